//! Volumes: create (idempotent by name, from snapshots and volumes),
//! delete, validate, list, get, expand, modify.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use csi_common::request::{GIB, expansion_gib, is_uuid, require, size_fits, size_gib};
use csi_common::{Context, DriverError, DriverResult};
use openstack_client::cinder::{
    BlockStorage, CreateVolume, ListVolumes, SnapshotStatus, Volume, VolumeStatus,
};
use openstack_client::common::{Poll, poll_until};
use proto::csi::v1 as csi;

use super::*;
use crate::capabilities::{
    AccessType, capability_unsupported, parse_capabilities, parse_capability,
};

impl ControllerService {
    // ------------------------------------------------------------ volumes

    pub(super) async fn create_volume(
        &self,
        r: csi::CreateVolumeRequest,
        deadline: Instant,
    ) -> DriverResult<csi::CreateVolumeResponse> {
        let name = require(&r.name, "name")?;
        let caps = parse_capabilities(&r.volume_capabilities)?;
        // what no volume type can make acceptable is refused before any call
        for c in &caps {
            if let Some(why) = capability_unsupported(c, true) {
                return Err(DriverError::InvalidArgument(why));
            }
        }
        let mut size = size_gib(r.capacity_range.as_ref())?;
        let cloud = self.cloud(&r.secrets)?;

        let mut volume_type = None;
        let mut availability = None;
        let mut metadata = BTreeMap::new();
        for (k, v) in &r.parameters {
            match k.as_str() {
                "type" => volume_type = Some(v.clone()).filter(|v| !v.is_empty()),
                "availability" => availability = Some(v.clone()).filter(|v| !v.is_empty()),
                PVC_NAME | PVC_NAMESPACE | PV_NAME => {
                    metadata.insert(k.clone(), v.clone());
                }
                other => {
                    return Err(DriverError::InvalidArgument(format!(
                        "unknown StorageClass parameter {other:?} (known: type, availability)"
                    )));
                }
            }
        }
        for (k, v) in &r.mutable_parameters {
            match k.as_str() {
                "type" => volume_type = Some(v.clone()).filter(|v| !v.is_empty()),
                other => {
                    return Err(DriverError::InvalidArgument(format!(
                        "unknown mutable parameter {other:?} (known: type)"
                    )));
                }
            }
        }
        if !self.opts.cluster.is_empty() {
            metadata.insert(CLUSTER_KEY.to_string(), self.opts.cluster.clone());
        }
        let requested_zone = self.requested_zone(&r, availability.as_deref());

        let (snapshot_id, source_volume_id) = match r
            .volume_content_source
            .as_ref()
            .and_then(|s| s.r#type.as_ref())
        {
            Some(csi::volume_content_source::Type::Snapshot(s)) => (
                Some(
                    require(&s.snapshot_id, "volume_content_source.snapshot.snapshot_id")?
                        .to_string(),
                ),
                None,
            ),
            Some(csi::volume_content_source::Type::Volume(v)) => (
                None,
                Some(require(&v.volume_id, "volume_content_source.volume.volume_id")?.to_string()),
            ),
            None => (None, None),
        };

        let _guard = self.locks.lock(&format!("create/{name}"), deadline).await?;
        let block = cloud.block.with_deadline(deadline);

        // idempotency: a volume of this name from an earlier call
        let existing: Vec<Volume> = block
            .volumes_named(name)
            .await
            .context(format!("looking up volumes named {name}"))?
            .into_iter()
            .filter(|v| !volume_gone(&v.status))
            .collect();
        if existing.len() > 1 {
            let ids: Vec<&str> = existing.iter().map(|v| v.id.as_str()).collect();
            return Err(DriverError::Internal(format!(
                "several Cinder volumes are named {name}: {ids:?}; delete the extra ones"
            )));
        }
        if let Some(v) = existing.into_iter().next() {
            if v.status.is_error() {
                tracing::warn!(volume_id = %v.id, status = %v.status, "an earlier attempt failed; deleting it and creating anew");
                not_found_ok(block.delete_volume(&v.id).await)
                    .context(format!("deleting failed volume {}", v.id))?;
            } else {
                self.check_compatible(
                    &block,
                    &v,
                    &r,
                    volume_type.as_deref(),
                    snapshot_id.as_deref(),
                    source_volume_id.as_deref(),
                    &caps,
                )
                .await?;
                let v = self.wait_volume_available(&block, &v.id, deadline).await?;
                let context = resize_context(&v, self.source_size(&block, &v).await);
                return Ok(csi::CreateVolumeResponse {
                    volume: Some(self.csi_volume(&v, context, requested_zone.as_deref())),
                });
            }
        }

        // the source decides the minimum size and must be usable
        let mut source_size = None;
        if let Some(sid) = &snapshot_id {
            if !is_uuid(sid) {
                return Err(DriverError::NotFound(format!(
                    "snapshot {sid} does not exist"
                )));
            }
            let s = block
                .get_snapshot(sid)
                .await
                .context(format!("snapshot {sid}"))?;
            if s.status != SnapshotStatus::Available {
                return Err(DriverError::Unavailable(format!(
                    "snapshot {sid} is {}, not available",
                    s.status
                )));
            }
            source_size = Some(s.size as i64);
        }
        if let Some(vid) = &source_volume_id {
            if !is_uuid(vid) {
                return Err(DriverError::NotFound(format!(
                    "volume {vid} does not exist"
                )));
            }
            let v = block
                .get_volume(vid)
                .await
                .context(format!("source volume {vid}"))?;
            if !matches!(v.status, VolumeStatus::Available | VolumeStatus::InUse) {
                return Err(DriverError::Unavailable(format!(
                    "source volume {vid} is {}, not available",
                    v.status
                )));
            }
            source_size = Some(v.size as i64);
        }
        if let Some(min) = source_size
            && size < min
        {
            if size_fits(min, r.capacity_range.as_ref())
                || r.capacity_range.as_ref().is_none_or(|c| c.limit_bytes == 0)
            {
                size = min;
            } else {
                return Err(DriverError::OutOfRange(format!(
                    "the source holds {min} GiB, more than limit_bytes allows"
                )));
            }
        }
        for c in &caps {
            if c.multi_node() {
                let multiattach = self
                    .type_is_multiattach(&block, volume_type.as_deref())
                    .await?;
                if let Some(why) = capability_unsupported(c, multiattach) {
                    return Err(DriverError::InvalidArgument(why));
                }
            }
        }

        let spec = CreateVolume {
            name: name.to_string(),
            size_gib: size as u64,
            description: Some(DESCRIPTION.to_string()),
            volume_type: volume_type.clone(),
            availability_zone: requested_zone.clone(),
            snapshot_id: snapshot_id.clone(),
            source_volume_id: source_volume_id.clone(),
            metadata,
            scheduler_hints: BTreeMap::new(),
        };
        let created = block
            .create_volume(&spec)
            .await
            .context(format!("creating volume {name}"))?;
        tracing::info!(volume_id = %created.id, size_gib = size, "volume created, waiting for it to become available");
        let v = self
            .wait_volume_available(&block, &created.id, deadline)
            .await?;
        let context = resize_context(&v, source_size);
        Ok(csi::CreateVolumeResponse {
            volume: Some(self.csi_volume(&v, context, requested_zone.as_deref())),
        })
    }

    fn requested_zone(
        &self,
        r: &csi::CreateVolumeRequest,
        availability: Option<&str>,
    ) -> Option<String> {
        if let Some(a) = availability {
            return Some(a.to_string());
        }
        if !self.opts.with_topology {
            return None;
        }
        let req = r.accessibility_requirements.as_ref()?;
        req.preferred
            .iter()
            .chain(req.requisite.iter())
            .find_map(|t| t.segments.get(TOPOLOGY_KEY).cloned())
    }

    pub(super) async fn type_is_multiattach(
        &self,
        block: &BlockStorage,
        volume_type: Option<&str>,
    ) -> DriverResult<bool> {
        let Some(t) = volume_type else {
            return Ok(false);
        };
        match block.get_volume_type(t).await {
            Ok(vt) => Ok(vt.multiattach()),
            Err(e) if e.is_not_found() => Err(DriverError::InvalidArgument(format!(
                "volume type {t:?} does not exist"
            ))),
            Err(e) => Err(e).context(format!("volume type {t}")),
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) async fn check_compatible(
        &self,
        block: &BlockStorage,
        v: &Volume,
        r: &csi::CreateVolumeRequest,
        volume_type: Option<&str>,
        snapshot_id: Option<&str>,
        source_volume_id: Option<&str>,
        caps: &[csi_common::request::Capability],
    ) -> DriverResult<()> {
        let clash = |what: String| {
            Err(DriverError::AlreadyExists(format!(
                "volume {} named {} already exists with {what}",
                v.id, r.name
            )))
        };
        if !size_fits(v.size as i64, r.capacity_range.as_ref()) {
            return clash(format!("size {} GiB, outside the requested range", v.size));
        }
        if v.snapshot_id.as_deref() != snapshot_id || v.source_volid.as_deref() != source_volume_id
        {
            return clash("another content source".into());
        }
        if let Some(t) = volume_type
            && v.volume_type.as_deref() != Some(t)
        {
            let same = match block.get_volume_type(t).await {
                Ok(vt) => {
                    v.volume_type.as_deref() == Some(vt.name.as_str())
                        || v.volume_type.as_deref() == Some(vt.id.as_str())
                }
                Err(_) => false,
            };
            if !same {
                return clash(format!("volume type {:?}", v.volume_type));
            }
        }
        for c in caps {
            if let Some(why) = capability_unsupported(c, v.multiattach) {
                return Err(DriverError::InvalidArgument(why));
            }
        }
        Ok(())
    }

    pub(super) async fn source_size(&self, block: &BlockStorage, v: &Volume) -> Option<i64> {
        if let Some(s) = &v.snapshot_id {
            return block.get_snapshot(s).await.ok().map(|s| s.size as i64);
        }
        if let Some(s) = &v.source_volid {
            return block.get_volume(s).await.ok().map(|s| s.size as i64);
        }
        None
    }

    /// Waits for `available`. A volume that fails is deleted (it is
    /// ours, created by this call or an earlier attempt of it) and the
    /// caller told why; one still creating at the deadline is kept, and
    /// the retry resumes the wait.
    pub(super) async fn wait_volume_available(
        &self,
        block: &BlockStorage,
        id: &str,
        deadline: Instant,
    ) -> DriverResult<Volume> {
        let result = poll_until("volume_create", deadline, POLL_FIRST, POLL_MAX, || async {
            let v = block.get_volume(id).await?;
            Ok(match v.status {
                VolumeStatus::Available | VolumeStatus::InUse => Poll::Ready(Ok(v)),
                ref s if s.is_error() || volume_gone(s) => Poll::Ready(Err(v)),
                ref s => Poll::Pending(s.to_string()),
            })
        })
        .await;
        match result {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(v)) => {
                let deleted = not_found_ok(block.delete_volume(id).await);
                Err(DriverError::Internal(format!(
                    "Cinder could not create volume {id} (status {}; usually no backend with enough capacity for the type and zone){}",
                    v.status,
                    match deleted {
                        Ok(()) => "; the failed volume was deleted".to_string(),
                        Err(e) => format!("; deleting the failed volume failed too: {e}"),
                    }
                )))
            }
            Err(openstack_client::Error::Timeout { .. }) => Err(DriverError::DeadlineExceeded(
                format!("volume {id} is not available yet; a retry resumes waiting"),
            )),
            Err(e) => Err(e).context(format!("waiting for volume {id}")),
        }
    }

    pub(super) async fn delete_volume(
        &self,
        r: csi::DeleteVolumeRequest,
        deadline: Instant,
    ) -> DriverResult<csi::DeleteVolumeResponse> {
        let id = require(&r.volume_id, "volume_id")?;
        if !is_uuid(id) {
            return Ok(csi::DeleteVolumeResponse {});
        }
        let cloud = self.cloud(&r.secrets)?;
        let _guard = self.locks.lock(id, deadline).await?;
        let block = cloud.block.with_deadline(deadline);
        let v = match block.get_volume(id).await {
            Ok(v) => v,
            Err(e) if e.is_not_found() => return Ok(csi::DeleteVolumeResponse {}),
            Err(e) => return Err(e).context(format!("volume {id}")),
        };
        if volume_gone(&v.status) {
            return Ok(csi::DeleteVolumeResponse {});
        }
        let servers: Vec<&str> = v.attached_servers().collect();
        if !servers.is_empty()
            || matches!(
                v.status,
                VolumeStatus::InUse
                    | VolumeStatus::Attaching
                    | VolumeStatus::Detaching
                    | VolumeStatus::Reserved
            )
        {
            return Err(DriverError::FailedPrecondition(format!(
                "volume {id} is {} (attached to {servers:?}); unpublish it first",
                v.status
            )));
        }
        not_found_ok(block.delete_volume(id).await).context(format!("deleting volume {id}"))?;
        tracing::info!(volume_id = id, "volume deletion accepted");
        Ok(csi::DeleteVolumeResponse {})
    }

    // ------------------------------------------------------------- queries

    pub(super) async fn validate(
        &self,
        r: csi::ValidateVolumeCapabilitiesRequest,
        deadline: Instant,
    ) -> DriverResult<csi::ValidateVolumeCapabilitiesResponse> {
        let id = require(&r.volume_id, "volume_id")?;
        let caps = parse_capabilities(&r.volume_capabilities)?;
        let cloud = self.cloud(&r.secrets)?;
        if !is_uuid(id) {
            return Err(DriverError::NotFound(format!("volume {id} does not exist")));
        }
        let v = cloud
            .block
            .with_deadline(deadline)
            .get_volume(id)
            .await
            .context(format!("volume {id}"))?;
        for k in r.parameters.keys() {
            if !matches!(
                k.as_str(),
                "type" | "availability" | PVC_NAME | PVC_NAMESPACE | PV_NAME
            ) {
                return Ok(csi::ValidateVolumeCapabilitiesResponse {
                    confirmed: None,
                    message: format!("unknown parameter {k:?}"),
                });
            }
        }
        if let Some(t) = r.parameters.get("type")
            && v.volume_type.as_deref() != Some(t.as_str())
        {
            return Ok(csi::ValidateVolumeCapabilitiesResponse {
                confirmed: None,
                message: format!("volume {id} has type {:?}, not {t:?}", v.volume_type),
            });
        }
        for c in &caps {
            if let Some(why) = capability_unsupported(c, v.multiattach) {
                return Ok(csi::ValidateVolumeCapabilitiesResponse {
                    confirmed: None,
                    message: why,
                });
            }
        }
        Ok(csi::ValidateVolumeCapabilitiesResponse {
            confirmed: Some(csi::validate_volume_capabilities_response::Confirmed {
                volume_context: r.volume_context,
                volume_capabilities: r.volume_capabilities,
                parameters: r.parameters,
                mutable_parameters: r.mutable_parameters,
            }),
            message: String::new(),
        })
    }

    /// Tokens: a Cinder marker; with several clouds, `<marker>:<cloud>`
    /// (an empty marker starts that cloud).
    pub(super) async fn list_volumes(
        &self,
        r: csi::ListVolumesRequest,
        deadline: Instant,
    ) -> DriverResult<csi::ListVolumesResponse> {
        if r.max_entries < 0 {
            return Err(DriverError::InvalidArgument(
                "max_entries must not be negative".into(),
            ));
        }
        let multi = self.clouds.len() > 1;
        let (mut cloud_idx, mut marker) = if r.starting_token.is_empty() {
            (0, None)
        } else {
            let (m, c) = if multi {
                r.starting_token.rsplit_once(':').ok_or_else(|| {
                    DriverError::Aborted(format!(
                        "starting_token {:?} is not one this driver issued",
                        r.starting_token
                    ))
                })?
            } else {
                (r.starting_token.as_str(), "")
            };
            let idx = if multi {
                self.clouds.iter().position(|x| x.name == c)
            } else {
                Some(0)
            };
            let idx = idx.ok_or_else(|| {
                DriverError::Aborted(format!("starting_token names unknown cloud {c:?}"))
            })?;
            if !m.is_empty() && !is_uuid(m) {
                return Err(DriverError::Aborted(format!(
                    "starting_token {:?} is not one this driver issued",
                    r.starting_token
                )));
            }
            (idx, Some(m.to_string()).filter(|m| !m.is_empty()))
        };
        let mut limit = if r.max_entries == 0 {
            DEFAULT_PAGE as usize
        } else {
            r.max_entries as usize
        };
        let mut entries = Vec::new();
        let mut next_token = String::new();
        while cloud_idx < self.clouds.len() && limit > 0 {
            let cloud = &self.clouds[cloud_idx];
            let page = match cloud
                .block
                .with_deadline(deadline)
                .list_volumes(&ListVolumes {
                    name: None,
                    limit: Some(limit as u32),
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
                Err(e) => return Err(e).context("listing volumes"),
            };
            limit = limit.saturating_sub(page.items.len());
            for v in &page.items {
                entries.push(csi::list_volumes_response::Entry {
                    volume: Some(self.csi_volume(v, HashMap::new(), None)),
                    status: Some(csi::list_volumes_response::VolumeStatus {
                        published_node_ids: v.attached_servers().map(str::to_string).collect(),
                        volume_condition: Some(condition(v)),
                    }),
                });
            }
            match page.next_marker {
                Some(m) => {
                    next_token = if multi {
                        format!("{m}:{}", cloud.name)
                    } else {
                        m
                    };
                    break;
                }
                None => {
                    cloud_idx += 1;
                    marker = None;
                    if cloud_idx < self.clouds.len() {
                        next_token = format!(":{}", self.clouds[cloud_idx].name);
                    } else {
                        next_token.clear();
                    }
                }
            }
        }
        Ok(csi::ListVolumesResponse {
            entries,
            next_token,
        })
    }

    pub(super) async fn get_volume(
        &self,
        r: csi::ControllerGetVolumeRequest,
        deadline: Instant,
    ) -> DriverResult<csi::ControllerGetVolumeResponse> {
        let id = require(&r.volume_id, "volume_id")?;
        if !is_uuid(id) {
            return Err(DriverError::NotFound(format!("volume {id} does not exist")));
        }
        for cloud in &self.clouds {
            match cloud.block.with_deadline(deadline).get_volume(id).await {
                Ok(v) => {
                    return Ok(csi::ControllerGetVolumeResponse {
                        volume: Some(self.csi_volume(&v, HashMap::new(), None)),
                        status: Some(csi::controller_get_volume_response::VolumeStatus {
                            published_node_ids: v.attached_servers().map(str::to_string).collect(),
                            volume_condition: Some(condition(&v)),
                        }),
                    });
                }
                Err(e) if e.is_not_found() => continue,
                Err(e) => return Err(e).context(format!("volume {id}")),
            }
        }
        Err(DriverError::NotFound(format!("volume {id} does not exist")))
    }

    // ---------------------------------------------------------- expansion

    pub(super) async fn expand(
        &self,
        r: csi::ControllerExpandVolumeRequest,
        deadline: Instant,
    ) -> DriverResult<csi::ControllerExpandVolumeResponse> {
        let id = require(&r.volume_id, "volume_id")?;
        let want = expansion_gib(r.capacity_range.as_ref())?;
        let block_mode = match &r.volume_capability {
            Some(c) => parse_capability(c)?.access_type == AccessType::Block,
            None => false,
        };
        let cloud = self.cloud(&r.secrets)?;
        if !is_uuid(id) {
            return Err(DriverError::NotFound(format!("volume {id} does not exist")));
        }
        let _guard = self.locks.lock(id, deadline).await?;
        let block = cloud.block.with_deadline(deadline);
        let v = block.get_volume(id).await.context(format!("volume {id}"))?;
        if v.size as i64 >= want {
            return Ok(csi::ControllerExpandVolumeResponse {
                capacity_bytes: (v.size as i64).saturating_mul(GIB),
                node_expansion_required: !block_mode,
            });
        }
        let in_use = match v.status {
            VolumeStatus::Available => false,
            VolumeStatus::InUse => true,
            VolumeStatus::Extending => {
                // an earlier attempt is under way; wait for it below
                false
            }
            ref s => {
                return Err(DriverError::FailedPrecondition(format!(
                    "volume {id} is {s}; it can be expanded when available or in-use"
                )));
            }
        };
        if v.status != VolumeStatus::Extending {
            block
                .extend_volume(id, want as u64, in_use)
                .await
                .context(format!("extending volume {id} to {want} GiB"))?;
        }
        let r = poll_until("volume_expand", deadline, POLL_FIRST, POLL_MAX, || async {
            let v = block.get_volume(id).await?;
            Ok(match v.status {
                VolumeStatus::Available | VolumeStatus::InUse if v.size as i64 >= want => {
                    Poll::Ready(Ok(v))
                }
                ref s if s.is_error() => Poll::Ready(Err(s.to_string())),
                ref s => Poll::Pending(s.to_string()),
            })
        })
        .await;
        match r {
            Ok(Ok(v)) => Ok(csi::ControllerExpandVolumeResponse {
                capacity_bytes: (v.size as i64).saturating_mul(GIB),
                node_expansion_required: !block_mode,
            }),
            Ok(Err(s)) => Err(DriverError::Internal(format!(
                "Cinder could not extend volume {id}: status {s}"
            ))),
            Err(openstack_client::Error::Timeout { .. }) => Err(DriverError::DeadlineExceeded(
                format!("volume {id} is still extending; a retry resumes waiting"),
            )),
            Err(e) => Err(e).context(format!("waiting for volume {id} to extend")),
        }
    }

    pub(super) async fn modify(
        &self,
        r: csi::ControllerModifyVolumeRequest,
        deadline: Instant,
    ) -> DriverResult<csi::ControllerModifyVolumeResponse> {
        let id = require(&r.volume_id, "volume_id")?;
        let mut new_type = None;
        for (k, v) in &r.mutable_parameters {
            match k.as_str() {
                "type" if !v.is_empty() => new_type = Some(v.clone()),
                other => {
                    return Err(DriverError::InvalidArgument(format!(
                        "mutable parameter {other:?}={v:?} is not supported (known: type)"
                    )));
                }
            }
        }
        let cloud = self.cloud(&r.secrets)?;
        if !is_uuid(id) {
            return Err(DriverError::NotFound(format!("volume {id} does not exist")));
        }
        let Some(new_type) = new_type else {
            return Ok(csi::ControllerModifyVolumeResponse {});
        };
        let _guard = self.locks.lock(id, deadline).await?;
        let block = cloud.block.with_deadline(deadline);
        let v = block.get_volume(id).await.context(format!("volume {id}"))?;
        let target = match block.get_volume_type(&new_type).await {
            Ok(t) => t,
            Err(e) if e.is_not_found() => {
                return Err(DriverError::InvalidArgument(format!(
                    "volume type {new_type:?} does not exist"
                )));
            }
            Err(e) => return Err(e).context(format!("volume type {new_type}")),
        };
        if v.volume_type.as_deref() == Some(target.name.as_str()) {
            return Ok(csi::ControllerModifyVolumeResponse {});
        }
        if v.status != VolumeStatus::Retyping {
            block
                .retype_volume(id, &target.name)
                .await
                .context(format!("retyping volume {id} to {}", target.name))?;
        }
        let r = poll_until("volume_retype", deadline, POLL_FIRST, POLL_MAX, || async {
            let v = block.get_volume(id).await?;
            Ok(match v.status {
                VolumeStatus::Retyping => Poll::Pending("retyping".into()),
                ref s if s.is_error() => Poll::Ready(Err(s.to_string())),
                _ if v.volume_type.as_deref() == Some(target.name.as_str()) => Poll::Ready(Ok(())),
                _ => Poll::Ready(Err(format!(
                    "type is still {:?} (Cinder refused the retype)",
                    v.volume_type
                ))),
            })
        })
        .await;
        match r {
            Ok(Ok(())) => Ok(csi::ControllerModifyVolumeResponse {}),
            Ok(Err(s)) => Err(DriverError::Internal(format!(
                "retyping volume {id} failed: {s}"
            ))),
            Err(openstack_client::Error::Timeout { .. }) => Err(DriverError::DeadlineExceeded(
                format!("volume {id} is still retyping; a retry resumes waiting"),
            )),
            Err(e) => Err(e).context(format!("waiting for volume {id} to retype")),
        }
    }
}

pub(super) fn content_source(v: &Volume) -> Option<csi::VolumeContentSource> {
    let t = if let Some(s) = &v.snapshot_id {
        csi::volume_content_source::Type::Snapshot(csi::volume_content_source::SnapshotSource {
            snapshot_id: s.clone(),
        })
    } else if let Some(s) = &v.source_volid {
        csi::volume_content_source::Type::Volume(csi::volume_content_source::VolumeSource {
            volume_id: s.clone(),
        })
    } else {
        return None;
    };
    Some(csi::VolumeContentSource { r#type: Some(t) })
}

/// The node grows the filesystem when the volume is larger than its source.
pub(super) fn resize_context(v: &Volume, source_size: Option<i64>) -> HashMap<String, String> {
    let mut c = HashMap::new();
    if let Some(s) = source_size
        && (v.size as i64) > s
    {
        c.insert(RESIZE_REQUIRED_KEY.to_string(), "true".to_string());
    }
    c
}

pub(super) fn condition(v: &Volume) -> csi::VolumeCondition {
    if v.status.is_error() {
        csi::VolumeCondition {
            abnormal: true,
            message: format!("Cinder reports volume {} in status {}", v.id, v.status),
        }
    } else {
        csi::VolumeCondition {
            abnormal: false,
            message: format!("volume is {}", v.status),
        }
    }
}
