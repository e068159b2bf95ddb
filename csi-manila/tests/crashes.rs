//! `manila-csi-plugin`'s controller killed (SIGKILL) between two cloud
//! calls of each mutating RPC (CreateVolume with its access rule,
//! DeleteVolume, ControllerExpandVolume, CreateSnapshot), after each of
//! its calls in turn: the cloud holds that answer while the plugin is
//! killed, a new plugin starts, and the RPC is sent again as the sidecar
//! would until it answers OK. What Manila holds must then be what one
//! fault-free call leaves: one share per name with one access rule, the
//! size asked, one snapshot per name, nothing left of a deletion.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::time::Duration;

use csi_sanity::harness::crash::{Subject, killed_after_each_call};
use proto::csi::v1 as csi;
use proto::csi::v1::controller_client::ControllerClient;

mod common;
use common::*;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rpc {
    CreateVolume,
    DeleteVolume,
    Expand,
    CreateSnapshot,
}

struct Target {
    name: String,
    share: Option<String>,
}

async fn prepare(e: &mut Env, rpc: Rpc, run: &str) -> Target {
    let name = format!("{rpc:?}-{run}").to_lowercase();
    if rpc == Rpc::CreateVolume {
        return Target { name, share: None };
    }
    let v = e.create(&format!("{name}-share"), 1, &[]).await;
    Target {
        name,
        share: Some(v.volume_id),
    }
}

async fn call(
    c: &mut ControllerClient<tonic::transport::Channel>,
    e: &Env,
    rpc: Rpc,
    t: &Target,
) -> Result<(), tonic::Status> {
    let share = t.share.clone().unwrap_or_default();
    let timeout = Duration::from_secs(30);
    match rpc {
        Rpc::CreateVolume => c
            .create_volume(timed(e.create_req(&t.name, 1, &[]), timeout))
            .await
            .map(drop),
        Rpc::DeleteVolume => c
            .delete_volume(timed(
                csi::DeleteVolumeRequest {
                    volume_id: share,
                    secrets: e.secrets.clone(),
                },
                timeout,
            ))
            .await
            .map(drop),
        Rpc::Expand => c
            .controller_expand_volume(timed(
                csi::ControllerExpandVolumeRequest {
                    volume_id: share,
                    capacity_range: Some(csi::CapacityRange {
                        required_bytes: 2 * GIB,
                        limit_bytes: 0,
                    }),
                    volume_capability: Some(rwx()),
                    secrets: e.secrets.clone(),
                },
                timeout,
            ))
            .await
            .map(drop),
        Rpc::CreateSnapshot => c
            .create_snapshot(timed(
                csi::CreateSnapshotRequest {
                    source_volume_id: share,
                    name: t.name.clone(),
                    secrets: e.secrets.clone(),
                    ..Default::default()
                },
                timeout,
            ))
            .await
            .map(drop),
    }
}

async fn left_as_one_call_leaves(e: &Env, rpc: Rpc, t: &Target) -> Result<(), String> {
    let share = t.share.as_deref().unwrap_or_default();
    match rpc {
        Rpc::CreateVolume => {
            let named = e.manila.list_shares_named(&t.name).await.unwrap();
            let statuses: Vec<String> = named.iter().map(|s| s.status.to_string()).collect();
            if statuses != ["available"] {
                return Err(format!("shares named {}: {statuses:?}", t.name));
            }
            let rules = e.manila.list_access_rules(&named[0].id).await.unwrap();
            if rules.len() != 1 {
                return Err(format!("{} access rules: {rules:?}", rules.len()));
            }
        }
        Rpc::DeleteVolume => {
            if let Ok(s) = e.manila.get_share(share).await
                && !s.status.to_string().starts_with("deleting")
            {
                return Err(format!("share {share} is {}", s.status));
            }
        }
        Rpc::Expand => {
            let s = e.manila.get_share(share).await.unwrap();
            if (s.size, s.status.to_string().as_str()) != (2, "available") {
                return Err(format!("{} GiB, {}", s.size, s.status));
            }
        }
        Rpc::CreateSnapshot => {
            let named: Vec<String> = e
                .manila
                .list_snapshots_named(&t.name)
                .await
                .unwrap()
                .iter()
                .map(|s| s.status.to_string())
                .collect();
            if named != ["available"] {
                return Err(format!("snapshots named {}: {named:?}", t.name));
            }
        }
    }
    Ok(())
}

/// One RPC of the Manila controller, crashed at each of its cloud calls.
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
        e: env("CEPHFS").await,
        rpc: Rpc::CreateVolume,
    };
    let mut broken = Vec::new();
    for rpc in [
        Rpc::CreateVolume,
        Rpc::CreateSnapshot,
        Rpc::Expand,
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
