//! What the driver's test programs share: the plugin against the emulator
//! (whose hypervisor turns attachments into loop devices), the requests
//! they send, and host helpers.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use csi_sanity::harness::{CinderOnEmulator, HarnessOptions};
use openstack_client::cinder::BlockStorage;
use openstack_client::config::{CloudConf, ConfigEnv};
use openstack_client::{Session, SessionOptions};
use proto::csi::v1 as csi;
use proto::csi::v1::controller_client::ControllerClient;
use proto::csi::v1::node_client::NodeClient;
use proto::csi::v1::volume_capability::access_mode::Mode;
use tonic::transport::Channel;

pub const BIN: &str = env!("CARGO_BIN_EXE_cinder-csi-plugin");

pub const GIB: i64 = 1 << 30;

pub fn root() -> bool {
    openstack_emulator::preconditions::root("loop devices, mounts")
}

pub struct Env {
    pub h: CinderOnEmulator,
    pub c: ControllerClient<Channel>,
    pub n: NodeClient<Channel>,
    pub cinder: BlockStorage,
}

pub async fn env_with(extra_args: &[&str]) -> Env {
    let mut o = HarnessOptions::new(BIN);
    o.extra_args = extra_args.iter().map(|s| s.to_string()).collect();
    let h = CinderOnEmulator::start(o).await.unwrap();
    let ch = plugin_runtime::connect_unix(&h.socket).await.unwrap();
    csi_sanity::harness::wait_until_ready(&h.socket)
        .await
        .unwrap();
    let cinder = cinder_of(&h);
    Env {
        c: ControllerClient::new(ch.clone()),
        n: NodeClient::new(ch),
        h,
        cinder,
    }
}

/// Cinder of the emulator, as the plugin's credentials see it.
/// Nova as the emulator's admin sees it (every project's servers).
pub fn admin_nova(h: &CinderOnEmulator) -> openstack_client::nova::Compute {
    let conf = CloudConf::from_texts(
        &[("c".into(), h.emulator.cloud_conf())],
        ConfigEnv::default(),
    )
    .unwrap();
    openstack_client::nova::Compute::new(
        Session::new(conf.cloud("").unwrap(), SessionOptions::default()).unwrap(),
    )
}

pub fn cinder_of(h: &CinderOnEmulator) -> BlockStorage {
    let conf = CloudConf::from_texts(
        &[("c".into(), h.cloud_conf_text().unwrap())],
        ConfigEnv::default(),
    )
    .unwrap();
    BlockStorage::new(Session::new(conf.cloud("").unwrap(), SessionOptions::default()).unwrap())
}

pub async fn env() -> Env {
    env_with(&[]).await
}

pub fn mount_cap(fs: &str, mode: Mode) -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_type: Some(csi::volume_capability::AccessType::Mount(
            csi::volume_capability::MountVolume {
                fs_type: fs.into(),
                mount_flags: vec![],
                volume_mount_group: String::new(),
            },
        )),
        access_mode: Some(csi::volume_capability::AccessMode { mode: mode as i32 }),
    }
}

pub fn block_cap(mode: Mode) -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_type: Some(csi::volume_capability::AccessType::Block(
            csi::volume_capability::BlockVolume {},
        )),
        access_mode: Some(csi::volume_capability::AccessMode { mode: mode as i32 }),
    }
}

pub fn create_req(name: &str, cap: csi::VolumeCapability, gib: i64) -> csi::CreateVolumeRequest {
    csi::CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: gib * GIB,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![cap],
        ..Default::default()
    }
}

pub fn timed<T>(msg: T, timeout: Duration) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.set_timeout(timeout);
    r
}

impl Env {
    pub async fn create(
        &mut self,
        name: &str,
        cap: csi::VolumeCapability,
        gib: i64,
    ) -> csi::Volume {
        self.c
            .create_volume(create_req(name, cap, gib))
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap()
    }

    pub async fn publish(&mut self, id: &str, cap: csi::VolumeCapability) {
        self.c
            .controller_publish_volume(csi::ControllerPublishVolumeRequest {
                volume_id: id.into(),
                node_id: self.h.node_id.clone(),
                volume_capability: Some(cap),
                ..Default::default()
            })
            .await
            .unwrap();
    }

