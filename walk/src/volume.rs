//! A Cinder volume's life through `cinder-csi-plugin`, as the external
//! provisioner, attacher, resizer, snapshotter and kubelet drive it:
//! create, attach, stage (mkfs + mount of a real loop device), publish,
//! write and read, grow, snapshot, restore, clean up.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use csi_sanity::harness::CinderOnEmulator;
use proto::csi::v1 as csi;
use proto::csi::v1::controller_client::ControllerClient;
use proto::csi::v1::node_client::NodeClient;
use proto::csi::v1::volume_capability::access_mode::Mode;
use tonic::transport::Channel;

use crate::report::{human, size};
use crate::{Report, StepFailure, answer, ensure};

const GIB: i64 = 1 << 30;
const FS_TYPE: &str = "xfs";
const FILE: &str = "hello.txt";
const TEXT: &str = "written by suite-walk through a CSI-published Cinder volume\n";

pub(crate) fn mount_capability(fs_type: &str, mode: Mode) -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_type: Some(csi::volume_capability::AccessType::Mount(
            csi::volume_capability::MountVolume {
                fs_type: fs_type.into(),
                ..Default::default()
            },
        )),
        access_mode: Some(csi::volume_capability::AccessMode { mode: mode as i32 }),
    }
}

pub(crate) fn gib(n: i64) -> Option<csi::CapacityRange> {
    Some(csi::CapacityRange {
        required_bytes: n * GIB,
        limit_bytes: 0,
    })
}

/// What a lookup of `path` here sees mounted (source and type), if anything.
pub(crate) fn mounted_at(path: &Path) -> Option<host_ops::MountEntry> {
    host_ops::mounts_at(path).ok()?.pop()
}

/// Bytes of the filesystem at `path`, as `df` shows them.
pub(crate) fn df_bytes(path: &Path) -> Result<u64, StepFailure> {
    host_ops::volume_usage(path)
        .map(|u| u.total_bytes)
        .map_err(|e| StepFailure::Check(e.to_string()))
}

pub(crate) fn write_synced(path: &Path, text: &str) -> Result<(), StepFailure> {
    let mut f = std::fs::File::create(path)?;
    f.write_all(text.as_bytes())?;
    f.sync_all()?;
    Ok(())
}

struct Cinder<'h> {
    h: &'h CinderOnEmulator,
    controller: ControllerClient<Channel>,
    node: NodeClient<Channel>,
    cap: csi::VolumeCapability,
}

