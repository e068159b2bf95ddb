//! What the real-cloud tests of `manila-csi-plugin` share: the plugin on
//! the test cloud of `tests/openstack/cloud.py`, its gRPC clients, and
//! Manila as the member sees it.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use csi_sanity::harness::ManilaOnRealCloud;
use openstack_client::manila::SharedFileSystems;
use proto::csi::v1 as csi;
use proto::csi::v1::controller_client::ControllerClient;
use proto::csi::v1::node_client::NodeClient;
use proto::csi::v1::volume_capability::access_mode::Mode;
use tonic::transport::Channel;

pub const BIN: &str = env!("CARGO_BIN_EXE_manila-csi-plugin");
pub const GIB: i64 = 1 << 30;
pub const RPC_TIMEOUT: Duration = Duration::from_secs(90);

/// One test at a time: they share the cloud, and one freezes Ceph.
pub static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

pub fn cloud_dir() -> PathBuf {
    csi_sanity::harness::real_cloud_dir()
}

pub struct Env {
    pub h: ManilaOnRealCloud,
    /// The StorageClass parameters `create` uses.
    pub parameters: HashMap<String, String>,
    pub c: ControllerClient<Channel>,
    pub n: NodeClient<Channel>,
    pub manila: SharedFileSystems,
}

/// The plugin for `protocol` (`CEPHFS` or `NFS`) on the real cloud; its
/// shares are created with `parameters`.
pub async fn env(protocol: &str, parameters: &[(&str, &str)]) -> Env {
    env_with_args(protocol, parameters, &[]).await
}

/// The same, with more plugin flags.
pub async fn env_with_args(
    protocol: &str,
    parameters: &[(&str, &str)],
    extra_args: &[String],
) -> Env {
    let dir = cloud_dir();
    let log = csi_sanity::harness::test_log(&format!(
        "manila-csi-real-{}.log",
        protocol.to_ascii_lowercase()
    ));
    let h = ManilaOnRealCloud::start(Path::new(BIN), &dir, protocol, false, extra_args, Some(log))
        .await
        .unwrap();
    csi_sanity::harness::wait_until_ready(&h.socket)
        .await
        .unwrap();
    let ch = plugin_runtime::connect_unix(&h.socket).await.unwrap();
    let manila = h.member_manila().unwrap();
    Env {
        parameters: parameters
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        c: ControllerClient::new(ch.clone()),
        n: NodeClient::new(ch),
        h,
        manila,
    }
}

pub fn timed<T>(msg: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.set_timeout(RPC_TIMEOUT);
    r
}

pub fn cap(mode: Mode) -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_type: Some(csi::volume_capability::AccessType::Mount(
            csi::volume_capability::MountVolume::default(),
        )),
        access_mode: Some(csi::volume_capability::AccessMode { mode: mode as i32 }),
    }
}

pub use csi_sanity::harness::unique_name as unique;

pub fn of_snapshot(snapshot_id: &str) -> Option<csi::VolumeContentSource> {
    Some(csi::VolumeContentSource {
        r#type: Some(csi::volume_content_source::Type::Snapshot(
            csi::volume_content_source::SnapshotSource {
                snapshot_id: snapshot_id.into(),
            },
        )),
    })
}

pub fn of_volume(volume_id: &str) -> Option<csi::VolumeContentSource> {
    Some(csi::VolumeContentSource {
        r#type: Some(csi::volume_content_source::Type::Volume(
            csi::volume_content_source::VolumeSource {
                volume_id: volume_id.into(),
            },
        )),
    })
}

/// `ceph` admin CLI of the test cloud.
pub fn ceph(args: &[&str]) -> std::process::Output {
    let conf = cloud_dir().join("ceph/ceph.conf");
    std::process::Command::new("ceph")
        .arg("--conf")
        .arg(conf)
        .args(["--connect-timeout", "10"])
        .args(args)
        .output()
        .unwrap()
}

impl Env {
    pub async fn create(
        &mut self,
        name: &str,
        gib: i64,
        src: Option<csi::VolumeContentSource>,
    ) -> csi::Volume {
        self.create_as(name, gib, src, Mode::MultiNodeMultiWriter)
            .await
    }

    /// A share for capabilities of `mode`.
    pub async fn create_as(
        &mut self,
        name: &str,
        gib: i64,
        src: Option<csi::VolumeContentSource>,
        mode: Mode,
    ) -> csi::Volume {
        self.c
            .create_volume(timed(csi::CreateVolumeRequest {
                name: name.into(),
                capacity_range: Some(csi::CapacityRange {
                    required_bytes: gib * GIB,
                    limit_bytes: 0,
                }),
                volume_capabilities: vec![cap(mode)],
                parameters: self.parameters.clone(),
                secrets: self.h.secrets.clone(),
                volume_content_source: src,
                ..Default::default()
            }))
            .await
            .unwrap_or_else(|s| panic!("CreateVolume {name}: {s}"))
            .into_inner()
            .volume
            .unwrap()
    }

