//! Orphans: what a cluster's driver made in OpenStack (a volume, a share,
//! a snapshot) that no PersistentVolume or VolumeSnapshotContent of the
//! cluster names any more. A provisioner stopped between CreateVolume
//! and the PV, with the claim deleted meanwhile, leaves one for good
//! (external-provisioner #486), and so does a PV deleted by hand with its
//! reclaim policy `Retain` forgotten. Upstream leaks them silently.
//!
//! What makes a resource this cluster's is proven, never assumed: it
//! carries the cluster id (`--cluster`, `--cluster-id`, which operators
//! leave at `kubernetes` in every cluster) *and* the cluster's identity,
//! the uid of its `kube-system` namespace ([`ClusterIdentity`]), which the
//! controller writes beside the id when it creates it, and which the
//! apiserver the tool asks must answer with. Something without it (made
//! by an older version, or by hand) is listed as not proven and never
//! deleted until an operator adopts it by name (`--adopt`); something
//! with another cluster's is that cluster's.
//!
//! The controller reports orphans ([`reporter`]); `<plugin> orphans`
//! ([`command`]) prints the same report and, only when asked
//! (`--delete`), deletes those older than `--older-than`, never one in
//! use, only after reading the cluster's PVs again, and not at all when
//! its view of the cluster looks wrong.

use std::collections::{BTreeMap, HashSet};
use std::future::Future;
use std::net::IpAddr;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;

pub mod command;
pub mod reporter;

pub use command::{CommandError, CommandOutcome, Printed, ReportArgs, run_command};
pub use reporter::{OrphanMetrics, ServeArgs, spawn_reporter, start};

/// The first argument that runs the report instead of the plugin.
pub const SUBCOMMAND: &str = "orphans";

/// The namespace whose uid is a cluster's identity: every cluster has
/// one, made with the cluster and never renamed or remade.
pub const IDENTITY_NAMESPACE: &str = "kube-system";

/// A static PV's attributes naming a Manila share (upstream's format).
pub const SHARE_ID_ATTRIBUTE: &str = "shareID";
pub const SHARE_NAME_ATTRIBUTE: &str = "shareName";

/// Whether this process was started as `<plugin> orphans`.
pub fn invoked() -> bool {
    std::env::args().nth(1).as_deref() == Some(SUBCOMMAND)
}

/// Which of the cluster's lists names a resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NamedBy {
    /// A PersistentVolume's `spec.csi.volumeHandle` (or, for a share, a
    /// static PV's `shareID` / `shareName`).
    PersistentVolume,
    /// A VolumeSnapshotContent's snapshot handle.
    SnapshotContent,
}

/// The IP addresses of the cluster's Nodes, with each one's node.
pub type NodeAddresses = BTreeMap<IpAddr, String>;

/// A resource of the cloud that carries this cluster's id.
#[derive(Debug, Clone, Serialize)]
pub struct Tagged {
    /// `volume`, `share`, `snapshot`: the metric's label.
    pub kind: &'static str,
    pub id: String,
    pub name: String,
    pub status: String,
    /// Seconds since the Unix epoch.
    pub created: Option<u64>,
    pub named_by: NamedBy,
    /// Why it is never deleted here, orphan or not (attached to a server,
    /// busy): it is reported with the reason.
    pub keep: Option<String>,
    /// The cluster identity it carries (a snapshot: its volume's or
    /// share's), if any.
    pub identity: Option<String>,
    /// Why it is not the driver's own work whatever it carries (a Manila
    /// snapshot made by someone else of one of the cluster's shares).
    pub not_made_by_driver: Option<String>,
}

/// What the cluster names, as one apiserver lists it.
#[derive(Debug, Clone, Default)]
pub struct ClusterRefs {
    /// The apiserver's cluster identity (its kube-system uid).
    pub identity: String,
    /// The driver's PersistentVolumes.
    pub persistent_volumes: usize,
    pub volume_handles: HashSet<String>,
    /// Shares a static PV names by id or by name.
    pub share_ids: HashSet<String>,
    pub share_names: HashSet<String>,
    /// None: the cluster has no snapshot API, so whether a snapshot is
    /// named cannot be told (none is ever an orphan then).
    pub snapshots: Option<HashSet<String>>,
}

