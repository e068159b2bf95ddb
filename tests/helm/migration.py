"""An operator's running upstream release replaced by ours in place, and
back: upstream's Cinder chart (kubernetes/cloud-provider-openstack's
charts/cinder-csi-plugin, 2.36) installed first with an operator's values,
its images replaced by ours so that it runs here; writers on its volumes
(ext4, xfs, raw block, and a claim restored from a snapshot);
then `helm upgrade` of that release to our chart with the same values (the
operator's documented step), and a rollback to upstream's. No write fails,
every driver stays registered, upstream's workloads go and come back, and
volumes are still made, mounted, grown, unmounted and deleted after each
switch.

Upstream's charts are another project's source: never copied into this
repository, they are supplied the way the Kubernetes binaries are, by
UPSTREAM_CPO_DIR, a folder holding upstream's `charts/`. Unset: the test
says so and counts as skipped. Set without the chart: an error.

What this cluster needs beyond the operator's values (its pods reach
nothing but the host's loopback) is patched in after Helm, as the overlay
does for deploy/: upstream's controller Deployment has no hostNetwork
value, so it is patched on each time upstream's chart puts it there."""

import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from charts import CHARTS
from in_cluster import (
    CINDER_WORKLOADS,
    LONGEST_GAPS,
    NAMESPACE,
    OVERLAY,
    REPO,
    STATE,
    TEST_NAMESPACE,
    apply,
    cinder_values,
    claim,
    get_json,
    helm,
    kubectl,
    pod_on,
    remove_kustomize_install,
    restore_kustomize_install,
    rolled_out,
    running,
    wait,
    writes,
)

UPSTREAM_CHART = "cinder-csi-plugin"
UPSTREAM_WORKLOADS = [("deployment", "openstack-cinder-csi-controllerplugin"),
                      ("daemonset", "openstack-cinder-csi-nodeplugin")]
RELEASE = "cinder-csi"


class Skipped(Exception):
    """The test's inputs are missing: it counts as skipped."""


def upstream_chart():
    folder = os.environ.get("UPSTREAM_CPO_DIR")
    if not folder:
        raise Skipped("UPSTREAM_CPO_DIR is unset (a folder holding kubernetes/cloud-provider-openstack's charts/)")
    chart = Path(folder) / "charts" / UPSTREAM_CHART
    if not (chart / "Chart.yaml").is_file():
        raise AssertionError(f"UPSTREAM_CPO_DIR={folder} holds no charts/{UPSTREAM_CHART}/Chart.yaml")
    return chart


def our_images():
    """The image values that make upstream's chart run our plugin and the
    sidecars this cluster has (its images are named as our chart names
    them)."""
    import yaml

    ours = yaml.safe_load((CHARTS / "openstack-cinder-csi" / "values.yaml").read_text())["csi"]
    app_version = yaml.safe_load((CHARTS / "openstack-cinder-csi" / "Chart.yaml").read_text())["appVersion"]
    images = {s: {"image": {"repository": ours[s]["image"]["repository"], "tag": ours[s]["image"]["tag"]}}
              for s in ("attacher", "provisioner", "snapshotter", "resizer", "livenessprobe", "nodeDriverRegistrar")}
    images["plugin"] = {"image": {"repository": ours["plugin"]["image"]["repository"], "tag": app_version}}
    return images


def merged(a, b):
    out = dict(a)
    for k, v in b.items():
        out[k] = merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def operator_values():
    """The operator's values for upstream's chart, kept for ours: the
    cluster's (cinder_values) and our images."""
    return merged(cinder_values(), {"csi": our_images()})


# the health port of upstream's controller on the host's network: its
# 9808 is its node plugin's there
CONTROLLER_HEALTH_PORT = 9818


def upstream_controller_on_host_network():
    """Upstream's controller Deployment on the host's network (this
    cluster's pods reach nothing else), its health port moved off its node
    plugin's, rolled out."""
    import json

    name = UPSTREAM_WORKLOADS[0][1]
    wait(f"{name} made", lambda: kubectl("-n", NAMESPACE, "get", "deployment", name, check=False).returncode == 0)
    containers = get_json("-n", NAMESPACE, "deployment", name)["spec"]["template"]["spec"]["containers"]
    at = {c["name"]: i for i, c in enumerate(containers)}
    probe, plugin = at["liveness-probe"], at["cinder-csi-plugin"]
    ops = [
        {"op": "add", "path": "/spec/template/spec/hostNetwork", "value": True},
        {"op": "add", "path": "/spec/template/spec/dnsPolicy", "value": "ClusterFirstWithHostNet"},
        {"op": "replace", "path": "/spec/strategy", "value": {"type": "Recreate"}},
        {"op": "add", "path": f"/spec/template/spec/containers/{probe}/args/-",
         "value": f"--http-endpoint=:{CONTROLLER_HEALTH_PORT}"},
        {"op": "replace", "path": f"/spec/template/spec/containers/{plugin}/ports/0/containerPort",
         "value": CONTROLLER_HEALTH_PORT},
    ]
    kubectl("-n", NAMESPACE, "patch", "deployment", name, "--type=json", "-p", json.dumps(ops))
    rolled_out(UPSTREAM_WORKLOADS)


