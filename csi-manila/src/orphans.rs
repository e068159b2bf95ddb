//! The Manila shares tagged with this cluster
//! (`manila.csi.openstack.org/cluster`) of the protocol this instance
//! serves, with the cluster's identity they carry (`.../cluster-uid`),
//! and the snapshots the driver made of them (Manila's snapshots carry no
//! tag: one of those shares' snapshots is the driver's when it bears the
//! driver's description, and carries its share's identity), and the
//! access rules that show a share in use by the cluster's nodes, for the
//! orphan report of `csi_common::orphans`; and `manila-csi-plugin
//! orphans`, which prints it and deletes on demand.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::path::PathBuf;

use csi_common::orphans::{
    CommandError, Inventory, NamedBy, NodeAddresses, Printed, ReportArgs, Tagged,
    changed_since_scan, created,
};
use openstack_client::manila::{
    AccessRule, Share, ShareSnapshotStatus, ShareStatus, SharedFileSystems,
};

use crate::share_protocol::ShareProtocol;
use crate::shares::{
    CLONE_SNAPSHOT_DESCRIPTION, CLUSTER_KEY, DESCRIPTION, IDENTITY_KEY, readers_of,
};

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

/// Why a snapshot is not the driver's, whatever share it is of: the
/// driver describes each snapshot it makes with one of its two
/// descriptions.
fn not_made_by_driver(description: Option<&str>) -> Option<String> {
    let ours = matches!(description, Some(DESCRIPTION | CLONE_SNAPSHOT_DESCRIPTION));
    (!ours).then(|| {
        format!(
            "a snapshot the driver did not make (its description is {:?}, not {DESCRIPTION:?}): a backup's or an operator's",
            description.unwrap_or_default()
        )
    })
}

impl ManilaInventory {
    /// Why a share, as it is now, is not this cluster's with `identity`.
    fn not_ours(&self, s: &Share, identity: &str) -> Option<&'static str> {
        if s.metadata.get(CLUSTER_KEY) != Some(&self.cluster) {
            Some("no longer tagged with this cluster")
        } else if s.metadata.get(IDENTITY_KEY).map(String::as_str) != Some(identity) {
            Some("no longer carries this cluster's identity")
        } else {
            None
        }
    }
}

/// The one host an `ip` access rule names: an address, or a network of
/// one address (`/32`, `/128`). A wider network (a class's
/// `nfs-shareClient`, given to every share the class makes) names no
/// node in particular and says nothing of use.
fn one_host(access_to: &str) -> Option<IpAddr> {
    let (addr, prefix) = match access_to.trim().split_once('/') {
        Some((a, p)) => (a, Some(p)),
        None => (access_to.trim(), None),
    };
    let ip: IpAddr = addr.parse().ok()?;
    let full = if ip.is_ipv4() { 32 } else { 128 };
    match prefix {
        None => Some(ip),
        Some(p) => (p.parse::<u8>().ok()? == full).then_some(ip),
    }
}

/// Why a share is in use by the cluster's nodes, as its access rules
/// tell: a rule granting one of their addresses alone (whoever granted
/// it, a node there may have it mounted).
fn held_by_rules(rules: &[AccessRule], nodes: &NodeAddresses) -> Option<String> {
    rules.iter().find_map(|r| {
        if !r.access_type.eq_ignore_ascii_case("ip") {
            return None;
        }
        let node = nodes.get(&one_host(&r.access_to)?)?;
        Some(format!(
            "an access rule grants node {node}'s address {} ({} {}): a pod there may have the share mounted (deny the rule once nothing mounts it)",
            r.access_to, r.access_level, r.state
        ))
    })
}

impl Inventory for ManilaInventory {
    fn reads_node_addresses(&self) -> bool {
        true
    }

    async fn held(
        &self,
        t: &Tagged,
        nodes: &NodeAddresses,
    ) -> Result<Option<String>, openstack_client::Error> {
        // a volume backed by a snapshot reads it through a rule on its
        // share, and no PV or content names either by id: the rules tell
        let share_id = match t.named_by {
            NamedBy::PersistentVolume => t.id.clone(),
            NamedBy::SnapshotContent => match self.manila.get_snapshot(&t.id).await {
                Ok(s) => s.share_id,
                Err(e) if e.is_not_found() => return Ok(None),
                Err(e) => return Err(e),
            },
        };
        // a share deleted since it was listed (one being deleted answers
        // 404 too) is held by nothing
        let rules = match self.manila.list_access_rules(&share_id).await {
            Ok(r) => r,
            Err(e) if e.is_not_found() => return Ok(None),
            Err(e) => return Err(e),
        };
        let snapshot = (t.named_by == NamedBy::SnapshotContent).then_some(t.id.as_str());
        let readers = readers_of(&rules, snapshot);
        if !readers.is_empty() {
            return Ok(Some(format!(
                "read by {} volume(s) backed by {} ({}): delete them first",
                readers.len(),
                if snapshot.is_some() {
                    "this snapshot"
                } else {
                    "its snapshots"
                },
                readers.join(", ")
            )));
        }
        if t.named_by != NamedBy::PersistentVolume || nodes.is_empty() {
            return Ok(None);
        }
        Ok(held_by_rules(&rules, nodes))
    }

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
        let identities: HashMap<String, Option<String>> = shares
            .iter()
            .map(|s| (s.id.clone(), s.metadata.get(IDENTITY_KEY).cloned()))
            .collect();
        let mut out: Vec<Tagged> = shares
            .into_iter()
            .map(|s| Tagged {
                kind: "share",
                created: created(s.created_at.as_deref()),
                keep: keep_unless(
                    matches!(s.status, ShareStatus::Available) || s.status.is_error(),
                    s.status.as_str(),
                ),
                identity: s.metadata.get(IDENTITY_KEY).cloned(),
                not_made_by_driver: None,
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
                .filter_map(|s| {
                    let identity = identities.get(&s.share_id)?.clone();
                    Some(Tagged {
                        kind: "snapshot",
                        created: created(s.created_at.as_deref()),
                        keep: keep_unless(
                            matches!(
                                s.status,
                                ShareSnapshotStatus::Available | ShareSnapshotStatus::Error
                            ),
                            s.status.as_str(),
                        ),
                        identity,
                        not_made_by_driver: not_made_by_driver(s.description.as_deref()),
                        status: s.status.to_string(),
                        id: s.id,
                        name: s.name,
                        named_by: NamedBy::SnapshotContent,
                    })
                }),
        );
        Ok(out)
    }

