//! The Manila CSI driver: drop-in for the upstream `manila-csi-plugin`
//! (same driver names, flags, StorageClass parameters, secrets and volume
//! attributes), mounting shares itself instead of forwarding node calls to
//! a partner plugin.
//!
//! - [`controller`]: shares, access rules, snapshots (Manila through
//!   `openstack-client`);
//! - [`node`]: staging, publishing, usage and health of mounted shares;
//! - [`mounts`]: ceph-fuse, kernel CephFS and NFS mounts;
//!   [`stage_record`]: the node's records of them; [`processes`]: the
//!   commands and daemons they run;
//! - [`daemons`], [`mount_pods`]: who runs the ceph-fuse daemons: the
//!   plugin, or a pod of their own per share (`--mount-pods`), so that a
//!   restart of the plugin never breaks a mount;
//! - [`shares`]: what controller and node both know about shares;
//! - [`parameters`]: StorageClass parameters and volume attributes;
//! - [`orphans`]: the shares and snapshots of this cluster that nothing
//!   in it names any more (`manila-csi-plugin orphans`);
//! - [`capabilities`], [`errors`], [`options`], [`runtime_config`],
//!   [`share_protocol`];
//! - [`plugin`]: the lifecycle the binary runs.
//!
//! What the Cinder driver does alike (deadlines, de-duplication, paging,
//! credentials, paths, readiness) lives in `csi-common`.

pub mod capabilities;
pub mod controller;
pub mod daemons;
pub mod errors;
pub mod mount_pod_hook;
pub mod mount_pods;
pub mod mount_target;
pub mod mounts;
pub mod node;
pub mod options;
pub mod orphans;
pub mod parameters;
pub mod plugin;
pub mod processes;
pub mod runtime_config;
pub mod share_protocol;
pub mod shares;
pub mod snapshot_dir;
pub mod stage_record;

pub use options::Options;
pub use share_protocol::ShareProtocol;

/// Upstream's default driver name and topology key.
pub const DEFAULT_DRIVER_NAME: &str = "manila.csi.openstack.org";
pub const TOPOLOGY_KEY: &str = "topology.manila.csi.openstack.org/zone";
