//! Read-only volumes backed by a snapshot (StorageClass parameter
//! `backingSnapshot: "true"`, in the style of ceph-csi's): a claim with a
//! VolumeSnapshot as its data source gets no share of its own and no
//! copy. Its volume is a read-only cephx access rule on the snapshot's
//! share; the node mounts that share with it and publishes the snapshot's
//! own directory (CephFS shows a snapshot of a share's subvolume inside
//! the share as `.snap/_<snapshot id>_<inode>`, read-only by nature).
//!
//! The rule says what it is for in its metadata (Manila 2.45): the
//! snapshot it reads, and the cluster. That is what DeleteSnapshot reads
//! to refuse deleting a snapshot from under its readers, what DeleteVolume
//! of the source share reads to refuse revoking their rules, and what
//! DeleteVolume of a backed volume checks before revoking anything: a
//! handle naming someone else's rule revokes nothing.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use csi_common::request::{Capability, GIB, is_uuid};
use csi_common::waits::{wait_gone, wait_until};
use csi_common::{Context, DriverError, DriverResult};
use openstack_client::common::Poll;
use openstack_client::manila::{
    AccessRule, AccessRuleState, GrantAccess, ShareSnapshotStatus, SharedFileSystems,
};
use proto::csi::v1 as csi;

use super::ControllerService;
use crate::parameters::{BACKING_SNAPSHOT_ATTRIBUTE, ShareParameters, cephx_id};
use crate::share_protocol::ShareProtocol;
use crate::shares::{BACKING_SNAPSHOT_KEY, CLUSTER_KEY, backs_a_volume, readers_of};

/// A backed volume's handle: `snapshot-backed:<snapshot id>:<rule id>`.
const HANDLE_PREFIX: &str = "snapshot-backed:";

/// The snapshot and access rule a backed volume's handle names; `None`
/// for any other handle (a share's id).
pub fn parse_handle(id: &str) -> Option<(&str, &str)> {
    let (snapshot, rule) = id.strip_prefix(HANDLE_PREFIX)?.split_once(':')?;
    (is_uuid(snapshot) && is_uuid(rule)).then_some((snapshot, rule))
}

fn handle(snapshot_id: &str, rule_id: &str) -> String {
    format!("{HANDLE_PREFIX}{snapshot_id}:{rule_id}")
}

