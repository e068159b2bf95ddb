"""The control plane: etcd, both apiservers, the controller-manager and the
scheduler, and the KMS plugin's key and static pod."""

import base64
import os
import shutil
import time
from pathlib import Path

from .config import (
    CLOUD,
    ClusterError,
    HOST,
    KMS_B_CLOUD_CONF_DIR,
    KMS_B_DIR,
    KMS_B_HTTP_PORT,
    KMS_CLOUD_CONF_DIR,
    KMS_DIR,
    PORTS,
    REPO,
    SERVICES,
    SERVICE_CIDR,
    STATE,
    binary,
    http,
)
from .pki import api_ready


def start_etcd(fresh=True):
    """etcd; `fresh`: on new data unless it runs (a cluster's restart
    keeps its data)."""
    data = STATE / "etcd"
    # a fresh cluster each run: nothing a previous run wrote can leak in
    if fresh and not SERVICES.alive("etcd"):
        shutil.rmtree(data, ignore_errors=True)
    data.mkdir(parents=True, exist_ok=True)
    data.chmod(0o700)
    client = f"http://{HOST}:{PORTS['etcd']}"
    peer = f"http://{HOST}:{PORTS['etcd-peer']}"
    SERVICES.start("etcd", [
        "etcd", "--name", "test", "--data-dir", data, "--listen-client-urls", client,
        "--advertise-client-urls", client, "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
        "--initial-cluster", f"test={peer}", "--log-level", "warn",
    ], env={"ETCD_UNSUPPORTED_ARCH": ""})
    SERVICES.wait_until("etcd", lambda: http("GET", f"{client}/health")[0] == 200, 60)


def start_apiserver(name="kube-apiserver", until="readyz", wait=True):
    """The apiserver; `kube-apiserver-b` is the second one, on the same
    etcd, encrypting through its own KMS plugin. Waits until it is ready
    (`until="livez"`: until it serves, ready or not; `wait=False`: see
    wait_apiserver)."""
    pki = STATE / "pki"
    port = PORTS["apiserver" if name == "kube-apiserver" else "apiserver-b"]
    encryption = (REPO / "deploy" / "kms" / "encryption-configuration.yaml" if name == "kube-apiserver"
                  else STATE / "encryption-configuration-b.yaml")
    SERVICES.start(name, [
        binary("kube-apiserver"),
        f"--etcd-servers=http://{HOST}:{PORTS['etcd']}",
        f"--bind-address={HOST}", f"--secure-port={port}", f"--advertise-address={HOST}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        f"--tls-cert-file={pki / 'apiserver.crt'}", f"--tls-private-key-file={pki / 'apiserver.key'}",
        f"--client-ca-file={pki / 'ca.crt'}",
        f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
        f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
        "--kubelet-preferred-address-types=Hostname",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={pki / 'sa.pub'}",
        f"--service-account-signing-key-file={pki / 'sa.key'}",
        "--authorization-mode=Node,RBAC",
        "--enable-admission-plugins=NodeRestriction",
        # trap 6: the node plugins are privileged
        "--allow-privileged=true",
        # Secrets through the Barbican KMS v2 plugin, as deploy/kms says
        f"--encryption-provider-config={encryption}",
        "--encryption-provider-config-automatic-reload=true",
        "--profiling=false",
        "--v=1",
        # both advertise 127.0.0.1: only the first keeps the `kubernetes`
        # Service's endpoints (its port), or they would overwrite each other's
        *([] if name == "kube-apiserver" else ["--endpoint-reconciler-type=none"]),
    ])
    if wait:
        wait_apiserver(name, until)


def wait_apiserver(name, until="readyz"):
    port = PORTS["apiserver" if name == "kube-apiserver" else "apiserver-b"]
    SERVICES.wait_until(name, lambda: api_ready(port, until), 120)


def start_controllers():
    """The controller-manager and the scheduler, each started again when it
    exits, as kubelet does with the static pods of a control plane: both
    exit when the apiserver is not healthy soon after their start (after a
    cold start, until its KMS plugin is back), and a cluster whose
    namespace controller never came back deletes no namespace."""
    pki = STATE / "pki"
    SERVICES.start("kube-controller-manager", [
        binary("kube-controller-manager"),
        f"--kubeconfig={STATE / 'kube-controller-manager.kubeconfig'}",
        f"--authentication-kubeconfig={STATE / 'kube-controller-manager.kubeconfig'}",
        f"--authorization-kubeconfig={STATE / 'kube-controller-manager.kubeconfig'}",
        f"--bind-address={HOST}", f"--secure-port={PORTS['controller-manager']}",
        f"--service-account-private-key-file={pki / 'sa.key'}",
        f"--root-ca-file={pki / 'ca.crt'}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--use-service-account-credentials=true",
        # a node whose kubelet stopped renewing its lease (every 10 s) is
        # NotReady after 20 s, not 50: the dead-node scenario waits for it
        "--node-monitor-grace-period=20s",
        "--leader-elect=false",
        "--profiling=false",
        "--v=1",
    ], restart_always=True)
    SERVICES.start("kube-scheduler", [
        binary("kube-scheduler"),
        f"--kubeconfig={STATE / 'kube-scheduler.kubeconfig'}",
        f"--authentication-kubeconfig={STATE / 'kube-scheduler.kubeconfig'}",
        f"--authorization-kubeconfig={STATE / 'kube-scheduler.kubeconfig'}",
        f"--bind-address={HOST}", f"--secure-port={PORTS['scheduler']}",
        "--leader-elect=false",
        "--profiling=false",
        "--v=1",
    ], restart_always=True)


