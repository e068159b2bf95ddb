"""The nodes: each one's containerd and kubelet (A in the host's namespaces,
B, C... each in a network and mount namespace of its own), its Nova server
and instance metadata."""

import json
import shutil
import socket
import subprocess
import sys
from pathlib import Path

from .config import (
    BRIDGE,
    CLOUD,
    CLOUD_PORT_BASE,
    CLUSTER_DNS,
    HERE,
    HOST_DNS,
    HOST_DNS_ZONE,
    KUBELET_DIR,
    MULTI_NODE_TAINT,
    PAUSE_IMAGE,
    PORTS,
    REPO,
    RUN,
    SERVICES,
    STARTUP_TAINTS,
    STATE,
    ClusterError,
    binary,
    http,
    log,
    port_open,
    run,
)
from .cri import cri_answers
from .host import is_mountpoint
from .images import ctr
from .pki import kubectl


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
    # its CRI, not only its own API: kubelet exits when the CRI is not
    # initialized yet (k8stier/cri.py)
    SERVICES.wait_until(node.service("containerd"), lambda: ctr("version", check=False, node=node).returncode == 0
                        and cri_answers(node.containerd_sock), 60)


def start_host_dns():
    """The control-plane node's own resolver (k8stier/host_dns.py), and the
    resolv.conf that names it, which node A's kubelet gives its pods of
    dnsPolicy Default."""
    (STATE / "host-resolv.conf").write_text(f"nameserver {HOST_DNS}\n")
    SERVICES.start("host-dns", [sys.executable, HERE / "k8stier" / "host_dns.py", HOST_DNS, HOST_DNS_ZONE])

    def answers():
        # one A query for a name of its zone, straight to it
        query = (b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00"
                 + b"".join(bytes([len(p)]) + p.encode() for p in f"probe.{HOST_DNS_ZONE}".split("."))
                 + b"\x00\x00\x01\x00\x01")
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.settimeout(1)
            try:
                s.sendto(query, (HOST_DNS, 53))
                reply = s.recv(512)
            except OSError:
                return False
        return reply[:2] == b"\x12\x34" and reply.endswith(bytes([127, 0, 0, 1]))

    SERVICES.wait_until("host-dns", answers, 30)
    # and cluster DNS is down: a query there is refused
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(2)
        s.connect((CLUSTER_DNS, 53))
        try:
            s.send(b"\x00\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00")
            s.recv(512)
            refused = False
        except ConnectionRefusedError:
            refused = True
        except OSError:
            refused = False
    if not refused:
        raise ClusterError(f"something answers DNS at {CLUSTER_DNS}, the tier's cluster DNS, which must be down")


def start_kubelet(node):
    config = node.state / "kubelet.yaml"
    (node.state / "manifests").mkdir(parents=True, exist_ok=True)
    cgroup_root = f"cgroupRoot: /{node.cgroup_root}\n" if node.cgroup_root else ""
    # pods of dnsPolicy Default on A ask the node's own resolver; the others
    # keep their mount namespace's /etc/resolv.conf
    resolv = f"resolvConf: {STATE / 'host-resolv.conf'}\n" if node.host else ""
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
# cluster DNS is down for the whole tier: nothing answers there
clusterDNS: ["{CLUSTER_DNS}"]
{resolv}# a shared disk must not evict the test pods, nor collect the imported images;
# absolute sizes, as 1% of a 250 GB disk is 2.5 GB, which a CI run's build
# can take the disk under and so leave every pod Pending on DiskPressure
evictionHard:
  memory.available: "100Mi"
  nodefs.available: "100Mi"
  nodefs.inodesFree: "1%"
  imagefs.available: "100Mi"
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
    if it were the host: the cloud (its services, Ceph, and the fault
    proxy's listeners 500 ports up), both apiservers, and its own metadata
    service under A's port (the manifests name one address for every node)."""
    shared = (f"{CLOUD_PORT_BASE}:{CLOUD_PORT_BASE + 199},{CLOUD_PORT_BASE + 500}:{CLOUD_PORT_BASE + 599},"
              f"3300,6789,2049,{PORTS['apiserver']},{PORTS['apiserver-b']}")
    return [(shared, None), (str(PORTS["metadata"]), node.metadata_port)]


def node_ns_run(node, script):
    run(["nsenter", f"--net=/run/netns/{node.netns}", f"--mount={node.mnt_ns}", "--", "sh", "-euc", script])


def prepare_namespaced_node(node):
    """The node's network namespace (a veth pair: host .1, node .2, no
    route out; its 127.0.0.1 reaches the host's listeners it needs through
    DNAT, and nothing else), its mount namespace (its own /var/lib/kubelet,
    shared for Bidirectional mounts, and /dev/disk/by-id), its cgroup root
    and its name in /etc/hosts (the apiserver reaches kubelets by name)."""
    if not namespaces_are_this_checkouts(node):
        # their names are fixed: a run cut off before its `down`, or
        # another checkout's cluster (CI's fresh clones), leaves them
        # pointing at its own folders, where this cloud links no disk.
        # Removed before the node's folders are made: the removal takes
        # the node's state with it (CI once bound a folder it had just
        # deleted this way)
        log(f"{node.name}: its namespaces were left by an earlier cluster: made again")
        remove_namespaced_node(node)
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
        rule = [chain, "-i", node.veth, "-d", node.gateway, "-p", "tcp", "-m", "multiport", "--dports",
                f"{host_ports},{node.metadata_port}", "-j", "DNAT", "--to-destination", "127.0.0.1"]
        if subprocess.run(["iptables", "-t", "nat", "-C", *rule], capture_output=True).returncode != 0:
            run(["iptables", "-t", "nat", "-A", *rule])
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


def namespaces_are_this_checkouts(node):
    """Whether the node's network and mount namespaces, if any, are the
    ones this checkout made: both there or both not, and the mount
    namespace's /var/lib/kubelet is this checkout's folder for the node."""
    has_net = Path(f"/run/netns/{node.netns}").exists()
    if has_net != node.mnt_ns.exists():
        return False
    if not has_net:
        return True
    if not node.kubelet_dir.exists():
        return False
    seen = subprocess.run(["nsenter", f"--mount={node.mnt_ns}", "--", "stat", "-c", "%d:%i", str(KUBELET_DIR)],
                          capture_output=True, text=True)
    own = node.kubelet_dir.stat()
    return seen.returncode == 0 and seen.stdout.strip() == f"{own.st_dev}:{own.st_ino}"


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
    # a machine the tier never came up on may not have iptables at all:
    # then it holds none of our rules either
    has_iptables = shutil.which("iptables") is not None
    r = subprocess.run(["iptables", "-t", "nat", "-S", chain], capture_output=True, text=True) \
        if has_iptables else subprocess.CompletedProcess([], 1, "", "")
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
    if shutil.which("iptables") is None:
        return
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