impl ControllerService {
    /// CreateVolume of a backed volume: the request is checked, then the
    /// rule granted (or found again: idempotent by name) and waited for.
    pub(super) async fn create_backed_volume(
        &self,
        r: &csi::CreateVolumeRequest,
        name: &str,
        caps: &[Capability],
        params: &ShareParameters,
        snapshot_id: Option<&str>,
        deadline: Instant,
    ) -> DriverResult<csi::CreateVolumeResponse> {
        if self.opts.protocol != ShareProtocol::Cephfs {
            return Err(DriverError::InvalidArgument(format!(
                "backingSnapshot: a volume backed by a snapshot is served for CephFS shares only; this driver does not mount Manila's mountable snapshots of {} shares: leave backingSnapshot unset to restore a writable copy",
                self.opts.protocol
            )));
        }
        let Some(snapshot_id) = snapshot_id else {
            return Err(DriverError::InvalidArgument(
                "backingSnapshot: the volume needs a snapshot as its data source (a claim's dataSource of kind VolumeSnapshot)".into(),
            ));
        };
        if let Some(c) = caps.iter().find(|c| !c.read_only_mode()) {
            return Err(DriverError::InvalidArgument(format!(
                "backingSnapshot: a volume backed by a snapshot is read-only; {:?} asks for writes (ask ReadOnlyMany, or leave backingSnapshot unset to restore a writable copy)",
                c.mode
            )));
        }
        // one cephx id for every volume backed by a share would be one
        // rule for all of them, which deleting any one revokes from the
        // others: each volume's rule is its own, under its name
        if let Some(id) = &params.cephfs_client_id {
            return Err(DriverError::InvalidArgument(format!(
                "backingSnapshot: cephfs-clientID {id:?} would give every volume backed by one share the same read-only rule, and deleting any of them would revoke it from the others; leave cephfs-clientID unset (each such volume gets a cephx id of its own, its name)"
            )));
        }
        let cephx = name;
        if !cephx_id(cephx) || cephx == "admin" {
            return Err(DriverError::InvalidArgument(format!(
                "backingSnapshot: {cephx:?} cannot be a cephx client id (letters, digits, '-', '_' and '.')"
            )));
        }
        if !is_uuid(snapshot_id) {
            return Err(DriverError::NotFound(format!(
                "snapshot {snapshot_id} does not exist"
            )));
        }
        let manila = self.manila(&r.secrets)?.with_deadline(deadline);
        let snapshot = manila
            .get_snapshot(snapshot_id)
            .await
            .context(format!("snapshot {snapshot_id}"))?;
        match snapshot.status {
            ShareSnapshotStatus::Available => {}
            ShareSnapshotStatus::Creating => {
                return Err(DriverError::Unavailable(format!(
                    "snapshot {snapshot_id} is still being made"
                )));
            }
            s => {
                return Err(DriverError::FailedPrecondition(format!(
                    "snapshot {snapshot_id} is {s}, not available"
                )));
            }
        }
        let size = i64::try_from(snapshot.size)
            .unwrap_or(i64::MAX)
            .saturating_mul(GIB);
        if let Some(range) = &r.capacity_range {
            if range.required_bytes > size {
                return Err(DriverError::OutOfRange(format!(
                    "backingSnapshot: snapshot {snapshot_id} holds {} GiB; a volume backed by it cannot be larger ({} bytes asked)",
                    snapshot.size, range.required_bytes
                )));
            }
            if range.limit_bytes > 0 && range.limit_bytes < size {
                return Err(DriverError::OutOfRange(format!(
                    "backingSnapshot: snapshot {snapshot_id} holds {} GiB, more than the limit of {} bytes",
                    snapshot.size, range.limit_bytes
                )));
            }
        }
        let share_id = snapshot.share_id.clone();
        let share = manila
            .get_share(&share_id)
            .await
            .context(format!("share {share_id} of snapshot {snapshot_id}"))?;
        if !share
            .share_proto
            .eq_ignore_ascii_case(ShareProtocol::Cephfs.as_manila())
        {
            return Err(DriverError::InvalidArgument(format!(
                "backingSnapshot: snapshot {snapshot_id} is of a {} share; this driver serves CEPHFS",
                share.share_proto
            )));
        }

        let _guard = self
            .locks
            .lock(&format!("backed/{share_id}/{cephx}"), deadline)
            .await?;
        let rules = manila
            .list_access_rules(&share_id)
            .await
            .context(format!("access rules of share {share_id}"))?;
        let mine =
            |r: &AccessRule| r.access_type.eq_ignore_ascii_case("cephx") && r.access_to == cephx;
        let metadata = BTreeMap::from([
            (BACKING_SNAPSHOT_KEY.to_string(), snapshot_id.to_string()),
            (CLUSTER_KEY.to_string(), self.opts.cluster_id.clone()),
        ]);
        let rule = match rules.iter().find(|r| mine(r)) {
            Some(r)
                if r.access_level == "ro"
                    && r.metadata.get(BACKING_SNAPSHOT_KEY) == Some(&snapshot_id.to_string())
                    && backs_a_volume(r) =>
            {
                tracing::info!(share_id, rule = %r.id, "a backed volume of this name exists; waiting for its rule");
                r.clone()
            }
            Some(r) => {
                return Err(DriverError::AlreadyExists(format!(
                    "share {share_id} already has a cephx rule for {cephx:?} ({}, {}) that is not this volume's (a read-only rule backed by snapshot {snapshot_id})",
                    r.access_level,
                    r.metadata
                        .get(BACKING_SNAPSHOT_KEY)
                        .map_or("no snapshot".to_string(), |s| format!("snapshot {s}"))
                )));
            }
            None => {
                let grant = GrantAccess {
                    access_type: "cephx".into(),
                    access_to: cephx.to_string(),
                    access_level: "ro".into(),
                };
                match manila
                    .grant_access_with_metadata(&share_id, &grant, &metadata)
                    .await
                {
                    Ok(r) => {
                        tracing::info!(share_id, rule = %r.id, snapshot_id, "read-only access granted for a volume backed by a snapshot");
                        r
                    }
                    Err(openstack_client::Error::BadRequest(e)) => {
                        return Err(DriverError::InvalidArgument(format!(
                            "Manila refused a read-only cephx rule for {cephx:?} on share {share_id}: {}",
                            e.message
                        )));
                    }
                    Err(e) => {
                        return Err(e).context(format!("granting read access on share {share_id}"));
                    }
                }
            }
        };
        let rule = self
            .wait_backing_rule(&manila, &share_id, &rule.id, deadline)
            .await?;

        let mut context = HashMap::from([
            ("shareID".to_string(), share_id.clone()),
            ("shareAccessIDs".to_string(), rule.id.clone()),
            (
                BACKING_SNAPSHOT_ATTRIBUTE.to_string(),
                snapshot_id.to_string(),
            ),
        ]);
        params.mount.to_context(&mut context);
        crate::mount_target::context_for_stage(
            &share,
            manila.list_export_locations(&share_id).await,
            self.opts.protocol,
            &mut context,
        );
        Ok(csi::CreateVolumeResponse {
            volume: Some(csi::Volume {
                capacity_bytes: size,
                volume_id: handle(snapshot_id, &rule.id),
                volume_context: context,
                content_source: r.volume_content_source.clone(),
                accessible_topology: self.topology(share.availability_zone.as_deref()),
            }),
        })
    }

