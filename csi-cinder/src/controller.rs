//! The CSI Controller service: Cinder volumes and snapshots, attachments
//! through Nova. Every wait is bounded by the caller's deadline; every
//! mutating call is idempotent and serialised per volume (or name).

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use openstack_client::cinder::{
    BlockStorage, CreateSnapshot, CreateVolume, ListSnapshots, ListVolumes, Snapshot,
    SnapshotStatus, Volume, VolumeStatus,
};
use openstack_client::common::{Poll, poll_until};
use openstack_client::nova::Compute;
use proto::csi::v1 as csi;
use proto::csi::v1::controller_server::Controller;
use proto::csi::v1::controller_service_capability::rpc::Type as Rpc;
use tonic::{Request, Response, Status};
use tracing::Instrument;

use crate::TOPOLOGY_KEY;
use crate::errors::{Context, DriverError, DriverResult};
use crate::rpc::{
    AccessType, GIB, KeyedLocks, capability_unsupported, deadline_from, is_uuid,
    parse_capabilities, require, size_fits, size_gib, timestamp,
};

/// Volume metadata and context keys (upstream's).
pub const CLUSTER_KEY: &str = "cinder.csi.openstack.org/cluster";
pub const RESIZE_REQUIRED_KEY: &str = "cinder.csi.openstack.org/resizeRequired";
const PVC_NAME: &str = "csi.storage.k8s.io/pvc/name";
const PVC_NAMESPACE: &str = "csi.storage.k8s.io/pvc/namespace";
const PV_NAME: &str = "csi.storage.k8s.io/pv/name";
const SNAPSHOT_NAME: &str = "csi.storage.k8s.io/volumesnapshot/name";
const SNAPSHOT_NAMESPACE: &str = "csi.storage.k8s.io/volumesnapshot/namespace";
const SNAPSHOT_CONTENT_NAME: &str = "csi.storage.k8s.io/volumesnapshotcontent/name";
const DESCRIPTION: &str = "Created by OpenStack Cinder CSI driver";

/// First poll of a pending resource, and the cap of the growing interval.
const POLL_FIRST: Duration = Duration::from_millis(25);
const POLL_MAX: Duration = Duration::from_secs(2);
/// ListVolumes/ListSnapshots page size when the caller sets no limit:
/// a page at a time keeps every call short on big projects.
const DEFAULT_PAGE: u32 = 500;

/// One cloud's clients (a `[Global "name"]` section).
#[derive(Debug, Clone)]
pub struct Cloud {
    pub name: String,
    pub block: BlockStorage,
    pub compute: Compute,
}

#[derive(Debug, Clone)]
pub struct ControllerOptions {
    pub cluster: String,
    pub with_topology: bool,
    /// `[BlockStorage] ignore-volume-az`: answer the requested zone, not
    /// the volume's (for clouds whose compute and volume zones differ).
    pub ignore_volume_az: bool,
}

#[derive(Debug, Clone)]
pub struct ControllerService {
    /// In `--cloud-name` order; the first is the default.
    clouds: Vec<Cloud>,
    opts: ControllerOptions,
    locks: KeyedLocks,
}

fn volume_gone(s: &VolumeStatus) -> bool {
    matches!(s, VolumeStatus::Deleting) || s.as_str() == "deleted"
}

fn not_found_ok(r: Result<(), openstack_client::Error>) -> Result<(), openstack_client::Error> {
    match r {
        Err(e) if e.is_not_found() => Ok(()),
        other => other,
    }
}

impl ControllerService {
    pub fn new(clouds: Vec<Cloud>, opts: ControllerOptions) -> Self {
        Self {
            clouds,
            opts,
            locks: KeyedLocks::default(),
        }
    }

