//! The Cinder volumes and snapshots tagged with this cluster
//! (`cinder.csi.openstack.org/cluster`), for the orphan report of
//! `csi_common::orphans`; and `cinder-csi-plugin orphans`, which prints it
//! and deletes on demand.

use std::collections::BTreeMap;
use std::path::PathBuf;

use csi_common::orphans::{CommandError, Inventory, NamedBy, ReportArgs, Tagged, created};
use openstack_client::cinder::{BlockStorage, SnapshotStatus, VolumeStatus};

use crate::controller::CLUSTER_KEY;

/// What the report counts, by its metric's `kind` label.
pub const KINDS: &[&str] = &["volume", "snapshot"];

/// One cloud's volumes and snapshots of one cluster.
#[derive(Debug, Clone)]
pub struct CinderInventory {
    pub block: BlockStorage,
    pub cluster: String,
}

impl CinderInventory {
    fn tag(&self) -> BTreeMap<String, String> {
        BTreeMap::from([(CLUSTER_KEY.to_string(), self.cluster.clone())])
    }
}

impl Inventory for CinderInventory {
    async fn tagged(&self) -> Result<Vec<Tagged>, openstack_client::Error> {
        let tag = self.tag();
        let mut out: Vec<Tagged> = self
            .block
            .volumes_with_metadata(&tag)
            .await?
            .into_iter()
            .map(|v| {
                let servers: Vec<&str> = v.attached_servers().collect();
                let keep = if !servers.is_empty() {
                    Some(format!("attached to {servers:?}"))
                } else if !matches!(v.status, VolumeStatus::Available) && !v.status.is_error() {
                    Some(format!("{} (neither available nor in error)", v.status))
                } else {
                    None
                };
                Tagged {
                    kind: "volume",
                    created: created(v.created_at.as_deref()),
                    id: v.id,
                    name: v.name,
                    status: v.status.to_string(),
                    named_by: NamedBy::PersistentVolume,
                    keep,
                }
            })
            .collect();
        out.extend(
            self.block
                .snapshots_with_metadata(&tag)
                .await?
                .into_iter()
                .map(|s| {
                    let keep = (!matches!(s.status, SnapshotStatus::Available)
                        && !s.status.is_error())
                    .then(|| format!("{} (neither available nor in error)", s.status));
                    Tagged {
                        kind: "snapshot",
                        created: created(s.created_at.as_deref()),
                        id: s.id,
                        name: s.name,
                        status: s.status.to_string(),
                        named_by: NamedBy::SnapshotContent,
                        keep,
                    }
                }),
        );
        Ok(out)
    }

    async fn delete(&self, t: &Tagged) -> Result<(), openstack_client::Error> {
        match t.named_by {
            NamedBy::SnapshotContent => self.block.delete_snapshot(&t.id).await,
            NamedBy::PersistentVolume => {
                // as it is now: attached or retagged since the scan, it stays
                let v = self.block.get_volume(&t.id).await?;
                if v.metadata.get(CLUSTER_KEY) != Some(&self.cluster)
                    || v.attached_servers().next().is_some()
                {
                    return Err(openstack_client::Error::Unsupported {
                        operation: "volume_delete",
                        message: "changed since the scan (attached, or no longer this cluster's): left alone".into(),
                    });
                }
                self.block.delete_volume(&t.id).await
            }
        }
    }
}

/// `cinder-csi-plugin orphans`.
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "cinder-csi-plugin orphans",
    about = "Lists the Cinder volumes and snapshots tagged with this cluster that no PersistentVolume or VolumeSnapshotContent names (older than --older-than), and deletes them with --delete",
    long_about = "Lists the Cinder volumes and snapshots tagged with this cluster (cinder.csi.openstack.org/cluster=--cluster) that no PersistentVolume or VolumeSnapshotContent of the driver names, older than --older-than; with --delete, deletes them (snapshots first; never one attached or busy), after reading the cluster's PVs again.\n\n\
        In the controller's pod it uses the pod's credentials for the apiserver: kubectl exec -n openstack-system deploy/csi-cinder-controllerplugin -c cinder-csi-plugin -- cinder-csi-plugin orphans --cloud-config=/etc/config/cloud.conf --cluster=<id>. Elsewhere give --kube-apiserver and --kube-token-file (kubectl create token csi-cinder-controller-sa -n openstack-system)."
)]
pub struct OrphansCommand {
    /// cloud.conf files, merged in order (later wins).
    #[arg(
        long = "cloud-config",
        env = "CLOUD_CONFIG",
        value_delimiter = ',',
        required = true
    )]
    pub cloud_config: Vec<PathBuf>,
    /// The cloud (`[Global "name"]`) to look in; "" is `[Global]`.
    #[arg(long = "cloud-name", default_value = "")]
    pub cloud_name: String,
    /// The cluster id the controller tags with (its --cluster).
    #[arg(long)]
    pub cluster: String,
    /// The CSI driver name the cluster's PVs carry.
    #[arg(long, default_value = crate::DEFAULT_DRIVER_NAME)]
    pub driver_name: String,
    #[command(flatten)]
    pub report: ReportArgs,
    #[command(flatten)]
    pub log: plugin_runtime::LogArgs,
}

/// Runs `cinder-csi-plugin orphans ...`: prints the report (and what was
/// deleted) on standard output.
pub async fn main() -> Result<String, CommandError> {
    use clap::Parser;
    let cmd = OrphansCommand::parse_from(std::env::args().skip(1));
    plugin_runtime::logging::init(&cmd.log)?;
    if cmd.cluster.is_empty() {
        return Err(CommandError::Flags(
            "--cluster is required: only what carries the cluster's id can be told to be its own"
                .into(),
        ));
    }
    let conf = csi_common::plugin::load_cloud_conf(&cmd.cloud_config)?;
    let session = openstack_client::Session::new(conf.cloud(&cmd.cloud_name)?, Default::default())?;
    let mut block = BlockStorage::new(session);
    if conf.block_storage.ignore_volume_microversion {
        block = block.without_microversions();
    }
    let inventory = CinderInventory {
        block,
        cluster: cmd.cluster.clone(),
    };
    let out =
        csi_common::orphans::run_command(&inventory, &cmd.cluster, &cmd.driver_name, &cmd.report)
            .await?;
    Ok(out.render(&cmd.report.output))
}
