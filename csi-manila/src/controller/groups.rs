//! Volume group snapshots (the CSI GroupController) through Manila's share
//! groups and share group snapshots.
//!
//! Manila places a share in a group only when it creates it (a class's
//! `groupID`), and snapshots a group whole: a group snapshot is asked for
//! exactly the shares of one share group. Its members are not share
//! snapshots, so a member's snapshot id is `<group snapshot>/<member>`,
//! and its data comes back only through a new share group made from the
//! group snapshot (one new share per member). A restore takes the unnamed
//! share of its member from such a group this driver made (a "restore
//! group"), or makes the group first: restoring every member of a group
//! snapshot clones each once, into one group again. Shares no restore
//! took are deleted with the group snapshot; a restore group is deleted
//! once its last share is.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use csi_common::errors::{Deletion, at_most_one, created, deletion};
use csi_common::request::{GIB, is_uuid, require, timestamp};
use csi_common::waits::{wait_gone, wait_until};
use csi_common::{Context, DriverError, DriverResult};
use openstack_client::common::Poll;
use openstack_client::manila::{
    CreateShareGroup, Share, ShareGroup, ShareGroupSnapshot, ShareGroupSnapshotStatus,
    ShareGroupStatus, ShareStatus, SharedFileSystems,
};
use proto::csi::v1 as csi;
use proto::csi::v1::group_controller_service_capability::rpc::Type as GroupRpc;

use super::ControllerService;
use crate::shares::{DESCRIPTION, is_gone, wait_share_available};

/// The snapshot id of one member of a group snapshot.
pub fn member_snapshot_id(group_snapshot: &str, member: &str) -> String {
    format!("{group_snapshot}/{member}")
}

/// `(group snapshot, member)` of a member's snapshot id.
pub fn parse_member(id: &str) -> Option<(&str, &str)> {
    let (g, m) = id.split_once('/')?;
    (is_uuid(g) && is_uuid(m)).then_some((g, m))
}

/// The name of the share groups this driver makes from group snapshot
/// `gs` to restore its members.
fn restore_group_name(gs: &str) -> String {
    format!("csi-restore-{gs}")
}

/// A restore group of this driver's, made from `gs`.
fn is_restore_group(g: &ShareGroup, gs: &str) -> bool {
    g.description.as_deref() == Some(DESCRIPTION)
        && g.source_share_group_snapshot_id.as_deref() == Some(gs)
        && g.name == restore_group_name(gs)
}

/// A restored share no restore has taken yet: Manila made it from a
/// member (a share put in the group by hand has no member) and left it
/// unnamed.
fn untaken(s: &Share) -> bool {
    s.name.is_empty() && s.source_share_group_snapshot_member_id.is_some() && !is_gone(&s.status)
}

fn ids_set(ids: &[String]) -> BTreeSet<&str> {
    ids.iter().map(String::as_str).collect()
}

fn csi_group_snapshot(gs: &ShareGroupSnapshot) -> csi::VolumeGroupSnapshot {
    let ready = gs.status == ShareGroupSnapshotStatus::Available;
    let created = timestamp(gs.created_at.as_deref());
    csi::VolumeGroupSnapshot {
        group_snapshot_id: gs.id.clone(),
        snapshots: gs
            .members
            .iter()
            .map(|m| csi::Snapshot {
                size_bytes: (m.size as i64).saturating_mul(GIB),
                snapshot_id: member_snapshot_id(&gs.id, &m.id),
                source_volume_id: m.share_id.clone(),
                creation_time: created,
                ready_to_use: ready,
                group_snapshot_id: gs.id.clone(),
            })
            .collect(),
        creation_time: created,
        ready_to_use: ready,
    }
}

/// The CO's list of member snapshots, when it gives one, must be the
/// group snapshot's (the spec's InvalidArgument for a mismatch).
fn check_members(gs: &ShareGroupSnapshot, given: &[String]) -> DriverResult<()> {
    if given.is_empty() {
        return Ok(());
    }
    let have: BTreeSet<String> = gs
        .members
        .iter()
        .map(|m| member_snapshot_id(&gs.id, &m.id))
        .collect();
    let given: BTreeSet<String> = given.iter().cloned().collect();
    if have != given {
        return Err(DriverError::InvalidArgument(format!(
            "snapshot_ids {given:?} are not the snapshots of group snapshot {} ({have:?})",
            gs.id
        )));
    }
    Ok(())
}

