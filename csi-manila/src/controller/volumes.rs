//! Shares as volumes: create (idempotent by name, from snapshots and as
//! clones of other shares, access rules active before the answer),
//! delete (rules revoked, share gone before the answer), expand.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use csi_common::errors::{at_most_one, not_found_ok, remove_left, unless_left_behind};
use csi_common::request::{Capability, GIB, expansion_gib, is_uuid, require, size_fits, size_gib};
use csi_common::waits::{delete_and_wait_gone, wait_gone};
use csi_common::{Context, DriverError, DriverResult};
use openstack_client::manila::{CreateShare, Share, ShareStatus, SharedFileSystems};
use proto::csi::v1 as csi;

use super::ControllerService;
use super::share_types::{check_snapshot_capable, share_type};
use super::sources::{Source, source_of};
use crate::TOPOLOGY_KEY;
use crate::capabilities::parse_capabilities;
use crate::errors::{
    scheduling_may_pass_later, scheduling_refused_again, scheduling_refused_without_time,
};
use crate::parameters::ShareParameters;
use crate::share_protocol::ShareProtocol;
use crate::shares::{
    CLONE_OF_KEY, CLUSTER_KEY, DESCRIPTION, GROW_TO_KEY, IDENTITY_KEY, is_gone, provisioned_here,
    wait_share_available,
};

/// A share the scheduler could not place is created once more after this
/// pause (Manila's backends report their capabilities every few seconds),
/// when at least [`RETRY_MARGIN`] of the caller's time is left.
const SCHEDULER_PAUSE: Duration = Duration::from_secs(3);
const RETRY_MARGIN: Duration = Duration::from_secs(15);

