//! Snapshots: create (idempotent by name; ready_to_use tells the
//! snapshotter when Manila is done), delete (gone before the answer),
//! list (by id, by source, paginated).

use std::time::{Duration, Instant};

use csi_common::errors::{at_most_one, created, unless_left_behind};
use csi_common::paging::{offset_from_token, offset_token, page_limit};
use csi_common::request::{GIB, is_uuid, require, timestamp};
use csi_common::waits::{delete_and_wait_gone, wait_until};
use csi_common::{Context, DriverError, DriverResult};
use openstack_client::common::Poll;
use openstack_client::manila::{ListPage, ShareSnapshot, ShareSnapshotStatus};
use proto::csi::v1 as csi;

use super::ControllerService;
use super::share_types::{share_type, spec_true};
use crate::errors::failure_from_messages;
use crate::shares::DESCRIPTION;
use csi_common::parameters::is_snapshot_metadata_key;

/// ListSnapshots page size when the caller sets no limit.
/// How long CreateSnapshot waits for the common fast case before it
/// answers `ready_to_use: false` and lets the snapshotter poll.
const READY_WAIT: Duration = Duration::from_secs(30);

fn csi_snapshot(s: &ShareSnapshot) -> csi::Snapshot {
    csi::Snapshot {
        size_bytes: (s.size as i64).saturating_mul(GIB),
        snapshot_id: s.id.clone(),
        source_volume_id: s.share_id.clone(),
        creation_time: timestamp(s.created_at.as_deref()),
        ready_to_use: s.status == ShareSnapshotStatus::Available,
        group_snapshot_id: String::new(),
    }
}

/// The name is a snapshot's of another volume.
fn taken_name(s: &ShareSnapshot, name: &str, source: &str) -> DriverError {
    DriverError::AlreadyExists(format!(
        "snapshot {} named {name} exists for volume {}, not {source}",
        s.id, s.share_id
    ))
}

fn failed(s: &ShareSnapshotStatus) -> bool {
    s.as_str().contains("error")
}

