"""Taking the cluster down: what the tests left, the pods, containers,
processes, network devices, iptables rules and cgroups, and what would be
left behind."""

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from .config import (
    BRIDGE,
    CLOUD,
    KUBELET_DIR,
    OVERLAY,
    RUN,
    SERVICES,
    STATE,
    TEST_NAMESPACE_LABEL,
    log,
    namespaced_nodes,
    nodes,
)
from .host import mountinfo
from .images import ctr
from .nodes import HOSTS_MARK
from .pki import kubectl
from .processes import all_processes, shim_pids
from .suite import addons


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
    if shutil.which("iptables") is not None and \
            subprocess.run(["iptables", "-t", "nat", "-S", "K8STEST-NODES"], capture_output=True).returncode == 0:
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