impl ControllerService {
    pub(super) async fn create_volume(
        &self,
        r: csi::CreateVolumeRequest,
        deadline: Instant,
    ) -> DriverResult<csi::CreateVolumeResponse> {
        // everything a request can get wrong is refused before any call
        let name = require(&r.name, "name")?.to_string();
        let caps = parse_capabilities(&r.volume_capabilities)?;
        let size = size_gib(r.capacity_range.as_ref())?;
        let params = ShareParameters::parse(&r.parameters, self.opts.protocol)?;
        if !params.ignored.is_empty() {
            tracing::info!(keys = ?params.ignored, "StorageClass parameters this driver does not use are ignored");
        }
        // a share only ever read (every capability a reader's) gets
        // read-only rules: the server refuses writes, not just the node
        let source = source_of(&r)?;
        if params.backing_snapshot {
            let snapshot = match &source {
                Source::Snapshot(s) => Some(s.as_str()),
                _ => None,
            };
            return self
                .create_backed_volume(&r, &name, &caps, &params, snapshot, deadline)
                .await;
        }
        let read_only = caps.iter().all(Capability::read_only_mode);
        let wanted = self.wanted_rules(&name, &params, read_only)?;
        let zone = self.requested_zone(&r, &params);
        self.refuse_unmade_placement(&r).await?;
        let manila = self.manila(&r.secrets)?.with_deadline(deadline);

        let _guard = self.locks.lock(&format!("create/{name}"), deadline).await?;
        let existing: Vec<Share> = manila
            .list_shares_named(&name)
            .await
            .context(format!("looking up shares named {name}"))?
            .into_iter()
            .filter(|s| !is_gone(&s.status))
            .collect();
        let existing = self.settle_twins(&manila, &name, existing).await?;
        let share = match at_most_one(existing, "shares", &name, |s| &s.id)? {
            None => None,
            Some(s) if s.status.is_error() && provisioned_here(&s) => {
                tracing::warn!(share_id = %s.id, status = %s.status, "an earlier attempt failed; deleting it and creating anew");
                remove_left(manila.delete_share_of(&s).await, &format!("share {}", s.id))?;
                wait_gone(
                    "share_delete",
                    deadline,
                    &format!("failed share {}", s.id),
                    || manila.get_share(&s.id),
                    |s| s.status.to_string(),
                )
                .await?;
                None
            }
            Some(s) => {
                self.check_compatible(&manila, &s, &r, &params, &source)
                    .await?;
                Some(s)
            }
        };
        let fresh = share.is_none();
        let share = match share {
            Some(s) => s,
            None => {
                self.create_share(
                    &manila,
                    &name,
                    size,
                    &r,
                    &params,
                    &source,
                    zone.as_deref(),
                    deadline,
                )
                .await?
            }
        };
        let share = if share.status == ShareStatus::Available {
            share
        } else {
            match self.wait_created(&manila, &share, deadline).await {
                Ok(s) => s,
                Err((e, true))
                    if deadline.saturating_duration_since(Instant::now()) > RETRY_MARGIN =>
                {
                    // once more, after the backends' next capability report
                    tracing::warn!(error = %e, "Manila's scheduler found no backend; creating the share once more");
                    tokio::time::sleep(SCHEDULER_PAUSE).await;
                    let again = self
                        .create_share(
                            &manila,
                            &name,
                            size,
                            &r,
                            &params,
                            &source,
                            zone.as_deref(),
                            deadline,
                        )
                        .await?;
                    self.wait_created(&manila, &again, deadline)
                        .await
                        .map_err(|(e, refused)| {
                            if refused {
                                scheduling_refused_again(e)
                            } else {
                                e
                            }
                        })?
                }
                // no time left to ask again: the same final answer as a
                // second refusal, not the first refusal's InvalidArgument
                // (which the provisioner would leave alone for five minutes)
                Err((e, true)) => return Err(scheduling_refused_without_time(e)),
                Err((e, _)) => return Err(e),
            }
        };
        // another replica may have made this name too, at the same time
        let (share, fresh) = if fresh {
            match self.older_twin(&manila, &name, &share, deadline).await? {
                Some(twin) => {
                    self.check_compatible(&manila, &twin, &r, &params, &source)
                        .await?;
                    (twin, false)
                }
                None => (share, true),
            }
        } else {
            (share, false)
        };
        // grown to what this request asks, never to what the metadata
        // says (anyone with the share can write that)
        let share = match grow_to(&share) {
            Some(_) if (share.size as i64) < size => {
                tracing::info!(share_id = %share.id, from_gib = share.size, size_gib = size, "made from a snapshot at its size; growing it to the size asked for");
                self.grow(&manila, share, size, deadline).await?
            }
            _ => share,
        };
        if let Source::Share(_) = &source {
            self.drop_clone_snapshot(&manila, &name).await;
        }
        // the export locations (what NodeStage would otherwise ask Manila
        // for on every node) are there once the share is available: asked
        // while the rules are granted, they cost no wait of their own
        let (rule_ids, locations) = tokio::join!(
            self.ensure_access(&manila, &share, &wanted, fresh, deadline),
            manila.list_export_locations(&share.id),
        );
        let rule_ids = rule_ids?;
        let mut context = HashMap::from([
            ("shareID".to_string(), share.id.clone()),
            ("shareAccessIDs".to_string(), rule_ids.join(",")),
        ]);
        if self.opts.protocol == ShareProtocol::Cephfs {
            params.mount.to_context(&mut context);
        }
        crate::mount_target::context_for_stage(&share, locations, self.opts.protocol, &mut context);
        if let Some(g) = &params.group_id {
            context.insert("groupID".into(), g.clone());
        }
        let accessible_topology = match (&zone, r.accessibility_requirements.as_ref()) {
            _ if !self.opts.with_topology => Vec::new(),
            (Some(z), _) if params.auto_topology => self.topology(Some(z)),
            // as upstream: the operator guarantees the share is reachable
            // from where the CO wanted it
            (_, Some(req)) => req.preferred.clone(),
            _ => Vec::new(),
        };
        Ok(csi::CreateVolumeResponse {
            volume: Some(csi::Volume {
                capacity_bytes: (share.size as i64).saturating_mul(GIB),
                volume_id: share.id.clone(),
                volume_context: context,
                content_source: r.volume_content_source.clone(),
                accessible_topology,
            }),
        })
    }

