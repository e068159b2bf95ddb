"""What the tests do to the cluster: restart kubelet or the apiservers, stop
a node's kubelet and start it again, restart the whole cluster, kill a
node as a machine losing power and bring it back, cut a node off from the
cloud or the apiservers and mend it."""

import json
import os
import signal
import subprocess
import sys
import time

from .config import (
    CLOUD_PORT_BASE,
    KUBELET_DIR,
    PORTS,
    REPO,
    SERVICES,
    ClusterError,
    binary,
    log,
    namespaced_nodes,
    nodes,
    run,
)
from .control_plane import start_apiserver, start_controllers, start_etcd, wait_apiserver
from .images import ctr
from .nodes import start_containerd, start_kubelet, wait_node_ready
from .pki import kubectl
from .processes import shim_pids
from .teardown import pod_processes


def reported_since(node, t):
    """The node's kubelet has sent a Ready heartbeat since `t`: a kubelet
    started at `t` has synced its pods."""
    r = kubectl("get", "node", node.name, "-o", "json", check=False)
    if r.returncode != 0:
        return False
    for c in json.loads(r.stdout)["status"].get("conditions", []):
        if c["type"] == "Ready" and c["status"] == "True":
            beat = time.mktime(time.strptime(c["lastHeartbeatTime"], "%Y-%m-%dT%H:%M:%SZ")) - time.timezone
            return beat >= int(t)
    return False


def start_kubelet_until_reported(node, t):
    start_kubelet(node)
    SERVICES.wait_until(node.service("kubelet"), lambda: reported_since(node, t), 120)


def cmd_restart_kubelet():
    """kubelet stopped (SIGTERM) and started again, as a node's service
    manager restarts it: its pods keep running meanwhile."""
    binary("kubelet")  # before anything stops: a missing input stops nothing
    SERVICES.stop("kubelet")
    t = time.time()
    start_kubelet_until_reported(nodes()[0], t)
    log(f"kubelet restarted; node Ready again after {time.time() - t:.1f}s")


def node_named(name):
    for node in nodes():
        if node.name == name:
            return node
    raise ClusterError(f"no node {name!r}: {', '.join(n.name for n in nodes())}")


def cmd_stop_kubelet(rest):
    """`stop-kubelet NAME`: the node's kubelet stopped, as a crashed
    service that nothing restarts, until `start-kubelet NAME`. Its pods run
    on, unwatched: past the node monitor's grace the node is NotReady,
    and pods whose toleration of that ends are evicted (they stay
    Terminating until the kubelet is back, or are force-deleted)."""
    if len(rest) != 1:
        raise ClusterError("usage: cluster.py stop-kubelet NAME")
    node = node_named(rest[0])
    binary("kubelet")  # the start that follows needs it: a missing input stops nothing
    SERVICES.stop(node.service("kubelet"))
    log(f"{node.name}'s kubelet stopped")


def cmd_start_kubelet(rest):
    """`start-kubelet NAME`: the node's kubelet started again, until it
    reported Ready."""
    if len(rest) != 1:
        raise ClusterError("usage: cluster.py start-kubelet NAME")
    node = node_named(rest[0])
    t = time.time()
    if SERVICES.alive(node.service("kubelet")):
        raise ClusterError(f"{node.name}'s kubelet runs: stop-kubelet it first")
    start_kubelet_until_reported(node, t)
    log(f"{node.name}'s kubelet started; Ready after {time.time() - t:.1f}s")


def kill_kms_plugins():
    """Every KMS plugin container of node A (the static pods', a chart's)
    killed, as a power cut kills them; the ids of those that ran. Their
    key lives only in their memory: once started again they must fetch it
    from Barbican before an apiserver can read a Secret."""
    node = nodes()[0]
    listed = ctr("containers", "ls", "-q", 'labels."io.kubernetes.container.name"==barbican-kms-plugin',
                 node=node).split()
    running = {line.split()[0] for line in ctr("tasks", "ls", node=node).splitlines()[1:]
               if "RUNNING" in line.split()}
    killed = []
    for cid in listed:
        if cid in running:
            ctr("tasks", "kill", "--signal", "SIGKILL", cid, node=node)
            killed.append(cid)
    if not killed:
        raise ClusterError("no running KMS plugin container on node A to kill")
    return killed