impl Cinder<'_> {
    fn paths(&self, volume_id: &str, pod: &str) -> (PathBuf, PathBuf) {
        let (staging, _) = self.h.paths(volume_id);
        let target = self.h.kubelet_dir.join(format!(
            "pods/{pod}/volumes/kubernetes.io~csi/{volume_id}/mount"
        ));
        (staging, target)
    }

    async fn publish(&mut self, volume_id: &str) -> Result<String, StepFailure> {
        let r = answer(
            "ControllerPublishVolume",
            self.controller
                .controller_publish_volume(csi::ControllerPublishVolumeRequest {
                    volume_id: volume_id.into(),
                    node_id: self.h.node_id.clone(),
                    volume_capability: Some(self.cap.clone()),
                    ..Default::default()
                })
                .await,
        )?;
        let mut keys: Vec<&String> = r.publish_context.keys().collect();
        keys.sort();
        Ok(format!(
            "attached to Nova server {} (publish context: {})",
            short(&self.h.node_id),
            keys.iter()
                .map(|k| k.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ))
    }

    async fn stage(&mut self, volume_id: &str) -> Result<String, StepFailure> {
        let (staging, _) = self.paths(volume_id, "");
        answer(
            "NodeStageVolume",
            self.node
                .node_stage_volume(csi::NodeStageVolumeRequest {
                    volume_id: volume_id.into(),
                    staging_target_path: staging.to_string_lossy().into(),
                    volume_capability: Some(self.cap.clone()),
                    ..Default::default()
                })
                .await,
        )?;
        let m = mounted_at(&staging).ok_or_else(|| {
            StepFailure::Check(format!("nothing mounted at {}", staging.display()))
        })?;
        Ok(format!(
            "{} on {} mounted at the staging path",
            m.fs_type, m.source
        ))
    }

    async fn node_publish(&mut self, volume_id: &str, pod: &str) -> Result<PathBuf, StepFailure> {
        let (staging, target) = self.paths(volume_id, pod);
        answer(
            "NodePublishVolume",
            self.node
                .node_publish_volume(csi::NodePublishVolumeRequest {
                    volume_id: volume_id.into(),
                    staging_target_path: staging.to_string_lossy().into(),
                    target_path: target.to_string_lossy().into(),
                    volume_capability: Some(self.cap.clone()),
                    ..Default::default()
                })
                .await,
        )?;
        ensure(mounted_at(&target).is_some(), || {
            format!("nothing mounted at {}", target.display())
        })?;
        Ok(target)
    }

    async fn unmount_and_detach(
        &mut self,
        volume_id: &str,
        pod: &str,
        root: bool,
    ) -> Result<(), StepFailure> {
        let (staging, target) = self.paths(volume_id, pod);
        if root {
            answer(
                "NodeUnpublishVolume",
                self.node
                    .node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
                        volume_id: volume_id.into(),
                        target_path: target.to_string_lossy().into(),
                    })
                    .await,
            )?;
            answer(
                "NodeUnstageVolume",
                self.node
                    .node_unstage_volume(csi::NodeUnstageVolumeRequest {
                        volume_id: volume_id.into(),
                        staging_target_path: staging.to_string_lossy().into(),
                    })
                    .await,
            )?;
            ensure(
                mounted_at(&target).is_none() && mounted_at(&staging).is_none(),
                || "a mount was left behind".into(),
            )?;
        }
        answer(
            "ControllerUnpublishVolume",
            self.controller
                .controller_unpublish_volume(csi::ControllerUnpublishVolumeRequest {
                    volume_id: volume_id.into(),
                    node_id: self.h.node_id.clone(),
                    secrets: HashMap::new(),
                })
                .await,
        )?;
        Ok(())
    }

    async fn delete(&mut self, volume_id: &str) -> Result<(), StepFailure> {
        answer(
            "DeleteVolume",
            self.controller
                .delete_volume(csi::DeleteVolumeRequest {
                    volume_id: volume_id.into(),
                    secrets: HashMap::new(),
                })
                .await,
        )?;
        Ok(())
    }
}

pub(crate) fn short(id: &str) -> &str {
    id.get(..8).unwrap_or(id)
}

const NEEDS_ROOT: &str = "needs root: loop devices and mounts";