def keystone_token(conf):
    """A token for the cloud.conf's user (password auth), and the catalog."""
    body = {"auth": {"identity": {"methods": ["password"], "password": {"user": {
        "name": conf["username"], "password": conf["password"],
        "domain": {"name": conf.get("user-domain-name", "Default")}}}},
        "scope": {"project": {"name": conf["tenant-name"],
                              "domain": {"name": conf.get("tenant-domain-name", "Default")}}}}}
    status, headers, reply = http("POST", conf["auth-url"].rstrip("/") + "/auth/tokens", body)
    if status != 201:
        raise ClusterError(f"Keystone refused the test cloud's credentials: {status} {reply}")
    return headers.get("X-Subject-Token") or headers.get("x-subject-token"), reply["token"]["catalog"]


def read_conf(path):
    """The [Global] keys of a cloud.conf written by cloud.py."""
    values = {}
    for line in Path(path).read_text().splitlines():
        if "=" in line and not line.strip().startswith(("#", ";", "[")):
            k, v = line.split("=", 1)
            values[k.strip()] = v.strip().strip('"')
    return values


def create_kms_key(conf):
    """A 32-byte symmetric secret in Barbican, as an operator makes one for
    [KeyManager] key-id."""
    token, catalog = keystone_token(conf)
    barbican = next((e["url"] for s in catalog if s["type"] == "key-manager" for e in s["endpoints"]
                     if e["interface"] == "public"), None)
    if not barbican:
        raise ClusterError("the test cloud has no key-manager endpoint: bring it up with the all profile")
    body = {"name": f"k8s-test-kek-{int(time.time())}", "payload": base64.b64encode(os.urandom(32)).decode(),
            "payload_content_type": "application/octet-stream", "payload_content_encoding": "base64",
            "algorithm": "aes", "bit_length": 256, "mode": "gcm", "secret_type": "symmetric"}
    status, _, reply = http("POST", barbican.rstrip("/") + "/v1/secrets", body, {"X-Auth-Token": token})
    if status != 201:
        raise ClusterError(f"Barbican refused a key: {status} {reply}")
    return reply["secret_ref"].rstrip("/").rsplit("/", 1)[-1]


def kms_cloud_conf(key_id):
    """The KMS plugin's cloud.conf on the host (deploy/kms: static pods
    cannot mount Secrets, and a Secret the plugin itself decrypts would
    deadlock a cold start)."""
    member = (CLOUD / "cloud-member.conf").read_text()
    return f"{member}\n[KeyManager]\nkey-id = \"{key_id}\"\n"


def install_kms():
    """The KMS plugin of each control-plane "node": the static pod exactly as
    deploy/kms ships it, and the second one's copy with its own socket,
    record, cloud.conf and port; both under the same key at first."""
    conf = read_conf(CLOUD / "cloud-member.conf")
    key_file = STATE / "kms-key-id"
    if not key_file.exists():
        key_file.write_text(create_kms_key(conf))
    for conf_dir in (KMS_CLOUD_CONF_DIR, KMS_B_CLOUD_CONF_DIR):
        target = conf_dir / "cloud.conf"
        tmp = target.with_suffix(".tmp")
        tmp.write_text(kms_cloud_conf(key_file.read_text().strip()))
        tmp.chmod(0o600)
        tmp.rename(target)
    manifests = STATE / "manifests"
    manifests.mkdir(exist_ok=True)
    pod = (REPO / "deploy" / "kms" / "barbican-kms-plugin.pod.yaml").read_text()
    (manifests / "barbican-kms-plugin.yaml").write_text(pod)
    pod_b = (pod.replace("barbican-kms-plugin\n", "barbican-kms-plugin-b\n")
             .replace(str(KMS_DIR), str(KMS_B_DIR))
             .replace(f"{KMS_CLOUD_CONF_DIR}\n", f"{KMS_B_CLOUD_CONF_DIR}\n")
             .replace("--cloud-config=/etc/kubernetes/cloud-config/", f"--cloud-config={KMS_B_CLOUD_CONF_DIR}/")
             .replace("9899", str(KMS_B_HTTP_PORT)))
    if pod_b.count("barbican-kms-plugin-b") < 2 or str(KMS_DIR) + "/" in pod_b:
        raise ClusterError("deploy/kms's static pod changed shape: the second plugin's copy needs updating")
    (manifests / "barbican-kms-plugin-b.yaml").write_text(pod_b)
    enc = (REPO / "deploy" / "kms" / "encryption-configuration.yaml").read_text()
    (STATE / "encryption-configuration-b.yaml").write_text(
        enc.replace(f"unix://{KMS_DIR}/kms.sock", f"unix://{KMS_B_DIR}/kms.sock"))
