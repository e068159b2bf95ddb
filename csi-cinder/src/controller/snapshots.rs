//! Snapshots: create (idempotent by name), delete, list.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use csi_common::request::{GIB, is_uuid, require, timestamp};
use csi_common::{Context, DriverError, DriverResult};
use openstack_client::cinder::{CreateSnapshot, ListSnapshots, Snapshot, SnapshotStatus};
use openstack_client::common::{Poll, poll_until};
use proto::csi::v1 as csi;

use super::*;

impl ControllerService {
    // ----------------------------------------------------------- snapshots

    pub(super) async fn create_snapshot(
        &self,
        r: csi::CreateSnapshotRequest,
        deadline: Instant,
    ) -> DriverResult<csi::CreateSnapshotResponse> {
        let name = require(&r.name, "name")?;
        let source = require(&r.source_volume_id, "source_volume_id")?;
        let cloud = self.cloud(&r.secrets)?;
        let mut force = false;
        let mut metadata = BTreeMap::new();
        for (k, v) in &r.parameters {
            match k.as_str() {
                "force-create" => {
                    force = v.parse::<bool>().map_err(|_| {
                        DriverError::InvalidArgument(format!(
                            "force-create must be true or false, not {v:?}"
                        ))
                    })?;
                }
                "type" if v.is_empty() || v == "snapshot" => {}
                "type" => {
                    return Err(DriverError::InvalidArgument(format!(
                        "snapshot type {v:?} is not supported by this driver (only \"snapshot\")"
                    )));
                }
                SNAPSHOT_NAME | SNAPSHOT_NAMESPACE | SNAPSHOT_CONTENT_NAME => {
                    metadata.insert(k.clone(), v.clone());
                }
                other => {
                    return Err(DriverError::InvalidArgument(format!(
                        "unknown VolumeSnapshotClass parameter {other:?} (known: force-create, type)"
                    )));
                }
            }
        }
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
        let existing = block
            .list_snapshots(&ListSnapshots {
                name: Some(name.to_string()),
                ..Default::default()
            })
            .await
            .context(format!("looking up snapshots named {name}"))?
            .items
            .into_iter()
            .filter(|s| s.name == name && s.status != SnapshotStatus::Deleting)
            .collect::<Vec<_>>();
        let snap = match existing.as_slice() {
            [s] if s.volume_id != source => {
                return Err(DriverError::AlreadyExists(format!(
                    "snapshot {} named {name} exists for volume {}, not {source}",
                    s.id, s.volume_id
                )));
            }
            [s] if s.status.is_error() => {
                not_found_ok(block.delete_snapshot(&s.id).await)
                    .context(format!("deleting failed snapshot {}", s.id))?;
                return Err(DriverError::Internal(format!(
                    "snapshot {} of volume {source} failed in Cinder; deleted it, a retry creates it anew",
                    s.id
                )));
            }
            [s] => s.clone(),
            [] => {
                block
                    .get_volume(source)
                    .await
                    .context(format!("volume {source}"))?;
                block
                    .create_snapshot(&CreateSnapshot {
                        volume_id: source.to_string(),
                        name: name.to_string(),
                        description: Some(DESCRIPTION.to_string()),
                        force,
                        metadata,
                    })
                    .await
                    .context(format!("creating snapshot {name} of volume {source}"))?
            }
            many => {
                let ids: Vec<&str> = many.iter().map(|s| s.id.as_str()).collect();
                return Err(DriverError::Internal(format!(
                    "several snapshots are named {name}: {ids:?}"
                )));
            }
        };
        // ready_to_use tells the snapshotter to poll; wait a little for the
        // common fast case, never past the deadline
        let wait_until = deadline.min(Instant::now() + Duration::from_secs(30));
        let snap = match poll_until(
            "snapshot_create",
            wait_until,
            POLL_FIRST,
            POLL_MAX,
            || async {
                let s = block.get_snapshot(&snap.id).await?;
                Ok(match s.status {
                    SnapshotStatus::Available => Poll::Ready(s),
                    ref st if st.is_error() => Poll::Ready(s),
                    ref st => Poll::Pending(st.to_string()),
                })
            },
        )
        .await
        {
            Ok(s) if s.status.is_error() => {
                let _ = block.delete_snapshot(&s.id).await;
                return Err(DriverError::Internal(format!(
                    "Cinder failed snapshot {} of volume {source}; deleted it",
                    s.id
                )));
            }
            Ok(s) => s,
            Err(openstack_client::Error::Timeout { .. }) => snap,
            Err(e) => return Err(e).context(format!("waiting for snapshot {}", snap.id)),
        };
        Ok(csi::CreateSnapshotResponse {
            snapshot: Some(csi_snapshot(&snap)),
        })
    }

