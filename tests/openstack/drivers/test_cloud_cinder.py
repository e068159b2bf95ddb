"""Cinder backend for the test cloud: Cinder's own fake driver, reporting
the multiattach capability (so that volume types with
multiattach="<is> True" schedule) and keeping each volume's data.

The stock fake driver stores nothing: snapshots, clones and restores come
out empty, and its iSCSI connection info cannot be attached by anyone. This
one keeps every volume's and snapshot's data in a sparse image file in the
directory the hypervisor agent attaches from (TEST_CLOUD_IMAGE_DIR, the same
`<id>.img` naming), copies it on snapshot, clone and restore-from-snapshot,
and answers connections as os-brick's `local` type pointing at the image, so
that cinder-backup reads and writes real data (backups and restores) and a
volume attached to the test server holds what its source held.
"""

import os
import re
import subprocess

from cinder.tests.fake_driver import FakeLoggingVolumeDriver

GIB = 1 << 30


def _image_dir():
    d = os.environ.get("TEST_CLOUD_IMAGE_DIR")
    if d:
        os.makedirs(d, exist_ok=True)
    return d


def _image(key):
    d = _image_dir()
    if not d:
        return None
    safe = re.sub(r"[^A-Za-z0-9-]", "", key)
    return os.path.join(d, safe + ".img")


def _snapshot_key(snapshot_id):
    # the hypervisor agent's key for a snapshot's data
    return "snap-" + snapshot_id


def _ensure(path, size_gib):
    """The image exists and is at least size_gib (sparse)."""
    with open(path, "ab"):
        pass
    want = int(size_gib) * GIB
    if os.path.getsize(path) < want:
        os.truncate(path, want)


def _copy(src_key, dst_key, size_gib):
    src, dst = _image(src_key), _image(dst_key)
    if not src or not dst:
        return
    if os.path.exists(src):
        subprocess.run(["cp", "--sparse=always", src, dst], check=True)
    _ensure(dst, size_gib)


def _remove(key):
    p = _image(key)
    if p and os.path.exists(p):
        os.remove(p)


class MultiattachFakeDriver(FakeLoggingVolumeDriver):
    def _update_volume_stats(self):
        super()._update_volume_stats()
        for pool in self._stats["pools"]:
            pool["multiattach"] = True

    def validate_connector(self, connector):
        # a `local` connection needs no initiator (the LVM base wants iSCSI)
        pass

    def delete_volume(self, volume):
        _remove(volume.id)

    def create_snapshot(self, snapshot):
        _copy(snapshot.volume_id, _snapshot_key(snapshot.id), snapshot.volume_size)

    def delete_snapshot(self, snapshot):
        _remove(_snapshot_key(snapshot.id))

    def create_cloned_volume(self, volume, src_vol):
        _copy(src_vol.id, volume.id, volume.size)

    def create_volume_from_snapshot(self, volume, snapshot):
        _copy(_snapshot_key(snapshot.id), volume.id, volume.size)

    def initialize_connection(self, volume, connector):
        info = super().initialize_connection(volume, connector)
        path = _image(volume.id)
        if not path:
            return info
        _ensure(path, volume.size)
        return {"driver_volume_type": "local",
                "data": {"device_path": path, "access_mode": info["data"]["access_mode"]}}

    def initialize_connection_snapshot(self, snapshot, connector):
        path = _image(_snapshot_key(snapshot.id))
        if not path:
            return super().initialize_connection_snapshot(snapshot, connector)
        _ensure(path, snapshot.volume_size)
        return {"driver_volume_type": "local", "data": {"device_path": path}}
