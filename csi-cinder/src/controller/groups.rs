//! Volume group snapshots (the CSI GroupController) through Cinder's
//! generic volume groups: the volumes join a group named after the group
//! snapshot, Cinder snapshots the group's volumes in one operation (at one
//! instant when the group type asks for `consistent_group_snapshot_enabled`
//! and the backend can), and the volumes leave the group again, so that
//! they are deleted, resized and snapshotted like any other. Each member is
//! a Cinder snapshot, restorable on its own; the group snapshot and its
//! members are deleted together, then the (empty) group.

use std::collections::BTreeSet;
use std::time::Instant;

use csi_common::errors::{Deletion, at_most_one, created, deletion};
use csi_common::request::{is_uuid, require, timestamp};
use csi_common::waits::{wait_gone, wait_until};
use csi_common::{Context, DriverError, DriverResult};
use openstack_client::cinder::{
    BlockStorage, CreateGroup, Group, GroupSnapshot, GroupSnapshotStatus, GroupStatus, Snapshot,
    SnapshotStatus,
};
use openstack_client::common::Poll;
use proto::csi::v1 as csi;
use proto::csi::v1::group_controller_service_capability::rpc::Type as GroupRpc;

use super::snapshots::csi_snapshot;
use super::*;
use crate::parameters::GroupSnapshotParameters;

/// The group type used when the class names none: Cinder ships no usable
/// generic one, operators conventionally create `default`.
pub const DEFAULT_GROUP_TYPE: &str = "default";

