//! The Cinder volumes and snapshots tagged with this cluster
//! (`cinder.csi.openstack.org/cluster`), with the cluster's identity they
//! carry (`.../cluster-uid` on a volume; a snapshot carries its
//! volume's), for the orphan report of `csi_common::orphans`; and
//! `cinder-csi-plugin orphans`, which prints it and deletes on demand.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

use csi_common::orphans::{
    CommandError, Inventory, NamedBy, Printed, ReportArgs, Tagged, changed_since_scan, created,
};
use openstack_client::cinder::{BlockStorage, SnapshotStatus, Volume, VolumeStatus};

use crate::controller::{CLUSTER_KEY, IDENTITY_KEY};

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

    /// Why a volume, as it is now, is not this cluster's with `identity`.
    fn not_ours(&self, v: &Volume, identity: &str) -> Option<&'static str> {
        if v.metadata.get(CLUSTER_KEY) != Some(&self.cluster) {
            Some("no longer tagged with this cluster")
        } else if v.metadata.get(IDENTITY_KEY).map(String::as_str) != Some(identity) {
            Some("no longer carries this cluster's identity")
        } else {
            None
        }
    }
}

impl Inventory for CinderInventory {
    async fn tagged(&self) -> Result<Vec<Tagged>, openstack_client::Error> {
        let tag = self.tag();
        let volumes = self.block.volumes_with_metadata(&tag).await?;
        let identities: HashMap<String, Option<String>> = volumes
            .iter()
            .map(|v| (v.id.clone(), v.metadata.get(IDENTITY_KEY).cloned()))
            .collect();
        let mut out: Vec<Tagged> = volumes
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
                    identity: v.metadata.get(IDENTITY_KEY).cloned(),
                    not_made_by_driver: None,
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
                        // its volume's: a volume of another cluster (or
                        // none tagged) gives it none
                        identity: identities.get(&s.volume_id).cloned().flatten(),
                        not_made_by_driver: None,
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

    async fn delete(&self, t: &Tagged, identity: &str) -> Result<(), openstack_client::Error> {
        match t.named_by {
            NamedBy::SnapshotContent => {
                // as it is now, with its volume as it is now
                let s = self.block.get_snapshot(&t.id).await?;
                let v = self.block.get_volume(&s.volume_id).await?;
                if s.metadata.get(CLUSTER_KEY) != Some(&self.cluster) {
                    return Err(changed_since_scan(
                        "snapshot_delete",
                        "no longer tagged with this cluster",
                    ));
                }
                if let Some(why) = self.not_ours(&v, identity) {
                    return Err(changed_since_scan("snapshot_delete", why));
                }
                self.block.delete_snapshot(&t.id).await
            }
            NamedBy::PersistentVolume => {
                // as it is now: attached or retagged since the scan, it stays
                let v = self.block.get_volume(&t.id).await?;
                if let Some(why) = self.not_ours(&v, identity) {
                    return Err(changed_since_scan("volume_delete", why));
                }
                if v.attached_servers().next().is_some() {
                    return Err(changed_since_scan(
                        "volume_delete",
                        "attached since the scan",
                    ));
                }
                self.block.delete_volume(&t.id).await
            }
        }
    }

    async fn adopt(&self, t: &Tagged, identity: &str) -> Result<(), openstack_client::Error> {
        let v = self.block.get_volume(&t.id).await?;
        if v.metadata.get(CLUSTER_KEY) != Some(&self.cluster) {
            return Err(changed_since_scan(
                "volume_metadata_update",
                "no longer tagged with this cluster",
            ));
        }
        if let Some(has) = v.metadata.get(IDENTITY_KEY) {
            return Err(changed_since_scan(
                "volume_metadata_update",
                &format!("it carries an identity now ({has})"),
            ));
        }
        let identity = BTreeMap::from([(IDENTITY_KEY.to_string(), identity.to_string())]);
        self.block
            .update_volume_metadata(&t.id, &identity)
            .await
            .map(|_| ())
    }
}

/// `cinder-csi-plugin orphans`.
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "cinder-csi-plugin orphans",
    about = "Lists the Cinder volumes and snapshots tagged with this cluster that no PersistentVolume or VolumeSnapshotContent names (older than --older-than), and deletes them with --delete",
    long_about = "Lists the Cinder volumes and snapshots of this cluster that no PersistentVolume or VolumeSnapshotContent of --drivername names, older than --older-than. A volume is this cluster's only when it carries both the cluster id (cinder.csi.openstack.org/cluster=--cluster) and the cluster's identity (cinder.csi.openstack.org/cluster-uid, the uid of kube-system, which the controller writes); a snapshot carries its volume's. Anything else is listed as not proven and never deleted; --adopt writes the identity into volumes an older version made.\n\n\
        A dry run unless --delete: then it deletes the orphans (snapshots first; never one attached or busy), after reading the cluster again, and refuses when its view of the cluster looks wrong (no PV of the driver, another cluster's apiserver, more orphans than volumes in use) unless each is named with --force-delete.\n\n\
        It reads the apiserver only (get namespace kube-system, list persistentvolumes and volumesnapshotcontents): in the controller's pod it uses the pod's own credentials (kubectl exec ... -- cinder-csi-plugin orphans ...); elsewhere give --kube-apiserver, --kube-ca-file and --kube-token-file with a token of a role that can read no more than that."
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
    /// The CSI driver name the cluster's PVs carry, as the controller's
    /// --drivername (cinder.csi.openstack.org in deploy/ and the chart).
    #[arg(long = "drivername", alias = "driver-name")]
    pub driver_name: String,
    #[command(flatten)]
    pub report: ReportArgs,
    #[command(flatten)]
    pub log: plugin_runtime::LogArgs,
}

/// Runs `cinder-csi-plugin orphans ...`: prints the report (and what was
/// deleted) on standard output.
pub async fn main() -> Result<Printed, CommandError> {
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
    Ok(out.printed(&cmd.report.output))
}