    /// The availability zone: the StorageClass's, else (autoTopology) the
    /// CO's preferred, then requisite, zone.
    fn requested_zone(&self, r: &csi::CreateVolumeRequest, p: &ShareParameters) -> Option<String> {
        if let Some(a) = &p.availability {
            return Some(a.clone());
        }
        if !self.opts.with_topology || !p.auto_topology {
            return None;
        }
        let req = r.accessibility_requirements.as_ref()?;
        req.preferred
            .iter()
            .chain(req.requisite.iter())
            .find_map(|t| t.segments.get(TOPOLOGY_KEY).cloned())
    }

    /// An existing share of the request's name must be what it asks for.
    async fn check_compatible(
        &self,
        manila: &SharedFileSystems,
        s: &Share,
        r: &csi::CreateVolumeRequest,
        p: &ShareParameters,
        source: &Source,
    ) -> DriverResult<()> {
        let clash = |what: String| {
            Err(DriverError::AlreadyExists(format!(
                "share {} named {} already exists with {what}",
                s.id, r.name
            )))
        };
        let size = grow_to(s).unwrap_or(s.size as i64);
        if !size_fits(size, r.capacity_range.as_ref()) {
            return clash(format!("size {size} GiB, outside the requested range"));
        }
        if !s
            .share_proto
            .eq_ignore_ascii_case(self.opts.protocol.as_manila())
        {
            return clash(format!("protocol {}", s.share_proto));
        }
        if s.share_network_id.as_deref().filter(|n| !n.is_empty()) != p.share_network_id.as_deref()
        {
            return clash(format!("share network {:?}", s.share_network_id));
        }
        let same_type = s.share_type_name.as_deref() == Some(p.share_type.as_str())
            || s.share_type.as_deref() == Some(p.share_type.as_str());
        if !same_type {
            let t = share_type(manila, &p.share_type).await?;
            if s.share_type.as_deref() != Some(t.id.as_str()) {
                return clash(format!(
                    "share type {:?}",
                    s.share_type_name.as_ref().or(s.share_type.as_ref())
                ));
            }
        }
        let has = match (s.metadata.get(CLONE_OF_KEY), &s.snapshot_id) {
            (Some(v), _) => Source::Share(v.clone()),
            (None, Some(snap)) => Source::Snapshot(snap.clone()),
            (None, None) => match (&s.source_share_group_snapshot_member_id, source) {
                // a restored share knows its member, not the group snapshot
                (Some(m), Source::Member(g, wanted)) if m == wanted => {
                    Source::Member(g.clone(), m.clone())
                }
                (Some(m), _) => Source::Member(String::new(), m.clone()),
                (None, _) => Source::Empty,
            },
        };
        if &has != source {
            return clash(format!("another content source ({has:?})"));
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    async fn create_share(
        &self,
        manila: &SharedFileSystems,
        name: &str,
        mut size: i64,
        r: &csi::CreateVolumeRequest,
        p: &ShareParameters,
        source: &Source,
        zone: Option<&str>,
        deadline: Instant,
    ) -> DriverResult<Share> {
        let mut metadata: BTreeMap<String, String> = p.metadata.clone();
        if !self.opts.cluster_id.is_empty() {
            metadata.insert(CLUSTER_KEY.into(), self.opts.cluster_id.clone());
            self.opts.identity.tag(IDENTITY_KEY, &mut metadata);
        }
        if let Source::Member(gs, member) = source {
            if p.group_id.is_some() {
                tracing::info!(group_snapshot_id = %gs, "a restore of a group snapshot member lands in the share group Manila makes from the group snapshot, not the class's groupID");
            }
            let range = r.capacity_range.as_ref();
            // the member's size comes with the one read of its group
            // snapshot that restore_member makes under its lock
            let metadata_for = |min: i64| {
                let min_fits = size_fits(min, range) || range.is_none_or(|c| c.limit_bytes == 0);
                if size < min && !min_fits {
                    return Err(DriverError::OutOfRange(format!(
                        "the source holds {min} GiB, more than limit_bytes allows"
                    )));
                }
                let mut metadata = metadata;
                if size > min {
                    // restored at the member's size, grown once taken
                    metadata.insert(GROW_TO_KEY.into(), size.to_string());
                }
                Ok(metadata)
            };
            return self
                .restore_member(manila, name, gs, member, metadata_for, deadline)
                .await;
        }
        let snapshot = match source {
            Source::Empty | Source::Member(..) => None,
            Source::Snapshot(id) => {
                let snap = self.usable_snapshot(manila, id).await?;
                let t = share_type(manila, &p.share_type).await?;
                check_snapshot_capable(&t, "a volume from a snapshot")?;
                Some(snap)
            }
            Source::Share(id) => {
                let snap = self.clone_snapshot(manila, name, id, deadline).await?;
                metadata.insert(CLONE_OF_KEY.into(), id.clone());
                Some(snap)
            }
        };
        if let Some(s) = &snapshot {
            let min = s.size as i64;
            if size < min {
                if size_fits(min, r.capacity_range.as_ref())
                    || r.capacity_range.as_ref().is_none_or(|c| c.limit_bytes == 0)
                {
                    size = min;
                } else {
                    return Err(DriverError::OutOfRange(format!(
                        "the source holds {min} GiB, more than limit_bytes allows"
                    )));
                }
            } else if size > min {
                // created at the snapshot's size, grown once available
                // (see GROW_TO_KEY)
                metadata.insert(GROW_TO_KEY.into(), size.to_string());
                size = min;
            }
        }
        let spec = CreateShare {
            protocol: self.opts.protocol.as_manila().into(),
            size_gib: size as u64,
            name: name.to_string(),
            description: Some(DESCRIPTION.into()),
            share_type: Some(p.share_type.clone()),
            share_network_id: p.share_network_id.clone(),
            availability_zone: zone.map(str::to_string),
            snapshot_id: snapshot.map(|s| s.id),
            share_group_id: p.group_id.clone(),
            metadata,
        };
        let created = match manila.create_share(&spec).await {
            Ok(s) => s,
            Err(openstack_client::Error::NotFound(e)) => {
                return Err(DriverError::InvalidArgument(format!(
                    "Manila cannot create share {name}: {}",
                    e.message
                )));
            }
            Err(openstack_client::Error::BadRequest(e)) => {
                return Err(DriverError::InvalidArgument(format!(
                    "Manila refused share {name}: {}",
                    e.message
                )));
            }
            Err(e) => return Err(e).context(format!("creating share {name}")),
        };
        tracing::info!(share_id = %created.id, size_gib = size, "share created, waiting for it to become available");
        Ok(created)
    }

    /// Waits for a new share; one Manila failed is deleted (it is ours:
    /// the description says so) and the answer carries Manila's reason.
    /// `Err((e, true))`: the scheduler's refusal may pass on a new try.
    async fn wait_created(
        &self,
        manila: &SharedFileSystems,
        share: &Share,
        deadline: Instant,
    ) -> Result<Share, (DriverError, bool)> {
        match wait_share_available(manila, &share.id, deadline, |_| true).await {
            Ok(s) => Ok(s),
            Err(e @ DriverError::DeadlineExceeded(_)) => Err((e, false)),
            Err(e) => {
                let again = manila
                    .list_user_messages(&share.id)
                    .await
                    .map(|m| scheduling_may_pass_later(&m))
                    .unwrap_or(false);
                let deleted = not_found_ok(manila.delete_share_of(share).await);
                tracing::warn!(share_id = %share.id, error = %e, deleted = deleted.is_ok(), "share failed in Manila");
                if deleted.is_ok() {
                    // gone before a retry creates the name again
                    let _ = wait_gone(
                        "share_delete",
                        deadline,
                        &format!("failed share {}", share.id),
                        || manila.get_share(&share.id),
                        |s| s.status.to_string(),
                    )
                    .await;
                }
                match deleted {
                    Ok(()) => Err((e, again)),
                    Err(d) => Err((
                        unless_left_behind(e, Err(d), &format!("failed share {}", share.id)),
                        false,
                    )),
                }
            }
        }
    }
}

impl ControllerService {
    pub(super) async fn delete_volume(
        &self,
        r: csi::DeleteVolumeRequest,
        deadline: Instant,
    ) -> DriverResult<csi::DeleteVolumeResponse> {
        let id = require(&r.volume_id, "volume_id")?;
        if let Some((snapshot, rule)) = super::backed::parse_handle(id) {
            return self
                .delete_backed_volume(&r, snapshot, rule, deadline)
                .await;
        }
        if !is_uuid(id) {
            // no share has such an id: nothing of ours to delete
            return Ok(csi::DeleteVolumeResponse {});
        }
        let manila = self.manila(&r.secrets)?.with_deadline(deadline);
        let _guard = self.locks.lock(id, deadline).await?;
        let share = match manila.get_share(id).await {
            Ok(s) => s,
            Err(e) if e.is_not_found() => return Ok(csi::DeleteVolumeResponse {}),
            Err(e) => return Err(e).context(format!("share {id}")),
        };
        let under_way = is_gone(&share.status);
        if !under_way {
            if !provisioned_here(&share) {
                return Err(DriverError::FailedPrecondition(format!(
                    "share {id} was not provisioned by a Manila CSI driver (its description is not {DESCRIPTION:?}); it is left in place"
                )));
            }
            // its readers' rules stay, and so does the share, until the
            // volumes backed by its snapshots are gone
            self.refuse_while_backing(&manila, id, None).await?;
            self.revoke_all(&manila, id, deadline).await?;
            // a clone's temporary snapshot, if Manila kept it
            self.drop_clone_snapshot(&manila, &share.name).await;
        }
        delete_and_wait_gone(
            "share_delete",
            deadline,
            "Manila",
            &format!("share {id}"),
            under_way,
            async {
                match manila.delete_share_of(&share).await {
                    // a share with group snapshot members stays until
                    // their group snapshot is deleted (Manila's 403)
                    Err(openstack_client::Error::Forbidden(e))
                        if e.message.contains("dependent") =>
                    {
                        Err(openstack_client::Error::Conflict(e))
                    }
                    other => other,
                }
            },
            || manila.get_share(id),
            |s| s.status.to_string(),
        )
        .await?;
        if let Some(group) = &share.share_group_id {
            self.drop_restore_group_if_empty(&manila, group).await;
        }
        Ok(csi::DeleteVolumeResponse {})
    }

    pub(super) async fn expand(
        &self,
        r: csi::ControllerExpandVolumeRequest,
        deadline: Instant,
    ) -> DriverResult<csi::ControllerExpandVolumeResponse> {
        let id = require(&r.volume_id, "volume_id")?;
        let want = expansion_gib(r.capacity_range.as_ref())?;
        if let Some(c) = &r.volume_capability {
            crate::capabilities::parse_capability(c)?;
        }
        if let Some((snapshot, _)) = super::backed::parse_handle(id) {
            return Err(DriverError::FailedPrecondition(format!(
                "volume {id} is snapshot {snapshot} itself, read-only: it cannot grow (restore a writable copy to grow it)"
            )));
        }
        let manila = self.manila(&r.secrets)?.with_deadline(deadline);
        let _guard = self.locks.lock(id, deadline).await?;
        let s = self.our_share(&manila, id).await?;
        let done = |s: &Share| s.size as i64 >= want;
        let answer = |s: &Share| csi::ControllerExpandVolumeResponse {
            capacity_bytes: (s.size as i64).saturating_mul(GIB),
            // a share's size is its quota: nothing to grow on the node
            node_expansion_required: false,
        };
        if done(&s) && s.status == ShareStatus::Available {
            return Ok(answer(&s));
        }
        let s = self.grow(&manila, s, want, deadline).await?;
        Ok(answer(&s))
    }

    /// Extends the share to `want` GiB (or waits for an extend under
    /// way), answering it once available at that size.
    async fn grow(
        &self,
        manila: &SharedFileSystems,
        s: Share,
        want: i64,
        deadline: Instant,
    ) -> DriverResult<Share> {
        let id = s.id.as_str();
        let done = |s: &Share| s.size as i64 >= want;
        match s.status {
            ShareStatus::Available => match manila.extend_share(id, want as u64).await {
                Ok(()) => tracing::info!(share_id = id, size_gib = want, "extend requested"),
                Err(openstack_client::Error::BadRequest(e)) => {
                    return Err(DriverError::FailedPrecondition(format!(
                        "Manila refused to extend share {id} to {want} GiB: {}",
                        e.message
                    )));
                }
                // the project's quota refused it before anything changed
                // (Manila answers 403 for an extend, 413 elsewhere): an
                // infeasible size (OutOfRange), after which Kubernetes lets
                // the user lower the claim's request (KEP-1790)
                Err(
                    openstack_client::Error::OverQuota(e) | openstack_client::Error::Forbidden(e),
                ) if e.message.to_ascii_lowercase().contains("quota") => {
                    return Err(DriverError::OutOfRange(format!(
                        "share {id} cannot grow from {} to {want} GiB, the project's quota refuses it ({}); lower the claim's request to a size the quota allows, or raise the quota",
                        s.size, e.message
                    )));
                }
                Err(e) => return Err(e).context(format!("extending share {id}")),
            },
            // an earlier attempt is under way: wait for it below
            ShareStatus::Extending => {}
            ref st => {
                return Err(DriverError::FailedPrecondition(format!(
                    "share {id} is {st}; it can be expanded when available"
                )));
            }
        }
        wait_share_available(manila, id, deadline, done).await
    }
}

/// The size a share made from a snapshot is to be grown to (GROW_TO_KEY).
fn grow_to(s: &Share) -> Option<i64> {
    s.metadata.get(GROW_TO_KEY)?.parse().ok()
}

/// The annotations a claim of upstream's driver may carry to place its
/// share (Manila's scheduler hints, a share group).
pub const PLACEMENT_ANNOTATIONS: [&str; 3] = [
    "manila.csi.openstack.org/affinity",
    "manila.csi.openstack.org/anti-affinity",
    "manila.csi.openstack.org/group-id",
];

impl ControllerService {
    /// `--pvc-annotations`: a claim that asks for a placement this driver
    /// does not make is refused, naming what it asks, before anything is
    /// made: a share put anywhere would break what the claim asks (an
    /// anti-affinity, say) without a word.
    pub(super) async fn refuse_unmade_placement(
        &self,
        r: &csi::CreateVolumeRequest,
    ) -> DriverResult<()> {
        let Some(claims) = &self.opts.claims else {
            return Ok(());
        };
        let Some(annotations) = claims.of_request(&r.parameters).await? else {
            return Ok(());
        };
        let asked: Vec<&str> = PLACEMENT_ANNOTATIONS
            .into_iter()
            .filter(|k| annotations.get(*k).is_some_and(|v| !v.trim().is_empty()))
            .collect();
        if asked.is_empty() {
            return Ok(());
        }
        Err(DriverError::FailedPrecondition(format!(
            "the claim asks for a placement this driver does not make ({}: Manila's scheduler hints \
             and share groups are not implemented); remove the annotations to have the share made \
             without it",
            asked.join(", ")
        )))
    }
}