    /// The rule active with its key; one Manila could not apply is
    /// revoked (nothing left behind) and the call fails.
    async fn wait_backing_rule(
        &self,
        manila: &SharedFileSystems,
        share_id: &str,
        rule_id: &str,
        deadline: Instant,
    ) -> DriverResult<AccessRule> {
        let rule = wait_until(
            "access_wait",
            deadline,
            |s| format!("read-only access rule {rule_id} of share {share_id} is still {s}"),
            || async {
                let r = manila.get_access_rule(share_id, rule_id).await?;
                Ok(match r.state {
                    AccessRuleState::Error => Poll::Ready(Err(r)),
                    AccessRuleState::Active
                        if r.access_key.as_deref().is_some_and(|k| !k.is_empty()) =>
                    {
                        Poll::Ready(Ok(r))
                    }
                    _ => Poll::Pending(r.state.to_string()),
                })
            },
        )
        .await?;
        match rule {
            Ok(r) => Ok(r),
            Err(r) => {
                if let Err(e) = manila.revoke_access(share_id, &r.id).await
                    && !e.is_not_found()
                {
                    tracing::warn!(share_id, rule = %r.id, error = %e, "cannot revoke the failed rule");
                }
                Err(DriverError::Internal(format!(
                    "Manila could not apply the read-only access rule {} on share {share_id}",
                    r.id
                )))
            }
        }
    }