fn ids_set(ids: &[String]) -> BTreeSet<&str> {
    ids.iter().map(String::as_str).collect()
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
        let wanted: BTreeSet<&str> = ids_set(&r.source_volume_ids);
        if let Some(bad) = wanted.iter().find(|id| !is_uuid(id)) {
            return Err(DriverError::NotFound(format!(
                "volume {bad} does not exist"
            )));
        }
        let params = GroupSnapshotParameters::parse(&r.parameters)?;
        let cloud = self.cloud(&r.secrets)?;
        let _guard = self
            .locks
            .lock(&format!("group-snapshot/{name}"), deadline)
            .await?;
        let block = cloud.block.with_deadline(deadline);

        // an earlier call's group snapshot
        let existing: Vec<GroupSnapshot> = block
            .group_snapshots_named(name)
            .await
            .context(format!("looking up group snapshots named {name}"))?
            .into_iter()
            .filter(|g| g.status != GroupSnapshotStatus::Deleting)
            .collect();
        let gs = match at_most_one(existing, "group snapshots", name, |g| &g.id)? {
            Some(gs) => {
                let members = block
                    .group_snapshot_members(&gs)
                    .await
                    .context(format!("members of group snapshot {}", gs.id))?;
                let of: BTreeSet<&str> = members.iter().map(|s| s.volume_id.as_str()).collect();
                if of != wanted {
                    return Err(DriverError::AlreadyExists(format!(
                        "group snapshot {} named {name} exists of volumes {of:?}, not {wanted:?}",
                        gs.id
                    )));
                }
                gs
            }
            None => {
                let group = self
                    .group_with(&block, name, &wanted, &params, deadline)
                    .await?;
                let gs = created(
                    block
                        .create_group_snapshot(&group.id, name, Some(DESCRIPTION))
                        .await,
                    "Cinder",
                    &format!("to snapshot volumes {wanted:?} together"),
                    &format!("creating group snapshot {name}"),
                )?;
                tracing::info!(group_snapshot_id = %gs.id, group_id = %group.id, "group snapshot requested");
                gs
            }
        };
        let gs = self.wait_group_snapshot(&block, gs, deadline).await?;
        // the volumes go back to being ordinary volumes
        self.empty_group(&block, &gs.group_id, deadline).await?;
        let members = block
            .group_snapshot_members(&gs)
            .await
            .context(format!("members of group snapshot {}", gs.id))?;
        Ok(csi::CreateVolumeGroupSnapshotResponse {
            group_snapshot: Some(csi_group_snapshot(&gs, &members)),
        })
    }

    /// The group named `name` (this driver's), holding exactly `wanted`.
    async fn group_with(
        &self,
        block: &BlockStorage,
        name: &str,
        wanted: &BTreeSet<&str>,
        params: &GroupSnapshotParameters,
        deadline: Instant,
    ) -> DriverResult<Group> {
        let mut volume_types = BTreeSet::new();
        for id in wanted {
            let v = match block.get_volume(id).await {
                Ok(v) if !volume_gone(&v.status) => v,
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
            let t = v.volume_type.clone().ok_or_else(|| {
                DriverError::FailedPrecondition(format!(
                    "volume {id} has no volume type; Cinder groups only volumes with one"
                ))
            })?;
            volume_types.insert(t);
        }
        let group_type = params
            .group_type
            .clone()
            .unwrap_or_else(|| DEFAULT_GROUP_TYPE.to_string());
        let ours = |g: &Group| {
            g.description.as_deref() == Some(DESCRIPTION) && g.status != GroupStatus::Deleting
        };
        let existing: Vec<Group> = block
            .groups_named(name)
            .await
            .context(format!("looking up groups named {name}"))?
            .into_iter()
            .filter(ours)
            .collect();
        let group = match existing.into_iter().next() {
            Some(g) => g,
            None => match block
                .create_group(&CreateGroup {
                    name: name.to_string(),
                    description: Some(DESCRIPTION.to_string()),
                    group_type: group_type.clone(),
                    volume_types: volume_types.into_iter().collect(),
                    availability_zone: None,
                })
                .await
            {
                Ok(g) => g,
                Err(e) if e.is_not_found() => {
                    return Err(DriverError::FailedPrecondition(format!(
                        "Cinder has no group type {group_type:?}: an operator creates one (openstack volume group type create {group_type}), or the VolumeGroupSnapshotClass names one in groupType ({})",
                        e
                    )));
                }
                Err(openstack_client::Error::BadRequest(e)) => {
                    return Err(DriverError::FailedPrecondition(format!(
                        "Cinder refuses a group of type {group_type:?} for volumes {wanted:?}: {}",
                        e.message
                    )));
                }
                Err(e) => return Err(e).context(format!("creating group {name}")),
            },
        };
        let group = self.wait_group(block, &group.id, deadline).await?;
        let have: BTreeSet<&str> = group.volumes.iter().map(String::as_str).collect();
        let add: Vec<String> = wanted.difference(&have).map(|s| s.to_string()).collect();
        let remove: Vec<String> = have.difference(wanted).map(|s| s.to_string()).collect();
        if add.is_empty() && remove.is_empty() {
            return Ok(group);
        }
        match block.update_group_volumes(&group.id, &add, &remove).await {
            Ok(()) => {}
            Err(openstack_client::Error::BadRequest(e)) => {
                return Err(DriverError::FailedPrecondition(format!(
                    "Cinder cannot group volumes {wanted:?}: {}",
                    e.message
                )));
            }
            Err(e) => return Err(e).context(format!("adding volumes to group {}", group.id)),
        }
        self.wait_group(block, &group.id, deadline).await
    }

    async fn wait_group(
        &self,
        block: &BlockStorage,
        id: &str,
        deadline: Instant,
    ) -> DriverResult<Group> {
        wait_until(
            "group_update",
            deadline,
            |s| format!("group {id} is still {s}"),
            || async {
                let g = block.get_group(id).await?;
                Ok(match g.status {
                    GroupStatus::Available => Poll::Ready(Ok(g)),
                    ref s if s.is_error() => Poll::Ready(Err(s.to_string())),
                    ref s => Poll::Pending(s.to_string()),
                })
            },
        )
        .await?
        .map_err(|s| DriverError::Internal(format!("Cinder's group {id} went to {s}")))
    }

    /// Waits for the group snapshot; one that failed is deleted and the
    /// caller told (a retry makes it anew).
    async fn wait_group_snapshot(
        &self,
        block: &BlockStorage,
        gs: GroupSnapshot,
        deadline: Instant,
    ) -> DriverResult<GroupSnapshot> {
        let id = gs.id.clone();
        let done = wait_until(
            "group_snapshot_create",
            deadline,
            |s| format!("group snapshot {id} is still {s}"),
            || async {
                let g = block.get_group_snapshot(&id).await?;
                Ok(match g.status {
                    GroupSnapshotStatus::Creating => Poll::Pending(g.status.to_string()),
                    _ => Poll::Ready(g),
                })
            },
        )
        .await?;
        if done.status.is_error() {
            let cleanup = match block.delete_group_snapshot(&id).await {
                Ok(()) => "deleted it".to_string(),
                Err(e) => format!("deleting it failed too: {e}"),
            };
            return Err(DriverError::Internal(format!(
                "Cinder could not snapshot group {} (group snapshot {id} is {}); {cleanup}, a retry makes a new one",
                done.group_id, done.status
            )));
        }
        Ok(done)
    }

    /// Takes every volume out of the group (a grouped volume cannot be
    /// deleted).
    async fn empty_group(
        &self,
        block: &BlockStorage,
        group_id: &str,
        deadline: Instant,
    ) -> DriverResult<()> {
        let group = match block.get_group(group_id).await {
            Ok(g) => g,
            Err(e) if e.is_not_found() => return Ok(()),
            Err(e) => return Err(e).context(format!("group {group_id}")),
        };
        if group.volumes.is_empty() {
            return Ok(());
        }
        if group.status != GroupStatus::Available {
            self.wait_group(block, group_id, deadline).await?;
        }
        block
            .update_group_volumes(group_id, &[], &group.volumes)
            .await
            .context(format!("taking the volumes out of group {group_id}"))?;
        self.wait_group(block, group_id, deadline).await.map(drop)
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
        let cloud = self.cloud(&r.secrets)?;
        let _guard = self.locks.lock(id, deadline).await?;
        let block = cloud.block.with_deadline(deadline);
        let gs = match block.get_group_snapshot(id).await {
            Ok(gs) => gs,
            Err(e) if e.is_not_found() => return Ok(csi::DeleteVolumeGroupSnapshotResponse {}),
            Err(e) => return Err(e).context(format!("group snapshot {id}")),
        };
        let members = block
            .group_snapshot_members(&gs)
            .await
            .context(format!("members of group snapshot {id}"))?;
        check_members(id, &members, &r.snapshot_ids)?;
        match gs.status {
            GroupSnapshotStatus::Deleting => {}
            GroupSnapshotStatus::Creating => {
                return Err(DriverError::Unavailable(format!(
                    "group snapshot {id} is still being created; it can be deleted once it is done"
                )));
            }
            _ => {
                let what = format!("group snapshot {id}");
                if deletion(block.delete_group_snapshot(id).await, "Cinder", &what)?
                    == Deletion::Accepted
                {
                    tracing::info!(group_snapshot_id = id, "group snapshot deletion accepted");
                }
            }
        }
        // done means gone, members included: their volumes can be deleted
        wait_gone(
            "group_snapshot_delete",
            deadline,
            &format!("group snapshot {id}"),
            || block.get_group_snapshot(id),
            |g| g.status.to_string(),
        )
        .await?;
        for m in &members {
            wait_gone(
                "snapshot_delete",
                deadline,
                &format!("snapshot {} of group snapshot {id}", m.id),
                || block.get_snapshot(&m.id),
                |s| s.status.to_string(),
            )
            .await?;
        }
        self.drop_group(&block, &gs, deadline).await;
        Ok(csi::DeleteVolumeGroupSnapshotResponse {})
    }

    /// Deletes the group the group snapshot was taken through, if this
    /// driver made it; a failure is logged (an empty group costs nothing).
    async fn drop_group(&self, block: &BlockStorage, gs: &GroupSnapshot, deadline: Instant) {
        let group = match block.get_group(&gs.group_id).await {
            Ok(g) if g.name == gs.name && g.description.as_deref() == Some(DESCRIPTION) => g,
            _ => return,
        };
        if !group.volumes.is_empty()
            && let Err(e) = self.empty_group(block, &group.id, deadline).await
        {
            tracing::warn!(group_id = %group.id, error = %e, "could not empty the group");
            return;
        }
        match block.delete_group(&group.id).await {
            Ok(()) => tracing::info!(group_id = %group.id, "group deletion accepted"),
            Err(e) if e.is_not_found() => {}
            Err(e) => {
                tracing::warn!(group_id = %group.id, error = %e, "could not delete the group")
            }
        }
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
        let cloud = self.cloud(&r.secrets)?;
        let block = cloud.block.with_deadline(deadline);
        let gs = match block.get_group_snapshot(id).await {
            Ok(gs) if gs.status == GroupSnapshotStatus::Deleting => return Err(gone()),
            Ok(gs) => gs,
            Err(e) if e.is_not_found() => return Err(gone()),
            Err(e) => return Err(e).context(format!("group snapshot {id}")),
        };
        let members = block
            .group_snapshot_members(&gs)
            .await
            .context(format!("members of group snapshot {id}"))?;
        check_members(id, &members, &r.snapshot_ids)?;
        Ok(csi::GetVolumeGroupSnapshotResponse {
            group_snapshot: Some(csi_group_snapshot(&gs, &members)),
        })
    }
}

/// The CO's list of member snapshots, when it gives one, must be the
/// group snapshot's (the spec's InvalidArgument for a mismatch).
fn check_members(id: &str, members: &[Snapshot], given: &[String]) -> DriverResult<()> {
    if given.is_empty() {
        return Ok(());
    }
    let have: BTreeSet<&str> = members.iter().map(|s| s.id.as_str()).collect();
    if have != ids_set(given) {
        return Err(DriverError::InvalidArgument(format!(
            "snapshot_ids {given:?} are not the snapshots of group snapshot {id} ({have:?})"
        )));
    }
    Ok(())
}

fn csi_group_snapshot(gs: &GroupSnapshot, members: &[Snapshot]) -> csi::VolumeGroupSnapshot {
    csi::VolumeGroupSnapshot {
        group_snapshot_id: gs.id.clone(),
        snapshots: members.iter().map(csi_snapshot).collect(),
        creation_time: timestamp(gs.created_at.as_deref()),
        ready_to_use: gs.status == GroupSnapshotStatus::Available
            && members
                .iter()
                .all(|s| s.status == SnapshotStatus::Available),
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
