//! The CSI Controller service: Manila shares and snapshots, access rules.
//! Every wait is bounded by the caller's deadline; every mutating call is
//! idempotent and serialised per share (or name).
//!
//! By RPC family: [`volumes`] (create, delete, validate, list, get,
//! expand, capacity), [`access`] (the rules a share is created with),
//! [`snapshots`].

mod access;
mod snapshots;
mod volumes;

use std::collections::HashMap;
use std::sync::Arc;

use csi_common::credentials::{Credentials, Source};
use csi_common::request::GIB;
use csi_common::{DriverResult, KeyedLocks, serve_rpc};
use openstack_client::manila::{Share, SharedFileSystems};
use proto::csi::v1 as csi;
use proto::csi::v1::controller_server::Controller;
use proto::csi::v1::controller_service_capability::rpc::Type as Rpc;
use tonic::{Request, Response, Status};

use crate::TOPOLOGY_KEY;
use crate::options::ShareProtocol;
use crate::runtime_config::RuntimeConfigFile;
use crate::shares::CLONE_OF_KEY;

#[derive(Debug, Clone)]
pub struct ControllerOptions {
    pub protocol: ShareProtocol,
    pub cluster_id: String,
    pub with_topology: bool,
    /// `--default-nfs-share-client`, already checked.
    pub default_nfs_share_clients: Vec<String>,
}

#[derive(Debug, Clone)]
pub struct ControllerService {
    credentials: Arc<Credentials<SharedFileSystems>>,
    runtime: Arc<RuntimeConfigFile>,
    opts: ControllerOptions,
    locks: KeyedLocks,
}

impl ControllerService {
    pub fn new(
        credentials: Arc<Credentials<SharedFileSystems>>,
        runtime: Arc<RuntimeConfigFile>,
        opts: ControllerOptions,
    ) -> Self {
        Self {
            credentials,
            runtime,
            opts,
            locks: KeyedLocks::default(),
        }
    }

    /// What is served: calls that carry no secrets (ListVolumes,
    /// ControllerGetVolume, GetCapacity) only with the plugin's own
    /// credentials.
    pub fn capabilities(own_credentials: bool) -> Vec<csi::ControllerServiceCapability> {
        let mut rpcs = vec![
            Rpc::CreateDeleteVolume,
            Rpc::CreateDeleteSnapshot,
            Rpc::ListSnapshots,
            Rpc::CloneVolume,
            Rpc::ExpandVolume,
            Rpc::SingleNodeMultiWriter,
        ];
        if own_credentials {
            rpcs.extend([
                Rpc::ListVolumes,
                Rpc::GetVolume,
                Rpc::VolumeCondition,
                Rpc::GetCapacity,
            ]);
        }
        rpcs.into_iter()
            .map(|t| csi::ControllerServiceCapability {
                r#type: Some(csi::controller_service_capability::Type::Rpc(
                    csi::controller_service_capability::Rpc { r#type: t as i32 },
                )),
            })
            .collect()
    }

    /// The Manila client for a call's secrets (or the plugin's own).
    fn manila(&self, secrets: &HashMap<String, String>) -> DriverResult<SharedFileSystems> {
        let (m, source) = self.credentials.client_for(secrets)?;
        if let Source::Secrets(label) = &source {
            tracing::debug!(credentials = %label, "credentials from the call's secrets");
        }
        Ok(m)
    }

    /// The plugin's own client, for calls without secrets.
    fn own_manila(&self) -> DriverResult<SharedFileSystems> {
        self.credentials.own().map(|(m, _)| m)
    }

    fn topology(&self, zone: Option<&str>) -> Vec<csi::Topology> {
        match zone {
            Some(z) if self.opts.with_topology && !z.is_empty() => vec![csi::Topology {
                segments: HashMap::from([(TOPOLOGY_KEY.to_string(), z.to_string())]),
            }],
            _ => Vec::new(),
        }
    }

    /// A share as a CSI volume (list and get answers).
    fn csi_volume(&self, s: &Share) -> csi::Volume {
        csi::Volume {
            capacity_bytes: (s.size as i64).saturating_mul(GIB),
            volume_id: s.id.clone(),
            volume_context: HashMap::new(),
            content_source: content_source(s),
            accessible_topology: self.topology(s.availability_zone.as_deref()),
        }
    }
}

