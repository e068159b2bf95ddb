//! The CSI Controller service: Manila shares and snapshots, access rules.
//! Every wait is bounded by the caller's deadline; every mutating call is
//! idempotent and serialised per share (or name).
//!
//! By RPC family: [`volumes`] (create, delete, validate, list, get,
//! expand, capacity), [`access`] (the rules a share is created with),
//! [`snapshots`], [`backed`] (read-only volumes that are a snapshot),
//! [`groups`] (group snapshots through share groups), [`sources`] (what
//! a new share is made from), [`share_types`].

mod access;
mod backed;
mod groups;
mod inventory;
mod share_types;
mod snapshots;
mod sources;
mod twins;
mod volumes;

use std::collections::HashMap;
use std::sync::Arc;

use csi_common::credentials::{Credentials, Source};
use csi_common::request::GIB;
use csi_common::{DriverResult, KeyedLocks, csi_controller_service};
use openstack_client::manila::{Share, SharedFileSystems};
use proto::csi::v1 as csi;
use proto::csi::v1::controller_service_capability::rpc::Type as Rpc;

use crate::TOPOLOGY_KEY;
use crate::runtime_config::RuntimeConfigFile;
use crate::share_protocol::ShareProtocol;
use crate::shares::CLONE_OF_KEY;

#[derive(Debug, Clone)]
pub struct ControllerOptions {
    pub protocol: ShareProtocol,
    pub cluster_id: String,
    pub with_topology: bool,
    /// `--default-nfs-share-client`, already checked.
    pub default_nfs_share_clients: Vec<String>,
    /// The cluster's identity, written beside `cluster_id` once known.
    pub identity: csi_common::orphans::ClusterIdentity,
    /// `--pvc-annotations`: where each new share's claim is read.
    pub claims: Option<csi_common::claim_annotations::ClaimAnnotations>,
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
            Rpc::GetSnapshot,
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
        csi_common::advertise::controller(&rpcs)
    }

    fn controller_capabilities(&self) -> Vec<csi::ControllerServiceCapability> {
        Self::capabilities(self.credentials.has_own())
    }

    /// The Manila client for a call's secrets (or the plugin's own).
    fn manila(&self, secrets: &HashMap<String, String>) -> DriverResult<SharedFileSystems> {
        let (m, source) = self.credentials.client_for(secrets)?;
        if let Source::Secrets(label) = &source {
            tracing::debug!(credentials = %label, "credentials from the call's secrets");
        }
        Ok(m)
    }

    /// A call's secrets when it has some, else the plugin's own
    /// credentials (calls whose secrets are optional).
    fn manila_or_own(&self, secrets: &HashMap<String, String>) -> DriverResult<SharedFileSystems> {
        if secrets.is_empty() && self.credentials.has_own() {
            self.own_manila()
        } else {
            self.manila(secrets)
        }
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

csi_controller_service!(ControllerService {
    rpcs {
        rpc get_capacity(GetCapacityRequest) -> GetCapacityResponse
            = "GetCapacity", parameters = |r| r.parameters.len() => capacity;
    }
    unimplemented {
        unimplemented controller_publish_volume(ControllerPublishVolumeRequest) -> ControllerPublishVolumeResponse
            = "Manila shares are not attached: the node mounts them (attachRequired: false)";
        unimplemented controller_unpublish_volume(ControllerUnpublishVolumeRequest) -> ControllerUnpublishVolumeResponse
            = "Manila shares are not attached: the node mounts them (attachRequired: false)";
        unimplemented controller_modify_volume(ControllerModifyVolumeRequest) -> ControllerModifyVolumeResponse
            = "ControllerModifyVolume is not supported by the Manila driver";
    }
});
