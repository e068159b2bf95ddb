"""The charts in the cluster tier, through Helm's own engine: the kustomize
install (tests/cluster/overlay) is replaced by the charts, installed with
values shaped like upstream's plus what this cluster needs (the overlay's
loopback addresses); a claim of each driver works; an upgrade that changes
a value rolls every plugin while two pods write every 100 ms, and no write
fails; a rollback restores the old values; an uninstall leaves only what
the reclaim policy keeps. The kustomize install is put back at the end
(also after a failure), and the retained volume is deleted through it.

Run by `charts.py --cluster` after the other cluster scenarios: it takes
the drivers away from the cluster for a while."""

import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

from charts import CHARTS, REPO, Rendering, check_rendering, load_fixture

STATE = Path(os.environ.get("K8S_TEST_CLUSTER_DIR", REPO / ".k8s-cluster"))
OVERLAY = REPO / "tests" / "cluster" / "overlay"
NAMESPACE = "openstack-system"
TEST_NAMESPACE = "helm-charts"
APP_IMAGE = "docker.io/library/busybox:1.35"
MULTI_NODE_TAINT_KEY = "csi-cluster-tier/multi-node"
DRIVERS = ["cinder.csi.openstack.org", "nfs.manila.csi.openstack.org", "cephfs.manila.csi.openstack.org"]
# what the charts own, by kind and name, in the kustomize install: taken
# away before the charts are installed (the rest of the overlay, the
# Manila classes and their Secret, stays)
CINDER_WORKLOADS = [("deployment", "csi-cinder-controllerplugin"), ("daemonset", "csi-cinder-nodeplugin")]
MANILA_WORKLOADS = [("deployment", f"csi-manila-{p}-controllerplugin") for p in ("nfs", "cephfs")] + \
    [("daemonset", f"csi-manila-{p}-nodeplugin") for p in ("nfs", "cephfs")]


def kubectl(*args, input=None, check=True, timeout=300):
    env = {**os.environ}
    env.setdefault("KUBECONFIG", str(STATE / "admin.kubeconfig"))
    out = subprocess.run(["kubectl", *args], input=input, capture_output=True, text=True, env=env,
                         timeout=timeout)
    if check and out.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)}: {out.stderr.strip()}")
    return out


def get_json(*args):
    return json.loads(kubectl("get", *args, "-o", "json").stdout)


def wait(what, check, timeout=300, interval=2):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last is True:
            return
        time.sleep(interval)
    raise AssertionError(f"{what}: not within {timeout} s (last: {last})")


def helm(namespace=NAMESPACE):
    """Helm's own engine against the cluster; its releases are kept in
    `namespace`, where they install."""
    import helm_python

    env_config = os.environ.get("KUBECONFIG", str(STATE / "admin.kubeconfig"))
    return helm_python.Config(kubeconfig_path=env_config, namespace=namespace)


def addresses():
    pairs = [l.split("=", 1) for l in (OVERLAY / "generated" / "addresses.env").read_text().splitlines() if "=" in l]
    return dict(pairs)