def cmd_restart_cluster(rest):
    """The whole cluster restarted, as after a power cut of its control
    plane and a restart of every node's kubelet: every kubelet, the
    scheduler, the controller-manager, both apiservers and etcd stopped
    (abruptly), then started again in order, etcd on its data of before;
    until every node reported Ready since. The pods' containers (each
    node's containerd, and the KMS plugins the apiservers need) run on
    meanwhile, writing to their volumes. `--cold`: the KMS plugins'
    containers are killed too while everything is down (a power cut of the
    control-plane node), and both apiservers are waited for until they
    serve, not until ready (readiness needs the plugins back, which the
    caller judges)."""
    cold = "--cold" in rest
    binary("kubelet")  # before anything stops: a missing input stops nothing
    binary("kube-apiserver")
    all_nodes = nodes()
    t = time.time()
    SERVICES.stop_all([n.service("kubelet") for n in all_nodes], grace=3)
    SERVICES.stop_all(["kube-scheduler", "kube-controller-manager", "kube-apiserver", "kube-apiserver-b"], grace=3)
    SERVICES.stop("etcd", grace=3)
    failed = None
    if cold:
        try:
            log(f"KMS plugin containers killed: {', '.join(c[:12] for c in kill_kms_plugins())}")
        except (ClusterError, subprocess.SubprocessError) as e:
            # the cluster comes back all the same; the failure is told after
            failed = e
    down = time.time()
    start_etcd(fresh=False)
    until = "livez" if cold else "readyz"
    for name in ("kube-apiserver", "kube-apiserver-b"):
        start_apiserver(name, until, wait=False)
    for name in ("kube-apiserver", "kube-apiserver-b"):
        wait_apiserver(name, until)
    start_controllers()
    for node in all_nodes:
        start_kubelet(node)
    for node in all_nodes:
        SERVICES.wait_until(node.service("kubelet"), lambda node=node: reported_since(node, down), 120)
    log(f"cluster restarted: down {down - t:.1f}s, every node Ready again after {time.time() - t:.1f}s")
    if failed is not None:
        raise ClusterError(f"the cold start's kill of the KMS plugins failed: {failed}")


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


# what csi-mounts runs in a node's mount namespace: the CSI mounts below
# the kubelet directory, each with what kubelet recorded of it
CSI_MOUNTS_SCRIPT = r"""
import json, os, sys
root = sys.argv[1]
found = []
for line in open("/proc/self/mountinfo"):
    fields = line.split(" ")
    target = fields[4].encode().decode("unicode_escape")
    parts = target[len(root):].split("/") if target.startswith(root + "/") else []
    if parts[1:2] == ["plugins"] and parts[-1] == "globalmount" and parts[2:4] == ["kubernetes.io", "csi"]:
        kind, pod = "staging", None
    elif parts[1:2] == ["pods"] and parts[3:5] == ["volumes", "kubernetes.io~csi"] and parts[-1] == "mount":
        kind, pod = "publish", parts[2]
    else:
        continue
    try:
        data = json.load(open(os.path.join(os.path.dirname(target), "vol_data.json")))
    except (OSError, ValueError):
        data = {}
    found.append({"target": target, "kind": kind, "pod_uid": pod, "driver": data.get("driverName"),
                  "volume_handle": data.get("volumeHandle"), "pv": data.get("specVolID"),
                  "device": fields[2]})
print(json.dumps(found))
"""