impl ControllerService {
    pub fn group_capabilities() -> Vec<csi::GroupControllerServiceCapability> {
        csi_common::advertise::group_controller(&[GroupRpc::CreateDeleteGetVolumeGroupSnapshot])
    }

    pub(super) async fn create_group_snapshot(
        &self,
        r: csi::CreateVolumeGroupSnapshotRequest,
        deadline: Instant,
    ) -> DriverResult<csi::CreateVolumeGroupSnapshotResponse> {
        let name = require(&r.name, "name")?;
        if r.source_volume_ids.is_empty() {
            return Err(DriverError::InvalidArgument(
                "source_volume_ids is required".into(),
            ));
        }
        let unknown: Vec<&String> = r
            .parameters
            .keys()
            .filter(|k| !k.starts_with("csi.storage.k8s.io/"))
            .collect();
        if !unknown.is_empty() {
            return Err(DriverError::InvalidArgument(format!(
                "VolumeGroupSnapshotClass parameters {unknown:?} are not known to this driver (it takes none: the share group is the claims' StorageClass groupID)"
            )));
        }
        let wanted = ids_set(&r.source_volume_ids);
        if let Some(bad) = wanted.iter().find(|id| !is_uuid(id)) {
            return Err(DriverError::NotFound(format!(
                "volume {bad} does not exist"
            )));
        }
        let manila = self.manila(&r.secrets)?.with_deadline(deadline);
        let _guard = self
            .locks
            .lock(&format!("group-snapshot/{name}"), deadline)
            .await?;
        let existing: Vec<ShareGroupSnapshot> = manila
            .share_group_snapshots_named(name)
            .await
            .context(format!("looking up share group snapshots named {name}"))?
            .into_iter()
            .filter(|g| g.status != ShareGroupSnapshotStatus::Deleting)
            .collect();
        let gs = match at_most_one(existing, "share group snapshots", name, |g| &g.id)? {
            Some(gs) => {
                let of: BTreeSet<&str> = gs.members.iter().map(|m| m.share_id.as_str()).collect();
                if of != wanted {
                    return Err(DriverError::AlreadyExists(format!(
                        "group snapshot {} named {name} exists of volumes {of:?}, not {wanted:?}",
                        gs.id
                    )));
                }
                gs
            }
            None => {
                let group = self.group_of(&manila, &wanted).await?;
                let gs = created(
                    manila
                        .create_share_group_snapshot(&group, name, Some(DESCRIPTION))
                        .await,
                    "Manila",
                    &format!("to snapshot share group {group}"),
                    &format!("creating share group snapshot {name}"),
                )?;
                tracing::info!(group_snapshot_id = %gs.id, share_group_id = %group, "share group snapshot requested");
                gs
            }
        };
        let gs = self.wait_group_snapshot(&manila, gs, deadline).await?;
        Ok(csi::CreateVolumeGroupSnapshotResponse {
            group_snapshot: Some(csi_group_snapshot(&gs)),
        })
    }

    /// The share group holding exactly the shares `wanted`: Manila
    /// snapshots a group whole, so anything else is refused, naming why.
    async fn group_of(
        &self,
        manila: &SharedFileSystems,
        wanted: &BTreeSet<&str>,
    ) -> DriverResult<String> {
        let mut groups = BTreeMap::<String, Vec<&str>>::new();
        for id in wanted {
            let s = match manila.get_share(id).await {
                Ok(s) if !is_gone(&s.status) => s,
                Ok(_) => {
                    return Err(DriverError::NotFound(format!(
                        "volume {id} is being deleted"
                    )));
                }
                Err(e) if e.is_not_found() => {
                    return Err(DriverError::NotFound(format!("volume {id} does not exist")));
                }
                Err(e) => return Err(e).context(format!("volume {id}")),
            };
            let g = s.share_group_id.clone().ok_or_else(|| {
                DriverError::FailedPrecondition(format!(
                    "volume {id} is in no share group: Manila snapshots share groups, and places a share in one only when it is created (a StorageClass with groupID)"
                ))
            })?;
            groups.entry(g).or_default().push(id);
        }
        if groups.len() > 1 {
            return Err(DriverError::FailedPrecondition(format!(
                "the volumes are in different share groups ({groups:?}); a group snapshot takes the shares of one"
            )));
        }
        let Some((group, _)) = groups.into_iter().next() else {
            return Err(DriverError::InvalidArgument(
                "source_volume_ids is required".into(),
            ));
        };
        let held: BTreeSet<String> = manila
            .shares_in_group(&group)
            .await
            .context(format!("shares of share group {group}"))?
            .into_iter()
            .filter(|s| !is_gone(&s.status))
            .map(|s| s.id)
            .collect();
        let held: BTreeSet<&str> = held.iter().map(String::as_str).collect();
        if &held != wanted {
            let extra: Vec<&&str> = held.difference(wanted).collect();
            return Err(DriverError::FailedPrecondition(format!(
                "share group {group} also holds {extra:?}: Manila snapshots every share of a group, so a group snapshot asks for all of them"
            )));
        }
        Ok(group)
    }