/// Walks a volume's life; every step goes into `report`.
pub async fn walk(report: &mut Report, h: &CinderOnEmulator, root: bool) {
    report.part(
        "volume",
        "cinder-csi-plugin, controller and node, over its socket (RWO block storage)",
    );
    let started = report
        .step("start cinder-csi-plugin", async {
            csi_sanity::harness::wait_until_ready(&h.socket)
                .await
                .map_err(StepFailure::Check)?;
            let ch = plugin_runtime::connect_unix(&h.socket).await?;
            Ok((
                ch,
                format!(
                    "pid {}, socket {}, ready (Probe)",
                    h.plugin_pid().unwrap_or_default(),
                    h.socket.display()
                ),
            ))
        })
        .await;
    let Some(ch) = started else { return };
    let mut c = Cinder {
        h,
        controller: ControllerClient::new(ch.clone()),
        node: NodeClient::new(ch),
        cap: mount_capability(FS_TYPE, Mode::SingleNodeWriter),
    };
    let volume = report
        .step("CreateVolume (1 GiB, xfs)", async {
            let v = answer(
                "CreateVolume",
                c.controller
                    .create_volume(csi::CreateVolumeRequest {
                        name: "pvc-suite-walk".into(),
                        capacity_range: gib(1),
                        volume_capabilities: vec![c.cap.clone()],
                        parameters: HashMap::from([(
                            "csi.storage.k8s.io/pvc/name".into(),
                            "data".into(),
                        )]),
                        ..Default::default()
                    })
                    .await,
            )?
            .volume
            .ok_or_else(|| StepFailure::Check("CreateVolume answered no volume".into()))?;
            let zone = v
                .accessible_topology
                .first()
                .and_then(|t| t.segments.values().next().cloned())
                .unwrap_or_default();
            let detail = format!(
                "volume {}, {}, available in zone {zone}",
                short(&v.volume_id),
                size(v.capacity_bytes.unsigned_abs())
            );
            Ok((v.volume_id, detail))
        })
        .await;
    let Some(volume) = volume else { return };
    let attached = report
        .step("ControllerPublishVolume", async {
            c.publish(&volume).await.map(|d| ((), d))
        })
        .await
        .is_some();

    let mut mounted = false;
    if attached && root {
        mounted = report
            .step("NodeStageVolume (mkfs + mount)", async {
                c.stage(&volume).await.map(|d| ((), d))
            })
            .await
            .is_some();
    } else if !root {
        report.skip("NodeStageVolume (mkfs + mount)", NEEDS_ROOT);
    }
    let mut target = None;
    if mounted {
        target = report
            .step("NodePublishVolume (pod-1)", async {
                let t = c.node_publish(&volume, "pod-1").await?;
                let d = format!("bind mount at {}", t.display());
                Ok((t, d))
            })
            .await;
    } else if !root {
        report.skip("NodePublishVolume (pod-1)", NEEDS_ROOT);
    }
    if let Some(t) = &target {
        report
            .step("write a file, read it back", async {
                write_synced(&t.join(FILE), TEXT)?;
                let back = std::fs::read_to_string(t.join(FILE))?;
                ensure(back == TEXT, || format!("read back {back:?}"))?;
                Ok(((), format!("{FILE}: {} bytes", TEXT.len())))
            })
            .await;
    } else if !root {
        report.skip("write a file, read it back", NEEDS_ROOT);
    }

    if attached {
        let expanded = report
            .step("ControllerExpandVolume (to 2 GiB)", async {
                let r = answer(
                    "ControllerExpandVolume",
                    c.controller
                        .controller_expand_volume(csi::ControllerExpandVolumeRequest {
                            volume_id: volume.clone(),
                            capacity_range: gib(2),
                            volume_capability: Some(c.cap.clone()),
                            ..Default::default()
                        })
                        .await,
                )?;
                Ok((
                    (),
                    format!(
                        "Cinder extended it online to {}; node expansion required: {}",
                        size(r.capacity_bytes.unsigned_abs()),
                        r.node_expansion_required
                    ),
                ))
            })
            .await
            .is_some();
        if let (true, Some(t)) = (expanded, &target) {
            report
                .step("NodeExpandVolume (df grows)", async {
                    let before = df_bytes(t)?;
                    let (staging, _) = c.paths(&volume, "pod-1");
                    answer(
                        "NodeExpandVolume",
                        c.node
                            .node_expand_volume(csi::NodeExpandVolumeRequest {
                                volume_id: volume.clone(),
                                volume_path: t.to_string_lossy().into(),
                                capacity_range: gib(2),
                                staging_target_path: staging.to_string_lossy().into(),
                                volume_capability: Some(c.cap.clone()),
                                ..Default::default()
                            })
                            .await,
                    )?;
                    let after = df_bytes(t)?;
                    ensure(after > before + (GIB as u64) / 2, || {
                        format!("df: {} before, {} after", size(before), size(after))
                    })?;
                    Ok(((), format!("df: {} -> {}", size(before), size(after))))
                })
                .await;
        } else if !root {
            report.skip("NodeExpandVolume (df grows)", NEEDS_ROOT);
        }
    }

    let snapshot = report
        .step("CreateSnapshot (of the volume in use)", async {
            let s = answer(
                "CreateSnapshot",
                c.controller
                    .create_snapshot(csi::CreateSnapshotRequest {
                        source_volume_id: volume.clone(),
                        name: "snapshot-suite-walk".into(),
                        // a VolumeSnapshotClass's parameter: Cinder
                        // snapshots an attached volume only when forced
                        parameters: HashMap::from([("force-create".into(), "true".into())]),
                        ..Default::default()
                    })
                    .await,
            )?
            .snapshot
            .ok_or_else(|| StepFailure::Check("CreateSnapshot answered no snapshot".into()))?;
            ensure(s.ready_to_use, || "the snapshot is not ready to use".into())?;
            let d = format!(
                "snapshot {}, {}, ready to use",
                short(&s.snapshot_id),
                size(s.size_bytes.unsigned_abs())
            );
            Ok((s.snapshot_id, d))
        })
        .await;

    let mut restored = None;
    if let Some(snap) = &snapshot {
        restored = report
            .step("CreateVolume from the snapshot", async {
                let v = answer(
                    "CreateVolume",
                    c.controller
                        .create_volume(csi::CreateVolumeRequest {
                            name: "pvc-suite-walk-restored".into(),
                            capacity_range: gib(2),
                            volume_capabilities: vec![c.cap.clone()],
                            volume_content_source: Some(csi::VolumeContentSource {
                                r#type: Some(csi::volume_content_source::Type::Snapshot(
                                    csi::volume_content_source::SnapshotSource {
                                        snapshot_id: snap.clone(),
                                    },
                                )),
                            }),
                            ..Default::default()
                        })
                        .await,
                )?
                .volume
                .ok_or_else(|| StepFailure::Check("CreateVolume answered no volume".into()))?;
                let d = format!("volume {}, available", short(&v.volume_id));
                Ok((v.volume_id, d))
            })
            .await;
    }
    if let Some(r) = restored.clone() {
        if root && target.is_some() {
            report
                .step("the restored volume holds the file", async {
                    let started = std::time::Instant::now();
                    c.publish(&r).await?;
                    c.stage(&r).await?;
                    let t = c.node_publish(&r, "pod-2").await?;
                    let back = std::fs::read_to_string(t.join(FILE))?;
                    ensure(back == TEXT, || format!("{FILE} holds {back:?}"))?;
                    Ok((
                        (),
                        format!(
                            "attached, staged, published to pod-2 in {}; {FILE} reads back",
                            human(started.elapsed())
                        ),
                    ))
                })
                .await;
        } else if !root {
            report.skip("the restored volume holds the file", NEEDS_ROOT);
        }
        report
            .step("clean up the restored volume", async {
                c.unmount_and_detach(&r, "pod-2", root).await?;
                c.delete(&r).await?;
                Ok(((), "unpublished, unstaged, detached, deleted".into()))
            })
            .await;
    }
    if let Some(s) = &snapshot {
        report
            .step("DeleteSnapshot", async {
                answer(
                    "DeleteSnapshot",
                    c.controller
                        .delete_snapshot(csi::DeleteSnapshotRequest {
                            snapshot_id: s.clone(),
                            secrets: HashMap::new(),
                        })
                        .await,
                )?;
                Ok(((), "gone when answered".into()))
            })
            .await;
    }
    report
        .step("clean up the volume", async {
            if attached {
                c.unmount_and_detach(&volume, "pod-1", root && mounted)
                    .await?;
            }
            c.delete(&volume).await?;
            let left = csi_sanity::harness::mounts_below(h.dir.path());
            ensure(left.is_empty(), || format!("still mounted: {left:?}"))?;
            let devices = std::fs::read_dir(&h.by_id_dir)
                .map(|d| d.count())
                .unwrap_or(0);
            ensure(devices == 0, || format!("{devices} devices still attached"))?;
            Ok((
                (),
                "unpublished, unstaged, detached, deleted; no mount, no loop device left".into(),
            ))
        })
        .await;
}