def cinder_values(verbosity=2, binding=None):
    """An operator's values in upstream's shapes (a Secret made from the
    values, as upstream's README has it), plus this cluster's loopback
    addresses, as the overlay patches them in."""
    gen = OVERLAY / "generated"
    addr = addresses()
    api = [{"name": k, "value": addr[k]} for k in ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT")]
    return {
        "logVerbosityLevel": verbosity,
        **({"storageClass": {"volumeBindingMode": binding}} if binding else {}),
        # the cluster has the snapshot CRDs; a name of its own beside
        # deploy/cinder/classes' csi-cinder-snapclass
        "volumeSnapshotClass": {"enabled": True, "name": "helm-cinder-snapclass"},
        "secret": {
            "enabled": True, "create": True, "name": "cinder-csi-cloud-config",
            "data": {"cloud.conf": (gen / "cinder-cloud.conf").read_text()},
            "nodeName": "cinder-csi-cloud-config-node",
            "nodeData": {"cloud.conf": (gen / "node-cloud.conf").read_text()},
        },
        "csi": {
            **{s: {"extraEnv": api} for s in ("provisioner", "attacher", "resizer", "snapshotter")},
            "plugin": {
                "extraEnv": api + [{"name": "METADATA_URL", "value": addr["METADATA_URL"]}],
                "nodePlugin": {"extraArgs": "- --metadata-url=$(METADATA_URL)"},
                "controllerPlugin": {
                    "hostNetwork": True,
                    # one node's host network: the new pod needs the old one's ports
                    "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
                },
            },
        },
    }


def manila_values(verbosity=2):
    addr = addresses()
    api = [{"name": k, "value": addr[k]} for k in ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT")]
    return {
        "logVerbosityLevel": verbosity,
        "shareProtocols": [{"protocolSelector": "NFS", "fsGroupPolicy": "None"},
                           {"protocolSelector": "CEPHFS", "fsGroupPolicy": "File"}],
        "csimanila": {"cloudConfig": {"secretName": "manila-csi-cloud-config",
                                      "nodeSecretName": "manila-csi-cloud-config-node"}},
        "nodeplugin": {"nodeplugin": {"extraEnv": api + [{"name": "METADATA_URL", "value": addr["METADATA_URL"]}],
                                      "extraArgs": ["--metadata-url=$(METADATA_URL)"]}},
        "controllerplugin": {
            "hostNetwork": True,
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
            "provisioner": {"extraEnv": api}, "resizer": {"extraEnv": api}, "snapshotter": {"extraEnv": api},
            "nodeplugin": {"extraEnv": api},
        },
    }


def remove_kustomize_install():
    """What the charts will own goes: the drivers' workloads first (their
    pods end), then every other object of deploy/suite and the Cinder
    classes the chart makes under the same names."""
    import yaml

    rendered = [d for d in yaml.safe_load_all(kubectl("kustomize", str(OVERLAY)).stdout) if d]
    for kind, name in CINDER_WORKLOADS + MANILA_WORKLOADS:
        kubectl("-n", NAMESPACE, "delete", kind, name, "--ignore-not-found", "--wait=true")
    keep_kinds = {"Namespace", "VolumeSnapshotClass"}
    doomed = [d for d in rendered
              if d["kind"] not in keep_kinds
              and not (d["kind"] == "StorageClass" and d["metadata"]["name"].startswith("csi-manila-"))
              and not (d["kind"] == "StorageClass" and d["metadata"]["name"] not in
                       ("csi-cinder-sc-delete", "csi-cinder-sc-retain"))
              and not (d["kind"] == "Secret" and d["metadata"]["name"] == "csi-manila-secrets")]
    kubectl("delete", "--ignore-not-found", "--wait=true", "-f", "-", input=yaml.safe_dump_all(doomed))


# Kubernetes #133827 (open): a policy whose parameter is a built-in kind,
# deleted with its binding and created again (an uninstall and an install,
# a kustomize delete and apply), refuses whatever it matches with "no
# params found for policy binding" until the apiserver restarts. The mount
# pod policy has no parameter for that reason; met here, it would mean the
# policy has one again.
PARAM_BUG = "no params found for policy binding"


def running_unless_param_bug(pod):
    """Whether the pod runs; a mount pod refused for want of a parameter
    fails the test at once (nothing restarts the apiservers)."""
    state = running(pod)
    if state is not True:
        events = kubectl("-n", TEST_NAMESPACE, "get", "events", "--field-selector", f"involvedObject.name={pod}",
                         "-o", "jsonpath={.items[*].message}", check=False).stdout
        if PARAM_BUG in events:
            raise AssertionError(f"{pod}'s mount pod refused: {PARAM_BUG} (Kubernetes #133827: the mount pod policy must not "
                          "take a parameter)")
    return state


def restore_kustomize_install():
    kubectl("apply", "-k", str(OVERLAY))
    for kind, name in CINDER_WORKLOADS + MANILA_WORKLOADS:
        kubectl("-n", NAMESPACE, "rollout", "status", f"{kind}/{name}", "--timeout=300s")
    wait("every driver registered on every node again", drivers_registered)


def drivers_registered():
    nodes = {n["metadata"]["name"] for n in get_json("nodes")["items"]}
    missing = []
    for csinode in get_json("csinodes")["items"]:
        have = {d["name"] for d in csinode["spec"].get("drivers") or []}
        missing += [f"{csinode['metadata']['name']}:{d}" for d in DRIVERS if d not in have]
    seen = {c["metadata"]["name"] for c in get_json("csinodes")["items"]}
    return True if not missing and nodes <= seen else f"missing {missing or sorted(nodes - seen)}"


def rolled_out(workloads):
    for kind, name in workloads:
        kubectl("-n", NAMESPACE, "rollout", "status", f"{kind}/{name}", "--timeout=300s")


def plugin_args(kind, name, container):
    obj = get_json("-n", NAMESPACE, kind, name)
    return next(c["args"] for c in obj["spec"]["template"]["spec"]["containers"] if c["name"] == container)


def rolled_to(debug, writers, what):
    """Every plugin rolled out with (or without) the debug log level, every
    driver registered again, and each writer wrote on through it: the
    numbers it wrote since `writers`."""
    rolled_out(CINDER_WORKLOADS + MANILA_WORKLOADS)
    for workloads, container in ((CINDER_WORKLOADS, "cinder-csi-plugin"), (MANILA_WORKLOADS, "manila-csi-plugin")):
        for kind, name in workloads:
            args = plugin_args(kind, name, container)
            assert ("--log-level=debug" in args) == debug, f"{name} after {what}: {args}"
    wait(f"every driver registered after {what}", drivers_registered)
    time.sleep(2)
    now = {p: writes(p) for p in writers}
    for p in writers:
        assert now[p] > writers[p], f"{p} wrote nothing through {what} ({writers[p]} -> {now[p]})"
    print(f"   {what}: the writers went on ({writers} -> {now})")
    return now


def pod_on(node, name, claim, file="seq"):
    """A pod on `node` appending a sequence number to /data/<file> every
    100 ms, each synced; any failed write ends it (restartPolicy Never)."""
    # each line: the number and the node's uptime (busybox's date has no
    # sub-second format), for the longest gap between two writes
    script = ("i=0; while true; do i=$((i+1)); read up idle < /proc/uptime; "
              f"echo \"$i $up\" >> /data/{file} || exit 1; sync || exit 1; sleep 0.1; done")
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": TEST_NAMESPACE},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 2,
            # through the scheduler: a WaitForFirstConsumer claim is made
            # for the node it picks
            "nodeSelector": {"kubernetes.io/hostname": node},
            "tolerations": [{"key": MULTI_NODE_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [{"name": "app", "image": APP_IMAGE, "command": ["sh", "-c", script],
                            "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}],
        },
    }


def claim(name, storage_class, mode="ReadWriteOnce", size="1Gi"):
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "namespace": TEST_NAMESPACE},
            "spec": {"accessModes": [mode], "storageClassName": storage_class,
                     "resources": {"requests": {"storage": size}}}}


def apply(*objects):
    import yaml

    kubectl("apply", "-f", "-", input=yaml.safe_dump_all(list(objects)))


LONGEST_GAPS = {}


def writes(pod, read=("cat", "/data/seq"), key=None):
    """The last number the pod wrote (as `read`, run in the pod, prints its
    records): every number from 1 is there once, in order (no write lost),
    and the pod still runs, never restarted (a failed write ends it).
    Records the longest gap between two writes, under `key` (the pod's
    name by default)."""
    p = get_json("-n", TEST_NAMESPACE, "pod", pod)
    if p["status"].get("phase") != "Running":
        raise AssertionError(f"{pod} is {p['status'].get('phase')}: a write failed "
                             f"({kubectl('-n', TEST_NAMESPACE, 'logs', pod, check=False).stdout[-400:]})")
    lines = [l for l in kubectl("-n", TEST_NAMESPACE, "exec", pod, "--", *read).stdout.splitlines() if l.strip()]
    numbers = [int(l.split()[0]) for l in lines]
    if numbers != list(range(1, len(numbers) + 1)):
        raise AssertionError(f"{pod}: the numbers {' '.join(read)} shows are not 1..{len(numbers)} in order")
    uptimes = [float(l.split()[1]) for l in lines]
    gaps = [b - a for a, b in zip(uptimes, uptimes[1:])]
    LONGEST_GAPS[key or pod] = max(gaps, default=0.0)
    return numbers[-1] if numbers else 0


def running(pod):
    p = get_json("-n", TEST_NAMESPACE, "pod", pod)
    return True if p["status"].get("phase") == "Running" else p["status"].get("phase")


def worker_nodes():
    nodes = sorted(n["metadata"]["name"] for n in get_json("nodes")["items"])
    others = [n for n in nodes if n != "localhost"]
    return (others + ["localhost", "localhost"])[:2]


def every_rendering_is_taken_by_the_apiserver(renderings):
    """Every rendering of the fixtures, as the cluster's apiserver takes it
    (its admission, defaults and validation; nothing changed). Objects of
    an API the cluster does not serve (a PodMonitor) are schema-checked
    only."""
    import yaml

    served = set(kubectl("api-versions").stdout.split())
    for r in renderings:
        docs = [d for _, d in r.docs if d["apiVersion"] in served]
        with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
            yaml.safe_dump_all(docs, f)
            f.flush()
            out = kubectl("apply", "--dry-run=server", "-f", f.name, check=False)
        if out.returncode != 0:
            raise AssertionError(f"{r.chart_name} ({r.values and sorted(r.values)}): the apiserver refused "
                                 f"the rendering:\n{out.stderr.strip()}")


def install_upgrade_rollback_uninstall():
    cfg = helm()
    kubectl("create", "namespace", TEST_NAMESPACE)
    kubectl("label", "namespace", TEST_NAMESPACE, "csi-cluster-tier=test")
    # the Manila plugins' own cloud.conf: an existing Secret, named in the values
    gen = OVERLAY / "generated"
    for name, f in (("manila-csi-cloud-config", "manila-cloud.conf"), ("manila-csi-cloud-config-node", "node-cloud.conf")):
        kubectl("-n", NAMESPACE, "create", "secret", "generic", name, f"--from-file=cloud.conf={gen / f}")
    try:
        remove_kustomize_install()
        renderings = [Rendering(chart, load_fixture(f)) for chart, f in (
            ("openstack-cinder-csi", "cinder-operator.yaml"), ("openstack-cinder-csi", "cinder-multicloud.yaml"),
            ("openstack-cinder-csi", "cinder-kubelet-dir.yaml"), ("openstack-manila-csi", "manila-operator.yaml"),
            ("openstack-manila-csi", "manila-kubelet-dir.yaml"))]
        for r in renderings:
            check_rendering(r)
        every_rendering_is_taken_by_the_apiserver(renderings)
        # this cluster's own values, through Helm's dry run against the
        # apiserver (it knows the cluster's APIs: the snapshot CRDs)
        cfg.install(str(CHARTS / "openstack-cinder-csi"), "cinder-csi", cinder_values(), namespace=NAMESPACE,
                    dry_run="server")
        cfg.install(str(CHARTS / "openstack-manila-csi"), "manila-csi", manila_values(), namespace=NAMESPACE,
                    dry_run="server")

        started = time.monotonic()
        cfg.install(str(CHARTS / "openstack-cinder-csi"), "cinder-csi", cinder_values(), namespace=NAMESPACE,
                    wait="watcher", timeout=300)
        cfg.install(str(CHARTS / "openstack-manila-csi"), "manila-csi", manila_values(), namespace=NAMESPACE,
                    wait="watcher", timeout=300)
        rolled_out(CINDER_WORKLOADS + MANILA_WORKLOADS)
        wait("every driver registered on every node by the charts' plugins", drivers_registered)
        assert get_json("volumesnapshotclass", "helm-cinder-snapclass")["driver"] == "cinder.csi.openstack.org"
        # before 1.35, NOTES says the attach count is read once (the
        # feature gate that refreshes it is off by default in 1.34)
        minor = int(json.loads(kubectl("version", "-o", "json").stdout)["serverVersion"]["minor"].rstrip("+"))
        notes = json.dumps(cfg.get_all("cinder-csi").get("info", {}))
        said = "MutableCSINodeAllocatableCount" in notes
        assert said == (minor < 35), f"Kubernetes 1.{minor}: the gate {'named' if said else 'not named'} in NOTES"
        print(f"   installed in {time.monotonic() - started:.0f} s (Kubernetes 1.{minor}: "
              f"{'NOTES names the attach count feature gate' if said else 'no feature gate named'})")

        # a claim of each driver: two writers, on two nodes; an NFS claim bound
        cinder_node, cephfs_node = worker_nodes()
        apply(claim("block", "csi-cinder-sc-delete"), claim("shared", "csi-manila-cephfs", "ReadWriteMany"),
              claim("nfs", "csi-manila-nfs", "ReadWriteMany"), claim("kept", "csi-cinder-sc-retain"))
        apply(pod_on(cinder_node, "block-writer", "block"), pod_on(cephfs_node, "shared-writer", "shared"),
              pod_on(cinder_node, "kept-writer", "kept"))
        for pod in ("block-writer", "shared-writer", "kept-writer"):
            wait(f"{pod} running", lambda: running_unless_param_bug(pod))
        wait("the NFS claim bound", lambda: get_json("-n", TEST_NAMESPACE, "pvc", "nfs")["status"].get("phase") == "Bound")
        before = {p: writes(p) for p in ("block-writer", "shared-writer")}

        # an upgrade that changes a value rolls every plugin; no write
        # fails. It also asks upstream's binding mode of the classes,
        # which the apiserver cannot change: the installed classes keep
        # theirs (the apiserver refused the whole upgrade before), and
        # NOTES says so
        bindings = {c: get_json("storageclass", c).get("volumeBindingMode")
                    for c in ("csi-cinder-sc-delete", "csi-cinder-sc-retain")}
        assert set(bindings.values()) == {"WaitForFirstConsumer"}, bindings
        cfg.upgrade(str(CHARTS / "openstack-cinder-csi"), "cinder-csi",
                    cinder_values(verbosity=4, binding="Immediate"),
                    namespace=NAMESPACE, wait="watcher", timeout=300)
        kept = {c: get_json("storageclass", c).get("volumeBindingMode") for c in bindings}
        assert kept == bindings, f"the classes' binding mode after the upgrade: {kept}"
        stored = json.dumps(cfg.get_all("cinder-csi").get("info", {}))
        assert "csi-cinder-sc-delete keeps volumeBindingMode WaitForFirstConsumer" in stored, \
            f"the release's NOTES: {stored[:3000]}"
        cfg.upgrade(str(CHARTS / "openstack-manila-csi"), "manila-csi", manila_values(verbosity=4),
                    namespace=NAMESPACE, wait="watcher", timeout=300)
        after = rolled_to(debug=True, writers=before, what="the upgrade")

        # a rollback restores the old values
        cfg.rollback("cinder-csi", version=1, wait="watcher", timeout=300)
        cfg.rollback("manila-csi", version=1, wait="watcher", timeout=300)
        rolled_to(debug=False, writers=after, what="the rollback")
        assert "-v=2" in plugin_args(*CINDER_WORKLOADS[0], "csi-provisioner"), "the sidecars' -v rolled back"

        # the claims go (the Delete class's volume with them), then the
        # charts: only the retained volume stays
        kubectl("-n", TEST_NAMESPACE, "delete", "pod", "--all", "--wait=true")
        kept_pv = get_json("-n", TEST_NAMESPACE, "pvc", "kept")["spec"]["volumeName"]
        block_pv = get_json("-n", TEST_NAMESPACE, "pvc", "block")["spec"]["volumeName"]
        kubectl("-n", TEST_NAMESPACE, "delete", "pvc", "--all", "--wait=true")
        wait("the Delete class's volume deleted",
             lambda: kubectl("get", "pv", block_pv, check=False).returncode != 0 or f"{block_pv} still there")
        cfg.uninstall("cinder-csi", wait="watcher", timeout=300)
        cfg.uninstall("manila-csi", wait="watcher", timeout=300)
        for kind, name in CINDER_WORKLOADS + MANILA_WORKLOADS:
            wait(f"{name} gone", lambda: kubectl("-n", NAMESPACE, "get", kind, name, check=False).returncode != 0)
        assert kubectl("get", "volumesnapshotclass", "helm-cinder-snapclass", check=False).returncode != 0, \
            "uninstall left the VolumeSnapshotClass it made"
        left = [d for d in DRIVERS if kubectl("get", "csidriver", d, check=False).returncode == 0]
        assert not left, f"uninstall left CSIDrivers {left}"
        left = [s for s in ("cinder-csi-cloud-config", "cinder-csi-cloud-config-node")
                if kubectl("-n", NAMESPACE, "get", "secret", s, check=False).returncode == 0]
        assert not left, f"uninstall left the Secrets it made: {left}"
        pv = get_json("pv", kept_pv)
        assert pv["spec"]["persistentVolumeReclaimPolicy"] == "Retain" and pv["status"]["phase"] == "Released", \
            f"the retained volume: {pv['status']}"
        print(f"   uninstall: only the retained volume {kept_pv} is left; the longest gap between two "
              f"writes through the upgrade and the rollback: "
              + ", ".join(f"{p} {g:.2f} s" for p, g in sorted(LONGEST_GAPS.items())))
    finally:
        for release in ("cinder-csi", "manila-csi"):
            try:
                cfg.uninstall(release, wait="watcher", timeout=300, ignore_not_found=True)
            except Exception as e:  # cleanup: report, go on restoring
                print(f"   cleanup: uninstall {release}: {e}")
        kubectl("delete", "namespace", TEST_NAMESPACE, "--ignore-not-found", "--wait=false", check=False)
        kubectl("-n", NAMESPACE, "delete", "secret", "manila-csi-cloud-config", "manila-csi-cloud-config-node",
                "--ignore-not-found", check=False)
        restore_kustomize_install()
        # the retained volume (also after a failure), deleted through the
        # kustomize install again
        for pv in get_json("pv")["items"]:
            if (pv["spec"].get("csi") or {}).get("driver") in DRIVERS and \
                    pv["spec"].get("claimRef", {}).get("namespace") == TEST_NAMESPACE:
                name = pv["metadata"]["name"]
                kubectl("patch", "pv", name, "--type=merge", "-p",
                        '{"spec":{"persistentVolumeReclaimPolicy":"Delete"}}')
                wait(f"the retained {name} deleted",
                     lambda: kubectl("get", "pv", name, check=False).returncode != 0 or f"{name} still there")
        wait(f"namespace {TEST_NAMESPACE} gone",
             lambda: kubectl("get", "namespace", TEST_NAMESPACE, check=False).returncode != 0)


def apiserver_b():
    base = int(os.environ.get("K8S_TEST_PORT_BASE", "26000"))
    return os.environ.get("K8S_TEST_APISERVER_B", f"https://127.0.0.1:{base + 444}")


def kms_b_metrics():
    out = subprocess.run(["curl", "-sS", "--max-time", "5", "http://127.0.0.1:9900/metrics"],
                         capture_output=True, text=True)
    calls = {}
    for line in out.stdout.splitlines():
        if line.startswith("grpc_server_handled_total{") and 'code="OK"' in line:
            method = line.split('method="', 1)[1].split('"', 1)[0].rsplit("/", 1)[-1]
            calls[method] = calls.get(method, 0) + int(float(line.rsplit(" ", 1)[1]))
    return calls


# the test cloud's Keystone by a name that only the control-plane node's
# own resolver answers (tests/cluster/k8stier/host_dns.py); cluster DNS is
# down for the whole tier (kubelet's clusterDNS answers nothing)
CLOUD_BY_NAME = "keystone.cloud.k8s-test.internal"
CLUSTER_DNS = ("127.0.0.154", 53)


def cloud_conf_by_name(text):
    """cloud.conf with Keystone's address in auth-url replaced by its name."""
    lines = []
    for line in text.splitlines():
        if line.replace(" ", "").startswith("auth-url="):
            assert "127.0.0.1" in line, f"the test cloud's auth-url is not on 127.0.0.1: {line}"
            line = line.replace("127.0.0.1", CLOUD_BY_NAME)
        lines.append(line)
    return "\n".join(lines) + "\n"


def write_in_place(path, text):
    """`path` rewritten in place: only the file is mounted into the
    plugin's pod, and a file moved over it would not be seen there."""
    with path.open("r+") as f:
        f.seek(0)
        f.write(text)
        f.truncate()


def cluster_dns_refuses():
    """Nothing answers at the cluster DNS address: a query is refused."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(2)
        sock.connect(CLUSTER_DNS)
        try:
            sock.send(b"\x00\x01\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x00\x01\x00\x01")
            sock.recv(512)
        except ConnectionRefusedError:
            return True
        except OSError:
            return False
    return False


def host_dns_answers_since(t):
    """The node resolver's answers for the cloud's name logged after `t`."""
    log = STATE / "logs" / "host-dns.log"
    answered = 0
    for line in log.read_text(errors="replace").splitlines():
        when, _, said = line.partition(" ")
        try:
            at = float(when)
        except ValueError:
            continue
        if at > t and said == f"{CLOUD_BY_NAME} type 1: 127.0.0.1":
            answered += 1
    return answered


def kms_chart_pod():
    pods = get_json("-n", "kube-system", "pods", "-l", "app=barbican-kms-plugin")["items"]
    ours = [p for p in pods if p["metadata"].get("ownerReferences", [{}])[0].get("kind") == "DaemonSet"]
    assert len(ours) == 1, f"the chart's KMS plugin: {len(ours)} pods"
    statuses = ours[0]["status"].get("containerStatuses", [])
    return ours[0]["metadata"]["name"], sum(c.get("restartCount", 0) for c in statuses)


def the_kms_charts_plugin_serves_the_apiserver():
    """The second control-plane "node"'s KMS plugin (a static pod, as
    deploy/kms ships it) is replaced by the chart's DaemonSet on the same
    socket, cloud.conf and port; the apiservers restart, and the second one
    writes and reads Secrets through the chart's plugin alone. Then its
    cloud.conf names Keystone by a name only the node's own resolver
    answers (cluster DNS is down for the whole tier), and the control plane
    is stopped cold (etcd, both apiservers, the controllers, every kubelet,
    and the KMS plugins killed as a power cut kills them) and started
    again: the chart's plugin, started again by kubelet, must fetch its key
    through Keystone by name with cluster DNS down, or apiserver B never
    becomes ready and cannot read the Secret it sealed. Then the static pod
    comes back."""
    cfg = helm("kube-system")
    manifest = STATE / "manifests" / "barbican-kms-plugin-b.yaml"
    stash = STATE / "barbican-kms-plugin-b.yaml.helm-test"
    conf = Path("/etc/kubernetes/cloud-config-b/cloud.conf")
    values = {
        "socketDir": "/var/lib/kms-b",
        "cloudConfig": {"hostDir": str(conf.parent)},
        "httpEndpoint": {"port": 9900},
        # this cluster's control-plane node carries no control-plane label
        "affinity": None,
        "nodeSelector": {"kubernetes.io/hostname": "localhost"},
    }
    r = Rendering("barbican-kms-plugin", values, namespace="kube-system")
    check_rendering(r)
    b = ["--server", apiserver_b()]
    ns = "helm-charts-kms"
    assert CLOUD_BY_NAME not in Path("/etc/hosts").read_text(), "the cloud's name must come from DNS alone"
    assert cluster_dns_refuses(), f"something answers DNS at cluster DNS's {CLUSTER_DNS}: it must be down"
    by_ip = conf.read_text()
    manifest.rename(stash)
    try:
        wait("the static KMS plugin of B gone", lambda: kubectl(
            "-n", "kube-system", "get", "pod", "barbican-kms-plugin-b-localhost", check=False).returncode != 0)
        cfg.install(str(CHARTS / "barbican-kms-plugin"), "barbican-kms", values, namespace="kube-system",
                    wait="watcher", timeout=300)
        kubectl("-n", "kube-system", "rollout", "status", "daemonset/barbican-kms-plugin", "--timeout=300s")
        subprocess.run(["python3", str(REPO / "tests" / "cluster" / "cluster.py"), "restart-apiservers"], check=True,
                       timeout=600)
        before = kms_b_metrics()
        kubectl("create", "namespace", ns)
        kubectl(*b, "-n", ns, "create", "secret", "generic", "through-the-chart",
                "--from-literal=word=sealed-by-the-chart")
        got = kubectl(*b, "-n", ns, "get", "secret", "through-the-chart",
                      "-o", "jsonpath={.data.word}").stdout
        import base64

        assert base64.b64decode(got).decode() == "sealed-by-the-chart", got
        after = kms_b_metrics()
        served = {m: after.get(m, 0) for m in ("Status", "Encrypt", "Decrypt")}
        assert after.get("Encrypt", 0) >= 1 and after.get("Status", 0) >= 1, \
            f"the chart's plugin was not asked to seal: {before} -> {after}"
        print(f"   the chart's KMS plugin served apiserver B: {served}")

        # from now on Keystone by name; the running plugin keeps its key,
        # so the cold start is where the name must resolve
        write_in_place(conf, cloud_conf_by_name(by_ip))
        pod, restarts = kms_chart_pod()
        t = time.time()
        subprocess.run(["python3", str(REPO / "tests" / "cluster" / "cluster.py"), "restart-cluster", "--cold"],
                       check=True, timeout=900)
        back = time.time()
        wait("apiserver B ready after the cold start, through the chart's plugin",
             lambda: kubectl(*b, "get", "--raw", "/readyz", check=False).returncode == 0 or "not ready",
             timeout=180)
        ready = time.time()
        # apiserver A (the default kubeconfig's, Helm's) opens no Secret
        # until its own plugin has answered once after the cold start: the
        # uninstall below reads the release's Secrets through it
        wait("apiserver A ready after the cold start, through its own plugin",
             lambda: kubectl("get", "--raw", "/readyz", check=False).returncode == 0 or "not ready",
             timeout=180)
        got = kubectl(*b, "-n", ns, "get", "secret", "through-the-chart", "-o", "jsonpath={.data.word}").stdout
        assert base64.b64decode(got).decode() == "sealed-by-the-chart", got
        pod_after, restarts_after = kms_chart_pod()
        assert pod_after == pod and restarts_after > restarts, \
            f"the chart's plugin was not started again: {pod} {restarts} -> {pod_after} {restarts_after}"
        answered = host_dns_answers_since(t)
        assert answered >= 1, "the node's resolver answered no lookup of the cloud's name since the cold stop"
        assert cluster_dns_refuses(), "cluster DNS answered during the cold start"
        decrypts = kms_b_metrics().get("Decrypt", 0)
        assert decrypts >= 1, "the restarted plugin was asked no Decrypt"
        print(f"   cold start: the control plane stopped and started in {back - t:.0f} s; apiserver B ready "
              f"{ready - back:.0f} s later through the chart's plugin (started again: {restarts} -> "
              f"{restarts_after} restarts; {answered} lookups of {CLOUD_BY_NAME} answered by the node's "
              f"resolver, cluster DNS refusing; {decrypts} Decrypt since)")
        cfg.uninstall("barbican-kms", wait="watcher", timeout=300)
        wait("the chart's KMS plugin gone", lambda: kubectl(
            "-n", "kube-system", "get", "daemonset", "barbican-kms-plugin", check=False).returncode != 0)
    finally:
        try:
            cfg.uninstall("barbican-kms", wait="watcher", timeout=300, ignore_not_found=True)
        except Exception as e:  # cleanup: report, go on restoring
            print(f"   cleanup: uninstall barbican-kms: {e}")
        write_in_place(conf, by_ip)
        stash.rename(manifest)
        kubectl("delete", "namespace", ns, "--ignore-not-found", "--wait=true", check=False)
    wait("the static KMS plugin of B back", lambda: (get_json("-n", "kube-system", "pod",
                                                               "barbican-kms-plugin-b-localhost")
                                                      ["status"].get("phase") == "Running")
         if kubectl("-n", "kube-system", "get", "pod", "barbican-kms-plugin-b-localhost",
                    check=False).returncode == 0 else "not yet")
    wait("apiserver B ready on its own plugin",
         lambda: kubectl(*b, "get", "--raw", "/readyz", check=False).returncode == 0)


TESTS = [("in-cluster/" + f.__name__, f) for f in (
    install_upgrade_rollback_uninstall,
    the_kms_charts_plugin_serves_the_apiserver,
)]