    /// Waits for the group snapshot; one that failed is deleted and the
    /// caller told (a retry makes it anew).
    async fn wait_group_snapshot(
        &self,
        manila: &SharedFileSystems,
        gs: ShareGroupSnapshot,
        deadline: Instant,
    ) -> DriverResult<ShareGroupSnapshot> {
        let id = gs.id.clone();
        let done = wait_until(
            "share_group_snapshot_create",
            deadline,
            |s| format!("share group snapshot {id} is still {s}"),
            || async {
                let g = manila.get_share_group_snapshot(&id).await?;
                Ok(match g.status {
                    ShareGroupSnapshotStatus::Creating => Poll::Pending(g.status.to_string()),
                    _ => Poll::Ready(g),
                })
            },
        )
        .await?;
        if done.status.is_error() {
            let cleanup = match manila.delete_share_group_snapshot(&id).await {
                Ok(()) => "deleted it".to_string(),
                Err(e) => format!("deleting it failed too: {e}"),
            };
            // Manila records no user message for it: its share service's
            // log says why (its CephFS driver, for one, cannot snapshot a
            // share in a share group)
            return Err(DriverError::Internal(format!(
                "Manila could not snapshot share group {} (share group snapshot {id} is {}; Manila gives no reason, its share service's log does); {cleanup}, a retry makes a new one",
                done.share_group_id, done.status
            )));
        }
        Ok(done)
    }

    pub(super) async fn get_group_snapshot(
        &self,
        r: csi::GetVolumeGroupSnapshotRequest,
        deadline: Instant,
    ) -> DriverResult<csi::GetVolumeGroupSnapshotResponse> {
        let id = require(&r.group_snapshot_id, "group_snapshot_id")?;
        let gone = || DriverError::NotFound(format!("group snapshot {id} does not exist"));
        if !is_uuid(id) {
            return Err(gone());
        }
        let manila = self.manila_or_own(&r.secrets)?.with_deadline(deadline);
        let gs = match manila.get_share_group_snapshot(id).await {
            Ok(gs) if gs.status == ShareGroupSnapshotStatus::Deleting => return Err(gone()),
            Ok(gs) => gs,
            Err(e) if e.is_not_found() => return Err(gone()),
            Err(e) => return Err(e).context(format!("share group snapshot {id}")),
        };
        check_members(&gs, &r.snapshot_ids)?;
        Ok(csi::GetVolumeGroupSnapshotResponse {
            group_snapshot: Some(csi_group_snapshot(&gs)),
        })
    }

    pub(super) async fn delete_group_snapshot(
        &self,
        r: csi::DeleteVolumeGroupSnapshotRequest,
        deadline: Instant,
    ) -> DriverResult<csi::DeleteVolumeGroupSnapshotResponse> {
        let id = require(&r.group_snapshot_id, "group_snapshot_id")?;
        if !is_uuid(id) {
            return Ok(csi::DeleteVolumeGroupSnapshotResponse {});
        }
        let manila = self.manila(&r.secrets)?.with_deadline(deadline);
        let _guard = self
            .locks
            .lock(&format!("group-restore/{id}"), deadline)
            .await?;
        let gs = match manila.get_share_group_snapshot(id).await {
            Ok(gs) => gs,
            Err(e) if e.is_not_found() => return Ok(csi::DeleteVolumeGroupSnapshotResponse {}),
            Err(e) => return Err(e).context(format!("share group snapshot {id}")),
        };
        check_members(&gs, &r.snapshot_ids)?;
        match gs.status {
            ShareGroupSnapshotStatus::Deleting => {}
            ShareGroupSnapshotStatus::Creating => {
                return Err(DriverError::Unavailable(format!(
                    "group snapshot {id} is still being created; it can be deleted once it is done"
                )));
            }
            _ => {
                // what no restore took goes with it
                self.drop_untaken(&manila, id, deadline).await?;
                let what = format!("share group snapshot {id}");
                if deletion(
                    manila.delete_share_group_snapshot(id).await,
                    "Manila",
                    &what,
                )? == Deletion::Accepted
                {
                    tracing::info!(
                        group_snapshot_id = id,
                        "share group snapshot deletion accepted"
                    );
                }
            }
        }
        wait_gone(
            "share_group_snapshot_delete",
            deadline,
            &format!("share group snapshot {id}"),
            || manila.get_share_group_snapshot(id),
            |g| g.status.to_string(),
        )
        .await?;
        Ok(csi::DeleteVolumeGroupSnapshotResponse {})
    }

