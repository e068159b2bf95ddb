"""What the cluster changes on this machine (shared mounts of the kubelet
directory and /dev), recorded so that `down` restores it."""

import json
import shutil
import subprocess
from pathlib import Path

from .config import (
    ClusterError,
    KMS_B_CLOUD_CONF_DIR,
    KMS_B_DIR,
    KMS_CLOUD_CONF_DIR,
    KMS_DIR,
    KUBELET_DIR,
    STATE,
    log,
    run,
)


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
    if marker.exists() and not (STATE / "host-changes.json").exists():
        clear_earlier_cluster_kubelet_dir()
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


def refuse_if_a_kubelet_runs():
    """Before this checkout takes over what an earlier cluster left: that
    cluster must be down (its kubelet would go on using it)."""
    for d in Path("/proc").iterdir():
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"kubelet") and f"--root-dir={KUBELET_DIR}".encode() in argv:
            raise ClusterError(f"a kubelet of another cluster is running on {KUBELET_DIR} (pid {d.name}): "
                               "bring that cluster down first")


def clear_earlier_cluster_kubelet_dir():
    """/var/lib/kubelet carries this tier's marker but this checkout's state
    never prepared it: an earlier cluster of this tier left it, from
    another checkout (CI's fresh clones) or from a run that was cut off
    before its `down`. Its kubelet's state (pods, registered plugins'
    sockets, checkpoints) would be read by the new kubelet as its own, and
    its KMS plugins' key records name that cluster's key; its self-bind is
    this tier's, so this `down` takes it away too."""
    refuse_if_a_kubelet_runs()
    log(f"{KUBELET_DIR} was left by an earlier cluster of this tier (another checkout, or a run cut off): "
        "clearing it")
    unmount_below(KUBELET_DIR, keep_root=True)
    for child in KUBELET_DIR.iterdir():
        if child.name == ".k8s-test-cluster":
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()
    if is_mountpoint(KUBELET_DIR):
        record_host_change("bound_kubelet_dir", True)
    # the KMS plugins' sockets and key records name that cluster's key
    for kms_dir in (KMS_DIR, KMS_B_DIR):
        for f in ("kms.sock", "kms-keys.json"):
            (kms_dir / f).unlink(missing_ok=True)


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