    /// DeleteVolume of a backed volume: its rule revoked once it is
    /// proven to be one (read-only, naming the handle's snapshot); a rule
    /// already gone is success.
    pub(super) async fn delete_backed_volume(
        &self,
        r: &csi::DeleteVolumeRequest,
        snapshot_id: &str,
        rule_id: &str,
        deadline: Instant,
    ) -> DriverResult<csi::DeleteVolumeResponse> {
        let manila = self.manila(&r.secrets)?.with_deadline(deadline);
        let _guard = self.locks.lock(&r.volume_id, deadline).await?;
        let rule = match manila.access_rule(rule_id).await {
            Ok(rule) => rule,
            Err(e) if e.is_not_found() => return Ok(csi::DeleteVolumeResponse {}),
            Err(e) => return Err(e).context(format!("access rule {rule_id}")),
        };
        if rule.access_level != "ro"
            || rule.metadata.get(BACKING_SNAPSHOT_KEY).map(String::as_str) != Some(snapshot_id)
        {
            return Err(DriverError::FailedPrecondition(format!(
                "access rule {rule_id} is not a read-only rule backed by snapshot {snapshot_id}; it is left in place"
            )));
        }
        // another cluster's reader of the same snapshot: its rule is its own
        if let Some(theirs) = rule.metadata.get(CLUSTER_KEY).filter(|c| {
            !c.is_empty() && !self.opts.cluster_id.is_empty() && **c != self.opts.cluster_id
        }) {
            return Err(DriverError::FailedPrecondition(format!(
                "access rule {rule_id} backs a volume of cluster {theirs:?}, not of this one ({:?}); it is left in place",
                self.opts.cluster_id
            )));
        }
        let share_id = rule.share_id.clone().unwrap_or_default();
        if !matches!(
            rule.state,
            AccessRuleState::QueuedToDeny | AccessRuleState::Denying
        ) {
            match manila.revoke_access(&share_id, rule_id).await {
                Ok(()) => {
                    tracing::info!(
                        share_id,
                        rule = rule_id,
                        snapshot_id,
                        "read-only access revoked"
                    )
                }
                Err(e) if e.is_not_found() => return Ok(csi::DeleteVolumeResponse {}),
                Err(e) => return Err(e).context(format!("revoking access rule {rule_id}")),
            }
        }
        wait_gone(
            "access_revoke",
            deadline,
            &format!("access rule {rule_id}"),
            || manila.get_access_rule(&share_id, rule_id),
            |r| r.state.to_string(),
        )
        .await?;
        Ok(csi::DeleteVolumeResponse {})
    }

    /// A backed volume's rule, proven to be one (read-only, naming the
    /// handle's snapshot), else NotFound: what ValidateVolumeCapabilities
    /// and ControllerGetVolume answer about.
    pub(super) async fn backed_rule(
        &self,
        manila: &SharedFileSystems,
        snapshot_id: &str,
        rule_id: &str,
    ) -> DriverResult<AccessRule> {
        let rule = match manila.access_rule(rule_id).await {
            Ok(r) => r,
            Err(e) if e.is_not_found() => {
                return Err(DriverError::NotFound(format!(
                    "volume backed by snapshot {snapshot_id}: access rule {rule_id} does not exist"
                )));
            }
            Err(e) => return Err(e).context(format!("access rule {rule_id}")),
        };
        if rule.access_level != "ro"
            || rule.metadata.get(BACKING_SNAPSHOT_KEY).map(String::as_str) != Some(snapshot_id)
            || !backs_a_volume(&rule)
        {
            return Err(DriverError::NotFound(format!(
                "access rule {rule_id} is not a volume backed by snapshot {snapshot_id}"
            )));
        }
        Ok(rule)
    }

