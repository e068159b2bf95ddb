"""Manila backend for the test cloud: Manila's own DummyDriver, changed so
that nothing points at a private address and CephFS behaves like the
native CephFS driver.

- NFS exports are on 127.0.0.x (the stock driver uses 10.0.0.10,
  10.0.0.20 and 11.0.0.11; private ranges are never a target here).
- CEPHFS shares are accepted, exported in the native CephFS format
  `<monitor>:6789:/volumes/_nogroup/<share>/<instance>`, and carry the
  share metadata `__mount_options: fs=cephfs`.
- `cephx` access rules on CEPHFS shares become active with an access key,
  `ip` rules on NFS shares as before; anything else is refused like the
  real drivers do.
- The stock operation delays (up to 4 s) come from configuration
  (`dummy_driver_default_driver_method_delay` and
  `dummy_driver_driver_methods_delays`), which the test cloud sets short.
"""

import base64
import hashlib

from manila import exception
from manila.tests.share.drivers.dummy import DummyDriver, slow_me_down

MONITOR = "127.0.0.1"


class LoopbackDummyDriver(DummyDriver):
    def _generate_export_locations(self, mountpoint, share_server=None):
        return [
            self._get_export(mountpoint, "127.0.0.3", True, False),
            self._get_export(mountpoint, "127.0.0.1", False, True),
            self._get_export(mountpoint, "127.0.0.2", False, False),
        ]

    def _create_share(self, context, share, share_server=None):
        if share["share_proto"] != "CEPHFS":
            return super()._create_share(context, share, share_server=share_server)
        name = self._get_share_name(share)
        path = "/volumes/_nogroup/%s/%s" % (share["share_id"], share["id"])
        self.private_storage.update(share["id"], {"fake_provider_share_name": name, "fake_provider_location": path})
        return [{"path": "%s:6789:%s" % (MONITOR, path), "is_admin_only": False, "metadata": {"preferred": True}}]

    def get_optional_share_creation_data(self, share, share_server=None):
        if share["share_proto"] == "CEPHFS":
            return {"metadata": {"__mount_options": "fs=cephfs"}}
        return {}

    @slow_me_down
    def update_access(self, context, share, access_rules, add_rules, delete_rules, update_rules,
                      share_server=None):
        proto = share["share_proto"].lower()
        updates = {}
        for rule in add_rules + access_rules:
            kind = rule["access_type"].lower()
            allowed = (proto == "nfs" and kind == "ip") or (proto == "cifs" and kind == "user") or (
                proto == "cephfs" and kind == "cephx")
            if not allowed:
                raise exception.InvalidShareAccess(
                    reason="Unsupported '%s' access type provided for '%s' share protocol." % (kind, proto))
            if kind == "cephx":
                if rule["access_to"] == "admin":
                    raise exception.InvalidShareAccess(reason="cephx ID 'admin' is reserved")
                # a stable, secret-looking key per rule, as Ceph hands out
                digest = hashlib.sha256(("test-cloud:" + rule["access_id"]).encode()).digest()
                updates[rule["access_id"]] = {"access_key": base64.b64encode(digest[:16]).decode(), "state": "active"}
        return updates or None

    def _update_share_stats(self, data=None):
        super()._update_share_stats(data)
        self._stats["storage_protocol"] = "NFS_CIFS_CEPHFS"
