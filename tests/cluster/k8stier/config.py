"""The cluster tier's settings (ports, paths, images, drivers, sidecars),
its nodes (class Node), errors, logging, the process supervisor of
tests/lib/services.py, and the Kubernetes binaries of $KUBE_BIN_DIR."""

import os
import re
import subprocess
import sys
from pathlib import Path

# tests/cluster: cluster.py, the overlay and the addons beside it
HERE = Path(__file__).resolve().parent.parent
REPO = HERE.parent.parent
sys.path.insert(0, str(HERE.parent / "lib"))
# group_rss_kib, http, port_open and run_cli are for the other parts
from services import Services, group_rss_kib, http, port_open, run_cli  # noqa: E402, F401

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
                   "busybox-static", "openssl", "iproute2", "iptables"]
# the drivers deploy/suite registers with kubelet
DRIVERS = ["cinder.csi.openstack.org", "nfs.manila.csi.openstack.org", "cephfs.manila.csi.openstack.org"]
SIDECARS = ["csi-provisioner", "csi-attacher", "csi-resizer", "csi-snapshotter", "snapshot-controller",
            "csi-node-driver-registrar", "livenessprobe"]
CONTROL_PLANE = ["kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet"]
PROCESSES = ["kubelet", "containerd", "kube-scheduler", "kube-controller-manager", "kube-apiserver",
             "kube-apiserver-b", "etcd", "metadata", "host-dns"]
# DNS (k8stier/host_dns.py): the control-plane node's own resolver answers
# the test cloud's names under HOST_DNS_ZONE (its pods with dnsPolicy
# Default ask it, through kubelet's resolvConf); cluster DNS is down for
# the whole tier: nothing answers at CLUSTER_DNS, in any node's namespace
# (refused at once, as a Service without endpoints is)
HOST_DNS = "127.0.0.153"
HOST_DNS_ZONE = "cloud.k8s-test.internal"
CLUSTER_DNS = "127.0.0.154"

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
