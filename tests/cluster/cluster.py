#!/usr/bin/env python3
"""A real Kubernetes of three nodes (K8S_TEST_NODES, default 3) on this
machine, running the suite from deploy/ with our images, for the cluster
tier of the tests. Node A (`localhost`) runs in the host's namespaces;
node B, C... each in a network and a mount namespace of its own, with its
own containerd, kubelet, cgroup root and Nova server (class Node). A and B
are in the test cloud's zone az1, C in az2 (each node's server, instance
metadata and `topology.kubernetes.io/zone` label).

    cluster.py up       start etcd, the control plane, each node's containerd
                        and kubelet;
                        import the images; apply the snapshot CRDs and
                        controller, the KMS static pod and deploy/suite
                        through tests/cluster/overlay
    cluster.py status   exit 0 when every node is Ready and every driver registered;
                        prints each process group's, the pods' and the shims'
                        resident memory, and their sum
    cluster.py down     delete what the tests left, stop everything, unmount,
                        remove containers, network devices and host changes
    cluster.py env      print the variables the tests read
    cluster.py restart-kubelet   stop kubelet and start it again (its pods run on)
    cluster.py restart-apiservers [--live]  stop both apiservers and start them
                        again (until ready; --live: until they serve)
    cluster.py kill-node NAME    a node (not A) dies as a machine losing power:
                        kubelet, containerd and every pod process killed at
                        once, its Nova server SHUTOFF
    cluster.py revive-node NAME [--as-new]  the node back: no mount of before,
                        server ACTIVE, containerd and kubelet started (until
                        Ready); --as-new: its Node deleted first, so that it
                        registers anew, as a replacement machine does
    cluster.py kubectl ARGS...   kubectl against the cluster

Needs root, and the real test cloud up (tests/openstack/cloud.py up all):
the plugins talk to its Keystone, Cinder, Nova, Manila, Barbican and Ceph.

Binaries: Kubernetes v1.36 and the CSI sidecars come from $KUBE_BIN_DIR,
supplied by whoever runs the tests (the README says how to get them from
the official releases). Without them, `up` exits with status 3 and says
so: the tier is skipped, never passed.
Everything else comes from Debian: etcd-server, containerd, runc,
containernetworking-plugins, catatonit, busybox-static.

The node is fitted to this machine (root without CAP_SYS_RESOURCE, cgroup
v1, no systemd, a private /): see ../shared/k8s/README.md's traps, each
fixed here where it says so. Only loopback and the namespaced nodes'
veth pairs are used: every host listener binds 127.0.0.1, pods get an
isolated bridge with no route out, and whatever talks to a server runs on
its node's network (a namespaced node reaches the host's loopback
listeners it needs by DNAT; nothing is forwarded beyond them).

State lives in $K8S_TEST_CLUSTER_DIR (default .k8s-cluster): PKI, etcd,
containerd's content store (the images, kept between runs), logs. The
node's directories are the ones deploy/ names: /var/lib/kubelet,
/var/lib/kms, /etc/kubernetes/cloud-config (created and removed here).
Only the standard library is used."""

import base64
import concurrent.futures
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import signal
import ssl
import string
import subprocess
import sys
import tarfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(HERE.parent / "lib"))
from services import Services, group_rss_kib, http, port_open, run_cli  # noqa: E402

STATE = Path(os.environ.get("K8S_TEST_CLUSTER_DIR", REPO / ".k8s-cluster")).resolve()
CLOUD = Path(os.environ.get("OS_TEST_CLOUD_DIR", REPO / ".openstack-cloud")).resolve()
SHARED_K8S = Path(os.environ.get("SHARED_K8S_DIR", REPO.parent / "shared" / "k8s"))
TARGET = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target")).resolve()
IMAGES_OCI = Path(os.environ.get("IMAGES_OCI", TARGET / "images" / "oci"))
PORT_BASE = int(os.environ.get("K8S_TEST_PORT_BASE", "26000"))
PORTS = {
    "etcd": PORT_BASE + 379,
    "etcd-peer": PORT_BASE + 380,
    "apiserver": PORT_BASE + 443,
    # a second apiserver on the same etcd, with its own KMS plugin: the
    # control plane doubled, as a second control-plane node has it
    "apiserver-b": PORT_BASE + 444,
    "controller-manager": PORT_BASE + 257,
    "scheduler": PORT_BASE + 259,
    "kubelet": PORT_BASE + 250,
    "kubelet-healthz": PORT_BASE + 248,
    "metadata": PORT_BASE + 254,
}
HOST = "127.0.0.1"
# the node's name; apiserver reaches kubelet by it (logs, exec): it must
# resolve to loopback, and `localhost` always does (trap 7: a loopback
# node IP is refused)
NODE = "localhost"
SERVICE_CIDR = "10.96.0.0/16"
POD_CIDR = "10.88.0.0/16"
BRIDGE = "k8stest0"
RUN = Path("/run/k8s-test-cluster")
CONTAINERD_SOCK = RUN / "containerd.sock"
KUBELET_DIR = Path("/var/lib/kubelet")
KMS_DIR = Path("/var/lib/kms")
KMS_CLOUD_CONF_DIR = Path("/etc/kubernetes/cloud-config")
# the second control-plane "node"'s plugin: its own socket, record and
# cloud.conf, as on another machine
KMS_B_DIR = Path("/var/lib/kms-b")
KMS_B_CLOUD_CONF_DIR = Path("/etc/kubernetes/cloud-config-b")
KMS_B_HTTP_PORT = 9900
PAUSE_IMAGE = "registry.k8s.io/pause:3.10"
APP_IMAGE = "docker.io/library/busybox:1.35"
OVERLAY = HERE / "overlay"
NAMESPACE = "openstack-system"
TEST_NAMESPACE_LABEL = "csi-cluster-tier=test"
DEBIAN_PACKAGES = ["etcd-server", "containerd", "runc", "containernetworking-plugins", "catatonit",
                   "busybox-static", "openssl", "iproute2"]
# the drivers deploy/suite registers with kubelet
DRIVERS = ["cinder.csi.openstack.org", "nfs.manila.csi.openstack.org", "cephfs.manila.csi.openstack.org"]
SIDECARS = ["csi-provisioner", "csi-attacher", "csi-resizer", "csi-snapshotter", "snapshot-controller",
            "csi-node-driver-registrar", "livenessprobe"]
CONTROL_PLANE = ["kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet"]
PROCESSES = ["kubelet", "containerd", "kube-scheduler", "kube-controller-manager", "kube-apiserver",
             "kube-apiserver-b", "etcd", "metadata"]

# the cloud's listeners a namespaced node reaches on the host's loopback:
# its API ports (and Ceph's daemons), Ceph's monitor, NFS
CLOUD_PORT_BASE = int(os.environ.get("OS_TEST_CLOUD_PORT_BASE", "25000"))
# the nodes: A in the host's namespaces (the single-node tier's `localhost`),
# the further ones each in their own network and mount namespaces
# (`cluster.py env` prints the nodes' names under the same variable, for
# the tests: a list of names counts as that many nodes)
def _node_count(value):
    return int(value) if value.strip().isdigit() else len(value.split())


NODE_COUNT = _node_count(os.environ.get("K8S_TEST_NODES", "3"))
# the test cloud's zones (tests/openstack/cloud.py): A and B in the first,
# C and any further node in the second
ZONES = ("az1", "az2")
# pods of the single-node scenarios and the controllers stay on A; the
# multi-node scenarios tolerate this taint
MULTI_NODE_TAINT = "csi-cluster-tier/multi-node=true:NoSchedule"
# what an operator registers every node with (README, "Run it in
# Kubernetes", *A node that joins*): each node plugin removes its own once
# kubelet registered it
STARTUP_TAINTS = [f"{d}/agent-not-ready:NoExecute" for d in DRIVERS]
NODE_NS_SUBNET = "10.201"