impl ControllerService {
    pub(super) async fn create_snapshot(
        &self,
        r: csi::CreateSnapshotRequest,
        deadline: Instant,
    ) -> DriverResult<csi::CreateSnapshotResponse> {
        let name = require(&r.name, "name")?.to_string();
        let source = require(&r.source_volume_id, "source_volume_id")?.to_string();
        let ignored: Vec<&String> = r
            .parameters
            .keys()
            .filter(|k| !is_snapshot_metadata_key(k))
            .collect();
        if !ignored.is_empty() {
            // upstream ignores VolumeSnapshotClass parameters too
            tracing::info!(keys = ?ignored, "VolumeSnapshotClass parameters are not used by this driver");
        }
        if !is_uuid(&source) {
            return Err(DriverError::NotFound(format!(
                "volume {source} does not exist"
            )));
        }
        let manila = self.manila(&r.secrets)?.with_deadline(deadline);
        let _guard = self
            .locks
            .lock(&format!("snapshot/{name}"), deadline)
            .await?;
        let existing: Vec<ShareSnapshot> = manila
            .list_snapshots_named(&name)
            .await
            .context(format!("looking up snapshots named {name}"))?
            .into_iter()
            .filter(|s| s.status != ShareSnapshotStatus::Deleting)
            .collect();
        let existing = self.settle_snapshot_twins(&manila, &name, existing).await?;
        let mut created_here = false;
        let snap = match at_most_one(existing, "snapshots", &name, |s| &s.id)? {
            Some(s) if s.share_id != source => return Err(taken_name(&s, &name, &source)),
            Some(s) if failed(&s.status) => {
                let messages = manila.list_user_messages(&s.id).await.unwrap_or_default();
                return Err(unless_left_behind(
                    failure_from_messages(
                        &format!(
                            "snapshot {} of volume {source} (deleted; a retry creates it anew)",
                            s.id
                        ),
                        &messages,
                    ),
                    manila.delete_snapshot(&s.id).await,
                    &format!("failed snapshot {}", s.id),
                ));
            }
            Some(s) => s,
            None => {
                let share = manila
                    .get_share(&source)
                    .await
                    .context(format!("volume {source}"))?;
                let type_ref = share
                    .share_type
                    .clone()
                    .or(share.share_type_name.clone())
                    .unwrap_or_default();
                let t = share_type(&manila, &type_ref).await?;
                if !spec_true(&t, "snapshot_support") {
                    return Err(DriverError::FailedPrecondition(format!(
                        "volume {source} has share type {:?}, which does not support snapshots (snapshot_support)",
                        t.name
                    )));
                }
                created_here = true;
                created(
                    manila
                        .create_snapshot(&source, &name, Some(DESCRIPTION))
                        .await,
                    "Manila",
                    &format!("a snapshot of volume {source}"),
                    &format!("creating snapshot {name} of volume {source}"),
                )?
            }
        };
        let wait = deadline.min(Instant::now() + READY_WAIT);
        let id = snap.id.clone();
        let settled = wait_until(
            "share_snapshot_wait",
            wait,
            |s| format!("snapshot {id} is still {s}"),
            || async {
                let s = manila.get_snapshot(&id).await?;
                Ok(match &s.status {
                    ShareSnapshotStatus::Available => Poll::Ready(s),
                    st if failed(st) => Poll::Ready(s),
                    st => Poll::Pending(st.to_string()),
                })
            },
        )
        .await;
        let snap = match settled {
            Ok(s) if failed(&s.status) => {
                let messages = manila.list_user_messages(&s.id).await.unwrap_or_default();
                return Err(unless_left_behind(
                    failure_from_messages(
                        &format!("snapshot {} of volume {source} (deleted)", s.id),
                        &messages,
                    ),
                    manila.delete_snapshot(&s.id).await,
                    &format!("failed snapshot {}", s.id),
                ));
            }
            Ok(s) if created_here => {
                let kept = self.yield_to_an_older_snapshot(&manila, &name, s).await?;
                if kept.share_id != source {
                    return Err(taken_name(&kept, &name, &source));
                }
                kept
            }
            Ok(s) => s,
            // still creating: ready_to_use false, the snapshotter polls
            // (a twin made meanwhile is settled by the next call)
            Err(DriverError::DeadlineExceeded(_)) => snap,
            Err(e) => return Err(e),
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
        if let Some((gs, member)) = super::groups::parse_member(id) {
            let manila = self.manila(&r.secrets)?.with_deadline(deadline);
            self.refuse_member_deletion(&manila, gs, member).await?;
            return Ok(csi::DeleteSnapshotResponse {});
        }
        if !is_uuid(id) {
            return Ok(csi::DeleteSnapshotResponse {});
        }
        let manila = self.manila(&r.secrets)?.with_deadline(deadline);
        let _guard = self.locks.lock(id, deadline).await?;
        let under_way = match manila.get_snapshot(id).await {
            Err(e) if e.is_not_found() => return Ok(csi::DeleteSnapshotResponse {}),
            Err(e) => return Err(e).context(format!("snapshot {id}")),
            Ok(s) if s.status == ShareSnapshotStatus::Deleting => true,
            Ok(s) => {
                // never from under the volumes that read it
                self.refuse_while_backing(&manila, &s.share_id, Some(id))
                    .await?;
                false
            }
        };
        delete_and_wait_gone(
            "share_snapshot_delete",
            deadline,
            "Manila",
            &format!("snapshot {id}"),
            under_way,
            manila.delete_snapshot(id),
            || manila.get_snapshot(id),
            |s| s.status.to_string(),
        )
        .await?;
        Ok(csi::DeleteSnapshotResponse {})
    }

    pub(super) async fn get_snapshot(
        &self,
        r: csi::GetSnapshotRequest,
        deadline: Instant,
    ) -> DriverResult<csi::GetSnapshotResponse> {
        let id = require(&r.snapshot_id, "snapshot_id")?;
        let gone = || DriverError::NotFound(format!("snapshot {id} does not exist"));
        if let Some((gs, member)) = super::groups::parse_member(id) {
            let manila = self.manila_or_own(&r.secrets)?.with_deadline(deadline);
            return Ok(csi::GetSnapshotResponse {
                snapshot: Some(self.member_snapshot(&manila, gs, member).await?),
            });
        }
        if !is_uuid(id) {
            return Err(gone());
        }
        let manila = self.manila_or_own(&r.secrets)?.with_deadline(deadline);
        match manila.get_snapshot(id).await {
            Ok(s) if s.status == ShareSnapshotStatus::Deleting => Err(gone()),
            Ok(s) => Ok(csi::GetSnapshotResponse {
                snapshot: Some(csi_snapshot(&s)),
            }),
            Err(e) if e.is_not_found() => Err(gone()),
            Err(e) => Err(e).context(format!("snapshot {id}")),
        }
    }

    pub(super) async fn list_snapshots(
        &self,
        r: csi::ListSnapshotsRequest,
        deadline: Instant,
    ) -> DriverResult<csi::ListSnapshotsResponse> {
        let limit = page_limit(r.max_entries)?;
        let offset = offset_from_token(&r.starting_token)?;
        let manila = self.manila_or_own(&r.secrets)?.with_deadline(deadline);
        let entry = |s: &ShareSnapshot| csi::list_snapshots_response::Entry {
            snapshot: Some(csi_snapshot(s)),
        };
        let listed =
            |s: &ShareSnapshot| !failed(&s.status) && s.status != ShareSnapshotStatus::Deleting;
        if !r.snapshot_id.is_empty() {
            if !is_uuid(&r.snapshot_id) {
                return Ok(csi::ListSnapshotsResponse::default());
            }
            return match manila.get_snapshot(&r.snapshot_id).await {
                Ok(s)
                    if listed(&s)
                        && (r.source_volume_id.is_empty() || s.share_id == r.source_volume_id) =>
                {
                    Ok(csi::ListSnapshotsResponse {
                        entries: vec![entry(&s)],
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
        let page = manila
            .list_snapshots(&ListPage {
                limit: Some(limit),
                offset,
                share_id: Some(r.source_volume_id.clone()).filter(|s| !s.is_empty()),
                ..Default::default()
            })
            .await
            .context("listing snapshots")?;
        let next_token = if page.len() as u32 == limit {
            offset_token(offset + page.len() as u64)
        } else {
            String::new()
        };
        Ok(csi::ListSnapshotsResponse {
            entries: page.iter().filter(|s| listed(s)).map(entry).collect(),
            next_token,
        })
    }
}
