//! The Manila CSI driver: drop-in for the upstream `manila-csi-plugin`.
//!
//! This crate holds the binary's flags and serves the CSI Identity
//! service; the Controller and Node services come with their own work
//! items and are not advertised until they exist.

use std::net::SocketAddr;
use std::path::PathBuf;

use plugin_runtime::{Endpoint, LogArgs};

pub const DEFAULT_DRIVER_NAME: &str = "manila.csi.openstack.org";
pub const TOPOLOGY_KEY: &str = "topology.manila.csi.openstack.org/zone";

/// The share protocol one instance of the driver serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ShareProtocol {
    #[value(name = "NFS", alias = "nfs")]
    Nfs,
    #[value(name = "CEPHFS", alias = "cephfs")]
    Cephfs,
}

#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "manila-csi-plugin",
    version,
    about = "CSI driver for OpenStack Manila shared file systems"
)]
pub struct Options {
    /// CSI endpoint, e.g. unix:///csi/csi.sock.
    #[arg(long, env = "CSI_ENDPOINT", default_value = "unix://tmp/csi.sock")]
    pub endpoint: Endpoint,
    /// CSI driver name (the chart uses nfs.manila.csi.openstack.org or
    /// cephfs.manila.csi.openstack.org).
    #[arg(long = "drivername", default_value = DEFAULT_DRIVER_NAME)]
    pub driver_name: String,
    /// The one protocol this instance serves.
    #[arg(long = "share-protocol-selector", value_enum)]
    pub share_protocol: ShareProtocol,
    /// Socket of a partner CSI node plugin that performs the mounts.
    #[arg(long = "fwdendpoint")]
    pub forward_endpoint: Option<Endpoint>,
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set)]
    pub with_topology: bool,
    /// JSON runtime configuration (per-cluster NFS network mappings).
    #[arg(long)]
    pub runtime_config_file: Option<PathBuf>,
    /// Cluster id written into share metadata.
    #[arg(long = "cluster-id", default_value = "")]
    pub cluster_id: String,
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub provide_controller_service: bool,
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub provide_node_service: bool,
    /// Serve /metrics and /healthz on this address.
    #[arg(long)]
    pub http_endpoint: Option<SocketAddr>,
    #[command(flatten)]
    pub log: LogArgs,
}

impl Options {
    pub fn validate(&self) -> Result<(), String> {
        plugin_runtime::csi_identity::validate_driver_name(&self.driver_name)?;
        if !self.provide_controller_service && !self.provide_node_service {
            return Err("at least one of --provide-controller-service and --provide-node-service must be true".into());
        }
        if let Some(p) = &self.runtime_config_file
            && !p.is_file()
        {
            return Err(format!(
                "--runtime-config-file {} does not exist",
                p.display()
            ));
        }
        Ok(())
    }
}