class Node:
    """One kubelet and its containerd. Node A (index 0) runs in the host's
    namespaces; node B, C... each in a network namespace reached through a
    veth pair (its address is not loopback: the apiserver reaches its
    kubelet, so `kubectl logs/exec` work) and a mount namespace in which
    its own directories are the paths deploy/ names (/var/lib/kubelet,
    /dev/disk/by-id), like a kind node without a container. Each is a Nova
    server of the test cloud and sees only the disks attached to it."""

    def __init__(self, index):
        self.index = index
        self.letter = "abcdefgh"[index]
        self.host = index == 0
        self.zone = ZONES[0] if index < 2 else ZONES[1]
        if self.host:
            self.name, self.state, self.run = NODE, STATE, RUN
            self.address = HOST
            self.pod_cidr = POD_CIDR
            self.cgroup_root = None
            self.suffix = ""
        else:
            self.name = f"k8s-test-node-{self.letter}"
            self.state, self.run = STATE / "nodes" / self.letter, RUN / "nodes" / self.letter
            self.address = f"{NODE_NS_SUBNET}.{index}.2"
            self.gateway = f"{NODE_NS_SUBNET}.{index}.1"
            self.pod_cidr = f"10.90.{index}.0/24"
            self.cgroup_root = f"k8s-test-{self.letter}"
            self.suffix = f"-{self.letter}"
            self.netns = f"k8stest-{self.letter}"
            self.veth = f"k8st{self.letter}-h"
            self.mnt_ns = RUN / "nodes" / f"{self.letter}.mnt"
            self.by_id = self.state / "by-id"
            self.kubelet_dir = self.state / "kubelet"
        self.containerd_sock = self.run / "containerd.sock"
        self.metadata_port = PORTS["metadata"] + 10 * index
        self.kubelet_user = "kubelet" if self.host else f"kubelet{self.suffix}"

    def service(self, what):
        return what + self.suffix

    def enter(self):
        """The command prefix that runs a program in the node's namespaces."""
        if self.host:
            return []
        return ["nsenter", f"--net=/run/netns/{self.netns}", f"--mount={self.mnt_ns}", "--"]

    def cgroup_roots(self):
        """Where kubelet puts this node's pod cgroups, in every hierarchy."""
        base = Path("/sys/fs/cgroup")
        if not base.is_dir():
            return []
        sub = Path(self.cgroup_root) if self.cgroup_root else Path()
        return [h / sub for h in base.iterdir() if h.is_dir() and not h.is_symlink()]


def nodes():
    return [Node(i) for i in range(max(1, NODE_COUNT))]


def namespaced_nodes():
    return [n for n in nodes() if not n.host]


class ClusterError(Exception):
    pass


class Skipped(Exception):
    """The tier's inputs are missing: said so, counted as skipped."""


def log(msg):
    print(f"[cluster] {msg}", flush=True)


SERVICES = Services(STATE, log, ClusterError)
run = SERVICES.run


# ----------------------------------------------------------- binaries


def bin_dir():
    """Where the Kubernetes and sidecar binaries are: $KUBE_BIN_DIR (they
    are supplied, never kept in the repository or ../shared). Unset, the
    tier is skipped; set to a folder that is not there, or that lacks a
    binary, it is an error (a run that was meant to test the cluster must
    not pass without it)."""
    explicit = os.environ.get("KUBE_BIN_DIR")
    if not explicit:
        raise Skipped("no Kubernetes binaries: KUBE_BIN_DIR is not set (the README says how to supply them)")
    d = Path(explicit).resolve()
    if not d.is_dir():
        raise ClusterError(f"KUBE_BIN_DIR={d} does not exist")
    return d


def binary(name):
    base = bin_dir()
    for d in (base, base / "kubernetes" / "bin", base / "csi-sidecars" / "bin"):
        if (d / name).is_file() and os.access(d / name, os.X_OK):
            return d / name
    raise ClusterError(f"{name} is not an executable under KUBE_BIN_DIR={base} (nor its kubernetes/bin, csi-sidecars/bin)")


def sidecar_version(name):
    """The version a sidecar binary reports, else the one ../shared/k8s's
    README gives for it (livenessprobe prints none)."""
    out = subprocess.run([binary(name), "--version"], capture_output=True, text=True, timeout=10)
    m = re.search(r"\bv\d+\.\d+\.\d+\b", out.stdout + out.stderr)
    if m:
        return m.group(0)
    readme = SHARED_K8S / "README.md"
    if readme.exists():
        for line in readme.read_text().splitlines():
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) >= 2 and name in [c.strip() for c in cells[0].split(",")]:
                m = re.match(r"v\d+\.\d+\.\d+", cells[1])
                if m:
                    return m.group(0)
    return None


# ---------------------------------------------------------------- PKI


def openssl(*args):
    run(["openssl", *args])


def issue(name, cn, org=None, sans=(), server=False):
    """A certificate signed by the cluster CA (EC P-256)."""
    pki = STATE / "pki"
    key, csr, crt = pki / f"{name}.key", pki / f"{name}.csr", pki / f"{name}.crt"
    if crt.exists():
        return
    subj = f"/CN={cn}" + (f"/O={org}" if org else "")
    openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", key, "-out", csr, "-subj", subj)
    ext = pki / f"{name}.ext"
    lines = ["basicConstraints=CA:FALSE", "keyUsage=critical,digitalSignature,keyEncipherment",
             f"extendedKeyUsage={'serverAuth' if server else 'clientAuth'}"]
    if sans:
        lines.append("subjectAltName=" + ",".join(sans))
    ext.write_text("\n".join(lines) + "\n")
    openssl("x509", "-req", "-in", csr, "-CA", pki / "ca.crt", "-CAkey", pki / "ca.key", "-CAcreateserial",
            "-days", "30", "-out", crt, "-extfile", ext)
    csr.unlink()
    ext.unlink()
    key.chmod(0o600)


def kubeconfig(name, user):
    pki = STATE / "pki"
    path = STATE / f"{name}.kubeconfig"
    path.write_text(f"""apiVersion: v1
kind: Config
clusters:
- name: test
  cluster:
    certificate-authority: {pki / 'ca.crt'}
    server: https://{HOST}:{PORTS['apiserver']}
users:
- name: {user}
  user:
    client-certificate: {pki / (user + '.crt')}
    client-key: {pki / (user + '.key')}
contexts:
- name: test
  context:
    cluster: test
    user: {user}
current-context: test
""")
    path.chmod(0o600)
    return path


def setup_pki():
    pki = STATE / "pki"
    pki.mkdir(parents=True, exist_ok=True)
    if not (pki / "ca.crt").exists():
        openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                "-keyout", pki / "ca.key", "-out", pki / "ca.crt", "-days", "30", "-subj", "/CN=k8s-test-ca")
        (pki / "ca.key").chmod(0o600)
    issue("apiserver", "kube-apiserver", sans=[
        "IP:127.0.0.1", "IP:10.96.0.1", "DNS:localhost", "DNS:kubernetes", "DNS:kubernetes.default",
        "DNS:kubernetes.default.svc", "DNS:kubernetes.default.svc.cluster.local"], server=True)
    issue("admin", "kubernetes-admin", "system:masters")
    issue("apiserver-kubelet-client", "kube-apiserver-kubelet-client", "system:masters")
    for node in nodes():
        issue(node.kubelet_user, f"system:node:{node.name}", "system:nodes")
    issue("kube-controller-manager", "system:kube-controller-manager")
    issue("kube-scheduler", "system:kube-scheduler")
    if not (pki / "sa.key").exists():
        openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-out", pki / "sa.key")
        openssl("pkey", "-in", pki / "sa.key", "-pubout", "-out", pki / "sa.pub")
        (pki / "sa.key").chmod(0o600)
    for user in ("admin", "kube-controller-manager", "kube-scheduler", *(n.kubelet_user for n in nodes())):
        kubeconfig(user, user)


def kubectl(*args, check=True, input=None, timeout=300):
    cmd = ["kubectl", f"--kubeconfig={STATE / 'admin.kubeconfig'}", *args]
    if check:
        return run(cmd, input=input, timeout=timeout)
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, input=input, timeout=timeout)


def api_ready(port=PORTS["apiserver"], check="readyz"):
    ctx = ssl.create_default_context(cafile=str(STATE / "pki" / "ca.crt"))
    ctx.load_cert_chain(str(STATE / "pki" / "admin.crt"), str(STATE / "pki" / "admin.key"))
    # kms-providers included: Secrets cannot be written before
    status, _, _ = http("GET", f"https://{HOST}:{port}/{check}", context=ctx, timeout=3)
    return status == 200


# ------------------------------------------------------ host changes


def mountinfo():
    """(mount point, propagation fields) of every mount, in mount order."""
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        sep = fields.index("-")
        point = fields[4].encode().decode("unicode_escape")
        out.append((point, fields[6:sep], fields[sep + 1]))
    return out


def is_mountpoint(path):
    return any(p == str(path) for p, _, _ in mountinfo())


def is_shared(path):
    return any(p == str(path) and any(o.startswith("shared:") for o in opts) for p, opts, _ in mountinfo())


def host_changes():
    f = STATE / "host-changes.json"
    return json.loads(f.read_text()) if f.exists() else {}


def record_host_change(key, value):
    changes = host_changes()
    changes.setdefault(key, value)
    (STATE / "host-changes.json").write_text(json.dumps(changes, indent=1))


