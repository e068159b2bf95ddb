//! Where a new share's content comes from: a snapshot, a member of a
//! group snapshot, or another share (cloned through a temporary snapshot
//! that goes once the clone no longer needs it).

use std::time::Instant;

use csi_common::errors::not_found_ok;
use csi_common::request::{is_uuid, require};
use csi_common::waits::wait_until;
use csi_common::{Context, DriverError, DriverResult};
use openstack_client::common::Poll;
use openstack_client::manila::{
    ShareSnapshot, ShareSnapshotStatus, ShareStatus, SharedFileSystems,
};
use proto::csi::v1 as csi;

use super::ControllerService;
use super::share_types::{check_snapshot_capable, share_type};
use crate::shares::{CLONE_SNAPSHOT_DESCRIPTION, clone_snapshot_name};

/// Where a new share's content comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Source {
    Empty,
    Snapshot(String),
    /// A member of a group snapshot: `(group snapshot, member)`.
    Member(String, String),
    /// A clone of another share (through a temporary snapshot).
    Share(String),
}

pub(super) fn source_of(r: &csi::CreateVolumeRequest) -> DriverResult<Source> {
    use csi::volume_content_source::Type;
    Ok(
        match r
            .volume_content_source
            .as_ref()
            .and_then(|s| s.r#type.as_ref())
        {
            None => Source::Empty,
            Some(Type::Snapshot(s)) => {
                let id = require(&s.snapshot_id, "volume_content_source.snapshot.snapshot_id")?;
                match super::groups::parse_member(id) {
                    Some((g, m)) => Source::Member(g.to_string(), m.to_string()),
                    None => Source::Snapshot(id.to_string()),
                }
            }
            Some(Type::Volume(v)) => Source::Share(
                require(&v.volume_id, "volume_content_source.volume.volume_id")?.to_string(),
            ),
        },
    )
}

impl ControllerService {
    pub(super) async fn usable_snapshot(
        &self,
        manila: &SharedFileSystems,
        id: &str,
    ) -> DriverResult<ShareSnapshot> {
        if !is_uuid(id) {
            return Err(DriverError::NotFound(format!(
                "snapshot {id} does not exist"
            )));
        }
        let s = manila
            .get_snapshot(id)
            .await
            .context(format!("snapshot {id}"))?;
        if s.status != ShareSnapshotStatus::Available {
            return Err(DriverError::Unavailable(format!(
                "snapshot {id} is {}, not available",
                s.status
            )));
        }
        Ok(s)
    }

    /// The temporary snapshot a clone is made from (found again by name
    /// on a retry), available.
    pub(super) async fn clone_snapshot(
        &self,
        manila: &SharedFileSystems,
        name: &str,
        source_id: &str,
        deadline: Instant,
    ) -> DriverResult<ShareSnapshot> {
        if !is_uuid(source_id) {
            return Err(DriverError::NotFound(format!(
                "volume {source_id} does not exist"
            )));
        }
        let src = manila
            .get_share(source_id)
            .await
            .context(format!("source volume {source_id}"))?;
        if !src
            .share_proto
            .eq_ignore_ascii_case(self.opts.protocol.as_manila())
        {
            return Err(DriverError::InvalidArgument(format!(
                "source volume {source_id} is a {} share; this instance serves {}",
                src.share_proto, self.opts.protocol
            )));
        }
        if src.status != ShareStatus::Available {
            return Err(DriverError::Unavailable(format!(
                "source volume {source_id} is {}, not available",
                src.status
            )));
        }
        let type_ref = src
            .share_type
            .clone()
            .or(src.share_type_name.clone())
            .unwrap_or_default();
        let t = share_type(manila, &type_ref).await?;
        check_snapshot_capable(&t, "a clone")?;
        let snap_name = clone_snapshot_name(name);
        let existing = manila
            .list_snapshots_named(&snap_name)
            .await
            .context(format!("looking up snapshot {snap_name}"))?
            .into_iter()
            .find(|s| s.share_id == source_id && s.status != ShareSnapshotStatus::Deleting);
        let snap = match existing {
            Some(s) => s,
            None => manila
                .create_snapshot(source_id, &snap_name, Some(CLONE_SNAPSHOT_DESCRIPTION))
                .await
                .context(format!("snapshotting volume {source_id} to clone it"))?,
        };
        let id = snap.id.clone();
        let r = wait_until(
            "share_snapshot_wait",
            deadline,
            |s| format!("snapshot {id} of clone source {source_id} is still {s}"),
            || async {
                let s = manila.get_snapshot(&id).await?;
                Ok(match &s.status {
                    ShareSnapshotStatus::Available => Poll::Ready(Ok(s)),
                    st if st.as_str().contains("error") => Poll::Ready(Err(s)),
                    st => Poll::Pending(st.to_string()),
                })
            },
        )
        .await?;
        r.map_err(|s| {
            let _ = &s;
            DriverError::Internal(format!(
                "Manila failed the snapshot {} a clone of {source_id} is made from ({})",
                s.id, s.status
            ))
        })
    }

    /// Deletes a clone's temporary snapshot once the clone no longer needs
    /// it; if Manila refuses now, DeleteVolume of the clone tries again.
    pub(super) async fn drop_clone_snapshot(&self, manila: &SharedFileSystems, name: &str) {
        let snap_name = clone_snapshot_name(name);
        match manila.list_snapshots_named(&snap_name).await {
            Ok(snaps) => {
                for s in snaps
                    .into_iter()
                    .filter(|s| s.status != ShareSnapshotStatus::Deleting)
                {
                    match not_found_ok(manila.delete_snapshot(&s.id).await) {
                        Ok(()) => {
                            tracing::info!(snapshot_id = %s.id, "temporary clone snapshot deleted")
                        }
                        Err(e) => {
                            tracing::warn!(snapshot_id = %s.id, error = %e, "temporary clone snapshot kept for now")
                        }
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot look up the temporary clone snapshot"),
        }
    }
}
