//! Volumes of one name made twice: two controller replicas acting at once
//! (leader election off, or a lease that briefly allows two, as during a
//! rolling update), each of which looked the name up, found nothing and
//! created one. Every replica settles on the same one, the oldest by
//! Cinder's `created_at` (then by id), and the replica that made another
//! deletes its own; a later call deletes whatever a killed replica left.
//! Only volumes this driver made (its description, and the cluster's tag
//! where `--cluster` is set) are ever settled: duplicates of a name made
//! by anyone else stay an error naming them.

use std::time::Instant;

use csi_common::twins::{rank, wait_past_created_second};
use csi_common::{Context, DriverResult};
use openstack_client::cinder::{BlockStorage, Volume, VolumeStatus};

use super::*;

/// The volume every replica keeps of several of one name.
fn keeper(volumes: &[Volume]) -> Option<&Volume> {
    volumes
        .iter()
        .min_by_key(|v| rank(v.created_at.as_deref(), &v.id))
}

impl ControllerService {
    /// Whether this driver made the volume (of this cluster).
    fn made_here(&self, v: &Volume) -> bool {
        v.description.as_deref() == Some(DESCRIPTION)
            && (self.opts.cluster.is_empty()
                || v.metadata.get(CLUSTER_KEY) == Some(&self.opts.cluster))
    }

    /// Of the volumes named alike that a lookup found: the one to keep,
    /// alone, once the others (twins this driver made) are deleted where
    /// Cinder lets them be (a twin still being created is its maker's to
    /// delete, or the next call's). Anything else is answered as found.
    pub(super) async fn settle_twins(
        &self,
        block: &BlockStorage,
        name: &str,
        found: Vec<Volume>,
    ) -> DriverResult<Vec<Volume>> {
        if found.len() < 2 || !found.iter().all(|v| self.made_here(v)) {
            return Ok(found);
        }
        let Some(keep) = keeper(&found).cloned() else {
            return Ok(found);
        };
        for twin in found.iter().filter(|v| v.id != keep.id) {
            if matches!(twin.status, VolumeStatus::Available) || twin.status.is_error() {
                not_found_ok(block.delete_volume(&twin.id).await).context(format!(
                    "deleting volume {}, a twin of {}",
                    twin.id, keep.id
                ))?;
                tracing::warn!(volume_id = %twin.id, kept = %keep.id, name, "a second volume of this name, made by another replica at the same time, deleted");
            }
        }
        Ok(vec![keep])
    }

    /// After this call created `mine` and it became available: if another
    /// replica made an older volume of the same name meanwhile, that one
    /// is the answer and `mine` is deleted; otherwise `mine`.
    pub(super) async fn yield_to_an_older_twin(
        &self,
        block: &BlockStorage,
        name: &str,
        mine: Volume,
        deadline: Instant,
    ) -> DriverResult<Volume> {
        wait_past_created_second(mine.created_at.as_deref(), mine.read_at).await;
        let named: Vec<Volume> = block
            .volumes_named(name)
            .await
            .context(format!("looking up volumes named {name}"))?
            .into_iter()
            .filter(|v| !volume_gone(&v.status) && self.made_here(v))
            .collect();
        let Some(keep) = keeper(&named).filter(|k| k.id != mine.id).cloned() else {
            return Ok(mine);
        };
        not_found_ok(block.delete_volume(&mine.id).await).context(format!(
            "deleting volume {}, a twin of {}",
            mine.id, keep.id
        ))?;
        tracing::warn!(volume_id = %mine.id, kept = %keep.id, name, "another replica made this volume first: ours deleted, theirs answered");
        self.wait_volume_available(block, &keep.id, deadline).await
    }
}