    /// Deletes the shares of `gs`'s restore groups that no restore took,
    /// then every such group left empty.
    async fn drop_untaken(
        &self,
        manila: &SharedFileSystems,
        gs: &str,
        deadline: Instant,
    ) -> DriverResult<()> {
        let groups: Vec<ShareGroup> = manila
            .share_groups_from(gs)
            .await
            .context(format!("share groups made from group snapshot {gs}"))?
            .into_iter()
            .filter(|g| is_restore_group(g, gs))
            .collect();
        for g in groups {
            if g.status == ShareGroupStatus::Creating {
                self.wait_group(manila, &g.id, deadline).await?;
            }
            let shares = manila
                .shares_in_group(&g.id)
                .await
                .context(format!("shares of share group {}", g.id))?;
            for s in shares.iter().filter(|s| untaken(s)) {
                let what = format!("untaken restored share {}", s.id);
                if s.status != ShareStatus::Available && !s.status.is_error() {
                    wait_share_available(manila, &s.id, deadline, |_| true).await?;
                }
                deletion(
                    manila.delete_share_in(&s.id, Some(&g.id)).await,
                    "Manila",
                    &what,
                )?;
                wait_gone(
                    "share_delete",
                    deadline,
                    &what,
                    || manila.get_share(&s.id),
                    |s| s.status.to_string(),
                )
                .await?;
            }
            self.drop_restore_group_if_empty(manila, &g.id).await;
        }
        Ok(())
    }

    /// Deletes restore group `group_id` once it holds no share; a failure
    /// is logged (an empty group costs nothing, the next deletion retries).
    pub(super) async fn drop_restore_group_if_empty(
        &self,
        manila: &SharedFileSystems,
        group_id: &str,
    ) {
        let g = match manila.get_share_group(group_id).await {
            Ok(g) => g,
            Err(_) => return,
        };
        let Some(gs) = g.source_share_group_snapshot_id.clone() else {
            return;
        };
        if !is_restore_group(&g, &gs) || g.status == ShareGroupStatus::Deleting {
            return;
        }
        match manila.shares_in_group(group_id).await {
            Ok(s) if s.is_empty() => {}
            _ => return,
        }
        match manila.delete_share_group(group_id).await {
            Ok(()) => tracing::info!(
                share_group_id = group_id,
                "empty restore group deletion accepted"
            ),
            Err(e) if e.is_not_found() => {}
            Err(e) => {
                tracing::warn!(share_group_id = group_id, error = %e, "could not delete the empty restore group")
            }
        }
    }

    async fn wait_group(
        &self,
        manila: &SharedFileSystems,
        id: &str,
        deadline: Instant,
    ) -> DriverResult<ShareGroup> {
        wait_until(
            "share_group_create",
            deadline,
            |s| format!("share group {id} is still {s}"),
            || async {
                let g = manila.get_share_group(id).await?;
                Ok(match g.status {
                    ShareGroupStatus::Available => Poll::Ready(Ok(g)),
                    ref s if s.is_error() => Poll::Ready(Err(s.to_string())),
                    ref s => Poll::Pending(s.to_string()),
                })
            },
        )
        .await?
        .map_err(|s| DriverError::Internal(format!("Manila's share group {id} went to {s}")))
    }