def cmd_csi_mounts(rest):
    """`csi-mounts NAME`: the node's CSI mounts (staging and publish) below
    the kubelet directory, as JSON: each one's path, kind, pod uid (of a
    publish), the driver, volume handle and PV kubelet recorded, and the
    device mounted (major:minor)."""
    if len(rest) != 1:
        raise ClusterError("usage: cluster.py csi-mounts NAME")
    node = node_named(rest[0])
    r = subprocess.run([*node.enter(), sys.executable, "-c", CSI_MOUNTS_SCRIPT, str(KUBELET_DIR)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise ClusterError(f"{node.name}: cannot list its mounts: {r.stderr.strip()}")
    print(r.stdout.strip())


def cmd_remount(rest):
    """`remount NAME TARGET ro|rw`: the filesystem of a CSI mount of the
    node (below the kubelet directory) made read-only, or writable again,
    as a filesystem that met an error turns read-only under its writers.
    A filesystem with a file open for writing refuses; a writer's shell
    opens its file for each line, so the remount is tried a few times."""
    if len(rest) != 3 or rest[2] not in ("ro", "rw"):
        raise ClusterError("usage: cluster.py remount NAME TARGET ro|rw")
    node = node_named(rest[0])
    target = rest[1]
    if not target.startswith(str(KUBELET_DIR) + "/") or "/../" in target:
        raise ClusterError(f"remount: {target} is not below {KUBELET_DIR}")
    last = ""
    for _ in range(50):
        r = subprocess.run([*node.enter(), "mount", "-o", f"remount,{rest[2]}", target],
                           capture_output=True, text=True)
        if r.returncode == 0:
            log(f"{node.name}: {target} remounted {rest[2]}")
            return
        last = r.stderr.strip()
        time.sleep(0.1)
    raise ClusterError(f"{node.name}: cannot remount {target} {rest[2]}: {last}")


# a node's cut, in its own network namespace: a chain of the filter table
# that OUTPUT jumps to, dropping what the node sends to the host's
# listeners it reaches by DNAT (the destination is the gateway once DNAT
# has run); dropped, not refused, as a cut cable or a partitioned switch
# does (callers wait for their timeouts)
CUT_CHAIN = "K8STEST-CUT"


def cut_ports(what):
    """The host ports a node is cut off from: the cloud (its services, the
    fault proxy's listeners, Ceph's monitors and NFS) or the apiservers."""
    if what == "cloud":
        return (f"{CLOUD_PORT_BASE}:{CLOUD_PORT_BASE + 199},{CLOUD_PORT_BASE + 500}:{CLOUD_PORT_BASE + 599},"
                "3300,6789,2049")
    if what == "apiserver":
        return f"{PORTS['apiserver']},{PORTS['apiserver-b']}"
    raise ClusterError(f"cut-node: {what!r} is neither cloud nor apiserver")


def cmd_cut_node(rest):
    """`cut-node NAME cloud|apiserver`: the node (not A, which is this
    host) loses its network to the cloud, or to the apiservers, until
    `mend-node NAME`; its processes run on."""
    if len(rest) != 2:
        raise ClusterError("usage: cluster.py cut-node NAME cloud|apiserver")
    node = namespaced_node(rest[0])
    ports = cut_ports(rest[1])
    ns = ["ip", "netns", "exec", node.netns, "iptables"]
    if subprocess.run([*ns, "-S", CUT_CHAIN], capture_output=True).returncode != 0:
        run([*ns, "-N", CUT_CHAIN])
        run([*ns, "-I", "OUTPUT", "-j", CUT_CHAIN])
    run([*ns, "-A", CUT_CHAIN, "-d", node.gateway, "-p", "tcp", "-m", "multiport", "--dports", ports, "-j", "DROP"])
    log(f"{node.name} cut off from the {rest[1]}")


def cmd_probe_node(rest):
    """`probe-node NAME cloud|apiserver`: whether the node reaches the
    cloud (the fault proxy's Keystone listener, the plugins' way in) or
    the first apiserver: a TCP connection from its network namespace,
    given 3 s. Prints `reachable` or `unreachable`: what proves a cut."""
    if len(rest) != 2 or rest[1] not in ("cloud", "apiserver"):
        raise ClusterError("usage: cluster.py probe-node NAME cloud|apiserver")
    node = namespaced_node(rest[0])
    port = CLOUD_PORT_BASE + 500 if rest[1] == "cloud" else PORTS["apiserver"]
    probe = "import socket, sys; socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=3)"
    r = subprocess.run(["ip", "netns", "exec", node.netns, sys.executable, "-c", probe, str(port)],
                       capture_output=True)
    print("reachable" if r.returncode == 0 else "unreachable")


def cmd_mend_node(rest):
    """`mend-node NAME`: every cut of the node ends."""
    if len(rest) != 1:
        raise ClusterError("usage: cluster.py mend-node NAME")
    node = namespaced_node(rest[0])
    ns = ["ip", "netns", "exec", node.netns, "iptables"]
    if subprocess.run([*ns, "-S", CUT_CHAIN], capture_output=True).returncode == 0:
        run([*ns, "-F", CUT_CHAIN])
    log(f"{node.name} mended")