impl ClusterRefs {
    /// The driver's PVs and snapshot contents, and the cluster's
    /// identity, as the apiserver lists them. Any read that fails fails
    /// the whole: nothing is decided on half a view.
    pub async fn of(kube: &kube_api::Client, driver: &str) -> Result<Self, kube_api::KubeError> {
        let identity = kube.namespace_uid(IDENTITY_NAMESPACE).await?;
        let pvs = kube.csi_volumes(driver).await?;
        let snapshots = kube.csi_snapshot_handles(driver).await?;
        let attribute = |key: &str| -> HashSet<String> {
            pvs.iter()
                .filter_map(|pv| pv.volume_attributes.get(key))
                .filter(|v| !v.is_empty())
                .cloned()
                .collect()
        };
        Ok(Self {
            identity,
            persistent_volumes: pvs.len(),
            share_ids: attribute(SHARE_ID_ATTRIBUTE),
            share_names: attribute(SHARE_NAME_ATTRIBUTE),
            volume_handles: pvs
                .iter()
                .map(|pv| pv.volume_handle.clone())
                .filter(|h| !h.is_empty())
                .collect(),
            snapshots,
        })
    }

    fn names(&self, t: &Tagged) -> bool {
        match t.named_by {
            NamedBy::PersistentVolume => {
                self.volume_handles.contains(&t.id)
                    || self.share_ids.contains(&t.id)
                    || (!t.name.is_empty() && self.share_names.contains(&t.name))
            }
            NamedBy::SnapshotContent => self.snapshots.as_ref().is_some_and(|s| s.contains(&t.id)),
        }
    }

    /// Why `t` cannot be proven this cluster's own driver's work, if it
    /// cannot.
    fn unproven(&self, t: &Tagged) -> Option<String> {
        if let Some(why) = &t.not_made_by_driver {
            return Some(why.clone());
        }
        match t.identity.as_deref() {
            None => {
                return Some(
                    "carries the cluster id but no cluster identity (made by an older version or by hand): adopt it by name with --adopt if it is this cluster's"
                        .into(),
                );
            }
            Some(other) if other != self.identity => {
                return Some(format!(
                    "carries another cluster's identity ({other}; this apiserver's is {}): another cluster sharing the project and the cluster id, or the wrong --kube-apiserver",
                    self.identity
                ));
            }
            Some(_) => {}
        }
        if t.named_by == NamedBy::SnapshotContent && self.snapshots.is_none() {
            return Some(
                "the cluster has no snapshot API: whether a VolumeSnapshotContent names it cannot be told"
                    .into(),
            );
        }
        if t.created.is_none() {
            return Some("no creation time: its age cannot be told".into());
        }
        None
    }
}

/// A resource listed but never deleted, and why.
#[derive(Debug, Clone, Serialize)]
pub struct Unproven {
    #[serde(flatten)]
    pub resource: Tagged,
    pub why: String,
}

/// The report of one scan.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    /// Proven the cluster's, named by nothing, older than the grace
    /// period.
    pub orphans: Vec<Tagged>,
    /// Named by nothing yet, but younger than the grace period.
    pub young: Vec<Tagged>,
    /// Named by nothing, but not proven this cluster's driver's: never
    /// deleted.
    pub unproven: Vec<Unproven>,
    /// Orphans by the cluster's objects, but in use by its nodes as the
    /// cloud tells it (a Manila access rule naming one of their
    /// addresses): never deleted.
    pub held: Vec<Unproven>,
    /// Everything tagged with the cluster's id.
    pub tagged: usize,
    /// Of those, what the cluster names (in use).
    pub named: usize,
    /// The driver's PersistentVolumes.
    pub persistent_volumes: usize,
    /// The identity of the cluster the apiserver answered as.
    pub identity: String,
}

impl Report {
    /// Sorts what the cloud holds for the cluster against what the
    /// cluster names.
    pub fn new(tagged: Vec<Tagged>, refs: &ClusterRefs, grace: Duration, now: SystemTime) -> Self {
        let now = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let mut r = Report {
            tagged: tagged.len(),
            persistent_volumes: refs.persistent_volumes,
            identity: refs.identity.clone(),
            ..Default::default()
        };
        for t in tagged {
            if refs.names(&t) {
                r.named += 1;
            } else if let Some(why) = refs.unproven(&t) {
                r.unproven.push(Unproven { resource: t, why });
            } else if t
                .created
                .is_some_and(|c| now.saturating_sub(c) >= grace.as_secs())
            {
                r.orphans.push(t);
            } else {
                r.young.push(t);
            }
        }
        // by kind, oldest first
        r.orphans.sort_by_key(|t| (t.kind, t.created));
        r
    }

