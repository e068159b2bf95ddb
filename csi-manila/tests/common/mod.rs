//! What the driver's test programs share: the plugin against the
//! emulator's Manila (node calls up to the mount(8) boundary through
//! stand-in helpers in a private mount namespace; see
//! `csi_sanity::harness::manila`), the requests they send, and helpers.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use csi_sanity::harness::{ManilaOnEmulator, ManilaOptions};
use openstack_client::config::{CloudConf, ConfigEnv};
use openstack_client::manila::SharedFileSystems;
use openstack_client::{Session, SessionOptions};
use proto::csi::v1 as csi;
use proto::csi::v1::controller_client::ControllerClient;
use proto::csi::v1::node_client::NodeClient;
use proto::csi::v1::volume_capability::access_mode::Mode;
use tonic::transport::Channel;

pub const BIN: &str = env!("CARGO_BIN_EXE_manila-csi-plugin");

pub const GIB: i64 = 1 << 30;

pub fn root() -> bool {
    openstack_emulator::preconditions::root("mount namespaces, mounts")
}

pub struct Env {
    pub h: ManilaOnEmulator,
    pub c: ControllerClient<Channel>,
    pub n: NodeClient<Channel>,
    /// The member's view of Manila (the plugin acts as the member).
    pub manila: SharedFileSystems,
    pub secrets: HashMap<String, String>,
}

pub async fn env_with(protocol: &str, f: impl FnOnce(&mut ManilaOptions)) -> Env {
    let mut o = ManilaOptions::new(BIN, protocol);
    o.stand_ins = nix::unistd::geteuid().is_root();
    f(&mut o);
    let h = ManilaOnEmulator::start(o).await.unwrap();
    let ch = plugin_runtime::connect_unix(&h.socket).await.unwrap();
    csi_sanity::harness::wait_until_ready(&h.socket)
        .await
        .unwrap();
    let conf = CloudConf::from_texts(
        &[("c".into(), h.emulator.cloud_conf())],
        ConfigEnv::default(),
    )
    .unwrap();
    let manila = SharedFileSystems::new(
        Session::new(conf.cloud("member").unwrap(), SessionOptions::default()).unwrap(),
    );
    let secrets = h.member_secrets();
    Env {
        c: ControllerClient::new(ch.clone()),
        n: NodeClient::new(ch),
        h,
        manila,
        secrets,
    }
}

pub async fn env(protocol: &str) -> Env {
    env_with(protocol, |_| {}).await
}

pub fn mount_cap(mode: Mode, flags: &[&str]) -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_type: Some(csi::volume_capability::AccessType::Mount(
            csi::volume_capability::MountVolume {
                fs_type: String::new(),
                mount_flags: flags.iter().map(|s| s.to_string()).collect(),
                volume_mount_group: String::new(),
            },
        )),
        access_mode: Some(csi::volume_capability::AccessMode { mode: mode as i32 }),
    }
}

pub fn rwx() -> csi::VolumeCapability {
    mount_cap(Mode::MultiNodeMultiWriter, &[])
}

pub fn params(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

pub fn timed<T>(msg: T, timeout: Duration) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.set_timeout(timeout);
    r
}

impl Env {
    pub fn create_req(&self, name: &str, gib: i64, p: &[(&str, &str)]) -> csi::CreateVolumeRequest {
        csi::CreateVolumeRequest {
            name: name.into(),
            capacity_range: Some(csi::CapacityRange {
                required_bytes: gib * GIB,
                limit_bytes: 0,
            }),
            volume_capabilities: vec![rwx()],
            parameters: params(p),
            secrets: self.secrets.clone(),
            ..Default::default()
        }
    }

    pub async fn create(&mut self, name: &str, gib: i64, p: &[(&str, &str)]) -> csi::Volume {
        let req = self.create_req(name, gib, p);
        self.c
            .create_volume(req)
            .await
            .unwrap_or_else(|s| panic!("CreateVolume {name}: {s}"))
            .into_inner()
            .volume
            .unwrap()
    }