    async fn delete(&self, t: &Tagged, identity: &str) -> Result<(), openstack_client::Error> {
        match t.named_by {
            NamedBy::SnapshotContent => {
                // as it is now, with its share as it is now
                let snap = self.manila.get_snapshot(&t.id).await?;
                if let Some(why) = not_made_by_driver(snap.description.as_deref()) {
                    return Err(changed_since_scan("snapshot_delete", &why));
                }
                let share = self.manila.get_share(&snap.share_id).await?;
                if let Some(why) = self.not_ours(&share, identity) {
                    return Err(changed_since_scan("snapshot_delete", why));
                }
                self.manila.delete_snapshot(&t.id).await
            }
            NamedBy::PersistentVolume => {
                let s = self.manila.get_share(&t.id).await?;
                if let Some(why) = self.not_ours(&s, identity) {
                    return Err(changed_since_scan("share_delete", why));
                }
                self.manila.delete_share_of(&s).await
            }
        }
    }

    async fn adopt(&self, t: &Tagged, identity: &str) -> Result<(), openstack_client::Error> {
        let s = self.manila.get_share(&t.id).await?;
        if s.metadata.get(CLUSTER_KEY) != Some(&self.cluster) {
            return Err(changed_since_scan(
                "share_metadata_update",
                "no longer tagged with this cluster",
            ));
        }
        if let Some(has) = s.metadata.get(IDENTITY_KEY) {
            return Err(changed_since_scan(
                "share_metadata_update",
                &format!("it carries an identity now ({has})"),
            ));
        }
        let identity = BTreeMap::from([(IDENTITY_KEY.to_string(), identity.to_string())]);
        self.manila.update_share_metadata(&t.id, &identity).await
    }
}

/// `manila-csi-plugin orphans`.
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "manila-csi-plugin orphans",
    about = "Lists the Manila shares tagged with this cluster (of one protocol) and their snapshots that no PersistentVolume or VolumeSnapshotContent names (older than --older-than), and deletes them with --delete",
    long_about = "Lists the Manila shares of this cluster of the protocol --share-protocol-selector names, and the snapshots the driver made of them, that no PersistentVolume (by volume handle, or a static PV's shareID or shareName) or VolumeSnapshotContent of --drivername names, older than --older-than. A share is this cluster's only when it carries both the cluster id (manila.csi.openstack.org/cluster=--cluster-id) and the cluster's identity (manila.csi.openstack.org/cluster-uid, the uid of kube-system, which the controller writes); a snapshot carries its share's, and only one with the driver's description is the driver's. A share with an ip access rule granting one of the cluster's Nodes' addresses alone (an address, /32 or /128) is in use by that node and never deleted; so is a snapshot that a volume backed by it reads (a read-only rule on its share naming it, which no PV names by id), and its share. Anything else is listed as not proven and never deleted; --adopt writes the identity into shares an older version made.\n\n\
        A dry run unless --delete: then it deletes the orphans (snapshots first; never one busy), after reading the cluster again, and refuses when its view of the cluster looks wrong (no PV of the driver, another cluster's apiserver, more orphans than shares in use) unless each is named with --force-delete. Uses the [Global] credentials of --cloud-config.\n\n\
        It reads the apiserver only (get namespace kube-system, list persistentvolumes, volumesnapshotcontents and nodes): in the controller's pod it uses the pod's own credentials; elsewhere give --kube-apiserver, --kube-ca-file and --kube-token-file with a token of a role that can read no more than that."
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
    /// The CSI driver name the cluster's PVs carry, as the controller's
    /// --drivername (nfs.manila.csi.openstack.org or
    /// cephfs.manila.csi.openstack.org in deploy/ and the charts).
    #[arg(long = "drivername")]
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
pub async fn main() -> Result<Printed, CommandError> {
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
    Ok(out.printed(&cmd.report.output))
}