    /// Why deleting on this report would be acting on a wrong view of the
    /// cluster (none: it looks right).
    pub fn doubts(&self) -> Vec<String> {
        let mut doubts = Vec::new();
        if self.persistent_volumes == 0 && self.tagged > 0 {
            doubts.push(format!(
                "the apiserver lists no PersistentVolume of this driver while {} resources carry the cluster id: a wrong --drivername, or the wrong cluster",
                self.tagged
            ));
        }
        let with_identity: Vec<&str> = self
            .orphans
            .iter()
            .chain(&self.young)
            .filter_map(|t| t.identity.as_deref())
            .chain(
                self.unproven
                    .iter()
                    .filter_map(|u| u.resource.identity.as_deref()),
            )
            .collect();
        if !with_identity.is_empty() && with_identity.iter().all(|i| *i != self.identity) {
            doubts.push(format!(
                "none of the {} resources with a cluster identity carries this apiserver's ({}): it is not the cluster that made them",
                with_identity.len(),
                self.identity
            ));
        }
        let orphans = self.orphans.len();
        if orphans > FEW_ORPHANS && orphans > self.named {
            doubts.push(format!(
                "{orphans} orphans against {} resources in use: more leaked than used looks like a wrong view of the cluster",
                self.named
            ));
        }
        doubts
    }

    /// Orphans per kind.
    pub fn counts(&self) -> BTreeMap<&'static str, usize> {
        let mut c = BTreeMap::new();
        for o in &self.orphans {
            *c.entry(o.kind).or_default() += 1;
        }
        c
    }

    /// One line naming the orphans (the first 20 of them).
    pub fn summary(&self) -> String {
        const SHOWN: usize = 20;
        let now = unix_now();
        let mut names: Vec<String> = self
            .orphans
            .iter()
            .take(SHOWN)
            .map(|o| {
                format!(
                    "{} {} ({:?}, {}{})",
                    o.kind,
                    o.id,
                    o.name,
                    o.status,
                    o.created
                        .map(|c| format!(", {} old", human(now.saturating_sub(c))))
                        .unwrap_or_default()
                )
            })
            .collect();
        if self.orphans.len() > SHOWN {
            names.push(format!("and {} more", self.orphans.len() - SHOWN));
        }
        names.join("; ")
    }
}

