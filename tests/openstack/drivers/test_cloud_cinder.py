"""Cinder backend for the test cloud: Cinder's own fake driver (creates,
extends, snapshots and clones are no-ops), reporting the multiattach
capability so that volume types with multiattach="<is> True" schedule."""

from cinder.tests.fake_driver import FakeLoggingVolumeDriver


class MultiattachFakeDriver(FakeLoggingVolumeDriver):
    def _update_volume_stats(self):
        super()._update_volume_stats()
        for pool in self._stats["pools"]:
            pool["multiattach"] = True
