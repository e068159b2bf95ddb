//! `cinder-csi-plugin`'s controller killed (SIGKILL) between two cloud
//! calls of each mutating RPC: after its k-th call of CreateVolume,
//! DeleteVolume, ControllerPublishVolume, ControllerUnpublishVolume,
//! ControllerExpandVolume and CreateSnapshot, for every k the RPC makes.
//! The cloud holds the k-th answer while the plugin is killed (the work
//! is done; the plugin never learns it), a new plugin starts, and the
//! RPC is sent again as the sidecar would until it answers OK. Then what
//! the cloud holds must be what one fault-free call leaves: one volume
//! per name, one attachment, the size asked, one snapshot per name,
//! nothing left of a deletion. Tests needing root return early without it.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::collections::HashMap;
use std::time::Duration;

use csi_sanity::harness::crash::{Subject, killed_after_each_call};
use proto::csi::v1 as csi;
use proto::csi::v1::controller_client::ControllerClient;
use proto::csi::v1::volume_capability::access_mode::Mode;

mod common;
use common::*;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rpc {
    CreateVolume,
    DeleteVolume,
    Publish,
    Unpublish,
    Expand,
    CreateSnapshot,
}

/// What one run of an RPC works on.
struct Target {
    /// The volume or snapshot name the RPC creates.
    name: String,
    /// The volume it works on (None for CreateVolume).
    volume: Option<String>,
}

fn cap() -> csi::VolumeCapability {
    mount_cap("ext4", Mode::SingleNodeWriter)
}

/// A fresh volume in the state `rpc` starts from.
async fn prepare(e: &mut Env, rpc: Rpc, run: &str) -> Target {
    let name = format!("{rpc:?}-{run}").to_lowercase();
    if rpc == Rpc::CreateVolume {
        return Target { name, volume: None };
    }
    let v = e.create(&format!("{name}-volume"), cap(), 1).await;
    if rpc == Rpc::Unpublish {
        e.publish(&v.volume_id, cap()).await;
    }
    Target {
        name,
        volume: Some(v.volume_id),
    }
}

async fn call(
    c: &mut ControllerClient<tonic::transport::Channel>,
    e: &Env,
    rpc: Rpc,
    t: &Target,
) -> Result<(), tonic::Status> {
    let volume_id = t.volume.clone().unwrap_or_default();
    let node_id = e.h.node_id.clone();
    let timeout = Duration::from_secs(30);
    match rpc {
        Rpc::CreateVolume => c
            .create_volume(timed(create_req(&t.name, cap(), 1), timeout))
            .await
            .map(drop),
        Rpc::DeleteVolume => c
            .delete_volume(timed(
                csi::DeleteVolumeRequest {
                    volume_id,
                    ..Default::default()
                },
                timeout,
            ))
            .await
            .map(drop),
        Rpc::Publish => c
            .controller_publish_volume(timed(
                csi::ControllerPublishVolumeRequest {
                    volume_id,
                    node_id,
                    volume_capability: Some(cap()),
                    ..Default::default()
                },
                timeout,
            ))
            .await
            .map(drop),
        Rpc::Unpublish => c
            .controller_unpublish_volume(timed(
                csi::ControllerUnpublishVolumeRequest {
                    volume_id,
                    node_id,
                    secrets: HashMap::new(),
                },
                timeout,
            ))
            .await
            .map(drop),
        Rpc::Expand => c
            .controller_expand_volume(timed(
                csi::ControllerExpandVolumeRequest {
                    volume_id,
                    capacity_range: Some(csi::CapacityRange {
                        required_bytes: 2 * GIB,
                        limit_bytes: 0,
                    }),
                    volume_capability: Some(cap()),
                    ..Default::default()
                },
                timeout,
            ))
            .await
            .map(drop),
        Rpc::CreateSnapshot => c
            .create_snapshot(timed(snapshot_req(&volume_id, &t.name, &[]), timeout))
            .await
            .map(drop),
    }
}