    /// The share restored from member `member` of group snapshot `gs`,
    /// taken for volume `name` (named so, its metadata what `metadata_for`
    /// gives for the member's size, which may refuse it), available. A
    /// retry finds it by name before it gets here.
    pub(super) async fn restore_member(
        &self,
        manila: &SharedFileSystems,
        name: &str,
        gs_id: &str,
        member: &str,
        metadata_for: impl FnOnce(i64) -> DriverResult<BTreeMap<String, String>>,
        deadline: Instant,
    ) -> DriverResult<Share> {
        let snapshot_id = member_snapshot_id(gs_id, member);
        let gone = || DriverError::NotFound(format!("snapshot {snapshot_id} does not exist"));
        let _guard = self
            .locks
            .lock(&format!("group-restore/{gs_id}"), deadline)
            .await?;
        let gs = match manila.get_share_group_snapshot(gs_id).await {
            Ok(gs) if gs.status == ShareGroupSnapshotStatus::Deleting => return Err(gone()),
            Ok(gs) => gs,
            Err(e) if e.is_not_found() => return Err(gone()),
            Err(e) => return Err(e).context(format!("share group snapshot {gs_id}")),
        };
        let Some(taken) = gs.members.iter().find(|m| m.id == member) else {
            return Err(gone());
        };
        let metadata = metadata_for(taken.size as i64)?;
        if gs.status != ShareGroupSnapshotStatus::Available {
            return Err(DriverError::Unavailable(format!(
                "group snapshot {gs_id} is {}, not available",
                gs.status
            )));
        }
        let share = match self.untaken_share(manila, gs_id, member, deadline).await? {
            Some(s) => s,
            None => {
                // the snapshotted group's type, which holds its share types
                // (Manila's default group type, used otherwise, may not)
                let from = manila
                    .get_share_group(&gs.share_group_id)
                    .await
                    .context(format!(
                        "share group {} of group snapshot {gs_id}",
                        gs.share_group_id
                    ))?;
                let group = created(
                    manila
                        .create_share_group(&CreateShareGroup {
                            name: restore_group_name(gs_id),
                            description: Some(DESCRIPTION.into()),
                            source_share_group_snapshot_id: Some(gs_id.to_string()),
                            share_group_type_id: from.share_group_type_id,
                            ..Default::default()
                        })
                        .await,
                    "Manila",
                    &format!("a share group made from group snapshot {gs_id}"),
                    &format!("restoring group snapshot {gs_id}"),
                )?;
                tracing::info!(share_group_id = %group.id, group_snapshot_id = gs_id, "restore group requested");
                if let Err(e) = self.wait_group(manila, &group.id, deadline).await {
                    if !matches!(e, DriverError::DeadlineExceeded(_)) {
                        self.drop_failed_restore(manila, &group.id, deadline).await;
                    }
                    return Err(e);
                }
                self.untaken_share(manila, gs_id, member, deadline)
                    .await?
                    .ok_or_else(|| {
                        DriverError::Internal(format!(
                            "Manila made share group {} from group snapshot {gs_id} without a share of member {member}",
                            group.id
                        ))
                    })?
            }
        };
        let share = wait_share_available(manila, &share.id, deadline, |_| true).await?;
        manila
            .update_share_metadata(&share.id, &metadata)
            .await
            .context(format!("marking restored share {} as ours", share.id))?;
        // the name last: a named share is a taken one (the description
        // says it is this driver's, as for a share it creates)
        manila
            .rename_share(&share.id, name, DESCRIPTION)
            .await
            .context(format!("naming restored share {} {name}", share.id))?;
        tracing::info!(share_id = %share.id, group_snapshot_id = gs_id, member, "restored share taken");
        manila
            .get_share(&share.id)
            .await
            .context(format!("restored share {}", share.id))
    }

    /// An untaken share of `member` in one of `gs`'s restore groups.
    async fn untaken_share(
        &self,
        manila: &SharedFileSystems,
        gs: &str,
        member: &str,
        deadline: Instant,
    ) -> DriverResult<Option<Share>> {
        let groups = manila
            .share_groups_from(gs)
            .await
            .context(format!("share groups made from group snapshot {gs}"))?;
        for g in groups.iter().filter(|g| is_restore_group(g, gs)) {
            match g.status {
                ShareGroupStatus::Available => {}
                ShareGroupStatus::Creating => {
                    self.wait_group(manila, &g.id, deadline).await?;
                }
                _ => continue,
            }
            let found = manila
                .shares_in_group(&g.id)
                .await
                .context(format!("shares of share group {}", g.id))?
                .into_iter()
                .find(|s| {
                    untaken(s)
                        && !s.status.is_error()
                        && s.source_share_group_snapshot_member_id.as_deref() == Some(member)
                });
            if found.is_some() {
                return Ok(found);
            }
        }
        Ok(None)
    }