    /// ControllerGetVolume of a backed volume: its size is the
    /// snapshot's; it is abnormal while its rule is not active.
    pub(super) async fn get_backed_volume(
        &self,
        manila: &SharedFileSystems,
        volume_id: &str,
        snapshot_id: &str,
        rule_id: &str,
    ) -> DriverResult<csi::ControllerGetVolumeResponse> {
        let rule = self.backed_rule(manila, snapshot_id, rule_id).await?;
        let size = match manila.get_snapshot(snapshot_id).await {
            Ok(s) => i64::try_from(s.size)
                .unwrap_or(i64::MAX)
                .saturating_mul(GIB),
            Err(e) if e.is_not_found() => 0,
            Err(e) => return Err(e).context(format!("snapshot {snapshot_id}")),
        };
        let abnormal = rule.state != AccessRuleState::Active;
        Ok(csi::ControllerGetVolumeResponse {
            volume: Some(csi::Volume {
                capacity_bytes: size,
                volume_id: volume_id.to_string(),
                volume_context: HashMap::new(),
                content_source: Some(csi::VolumeContentSource {
                    r#type: Some(csi::volume_content_source::Type::Snapshot(
                        csi::volume_content_source::SnapshotSource {
                            snapshot_id: snapshot_id.to_string(),
                        },
                    )),
                }),
                accessible_topology: Vec::new(),
            }),
            status: Some(csi::controller_get_volume_response::VolumeStatus {
                published_node_ids: Vec::new(),
                volume_condition: Some(csi::VolumeCondition {
                    abnormal,
                    message: if abnormal {
                        format!("its read-only access rule {rule_id} is {}", rule.state)
                    } else {
                        format!("read-only, backed by snapshot {snapshot_id}")
                    },
                }),
            }),
        })
    }

    /// A share's or snapshot's deletion refused while a backed volume
    /// reads it: Kubernetes retries, and the volume's readers keep their
    /// data until its claim is gone.
    pub(super) async fn refuse_while_backing(
        &self,
        manila: &SharedFileSystems,
        share_id: &str,
        snapshot_id: Option<&str>,
    ) -> DriverResult<()> {
        let rules = match manila.list_access_rules(share_id).await {
            Ok(r) => r,
            Err(e) if e.is_not_found() => return Ok(()),
            Err(e) => return Err(e).context(format!("access rules of share {share_id}")),
        };
        let readers = readers_of(&rules, snapshot_id);
        if readers.is_empty() {
            return Ok(());
        }
        let what = match snapshot_id {
            Some(s) => format!("snapshot {s}"),
            None => format!("share {share_id}"),
        };
        Err(DriverError::FailedPrecondition(format!(
            "{what} backs {} read-only volume(s) ({}); delete them first",
            readers.len(),
            readers.join(", ")
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: &str = "0b5c3a4e-5b7e-4c61-9d0e-2f2b8a7d9c11";
    const R: &str = "6f1d2c3b-4a5e-4f60-8a7b-9c0d1e2f3a4b";

    #[test]
    fn handles_name_a_snapshot_and_a_rule_and_nothing_else() {
        let h = handle(S, R);
        assert_eq!(parse_handle(&h), Some((S, R)));
        assert!(h.len() <= 128, "CSI's size limit for ids: {}", h.len());
        for other in [
            S.to_string(),
            format!("{HANDLE_PREFIX}{S}"),
            format!("{HANDLE_PREFIX}{S}:x"),
            format!("{HANDLE_PREFIX}../{S}:{R}"),
            format!("{HANDLE_PREFIX}{S}:{R}:{R}"),
        ] {
            assert_eq!(parse_handle(&other), None, "{other}");
        }
    }

    fn rule(to: &str, snapshot: Option<&str>, state: AccessRuleState) -> AccessRule {
        AccessRule {
            id: to.into(),
            access_type: "cephx".into(),
            access_to: to.into(),
            access_level: "ro".into(),
            state,
            access_key: None,
            share_id: None,
            metadata: snapshot
                .map(|s| BTreeMap::from([(BACKING_SNAPSHOT_KEY.to_string(), s.to_string())]))
                .unwrap_or_default(),
        }
    }

    #[test]
    fn readers_are_the_rules_naming_the_snapshot_and_not_being_denied() {
        let rules = [
            rule("pvc-a", Some(S), AccessRuleState::Active),
            rule("pvc-b", Some(S), AccessRuleState::Denying),
            rule("pvc-c", Some(R), AccessRuleState::QueuedToApply),
            rule("app", None, AccessRuleState::Active),
        ];
        assert_eq!(readers_of(&rules, Some(S)), vec!["pvc-a"]);
        assert_eq!(readers_of(&rules, None), vec!["pvc-a", "pvc-c"]);
        assert!(readers_of(&rules[3..], None).is_empty());
    }
}