def cinder_registered():
    """Whether every node's CSINode lists Cinder's driver (Manila's are
    away with the kustomize install while this runs)."""
    nodes = {n["metadata"]["name"] for n in get_json("nodes")["items"]}
    have = {c["metadata"]["name"] for c in get_json("csinodes")["items"]
            if any(d["name"] == "cinder.csi.openstack.org" for d in c["spec"].get("drivers") or [])}
    if nodes <= have:
        return True
    # what a failure shows (CI prints only its last lines): whose node
    # plugins were on the nodes without the driver
    per = node_plugins_per_node()
    return f"not registered on {sorted(nodes - have)}; node plugin pods there: " + \
        ", ".join(f"{n}: {per.get(n, [])}" for n in sorted(nodes - have))


# how long the registrations are watched after a switch ended
SETTLE = 10


class RegistrationGaps:
    """Samples every node's CSINode each second while a switch runs: the
    longest stretch each node went without Cinder's driver registered
    (kubelet mounts nothing of a driver it does not know). A read that
    fails counts as not registered."""

    def __init__(self):
        import threading

        self.longest = {}
        self.samples = 0
        self.failed_reads = 0
        self.last_failure = []
        self._since = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def _run(self):
        while not self._stop.is_set():
            now = time.monotonic()
            try:
                nodes = {n["metadata"]["name"] for n in get_json("nodes")["items"]}
                have = {c["metadata"]["name"] for c in get_json("csinodes")["items"]
                        if any(d["name"] == "cinder.csi.openstack.org" for d in c["spec"].get("drivers") or [])}
            except Exception as e:  # a failed read proves nothing registered
                nodes, have = set(self._since) | set(self.longest), set()
                # counted apart: a gap made of failed reads is the
                # apiserver's, not the drivers'
                self.failed_reads += 1
                self.last_failure = str(e).strip().splitlines()[-1:] or [type(e).__name__]
            self.samples += 1
            for node in nodes:
                if node in have:
                    self._since.pop(node, None)
                    self.longest.setdefault(node, 0.0)
                else:
                    start = self._since.setdefault(node, now)
                    self.longest[node] = max(self.longest.get(node, 0.0), now - start)
            self._stop.wait(1)

    def check(self, what, bound):
        print(f"   {what}: the longest time a node went without the driver registered: "
              + ", ".join(f"{n} {g:.0f} s" for n, g in sorted(self.longest.items()))
              + f" ({self.samples} samples, {self.failed_reads} of them failed reads"
              + (f", the last: {self.last_failure[0][:200]}" if self.last_failure else "") + ")")
        assert self.samples >= 5, f"{what}: {self.samples} samples of the nodes' registrations"
        over = {n: round(g) for n, g in self.longest.items() if g > bound}
        assert not over, f"{what}: nodes without Cinder's driver for longer than {bound} s: {over}"


def gone(workloads):
    for kind, name in workloads:
        wait(f"{kind} {name} gone", lambda: kubectl("-n", NAMESPACE, "get", kind, name,
                                                     check=False).returncode != 0 or "still there")


def node_plugins_per_node():
    """The node plugin pods of either release on each node, Running or not."""
    per = {}
    for p in get_json("-n", NAMESPACE, "pods")["items"]:
        name = p["metadata"]["name"]
        if name.startswith(("openstack-cinder-csi-nodeplugin-", "csi-cinder-nodeplugin-")):
            per.setdefault(p["spec"].get("nodeName"), []).append(name)
    return per