def prepare_host():
    """The node's directories and mount propagation (traps 3 and 9)."""
    marker = KUBELET_DIR / ".k8s-test-cluster"
    if KUBELET_DIR.exists() and any(KUBELET_DIR.iterdir()) and not marker.exists():
        raise ClusterError(f"{KUBELET_DIR} holds something this script did not create: is a real kubelet here?")
    if not Path("/etc/kubernetes").exists():
        record_host_change("created_etc_kubernetes", True)
    for d, key in ((KUBELET_DIR, "created_kubelet_dir"), (KMS_DIR, "created_kms_dir"),
                   (KMS_CLOUD_CONF_DIR, "created_kms_cloud_conf_dir"), (KMS_B_DIR, "created_kms_b_dir"),
                   (KMS_B_CLOUD_CONF_DIR, "created_kms_b_cloud_conf_dir")):
        if not d.exists():
            d.mkdir(parents=True)
            record_host_change(key, str(d))
    marker.touch()
    # trap 3: a Bidirectional mount needs a shared source
    if not is_mountpoint(KUBELET_DIR):
        run(["mount", "--bind", KUBELET_DIR, KUBELET_DIR])
        record_host_change("bound_kubelet_dir", True)
    run(["mount", "--make-rshared", KUBELET_DIR])
    # trap 9: /dev with HostToContainer propagation needs /dev shared
    if not is_shared("/dev"):
        record_host_change("dev_was_private", True)
        run(["mount", "--make-rshared", "/dev"])
    # the cloud's hypervisor agent links attached volumes here, as udev does
    Path("/dev/disk/by-id").mkdir(parents=True, exist_ok=True)


def restore_host():
    changes = host_changes()
    unmount_below(KUBELET_DIR, keep_root=not changes.get("bound_kubelet_dir"))
    if changes.get("dev_was_private"):
        subprocess.run(["mount", "--make-rprivate", "/dev"], capture_output=True)
    if KUBELET_DIR.exists() and (KUBELET_DIR / ".k8s-test-cluster").exists():
        if is_mountpoint(KUBELET_DIR):
            log(f"{KUBELET_DIR} is still mounted: not removing what is under it")
        else:
            shutil.rmtree(KUBELET_DIR, ignore_errors=True)
            if not changes.get("created_kubelet_dir"):
                KUBELET_DIR.mkdir(exist_ok=True)
    for kms_dir, conf_dir, suffix in ((KMS_DIR, KMS_CLOUD_CONF_DIR, ""), (KMS_B_DIR, KMS_B_CLOUD_CONF_DIR, "_b")):
        if changes.get(f"created_kms{suffix}_dir"):
            shutil.rmtree(kms_dir, ignore_errors=True)
        else:
            for f in ("kms.sock", "kms-keys.json"):
                (kms_dir / f).unlink(missing_ok=True)
        (conf_dir / "cloud.conf").unlink(missing_ok=True)
        if changes.get(f"created_kms{suffix}_cloud_conf_dir"):
            shutil.rmtree(conf_dir, ignore_errors=True)
    if changes.get("created_etc_kubernetes"):
        try:
            Path("/etc/kubernetes").rmdir()
        except OSError:
            pass
    (STATE / "host-changes.json").unlink(missing_ok=True)


def unmount_below(root, keep_root=True):
    """Unmounts everything below `root` (deepest first; a busy or dead FUSE
    mount is detached)."""
    root = str(root).rstrip("/")
    for _ in range(5):
        points = [p for p, _, _ in mountinfo() if p.startswith(root + "/") or (p == root and not keep_root)]
        if not points:
            return
        for p in sorted(set(points), key=lambda x: (-x.count("/"), x)):
            try:
                r = subprocess.run(["umount", p], capture_output=True, text=True, timeout=30)
                ok = r.returncode == 0
            except subprocess.TimeoutExpired:
                # a FUSE mount whose daemon hangs: only a lazy unmount returns
                ok = False
            if not ok:
                subprocess.run(["umount", "-l", p], capture_output=True, timeout=30)


# --------------------------------------------------------- control plane


def start_etcd():
    data = STATE / "etcd"
    # a fresh cluster each run: nothing a previous run wrote can leak in
    if not SERVICES.alive("etcd"):
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
    ])
    SERVICES.start("kube-scheduler", [
        binary("kube-scheduler"),
        f"--kubeconfig={STATE / 'kube-scheduler.kubeconfig'}",
        f"--authentication-kubeconfig={STATE / 'kube-scheduler.kubeconfig'}",
        f"--authorization-kubeconfig={STATE / 'kube-scheduler.kubeconfig'}",
        f"--bind-address={HOST}", f"--secure-port={PORTS['scheduler']}",
        "--leader-elect=false",
        "--profiling=false",
        "--v=1",
    ])


# ------------------------------------------------------------------ KMS


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


# ------------------------------------------------------------- images