    pub(super) async fn delete_snapshot(
        &self,
        r: csi::DeleteSnapshotRequest,
        deadline: Instant,
    ) -> DriverResult<csi::DeleteSnapshotResponse> {
        let id = require(&r.snapshot_id, "snapshot_id")?;
        if !is_uuid(id) {
            return Ok(csi::DeleteSnapshotResponse {});
        }
        let cloud = self.cloud(&r.secrets)?;
        let _guard = self.locks.lock(id, deadline).await?;
        let block = cloud.block.with_deadline(deadline);
        match block.get_snapshot(id).await {
            Err(e) if e.is_not_found() => return Ok(csi::DeleteSnapshotResponse {}),
            Err(e) => return Err(e).context(format!("snapshot {id}")),
            // an earlier call's deletion is under way
            Ok(s) if s.status == SnapshotStatus::Deleting => {
                return Ok(csi::DeleteSnapshotResponse {});
            }
            Ok(_) => {}
        }
        not_found_ok(block.delete_snapshot(id).await).context(format!("deleting snapshot {id}"))?;
        Ok(csi::DeleteSnapshotResponse {})
    }

    pub(super) async fn list_snapshots(
        &self,
        r: csi::ListSnapshotsRequest,
        deadline: Instant,
    ) -> DriverResult<csi::ListSnapshotsResponse> {
        if r.max_entries < 0 {
            return Err(DriverError::InvalidArgument(
                "max_entries must not be negative".into(),
            ));
        }
        let cloud = self.cloud(&r.secrets)?;
        let block = cloud.block.with_deadline(deadline);
        if !r.snapshot_id.is_empty() {
            if !is_uuid(&r.snapshot_id) {
                return Ok(csi::ListSnapshotsResponse::default());
            }
            return match block.get_snapshot(&r.snapshot_id).await {
                Ok(s) if r.source_volume_id.is_empty() || s.volume_id == r.source_volume_id => {
                    Ok(csi::ListSnapshotsResponse {
                        entries: vec![csi::list_snapshots_response::Entry {
                            snapshot: Some(csi_snapshot(&s)),
                        }],
                        next_token: String::new(),
                    })
                }
                Ok(_) => Ok(csi::ListSnapshotsResponse::default()),
                Err(e) if e.is_not_found() => Ok(csi::ListSnapshotsResponse::default()),
                Err(e) => Err(e).context(format!("snapshot {}", r.snapshot_id)),
            };
        }
        if !r.source_volume_id.is_empty() && !is_uuid(&r.source_volume_id) {
            return Ok(csi::ListSnapshotsResponse::default());
        }
        let marker = if r.starting_token.is_empty() {
            None
        } else if is_uuid(&r.starting_token) {
            Some(r.starting_token.clone())
        } else {
            return Err(DriverError::Aborted(format!(
                "starting_token {:?} is not one this driver issued",
                r.starting_token
            )));
        };
        let limit = if r.max_entries == 0 {
            DEFAULT_PAGE
        } else {
            r.max_entries as u32
        };
        let page = match block
            .list_snapshots(&ListSnapshots {
                name: None,
                volume_id: Some(r.source_volume_id.clone()).filter(|s| !s.is_empty()),
                limit: Some(limit),
                marker: marker.clone(),
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
                .iter()
                .filter(|s| !s.status.is_error() && s.status != SnapshotStatus::Deleting)
                .map(|s| csi::list_snapshots_response::Entry {
                    snapshot: Some(csi_snapshot(s)),
                })
                .collect(),
            next_token: page.next_marker.unwrap_or_default(),
        })
    }
}

pub(super) fn csi_snapshot(s: &Snapshot) -> csi::Snapshot {
    csi::Snapshot {
        size_bytes: (s.size as i64).saturating_mul(GIB),
        snapshot_id: s.id.clone(),
        source_volume_id: s.volume_id.clone(),
        creation_time: timestamp(s.created_at.as_deref()),
        ready_to_use: s.status == SnapshotStatus::Available,
        group_snapshot_id: String::new(),
    }
}
