//! The Cinder CSI driver: drop-in for the upstream `cinder-csi-plugin`.
//!
//! - [`controller`]: volumes, snapshots, attachments (Cinder and Nova
//!   through `openstack-client`);
//! - [`node`]: devices, filesystems and mounts (through `host-ops`);
//! - [`capabilities`]: what a Cinder volume can serve;
//! - [`errors`]: what Cinder's and Nova's refusals mean as gRPC codes;
//! - [`options`]: the binary's flags;
//! - [`orphans`]: the volumes and snapshots of this cluster that nothing
//!   in it names any more (`cinder-csi-plugin orphans`);
//! - [`parameters`]: StorageClass, VolumeAttributesClass and
//!   VolumeSnapshotClass parameters;
//! - [`plugin`]: the lifecycle the binary runs.
//!
//! What the Manila driver does alike (deadlines, de-duplication, paging,
//! paths, readiness) lives in `csi-common`.

pub mod capabilities;
pub mod controller;
pub mod errors;
pub mod node;
pub mod options;
pub mod orphans;
pub mod parameters;
pub mod plugin;

pub use options::Options;

/// Upstream's driver name and topology key.
pub const DEFAULT_DRIVER_NAME: &str = "cinder.csi.openstack.org";
pub const TOPOLOGY_KEY: &str = "topology.cinder.csi.openstack.org/zone";