    pub fn capabilities() -> Vec<csi::ControllerServiceCapability> {
        [
            Rpc::CreateDeleteVolume,
            Rpc::PublishUnpublishVolume,
            Rpc::ListVolumes,
            Rpc::ListVolumesPublishedNodes,
            Rpc::GetVolume,
            Rpc::VolumeCondition,
            Rpc::CreateDeleteSnapshot,
            Rpc::ListSnapshots,
            Rpc::CloneVolume,
            Rpc::ExpandVolume,
            Rpc::ModifyVolume,
        ]
        .into_iter()
        .map(|t| csi::ControllerServiceCapability {
            r#type: Some(csi::controller_service_capability::Type::Rpc(
                csi::controller_service_capability::Rpc { r#type: t as i32 },
            )),
        })
        .collect()
    }

    /// The cloud a request's secrets select (`cloud` key), else the first.
    fn cloud(&self, secrets: &HashMap<String, String>) -> DriverResult<&Cloud> {
        match secrets.get("cloud") {
            Some(name) => self.clouds.iter().find(|c| &c.name == name).ok_or_else(|| {
                DriverError::InvalidArgument(format!(
                    "the secret's cloud {name:?} is not one of the configured --cloud-name values"
                ))
            }),
            None => self
                .clouds
                .first()
                .ok_or_else(|| DriverError::Internal("no cloud configured".into())),
        }
    }

    fn topology(&self, zone: &str) -> Vec<csi::Topology> {
        if !self.opts.with_topology || zone.is_empty() {
            return Vec::new();
        }
        vec![csi::Topology {
            segments: HashMap::from([(TOPOLOGY_KEY.to_string(), zone.to_string())]),
        }]
    }

    fn csi_volume(
        &self,
        v: &Volume,
        context: HashMap<String, String>,
        requested_zone: Option<&str>,
    ) -> csi::Volume {
        let zone = match (self.opts.ignore_volume_az, requested_zone) {
            (true, Some(z)) => z,
            _ => v.availability_zone.as_str(),
        };
        csi::Volume {
            capacity_bytes: (v.size as i64).saturating_mul(GIB),
            volume_id: v.id.clone(),
            volume_context: context,
            content_source: content_source(v),
            accessible_topology: self.topology(zone),
        }
    }

    // ------------------------------------------------------------ volumes

    async fn create_volume(
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

    async fn type_is_multiattach(
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
    async fn check_compatible(
        &self,
        block: &BlockStorage,
        v: &Volume,
        r: &csi::CreateVolumeRequest,
        volume_type: Option<&str>,
        snapshot_id: Option<&str>,
        source_volume_id: Option<&str>,
        caps: &[crate::rpc::Capability],
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

    async fn source_size(&self, block: &BlockStorage, v: &Volume) -> Option<i64> {
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
    async fn wait_volume_available(
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

    async fn delete_volume(
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

    // ---------------------------------------------------------- attachment

    async fn publish(
        &self,
        r: csi::ControllerPublishVolumeRequest,
        deadline: Instant,
    ) -> DriverResult<csi::ControllerPublishVolumeResponse> {
        let id = require(&r.volume_id, "volume_id")?;
        let node = require(&r.node_id, "node_id")?;
        let cap = r
            .volume_capability
            .as_ref()
            .ok_or_else(|| DriverError::InvalidArgument("volume_capability is required".into()))
            .and_then(crate::rpc::parse_capability)?;
        let cloud = self.cloud(&r.secrets)?;
        if !is_uuid(id) {
            return Err(DriverError::NotFound(format!("volume {id} does not exist")));
        }
        if !is_uuid(node) {
            return Err(DriverError::NotFound(format!(
                "node {node} does not exist (node ids are Nova server UUIDs)"
            )));
        }
        let _guard = self.locks.lock(id, deadline).await?;
        let block = cloud.block.with_deadline(deadline);
        let compute = cloud.compute.with_deadline(deadline);
        let v = block.get_volume(id).await.context(format!("volume {id}"))?;
        if let Some(why) = capability_unsupported(&cap, v.multiattach) {
            return Err(DriverError::InvalidArgument(why));
        }
        let attached_here = v
            .attachments
            .iter()
            .any(|a| a.server_id.as_deref() == Some(node));
        if !attached_here {
            let others: Vec<&str> = v.attached_servers().filter(|s| *s != node).collect();
            if !others.is_empty() && !v.multiattach {
                return Err(DriverError::FailedPrecondition(format!(
                    "volume {id} is attached to {others:?} and its type does not allow multi-attach"
                )));
            }
            compute
                .get_server(node)
                .await
                .context(format!("node {node}"))?;
            match v.status {
                VolumeStatus::Available | VolumeStatus::InUse => {
                    match compute.attach_volume(node, id, v.multiattach).await {
                        Ok(a) => {
                            tracing::info!(volume_id = id, node, device = ?a.device, "attach requested")
                        }
                        // attaching already (a retry of an earlier call)
                        Err(openstack_client::Error::Conflict(e)) => {
                            tracing::info!(volume_id = id, node, error = %e, "attach in progress")
                        }
                        Err(e) => {
                            return Err(e).context(format!("attaching volume {id} to {node}"));
                        }
                    }
                }
                // an earlier attempt's attach is still under way
                VolumeStatus::Attaching | VolumeStatus::Reserved => {}
                ref s => {
                    return Err(DriverError::FailedPrecondition(format!(
                        "volume {id} is {s}; cannot attach"
                    )));
                }
            }
        }
        let device = self.wait_attached(&block, id, node, deadline).await?;
        let mut context = HashMap::new();
        if let Some(d) = device {
            context.insert("DevicePath".to_string(), d);
        }
        Ok(csi::ControllerPublishVolumeResponse {
            publish_context: context,
        })
    }

    /// Waits until Cinder shows the volume in use by `node`; returns the
    /// device name Nova chose (a hint only: the node finds the device by id).
    async fn wait_attached(
        &self,
        block: &BlockStorage,
        id: &str,
        node: &str,
        deadline: Instant,
    ) -> DriverResult<Option<String>> {
        let r = poll_until("volume_attach", deadline, POLL_FIRST, POLL_MAX, || async {
            let v = block.get_volume(id).await?;
            let att = v
                .attachments
                .iter()
                .find(|a| a.server_id.as_deref() == Some(node));
            Ok(match (&v.status, att) {
                (VolumeStatus::InUse, Some(a)) => Poll::Ready(Ok(a.device.clone())),
                (s, _) if s.is_error() => Poll::Ready(Err(s.to_string())),
                // Nova rolled the attach back
                (VolumeStatus::Available, None) => {
                    Poll::Ready(Err("available (the attach failed)".to_string()))
                }
                (s, _) => Poll::Pending(s.to_string()),
            })
        })
        .await;
        match r {
            Ok(Ok(d)) => Ok(d),
            Ok(Err(s)) => Err(DriverError::Internal(format!(
                "attaching volume {id} to {node} failed: volume is {s}"
            ))),
            Err(openstack_client::Error::Timeout { last, .. }) => {
                Err(DriverError::DeadlineExceeded(format!(
                    "volume {id} is not attached to {node} yet ({}); a retry resumes waiting",
                    last.map(|e| e.to_string()).unwrap_or_default()
                )))
            }
            Err(e) => Err(e).context(format!("waiting for volume {id} to attach")),
        }
    }

    async fn unpublish(
        &self,
        r: csi::ControllerUnpublishVolumeRequest,
        deadline: Instant,
    ) -> DriverResult<csi::ControllerUnpublishVolumeResponse> {
        let id = require(&r.volume_id, "volume_id")?;
        let node = require(&r.node_id, "node_id")?;
        let cloud = self.cloud(&r.secrets)?;
        if !is_uuid(id) || !is_uuid(node) {
            // nothing of that name can be attached
            return Ok(csi::ControllerUnpublishVolumeResponse {});
        }
        let _guard = self.locks.lock(id, deadline).await?;
        let block = cloud.block.with_deadline(deadline);
        let compute = cloud.compute.with_deadline(deadline);
        let v = match block.get_volume(id).await {
            Ok(v) => v,
            Err(e) if e.is_not_found() => return Ok(csi::ControllerUnpublishVolumeResponse {}),
            Err(e) => return Err(e).context(format!("volume {id}")),
        };
        if !v
            .attachments
            .iter()
            .any(|a| a.server_id.as_deref() == Some(node))
        {
            return Ok(csi::ControllerUnpublishVolumeResponse {});
        }
        if v.status != VolumeStatus::Detaching {
            match compute.detach_volume(node, id).await {
                Ok(()) => tracing::info!(volume_id = id, node, "detach requested"),
                // the server is gone, or the attachment with it
                Err(e) if e.is_not_found() => {
                    tracing::info!(volume_id = id, node, "server or attachment gone");
                    return Ok(csi::ControllerUnpublishVolumeResponse {});
                }
                // a detach is already under way
                Err(openstack_client::Error::Conflict(e)) => {
                    tracing::info!(volume_id = id, node, error = %e, "detach in progress")
                }
                Err(e) => return Err(e).context(format!("detaching volume {id} from {node}")),
            }
        }
        let r = poll_until("volume_detach", deadline, POLL_FIRST, POLL_MAX, || async {
            let v = match block.get_volume(id).await {
                Ok(v) => v,
                Err(e) if e.is_not_found() => return Ok(Poll::Ready(())),
                Err(e) => return Err(e),
            };
            if v.attachments
                .iter()
                .any(|a| a.server_id.as_deref() == Some(node))
            {
                Ok(Poll::Pending(v.status.to_string()))
            } else {
                Ok(Poll::Ready(()))
            }
        })
        .await;
        match r {
            Ok(()) => Ok(csi::ControllerUnpublishVolumeResponse {}),
            Err(openstack_client::Error::Timeout { .. }) => Err(DriverError::DeadlineExceeded(
                format!("volume {id} is still attached to {node}; a retry resumes waiting"),
            )),
            Err(e) => Err(e).context(format!("waiting for volume {id} to detach")),
        }
    }

    // ------------------------------------------------------------- queries

    async fn validate(
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
    async fn list_volumes(
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

    async fn get_volume(
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

    // ----------------------------------------------------------- snapshots

    async fn create_snapshot(
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

    async fn delete_snapshot(
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

    async fn list_snapshots(
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

    // ---------------------------------------------------------- expansion

    async fn expand(
        &self,
        r: csi::ControllerExpandVolumeRequest,
        deadline: Instant,
    ) -> DriverResult<csi::ControllerExpandVolumeResponse> {
        let id = require(&r.volume_id, "volume_id")?;
        let range = r
            .capacity_range
            .as_ref()
            .ok_or_else(|| DriverError::InvalidArgument("capacity_range is required".into()))?;
        if range.required_bytes <= 0 && range.limit_bytes <= 0 {
            return Err(DriverError::InvalidArgument(
                "capacity_range needs required_bytes or limit_bytes".into(),
            ));
        }
        let want = size_gib(Some(range))?;
        let block_mode = match &r.volume_capability {
            Some(c) => crate::rpc::parse_capability(c)?.access_type == AccessType::Block,
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

    async fn modify(
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

fn content_source(v: &Volume) -> Option<csi::VolumeContentSource> {
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
fn resize_context(v: &Volume, source_size: Option<i64>) -> HashMap<String, String> {
    let mut c = HashMap::new();
    if let Some(s) = source_size
        && (v.size as i64) > s
    {
        c.insert(RESIZE_REQUIRED_KEY.to_string(), "true".to_string());
    }
    c
}

fn condition(v: &Volume) -> csi::VolumeCondition {
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

fn csi_snapshot(s: &Snapshot) -> csi::Snapshot {
    csi::Snapshot {
        size_bytes: (s.size as i64).saturating_mul(GIB),
        snapshot_id: s.id.clone(),
        source_volume_id: s.volume_id.clone(),
        creation_time: timestamp(s.created_at.as_deref()),
        ready_to_use: s.status == SnapshotStatus::Available,
        group_snapshot_id: String::new(),
    }
}

/// Runs a handler in a span named after the RPC and carrying the id it
/// works on, and converts its error once.
macro_rules! handle {
    ($self:ident, $req:ident, $rpc:literal, $field:ident = $id:expr, $method:ident) => {{
        let deadline = deadline_from($req.metadata());
        let r = $req.into_inner();
        let span = tracing::info_span!($rpc, $field = %$id(&r));
        $self.$method(r, deadline).instrument(span).await.map(Response::new).map_err(Status::from)
    }};
}

#[tonic::async_trait]
impl Controller for ControllerService {
    async fn create_volume(
        &self,
        req: Request<csi::CreateVolumeRequest>,
    ) -> Result<Response<csi::CreateVolumeResponse>, Status> {
        handle!(
            self,
            req,
            "CreateVolume",
            name = |r: &csi::CreateVolumeRequest| r.name.clone(),
            create_volume
        )
    }
    async fn delete_volume(
        &self,
        req: Request<csi::DeleteVolumeRequest>,
    ) -> Result<Response<csi::DeleteVolumeResponse>, Status> {
        handle!(
            self,
            req,
            "DeleteVolume",
            volume_id = |r: &csi::DeleteVolumeRequest| r.volume_id.clone(),
            delete_volume
        )
    }
    async fn controller_publish_volume(
        &self,
        req: Request<csi::ControllerPublishVolumeRequest>,
    ) -> Result<Response<csi::ControllerPublishVolumeResponse>, Status> {
        handle!(
            self,
            req,
            "ControllerPublishVolume",
            volume_id = |r: &csi::ControllerPublishVolumeRequest| r.volume_id.clone(),
            publish
        )
    }
    async fn controller_unpublish_volume(
        &self,
        req: Request<csi::ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<csi::ControllerUnpublishVolumeResponse>, Status> {
        handle!(
            self,
            req,
            "ControllerUnpublishVolume",
            volume_id = |r: &csi::ControllerUnpublishVolumeRequest| r.volume_id.clone(),
            unpublish
        )
    }
    async fn validate_volume_capabilities(
        &self,
        req: Request<csi::ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<csi::ValidateVolumeCapabilitiesResponse>, Status> {
        handle!(
            self,
            req,
            "ValidateVolumeCapabilities",
            volume_id = |r: &csi::ValidateVolumeCapabilitiesRequest| r.volume_id.clone(),
            validate
        )
    }
    async fn list_volumes(
        &self,
        req: Request<csi::ListVolumesRequest>,
    ) -> Result<Response<csi::ListVolumesResponse>, Status> {
        handle!(
            self,
            req,
            "ListVolumes",
            token = |r: &csi::ListVolumesRequest| r.starting_token.clone(),
            list_volumes
        )
    }
    async fn get_capacity(
        &self,
        _req: Request<csi::GetCapacityRequest>,
    ) -> Result<Response<csi::GetCapacityResponse>, Status> {
        Err(Status::unimplemented(
            "GetCapacity is not supported: Cinder does not report capacity per zone to projects",
        ))
    }
    async fn controller_get_capabilities(
        &self,
        _req: Request<csi::ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<csi::ControllerGetCapabilitiesResponse>, Status> {
        Ok(Response::new(csi::ControllerGetCapabilitiesResponse {
            capabilities: Self::capabilities(),
        }))
    }
    async fn create_snapshot(
        &self,
        req: Request<csi::CreateSnapshotRequest>,
    ) -> Result<Response<csi::CreateSnapshotResponse>, Status> {
        handle!(
            self,
            req,
            "CreateSnapshot",
            name = |r: &csi::CreateSnapshotRequest| r.name.clone(),
            create_snapshot
        )
    }
    async fn delete_snapshot(
        &self,
        req: Request<csi::DeleteSnapshotRequest>,
    ) -> Result<Response<csi::DeleteSnapshotResponse>, Status> {
        handle!(
            self,
            req,
            "DeleteSnapshot",
            snapshot_id = |r: &csi::DeleteSnapshotRequest| r.snapshot_id.clone(),
            delete_snapshot
        )
    }
    async fn list_snapshots(
        &self,
        req: Request<csi::ListSnapshotsRequest>,
    ) -> Result<Response<csi::ListSnapshotsResponse>, Status> {
        handle!(
            self,
            req,
            "ListSnapshots",
            volume_id = |r: &csi::ListSnapshotsRequest| r.source_volume_id.clone(),
            list_snapshots
        )
    }
    async fn controller_expand_volume(
        &self,
        req: Request<csi::ControllerExpandVolumeRequest>,
    ) -> Result<Response<csi::ControllerExpandVolumeResponse>, Status> {
        handle!(
            self,
            req,
            "ControllerExpandVolume",
            volume_id = |r: &csi::ControllerExpandVolumeRequest| r.volume_id.clone(),
            expand
        )
    }
    async fn controller_get_volume(
        &self,
        req: Request<csi::ControllerGetVolumeRequest>,
    ) -> Result<Response<csi::ControllerGetVolumeResponse>, Status> {
        handle!(
            self,
            req,
            "ControllerGetVolume",
            volume_id = |r: &csi::ControllerGetVolumeRequest| r.volume_id.clone(),
            get_volume
        )
    }
    async fn controller_modify_volume(
        &self,
        req: Request<csi::ControllerModifyVolumeRequest>,
    ) -> Result<Response<csi::ControllerModifyVolumeResponse>, Status> {
        handle!(
            self,
            req,
            "ControllerModifyVolume",
            volume_id = |r: &csi::ControllerModifyVolumeRequest| r.volume_id.clone(),
            modify
        )
    }
}