def layer_from_files(files):
    """A gzipped tar layer of (path in image, source file or None for a
    directory, symlink target or None, mode); returns (blob, diff_id)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path, src, link, mode in files:
            info = tarfile.TarInfo(path.lstrip("/"))
            info.mtime = 0
            info.uid = info.gid = 0
            if link is not None:
                info.type = tarfile.SYMTYPE
                info.linkname = link
                info.mode = 0o777
                tar.addfile(info)
            elif src is None:
                info.type = tarfile.DIRTYPE
                info.mode = mode
                tar.addfile(info)
            else:
                data = Path(src).read_bytes()
                info.size = len(data)
                info.mode = mode
                tar.addfile(info, io.BytesIO(data))
    diff_id = "sha256:" + hashlib.sha256(raw.getvalue()).hexdigest()
    blob = gzip.compress(raw.getvalue(), compresslevel=1, mtime=0)
    return blob, diff_id


def oci_archive(path, images):
    """An OCI image layout tar holding `images`: name → (layer blob,
    diff_id, image config dict). Each manifest is named for containerd
    (`io.containerd.image.name`)."""
    blobs, manifests = {}, []

    def put(data):
        digest = hashlib.sha256(data).hexdigest()
        blobs[digest] = data
        return {"digest": f"sha256:{digest}", "size": len(data)}

    for name, (layer, diff_id, config) in images.items():
        cfg = {"architecture": "amd64", "os": "linux", "config": config,
               "rootfs": {"type": "layers", "diff_ids": [diff_id]}}
        manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                               **put(json.dumps(cfg).encode())},
                    "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", **put(layer)}]}
        m = put(json.dumps(manifest).encode())
        manifests.append({"mediaType": "application/vnd.oci.image.manifest.v1+json", **m,
                          "annotations": {"io.containerd.image.name": name,
                                          "org.opencontainers.image.ref.name": name.rsplit(":", 1)[-1]}})
    write_layout_tar(path, blobs, {"schemaVersion": 2, "manifests": manifests})


def write_layout_tar(path, blobs, index):
    with tarfile.open(path, "w") as tar:
        def add(name, data):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
        add("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
        add("index.json", json.dumps(index).encode())
        for digest, data in blobs.items():
            add(f"blobs/sha256/{digest}", data)


def single_binary_image(binary_path, name_in_image, entrypoint_args=()):
    layer, diff_id = layer_from_files([
        ("/tmp", None, None, 0o1777),
        (f"/{name_in_image}", binary_path, None, 0o755),
    ])
    config = {"Entrypoint": [f"/{name_in_image}", *entrypoint_args],
              "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]}
    return layer, diff_id, config


def busybox_image():
    applets = subprocess.run(["/bin/busybox", "--list"], capture_output=True, text=True, check=True).stdout.split()
    files = [("/bin", None, None, 0o755), ("/tmp", None, None, 0o1777), ("/bin/busybox", "/bin/busybox", None, 0o755)]
    files += [(f"/bin/{a}", None, "busybox", 0) for a in applets if a != "busybox"]
    layer, diff_id = layer_from_files(files)
    return layer, diff_id, {"Cmd": ["sh"], "Env": ["PATH=/bin"]}


def our_images_archive(path, names):
    """Our three images, from deploy/images/build.sh's OCI layout, named as
    deploy/ names them."""
    index = json.loads((IMAGES_OCI / "index.json").read_text())
    by_tag = {m.get("annotations", {}).get("org.opencontainers.image.ref.name"): m for m in index["manifests"]}
    manifests = []
    for tag, full_name in names.items():
        m = by_tag.get(tag)
        if m is None:
            raise ClusterError(f"{IMAGES_OCI} has no image {tag}: run deploy/images/build.sh")
        manifests.append({**m, "annotations": {"io.containerd.image.name": full_name,
                                               "org.opencontainers.image.ref.name": full_name.rsplit(":", 1)[-1]}})
    blobs = {}
    needed = [m["digest"] for m in manifests]
    while needed:
        digest = needed.pop().split(":", 1)[1]
        if digest in blobs:
            continue
        data = (IMAGES_OCI / "blobs" / "sha256" / digest).read_bytes()
        blobs[digest] = data
        try:
            doc = json.loads(data)
        except (ValueError, UnicodeDecodeError):
            continue
        if isinstance(doc, dict) and "layers" in doc:
            needed += [doc["config"]["digest"], *(layer["digest"] for layer in doc["layers"])]
    write_layout_tar(path, blobs, {"schemaVersion": 2, "manifests": manifests})


def images_wanted():
    """Every image the rendered overlay, the add-ons and the KMS static pod
    name."""
    texts = [kubectl("kustomize", OVERLAY), addons(),
             (REPO / "deploy" / "kms" / "barbican-kms-plugin.pod.yaml").read_text()]
    names = {n for t in texts for n in re.findall(r"^\s*(?:- )?image:\s*(\S+)\s*$", t, re.M)}
    return {n.strip("'\"") for n in names}


def ctr(*args, check=True, timeout=300, node=None):
    sock = node.containerd_sock if node else CONTAINERD_SOCK
    cmd = ["ctr", "--address", sock, "--namespace", "k8s.io", *args]
    if check:
        return run(cmd, timeout=timeout)
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout)


def import_images(all_nodes):
    """Builds and imports every image the nodes run (trap 5: nothing can be
    pulled): the pause image (catatonit -P), the CSI sidecars from their
    binaries, a busybox for test pods, and ours from deploy/images."""
    if not (IMAGES_OCI / "index.json").exists():
        log("no OCI layout of our images: building them (deploy/images/build.sh, debug binaries)")
        run(["cargo", "build", "--locked", "--bins", "-p", "csi-cinder", "-p", "csi-manila", "-p", "kms-barbican"],
            cwd=REPO, timeout=3600)
        run(["bash", REPO / "deploy" / "images" / "build.sh", TARGET / "images"], cwd=REPO, timeout=3600,
            env={**os.environ, "IMAGE_PROFILE": "debug"})
    out = STATE / "images"
    out.mkdir(exist_ok=True)
    wanted = images_wanted() | {PAUSE_IMAGE, APP_IMAGE}
    built, ours = {}, {}
    for name in sorted(wanted):
        repo, _, tag = name.rpartition(":")
        base = repo.rsplit("/", 1)[-1]
        if name == PAUSE_IMAGE:
            built[name] = single_binary_image("/usr/bin/catatonit", "pause", ["-P"])
        elif name == APP_IMAGE:
            built[name] = busybox_image()
        elif repo.startswith("registry.k8s.io/sig-storage/") and base in SIDECARS:
            have = sidecar_version(base)
            if have and have != tag:
                raise ClusterError(f"deploy/ pins {base} {tag}, but the binary tested here is {have}: "
                                   "pin what is tested")
            built[name] = single_binary_image(binary(base), base)
        elif base in ("cinder-csi-plugin", "manila-csi-plugin", "barbican-kms-plugin"):
            ours[base] = name
        else:
            raise ClusterError(f"no way to make image {name} here (nothing can be pulled)")
    archive = out / "built.tar"
    oci_archive(archive, built)
    ours_archive = out / "ours.tar"
    our_images_archive(ours_archive, ours)
    def import_into(node):
        for a in (archive, ours_archive):
            ctr("images", "import", a, timeout=600, node=node)
        for name in [*built, *ours.values()]:
            # kubelet's image GC never removes a pinned image
            ctr("images", "label", name, "io.cri-containerd.pinned=pinned", node=node)

    # each node's containerd of its own: imported side by side
    with concurrent.futures.ThreadPoolExecutor(len(all_nodes)) as pool:
        list(pool.map(import_into, all_nodes))
    log(f"imported {len(built) + len(ours)} images into {len(all_nodes)} node(s)")


# --------------------------------------------------------------- the node


def start_containerd(node):
    node.run.mkdir(parents=True, exist_ok=True)
    (node.state / "containerd").mkdir(parents=True, exist_ok=True)
    cni = node.state / "cni"
    cni.mkdir(exist_ok=True)
    # trap 4: containerd 1.6 wants an eth0 with an address; an isolated
    # bridge gives one, with no gateway, no masquerade and no route out
    (cni / "10-k8s-test.conflist").write_text(json.dumps({
        "cniVersion": "0.4.0", "name": "k8s-test",
        "plugins": [{"type": "bridge", "bridge": BRIDGE, "isGateway": False, "ipMasq": False,
                     "hairpinMode": False,
                     "ipam": {"type": "host-local", "ranges": [[{"subnet": node.pod_cidr}]],
                              "dataDir": str(node.state / "cni-ipam")}}]}, indent=1))
    config = node.state / "containerd.toml"
    config.write_text(f"""version = 2
root = "{node.state / 'containerd'}"
state = "{node.run / 'containerd-state'}"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
                    "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs",
                    "io.containerd.internal.v1.opt", "io.containerd.tracing.processor.v1.otlp"]
[grpc]
  address = "{node.containerd_sock}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  # trap 1: runc cannot lower oom_score_adj without CAP_SYS_RESOURCE
  restrict_oom_score_adj = true
  enable_cdi = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{cni}"
""")
    SERVICES.start(node.service("containerd"), [*node.enter(), "containerd", "--config", config,
                                                "--log-level", "warn"])
    SERVICES.wait_until(node.service("containerd"), lambda: ctr("version", check=False, node=node).returncode == 0,
                        60)


def start_kubelet(node):
    config = node.state / "kubelet.yaml"
    (node.state / "manifests").mkdir(parents=True, exist_ok=True)
    cgroup_root = f"cgroupRoot: /{node.cgroup_root}\n" if node.cgroup_root else ""
    config.write_text(f"""apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: {node.address}
port: {PORTS['kubelet']}
healthzBindAddress: {node.address}
healthzPort: {PORTS['kubelet-healthz']}
{cgroup_root}
readOnlyPort: 0
# trap 2: cgroup v1, no systemd, swap
failCgroupV1: false
cgroupDriver: cgroupfs
failSwapOn: false
containerRuntimeEndpoint: unix://{node.containerd_sock}
staticPodPath: {node.state / 'manifests'}
fileCheckFrequency: 5s
syncFrequency: 10s
podLogsDir: {node.state / 'pod-logs'}
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: {STATE / 'pki' / 'ca.crt'}
authorization:
  mode: Webhook
clusterDomain: cluster.local
# a shared disk must not evict the test pods, nor collect the imported images
evictionHard:
  memory.available: "100Mi"
  nodefs.available: "1%"
  nodefs.inodesFree: "1%"
  imagefs.available: "1%"
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
maxPods: 110
""")
    # the zone label a cloud controller manager would set
    extra = [f"--node-labels=topology.kubernetes.io/zone={node.zone}"]
    taints = list(STARTUP_TAINTS)
    if not node.host:
        extra += [f"--node-ip={node.address}"]
        taints.append(MULTI_NODE_TAINT)
    extra.append(f"--register-with-taints={','.join(taints)}")
    SERVICES.start(node.service("kubelet"), [
        *node.enter(),
        binary("kubelet"),
        f"--config={config}",
        f"--kubeconfig={STATE / (node.kubelet_user + '.kubeconfig')}",
        f"--hostname-override={node.name}",
        f"--root-dir={KUBELET_DIR}",
        *extra,
        "--v=2",
    ])
    healthz = f"http://{node.address}:{PORTS['kubelet-healthz']}/healthz"
    SERVICES.wait_until(node.service("kubelet"), lambda: http("GET", healthz)[0] == 200, 60)


def loopback_forwards(node):
    """(ports, host port) pairs a namespaced node reaches on 127.0.0.1 as
    if it were the host: the cloud, both apiservers, and its own metadata
    service under A's port (the manifests name one address for every node)."""
    shared = f"{CLOUD_PORT_BASE}:{CLOUD_PORT_BASE + 199},3300,6789,2049,{PORTS['apiserver']},{PORTS['apiserver-b']}"
    return [(shared, None), (str(PORTS["metadata"]), node.metadata_port)]


def node_ns_run(node, script):
    run(["nsenter", f"--net=/run/netns/{node.netns}", f"--mount={node.mnt_ns}", "--", "sh", "-euc", script])