    /// A restore group Manila failed: its shares and itself are deleted
    /// (best effort, logged).
    async fn drop_failed_restore(
        &self,
        manila: &SharedFileSystems,
        group: &str,
        deadline: Instant,
    ) {
        let shares = manila.shares_in_group(group).await.unwrap_or_default();
        for s in shares {
            let _ = manila.delete_share_in(&s.id, Some(group)).await;
            let _ = wait_gone(
                "share_delete",
                deadline,
                &format!("share {} of failed restore group {group}", s.id),
                || manila.get_share(&s.id),
                |s| s.status.to_string(),
            )
            .await;
        }
        if let Err(e) = manila.delete_share_group(group).await {
            tracing::warn!(share_group_id = group, error = %e, "could not delete a failed restore group");
        }
    }

    /// DeleteSnapshot of a group snapshot's member: Manila deletes members
    /// only with their group snapshot.
    pub(super) async fn refuse_member_deletion(
        &self,
        manila: &SharedFileSystems,
        gs: &str,
        member: &str,
    ) -> DriverResult<()> {
        match manila.get_share_group_snapshot(gs).await {
            Err(e) if e.is_not_found() => Ok(()),
            Err(e) => Err(e).context(format!("share group snapshot {gs}")),
            Ok(g) if g.status == ShareGroupSnapshotStatus::Deleting => Ok(()),
            Ok(g) if !g.members.iter().any(|m| m.id == member) => Ok(()),
            Ok(_) => Err(DriverError::FailedPrecondition(format!(
                "snapshot {gs}/{member} is a member of group snapshot {gs}: Manila deletes it only with the group snapshot (delete the VolumeGroupSnapshot)"
            ))),
        }
    }

    /// GetSnapshot of a group snapshot's member.
    pub(super) async fn member_snapshot(
        &self,
        manila: &SharedFileSystems,
        gs: &str,
        member: &str,
    ) -> DriverResult<csi::Snapshot> {
        let id = member_snapshot_id(gs, member);
        let gone = || DriverError::NotFound(format!("snapshot {id} does not exist"));
        let g = match manila.get_share_group_snapshot(gs).await {
            Ok(g) if g.status == ShareGroupSnapshotStatus::Deleting => return Err(gone()),
            Ok(g) => g,
            Err(e) if e.is_not_found() => return Err(gone()),
            Err(e) => return Err(e).context(format!("share group snapshot {gs}")),
        };
        csi_group_snapshot(&g)
            .snapshots
            .into_iter()
            .find(|s| s.snapshot_id == id)
            .ok_or_else(gone)
    }
}

csi_common::csi_service! {
    impl proto::csi::v1::group_controller_server::GroupController => ControllerService {
        rpc create_volume_group_snapshot(CreateVolumeGroupSnapshotRequest) -> CreateVolumeGroupSnapshotResponse
            = "CreateVolumeGroupSnapshot", group_snapshot_name = |r| r.name.clone() => create_group_snapshot;
        rpc delete_volume_group_snapshot(DeleteVolumeGroupSnapshotRequest) -> DeleteVolumeGroupSnapshotResponse
            = "DeleteVolumeGroupSnapshot", group_snapshot_id = |r| r.group_snapshot_id.clone() => delete_group_snapshot;
        rpc get_volume_group_snapshot(GetVolumeGroupSnapshotRequest) -> GetVolumeGroupSnapshotResponse
            = "GetVolumeGroupSnapshot", group_snapshot_id = |r| r.group_snapshot_id.clone() => get_group_snapshot;
        verbatim {
            async fn group_controller_get_capabilities(
                &self,
                _req: tonic::Request<csi::GroupControllerGetCapabilitiesRequest>,
            ) -> Result<tonic::Response<csi::GroupControllerGetCapabilitiesResponse>, tonic::Status> {
                Ok(tonic::Response::new(csi::GroupControllerGetCapabilitiesResponse {
                    capabilities: Self::group_capabilities(),
                }))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn member_ids_round_trip_and_nothing_else_parses() {
        let g = "0b5c3e62-8a41-4d6f-9c1e-2f7a6b3d9e10";
        let m = "7d2e9f41-3c6b-4a58-8e0d-1b9c5a7f2e63";
        let id = member_snapshot_id(g, m);
        assert_eq!(parse_member(&id), Some((g, m)));
        assert_eq!(parse_member(g), None);
        assert_eq!(parse_member(&format!("{g}/x")), None);
        assert_eq!(parse_member(&format!("{g}/{m}/{m}")), None);
    }
}