/// Up to this many orphans are never doubted for their number alone (a
/// small cluster's one leaked claim may outnumber its volumes in use).
const FEW_ORPHANS: usize = 5;

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// `3h05m`, `12m`, `40s`.
pub(crate) fn human(secs: u64) -> String {
    match secs {
        s if s >= 86400 => format!("{}d{:02}h", s / 86400, s % 86400 / 3600),
        s if s >= 3600 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        s if s >= 60 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

/// OpenStack's `created_at` as seconds since the epoch.
pub fn created(created_at: Option<&str>) -> Option<u64> {
    crate::request::timestamp(created_at).and_then(|t| u64::try_from(t.seconds).ok())
}

/// What a driver lists, deletes and adopts of its own in the cloud.
pub trait Inventory: Send + Sync {
    /// Everything tagged with the cluster's id (volumes and their
    /// snapshots, or shares and theirs).
    fn tagged(&self) -> impl Future<Output = Result<Vec<Tagged>, openstack_client::Error>> + Send;
    /// Deletes one orphan, after reading it again: it must still carry
    /// `identity` and be unused.
    fn delete(
        &self,
        t: &Tagged,
        identity: &str,
    ) -> impl Future<Output = Result<(), openstack_client::Error>> + Send;
    /// Whether `held` needs the addresses of the cluster's nodes (the
    /// tool then lists Nodes).
    fn reads_node_addresses(&self) -> bool {
        false
    }
    /// Why an orphan by the cluster's objects is in use by its nodes as
    /// the cloud tells it (None: nothing says so). A read that fails
    /// fails the whole: nothing is deleted on what could not be read.
    fn held(
        &self,
        _t: &Tagged,
        _nodes: &NodeAddresses,
    ) -> impl Future<Output = Result<Option<String>, openstack_client::Error>> + Send {
        async { Ok(None) }
    }
    /// Writes `identity` into a resource that carries the cluster id and
    /// no identity (one an older version made).
    fn adopt(
        &self,
        t: &Tagged,
        identity: &str,
    ) -> impl Future<Output = Result<(), openstack_client::Error>> + Send;
}

/// The refusal a driver's delete or adopt returns when the resource is
/// not as the scan saw it.
pub fn changed_since_scan(operation: &'static str, why: &str) -> openstack_client::Error {
    openstack_client::Error::Unsupported {
        operation,
        message: format!("{why}: left alone"),
    }
}

/// The cluster's identity (its kube-system uid), once the apiserver has
/// told it: the controller writes it into everything it makes. Cheap to
/// clone; empty until known (what is made meanwhile carries none, and is
/// never deleted by the orphan tool without an operator's adoption).
#[derive(Debug, Clone, Default)]
pub struct ClusterIdentity(Arc<OnceLock<String>>);

/// How often the controller asks again for its identity until it has it.
const IDENTITY_RETRY: Duration = Duration::from_secs(15);

impl ClusterIdentity {
    /// An identity already known (tests).
    pub fn known(uid: &str) -> Self {
        let s = Self::default();
        let _ = s.0.set(uid.to_string());
        s
    }

    pub fn get(&self) -> Option<&str> {
        self.0.get().map(String::as_str)
    }

    /// Asks the apiserver for the identity, now and until it answers.
    /// Without a cluster id nothing is tagged, and without an apiserver
    /// (csi-sanity outside a cluster) there is no identity to find.
    pub fn resolve(cluster: &str, kube: &reporter::KubeArgs) -> Self {
        let s = Self::default();
        if cluster.is_empty() {
            return s;
        }
        let client = match kube.client() {
            Ok(c) => c,
            Err(e) => {
                tracing::info!(error = %e, "no apiserver to ask for the cluster's identity: what this controller makes carries the cluster id only, and the orphan tool will never delete it");
                return s;
            }
        };
        let cell = s.0.clone();
        tokio::spawn(async move {
            loop {
                match client.namespace_uid(IDENTITY_NAMESPACE).await {
                    Ok(uid) => {
                        tracing::info!(identity = %uid, "the cluster's identity (the uid of kube-system), written beside the cluster id into what this controller makes");
                        let _ = cell.set(uid);
                        return;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot read the cluster's identity (the uid of kube-system; the controller's role needs `get` on that namespace): what is made meanwhile carries the cluster id only")
                    }
                }
                tokio::time::sleep(IDENTITY_RETRY).await;
            }
        });
        s
    }

    /// The metadata to write beside the cluster id, when known.
    pub fn tag(&self, key: &str, metadata: &mut BTreeMap<String, String>) {
        if let Some(uid) = self.get() {
            metadata.insert(key.to_string(), uid.to_string());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: &str = "uid-of-this-cluster";

    fn tagged(kind: &'static str, id: &str, age_secs: Option<u64>, now: u64) -> Tagged {
        Tagged {
            kind,
            id: id.into(),
            name: format!("pvc-{id}"),
            status: "available".into(),
            created: age_secs.map(|a| now - a),
            named_by: if kind == "snapshot" {
                NamedBy::SnapshotContent
            } else {
                NamedBy::PersistentVolume
            },
            keep: None,
            identity: Some(US.into()),
            not_made_by_driver: None,
        }
    }

    fn refs() -> ClusterRefs {
        ClusterRefs {
            identity: US.into(),
            persistent_volumes: 3,
            volume_handles: ["v-named".to_string()].into(),
            share_ids: ["static-by-id".to_string()].into(),
            share_names: ["static-name".to_string()].into(),
            snapshots: Some(["s-named".to_string()].into()),
        }
    }

    #[test]
    fn only_what_is_proven_ours_and_named_by_nothing_past_the_grace_period_is_an_orphan() {
        let now = SystemTime::now();
        let secs = now.duration_since(UNIX_EPOCH).unwrap().as_secs();
        let mut by_name = tagged("share", "x", Some(7200), secs);
        by_name.name = "static-name".into();
        let mut theirs = tagged("volume", "v-theirs", Some(7200), secs);
        theirs.identity = Some("uid-of-another".into());
        let mut old_version = tagged("volume", "v-old-version", Some(7200), secs);
        old_version.identity = None;
        let mut backup = tagged("snapshot", "s-backup", Some(7200), secs);
        backup.not_made_by_driver = Some("made by someone else".into());
        let r = Report::new(
            vec![
                tagged("volume", "v-named", Some(7200), secs),
                tagged("volume", "v-old", Some(7200), secs),
                tagged("volume", "v-young", Some(60), secs),
                tagged("volume", "v-undated", None, secs),
                tagged("share", "static-by-id", Some(7200), secs),
                by_name,
                theirs,
                old_version,
                backup,
                tagged("snapshot", "s-named", Some(7200), secs),
                tagged("snapshot", "s-old", Some(7200), secs),
                // a snapshot id that a PV happens to name is still a snapshot
                tagged("snapshot", "v-named", Some(7200), secs),
            ],
            &refs(),
            Duration::from_secs(600),
            now,
        );
        let ids: Vec<&str> = r.orphans.iter().map(|o| o.id.as_str()).collect();
        assert_eq!(ids, ["s-old", "v-named", "v-old"]);
        assert_eq!(r.young.len(), 1);
        let unproven: Vec<&str> = r.unproven.iter().map(|u| u.resource.id.as_str()).collect();
        assert_eq!(
            unproven,
            ["v-undated", "v-theirs", "v-old-version", "s-backup"]
        );
        assert_eq!((r.tagged, r.named), (12, 4));
        assert_eq!(r.counts().get("volume"), Some(&1));
        assert!(
            r.summary()
                .contains("volume v-old (\"pvc-v-old\", available, 2h00m old)"),
            "{}",
            r.summary()
        );
        assert!(r.doubts().is_empty(), "{:?}", r.doubts());
        // without a snapshot API, no snapshot is an orphan
        let none = ClusterRefs {
            snapshots: None,
            ..refs()
        };
        let r = Report::new(
            vec![tagged("snapshot", "s-old", Some(7200), secs)],
            &none,
            Duration::ZERO,
            now,
        );
        assert!(r.orphans.is_empty());
        assert!(r.unproven[0].why.contains("no snapshot API"));
    }

    #[test]
    fn a_view_of_the_cluster_that_looks_wrong_is_doubted() {
        let now = SystemTime::now();
        let secs = now.duration_since(UNIX_EPOCH).unwrap().as_secs();
        let old = |id: &str| tagged("volume", id, Some(7200), secs);
        // no PV of the driver at all
        let no_pvs = ClusterRefs {
            persistent_volumes: 0,
            volume_handles: HashSet::new(),
            ..refs()
        };
        let r = Report::new(vec![old("a")], &no_pvs, Duration::ZERO, now);
        assert!(
            r.doubts()[0].contains("no PersistentVolume"),
            "{:?}",
            r.doubts()
        );
        // another apiserver: none carries its identity
        let elsewhere = ClusterRefs {
            identity: "uid-of-another".into(),
            ..refs()
        };
        let r = Report::new(
            vec![old("v-named"), old("a")],
            &elsewhere,
            Duration::ZERO,
            now,
        );
        assert!(
            r.doubts().iter().any(|d| d.contains("not the cluster")),
            "{:?}",
            r.doubts()
        );
        // far more leaked than used
        let many: Vec<Tagged> = (0..8).map(|i| old(&format!("o{i}"))).collect();
        let r = Report::new(many, &refs(), Duration::ZERO, now);
        assert!(
            r.doubts().iter().any(|d| d.contains("8 orphans against 0")),
            "{:?}",
            r.doubts()
        );
        // a few leaked in a small cluster are not doubted
        let few: Vec<Tagged> = (0..5).map(|i| old(&format!("o{i}"))).collect();
        assert!(
            Report::new(few, &refs(), Duration::ZERO, now)
                .doubts()
                .is_empty()
        );
    }
}
