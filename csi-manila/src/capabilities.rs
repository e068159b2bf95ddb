//! Which capabilities a Manila share can serve: a mounted filesystem in
//! any access mode (shares are RWX by nature); never a raw block device.

use csi_common::request::{self, AccessType, Capability};
use csi_common::{DriverError, DriverResult};
use proto::csi::v1 as csi;

/// The shared shape check, then: mount only. The filesystem type is the
/// share's protocol's, so `fs_type` is not used (upstream ignores it too).
pub fn parse_capability(c: &csi::VolumeCapability) -> DriverResult<Capability> {
    let cap = request::parse_capability(c)?;
    if cap.access_type == AccessType::Block {
        return Err(DriverError::InvalidArgument(
            "Manila shares are file systems: block access (volumeMode Block) is not supported"
                .into(),
        ));
    }
    Ok(cap)
}

pub fn parse_capabilities(caps: &[csi::VolumeCapability]) -> DriverResult<Vec<Capability>> {
    request::parse_capabilities(caps, parse_capability)
}
