//! Volumes: create (idempotent by name, from snapshots and volumes),
//! delete, validate, list, get, expand, modify.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use csi_common::errors::{Deletion, at_most_one, deletion, remove_left, unless_left_behind};
use csi_common::request::{GIB, expansion_gib, is_uuid, require, size_fits, size_gib};
use csi_common::waits::wait_until;
use csi_common::{Context, DriverError, DriverResult};
use openstack_client::cinder::{
    Backup, BackupStatus, BlockStorage, CreateVolume, ListSnapshots, Snapshot, SnapshotStatus,
    Volume, VolumeStatus,
};
use openstack_client::common::Poll;
use proto::csi::v1 as csi;

use super::*;
use crate::capabilities::{
    AccessType, capability_unsupported, parse_capabilities, parse_capability,
};
use crate::parameters::{FS_TYPE_CONTEXT_KEY, MutableParameters, VolumeParameters};

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

        let params = VolumeParameters::parse(&r.parameters, &r.mutable_parameters)?;
        let volume_type = params.volume_type.clone();
        // the classes' keys first: the claim's and the cluster's cannot be
        // overwritten (a class is also refused for naming them)
        let mut metadata = class_metadata::at_create(&params)?;
        metadata.extend(params.metadata.clone());
        if !self.opts.cluster.is_empty() {
            metadata.insert(CLUSTER_KEY.to_string(), self.opts.cluster.clone());
            self.opts.identity.tag(IDENTITY_KEY, &mut metadata);
        }
        let requested_zone = self.requested_zone(&r, params.availability.as_deref());
        let requested = RequestedSource::of(&r)?;

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
        let existing = self.settle_twins(&block, name, existing).await?;
        if let Some(v) = at_most_one(existing, "Cinder volumes", name, |v| &v.id)? {
            if v.status.is_error() {
                tracing::warn!(volume_id = %v.id, status = %v.status, "an earlier attempt failed; deleting it and creating anew");
                remove_left(
                    block.delete_volume(&v.id).await,
                    &format!("volume {}", v.id),
                )?;
            } else {
                self.check_compatible(&block, &v, &r, volume_type.as_deref(), &requested, &caps)
                    .await?;
                let v = self.wait_volume_available(&block, &v.id, deadline).await?;
                let context = volume_context(&v, self.source_size(&block, &v).await, &params);
                return Ok(csi::CreateVolumeResponse {
                    volume: Some(self.csi_volume(&v, context, requested_zone.as_deref())),
                });
            }
        }

        // the source decides the minimum size and must be usable
        let source = requested.resolve(&block).await?;
        let zone = self
            .zone_for_source(&block, &r, params.availability.as_deref(), &source)
            .await?;
        let source_size = source.size_gib();
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

        let placement = self.placement(&block, &r).await?;
        let mut spec = CreateVolume {
            name: name.to_string(),
            size_gib: size as u64,
            description: Some(DESCRIPTION.to_string()),
            volume_type: volume_type.clone(),
            availability_zone: zone.clone(),
            metadata,
            scheduler_hints: placement.scheduler_hints(),
            ..Default::default()
        };
        match source {
            Source::Empty => {}
            Source::Snapshot(s) => spec.snapshot_id = Some(s.id),
            Source::Volume(v) => spec.source_volume_id = Some(v.id),
            Source::Backup(b) => {
                spec.metadata
                    .insert(SOURCE_BACKUP_KEY.to_string(), b.id.clone());
                spec.backup_id = Some(b.id);
            }
        }
        let created = block
            .create_volume(&spec)
            .await
            .context(format!("creating volume {name}"))?;
        tracing::info!(volume_id = %created.id, size_gib = size, "volume created, waiting for it to become available");
        // a twin another replica made meanwhile is looked for while the
        // volume becomes available
        let (available, older) = tokio::join!(
            self.wait_volume_available(&block, &created.id, deadline),
            self.older_twin(&block, name, &created)
        );
        let v = available.map_err(|e| placement.explain(e))?;
        let v = match older? {
            Some(keep) => self.yield_to(&block, name, &v, &keep, deadline).await?,
            None => v,
        };
        if v.id != created.id {
            // the twin answers this request only if it fits it
            let requested = RequestedSource::of(&r)?;
            self.check_compatible(&block, &v, &r, volume_type.as_deref(), &requested, &caps)
                .await?;
        }
        let mut context = volume_context(&v, source_size, &params);
        placement.add_to_context(&mut context);
        Ok(csi::CreateVolumeResponse {
            volume: Some(self.csi_volume(&v, context, zone.as_deref())),
        })
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

    pub(super) async fn check_compatible(
        &self,
        block: &BlockStorage,
        v: &Volume,
        r: &csi::CreateVolumeRequest,
        volume_type: Option<&str>,
        requested: &RequestedSource,
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
        if !requested.made(v) {
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

    /// The size of the source an existing volume was made from.
    pub(super) async fn source_size(&self, block: &BlockStorage, v: &Volume) -> Option<i64> {
        if let Some(s) = &v.snapshot_id {
            return block.get_snapshot(s).await.ok().map(|s| s.size as i64);
        }
        if let Some(b) = v.metadata.get(SOURCE_BACKUP_KEY) {
            return block.get_backup(b).await.ok().map(|b| b.size as i64);
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
        let result = wait_until(
            "volume_create",
            deadline,
            |s| format!("volume {id} is still {s}"),
            || async {
                let v = block.get_volume(id).await?;
                Ok(match v.status {
                    VolumeStatus::Available | VolumeStatus::InUse => Poll::Ready(Ok(v)),
                    ref s if s.is_error() || volume_gone(s) => Poll::Ready(Err(v)),
                    ref s => Poll::Pending(s.to_string()),
                })
            },
        )
        .await?;
        match result {
            Ok(v) => Ok(v),
            Err(v) => Err(unless_left_behind(
                DriverError::Internal(format!(
                    "Cinder could not create volume {id} (status {}; usually no backend with enough capacity for the type and zone); the failed volume is deleted",
                    v.status
                )),
                block.delete_volume(id).await,
                &format!("failed volume {id}"),
            )),
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
        if !volume_gone(&v.status) {
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
            self.wait_snapshots_deleted(&block, id, deadline).await?;
            if deletion(
                block.delete_volume(id).await,
                "Cinder",
                &format!("volume {id}"),
            )? == Deletion::Gone
            {
                return Ok(csi::DeleteVolumeResponse {});
            }
            tracing::info!(volume_id = id, "volume deletion accepted");
        }
        // done means gone: a list, a get or the deletion of a source must
        // not see it any more
        wait_until(
            "volume_delete",
            deadline,
            |s| format!("volume {id} is still {s}"),
            || async {
                Ok(match block.get_volume(id).await {
                    Err(e) if e.is_not_found() => Poll::Ready(Ok(())),
                    Err(e) => return Err(e),
                    Ok(v) if v.status.as_str() == "error_deleting" => Poll::Ready(Err(())),
                    Ok(v) => Poll::Pending(v.status.to_string()),
                })
            },
        )
        .await?
        .map_err(|()| {
            DriverError::Internal(format!(
                "Cinder could not delete volume {id} (error_deleting); it needs an operator"
            ))
        })?;
        Ok(csi::DeleteVolumeResponse {})
    }

    /// Snapshots of a volume that are being deleted keep Cinder from
    /// deleting the volume: wait them out. Any other snapshot is a
    /// refusal the user acts on.
    async fn wait_snapshots_deleted(
        &self,
        block: &BlockStorage,
        id: &str,
        deadline: Instant,
    ) -> DriverResult<()> {
        let of_volume = || async {
            block
                .list_snapshots(&ListSnapshots {
                    volume_id: Some(id.to_string()),
                    ..Default::default()
                })
                .await
                .map(|p| p.items)
        };
        let snaps = of_volume()
            .await
            .context(format!("snapshots of volume {id}"))?;
        let live: Vec<&str> = snaps
            .iter()
            .filter(|s| s.status != SnapshotStatus::Deleting)
            .map(|s| s.id.as_str())
            .collect();
        if !live.is_empty() {
            return Err(DriverError::FailedPrecondition(format!(
                "volume {id} has snapshots {live:?}; delete them first"
            )));
        }
        if snaps.is_empty() {
            return Ok(());
        }
        wait_until(
            "snapshot_delete",
            deadline,
            |s| format!("snapshots of volume {id} are still being deleted ({s})"),
            || async {
                let left = of_volume().await?;
                Ok(if left.is_empty() {
                    Poll::Ready(())
                } else {
                    Poll::Pending(format!("{} left", left.len()))
                })
            },
        )
        .await
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
            match block.extend_volume(id, want as u64, in_use).await {
                Ok(()) => {}
                // Cinder refused before anything changed: an infeasible
                // size (OutOfRange), after which Kubernetes lets the user
                // lower the claim's request to one the quota allows
                // (KEP-1790); the resizer still tries again with backoff,
                // so a quota raised meanwhile also ends it
                Err(openstack_client::Error::OverQuota(e)) => {
                    return Err(DriverError::OutOfRange(format!(
                        "volume {id} cannot grow from {} to {want} GiB, the project's quota refuses it ({}); lower the claim's request to a size the quota allows, or raise the quota",
                        v.size, e.message
                    )));
                }
                Err(e) => return Err(e).context(format!("extending volume {id} to {want} GiB")),
            }
        }
        let v = wait_until(
            "volume_expand",
            deadline,
            |s| format!("volume {id} is still {s}"),
            || async {
                let v = block.get_volume(id).await?;
                Ok(match v.status {
                    VolumeStatus::Available | VolumeStatus::InUse if v.size as i64 >= want => {
                        Poll::Ready(Ok(v))
                    }
                    ref s if s.is_error() => Poll::Ready(Err(s.to_string())),
                    ref s => Poll::Pending(s.to_string()),
                })
            },
        )
        .await?
        .map_err(|s| {
            DriverError::Internal(format!("Cinder could not extend volume {id}: status {s}"))
        })?;
        Ok(csi::ControllerExpandVolumeResponse {
            capacity_bytes: (v.size as i64).saturating_mul(GIB),
            node_expansion_required: !block_mode,
        })
    }

    pub(super) async fn modify(
        &self,
        r: csi::ControllerModifyVolumeRequest,
        deadline: Instant,
    ) -> DriverResult<csi::ControllerModifyVolumeResponse> {
        let id = require(&r.volume_id, "volume_id")?;
        let changes = MutableParameters::parse(&r.mutable_parameters)?;
        let cloud = self.cloud(&r.secrets)?;
        if !is_uuid(id) {
            return Err(DriverError::NotFound(format!("volume {id} does not exist")));
        }
        let _guard = self.locks.lock(id, deadline).await?;
        let block = cloud.block.with_deadline(deadline);
        let v = block.get_volume(id).await.context(format!("volume {id}"))?;
        if volume_gone(&v.status) {
            return Err(DriverError::NotFound(format!(
                "volume {id} is being deleted"
            )));
        }
        // the class's metadata (a metadata update, never a retype), and
        // the resizer's claim keys, recorded as the provisioner's are
        let class = class_metadata::change(&v.metadata, &changes.class_metadata)?;
        let mut stale: BTreeMap<String, String> = changes
            .metadata
            .iter()
            .filter(|(k, val)| v.metadata.get(*k) != Some(*val))
            .map(|(k, val)| (k.clone(), val.clone()))
            .collect();
        stale.extend(class.set);
        if !stale.is_empty() {
            block
                .update_volume_metadata(id, &stale)
                .await
                .context(format!("recording metadata on volume {id}"))?;
        }
        for key in &class.remove {
            block
                .delete_volume_metadata_key(id, key)
                .await
                .context(format!("removing metadata {key} of volume {id}"))?;
        }
        let Some(new_type) = changes.volume_type else {
            return Ok(csi::ControllerModifyVolumeResponse {});
        };
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
        wait_until(
            "volume_retype",
            deadline,
            |s| format!("volume {id} is still {s}"),
            || async {
                let v = block.get_volume(id).await?;
                Ok(match v.status {
                    VolumeStatus::Retyping => Poll::Pending("retyping".into()),
                    ref s if s.is_error() => Poll::Ready(Err(s.to_string())),
                    _ if v.volume_type.as_deref() == Some(target.name.as_str()) => {
                        Poll::Ready(Ok(()))
                    }
                    _ => Poll::Ready(Err(format!(
                        "type is still {:?} (Cinder refused the retype)",
                        v.volume_type
                    ))),
                })
            },
        )
        .await?
        .map_err(|s| DriverError::Internal(format!("retyping volume {id} failed: {s}")))?;
        Ok(csi::ControllerModifyVolumeResponse {})
    }
}

/// The content source a volume was made from: a CSI snapshot id is a
/// Cinder snapshot's or a backup's.
pub(super) fn content_source(v: &Volume) -> Option<csi::VolumeContentSource> {
    use csi::volume_content_source::{SnapshotSource, Type, VolumeSource};
    let t = if let Some(s) = v.snapshot_id.as_ref().or(v.metadata.get(SOURCE_BACKUP_KEY)) {
        Type::Snapshot(SnapshotSource {
            snapshot_id: s.clone(),
        })
    } else if let Some(s) = &v.source_volid {
        Type::Volume(VolumeSource {
            volume_id: s.clone(),
        })
    } else {
        return None;
    };
    Some(csi::VolumeContentSource { r#type: Some(t) })
}

/// What the node needs to know: grow the filesystem when the volume is
/// larger than its source, and the StorageClass's legacy `fsType`.
pub(super) fn volume_context(
    v: &Volume,
    source_size: Option<i64>,
    params: &VolumeParameters,
) -> HashMap<String, String> {
    let mut c = HashMap::new();
    if let Some(s) = source_size
        && (v.size as i64) > s
    {
        c.insert(RESIZE_REQUIRED_KEY.to_string(), "true".to_string());
    }
    if let Some(fs) = params.fs_type {
        c.insert(FS_TYPE_CONTEXT_KEY.to_string(), fs.as_str().to_string());
    }
    c
}

/// The content source a CreateVolume asks for, before it is looked up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum RequestedSource {
    Empty,
    /// A CSI snapshot: a Cinder snapshot or a backup.
    Snapshot(String),
    Volume(String),
}

/// The content source, found in Cinder.
#[derive(Debug, Clone)]
pub(super) enum Source {
    Empty,
    Snapshot(Snapshot),
    Backup(Backup),
    Volume(Volume),
}

impl RequestedSource {
    fn of(r: &csi::CreateVolumeRequest) -> DriverResult<Self> {
        use csi::volume_content_source::Type;
        Ok(
            match r
                .volume_content_source
                .as_ref()
                .and_then(|s| s.r#type.as_ref())
            {
                Some(Type::Snapshot(s)) => RequestedSource::Snapshot(
                    require(&s.snapshot_id, "volume_content_source.snapshot.snapshot_id")?
                        .to_string(),
                ),
                Some(Type::Volume(v)) => RequestedSource::Volume(
                    require(&v.volume_id, "volume_content_source.volume.volume_id")?.to_string(),
                ),
                None => RequestedSource::Empty,
            },
        )
    }

    /// Whether an existing volume was made from this source.
    fn made(&self, v: &Volume) -> bool {
        let backup = v.metadata.get(SOURCE_BACKUP_KEY);
        match self {
            RequestedSource::Empty => {
                v.snapshot_id.is_none() && v.source_volid.is_none() && backup.is_none()
            }
            RequestedSource::Snapshot(id) => {
                v.snapshot_id.as_ref() == Some(id) || backup == Some(id)
            }
            RequestedSource::Volume(id) => v.source_volid.as_ref() == Some(id),
        }
    }

    /// Looks the source up: it must exist (NotFound) and be usable now
    /// (Unavailable, which the provisioner retries).
    async fn resolve(self, block: &BlockStorage) -> DriverResult<Source> {
        match self {
            RequestedSource::Empty => Ok(Source::Empty),
            RequestedSource::Snapshot(id) => {
                let missing = || DriverError::NotFound(format!("snapshot {id} does not exist"));
                if !is_uuid(&id) {
                    return Err(missing());
                }
                match block.get_snapshot(&id).await {
                    Ok(s) if s.status == SnapshotStatus::Available => {
                        return Ok(Source::Snapshot(s));
                    }
                    Ok(s) => {
                        return Err(DriverError::Unavailable(format!(
                            "snapshot {id} is {}, not available",
                            s.status
                        )));
                    }
                    Err(e) if e.is_not_found() => {}
                    Err(e) => return Err(e).context(format!("snapshot {id}")),
                }
                // snapshots of type backup are Cinder backups
                match block.get_backup(&id).await {
                    Ok(b) if b.status == BackupStatus::Available => Ok(Source::Backup(b)),
                    Ok(b) => Err(DriverError::Unavailable(format!(
                        "backup {id} is {}, not available",
                        b.status
                    ))),
                    Err(e) if e.is_not_found() => Err(missing()),
                    Err(e) => Err(e).context(format!("backup {id}")),
                }
            }
            RequestedSource::Volume(id) => {
                if !is_uuid(&id) {
                    return Err(DriverError::NotFound(format!("volume {id} does not exist")));
                }
                let v = block
                    .get_volume(&id)
                    .await
                    .context(format!("source volume {id}"))?;
                if !matches!(v.status, VolumeStatus::Available | VolumeStatus::InUse) {
                    return Err(DriverError::Unavailable(format!(
                        "source volume {id} is {}, not available",
                        v.status
                    )));
                }
                Ok(Source::Volume(v))
            }
        }
    }
}

impl Source {
    fn size_gib(&self) -> Option<i64> {
        match self {
            Source::Empty => None,
            Source::Snapshot(s) => Some(s.size as i64),
            Source::Backup(b) => Some(b.size as i64),
            Source::Volume(v) => Some(v.size as i64),
        }
    }
}
