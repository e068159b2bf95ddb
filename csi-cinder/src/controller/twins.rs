//! Volumes and snapshots of one name made twice: two controller replicas
//! acting at once (leader election off, or a lease that briefly allows
//! two, as during a rolling update), each of which looked the name up,
//! found nothing and created one. Every replica settles on the same one,
//! the oldest by Cinder's `created_at` (then by id), and the replica that
//! made another deletes its own; a later call deletes whatever a killed
//! replica left. Only what this driver made (its description, and the
//! cluster's tag where `--cluster` is set) is ever settled: duplicates of
//! a name made by anyone else stay an error naming them.

use std::collections::BTreeMap;
use std::time::Instant;

use csi_common::twins::{rank, wait_past_created_second};
use csi_common::{Context, DriverResult};
use openstack_client::cinder::{
    BlockStorage, ListSnapshots, Snapshot, SnapshotStatus, Volume, VolumeStatus,
};

use super::*;

/// What twins are told apart and settled by.
trait Twin {
    fn id(&self) -> &str;
    fn created_at(&self) -> Option<&str>;
    fn description(&self) -> Option<&str>;
    fn metadata(&self) -> &BTreeMap<String, String>;
    /// Whether Cinder deletes it as it is now (not while being made).
    fn deletable(&self) -> bool;
}

impl Twin for Volume {
    fn id(&self) -> &str {
        &self.id
    }
    fn created_at(&self) -> Option<&str> {
        self.created_at.as_deref()
    }
    fn description(&self) -> Option<&str> {
        self.description.as_deref()
    }
    fn metadata(&self) -> &BTreeMap<String, String> {
        &self.metadata
    }
    fn deletable(&self) -> bool {
        matches!(self.status, VolumeStatus::Available) || self.status.is_error()
    }
}

impl Twin for Snapshot {
    fn id(&self) -> &str {
        &self.id
    }
    fn created_at(&self) -> Option<&str> {
        self.created_at.as_deref()
    }
    fn description(&self) -> Option<&str> {
        self.description.as_deref()
    }
    fn metadata(&self) -> &BTreeMap<String, String> {
        &self.metadata
    }
    fn deletable(&self) -> bool {
        matches!(self.status, SnapshotStatus::Available) || self.status.is_error()
    }
}

/// The one every replica keeps of several of one name.
fn keeper<T: Twin>(twins: &[T]) -> Option<&T> {
    twins.iter().min_by_key(|t| rank(t.created_at(), t.id()))
}

impl ControllerService {
    /// Whether this driver made it (of this cluster).
    fn made_here(&self, t: &impl Twin) -> bool {
        t.description() == Some(DESCRIPTION)
            && (self.opts.cluster.is_empty()
                || t.metadata().get(CLUSTER_KEY) == Some(&self.opts.cluster))
    }

    /// Of what a lookup by name found: the one to keep, alone, once the
    /// others (twins this driver made) are deleted where Cinder lets them
    /// be (a twin still being made is its maker's to delete, or the next
    /// call's). Anything else is answered as found.
    async fn settle<T, F, Fut>(
        &self,
        what: &str,
        name: &str,
        found: Vec<T>,
        delete: F,
    ) -> DriverResult<Vec<T>>
    where
        T: Twin + Clone,
        F: Fn(String) -> Fut,
        Fut: std::future::Future<Output = openstack_client::Result<()>>,
    {
        if found.len() < 2 || !found.iter().all(|t| self.made_here(t)) {
            return Ok(found);
        }
        let Some(keep) = keeper(&found).cloned() else {
            return Ok(found);
        };
        for twin in found
            .iter()
            .filter(|t| t.id() != keep.id() && t.deletable())
        {
            not_found_ok(delete(twin.id().to_string()).await).context(format!(
                "deleting {what} {}, a twin of {}",
                twin.id(),
                keep.id()
            ))?;
            tracing::warn!(twin = %twin.id(), kept = %keep.id(), name, "a second {what} of this name, made by another replica at the same time, deleted");
        }
        Ok(vec![keep])
    }

    /// Volumes named alike, settled (see [`Self::settle`]).
    pub(super) async fn settle_twins(
        &self,
        block: &BlockStorage,
        name: &str,
        found: Vec<Volume>,
    ) -> DriverResult<Vec<Volume>> {
        self.settle("volume", name, found, |id| async move {
            block.delete_volume(&id).await
        })
        .await
    }

    /// Snapshots named alike, settled (see [`Self::settle`]).
    pub(super) async fn settle_snapshot_twins(
        &self,
        block: &BlockStorage,
        name: &str,
        found: Vec<Snapshot>,
    ) -> DriverResult<Vec<Snapshot>> {
        self.settle("snapshot", name, found, |id| async move {
            block.delete_snapshot(&id).await
        })
        .await
    }

    /// An older volume of the name that another replica made while this
    /// call made `mine` (looked for as soon as `mine` exists: any volume
    /// made before it is listed by then), if there is one.
    pub(super) async fn older_twin(
        &self,
        block: &BlockStorage,
        name: &str,
        mine: &Volume,
    ) -> DriverResult<Option<Volume>> {
        wait_past_created_second(mine.created_at.as_deref(), mine.read_at).await;
        let named: Vec<Volume> = block
            .volumes_named(name)
            .await
            .context(format!("looking up volumes named {name}"))?
            .into_iter()
            .filter(|v| !volume_gone(&v.status) && self.made_here(v))
            .collect();
        Ok(keeper(&named).filter(|k| k.id != mine.id).cloned())
    }

    /// `mine`, available, yields to `keep`, an older twin: `mine` is
    /// deleted and `keep` is the answer, once available.
    pub(super) async fn yield_to(
        &self,
        block: &BlockStorage,
        name: &str,
        mine: &Volume,
        keep: &Volume,
        deadline: Instant,
    ) -> DriverResult<Volume> {
        not_found_ok(block.delete_volume(&mine.id).await).context(format!(
            "deleting volume {}, a twin of {}",
            mine.id, keep.id
        ))?;
        tracing::warn!(volume_id = %mine.id, kept = %keep.id, name, "another replica made this volume first: ours deleted, theirs answered");
        self.wait_volume_available(block, &keep.id, deadline).await
    }

    /// The same for a snapshot this call created and saw available: the
    /// older twin is the answer (as it is, `ready_to_use` tells the
    /// snapshotter whether to poll), and `mine` is deleted.
    pub(super) async fn yield_to_an_older_snapshot(
        &self,
        block: &BlockStorage,
        name: &str,
        mine: Snapshot,
    ) -> DriverResult<Snapshot> {
        wait_past_created_second(mine.created_at.as_deref(), mine.read_at).await;
        let named: Vec<Snapshot> = block
            .list_snapshots(&ListSnapshots {
                name: Some(name.to_string()),
                ..Default::default()
            })
            .await
            .context(format!("looking up snapshots named {name}"))?
            .items
            .into_iter()
            .filter(|s| {
                s.name == name
                    && !matches!(s.status, SnapshotStatus::Deleting | SnapshotStatus::Deleted)
                    && self.made_here(s)
            })
            .collect();
        let Some(keep) = keeper(&named).filter(|k| k.id != mine.id).cloned() else {
            return Ok(mine);
        };
        not_found_ok(block.delete_snapshot(&mine.id).await).context(format!(
            "deleting snapshot {}, a twin of {}",
            mine.id, keep.id
        ))?;
        tracing::warn!(snapshot_id = %mine.id, kept = %keep.id, name, "another replica made this snapshot first: ours deleted, theirs answered");
        Ok(keep)
    }
}