    pub async fn unpublish(&mut self, id: &str) {
        self.c
            .controller_unpublish_volume(csi::ControllerUnpublishVolumeRequest {
                volume_id: id.into(),
                node_id: self.h.node_id.clone(),
                secrets: HashMap::new(),
            })
            .await
            .unwrap();
    }

    pub fn stage_req(
        &self,
        v: &csi::Volume,
        cap: csi::VolumeCapability,
    ) -> csi::NodeStageVolumeRequest {
        let (staging, _) = self.h.paths(&v.volume_id);
        csi::NodeStageVolumeRequest {
            volume_id: v.volume_id.clone(),
            staging_target_path: staging.to_string_lossy().into(),
            volume_capability: Some(cap),
            volume_context: v.volume_context.clone(),
            ..Default::default()
        }
    }

    pub async fn stage(
        &mut self,
        v: &csi::Volume,
        cap: csi::VolumeCapability,
    ) -> Result<(), tonic::Status> {
        let r = self.stage_req(v, cap);
        self.n.node_stage_volume(r).await.map(drop)
    }

    /// A new volume, attached and staged: the volume and its staging path.
    pub async fn staged(
        &mut self,
        name: &str,
        cap: csi::VolumeCapability,
        gib: i64,
    ) -> (csi::Volume, std::path::PathBuf) {
        let v = self.create(name, cap.clone(), gib).await;
        self.publish(&v.volume_id, cap.clone()).await;
        self.stage(&v, cap).await.unwrap();
        let (staging, _) = self.h.paths(&v.volume_id);
        (v, staging)
    }

    pub async fn unstage(&mut self, id: &str) {
        let (staging, _) = self.h.paths(id);
        self.n
            .node_unstage_volume(csi::NodeUnstageVolumeRequest {
                volume_id: id.into(),
                staging_target_path: staging.to_string_lossy().into(),
            })
            .await
            .unwrap();
    }

    pub fn device(&self, id: &str) -> std::path::PathBuf {
        self.h
            .by_id_dir
            .join(openstack_emulator::hypervisor::by_id_name(id))
            .canonicalize()
            .unwrap()
    }

    /// The volume's status, as Cinder says.
    pub async fn status(&self, id: &str) -> String {
        self.cinder.get_volume(id).await.unwrap().status.to_string()
    }

    /// Volumes named `name` that are not being deleted.
    pub async fn named(&self, name: &str) -> Vec<openstack_client::cinder::Volume> {
        self.cinder
            .volumes_named(name)
            .await
            .unwrap()
            .into_iter()
            .filter(|v| v.status.as_str() != "deleting")
            .collect()
    }
}

pub fn run(cmd: &str, args: &[&str]) {
    let out = std::process::Command::new(cmd).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{cmd} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Mounts `device` on a private directory, runs `f` on it, unmounts.
pub fn with_mounted<T>(device: &Path, fs: &str, f: impl FnOnce(&Path) -> T) -> T {
    let dir = tempfile::tempdir().unwrap();
    let opts = if fs == "xfs" { Some("nouuid") } else { None };
    nix::mount::mount(
        Some(device),
        dir.path(),
        Some(fs),
        nix::mount::MsFlags::empty(),
        opts,
    )
    .unwrap();
    let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(dir.path())));
    nix::mount::umount2(dir.path(), nix::mount::MntFlags::MNT_DETACH).unwrap();
    out.unwrap()
}

pub fn snapshot_req(
    source: &str,
    name: &str,
    params: &[(&str, &str)],
) -> csi::CreateSnapshotRequest {
    csi::CreateSnapshotRequest {
        source_volume_id: source.into(),
        name: name.into(),
        parameters: params
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..Default::default()
    }
}

pub fn from_snapshot(id: &str) -> Option<csi::VolumeContentSource> {
    Some(csi::VolumeContentSource {
        r#type: Some(csi::volume_content_source::Type::Snapshot(
            csi::volume_content_source::SnapshotSource {
                snapshot_id: id.into(),
            },
        )),
    })
}

pub fn from_volume(id: &str) -> Option<csi::VolumeContentSource> {
    Some(csi::VolumeContentSource {
        r#type: Some(csi::volume_content_source::Type::Volume(
            csi::volume_content_source::VolumeSource {
                volume_id: id.into(),
            },
        )),
    })
}