    /// A snapshot of the volume `source`, through the plugin.
    pub async fn snapshot(&mut self, source: &str, name: &str) -> csi::Snapshot {
        self.c
            .create_snapshot(csi::CreateSnapshotRequest {
                source_volume_id: source.into(),
                name: name.into(),
                secrets: self.secrets.clone(),
                parameters: HashMap::new(),
            })
            .await
            .unwrap_or_else(|s| panic!("CreateSnapshot {name}: {s}"))
            .into_inner()
            .snapshot
            .unwrap()
    }

    pub async fn delete(&mut self, id: &str) -> Result<(), tonic::Status> {
        self.c
            .delete_volume(csi::DeleteVolumeRequest {
                volume_id: id.into(),
                secrets: self.secrets.clone(),
            })
            .await
            .map(|_| ())
    }

    pub fn stage_req(
        &self,
        v: &csi::Volume,
        cap: csi::VolumeCapability,
    ) -> csi::NodeStageVolumeRequest {
        let (staging, _) = self.h.paths(&v.volume_id, "pod-a");
        csi::NodeStageVolumeRequest {
            volume_id: v.volume_id.clone(),
            staging_target_path: staging.to_string_lossy().into(),
            volume_capability: Some(cap),
            secrets: self.secrets.clone(),
            volume_context: v.volume_context.clone(),
            ..Default::default()
        }
    }

    pub async fn stage(&mut self, v: &csi::Volume, cap: csi::VolumeCapability) {
        let req = self.stage_req(v, cap);
        self.n
            .node_stage_volume(req)
            .await
            .unwrap_or_else(|s| panic!("NodeStageVolume: {s}"));
    }

    pub async fn publish(
        &mut self,
        v: &csi::Volume,
        pod: &str,
        readonly: bool,
    ) -> std::path::PathBuf {
        let (staging, target) = self.h.paths(&v.volume_id, pod);
        self.n
            .node_publish_volume(csi::NodePublishVolumeRequest {
                volume_id: v.volume_id.clone(),
                staging_target_path: staging.to_string_lossy().into(),
                target_path: target.to_string_lossy().into(),
                volume_capability: Some(rwx()),
                readonly,
                volume_context: v.volume_context.clone(),
                ..Default::default()
            })
            .await
            .unwrap_or_else(|s| panic!("NodePublishVolume {pod}: {s}"));
        target
    }

    pub async fn unpublish(&mut self, v: &csi::Volume, pod: &str) {
        let (_, target) = self.h.paths(&v.volume_id, pod);
        for _ in 0..2 {
            self.n
                .node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
                    volume_id: v.volume_id.clone(),
                    target_path: target.to_string_lossy().into(),
                })
                .await
                .unwrap_or_else(|s| panic!("NodeUnpublishVolume {pod}: {s}"));
        }
    }

    pub async fn unstage(&mut self, v: &csi::Volume) {
        let (staging, _) = self.h.paths(&v.volume_id, "pod-a");
        for _ in 0..2 {
            self.n
                .node_unstage_volume(csi::NodeUnstageVolumeRequest {
                    volume_id: v.volume_id.clone(),
                    staging_target_path: staging.to_string_lossy().into(),
                })
                .await
                .unwrap_or_else(|s| panic!("NodeUnstageVolume: {s}"));
        }
    }

    pub async fn stats(&mut self, path: &Path) -> csi::NodeGetVolumeStatsResponse {
        self.n
            .node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
                volume_id: "v".into(),
                volume_path: path.to_string_lossy().into(),
                staging_target_path: String::new(),
            })
            .await
            .unwrap()
            .into_inner()
    }

    /// How many shares the project holds.
    pub async fn share_count(&self) -> usize {
        self.manila
            .list_shares(&Default::default())
            .await
            .unwrap()
            .len()
    }

    /// Requests the plugin made to Manila's share endpoints.
    pub fn share_calls(&self) -> Vec<String> {
        self.h
            .emulator
            .control()
            .calls()
            .into_iter()
            .filter(|c| c.path.contains("/share/"))
            .map(|c| format!("{} {}", c.method, c.path))
            .collect()
    }
}
