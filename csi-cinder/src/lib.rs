//! The Cinder CSI driver: drop-in for the upstream `cinder-csi-plugin`.
//!
//! This crate holds the binary's flags and start-up (configuration,
//! readiness) and serves the CSI Identity service; the Controller and Node
//! services are added by their own work items and are not advertised
//! until they exist.

pub mod options;
pub mod readiness;

pub use options::Options;

/// Upstream's driver name and topology key.
pub const DEFAULT_DRIVER_NAME: &str = "cinder.csi.openstack.org";
pub const TOPOLOGY_KEY: &str = "topology.cinder.csi.openstack.org/zone";
