//! Volumes and snapshots of one name made twice: two controller replicas
//! acting at once (leader election off, or a lease that briefly allows
//! two, as during a rolling update), each of which looked the name up,
//! found nothing and created one. Every replica settles on the same one,
//! the oldest by Cinder's `created_at` (then by id), and the replica that
//! made another deletes its own; a later call deletes whatever a killed
//! replica left. Only what this driver made (its description, and the
//! cluster's tag where `--cluster` is set) is ever settled: duplicates of
//! a name made by anyone else stay an error naming them.

use std::time::Instant;

use csi_common::twins::{TwinView, keeper, settle, wait_past_created_second};
use csi_common::{Context, DriverResult};
use openstack_client::cinder::{BlockStorage, Snapshot, SnapshotStatus, Volume, VolumeStatus};

use super::*;

impl ControllerService {
    /// Whether this driver made it (of this cluster), by its description
    /// and metadata.
    fn made_here(
        &self,
        description: Option<&str>,
        metadata: &std::collections::BTreeMap<String, String>,
    ) -> bool {
        description == Some(DESCRIPTION)
            && (self.opts.cluster.is_empty()
                || metadata.get(CLUSTER_KEY) == Some(&self.opts.cluster))
    }

    fn volume_view(&self, v: &Volume) -> TwinView {
        TwinView {
            id: v.id.clone(),
            created_at: v.created_at.clone(),
            made_here: self.made_here(v.description.as_deref(), &v.metadata),
            deletable: matches!(v.status, VolumeStatus::Available) || v.status.is_error(),
        }
    }

    fn snapshot_view(&self, s: &Snapshot) -> TwinView {
        TwinView {
            id: s.id.clone(),
            created_at: s.created_at.clone(),
            made_here: self.made_here(s.description.as_deref(), &s.metadata),
            deletable: matches!(s.status, SnapshotStatus::Available) || s.status.is_error(),
        }
    }

    /// Volumes named alike, settled (see [`settle`]).
    pub(super) async fn settle_twins(
        &self,
        block: &BlockStorage,
        name: &str,
        found: Vec<Volume>,
    ) -> DriverResult<Vec<Volume>> {
        settle(
            "volume",
            name,
            found,
            |v| self.volume_view(v),
            |id| async move { block.delete_volume(&id).await },
        )
        .await
    }

    /// Snapshots named alike, settled (see [`settle`]).
    pub(super) async fn settle_snapshot_twins(
        &self,
        block: &BlockStorage,
        name: &str,
        found: Vec<Snapshot>,
    ) -> DriverResult<Vec<Snapshot>> {
        settle(
            "snapshot",
            name,
            found,
            |s| self.snapshot_view(s),
            |id| async move { block.delete_snapshot(&id).await },
        )
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
            .filter(|v| !volume_gone(&v.status) && self.volume_view(v).made_here)
            .collect();
        Ok(keeper(&named, |v| self.volume_view(v))
            .filter(|k| k.id != mine.id)
            .cloned())
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
            .snapshots_named(name)
            .await
            .context(format!("looking up snapshots named {name}"))?
            .into_iter()
            .filter(|s| {
                !matches!(s.status, SnapshotStatus::Deleting | SnapshotStatus::Deleted)
                    && self.snapshot_view(s).made_here
            })
            .collect();
        let Some(keep) = keeper(&named, |s| self.snapshot_view(s))
            .filter(|k| k.id != mine.id)
            .cloned()
        else {
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
