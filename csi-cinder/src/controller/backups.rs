//! Snapshots of type backup (VolumeSnapshotClass `type: backup`), as
//! upstream makes them: a Cinder snapshot of the volume, a backup of that
//! snapshot (so an attached volume is backed up consistently), and the
//! snapshot deleted once the backup is available. The backup's id is the
//! CSI snapshot id; a backup is independent of its volume, which can be
//! deleted while the backup lives.

use std::collections::BTreeMap;
use std::time::Instant;

use csi_common::errors::{Deletion, at_most_one, created, deletion};
use csi_common::waits::wait_until;
use csi_common::{Context, DriverError, DriverResult};
use openstack_client::cinder::{Backup, BackupStatus, BlockStorage, CreateBackup, SnapshotStatus};
use openstack_client::common::Poll;

use super::*;
use crate::parameters::SnapshotParameters;

impl ControllerService {
    /// The backup `name` of `source`: found or made, and waited for within
    /// the deadline and the class's `backup-max-duration-seconds-per-gb`
    /// (one still creating is answered `ready_to_use: false`; the
    /// snapshotter asks again and the wait resumes).
    pub(super) async fn ensure_backup(
        &self,
        block: &BlockStorage,
        name: &str,
        source: &str,
        params: &SnapshotParameters,
        metadata: BTreeMap<String, String>,
        deadline: Instant,
    ) -> DriverResult<Backup> {
        let existing: Vec<Backup> = block
            .backups_named(name, None)
            .await
            .context(format!("looking up backups named {name}"))?
            .into_iter()
            .filter(|b| b.status != BackupStatus::Deleting)
            .collect();
        let backup = match at_most_one(existing, "backups", name, |b| &b.id)? {
            Some(b) if b.volume_id != source => {
                return Err(DriverError::AlreadyExists(format!(
                    "backup {} named {name} exists for volume {}, not {source}",
                    b.id, b.volume_id
                )));
            }
            Some(b) => b,
            None => {
                // the snapshot the backup is made from, named like it
                let snap = self
                    .ensure_snapshot(block, name, source, params, metadata.clone(), deadline)
                    .await?;
                if snap.status != SnapshotStatus::Available {
                    return Err(DriverError::DeadlineExceeded(format!(
                        "snapshot {} to back up volume {source} from is still {}; a retry resumes",
                        snap.id, snap.status
                    )));
                }
                let b = created(
                    block
                        .create_backup(&CreateBackup {
                            volume_id: source.to_string(),
                            name: name.to_string(),
                            description: Some(DESCRIPTION.to_string()),
                            snapshot_id: Some(snap.id.clone()),
                            force: params.force,
                            availability_zone: params.availability.clone(),
                            metadata,
                        })
                        .await,
                    "Cinder",
                    &format!("to back up volume {source}"),
                    &format!("creating backup {name} of volume {source}"),
                )?;
                tracing::info!(backup_id = %b.id, snapshot_id = %snap.id, "backup requested");
                b
            }
        };
        let id = backup.id.clone();
        // checked: a class's budget may be far past what an Instant holds
        let until = Instant::now()
            .checked_add(params.backup_timeout(backup.size))
            .map_or(deadline, |u| deadline.min(u));
        let waited = wait_until(
            "backup_create",
            until,
            |s| format!("backup {id} is still {s}"),
            || async {
                let b = block.get_backup(&id).await?;
                Ok(match b.status {
                    BackupStatus::Creating => Poll::Pending(b.status.to_string()),
                    _ => Poll::Ready(b),
                })
            },
        )
        .await;
        let b = match waited {
            Ok(b) => b,
            Err(DriverError::DeadlineExceeded(_)) => return Ok(backup),
            Err(e) => return Err(e),
        };
        if b.status.is_error() {
            let reason = b.fail_reason.clone().unwrap_or_default();
            let cleanup = match block.delete_backup(&b.id).await {
                Ok(()) => "deleted it".to_string(),
                Err(e) => format!("deleting it failed too: {e}"),
            };
            self.drop_backup_source(block, &b).await;
            return Err(DriverError::Internal(format!(
                "Cinder could not back up volume {source} (backup {}: {reason}); {cleanup}, a retry makes a new one",
                b.id
            )));
        }
        if b.status == BackupStatus::Available {
            self.drop_backup_source(block, &b).await;
        }
        Ok(b)
    }

    /// Deletes the snapshot a backup was made from, if this driver made it
    /// for the backup (same name, our description). A failure is logged:
    /// the snapshot is left behind, never the backup.
    async fn drop_backup_source(&self, block: &BlockStorage, b: &Backup) {
        let Some(sid) = b.snapshot_id.as_deref().filter(|s| !s.is_empty()) else {
            return;
        };
        match block.get_snapshot(sid).await {
            Ok(s)
                if s.name == b.name
                    && s.description.as_deref() == Some(DESCRIPTION)
                    && s.status != SnapshotStatus::Deleting =>
            {
                match block.delete_snapshot(sid).await {
                    Ok(()) => {
                        tracing::info!(backup_id = %b.id, snapshot_id = sid, "deleted the snapshot the backup was made from")
                    }
                    Err(e) if e.is_not_found() => {}
                    Err(e) => {
                        tracing::warn!(backup_id = %b.id, snapshot_id = sid, error = %e, "could not delete the snapshot the backup was made from")
                    }
                }
            }
            Ok(_) => {}
            Err(e) if e.is_not_found() => {}
            Err(e) => {
                tracing::warn!(backup_id = %b.id, snapshot_id = sid, error = %e, "could not look up the snapshot the backup was made from")
            }
        }
    }

    /// Deletes a backup (and the snapshot it was made from, if left) and
    /// waits until it is gone.
    pub(super) async fn delete_backup(
        &self,
        block: &BlockStorage,
        b: Backup,
        deadline: Instant,
    ) -> DriverResult<()> {
        let id = b.id.clone();
        match b.status {
            BackupStatus::Creating | BackupStatus::Restoring => {
                return Err(DriverError::Unavailable(format!(
                    "backup {id} is {}; Cinder deletes it once that is done, a retry will",
                    b.status
                )));
            }
            BackupStatus::Deleting => {}
            _ => {
                if deletion(
                    block.delete_backup(&id).await,
                    "Cinder",
                    &format!("backup {id}"),
                )? == Deletion::Gone
                {
                    return Ok(());
                }
                tracing::info!(backup_id = %id, "backup deletion accepted");
            }
        }
        self.drop_backup_source(block, &b).await;
        wait_until(
            "backup_delete",
            deadline,
            |s| format!("backup {id} is still {s}"),
            || async {
                Ok(match block.get_backup(&id).await {
                    Err(e) if e.is_not_found() => Poll::Ready(Ok(())),
                    Err(e) => return Err(e),
                    Ok(b) if b.status == BackupStatus::ErrorDeleting => Poll::Ready(Err(())),
                    Ok(b) => Poll::Pending(b.status.to_string()),
                })
            },
        )
        .await?
        .map_err(|()| {
            DriverError::Internal(format!(
                "Cinder could not delete backup {id} (error_deleting); it needs an operator"
            ))
        })
    }
}