    pub async fn stage(&mut self, volume_id: &str, context: &HashMap<String, String>) -> PathBuf {
        let (staging, _) = self.h.paths(volume_id, "pod-a");
        self.n
            .node_stage_volume(timed(csi::NodeStageVolumeRequest {
                volume_id: volume_id.into(),
                staging_target_path: staging.to_string_lossy().into(),
                volume_capability: Some(cap(Mode::MultiNodeMultiWriter)),
                secrets: self.h.secrets.clone(),
                volume_context: context.clone(),
                ..Default::default()
            }))
            .await
            .unwrap_or_else(|s| panic!("NodeStageVolume: {s}"));
        staging
    }

    pub async fn publish(&mut self, volume_id: &str, pod: &str, readonly: bool) -> PathBuf {
        let (staging, target) = self.h.paths(volume_id, pod);
        self.n
            .node_publish_volume(timed(csi::NodePublishVolumeRequest {
                volume_id: volume_id.into(),
                staging_target_path: staging.to_string_lossy().into(),
                target_path: target.to_string_lossy().into(),
                volume_capability: Some(cap(Mode::MultiNodeMultiWriter)),
                readonly,
                ..Default::default()
            }))
            .await
            .unwrap_or_else(|s| panic!("NodePublishVolume {pod}: {s}"));
        target
    }

    pub async fn unpublish(&mut self, volume_id: &str, pod: &str) -> Result<(), tonic::Status> {
        let (_, target) = self.h.paths(volume_id, pod);
        self.n
            .node_unpublish_volume(timed(csi::NodeUnpublishVolumeRequest {
                volume_id: volume_id.into(),
                target_path: target.to_string_lossy().into(),
            }))
            .await
            .map(|_| ())
    }

    pub async fn unstage(&mut self, volume_id: &str) -> Result<(), tonic::Status> {
        let (staging, _) = self.h.paths(volume_id, "pod-a");
        self.n
            .node_unstage_volume(timed(csi::NodeUnstageVolumeRequest {
                volume_id: volume_id.into(),
                staging_target_path: staging.to_string_lossy().into(),
            }))
            .await
            .map(|_| ())
    }

    pub async fn stats(&mut self, path: &Path) -> csi::NodeGetVolumeStatsResponse {
        self.n
            .node_get_volume_stats(timed(csi::NodeGetVolumeStatsRequest {
                volume_id: "v".into(),
                volume_path: path.to_string_lossy().into(),
                staging_target_path: String::new(),
            }))
            .await
            .unwrap()
            .into_inner()
    }

    pub async fn delete(&mut self, id: &str) {
        self.c
            .delete_volume(timed(csi::DeleteVolumeRequest {
                volume_id: id.into(),
                secrets: self.h.secrets.clone(),
            }))
            .await
            .unwrap_or_else(|s| panic!("DeleteVolume {id}: {s}"));
    }

    pub async fn snapshot(&mut self, source_volume_id: &str, name: &str) -> csi::Snapshot {
        self.c
            .create_snapshot(timed(csi::CreateSnapshotRequest {
                source_volume_id: source_volume_id.into(),
                name: name.into(),
                secrets: self.h.secrets.clone(),
                parameters: HashMap::new(),
            }))
            .await
            .unwrap_or_else(|s| panic!("CreateSnapshot {name}: {s}"))
            .into_inner()
            .snapshot
            .unwrap()
    }

    pub async fn delete_snapshot(&mut self, id: &str) {
        self.c
            .delete_snapshot(timed(csi::DeleteSnapshotRequest {
                snapshot_id: id.into(),
                secrets: self.h.secrets.clone(),
            }))
            .await
            .unwrap_or_else(|s| panic!("DeleteSnapshot {id}: {s}"));
    }

    pub async fn expand(&mut self, id: &str, gib: i64) -> csi::ControllerExpandVolumeResponse {
        self.c
            .controller_expand_volume(timed(csi::ControllerExpandVolumeRequest {
                volume_id: id.into(),
                capacity_range: Some(csi::CapacityRange {
                    required_bytes: gib * GIB,
                    limit_bytes: 0,
                }),
                secrets: self.h.secrets.clone(),
                volume_capability: Some(cap(Mode::MultiNodeMultiWriter)),
            }))
            .await
            .unwrap_or_else(|s| panic!("ControllerExpandVolume {id}: {s}"))
            .into_inner()
    }

    pub fn mounted(&self, path: &Path) -> bool {
        !host_ops::mounts_at(path).unwrap_or_default().is_empty()
    }
}
