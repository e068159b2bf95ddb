//! The Manila shares tagged with this cluster
//! (`manila.csi.openstack.org/cluster`) of the protocol this instance
//! serves, and their snapshots (Manila's snapshots carry no tag: a
//! snapshot of one of those shares is the cluster's), for the orphan
//! report of `csi_common::orphans`; and `manila-csi-plugin orphans`,
//! which prints it and deletes on demand.

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;

use csi_common::orphans::{CommandError, Inventory, NamedBy, ReportArgs, Tagged, created};
use openstack_client::manila::{ShareSnapshotStatus, ShareStatus, SharedFileSystems};

use crate::share_protocol::ShareProtocol;
use crate::shares::CLUSTER_KEY;

/// What the report counts, by its metric's `kind` label.
pub const KINDS: &[&str] = &["share", "snapshot"];

/// One cloud's shares (of one protocol) and snapshots of one cluster.
#[derive(Debug, Clone)]
pub struct ManilaInventory {
    pub manila: SharedFileSystems,
    pub cluster: String,
    pub protocol: ShareProtocol,
}

fn keep_unless(settled: bool, status: &str) -> Option<String> {
    (!settled).then(|| format!("{status} (neither available nor in error)"))
}

impl Inventory for ManilaInventory {
    async fn tagged(&self) -> Result<Vec<Tagged>, openstack_client::Error> {
        let tag = BTreeMap::from([(CLUSTER_KEY.to_string(), self.cluster.clone())]);
        let shares: Vec<_> = self
            .manila
            .shares_with_metadata(&tag)
            .await?
            .into_iter()
            .filter(|s| {
                s.share_proto
                    .eq_ignore_ascii_case(self.protocol.as_manila())
            })
            .collect();
        let ours: HashSet<String> = shares.iter().map(|s| s.id.clone()).collect();
        let mut out: Vec<Tagged> = shares
            .into_iter()
            .map(|s| Tagged {
                kind: "share",
                created: created(s.created_at.as_deref()),
                keep: keep_unless(
                    matches!(s.status, ShareStatus::Available) || s.status.is_error(),
                    s.status.as_str(),
                ),
                status: s.status.to_string(),
                id: s.id,
                name: s.name,
                named_by: NamedBy::PersistentVolume,
            })
            .collect();
        out.extend(
            self.manila
                .all_snapshots()
                .await?
                .into_iter()
                .filter(|s| ours.contains(&s.share_id))
                .map(|s| Tagged {
                    kind: "snapshot",
                    created: created(s.created_at.as_deref()),
                    keep: keep_unless(
                        matches!(
                            s.status,
                            ShareSnapshotStatus::Available | ShareSnapshotStatus::Error
                        ),
                        s.status.as_str(),
                    ),
                    status: s.status.to_string(),
                    id: s.id,
                    name: s.name,
                    named_by: NamedBy::SnapshotContent,
                }),
        );
        Ok(out)
    }

    async fn delete(&self, t: &Tagged) -> Result<(), openstack_client::Error> {
        match t.named_by {
            NamedBy::SnapshotContent => self.manila.delete_snapshot(&t.id).await,
            NamedBy::PersistentVolume => {
                let s = self.manila.get_share(&t.id).await?;
                if s.metadata.get(CLUSTER_KEY) != Some(&self.cluster) {
                    return Err(openstack_client::Error::Unsupported {
                        operation: "share_delete",
                        message: "no longer this cluster's: left alone".into(),
                    });
                }
                self.manila.delete_share(&t.id).await
            }
        }
    }
}

/// `manila-csi-plugin orphans`.
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "manila-csi-plugin orphans",
    about = "Lists the Manila shares tagged with this cluster (of one protocol) and their snapshots that no PersistentVolume or VolumeSnapshotContent names (older than --older-than), and deletes them with --delete",
    long_about = "Lists the Manila shares tagged with this cluster (manila.csi.openstack.org/cluster=--cluster-id) of the protocol --share-protocol-selector names, and their snapshots, that no PersistentVolume or VolumeSnapshotContent of --drivername names, older than --older-than; with --delete, deletes them (snapshots first; never one busy), after reading the cluster's PVs again. Uses the [Global] credentials of --cloud-config.\n\n\
        In the controller's pod it uses the pod's credentials for the apiserver; elsewhere give --kube-apiserver and --kube-token-file."
)]
pub struct OrphansCommand {
    /// cloud.conf files with the credentials to look with.
    #[arg(
        long = "cloud-config",
        env = "CLOUD_CONFIG",
        value_delimiter = ',',
        required = true
    )]
    pub cloud_config: Vec<PathBuf>,
    /// The cluster id the controller tags with (its --cluster-id).
    #[arg(long = "cluster-id")]
    pub cluster_id: String,
    /// The CSI driver name the cluster's PVs carry.
    #[arg(long = "drivername", default_value = crate::DEFAULT_DRIVER_NAME)]
    pub driver_name: String,
    /// The protocol of the shares this driver makes.
    #[arg(long = "share-protocol-selector", value_enum)]
    pub share_protocol: ShareProtocol,
    #[command(flatten)]
    pub report: ReportArgs,
    #[command(flatten)]
    pub log: plugin_runtime::LogArgs,
}

/// Runs `manila-csi-plugin orphans ...`: the report (and what was
/// deleted), for standard output.
pub async fn main() -> Result<String, CommandError> {
    use clap::Parser;
    let cmd = OrphansCommand::parse_from(std::env::args().skip(1));
    plugin_runtime::logging::init(&cmd.log)?;
    if cmd.cluster_id.is_empty() {
        return Err(CommandError::Flags(
            "--cluster-id is required: only what carries the cluster's id can be told to be its own".into(),
        ));
    }
    let conf = csi_common::plugin::load_cloud_conf(&cmd.cloud_config)?;
    let session = openstack_client::Session::new(conf.cloud("")?, Default::default())?;
    let inventory = ManilaInventory {
        manila: SharedFileSystems::new(session),
        cluster: cmd.cluster_id.clone(),
        protocol: cmd.share_protocol,
    };
    let out = csi_common::orphans::run_command(
        &inventory,
        &cmd.cluster_id,
        &cmd.driver_name,
        &cmd.report,
    )
    .await?;
    Ok(out.render(&cmd.report.output))
}