def a_volume_works(tag):
    """A new claim through whichever release serves: made, mounted, written,
    grown online, and gone again with its Cinder volume (on xfs: ext4
    cannot grow online on these machines, as root lacks CAP_SYS_RESOURCE;
    deploy/'s xfs class, which the kustomize install leaves)."""
    pvc, pod = f"fresh-{tag}", f"fresh-{tag}-writer"
    apply(claim(pvc, "csi-cinder-sc-xfs"), unpinned(pod_on("localhost", pod, pvc)))
    wait(f"{pod} running", lambda: running(pod))
    before = writes(pod)
    kubectl("-n", TEST_NAMESPACE, "patch", "pvc", pvc, "-p", '{"spec":{"resources":{"requests":{"storage":"2Gi"}}}}')
    wait(f"{pvc} grown", lambda: get_json("-n", TEST_NAMESPACE, "pvc", pvc)["status"].get("capacity", {})
         .get("storage") == "2Gi" or get_json("-n", TEST_NAMESPACE, "pvc", pvc)["status"])
    time.sleep(1)
    assert writes(pod) > before, f"{pod} stopped writing"
    pv = get_json("-n", TEST_NAMESPACE, "pvc", pvc)["spec"]["volumeName"]
    kubectl("-n", TEST_NAMESPACE, "delete", "pod", pod, "--wait=true")
    kubectl("-n", TEST_NAMESPACE, "delete", "pvc", pvc, "--wait=true")
    wait(f"{pv} deleted", lambda: kubectl("get", "pv", pv, check=False).returncode != 0 or "still there")


def unpinned(pod):
    """The pod placed by the scheduler where its volume is (upstream's
    classes bind at once, in a zone of the provisioner's choice)."""
    pod["spec"].pop("nodeSelector", None)
    return pod


# a raw block writer's records: 64 bytes each from the device's start,
# in an area zeroed first (room for 65536 records, 109 min at 10 a second)
BLOCK_DEVICE = "/dev/block"
BLOCK_AREA = 4 << 20


def block_claim(name, storage_class):
    c = claim(name, storage_class)
    c["spec"]["volumeMode"] = "Block"
    return c


def block_pod(name, claim_name):
    """A pod writing numbered records straight to a raw block volume, each
    synced (`conv=fsync`); any failed write ends it."""
    script = (f"dd if=/dev/zero of={BLOCK_DEVICE} bs=1048576 count={BLOCK_AREA >> 20} conv=fsync 2>/dev/null "
              "|| exit 1; i=0; while true; do i=$((i+1)); read up idle < /proc/uptime; "
              f"printf '%-63s\\n' \"$i $up\" | dd of={BLOCK_DEVICE} bs=64 seek=$((i-1)) conv=notrunc,fsync "
              "2>/dev/null || exit 1; sleep 0.1; done")
    pod = unpinned(pod_on("localhost", name, claim_name))
    container = pod["spec"]["containers"][0]
    container["command"] = ["sh", "-c", script]
    del container["volumeMounts"]
    container["volumeDevices"] = [{"name": "data", "devicePath": BLOCK_DEVICE}]
    return pod


SNAPSHOT_CLASS = "csi-cinder-snapclass"  # deploy/'s, which the kustomize install leaves


def snapshot(name, of):
    return {"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
            "metadata": {"name": name, "namespace": TEST_NAMESPACE},
            "spec": {"volumeSnapshotClassName": SNAPSHOT_CLASS, "source": {"persistentVolumeClaimName": of}}}


def snapshot_ready(name):
    status = get_json("-n", TEST_NAMESPACE, "volumesnapshot", name).get("status") or {}
    return True if status.get("readyToUse") else (status or "no status yet")