def prepare_namespaced_node(node):
    """The node's network namespace (a veth pair: host .1, node .2, no
    route out; its 127.0.0.1 reaches the host's listeners it needs through
    DNAT, and nothing else), its mount namespace (its own /var/lib/kubelet,
    shared for Bidirectional mounts, and /dev/disk/by-id), its cgroup root
    and its name in /etc/hosts (the apiserver reaches kubelets by name)."""
    for d in ("kubelet", "by-id", "logs"):
        (node.state / d).mkdir(parents=True, exist_ok=True)
    node.run.mkdir(parents=True, exist_ok=True)
    if not Path(f"/run/netns/{node.netns}").exists():
        run(["ip", "netns", "add", node.netns])
        run(["ip", "link", "add", node.veth, "type", "veth", "peer", "name", "eth0", "netns", node.netns])
        run(["ip", "addr", "add", f"{node.gateway}/30", "dev", node.veth])
        run(["ip", "link", "set", node.veth, "up"])
        run(["sysctl", "-qw", f"net.ipv4.conf.{node.veth}.route_localnet=1"])
        ns = ["ip", "netns", "exec", node.netns]
        run([*ns, "ip", "addr", "add", f"{node.address}/30", "dev", "eth0"])
        run([*ns, "ip", "link", "set", "eth0", "up"])
        run([*ns, "ip", "link", "set", "lo", "up"])
        run([*ns, "sysctl", "-qw", "net.ipv4.conf.all.route_localnet=1"])
        for ports, host_port in loopback_forwards(node):
            to = node.gateway + (f":{host_port}" if host_port else "")
            run([*ns, "iptables", "-t", "nat", "-A", "OUTPUT", "-d", "127.0.0.1/32", "-p", "tcp", "-m", "multiport",
                 "--dports", ports, "-j", "DNAT", "--to-destination", to])
        run([*ns, "iptables", "-t", "nat", "-A", "POSTROUTING", "-s", "127.0.0.0/8", "-o", "eth0", "-j", "SNAT",
             "--to-source", node.address])
        # on the host: only what came from this node, only to those ports
        chain = "K8STEST-NODES"
        if subprocess.run(["iptables", "-t", "nat", "-S", chain], capture_output=True).returncode != 0:
            run(["iptables", "-t", "nat", "-N", chain])
            run(["iptables", "-t", "nat", "-I", "PREROUTING", "-j", chain])
        host_ports = ",".join(p for p, _ in loopback_forwards(node) if p != str(PORTS["metadata"]))
        run(["iptables", "-t", "nat", "-A", chain, "-i", node.veth, "-d", node.gateway, "-p", "tcp", "-m",
             "multiport", "--dports", f"{host_ports},{node.metadata_port}", "-j", "DNAT",
             "--to-destination", "127.0.0.1"])
    if not node.mnt_ns.exists():
        ns_dir = node.mnt_ns.parent
        # a mount namespace is kept by binding its file on a private mount
        if not is_mountpoint(ns_dir):
            run(["mount", "--bind", ns_dir, ns_dir])
        run(["mount", "--make-private", ns_dir])
        node.mnt_ns.touch()
        # slave: the host's /dev (new loop devices) reaches the node, the
        # node's mounts never reach the host
        run(["unshare", f"--mount={node.mnt_ns}", "--propagation", "slave", "true"])
        # A's /var/lib/kubelet (a bind mount) leaves this namespace first:
        # stacked under the node's own it would be what containerd checks
        # for Bidirectional propagation, and A's pod mounts would keep
        # arriving beneath
        node_ns_run(node, f"""
if mountpoint -q {KUBELET_DIR}; then umount -R {KUBELET_DIR}; fi
mount --bind {node.kubelet_dir} {KUBELET_DIR}
mount --make-rshared {KUBELET_DIR}
mount --bind {node.by_id} /dev/disk/by-id
""")
    for root in node.cgroup_roots():
        root.mkdir(exist_ok=True)
    hosts = Path("/etc/hosts")
    line = f"{node.address} {node.name}  {HOSTS_MARK}"
    text = hosts.read_text()
    if line not in text.splitlines():
        hosts.write_text(text.rstrip("\n") + "\n" + line + "\n")


HOSTS_MARK = "# k8s-test-cluster node"


def remove_namespaced_node(node):
    """Everything prepare_namespaced_node and the node's services made;
    its processes are gone by now."""
    if node.mnt_ns.exists():
        subprocess.run(["umount", node.mnt_ns], capture_output=True)
        node.mnt_ns.unlink(missing_ok=True)
    if Path(f"/run/netns/{node.netns}").exists():
        subprocess.run(["ip", "netns", "del", node.netns], capture_output=True)
    chain = "K8STEST-NODES"
    r = subprocess.run(["iptables", "-t", "nat", "-S", chain], capture_output=True, text=True)
    for rule in r.stdout.splitlines():
        if f"-i {node.veth} " in rule:
            subprocess.run(["iptables", "-t", "nat", "-D", *rule.split()[1:]], capture_output=True)
    for root in node.cgroup_roots():
        try:
            root.rmdir()
        except OSError:
            pass
    hosts = Path("/etc/hosts")
    kept = [ln for ln in hosts.read_text().splitlines() if not (ln.endswith(HOSTS_MARK) and node.name in ln)]
    hosts.write_text("\n".join(kept) + "\n")
    shutil.rmtree(node.run, ignore_errors=True)
    shutil.rmtree(node.state, ignore_errors=True)


def remove_node_chain():
    chain = "K8STEST-NODES"
    if subprocess.run(["iptables", "-t", "nat", "-S", chain], capture_output=True).returncode == 0:
        subprocess.run(["iptables", "-t", "nat", "-D", "PREROUTING", "-j", chain], capture_output=True)
        subprocess.run(["iptables", "-t", "nat", "-F", chain], capture_output=True)
        subprocess.run(["iptables", "-t", "nat", "-X", chain], capture_output=True)
    ns_dir = RUN / "nodes"
    if is_mountpoint(ns_dir):
        subprocess.run(["umount", ns_dir], capture_output=True)


def node_server(node):
    """The node's Nova server (booted once by the test cloud, which links
    the disks attached to it in the node's by-id directory only)."""
    if node.host:
        return (CLOUD / "test-server-id").read_text().strip()
    out = run([sys.executable, REPO / "tests" / "openstack" / "cloud.py", "node-server", node.name, node.by_id,
               node.zone], timeout=300)
    return out.strip().splitlines()[-1]


def node_ready(node):
    r = kubectl("get", "node", node.name, "-o", "json", check=False)
    if r.returncode != 0:
        return False
    conds = json.loads(r.stdout)["status"].get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)


def wait_node_ready(node):
    SERVICES.wait_until(node.service("kubelet"), lambda: node_ready(node), 120)


def start_metadata(node, server):
    """The node's instance metadata (what 169.254.169.254 answers its
    server); a namespaced node reaches it on the same loopback port as A,
    translated to its own."""
    SERVICES.start(node.service("metadata"), [sys.executable, HERE / "metadata.py", node.metadata_port, server,
                                              node.name if not node.host else "k8s-test-node", node.zone])
    SERVICES.wait_until(node.service("metadata"), lambda: port_open(node.metadata_port), 30)


# ---------------------------------------------------------------- the suite


def write_overlay_inputs():
    """What an operator writes for deploy/suite: the cloud.conf Secrets
    (the test cloud's member credentials) and the node's cloud.conf. The
    overlay itself (tests/cluster/overlay) is committed."""
    gen = OVERLAY / "generated"
    gen.mkdir(exist_ok=True)
    limit = ""
    if (CLOUD / "max-disk-devices").exists():
        # the disks Nova lets the server take, its root included: the
        # controller's and the node's cloud.conf agree on it
        limit = f"node-volume-attach-limit = {int((CLOUD / 'max-disk-devices').read_text())}\n"
    # Cinder's controller attaches to the node's server: the test cloud
    # made it in the admin project; Manila's shares belong to the member
    admin = (CLOUD / "cloud-admin.conf").read_text()
    (gen / "cinder-cloud.conf").write_text(f"{admin}\n[BlockStorage]\nignore-volume-az = false\n{limit}")
    (gen / "manila-cloud.conf").write_text((CLOUD / "cloud-member.conf").read_text())
    (gen / "node-cloud.conf").write_text(
        f"[Metadata]\nsearch-order = configDrive,metadataService\n\n[BlockStorage]\n{limit}")
    (gen / "addresses.env").write_text(
        f"KUBERNETES_SERVICE_HOST={HOST}\nKUBERNETES_SERVICE_PORT={PORTS['apiserver']}\n"
        f"METADATA_URL=http://{HOST}:{PORTS['metadata']}/\n")
    secrets = read_conf(CLOUD / "cloud-member.conf")
    (gen / "csi-secrets.env").write_text("\n".join([
        f"os-authURL={secrets['auth-url']}",
        f"os-region={secrets.get('region', 'RegionOne')}",
        f"os-userName={secrets['username']}",
        f"os-password={secrets['password']}",
        f"os-projectName={secrets['tenant-name']}",
        f"os-domainName={secrets.get('user-domain-name', 'Default')}",
    ]) + "\n")
    for f in gen.iterdir():
        f.chmod(0o600)


