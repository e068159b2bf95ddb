//! Shares and snapshots of one name made twice: two controller replicas
//! acting at once (leader election off, or a lease that briefly allows
//! two), each of which looked the name up, found nothing and created one.
//! Every replica settles on the same one, the oldest by Manila's
//! `created_at` (then by id), and the replica that made another deletes
//! its own; a later call deletes whatever a killed replica left. Only what
//! this driver provisioned is ever settled: duplicates of a name made by
//! anyone else stay an error naming them.

use std::time::Instant;

use csi_common::errors::not_found_ok;
use csi_common::twins::{TwinView, keeper, settle, wait_past_created_second};
use csi_common::{Context, DriverResult};
use openstack_client::manila::{
    Share, ShareSnapshot, ShareSnapshotStatus, ShareStatus, SharedFileSystems,
};

use super::ControllerService;
use crate::shares::{DESCRIPTION, is_gone, provisioned_here, wait_share_available};

fn share_view(s: &Share) -> TwinView {
    TwinView {
        id: s.id.clone(),
        created_at: s.created_at.clone(),
        made_here: provisioned_here(s),
        deletable: matches!(s.status, ShareStatus::Available) || s.status.is_error(),
    }
}

fn snapshot_view(s: &ShareSnapshot) -> TwinView {
    TwinView {
        id: s.id.clone(),
        created_at: s.created_at.clone(),
        made_here: s.description.as_deref() == Some(DESCRIPTION),
        deletable: matches!(s.status, ShareSnapshotStatus::Available)
            || s.status.as_str().contains("error"),
    }
}

impl ControllerService {
    /// Shares named alike, settled (see [`settle`]).
    pub(super) async fn settle_twins(
        &self,
        manila: &SharedFileSystems,
        name: &str,
        found: Vec<Share>,
    ) -> DriverResult<Vec<Share>> {
        settle("share", name, found, share_view, |id| async move {
            manila.delete_share(&id).await
        })
        .await
    }

    /// Snapshots named alike, settled (see [`settle`]).
    pub(super) async fn settle_snapshot_twins(
        &self,
        manila: &SharedFileSystems,
        name: &str,
        found: Vec<ShareSnapshot>,
    ) -> DriverResult<Vec<ShareSnapshot>> {
        settle("snapshot", name, found, snapshot_view, |id| async move {
            manila.delete_snapshot(&id).await
        })
        .await
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
        let Some(keep) = keeper(&named, share_view)
            .filter(|k| k.id != mine.id)
            .cloned()
        else {
            return Ok(None);
        };
        not_found_ok(manila.delete_share_of(mine).await)
            .context(format!("deleting share {}, a twin of {}", mine.id, keep.id))?;
        tracing::warn!(share_id = %mine.id, kept = %keep.id, name, "another replica made this share first: ours deleted, theirs answered");
        wait_share_available(manila, &keep.id, deadline, |_| true)
            .await
            .map(Some)
    }

    /// The same for a snapshot this call created and saw available: the
    /// older twin is the answer (as it is: `ready_to_use` tells the
    /// snapshotter whether to poll), and `mine` is deleted.
    pub(super) async fn yield_to_an_older_snapshot(
        &self,
        manila: &SharedFileSystems,
        name: &str,
        mine: ShareSnapshot,
    ) -> DriverResult<ShareSnapshot> {
        wait_past_created_second(mine.created_at.as_deref(), mine.read_at).await;
        let named: Vec<ShareSnapshot> = manila
            .list_snapshots_named(name)
            .await
            .context(format!("looking up snapshots named {name}"))?
            .into_iter()
            .filter(|s| s.status != ShareSnapshotStatus::Deleting && snapshot_view(s).made_here)
            .collect();
        let Some(keep) = keeper(&named, snapshot_view)
            .filter(|k| k.id != mine.id)
            .cloned()
        else {
            return Ok(mine);
        };
        not_found_ok(manila.delete_snapshot(&mine.id).await).context(format!(
            "deleting snapshot {}, a twin of {}",
            mine.id, keep.id
        ))?;
        tracing::warn!(snapshot_id = %mine.id, kept = %keep.id, name, "another replica made this snapshot first: ours deleted, theirs answered");
        Ok(keep)
    }
}
