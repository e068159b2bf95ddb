//! Snapshots: create (idempotent by name), delete (gone before the
//! answer), get and list. A CSI snapshot is a Cinder snapshot, or, with
//! `type: backup` in the VolumeSnapshotClass, a Cinder backup
//! ([`super::backups`]); every call that takes a snapshot id accepts both.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use csi_common::errors::{at_most_one, created, remove_left, unless_left_behind};
use csi_common::paging::{marker_from_token, page_limit};
use csi_common::request::{GIB, is_uuid, require, timestamp};
use csi_common::waits::{delete_and_wait_gone, wait_until};
use csi_common::{Context, DriverError, DriverResult};
use openstack_client::cinder::{
    Backup, BackupStatus, BlockStorage, CreateSnapshot, ListSnapshots, Snapshot, SnapshotStatus,
    VolumeStatus,
};
use openstack_client::common::Poll;
use proto::csi::v1 as csi;

use super::*;
use crate::parameters::{SnapshotKind, SnapshotParameters};

/// How long CreateSnapshot waits for a Cinder snapshot before answering
/// `ready_to_use: false` (the snapshotter then polls).
const SNAPSHOT_WAIT: Duration = Duration::from_secs(30);

/// The name is a snapshot's of another volume.
fn taken_name(s: &Snapshot, name: &str, source: &str) -> DriverError {
    DriverError::AlreadyExists(format!(
        "snapshot {} named {name} exists for volume {}, not {source}",
        s.id, s.volume_id
    ))
}

/// What a snapshot id names.
pub(super) enum Found {
    Snapshot(Snapshot),
    Backup(Backup),
}

impl ControllerService {
    pub(super) async fn create_snapshot(
        &self,
        r: csi::CreateSnapshotRequest,
        deadline: Instant,
    ) -> DriverResult<csi::CreateSnapshotResponse> {
        let name = require(&r.name, "name")?;
        let source = require(&r.source_volume_id, "source_volume_id")?;
        let params = SnapshotParameters::parse(&r.parameters)?;
        let cloud = self.cloud(&r.secrets)?;
        let mut metadata = params.metadata.clone();
        if !self.opts.cluster.is_empty() {
            metadata.insert(CLUSTER_KEY.to_string(), self.opts.cluster.clone());
        }
        if !is_uuid(source) {
            return Err(DriverError::NotFound(format!(
                "volume {source} does not exist"
            )));
        }
        let _guard = self
            .locks
            .lock(&format!("snapshot/{name}"), deadline)
            .await?;
        let block = cloud.block.with_deadline(deadline);
        let snapshot = match params.kind {
            SnapshotKind::Snapshot => {
                let s = self
                    .ensure_snapshot(&block, name, source, &params, metadata, deadline)
                    .await?;
                csi_snapshot(&s)
            }
            SnapshotKind::Backup => {
                let b = self
                    .ensure_backup(&block, name, source, &params, metadata, deadline)
                    .await?;
                csi_backup(&b)
            }
        };
        Ok(csi::CreateSnapshotResponse {
            snapshot: Some(snapshot),
        })
    }

