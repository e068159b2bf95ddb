//! Which capabilities a Cinder volume can serve: the shared shape check,
//! plus the filesystems this driver formats and the multi-node rules.

use csi_common::request::{self, Capability};
use csi_common::{DriverError, DriverResult};
use proto::csi::v1 as csi;

pub use csi_common::request::AccessType;

/// The shared check, and a filesystem type this driver can make.
pub fn parse_capability(c: &csi::VolumeCapability) -> DriverResult<Capability> {
    let cap = request::parse_capability(c)?;
    if !cap.fs_type.is_empty() {
        host_ops::Filesystem::parse(&cap.fs_type)
            .map_err(|e| DriverError::InvalidArgument(e.to_string()))?;
    }
    Ok(cap)
}

pub fn parse_capabilities(caps: &[csi::VolumeCapability]) -> DriverResult<Vec<Capability>> {
    request::parse_capabilities(caps, parse_capability)
}
/// Why a volume cannot serve a capability: several nodes may use one
/// Cinder volume only when its type allows multi-attach, and only as a raw
/// block device (a filesystem such as ext4 mounted on two nodes corrupts).
pub fn capability_unsupported(c: &Capability, multiattach: bool) -> Option<String> {
    if c.multi_node() {
        if c.access_type == AccessType::Mount {
            return Some(format!(
                "access mode {} needs volumeMode Block: a filesystem cannot be mounted on several nodes",
                c.mode.as_str_name()
            ));
        }
        if !multiattach {
            return Some(format!(
                "access mode {} needs a volume type with multiattach=\"<is> True\"",
                c.mode.as_str_name()
            ));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::csi::v1::volume_capability::access_mode::Mode;

    #[test]
    fn multi_node_modes_need_block_and_multiattach() {
        let cap = |mode, block| Capability {
            access_type: if block {
                AccessType::Block
            } else {
                AccessType::Mount
            },
            mode,
            fs_type: String::new(),
            mount_flags: vec![],
        };
        assert!(capability_unsupported(&cap(Mode::SingleNodeWriter, false), false).is_none());
        assert!(capability_unsupported(&cap(Mode::MultiNodeMultiWriter, false), true).is_some());
        assert!(capability_unsupported(&cap(Mode::MultiNodeMultiWriter, true), false).is_some());
        assert!(capability_unsupported(&cap(Mode::MultiNodeMultiWriter, true), true).is_none());
    }
}