/// What one fault-free call leaves, or what differs from it.
async fn left_as_one_call_leaves(e: &Env, rpc: Rpc, t: &Target) -> Result<(), String> {
    let node = e.h.node_id.clone();
    let volume = t.volume.as_deref().unwrap_or_default();
    let attached_to_node = |id: &str| {
        let nova = admin_nova(&e.h);
        let (id, node) = (id.to_string(), node.clone());
        async move {
            nova.list_volume_attachments(&node)
                .await
                .unwrap()
                .iter()
                .filter(|a| a.volume_id == id)
                .count()
        }
    };
    match rpc {
        Rpc::CreateVolume => {
            let named = e.named(&t.name).await;
            let statuses: Vec<String> = named.iter().map(|v| v.status.to_string()).collect();
            if statuses != ["available"] {
                return Err(format!("volumes named {}: {statuses:?}", t.name));
            }
        }
        Rpc::DeleteVolume => {
            if let Ok(v) = e.cinder.get_volume(volume).await
                && v.status.as_str() != "deleting"
            {
                return Err(format!("volume {volume} is {}", v.status));
            }
        }
        Rpc::Publish | Rpc::Unpublish => {
            let v = e.cinder.get_volume(volume).await.unwrap();
            let servers: Vec<String> = v
                .attachments
                .iter()
                .filter_map(|a| a.server_id.clone())
                .collect();
            let in_nova = attached_to_node(volume).await;
            let want = if rpc == Rpc::Publish {
                (vec![node.clone()], "in-use", 1)
            } else {
                (vec![], "available", 0)
            };
            if (servers.clone(), v.status.as_str(), in_nova) != want {
                return Err(format!(
                    "Cinder: {servers:?} {}; Nova lists it {in_nova} times on the node",
                    v.status
                ));
            }
        }
        Rpc::Expand => {
            let v = e.cinder.get_volume(volume).await.unwrap();
            if (v.size, v.status.as_str()) != (2, "available") {
                return Err(format!("{} GiB, {}", v.size, v.status));
            }
        }
        Rpc::CreateSnapshot => {
            let named: Vec<String> = e
                .cinder
                .list_snapshots(&Default::default())
                .await
                .unwrap()
                .items
                .into_iter()
                .filter(|s| s.name == t.name)
                .map(|s| s.status.to_string())
                .collect();
            if named != ["available"] {
                return Err(format!("snapshots named {}: {named:?}", t.name));
            }
        }
    }
    Ok(())
}

/// One RPC of the Cinder controller, crashed at each of its cloud calls.
struct Crashing {
    e: Env,
    rpc: Rpc,
}

impl Subject for Crashing {
    type Target = Target;

    fn emulator(&self) -> std::sync::Arc<openstack_emulator::Emulator> {
        self.e.h.emulator.clone()
    }

    async fn prepare(&mut self, run: &str) -> Target {
        prepare(&mut self.e, self.rpc, run).await
    }

    async fn call(&self, t: &Target) -> Result<(), tonic::Status> {
        call(&mut self.e.c.clone(), &self.e, self.rpc, t).await
    }

    async fn left_as_one_call_leaves(&self, t: &Target) -> Result<(), String> {
        left_as_one_call_leaves(&self.e, self.rpc, t).await
    }

    async fn restart(&mut self) {
        self.e.h.restart_plugin().await.unwrap();
        csi_sanity::harness::wait_until_ready(&self.e.h.socket)
            .await
            .unwrap();
        let ch = plugin_runtime::connect_unix(&self.e.h.socket)
            .await
            .unwrap();
        self.e.c = ControllerClient::new(ch.clone());
        self.e.n = proto::csi::v1::node_client::NodeClient::new(ch);
    }
}

#[tokio::test]
async fn a_controller_killed_between_two_cloud_calls_leaves_what_one_call_leaves() {
    if !root() {
        return;
    }
    let mut s = Crashing {
        e: env().await,
        rpc: Rpc::CreateVolume,
    };
    let mut broken = Vec::new();
    for rpc in [
        Rpc::CreateVolume,
        Rpc::CreateSnapshot,
        Rpc::Expand,
        Rpc::Publish,
        Rpc::Unpublish,
        Rpc::DeleteVolume,
    ] {
        s.rpc = rpc;
        let r = killed_after_each_call(&mut s).await;
        println!(
            "{rpc:?}: {} cloud calls; killed {} times, after each, then sent again: {} left other than one call leaves",
            r.calls,
            r.kills,
            r.broken.len()
        );
        broken.extend(r.broken.into_iter().map(|b| format!("{rpc:?} {b}")));
    }
    assert!(broken.is_empty(), "{broken:#?}");
}
