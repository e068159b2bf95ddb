//! Shares of one name made twice: two controller replicas acting at once
//! (leader election off, or a lease that briefly allows two), each of
//! which looked the name up, found nothing and created one. Every replica
//! settles on the same one, the oldest by Manila's `created_at` (then by
//! id), and the replica that made another deletes its own; a later call
//! deletes whatever a killed replica left. Only shares this driver
//! provisioned are ever settled: duplicates of a name made by anyone else
//! stay an error naming them.

use std::time::Instant;

use csi_common::twins::{rank, wait_past_created_second};
use csi_common::{Context, DriverResult};
use openstack_client::manila::{Share, ShareStatus, SharedFileSystems};

use super::ControllerService;
use crate::shares::{is_gone, provisioned_here, wait_share_available};

/// The share every replica keeps of several of one name.
fn keeper(shares: &[Share]) -> Option<&Share> {
    shares
        .iter()
        .min_by_key(|s| rank(s.created_at.as_deref(), &s.id))
}

fn deleted_ok(r: openstack_client::Result<()>) -> openstack_client::Result<()> {
    match r {
        Err(e) if e.is_not_found() => Ok(()),
        other => other,
    }
}

impl ControllerService {
    /// Of the shares named alike that a lookup found: the one to keep,
    /// alone, once the others (twins this driver made) are deleted where
    /// Manila lets them be (a twin still being created is its maker's to
    /// delete, or the next call's). Anything else is answered as found.
    pub(super) async fn settle_twins(
        &self,
        manila: &SharedFileSystems,
        name: &str,
        found: Vec<Share>,
    ) -> DriverResult<Vec<Share>> {
        if found.len() < 2 || !found.iter().all(provisioned_here) {
            return Ok(found);
        }
        let Some(keep) = keeper(&found).cloned() else {
            return Ok(found);
        };
        for twin in found.iter().filter(|s| s.id != keep.id) {
            if matches!(twin.status, ShareStatus::Available) || twin.status.is_error() {
                deleted_ok(manila.delete_share(&twin.id).await)
                    .context(format!("deleting share {}, a twin of {}", twin.id, keep.id))?;
                tracing::warn!(share_id = %twin.id, kept = %keep.id, name, "a second share of this name, made by another replica at the same time, deleted");
            }
        }
        Ok(vec![keep])
    }

    /// After this call created `mine` and it became available: if another
    /// replica made an older share of the same name meanwhile, that one is
    /// the answer (None: `mine` it is) and `mine` is deleted.
    pub(super) async fn older_twin(
        &self,
        manila: &SharedFileSystems,
        name: &str,
        mine: &Share,
        deadline: Instant,
    ) -> DriverResult<Option<Share>> {
        wait_past_created_second(mine.created_at.as_deref(), mine.read_at).await;
        let named: Vec<Share> = manila
            .list_shares_named(name)
            .await
            .context(format!("looking up shares named {name}"))?
            .into_iter()
            .filter(|s| !is_gone(&s.status) && provisioned_here(s))
            .collect();
        let Some(keep) = keeper(&named).filter(|k| k.id != mine.id).cloned() else {
            return Ok(None);
        };
        deleted_ok(manila.delete_share(&mine.id).await)
            .context(format!("deleting share {}, a twin of {}", mine.id, keep.id))?;
        tracing::warn!(share_id = %mine.id, kept = %keep.id, name, "another replica made this share first: ours deleted, theirs answered");
        wait_share_available(manila, &keep.id, deadline, |_| true)
            .await
            .map(Some)
    }
}
