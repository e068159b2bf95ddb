"""The cluster's processes: every group `up` started, the pods' and the
containerd shims' processes, and their resident memory."""

from pathlib import Path

from .config import PROCESSES, namespaced_nodes


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