/// Where a share's content came from: a clone's source share, else the
/// snapshot it was made from.
fn content_source(s: &Share) -> Option<csi::VolumeContentSource> {
    use csi::volume_content_source::{SnapshotSource, Type, VolumeSource};
    let t = if let Some(v) = s.metadata.get(CLONE_OF_KEY) {
        Type::Volume(VolumeSource {
            volume_id: v.clone(),
        })
    } else {
        Type::Snapshot(SnapshotSource {
            snapshot_id: s.snapshot_id.clone()?,
        })
    };
    Some(csi::VolumeContentSource { r#type: Some(t) })
}

#[tonic::async_trait]
impl Controller for ControllerService {
    async fn create_volume(
        &self,
        req: Request<csi::CreateVolumeRequest>,
    ) -> Result<Response<csi::CreateVolumeResponse>, Status> {
        serve_rpc!(
            self,
            req,
            "CreateVolume",
            volume_name = |r: &csi::CreateVolumeRequest| r.name.clone(),
            create_volume
        )
    }
    async fn delete_volume(
        &self,
        req: Request<csi::DeleteVolumeRequest>,
    ) -> Result<Response<csi::DeleteVolumeResponse>, Status> {
        serve_rpc!(
            self,
            req,
            "DeleteVolume",
            volume_id = |r: &csi::DeleteVolumeRequest| r.volume_id.clone(),
            delete_volume
        )
    }
    async fn controller_publish_volume(
        &self,
        _req: Request<csi::ControllerPublishVolumeRequest>,
    ) -> Result<Response<csi::ControllerPublishVolumeResponse>, Status> {
        Err(Status::unimplemented(
            "Manila shares are not attached: the node mounts them (attachRequired: false)",
        ))
    }
    async fn controller_unpublish_volume(
        &self,
        _req: Request<csi::ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<csi::ControllerUnpublishVolumeResponse>, Status> {
        Err(Status::unimplemented(
            "Manila shares are not attached: the node mounts them (attachRequired: false)",
        ))
    }
    async fn validate_volume_capabilities(
        &self,
        req: Request<csi::ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<csi::ValidateVolumeCapabilitiesResponse>, Status> {
        serve_rpc!(
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
        serve_rpc!(
            self,
            req,
            "ListVolumes",
            token = |r: &csi::ListVolumesRequest| r.starting_token.clone(),
            list_volumes
        )
    }
    async fn get_capacity(
        &self,
        req: Request<csi::GetCapacityRequest>,
    ) -> Result<Response<csi::GetCapacityResponse>, Status> {
        serve_rpc!(
            self,
            req,
            "GetCapacity",
            parameters = |r: &csi::GetCapacityRequest| r.parameters.len(),
            capacity
        )
    }
    async fn controller_get_capabilities(
        &self,
        _req: Request<csi::ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<csi::ControllerGetCapabilitiesResponse>, Status> {
        Ok(Response::new(csi::ControllerGetCapabilitiesResponse {
            capabilities: Self::capabilities(self.credentials.has_own()),
        }))
    }
    async fn create_snapshot(
        &self,
        req: Request<csi::CreateSnapshotRequest>,
    ) -> Result<Response<csi::CreateSnapshotResponse>, Status> {
        serve_rpc!(
            self,
            req,
            "CreateSnapshot",
            snapshot_name = |r: &csi::CreateSnapshotRequest| r.name.clone(),
            create_snapshot
        )
    }
    async fn delete_snapshot(
        &self,
        req: Request<csi::DeleteSnapshotRequest>,
    ) -> Result<Response<csi::DeleteSnapshotResponse>, Status> {
        serve_rpc!(
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
        serve_rpc!(
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
        serve_rpc!(
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
        serve_rpc!(
            self,
            req,
            "ControllerGetVolume",
            volume_id = |r: &csi::ControllerGetVolumeRequest| r.volume_id.clone(),
            get_volume
        )
    }
    async fn controller_modify_volume(
        &self,
        _req: Request<csi::ControllerModifyVolumeRequest>,
    ) -> Result<Response<csi::ControllerModifyVolumeResponse>, Status> {
        Err(Status::unimplemented(
            "ControllerModifyVolume is not supported by the Manila driver",
        ))
    }
}