    /// The Cinder snapshot `name` of `source`: found or created, and
    /// waited for (a little: `ready_to_use` tells the snapshotter to poll).
    pub(super) async fn ensure_snapshot(
        &self,
        block: &BlockStorage,
        name: &str,
        source: &str,
        params: &SnapshotParameters,
        metadata: BTreeMap<String, String>,
        deadline: Instant,
    ) -> DriverResult<Snapshot> {
        let existing = block
            .snapshots_named(name)
            .await
            .context(format!("looking up snapshots named {name}"))?
            .into_iter()
            .filter(|s| s.status != SnapshotStatus::Deleting)
            .collect::<Vec<_>>();
        let existing = self.settle_snapshot_twins(block, name, existing).await?;
        let mut created_here = false;
        let snap = match at_most_one(existing, "snapshots", name, |s| &s.id)? {
            Some(s) if s.volume_id != source => return Err(taken_name(&s, name, source)),
            Some(s) if s.status.is_error() => {
                remove_left(
                    block.delete_snapshot(&s.id).await,
                    &format!("snapshot {}", s.id),
                )?;
                return Err(DriverError::Internal(format!(
                    "snapshot {} of volume {source} failed in Cinder; deleted it, a retry creates it anew",
                    s.id
                )));
            }
            Some(s) => s,
            None => {
                let v = block
                    .get_volume(source)
                    .await
                    .context(format!("volume {source}"))?;
                if v.status == VolumeStatus::InUse && !params.force {
                    return Err(DriverError::FailedPrecondition(format!(
                        "volume {source} is in use (attached to {:?}); Cinder snapshots an attached volume only when asked: set force-create: \"true\" in the VolumeSnapshotClass's parameters, or detach the volume",
                        v.attached_servers().collect::<Vec<_>>()
                    )));
                }
                created_here = true;
                created(
                    block
                        .create_snapshot(&CreateSnapshot {
                            volume_id: source.to_string(),
                            name: name.to_string(),
                            description: Some(DESCRIPTION.to_string()),
                            force: params.force,
                            metadata,
                        })
                        .await,
                    "Cinder",
                    &format!("to snapshot volume {source}"),
                    &format!("creating snapshot {name} of volume {source}"),
                )?
            }
        };
        let id = snap.id.clone();
        let waited = wait_until(
            "snapshot_create",
            deadline.min(Instant::now() + SNAPSHOT_WAIT),
            |s| format!("snapshot {id} is still {s}"),
            || async {
                let s = block.get_snapshot(&id).await?;
                Ok(match s.status {
                    SnapshotStatus::Available => Poll::Ready(s),
                    ref st if st.is_error() => Poll::Ready(s),
                    ref st => Poll::Pending(st.to_string()),
                })
            },
        )
        .await;
        match waited {
            Ok(s) if s.status.is_error() => Err(unless_left_behind(
                DriverError::Internal(format!(
                    "Cinder failed snapshot {} of volume {source}; it is deleted",
                    s.id
                )),
                block.delete_snapshot(&s.id).await,
                &format!("failed snapshot {}", s.id),
            )),
            Ok(s) if created_here => {
                let kept = self.yield_to_an_older_snapshot(block, name, s).await?;
                if kept.volume_id != source {
                    return Err(taken_name(&kept, name, source));
                }
                Ok(kept)
            }
            Ok(s) => Ok(s),
            // a twin made meanwhile is settled by the next call
            Err(DriverError::DeadlineExceeded(_)) => Ok(snap),
            Err(e) => Err(e),
        }
    }