def snapshot_crds():
    """The snapshot CRDs of external-snapshotter v8.6: $KUBE_BIN_DIR/crds,
    else ../shared/k8s/crds."""
    explicit = os.environ.get("KUBE_BIN_DIR")
    for d in ([Path(explicit) / "crds"] if explicit else []) + [SHARED_K8S / "crds"]:
        if d.is_dir():
            return d
    raise Skipped(f"no snapshot CRDs: neither $KUBE_BIN_DIR/crds nor {SHARED_K8S / 'crds'} exists")


def apply_addons():
    """What a cluster brings before the suite (deploy/README.md): the
    snapshot CRDs of external-snapshotter v8.6 and its controller."""
    kubectl("apply", "--server-side", "-f", snapshot_crds())
    kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd", "--all")
    kubectl("apply", "-f", "-", input=addons())


def addons():
    """tests/cluster/addons with this node's apiserver port filled in."""
    texts = [string.Template(f.read_text()).substitute(APISERVER_PORT=PORTS["apiserver"])
             for f in sorted((HERE / "addons").glob("*.yaml"))]
    return "\n---\n".join(texts)


def apply_suite():
    kubectl("apply", "-k", OVERLAY, timeout=300)


def drivers_registered():
    for node in nodes():
        r = kubectl("get", "csinode", node.name, "-o", "json", check=False)
        if r.returncode != 0:
            return False
        names = {d["name"] for d in json.loads(r.stdout)["spec"].get("drivers") or []}
        if not all(d in names for d in DRIVERS):
            return False
    return True


def startup_taints_left():
    """The nodes still carrying a startup taint (`<driver>/agent-not-ready`)."""
    r = kubectl("get", "nodes", "-o", "json", check=False)
    if r.returncode != 0:
        return ["(the API did not answer)"]
    return [n["metadata"]["name"] for n in json.loads(r.stdout)["items"]
            if any(t["key"].endswith("/agent-not-ready") for t in n["spec"].get("taints") or [])]


def wait_suite():
    def rolled_out():
        for kind, name in deployments():
            r = kubectl("rollout", "status", f"{kind}/{name}", "-n", NAMESPACE, "--timeout=5s", check=False)
            if r.returncode != 0:
                return False
        # the node plugins removed their startup taints
        return drivers_registered() and not startup_taints_left()
    try:
        SERVICES.wait_until("the suite", rolled_out, 300, log_file=STATE / "logs" / "kubelet.log")
    except ClusterError as e:
        raise ClusterError(f"{e}\n{describe_failures()}")


def deployments():
    r = kubectl("get", "deployments,daemonsets", "-n", NAMESPACE, "-o", "json", check=False)
    if r.returncode != 0:
        return []
    return [(i["kind"].lower(), i["metadata"]["name"]) for i in json.loads(r.stdout)["items"]]


def describe_failures():
    """The pods that are not running, and their containers' last words."""
    r = kubectl("get", "pods", "-A", "-o", "json", check=False)
    if r.returncode != 0:
        return r.stderr
    lines = []
    for p in json.loads(r.stdout)["items"]:
        statuses = p["status"].get("containerStatuses") or []
        if p["status"].get("phase") == "Running" and all(s.get("ready") for s in statuses):
            continue
        lines.append(f"pod {p['metadata']['namespace']}/{p['metadata']['name']}: {p['status'].get('phase')}")
        for s in statuses:
            state = s.get("state", {})
            lines.append(f"  {s['name']}: {json.dumps(state)}")
    return "\n".join(lines)


# ---------------------------------------------------------------- verbs


def cloud_up():
    """The test cloud's files are there and its Keystone answers."""
    if not (CLOUD / "test-server-id").exists() or not (CLOUD / "cloud-member.conf").exists():
        return False
    try:
        return http("GET", read_conf(CLOUD / "cloud-member.conf")["auth-url"], timeout=5)[0] == 200
    except OSError:
        return False


def cmd_up():
    if os.geteuid() != 0:
        raise ClusterError("needs root: mounts, containerd, kubelet")
    t0 = time.time()
    # the tier's own inputs first: without them it is skipped
    bin_dir()
    for name in CONTROL_PLANE + SIDECARS:
        binary(name)
    snapshot_crds()
    if not cloud_up():
        raise ClusterError(f"the test cloud is not up ({CLOUD}): run tests/openstack/cloud.py up all first")
    SERVICES.ensure_debian_packages(DEBIAN_PACKAGES)
    if shutil.which("kubectl") is None:
        raise ClusterError("kubectl is needed (it renders deploy/ too)")
    for sub in ("logs", "pids"):
        (STATE / sub).mkdir(parents=True, exist_ok=True)
    if not SERVICES.alive("kubelet"):
        # a fresh node: an earlier run's logs of the static pod (whose uid
        # never changes) would show as restarts of this one
        shutil.rmtree(STATE / "pod-logs", ignore_errors=True)
    setup_pki()
    prepare_host()
    all_nodes = nodes()
    for node in all_nodes:
        if not node.host:
            prepare_namespaced_node(node)
    # each node's Nova server, booted side by side
    with concurrent.futures.ThreadPoolExecutor(len(all_nodes)) as pool:
        servers = list(pool.map(node_server, all_nodes))
    for node, server in zip(all_nodes, servers):
        start_metadata(node, server)
    start_etcd()
    # kubelet before the apiserver, as on a control-plane node: it starts
    # the KMS static pod without the API, so the apiserver finds the
    # plugin's socket at once (its gRPC channel otherwise backs off for
    # up to two minutes, and Secrets cannot be written meanwhile)
    install_kms()
    write_overlay_inputs()
    for node in all_nodes:
        start_containerd(node)
    import_images(all_nodes)
    for node in all_nodes:
        start_kubelet(node)
    for name in ("kube-apiserver", "kube-apiserver-b"):
        start_apiserver(name, wait=False)
    for name in ("kube-apiserver", "kube-apiserver-b"):
        wait_apiserver(name)
    start_controllers()
    for node in all_nodes:
        wait_node_ready(node)
    apply_addons()
    apply_suite()
    wait_suite()
    log(f"up in {time.time() - t0:.0f}s: nodes {', '.join(n.name for n in all_nodes)} Ready, drivers "
        f"{', '.join(DRIVERS)} registered on each; KUBECONFIG={STATE / 'admin.kubeconfig'}")


def all_processes():
    return PROCESSES + [n.service(p) for n in namespaced_nodes() for p in ("kubelet", "containerd", "metadata")]


def pods_rss_kib(node):
    """What the node's pods hold resident (their cgroups' total_rss)."""
    stat = Path("/sys/fs/cgroup/memory") / (node.cgroup_root or "") / "kubepods" / "memory.stat"
    try:
        for line in stat.read_text().splitlines():
            if line.startswith("total_rss "):
                return int(line.split()[1]) // 1024
    except (OSError, ValueError):
        pass
    return 0


def shim_pids(of_nodes):
    """The containerd shims of these nodes (each names its node's
    containerd socket on its command line; they live outside the pods'
    cgroups and process groups)."""
    socks = [str(n.containerd_sock) for n in of_nodes]
    pids = set()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmdline = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "containerd-shim" in cmdline and any(sock in cmdline for sock in socks):
            pids.add(int(d.name))
    return pids


def shims_rss_kib(node):
    """What the node's containerd shims hold resident (one per pod)."""
    total = 0
    for pid in shim_pids([node]):
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except (OSError, ValueError):
            continue
    return total


def cmd_status():
    ok = all(SERVICES.alive(p) for p in all_processes())
    total = 0
    for p in all_processes():
        pgid = SERVICES.group(p) if SERVICES.alive(p) else None
        rss = group_rss_kib(pgid) if pgid else 0
        total += rss
        print(f"{p:24} {'up' if pgid else 'DOWN':4} {rss / 1024:6.0f} MiB")
    for node in nodes():
        for what, rss in (("pods", pods_rss_kib(node)), ("shims", shims_rss_kib(node))):
            total += rss
            print(f"{what + ' on ' + node.name:24} {'':4} {rss / 1024:6.0f} MiB")
    print(f"{'memory of the tier':24} {'':4} {total / 1024:6.0f} MiB")
    reg = ok and drivers_registered()
    print(f"{'drivers registered':24} {'yes' if reg else 'no'}")
    return 0 if reg else 1


