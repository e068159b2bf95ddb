//! A Manila NFS share's life through `manila-csi-plugin`, mounted natively
//! (no partner plugin): created with its access rule, staged once on the
//! node, published to two pods that see each other's writes, grown,
//! snapshotted, unpublished and deleted with its access revoked.
//!
//! This machine has no NFS client, so as root the node runs in a private
//! mount namespace whose `mount.nfs` is a stand-in: mount(8) runs for real
//! and hands it the exact source and options (printed), and it binds a
//! local directory standing for the export, so the two pods share files.

use std::collections::HashMap;
use std::path::PathBuf;

use csi_sanity::harness::ManilaOnEmulator;
use proto::csi::v1 as csi;
use proto::csi::v1::controller_client::ControllerClient;
use proto::csi::v1::node_client::NodeClient;
use proto::csi::v1::volume_capability::access_mode::Mode;
use tonic::transport::Channel;

use crate::report::size;
use crate::volume::{gib, mount_capability, short, write_synced};
use crate::{Report, StepFailure, answer, ensure};

/// Who may mount the share: an explicit client network, as the
/// StorageClass's `nfs-shareClient` says (the plugin never opens a share
/// to everyone unless told).
const SHARE_CLIENT: &str = "10.0.0.0/24";
const NEEDS_ROOT: &str = "needs root: mounts in a private mount namespace";

struct Manila<'h> {
    h: &'h ManilaOnEmulator,
    controller: ControllerClient<Channel>,
    node: NodeClient<Channel>,
    cap: csi::VolumeCapability,
    secrets: HashMap<String, String>,
}

impl Manila<'_> {
    async fn publish(&mut self, v: &csi::Volume, pod: &str) -> Result<PathBuf, StepFailure> {
        let (staging, target) = self.h.paths(&v.volume_id, pod);
        answer(
            "NodePublishVolume",
            self.node
                .node_publish_volume(csi::NodePublishVolumeRequest {
                    volume_id: v.volume_id.clone(),
                    staging_target_path: staging.to_string_lossy().into(),
                    target_path: target.to_string_lossy().into(),
                    volume_capability: Some(self.cap.clone()),
                    volume_context: v.volume_context.clone(),
                    ..Default::default()
                })
                .await,
        )?;
        ensure(!self.h.mounts_at(&target).is_empty(), || {
            format!("nothing mounted at {}", target.display())
        })?;
        Ok(target)
    }

    async fn unpublish(&mut self, v: &csi::Volume, pod: &str) -> Result<(), StepFailure> {
        let (_, target) = self.h.paths(&v.volume_id, pod);
        answer(
            "NodeUnpublishVolume",
            self.node
                .node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
                    volume_id: v.volume_id.clone(),
                    target_path: target.to_string_lossy().into(),
                })
                .await,
        )?;
        Ok(())
    }
}