    /// A snapshot id: a Cinder snapshot's, else a backup's, else `None`.
    pub(super) async fn find_snapshot(
        &self,
        block: &BlockStorage,
        id: &str,
    ) -> DriverResult<Option<Found>> {
        if !is_uuid(id) {
            return Ok(None);
        }
        match block.get_snapshot(id).await {
            Ok(s) => return Ok(Some(Found::Snapshot(s))),
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e).context(format!("snapshot {id}")),
        }
        match block.get_backup(id).await {
            Ok(b) => Ok(Some(Found::Backup(b))),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e).context(format!("backup {id}")),
        }
    }

    pub(super) async fn delete_snapshot(
        &self,
        r: csi::DeleteSnapshotRequest,
        deadline: Instant,
    ) -> DriverResult<csi::DeleteSnapshotResponse> {
        let id = require(&r.snapshot_id, "snapshot_id")?;
        let cloud = self.cloud(&r.secrets)?;
        let _guard = self.locks.lock(id, deadline).await?;
        let block = cloud.block.with_deadline(deadline);
        match self.find_snapshot(&block, id).await? {
            None => {}
            Some(Found::Backup(b)) => self.delete_backup(&block, b, deadline).await?,
            Some(Found::Snapshot(s)) => {
                delete_and_wait_gone(
                    "snapshot_delete",
                    deadline,
                    "Cinder",
                    &format!("snapshot {id}"),
                    s.status == SnapshotStatus::Deleting,
                    block.delete_snapshot(id),
                    || block.get_snapshot(id),
                    |s| s.status.to_string(),
                )
                .await?;
            }
        }
        Ok(csi::DeleteSnapshotResponse {})
    }

    pub(super) async fn get_snapshot(
        &self,
        r: csi::GetSnapshotRequest,
        deadline: Instant,
    ) -> DriverResult<csi::GetSnapshotResponse> {
        let id = require(&r.snapshot_id, "snapshot_id")?;
        let cloud = self.cloud(&r.secrets)?;
        let block = cloud.block.with_deadline(deadline);
        match self.find_snapshot(&block, id).await?.and_then(listed) {
            Some(snapshot) => Ok(csi::GetSnapshotResponse {
                snapshot: Some(snapshot),
            }),
            None => Err(DriverError::NotFound(format!(
                "snapshot {id} does not exist"
            ))),
        }
    }

    pub(super) async fn list_snapshots(
        &self,
        r: csi::ListSnapshotsRequest,
        deadline: Instant,
    ) -> DriverResult<csi::ListSnapshotsResponse> {
        let limit = page_limit(r.max_entries)?;
        let cloud = self.cloud(&r.secrets)?;
        let block = cloud.block.with_deadline(deadline);
        if !r.snapshot_id.is_empty() {
            let entries = self
                .find_snapshot(&block, &r.snapshot_id)
                .await?
                .and_then(listed)
                .filter(|s| {
                    r.source_volume_id.is_empty() || s.source_volume_id == r.source_volume_id
                })
                .map(|s| csi::list_snapshots_response::Entry { snapshot: Some(s) })
                .into_iter()
                .collect();
            return Ok(csi::ListSnapshotsResponse {
                entries,
                next_token: String::new(),
            });
        }
        if !r.source_volume_id.is_empty() && !is_uuid(&r.source_volume_id) {
            return Ok(csi::ListSnapshotsResponse::default());
        }
        let marker = marker_from_token(&r.starting_token)?;
        let page = match block
            .list_snapshots(&ListSnapshots {
                name: None,
                volume_id: Some(r.source_volume_id.clone()).filter(|s| !s.is_empty()),
                limit: Some(limit),
                marker: marker.clone(),
                ..Default::default()
            })
            .await
        {
            Ok(p) => p,
            Err(openstack_client::Error::BadRequest(e))
            | Err(openstack_client::Error::NotFound(e))
                if marker.is_some() =>
            {
                return Err(DriverError::Aborted(format!(
                    "starting_token is no longer valid: {}",
                    e.message
                )));
            }
            Err(e) => return Err(e).context("listing snapshots"),
        };
        Ok(csi::ListSnapshotsResponse {
            entries: page
                .items
                .into_iter()
                .filter_map(|s| listed(Found::Snapshot(s)))
                .map(|s| csi::list_snapshots_response::Entry { snapshot: Some(s) })
                .collect(),
            next_token: page.next_marker.unwrap_or_default(),
        })
    }
}

/// What a caller still sees: failed and departing snapshots are not
/// listed.
fn listed(found: Found) -> Option<csi::Snapshot> {
    match found {
        Found::Snapshot(s) if s.status.is_error() || s.status == SnapshotStatus::Deleting => None,
        Found::Snapshot(s) => Some(csi_snapshot(&s)),
        Found::Backup(b) if b.status.is_error() || b.status == BackupStatus::Deleting => None,
        Found::Backup(b) => Some(csi_backup(&b)),
    }
}

pub(super) fn csi_snapshot(s: &Snapshot) -> csi::Snapshot {
    csi::Snapshot {
        size_bytes: (s.size as i64).saturating_mul(GIB),
        snapshot_id: s.id.clone(),
        source_volume_id: s.volume_id.clone(),
        creation_time: timestamp(s.created_at.as_deref()),
        ready_to_use: s.status == SnapshotStatus::Available,
        group_snapshot_id: s.group_snapshot_id.clone().unwrap_or_default(),
    }
}

pub(super) fn csi_backup(b: &Backup) -> csi::Snapshot {
    csi::Snapshot {
        size_bytes: (b.size as i64).saturating_mul(GIB),
        snapshot_id: b.id.clone(),
        source_volume_id: b.volume_id.clone(),
        creation_time: timestamp(b.created_at.as_deref()),
        ready_to_use: b.status == BackupStatus::Available,
        group_snapshot_id: String::new(),
    }
}