def delete_test_objects(timeout=300):
    """What the tests left: their namespaces (pods, claims), then every
    volume detached and deleted by its driver, so that no Cinder volume,
    attachment or Manila share outlives the run (the suite goes next, and
    with it the controllers that would)."""
    r = kubectl("get", "ns", "-l", TEST_NAMESPACE_LABEL, "-o", "name", check=False)
    namespaces = r.stdout.split() if r.returncode == 0 else []
    if namespaces:
        log(f"deleting what the tests left: {' '.join(namespaces)}")
        kubectl("delete", *namespaces, "--wait=false", check=False)
    t0 = time.time()
    said = t0
    while True:
        present = {kind: kubectl("get", kind, "-o", "name", *labels, check=False).stdout.split()
                   for kind, labels in (("ns", ["-l", TEST_NAMESPACE_LABEL]), ("pv", []),
                                        ("volumeattachments", []), ("volumesnapshotcontents", []))}
        if not any(present.values()):
            return
        if time.time() - t0 > timeout:
            log(f"after {timeout}s still present: {present}")
            return
        if time.time() - said > 30:
            said = time.time()
            log(f"waiting for what the tests made to go: {present}")
        time.sleep(2)


def stop_pods(timeout=120):
    """Lets kubelet stop every pod through the CRI (so that CNI tears the
    pod networks down): the suite and the add-ons deleted, the static pod
    removed, then the node's remaining pods."""
    kubectl("delete", "-k", OVERLAY, "--ignore-not-found", "--wait=false", check=False, timeout=120)
    kubectl("delete", "-f", "-", "--ignore-not-found", "--wait=false", check=False, input=addons())
    for m in ("barbican-kms-plugin.yaml", "barbican-kms-plugin-b.yaml"):
        (STATE / "manifests" / m).unlink(missing_ok=True)
    kubectl("delete", "pods", "-A", "--all", "--grace-period=5", "--wait=false", check=False)
    deadline = time.time() + timeout
    while time.time() < deadline:
        running = False
        for node in nodes():
            r = ctr("tasks", "ls", "-q", check=False, node=node)
            running |= r.returncode == 0 and bool(r.stdout.split())
        if not running:
            return
        time.sleep(1)
    log(f"containers still running after {timeout}s: removing them by force")


def remove_containers(node):
    """Whatever kubelet did not stop: tasks killed, containers and their
    network namespaces removed."""
    if not SERVICES.alive(node.service("containerd")):
        return
    for _ in range(3):
        tasks = ctr("tasks", "ls", "-q", check=False, node=node).stdout.split()
        for t in tasks:
            ctr("tasks", "kill", "--signal", "SIGKILL", t, check=False, node=node)
        for t in tasks:
            ctr("tasks", "delete", "--force", t, check=False, timeout=60, node=node)
        containers = ctr("containers", "ls", "-q", check=False, node=node).stdout.split()
        for c in containers:
            ctr("containers", "delete", c, check=False, node=node)
        if not tasks and not containers:
            break
        time.sleep(1)


def kill_strays():
    """containerd's shims and anything still running from our state."""
    for pid in shim_pids(nodes()):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def pod_cgroup_roots(of_nodes=None):
    """The nodes' (default: every node's) `kubepods` cgroup, in every
    hierarchy."""
    return [r / "kubepods" for n in (of_nodes or nodes()) for r in n.cgroup_roots()]


def pod_processes(of_nodes=None):
    """The processes in the pods' cgroups (every hierarchy kubelet made)
    of these nodes (default: every node)."""
    pids = set()
    for root in pod_cgroup_roots(of_nodes):
        if not root.is_dir():
            continue
        for procs in root.rglob("cgroup.procs"):
            try:
                pids.update(int(p) for p in procs.read_text().split())
            except (OSError, ValueError):
                pass
    return pids


def kill_pod_processes(timeout=30):
    """Whatever still runs in a pod's cgroup: a container whose shim was
    killed goes on, orphaned, and keeps its cgroup (and maybe a mount)
    busy. Killed, and waited for until the cgroups are empty."""
    deadline = time.time() + timeout
    while pids := pod_processes():
        if time.time() > deadline:
            log(f"processes still in the pods' cgroups after {timeout}s: {sorted(pids)}")
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.5)


def remove_network():
    for ns in Path("/run/netns").glob("cni-*") if Path("/run/netns").exists() else []:
        subprocess.run(["umount", ns], capture_output=True)
        ns.unlink(missing_ok=True)
    if subprocess.run(["ip", "link", "show", BRIDGE], capture_output=True).returncode == 0:
        subprocess.run(["ip", "link", "delete", BRIDGE], capture_output=True)
    shutil.rmtree(STATE / "cni-ipam", ignore_errors=True)


def remove_iptables():
    """The chains kubelet adds (KUBE-FIREWALL and its canaries) and any a
    CNI plugin adds, with the rules that jump to them."""
    for tool in ("iptables", "ip6tables"):
        if shutil.which(tool) is None:
            continue
        for table in ("filter", "nat", "mangle"):
            r = subprocess.run([tool, "-t", table, "-S"], capture_output=True, text=True)
            if r.returncode != 0:
                continue
            ours = lambda chain: chain.startswith(("KUBE-", "CNI-"))  # noqa: E731
            for line in r.stdout.splitlines():
                parts = line.split()
                # a rule of a built-in chain that jumps into ours
                if parts[:1] == ["-A"] and not ours(parts[1]) and "-j" in parts \
                        and ours(parts[parts.index("-j") + 1]):
                    subprocess.run([tool, "-t", table, "-D", *parts[1:]], capture_output=True)
            chains = [line.split()[1] for line in r.stdout.splitlines()
                      if line.startswith("-N ") and ours(line.split()[1])]
            for chain in chains:
                subprocess.run([tool, "-t", table, "-F", chain], capture_output=True)
            for chain in chains:
                subprocess.run([tool, "-t", table, "-X", chain], capture_output=True)


def leftovers():
    """What of the cluster is still on the machine (empty: nothing)."""
    left = [f"process {p}" for p in all_processes() if SERVICES.alive(p)]
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            cmdline = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if (str(RUN) in cmdline or str(STATE) in cmdline) and "cluster.py" not in cmdline:
            left.append(f"process {d.name}: {cmdline[:120]}")
    for point, _, _ in mountinfo():
        if point.startswith((str(KUBELET_DIR), str(STATE) + "/", str(RUN), "/run/netns/cni-")):
            left.append(f"mount {point}")
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    for line in links.splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        if name == BRIDGE or name.startswith(("veth", "k8st")):
            left.append(f"network device {name}")
    for tool in ("iptables", "ip6tables"):
        if shutil.which(tool) is None:
            continue
        for table in ("filter", "nat", "mangle"):
            r = subprocess.run([tool, "-t", table, "-S"], capture_output=True, text=True)
            left += [f"{tool} -t {table}: {line}" for line in r.stdout.splitlines()
                     if "KUBE-" in line or "CNI-" in line]
    images = str(CLOUD / "hypervisor-images")
    for line in subprocess.run(["losetup", "-l", "-n", "-O", "NAME,BACK-FILE"], capture_output=True,
                               text=True).stdout.splitlines():
        if images in line:
            left.append(f"loop device of a volume: {line.strip()}")
    for root in pod_cgroup_roots():
        if root.is_dir():
            left.append(f"cgroup {root}")
    for node in namespaced_nodes():
        left += [f"cgroup {r}" for r in node.cgroup_roots() if r.is_dir()]
        if Path(f"/run/netns/{node.netns}").exists():
            left.append(f"network namespace {node.netns}")
        if node.mnt_ns.exists():
            left.append(f"mount namespace {node.mnt_ns}")
    if subprocess.run(["iptables", "-t", "nat", "-S", "K8STEST-NODES"], capture_output=True).returncode == 0:
        left.append("iptables -t nat chain K8STEST-NODES")
    if HOSTS_MARK in Path("/etc/hosts").read_text():
        left.append("a node's name in /etc/hosts")
    return left


def remove_cgroups(timeout=15):
    """The pod cgroups kubelet made (cgroupfs driver), leaves first; a
    cgroup whose last process is still exiting is tried again."""
    deadline = time.time() + timeout
    while True:
        left = False
        for root in pod_cgroup_roots():
            if not root.is_dir():
                continue
            for d in sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
                try:
                    d.rmdir()
                except OSError:
                    pass
            try:
                root.rmdir()
            except OSError:
                left = True
        if not left or time.time() > deadline:
            return
        time.sleep(0.5)


