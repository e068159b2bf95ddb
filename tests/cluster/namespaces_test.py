#!/usr/bin/env python3
"""The cluster tier's own set-up of a namespaced node, against what an
earlier cluster leaves: node B's network and mount namespaces (their names
are fixed) made by another checkout, or by a run cut off before its
`down`. CI clones afresh each time, so this is what its `up` meets after
any run that did not end well; once it deleted the node's folders it was
about to bind, and the tier failed to come up.

    namespaces_test.py     exit 0 when every check holds; 1 and what failed

Runs before `cluster.py up` (it needs node B's names free: refused while
a cluster of this machine holds them). Needs root, ip and iptables.
Leaves nothing: every namespace, mount, rule and folder it made goes, also
on failure."""
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent

# what a child runs: node B prepared, removed, or described, as the
# checkout whose state is K8S_TEST_CLUSTER_DIR
CHILD = """
import sys
sys.path.insert(0, sys.argv[1])
from k8stier import config, nodes
node = config.Node(1)
what = sys.argv[2]
if what == "prepare":
    nodes.prepare_namespaced_node(node)
elif what == "remove":
    nodes.remove_namespaced_node(node)
    nodes.remove_node_chain()
elif what == "owned":
    print("yes" if nodes.namespaces_are_this_checkouts(node) else "no")
"""


def as_checkout(state, what):
    env = dict(os.environ, K8S_TEST_CLUSTER_DIR=str(state))
    r = subprocess.run([sys.executable, "-c", CHILD, str(HERE), what], env=env, capture_output=True, text=True)
    return r.returncode, r.stdout + r.stderr


def kubelet_dir_seen_by_node_b():
    """The (device, inode) node B's mount namespace has at /var/lib/kubelet."""
    r = subprocess.run(["nsenter", "--mount=/run/k8s-test-cluster/nodes/b.mnt", "--", "stat", "-c", "%d:%i",
                        "/var/lib/kubelet"], capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else None


def ident(path):
    st = Path(path).stat()
    return f"{st.st_dev}:{st.st_ino}"


def main():
    if Path("/run/netns/k8stest-b").exists():
        print("node B's namespaces exist: a cluster is up here (cluster.py down first); nothing checked")
        return 1
    sys.path.insert(0, str(HERE))
    from k8stier.config import DEBIAN_PACKAGES, SERVICES
    SERVICES.ensure_debian_packages([p for p in DEBIAN_PACKAGES if p in ("iproute2", "iptables")])
    failures = []

    def check(ok, what):
        # suite-walk's step lines, which the test command counts
        print(f"  {'ok  ' if ok else 'FAIL'}  {what}", flush=True)
        if not ok:
            failures.append(what)

    # the node's mount namespace is a copy of the host's: what it binds
    # over must be there, as `up` makes it before any node (on a fresh
    # machine neither is); what is made here goes again
    made = [d for d in (Path("/var/lib/kubelet"), Path("/dev/disk/by-id")) if not d.exists()]
    for d in made:
        d.mkdir(parents=True)
    with tempfile.TemporaryDirectory(prefix="k8s-ns-earlier-") as earlier, \
            tempfile.TemporaryDirectory(prefix="k8s-ns-this-") as this:
        try:
            rc, out = as_checkout(earlier, "prepare")
            check(rc == 0, f"an earlier checkout's node B prepared{'' if rc == 0 else ': ' + out}")
            rc, out = as_checkout(this, "owned")
            check(out.strip() == "no", "this checkout does not take the earlier one's namespaces for its own")
            rc, out = as_checkout(this, "prepare")
            check(rc == 0, f"this checkout prepares node B over them{'' if rc == 0 else ': ' + out}")
            check("left by an earlier cluster" in out, "it says it made them again")
            kubelet = Path(this) / "nodes/b/kubelet"
            check(kubelet.is_dir() and (Path(this) / "nodes/b/by-id").is_dir(), "the node's folders are there")
            check(kubelet.is_dir() and kubelet_dir_seen_by_node_b() == ident(kubelet),
                  "node B's /var/lib/kubelet is this checkout's folder")
            rc, out = as_checkout(this, "prepare")
            check(rc == 0 and "left by an earlier cluster" not in out,
                  "prepared again, its own namespaces are kept")
        finally:
            # both checkouts' removal: the namespaces are one set, the
            # earlier folders are its own
            for state in (this, earlier):
                as_checkout(state, "remove")
            for d in reversed(made):
                d.rmdir()
        check(not Path("/run/netns/k8stest-b").exists()
              and not Path("/run/k8s-test-cluster/nodes/b.mnt").exists(),
              "nothing of node B is left")
    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    print("every check held")
    return 0


if __name__ == "__main__":
    sys.exit(main())
