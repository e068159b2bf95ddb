//! The Cinder CSI driver: drop-in for the upstream `cinder-csi-plugin`.
//!
//! - [`controller`]: volumes, snapshots, attachments (Cinder and Nova
//!   through `openstack-client`);
//! - [`node`]: devices, filesystems and mounts (through `host-ops`);
//! - [`errors`]: the one mapping from driver errors to gRPC codes;
//! - [`rpc`]: deadlines, per-key locks and CSI argument checks they share.

pub mod controller;
pub mod errors;
pub mod node;
pub mod options;
pub mod readiness;
pub mod rpc;

pub use options::Options;

/// Upstream's driver name and topology key.
pub const DEFAULT_DRIVER_NAME: &str = "cinder.csi.openstack.org";
pub const TOPOLOGY_KEY: &str = "topology.cinder.csi.openstack.org/zone";