/// Walks a share's life; every step goes into `report`.
pub async fn walk(report: &mut Report, h: &ManilaOnEmulator, root: bool) {
    report.part(
        "share",
        "manila-csi-plugin (NFS), controller and node, over its socket (RWX shared file systems)",
    );
    let started = report
        .step("start manila-csi-plugin", async {
            csi_sanity::harness::wait_until_ready(&h.socket)
                .await
                .map_err(StepFailure::Check)?;
            let ch = plugin_runtime::connect_unix(&h.socket).await?;
            Ok((
                ch,
                format!(
                    "pid {}, socket {}, ready; node mounts natively{}",
                    h.plugin_pid().unwrap_or_default(),
                    h.socket.display(),
                    if root {
                        "; mount(8) and the bind mounts into the pods are real, the NFS mount itself stops at mount(8) (no NFS client here: a stand-in mount.nfs binds a local export)"
                    } else {
                        ""
                    }
                ),
            ))
        })
        .await;
    let Some(ch) = started else { return };
    let mut m = Manila {
        h,
        controller: ControllerClient::new(ch.clone()),
        node: NodeClient::new(ch),
        cap: mount_capability("", Mode::MultiNodeMultiWriter),
        secrets: h.member_secrets(),
    };
    let share = report
        .step("CreateVolume (1 GiB NFS share, RWX)", async {
            let v = answer(
                "CreateVolume",
                m.controller
                    .create_volume(csi::CreateVolumeRequest {
                        name: "pvc-suite-walk-share".into(),
                        capacity_range: gib(1),
                        volume_capabilities: vec![m.cap.clone()],
                        parameters: HashMap::from([
                            ("type".into(), "default".into()),
                            ("nfs-shareClient".into(), SHARE_CLIENT.into()),
                        ]),
                        secrets: m.secrets.clone(),
                        ..Default::default()
                    })
                    .await,
            )?
            .volume
            .ok_or_else(|| StepFailure::Check("CreateVolume answered no volume".into()))?;
            let rules = v
                .volume_context
                .get("shareAccessIDs")
                .cloned()
                .unwrap_or_default();
            ensure(!rules.is_empty(), || {
                "no access rule in the volume context".into()
            })?;
            let d = format!(
                "share {}, {}, available; access rule {} (ip {SHARE_CLIENT}, rw) active",
                short(&v.volume_id),
                size(v.capacity_bytes.unsigned_abs()),
                short(&rules)
            );
            Ok((v, d))
        })
        .await;
    let Some(share) = share else { return };
    let (staging, _) = h.paths(&share.volume_id, "pod-a");

    let mut staged = false;
    if root {
        staged = report
            .step("NodeStageVolume (mount the export)", async {
                answer(
                    "NodeStageVolume",
                    m.node
                        .node_stage_volume(csi::NodeStageVolumeRequest {
                            volume_id: share.volume_id.clone(),
                            staging_target_path: staging.to_string_lossy().into(),
                            volume_capability: Some(m.cap.clone()),
                            volume_context: share.volume_context.clone(),
                            secrets: m.secrets.clone(),
                            ..Default::default()
                        })
                        .await,
                )?;
                let call = h
                    .helper_calls()
                    .into_iter()
                    .rfind(|c| c.target == staging.to_string_lossy())
                    .ok_or_else(|| StepFailure::Check("mount.nfs was never called".into()))?;
                Ok((
                    (),
                    format!(
                        "mount -t {} {} <staging>{}",
                        call.program,
                        call.source,
                        if call.options.is_empty() {
                            String::new()
                        } else {
                            format!(" -o {}", call.options)
                        }
                    ),
                ))
            })
            .await
            .is_some();
    } else {
        report.skip("NodeStageVolume (mount the export)", NEEDS_ROOT);
    }

    let mut pods = Vec::new();
    for pod in ["pod-a", "pod-b"] {
        let name = format!("NodePublishVolume ({pod})");
        if !staged {
            if !root {
                report.skip(&name, NEEDS_ROOT);
            }
            continue;
        }
        if let Some(t) = report
            .step(&name, async {
                let t = m.publish(&share, pod).await?;
                Ok((t, format!("bind mount of the staged share for {pod}")))
            })
            .await
        {
            pods.push(t);
        }
    }
    if let [a, b] = pods.as_slice() {
        report
            .step("write in pod-a, read in pod-b", async {
                let text = "one share, two pods\n";
                write_synced(&h.seen(a).join("shared.txt"), text)?;
                let back = std::fs::read_to_string(h.seen(b).join("shared.txt"))?;
                ensure(back == text, || format!("pod-b reads {back:?}"))?;
                Ok(((), "pod-b reads what pod-a wrote".into()))
            })
            .await;
    } else if !root {
        report.skip("write in pod-a, read in pod-b", NEEDS_ROOT);
    }

    report
        .step("ControllerExpandVolume (to 2 GiB)", async {
            let r = answer(
                "ControllerExpandVolume",
                m.controller
                    .controller_expand_volume(csi::ControllerExpandVolumeRequest {
                        volume_id: share.volume_id.clone(),
                        capacity_range: gib(2),
                        secrets: m.secrets.clone(),
                        volume_capability: Some(m.cap.clone()),
                    })
                    .await,
            )?;
            ensure(!r.node_expansion_required, || {
                "a share should need no node expansion".into()
            })?;
            Ok((
                (),
                format!(
                    "Manila extended it to {}; no node expansion needed",
                    size(r.capacity_bytes.unsigned_abs())
                ),
            ))
        })
        .await;
    let snapshot = report
        .step("CreateSnapshot", async {
            let s = answer(
                "CreateSnapshot",
                m.controller
                    .create_snapshot(csi::CreateSnapshotRequest {
                        source_volume_id: share.volume_id.clone(),
                        name: "snapshot-suite-walk-share".into(),
                        secrets: m.secrets.clone(),
                        ..Default::default()
                    })
                    .await,
            )?
            .snapshot
            .ok_or_else(|| StepFailure::Check("CreateSnapshot answered no snapshot".into()))?;
            ensure(s.ready_to_use, || "the snapshot is not ready to use".into())?;
            let d = format!("share snapshot {}, ready to use", short(&s.snapshot_id));
            Ok((s.snapshot_id, d))
        })
        .await;
    if let Some(s) = snapshot {
        report
            .step("DeleteSnapshot", async {
                answer(
                    "DeleteSnapshot",
                    m.controller
                        .delete_snapshot(csi::DeleteSnapshotRequest {
                            snapshot_id: s,
                            secrets: m.secrets.clone(),
                        })
                        .await,
                )?;
                Ok(((), "gone when answered".into()))
            })
            .await;
    }
    if staged {
        report
            .step("NodeUnpublishVolume x2, NodeUnstageVolume", async {
                for pod in ["pod-a", "pod-b"] {
                    m.unpublish(&share, pod).await?;
                }
                answer(
                    "NodeUnstageVolume",
                    m.node
                        .node_unstage_volume(csi::NodeUnstageVolumeRequest {
                            volume_id: share.volume_id.clone(),
                            staging_target_path: staging.to_string_lossy().into(),
                        })
                        .await,
                )?;
                let left = h.mounts_below_dir();
                ensure(left.is_empty(), || format!("still mounted: {left:?}"))?;
                Ok(((), "nothing left mounted".into()))
            })
            .await;
    }
    report
        .step("DeleteVolume (access revoked)", async {
            let calls_before = h.emulator.control().calls().len();
            answer(
                "DeleteVolume",
                m.controller
                    .delete_volume(csi::DeleteVolumeRequest {
                        volume_id: share.volume_id.clone(),
                        secrets: m.secrets.clone(),
                    })
                    .await,
            )?;
            // what the plugin asked Manila for this share while deleting it
            let calls: Vec<_> = h
                .emulator
                .control()
                .calls()
                .into_iter()
                .skip(calls_before)
                .filter(|c| c.path.contains(&share.volume_id))
                .collect();
            let revoked = calls
                .iter()
                .any(|c| c.method == "POST" && c.path.ends_with("/action"));
            let deleted = calls.iter().any(|c| c.method == "DELETE");
            let gone = calls
                .iter()
                .any(|c| c.method == "GET" && c.status == Some(404));
            ensure(revoked && deleted && gone, || {
                format!("expected deny_access, DELETE and a 404; saw {calls:?}")
            })?;
            Ok((
                (),
                "access rule denied, share deleted, Manila answers 404 for it".into(),
            ))
        })
        .await;
}