def restored_claim(name, snap, storage_class):
    c = claim(name, storage_class)
    c["spec"]["dataSource"] = {"apiGroup": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot", "name": snap}
    return c


def records_restored(pod):
    """The records a claim restored from a snapshot of writer-a's volume
    holds: 1..k in order, k > 0. The snapshot was cut while writer-a
    wrote, so its last line may be cut short (no newline): it is not
    counted."""
    out = kubectl("-n", TEST_NAMESPACE, "exec", pod, "--", "cat", "/data/seq").stdout
    lines = out.split("\n")[:-1]  # what follows the last newline is cut short, or nothing
    numbers = [int(line.split()[0]) for line in lines]
    assert numbers and numbers == list(range(1, len(numbers) + 1)), \
        f"{pod}: the restored records are not 1..k in order ({len(numbers)} lines)"
    return numbers[-1]


# how each writer's records are read: a file's lines, or the block
# device's area with its zeros dropped
READERS = {
    "writer-a": lambda: writes("writer-a"),
    "writer-b": lambda: writes("writer-b"),
    "writer-xfs": lambda: writes("writer-xfs"),
    "writer-block": lambda: writes("writer-block", read=(
        "sh", "-c", f"head -c {BLOCK_AREA} {BLOCK_DEVICE} | tr -d '\\000'")),
    "writer-restored": lambda: writes("writer-restored", read=("cat", "/data/seq-restored"),
                                      key="writer-restored seq-restored"),
}


def writers_went_on(writers, what):
    now = {p: READERS[p]() for p in writers}
    for p in writers:
        assert now[p] > writers[p], f"{p} wrote nothing through {what} ({writers[p]} -> {now[p]})"
    print(f"   {what}: the writers went on ({writers} -> {now})")
    return now


def restored_through(release, snap, at_snapshot):
    """The snapshot cut under upstream's release restored through
    `release`: the claim holds the same records, and takes new writes."""
    pvc, pod = f"restored-{release}", f"restored-{release}-writer"
    apply(restored_claim(pvc, snap, "csi-cinder-sc-delete"),
          unpinned(pod_on("localhost", pod, pvc, file="seq-new")))
    wait(f"{pod} running", lambda: running(pod))
    held = records_restored(pod)
    assert held == at_snapshot, f"{snap} restored through {release} holds {held} records, {at_snapshot} when first restored"
    time.sleep(1)
    assert writes(pod, read=("cat", "/data/seq-new"), key=f"{pod} seq-new") > 0, f"{pod} wrote nothing"
    pv = get_json("-n", TEST_NAMESPACE, "pvc", pvc)["spec"]["volumeName"]
    kubectl("-n", TEST_NAMESPACE, "delete", "pod", pod, "--wait=true")
    kubectl("-n", TEST_NAMESPACE, "delete", "pvc", pvc, "--wait=true")
    wait(f"{pv} deleted", lambda: kubectl("get", "pv", pv, check=False).returncode != 0 or "still there")
    print(f"   {snap} restored through {release}: {held} records, as when first restored")


def at_once(*checks):
    """The checks run side by side (each mostly waits on the cluster: a
    claim bound, a pod started, a volume deleted); the first failure is
    raised once all have ended."""
    with ThreadPoolExecutor(len(checks)) as pool:
        for f in [pool.submit(c) for c in checks]:
            f.result()


def upstreams_cinder_release_replaced_in_place_and_rolled_back():
    chart = upstream_chart()
    cfg = helm()
    kubectl("create", "namespace", TEST_NAMESPACE)
    kubectl("label", "namespace", TEST_NAMESPACE, "csi-cluster-tier=test")
    LONGEST_GAPS.clear()
    try:
        remove_kustomize_install()
        values = operator_values()
        started = time.monotonic()
        cfg.install(str(chart), RELEASE, values, namespace=NAMESPACE)
        upstream_controller_on_host_network()
        wait("cinder.csi.openstack.org registered by upstream's release", cinder_registered)
        assert get_json("csidriver", "cinder.csi.openstack.org")["spec"].get("volumeLifecycleModes") == \
            ["Persistent", "Ephemeral"], "upstream's CSIDriver"
        print(f"   upstream's chart {chart.name} installed in {time.monotonic() - started:.0f} s")

        # an operator's volumes in use, each with a writer placed where
        # its volume is: ext4 through upstream's Delete and Retain
        # classes, xfs (deploy/'s class, which the kustomize install
        # leaves), a raw block volume, and a claim restored from a
        # snapshot cut while writer-a wrote
        apply(claim("upstream-a", "csi-cinder-sc-delete"), claim("upstream-b", "csi-cinder-sc-retain"),
              claim("upstream-xfs", "csi-cinder-sc-xfs"), block_claim("upstream-block", "csi-cinder-sc-delete"))
        apply(unpinned(pod_on("localhost", "writer-a", "upstream-a")),
              unpinned(pod_on("localhost", "writer-b", "upstream-b")),
              unpinned(pod_on("localhost", "writer-xfs", "upstream-xfs")),
              block_pod("writer-block", "upstream-block"))
        for pod in ("writer-a", "writer-b", "writer-xfs", "writer-block"):
            wait(f"{pod} running", lambda: running(pod))
        time.sleep(1)
        apply(snapshot("snap-a", "upstream-a"))
        wait("snap-a ready", lambda: snapshot_ready("snap-a"))
        apply(restored_claim("upstream-restored", "snap-a", "csi-cinder-sc-delete"),
              unpinned(pod_on("localhost", "writer-restored", "upstream-restored", file="seq-restored")))
        wait("writer-restored running", lambda: running("writer-restored"))
        at_snapshot = records_restored("writer-restored")
        writers = {p: READERS[p]() for p in READERS}
        print(f"   under upstream's release: {sorted(writers)} writing; snap-a holds {at_snapshot} of writer-a's records")

        # the switch: helm upgrade of the same release to our chart, same
        # values; sampled meanwhile for node plugins of both releases
        most = {}
        t = time.monotonic()
        with RegistrationGaps() as gaps:
            cfg.upgrade(str(CHARTS / "openstack-cinder-csi"), RELEASE, values, namespace=NAMESPACE,
                        wait="watcher", timeout=300)
            switched = time.monotonic() - t
            while True:
                per = node_plugins_per_node()
                for node, pods in per.items():
                    most[node] = max(most.get(node, 0), len(pods))
                if all(len(p) == 1 and p[0].startswith("csi-cinder-") for p in per.values()):
                    break
                assert time.monotonic() - t < 300, f"upstream's node plugins still there: {per}"
                time.sleep(1)
            rolled_out(CINDER_WORKLOADS)
            gone(UPSTREAM_WORKLOADS)
            # a departing registrar's removal reaches CSINode late: watched
            # for a while after the switch, then waited out
            time.sleep(SETTLE)
            wait("cinder.csi.openstack.org registered on every node by ours", cinder_registered)
        # upstream's departing registrar may remove ours' socket (our
        # registrar started first): our plugin's guard puts it back within
        # seconds. Without the guard our registrar's liveness probe made it
        # again, 28-29 s later (Kubernetes 1.35), which this bound refuses
        gaps.check("the upgrade to our chart", 20)
        assert get_json("csidriver", "cinder.csi.openstack.org")["spec"].get("volumeLifecycleModes") == \
            ["Persistent", "Ephemeral"], "the CSIDriver's lifecycle modes changed (immutable: the upgrade fails)"
        modes = {c: get_json("storageclass", c).get("volumeBindingMode") for c in
                 ("csi-cinder-sc-delete", "csi-cinder-sc-retain")}
        assert set(modes.values()) == {"Immediate"}, f"the classes' binding mode: {modes}"
        writers = writers_went_on(writers, f"the upgrade to our chart ({switched:.0f} s)")
        at_once(lambda: a_volume_works("ours"), lambda: restored_through("ours", "snap-a", at_snapshot))
        writers = writers_went_on(writers, "a volume and a restore through ours")

        # and back: a rollback to upstream's release
        t = time.monotonic()
        with RegistrationGaps() as gaps:
            cfg.rollback(RELEASE, version=1, timeout=300)
            upstream_controller_on_host_network()
            gone(CINDER_WORKLOADS)
            time.sleep(SETTLE)
            wait("cinder.csi.openstack.org registered on every node by upstream's release again", cinder_registered)
        # our departing registrar removes upstream's new socket by path:
        # our plugin puts it back (upstream's registrar has no liveness
        # probe, nothing else would)
        gaps.check("the rollback to upstream's chart", 30)
        writers = writers_went_on(writers, f"the rollback to upstream's chart ({time.monotonic() - t:.0f} s)")
        at_once(lambda: a_volume_works("upstream-again"),
                lambda: restored_through("upstream-again", "snap-a", at_snapshot))
        writers_went_on(writers, "a volume and a restore through upstream's release again")
        # the snapshot cut before the switches, deleted after them
        kubectl("-n", TEST_NAMESPACE, "delete", "volumesnapshot", "snap-a", "--wait=true")

        kubectl("-n", TEST_NAMESPACE, "delete", "pod", "--all", "--wait=true")
        print(f"   node plugin pods on a node at once during the switch: {most}; the longest gap between two "
              f"writes: " + ", ".join(f"{p} {g:.2f} s" for p, g in sorted(LONGEST_GAPS.items())))
    finally:
        # the pods first, while a release's node plugins can unmount
        # their volumes
        try:
            kubectl("-n", TEST_NAMESPACE, "delete", "pod", "--all", "--wait=true", check=False)
        except Exception as e:  # cleanup: report, go on restoring
            print(f"   cleanup: the pods: {e}")
        try:
            cfg.uninstall(RELEASE, wait="watcher", timeout=300, ignore_not_found=True)
        except Exception as e:  # cleanup: report, go on restoring
            print(f"   cleanup: uninstall {RELEASE}: {e}")
        restore_kustomize_install()
        kubectl("-n", TEST_NAMESPACE, "delete", "pod", "--all", "--wait=true", check=False)
        # the retained claim's volume, deleted through the kustomize install
        for pv in get_json("pv")["items"]:
            if (pv["spec"].get("claimRef") or {}).get("namespace") == TEST_NAMESPACE:
                kubectl("patch", "pv", pv["metadata"]["name"], "--type=merge", "-p",
                        '{"spec":{"persistentVolumeReclaimPolicy":"Delete"}}', check=False)
        kubectl("delete", "namespace", TEST_NAMESPACE, "--ignore-not-found", "--wait=true", check=False)
        wait("the test's volumes deleted", lambda: not [
            pv["metadata"]["name"] for pv in get_json("pv")["items"]
            if (pv["spec"].get("claimRef") or {}).get("namespace") == TEST_NAMESPACE] or "still there")


# --- from upstream's manifests: `kubectl apply` of their files, then ours

MANIFESTS_NAMESPACE = "kube-system"  # upstream's manifests' and deploy/cinder/base's
OVERLAY_GENERATED = OVERLAY / "generated"  # the cluster's cloud.conf and addresses (cluster.py up)
# the files of upstream's manifests/cinder-csi-plugin an operator applies;
# its csi-secret-cinderplugin.yaml is a placeholder cloud.conf the
# operator replaces with their own (here: the cluster's)
UPSTREAM_MANIFESTS = ["cinder-csi-controllerplugin-rbac.yaml", "cinder-csi-controllerplugin.yaml",
                      "cinder-csi-nodeplugin-rbac.yaml", "cinder-csi-nodeplugin.yaml", "csi-cinder-driver.yaml"]
MANIFEST_WORKLOADS = [("deployment", "csi-cinder-controllerplugin"), ("daemonset", "csi-cinder-nodeplugin")]


def upstream_manifests():
    folder = os.environ.get("UPSTREAM_CPO_DIR")
    if not folder:
        raise Skipped("UPSTREAM_CPO_DIR is unset (a folder holding kubernetes/cloud-provider-openstack's manifests/)")
    here = Path(folder) / "manifests" / "cinder-csi-plugin"
    missing = [f for f in UPSTREAM_MANIFESTS if not (here / f).is_file()]
    if missing:
        raise AssertionError(f"UPSTREAM_CPO_DIR={folder} lacks manifests/cinder-csi-plugin/{missing}")
    return here


def suite_images():
    """deploy/suite's images (the ones this cluster has), by name."""
    import yaml

    k = yaml.safe_load((REPO / "deploy" / "suite" / "kustomization.yaml").read_text())
    return {i["name"]: i for i in k["images"]}


def cluster_kustomization(folder, resources, images, extra_patches=()):
    """A kustomization in `folder` of `resources` in kube-system as this
    cluster runs them, as tests/cluster/overlay does for deploy/suite: the
    cluster's cloud.conf Secrets, the controller on the host's network
    finding the apiserver on its loopback, the node plugin given the
    metadata service's address."""
    import shutil

    import yaml

    folder.mkdir(parents=True, exist_ok=True)
    for f in ("controllers-on-host-network.yaml", "apiserver-on-loopback.yaml", "node-addresses-cinder.yaml"):
        shutil.copy(OVERLAY / f, folder / f)
    for f in ("cinder-cloud.conf", "node-cloud.conf", "addresses.env"):
        shutil.copy(OVERLAY_GENERATED / f, folder / f)
    k = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "namespace": MANIFESTS_NAMESPACE,
        "resources": resources,
        "images": images,
        "generatorOptions": {"disableNameSuffixHash": True},
        "secretGenerator": [{"name": "cloud-config", "files": ["cloud.conf=cinder-cloud.conf"]},
                            {"name": "cloud-config-node", "files": ["cloud.conf=node-cloud.conf"]}],
        "configMapGenerator": [{"name": "test-node-addresses", "envs": ["addresses.env"]}],
        # the caller's first: theirs are JSON patches by index, which the
        # strategic merges below may reorder
        "patches": [
            *extra_patches,
            {"path": "controllers-on-host-network.yaml", "target": {"kind": "Deployment"}},
            {"path": "apiserver-on-loopback.yaml", "target": {"kind": "Deployment", "name": "csi-cinder-controllerplugin"}},
            {"path": "node-addresses-cinder.yaml", "target": {"kind": "DaemonSet", "name": "csi-cinder-nodeplugin"}},
        ],
    }
    (folder / "kustomization.yaml").write_text(yaml.safe_dump(k))
    return folder


