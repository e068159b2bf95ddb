//! The CSI Controller service: Cinder volumes and snapshots, attachments
//! through Nova. Every wait is bounded by the caller's deadline; every
//! mutating call is idempotent and serialised per volume (or name).
//!
//! By RPC family: [`volumes`] (create, delete, expand, modify),
//! [`inventory`] (validate, list, get), [`attachments`] (publish,
//! unpublish, with [`repairs`] of what is stuck and the [`unanswered`]
//! detaches that may still land), [`snapshots`] (snapshots and backups), [`groups`] (the
//! GroupController: volume group snapshots), [`zones`] (where a new
//! volume goes).

mod affinity;
mod attachments;
mod backups;
mod class_metadata;
mod groups;
mod inventory;
mod repairs;
mod slots;
mod snapshots;
mod twins;
mod unanswered;
mod volumes;
mod zones;

use csi_common::errors::not_found_ok;
use std::collections::HashMap;

use csi_common::request::GIB;
use csi_common::{DriverError, DriverResult, KeyedLocks, csi_controller_service};
use openstack_client::cinder::{BlockStorage, Volume, VolumeStatus};
use openstack_client::nova::Compute;
use proto::csi::v1 as csi;
use proto::csi::v1::controller_service_capability::rpc::Type as Rpc;

use crate::TOPOLOGY_KEY;
pub use repairs::AttachmentMetrics;
use volumes::content_source;

/// Volume metadata and context keys (upstream's).
pub const CLUSTER_KEY: &str = "cinder.csi.openstack.org/cluster";
/// Beside the cluster id: the cluster's identity (its kube-system uid),
/// which the orphan tool needs before it deletes anything (ours).
pub const IDENTITY_KEY: &str = "cinder.csi.openstack.org/cluster-uid";
pub const RESIZE_REQUIRED_KEY: &str = "cinder.csi.openstack.org/resizeRequired";
/// Metadata of a volume restored from a Cinder backup: Cinder itself does
/// not show a volume's backup, and CreateVolume must name its source.
pub const SOURCE_BACKUP_KEY: &str = "cinder.csi.openstack.org/sourceBackup";
const DESCRIPTION: &str = "Created by OpenStack Cinder CSI driver";

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
    /// `[BlockStorage] node-volume-attach-limit`: the disks a server takes
    /// in all (its local ones included); the node reports the same limit.
    pub attach_limit: i64,
    /// `--stuck-attachment-secs`: a volume `reserved`, `attaching` or
    /// `detaching` this long is repaired (see [`repairs`]).
    pub stuck_after: std::time::Duration,
    /// The cluster's identity, written beside `cluster` once known.
    pub identity: csi_common::orphans::ClusterIdentity,
    /// `--pvc-annotations`: where each new volume's claim is read.
    pub claims: Option<csi_common::claim_annotations::ClaimAnnotations>,
}

#[derive(Debug, Clone)]
pub struct ControllerService {
    /// In `--cloud-name` order; the first is the default.
    clouds: Vec<Cloud>,
    opts: ControllerOptions,
    locks: KeyedLocks,
    metrics: AttachmentMetrics,
    unanswered: unanswered::UnansweredDetaches,
    slots: slots::AttachSlots,
}

fn volume_gone(s: &VolumeStatus) -> bool {
    matches!(s, VolumeStatus::Deleting) || s.as_str() == "deleted"
}

impl ControllerService {
    pub fn new(clouds: Vec<Cloud>, opts: ControllerOptions) -> Self {
        Self {
            clouds,
            opts,
            locks: KeyedLocks::default(),
            metrics: AttachmentMetrics::default(),
            unanswered: unanswered::UnansweredDetaches::default(),
            slots: slots::AttachSlots::default(),
        }
    }

    /// The attachment metrics (see [`repairs`]), to register.
    pub fn attachment_metrics(&self) -> &AttachmentMetrics {
        &self.metrics
    }

    pub fn capabilities() -> Vec<csi::ControllerServiceCapability> {
        csi_common::advertise::controller(&[
            Rpc::CreateDeleteVolume,
            Rpc::PublishUnpublishVolume,
            Rpc::ListVolumes,
            Rpc::ListVolumesPublishedNodes,
            Rpc::GetVolume,
            Rpc::VolumeCondition,
            Rpc::CreateDeleteSnapshot,
            Rpc::ListSnapshots,
            Rpc::GetSnapshot,
            Rpc::CloneVolume,
            Rpc::ExpandVolume,
            Rpc::ModifyVolume,
            Rpc::SingleNodeMultiWriter,
        ])
    }

    fn controller_capabilities(&self) -> Vec<csi::ControllerServiceCapability> {
        Self::capabilities()
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
}

csi_controller_service!(ControllerService {
    rpcs {
        rpc controller_publish_volume(ControllerPublishVolumeRequest) -> ControllerPublishVolumeResponse
            = "ControllerPublishVolume", volume_id = |r| r.volume_id.clone() => publish;
        rpc controller_unpublish_volume(ControllerUnpublishVolumeRequest) -> ControllerUnpublishVolumeResponse
            = "ControllerUnpublishVolume", volume_id = |r| r.volume_id.clone() => unpublish;
        rpc controller_modify_volume(ControllerModifyVolumeRequest) -> ControllerModifyVolumeResponse
            = "ControllerModifyVolume", volume_id = |r| r.volume_id.clone() => modify;
    }
    unimplemented {
        unimplemented get_capacity(GetCapacityRequest) -> GetCapacityResponse
            = "GetCapacity is not supported: Cinder does not report capacity per zone to projects";
    }
});
