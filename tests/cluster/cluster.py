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
    cluster.py stop-kubelet NAME   a node's kubelet stopped (its pods run on),
                        until start-kubelet NAME (until it reported Ready)
    cluster.py restart-cluster [--cold]  every kubelet, the controllers, both
                        apiservers and etcd stopped and started again
                        (etcd on its data), until every node is Ready;
                        --cold: the KMS plugins' containers killed too while
                        all is down, as a power cut of the control-plane
                        node does (they must fetch their key again)
    cluster.py restart-apiservers [--live]  stop both apiservers and start them
                        again (until ready; --live: until they serve)
    cluster.py kill-node NAME    a node (not A) dies as a machine losing power:
                        kubelet, containerd and every pod process killed at
                        once, its Nova server SHUTOFF
    cluster.py revive-node NAME [--as-new]  the node back: no mount of before,
                        server ACTIVE, containerd and kubelet started (until
                        Ready); --as-new: its Node deleted first, so that it
                        registers anew, as a replacement machine does
    cluster.py cut-node NAME cloud|apiserver  a node (not A) cut off from
                        the cloud (its APIs, Ceph) or from the apiservers:
                        what it sends there is dropped, until mend-node
    cluster.py mend-node NAME    every cut of the node ends
    cluster.py probe-node NAME cloud|apiserver  whether the node reaches the
                        cloud or the apiserver now (reachable, unreachable)
    cluster.py csi-mounts NAME   the node's CSI staging and publish mounts,
                        with the volume kubelet recorded for each (JSON)
    cluster.py remount NAME TARGET ro|rw  the filesystem of a CSI mount of
                        the node made read-only (as one that met an error),
                        or writable again
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

import concurrent.futures
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


from k8stier.config import (
    CLOUD,
    CONTROL_PLANE,
    ClusterError,
    DEBIAN_PACKAGES,
    DRIVERS,
    HOST,
    NODE,
    OVERLAY,
    PORTS,
    REPO,
    RUN,
    SERVICES,
    SIDECARS,
    STATE,
    Skipped,
    bin_dir,
    binary,
    group_rss_kib,
    http,
    log,
    namespaced_nodes,
    nodes,
    run,
    run_cli,
)
from k8stier.control_plane import (
    install_kms,
    read_conf,
    start_apiserver,
    start_controllers,
    start_etcd,
    wait_apiserver,
)
from k8stier.faults import (
    cmd_csi_mounts,
    cmd_probe_node,
    cmd_remount,
    cmd_cut_node,
    cmd_kill_node,
    cmd_mend_node,
    cmd_restart_apiservers,
    cmd_restart_cluster,
    cmd_restart_kubelet,
    cmd_revive_node,
    cmd_start_kubelet,
    cmd_stop_kubelet,
)
from k8stier.host import prepare_host, refuse_if_a_kubelet_runs, restore_host, unmount_below
from k8stier.images import import_images
from k8stier.nodes import (
    node_server,
    prepare_namespaced_node,
    remove_namespaced_node,
    remove_node_chain,
    start_containerd,
    start_host_dns,
    start_kubelet,
    start_metadata,
    wait_node_ready,
)
from k8stier.pki import setup_pki
from k8stier.processes import all_processes, pods_rss_kib, shims_rss_kib
from k8stier.suite import (
    apply_addons,
    apply_suite,
    drivers_registered,
    snapshot_crds,
    wait_suite,
    write_overlay_inputs,
)
from k8stier.teardown import (
    delete_test_objects,
    kill_pod_processes,
    pod_processes,
    kill_strays,
    leftovers,
    remove_cgroups,
    remove_containers,
    remove_iptables,
    remove_network,
    stop_pods,
)


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
    if not (STATE / "host-changes.json").exists():
        # this checkout's cluster is down: whatever still runs in the pods'
        # cgroups (their names are fixed) is an earlier cluster's, left by
        # a run cut off before its `down`, and would load the machine
        refuse_if_a_kubelet_runs()
        if pod_processes():
            log("processes of an earlier cluster still run in the pods' cgroups: killed")
            kill_pod_processes()
            remove_cgroups()
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
    start_host_dns()
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
                       *(n.service("metadata") for n in all_nodes), "host-dns"])
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
        "stop-kubelet": cmd_stop_kubelet,
        "start-kubelet": cmd_start_kubelet,
        "restart-cluster": cmd_restart_cluster,
        "restart-apiservers": cmd_restart_apiservers,
        "kill-node": cmd_kill_node,
        "revive-node": cmd_revive_node,
        "cut-node": cmd_cut_node,
        "mend-node": cmd_mend_node,
        "csi-mounts": cmd_csi_mounts,
        "remount": cmd_remount,
        "probe-node": cmd_probe_node,
        "kubectl": lambda rest: subprocess.run(
            ["kubectl", f"--kubeconfig={STATE / 'admin.kubeconfig'}", *rest]).returncode,
    }, "cluster", {Skipped: ("SKIPPED", 3), ClusterError: ("ERROR", 1)})


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