def upstream_manifests_here(folder):
    """Upstream's manifests as an operator applies them, with our images
    (so that they run here) and what this cluster needs; upstream's
    controller keeps its health port off its node plugin's on the host's
    network."""
    import json
    import re

    source = upstream_manifests()
    folder.mkdir(parents=True, exist_ok=True)
    for f in UPSTREAM_MANIFESTS:
        # its snapshotter's `imagePullPolicy: Always` would pull from a
        # registry, which nothing here reaches (as in an air-gapped
        # cluster, whose operator makes the same change)
        (folder / f).write_text(re.sub(r'imagePullPolicy:\s*"?Always"?', "imagePullPolicy: IfNotPresent",
                                       (source / f).read_text()))
    ours = suite_images()
    plugin = ours["registry.example.com/openstack-csi/cinder-csi-plugin"]
    images = [{"name": "registry.k8s.io/provider-os/cinder-csi-plugin",
               "newName": plugin["newName"], "newTag": plugin["newTag"]}]
    images += [{"name": n, "newTag": i["newTag"]} for n, i in ours.items() if n.startswith("registry.k8s.io/")]
    (folder / "controller-health-port.json").write_text(json.dumps([
        {"op": "test", "path": "/spec/template/spec/containers/4/name", "value": "liveness-probe"},
        {"op": "add", "path": "/spec/template/spec/containers/4/args/-",
         "value": f"--http-endpoint=:{CONTROLLER_HEALTH_PORT}"},
        {"op": "test", "path": "/spec/template/spec/containers/5/name", "value": "cinder-csi-plugin"},
        {"op": "replace", "path": "/spec/template/spec/containers/5/ports/0/containerPort",
         "value": CONTROLLER_HEALTH_PORT},
    ]))
    return cluster_kustomization(folder, UPSTREAM_MANIFESTS, images, [
        {"path": "controller-health-port.json", "target": {"kind": "Deployment", "name": "csi-cinder-controllerplugin"}}])