def cmd_down():
    if SERVICES.alive("kube-apiserver") and SERVICES.alive("kubelet"):
        delete_test_objects()
        stop_pods()
    all_nodes = nodes()
    SERVICES.stop_all([n.service("kubelet") for n in all_nodes])
    for node in all_nodes:
        remove_containers(node)
    SERVICES.stop_all([n.service("containerd") for n in all_nodes])
    kill_strays()
    kill_pod_processes()
    # containerd's mounts (rootfs overlays, shm, netns) and the pods' (a
    # namespaced node's go with its mount namespace)
    for root in (RUN, STATE / "containerd"):
        unmount_below(root)
    remove_network()
    SERVICES.stop_all(["kube-scheduler", "kube-controller-manager", "kube-apiserver", "kube-apiserver-b",
                       *(n.service("metadata") for n in all_nodes)])
    SERVICES.stop("etcd")
    restore_host()
    remove_cgroups()
    for node in namespaced_nodes():
        remove_namespaced_node(node)
        if cloud_up():
            run([sys.executable, REPO / "tests" / "openstack" / "cloud.py", "node-server-delete", node.name],
                timeout=300)
    remove_node_chain()
    remove_iptables()
    shutil.rmtree(RUN, ignore_errors=True)
    shutil.rmtree(OVERLAY / "generated", ignore_errors=True)
    (STATE / "kms-key-id").unlink(missing_ok=True)
    (STATE / "encryption-configuration-b.yaml").unlink(missing_ok=True)
    left = leftovers()
    if left:
        raise ClusterError("down left behind:\n  " + "\n  ".join(left))
    log("down: no process, container, mount, loop device, network device, iptables rule or cgroup of the "
        "cluster left")


def cmd_restart_kubelet():
    """kubelet stopped (SIGTERM) and started again, as a node's service
    manager restarts it: its pods keep running meanwhile."""
    binary("kubelet")  # before anything stops: a missing input stops nothing
    SERVICES.stop("kubelet")
    t = time.time()
    start_kubelet(nodes()[0])

    def reported_since():
        # a Ready heartbeat of the new kubelet: it has synced its pods
        r = kubectl("get", "node", NODE, "-o", "json", check=False)
        if r.returncode != 0:
            return False
        for c in json.loads(r.stdout)["status"].get("conditions", []):
            if c["type"] == "Ready" and c["status"] == "True":
                beat = time.mktime(time.strptime(c["lastHeartbeatTime"], "%Y-%m-%dT%H:%M:%SZ")) - time.timezone
                return beat >= int(t)
        return False
    SERVICES.wait_until("kubelet", reported_since, 120)
    log(f"kubelet restarted; node Ready again after {time.time() - t:.1f}s")


def cmd_restart_apiservers(rest):
    """Both apiservers stopped and started again, as after a reboot of
    their nodes: their caches of data keys are gone, so every stored
    Secret's key is asked of the KMS plugins again (Decrypt). With
    `--live`, each is waited for until it serves, not until it is ready
    (an apiserver whose plugin cannot open every Secret never is)."""
    until = "livez" if "--live" in rest else "readyz"
    binary("kube-apiserver")  # before anything stops: a missing input stops nothing
    t = time.time()
    names = ("kube-apiserver", "kube-apiserver-b")
    # abrupt, as a reboot is (its graceful drain takes longer than the test)
    SERVICES.stop_all(names, grace=3)
    # both nodes come back at once, as after a power cut
    for name in names:
        start_apiserver(name, until, wait=False)
    for name in names:
        wait_apiserver(name, until)
    log(f"apiservers restarted in {time.time() - t:.1f}s")


def namespaced_node(name):
    for node in namespaced_nodes():
        if node.name == name:
            return node
    raise ClusterError(f"{name!r} is not a node of its own namespaces (node A runs the control plane): "
                       f"{', '.join(n.name for n in namespaced_nodes())}")


def node_server_power(node, action):
    run([sys.executable, REPO / "tests" / "openstack" / "cloud.py", "node-server-power", node.name, action],
        timeout=300)


def node_mounts(node):
    """(mount point, filesystem type, source) of the mounts below the
    kubelet directory in the node's mount namespace, deepest first."""
    r = subprocess.run([*node.enter(), "findmnt", "-rn", "-o", "TARGET,FSTYPE,SOURCE"],
                       capture_output=True, text=True)
    found = []
    for line in r.stdout.splitlines():
        parts = line.split(" ")
        if len(parts) == 3 and parts[0].startswith(f"{KUBELET_DIR}/"):
            found.append(tuple(parts))
    return sorted(found, key=lambda m: m[0].count("/"), reverse=True)


def cmd_kill_node(rest):
    """`kill-node NAME`: the node dies as a machine that loses power does.
    Its kubelet, containerd, shims and pod processes are killed at once
    (SIGKILL: nothing unmounts, unstages or says goodbye to the API), and
    its Nova server goes SHUTOFF. One thing a dead machine does that
    killed processes do not: its kernel writes nothing more to its disks.
    Its block filesystems are made read-only here (which flushes what was
    written): a filesystem the node mounted must not write to the volume
    again, later, when another node has it."""
    if len(rest) != 1:
        raise ClusterError("usage: cluster.py kill-node NAME")
    node = namespaced_node(rest[0])
    t = time.time()
    for name in (node.service("kubelet"), node.service("containerd")):
        pgid = SERVICES.group(name)
        if pgid is not None:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            SERVICES.forget(name)
    deadline = time.time() + 30
    while pids := node_processes(node):
        if time.time() > deadline:
            raise ClusterError(f"processes of {node.name} outlived SIGKILL: {sorted(pids)}")
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.2)
    frozen = 0
    for target, fstype, source in node_mounts(node):
        if source.startswith("/dev/") and fstype in ("ext2", "ext3", "ext4", "xfs"):
            r = subprocess.run([*node.enter(), "mount", "-o", "remount,ro", target], capture_output=True, text=True)
            if r.returncode != 0:
                raise ClusterError(f"{node.name}: cannot make {target} read-only: {r.stderr.strip()}")
            frozen += 1
    node_server_power(node, "stop")
    log(f"{node.name} dead in {time.time() - t:.1f}s: its processes killed, {frozen} mounts of its disks "
        "read-only, its server SHUTOFF")


def node_processes(node):
    """The node's shims and whatever runs in its pods' cgroups."""
    return shim_pids([node]) | pod_processes([node])


def cmd_revive_node(rest):
    """`revive-node NAME [--as-new]`: the node back after kill-node, as a
    machine powered on again: none of its mounts of before (taken off
    without a write, kill-node made them read-only; a dead FUSE daemon's
    lazily), its server ACTIVE, containerd and kubelet started, until
    Ready. With --as-new its Node (and so its CSINode) is deleted first:
    kubelet registers it anew, with the registration taints of a new
    machine, the startup taints among them."""
    if len(rest) not in (1, 2) or (len(rest) == 2 and rest[1] != "--as-new"):
        raise ClusterError("usage: cluster.py revive-node NAME [--as-new]")
    node = namespaced_node(rest[0])
    t = time.time()
    if SERVICES.alive(node.service("kubelet")):
        raise ClusterError(f"{node.name}'s kubelet runs: kill-node it first")
    for target, _, _ in node_mounts(node):
        subprocess.run([*node.enter(), "umount", "-l", target], capture_output=True)
    if len(rest) == 2:
        kubectl("delete", "node", node.name, "--ignore-not-found", "--wait=true", timeout=120)

        def csinode_gone():
            r = kubectl("get", "csinode", node.name, "--ignore-not-found", "-o", "name", check=False)
            return r.returncode == 0 and not r.stdout.strip()
        # kubelet would otherwise find the old machine's drivers listed
        SERVICES.wait_until(f"{node.name}'s CSINode collected", csinode_gone, 60)
    node_server_power(node, "start")
    start_containerd(node)
    start_kubelet(node)
    wait_node_ready(node)
    log(f"{node.name} back and Ready in {time.time() - t:.1f}s" + (" (registered anew)" if len(rest) == 2 else ""))


def cmd_env():
    print(f"K8S_TEST_CLUSTER_DIR={STATE}")
    print(f"K8S_TEST_NODES={' '.join(n.name for n in nodes())}")
    print(f"K8S_TEST_APISERVER_B=https://{HOST}:{PORTS['apiserver-b']}")
    print(f"KUBECONFIG={STATE / 'admin.kubeconfig'}")
    print(f"K8S_TEST_NODE={NODE}")


def main(argv):
    return run_cli(argv, __doc__, {
        "up": lambda rest: cmd_up(),
        "status": lambda rest: cmd_status(),
        "down": lambda rest: cmd_down(),
        "env": lambda rest: cmd_env(),
        "restart-kubelet": lambda rest: cmd_restart_kubelet(),
        "restart-apiservers": cmd_restart_apiservers,
        "kill-node": cmd_kill_node,
        "revive-node": cmd_revive_node,
        "kubectl": lambda rest: subprocess.run(
            ["kubectl", f"--kubeconfig={STATE / 'admin.kubeconfig'}", *rest]).returncode,
    }, "cluster", {Skipped: ("SKIPPED", 3), ClusterError: ("ERROR", 1)})


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