def ours_here(folder):
    """deploy/cinder/base (kube-system, upstream's workload names and
    selectors) with deploy/suite's images, as this cluster runs it."""
    import os.path

    base = os.path.relpath(REPO / "deploy" / "cinder" / "base", folder)
    images = list(suite_images().values())
    return cluster_kustomization(folder, [base], images)


def rendered(folder):
    import yaml

    return [d for d in yaml.safe_load_all(kubectl("kustomize", str(folder)).stdout) if d]


def keys(objects):
    return {(d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"]) for d in objects}


def delete_objects(objects):
    import yaml

    if objects:
        kubectl("delete", "--ignore-not-found", "--wait=true", "-f", "-", input=yaml.safe_dump_all(objects))


def manifest_workloads_rolled_out():
    for kind, name in MANIFEST_WORKLOADS:
        kubectl("-n", MANIFESTS_NAMESPACE, "rollout", "status", f"{kind}/{name}", "--timeout=300s")


def manifest_plugin_image(kind, name):
    spec = get_json("-n", MANIFESTS_NAMESPACE, kind, name)["spec"]["template"]["spec"]
    return {c["name"]: c["image"] for c in spec["containers"]}


def upstreams_cinder_manifests_replaced_by_deploy_and_back():
    """An operator running upstream's manifests (kube-system) applies
    deploy/cinder/base over them: the same workloads, selectors and
    CSIDriver, so `kubectl apply -k` rolls them in place, node by node,
    under writers; then the objects of upstream's that ours has not (its
    RBAC under other names) are deleted, as the README says. And back:
    upstream's files applied again, ours' own objects deleted."""
    import tempfile

    upstream_manifests()  # skipped, or an error, before anything is made
    work = Path(tempfile.mkdtemp(prefix="manifests-", dir=STATE))
    upstream_dir = upstream_manifests_here(work / "upstream")
    ours_dir = ours_here(work / "ours")
    upstream_objects, our_objects = rendered(upstream_dir), rendered(ours_dir)
    upstream_only = [d for d in upstream_objects if keys([d]) - keys(our_objects)]
    ours_only = [d for d in our_objects if keys([d]) - keys(upstream_objects)]
    print(f"   upstream's objects that ours has not: {sorted(n for _, _, n in keys(upstream_only))}")
    kubectl("create", "namespace", TEST_NAMESPACE)
    kubectl("label", "namespace", TEST_NAMESPACE, "csi-cluster-tier=test")
    LONGEST_GAPS.clear()
    try:
        remove_kustomize_install()
        # the operator's classes: deploy/'s Cinder classes, kept or made
        kubectl("apply", "-k", str(REPO / "deploy" / "cinder" / "classes"))
        t = time.monotonic()
        kubectl("apply", "-k", str(upstream_dir))
        manifest_workloads_rolled_out()
        wait("cinder.csi.openstack.org registered by upstream's manifests", cinder_registered)
        print(f"   upstream's manifests applied and rolled out in {time.monotonic() - t:.0f} s")

        apply(claim("upstream-a", "csi-cinder-sc-delete"), claim("upstream-xfs", "csi-cinder-sc-xfs"),
              block_claim("upstream-block", "csi-cinder-sc-delete"))
        apply(unpinned(pod_on("localhost", "writer-a", "upstream-a")),
              unpinned(pod_on("localhost", "writer-xfs", "upstream-xfs")),
              block_pod("writer-block", "upstream-block"))
        for pod in ("writer-a", "writer-xfs", "writer-block"):
            wait(f"{pod} running", lambda: running(pod))
        writers = {p: READERS[p]() for p in ("writer-a", "writer-xfs", "writer-block")}

        # the switch: ours applied over upstream's, then upstream's RBAC
        # under other names deleted
        t = time.monotonic()
        with RegistrationGaps() as gaps:
            kubectl("apply", "-k", str(ours_dir))
            manifest_workloads_rolled_out()
            delete_objects(upstream_only)
            time.sleep(SETTLE)
            wait("cinder.csi.openstack.org registered on every node by ours", cinder_registered)
        gaps.check("deploy/ applied over upstream's manifests", 20)
        images = manifest_plugin_image("daemonset", "csi-cinder-nodeplugin")
        assert "liveness-probe" in images and "cinder-csi-plugin" in images, images
        pods = [p["metadata"]["name"] for p in get_json("-n", MANIFESTS_NAMESPACE, "pods")["items"]
                if p["metadata"]["name"].startswith("csi-cinder-nodeplugin-")]
        assert len(pods) == len(get_json("nodes")["items"]), f"node plugin pods: {pods}"
        bound = [b["metadata"]["name"] for b in get_json("clusterrolebindings")["items"]
                 if any(s.get("name") in ("csi-cinder-controller-sa", "csi-cinder-node-sa")
                        for s in b.get("subjects") or [])]
        assert not set(bound) & {n for _, _, n in keys(upstream_only)}, f"upstream's bindings left: {bound}"
        writers = writers_went_on(writers, f"deploy/ over upstream's manifests ({time.monotonic() - t:.0f} s)")
        a_volume_works("deploy-over-manifests")
        writers = writers_went_on(writers, "a volume through ours")

        # and back: upstream's files applied again, ours' own deleted
        t = time.monotonic()
        with RegistrationGaps() as gaps:
            kubectl("apply", "-k", str(upstream_dir))
            manifest_workloads_rolled_out()
            delete_objects(ours_only)
            time.sleep(SETTLE)
            wait("cinder.csi.openstack.org registered on every node by upstream's manifests again",
                 cinder_registered)
        gaps.check("upstream's manifests applied again", 20)
        writers = writers_went_on(writers, f"upstream's manifests again ({time.monotonic() - t:.0f} s)")
        a_volume_works("manifests-again")
        writers_went_on(writers, "a volume through upstream's manifests again")
        kubectl("-n", TEST_NAMESPACE, "delete", "pod", "--all", "--wait=true")
        print("   the longest gap between two writes: "
              + ", ".join(f"{p} {g:.2f} s" for p, g in sorted(LONGEST_GAPS.items())))
    finally:
        try:
            kubectl("-n", TEST_NAMESPACE, "delete", "pod", "--all", "--wait=true", check=False)
        except Exception as e:  # cleanup: report, go on restoring
            print(f"   cleanup: the pods: {e}")
        # whichever is installed in kube-system goes, the workloads first
        for kind, name in MANIFEST_WORKLOADS:
            kubectl("-n", MANIFESTS_NAMESPACE, "delete", kind, name, "--ignore-not-found", "--wait=true", check=False)
        try:
            delete_objects(upstream_objects + ours_only)
        except Exception as e:  # cleanup: report, go on restoring
            print(f"   cleanup: kube-system's objects: {e}")
        restore_kustomize_install()
        kubectl("delete", "namespace", TEST_NAMESPACE, "--ignore-not-found", "--wait=true", check=False)
        wait("the test's volumes deleted", lambda: not [
            pv["metadata"]["name"] for pv in get_json("pv")["items"]
            if (pv["spec"].get("claimRef") or {}).get("namespace") == TEST_NAMESPACE] or "still there")
        import shutil

        shutil.rmtree(work, ignore_errors=True)


TESTS = [("in-cluster/upstream-" + f.__name__, f) for f in (
    upstreams_cinder_release_replaced_in_place_and_rolled_back,
    upstreams_cinder_manifests_replaced_by_deploy_and_back,
)]
