//! Full lifecycles on real mounts: create, (controller) publish, stage
//! and publish twice each, write, read, tear down in reverse; for a
//! filesystem, a raw block device, a shared volume, a single writer, and
//! an online expansion.

use super::*;

impl Suite {
    pub(super) fn lifecycle_paths(&self, id: &str) -> (PathBuf, PathBuf) {
        (
            self.cfg.mount_dir.join(format!("staging/{id}")),
            self.cfg.mount_dir.join(format!("pods/{id}/target")),
        )
    }

    pub(super) fn publishes(&self) -> bool {
        self.controller_caps.contains(&CRpc::PublishUnpublishVolume)
    }

    /// create → (controller publish) → stage ×2 → publish ×2; returns the
    /// paths.
    pub(super) async fn bring_up(
        &mut self,
        cap: csi::VolumeCapability,
        what: &str,
    ) -> Result<(csi::Volume, PathBuf, PathBuf, HashMap<String, String>), String> {
        let name = self.name(what);
        let v = self.create_volume(&name, cap.clone()).await?;
        self.bring_up_volume(v, cap).await
    }

    /// (controller publish) → stage ×2 → publish ×2 of an existing volume.
    pub(super) async fn bring_up_volume(
        &mut self,
        v: csi::Volume,
        cap: csi::VolumeCapability,
    ) -> Result<(csi::Volume, PathBuf, PathBuf, HashMap<String, String>), String> {
        let node = self.node_id.clone().ok_or("no node id")?;
        let pc = if self.publishes() {
            ok(
                self.controller
                    .controller_publish_volume(self.req(self.publish_req(
                        &v.volume_id,
                        &node,
                        cap.clone(),
                    )))
                    .await,
                "ControllerPublishVolume",
            )?
            .publish_context
        } else {
            HashMap::new()
        };
        let (staging, target) = self.lifecycle_paths(&v.volume_id);
        let stage = csi::NodeStageVolumeRequest {
            volume_id: v.volume_id.clone(),
            publish_context: pc.clone(),
            staging_target_path: staging.to_string_lossy().into_owned(),
            volume_capability: Some(cap.clone()),
            secrets: self.cfg.secrets.clone(),
            volume_context: v.volume_context.clone(),
        };
        ok(
            self.node.node_stage_volume(self.req(stage.clone())).await,
            "NodeStageVolume",
        )?;
        ok(
            self.node.node_stage_volume(self.req(stage)).await,
            "NodeStageVolume again",
        )?;
        self.node_publish(&v, &pc, &staging, &target, cap, false)
            .await?;
        Ok((v, staging, target, pc))
    }

    /// NodePublishVolume twice (the repeat must succeed).
    pub(super) async fn node_publish(
        &mut self,
        v: &csi::Volume,
        pc: &HashMap<String, String>,
        staging: &std::path::Path,
        target: &std::path::Path,
        cap: csi::VolumeCapability,
        readonly: bool,
    ) -> Check {
        let publish = csi::NodePublishVolumeRequest {
            volume_id: v.volume_id.clone(),
            publish_context: pc.clone(),
            staging_target_path: staging.to_string_lossy().into_owned(),
            target_path: target.to_string_lossy().into_owned(),
            volume_capability: Some(cap),
            readonly,
            secrets: self.cfg.secrets.clone(),
            volume_context: v.volume_context.clone(),
        };
        ok(
            self.node
                .node_publish_volume(self.req(publish.clone()))
                .await,
            "NodePublishVolume",
        )?;
        ok(
            self.node.node_publish_volume(self.req(publish)).await,
            "NodePublishVolume again",
        )?;
        Ok(())
    }

    /// NodeUnpublishVolume twice; the target must be gone.
    pub(super) async fn node_unpublish(
        &mut self,
        v: &csi::Volume,
        target: &std::path::Path,
    ) -> Check {
        let un = csi::NodeUnpublishVolumeRequest {
            volume_id: v.volume_id.clone(),
            target_path: target.to_string_lossy().into_owned(),
        };
        ok(
            self.node.node_unpublish_volume(self.req(un.clone())).await,
            "NodeUnpublishVolume",
        )?;
        ok(
            self.node.node_unpublish_volume(self.req(un)).await,
            "NodeUnpublishVolume again",
        )?;
        ensure(!self.mounted(target) && !self.seen(target).exists(), || {
            format!("{} left behind", target.display())
        })
    }

    /// unpublish ×2 → unstage ×2 → (controller unpublish ×2) → delete ×2.
    pub(super) async fn tear_down(
        &mut self,
        v: &csi::Volume,
        staging: &std::path::Path,
        target: &std::path::Path,
    ) -> Check {
        let node = self.node_id.clone().ok_or("no node id")?;
        self.node_unpublish(v, target).await?;
        let us = csi::NodeUnstageVolumeRequest {
            volume_id: v.volume_id.clone(),
            staging_target_path: staging.to_string_lossy().into_owned(),
        };
        ok(
            self.node.node_unstage_volume(self.req(us.clone())).await,
            "NodeUnstageVolume",
        )?;
        ok(
            self.node.node_unstage_volume(self.req(us)).await,
            "NodeUnstageVolume again",
        )?;
        ensure(!self.mounted(staging), || {
            format!("{} still mounted", staging.display())
        })?;
        if self.publishes() {
            let cu = csi::ControllerUnpublishVolumeRequest {
                volume_id: v.volume_id.clone(),
                node_id: node,
                secrets: self.cfg.secrets.clone(),
            };
            ok(
                self.controller
                    .controller_unpublish_volume(self.req(cu.clone()))
                    .await,
                "ControllerUnpublishVolume",
            )?;
            ok(
                self.controller
                    .controller_unpublish_volume(self.req(cu))
                    .await,
                "ControllerUnpublishVolume again",
            )?;
        }
        self.delete_volume(&v.volume_id).await?;
        self.delete_volume(&v.volume_id).await
    }

    pub(super) async fn lifecycle_mount(&mut self) -> Check {
        let cap = mount_cap(&self.cfg.fs_type, Mode::SingleNodeWriter);
        let (v, staging, target, _) = self.bring_up(cap, "life").await?;
        ensure(self.mounted(&staging), || "staging path not mounted".into())?;
        ensure(self.mounted(&target), || "target path not mounted".into())?;
        std::fs::write(self.seen(&target).join("hello"), b"sanity")
            .map_err(|e| format!("writing to the volume: {e}"))?;
        let seen = std::fs::read(self.seen(&staging).join("hello"))
            .map_err(|e| format!("reading through staging: {e}"))?;
        ensure(seen == b"sanity", || "target and staging disagree".into())?;
        if self.node_caps.contains(&NRpc::GetVolumeStats) {
            let st = ok(
                self.node
                    .node_get_volume_stats(self.req(csi::NodeGetVolumeStatsRequest {
                        volume_id: v.volume_id.clone(),
                        volume_path: target.to_string_lossy().into_owned(),
                        staging_target_path: staging.to_string_lossy().into_owned(),
                    }))
                    .await,
                "NodeGetVolumeStats",
            )?;
            let bytes = st
                .usage
                .iter()
                .find(|u| u.unit == csi::volume_usage::Unit::Bytes as i32)
                .ok_or("no byte usage")?;
            ensure(bytes.total > 0 && bytes.used >= 0, || {
                format!("implausible usage {bytes:?}")
            })?;
            if self.cfg.block {
                // a block-backed filesystem is no larger than its volume
                ensure(bytes.total <= v.capacity_bytes && bytes.used > 0, || {
                    format!("implausible usage {bytes:?}")
                })?;
            }
            ensure(
                st.usage
                    .iter()
                    .any(|u| u.unit == csi::volume_usage::Unit::Inodes as i32),
                || "no inode usage".into(),
            )?;
            // a volume the node has, asked for at a path it is not at
            expect_code(
                self.node
                    .node_get_volume_stats(self.req(csi::NodeGetVolumeStatsRequest {
                        volume_id: v.volume_id.clone(),
                        volume_path: "some/path".into(),
                        staging_target_path: String::new(),
                    }))
                    .await,
                Code::NotFound,
                "NodeGetVolumeStats of a published volume at \"some/path\"",
            )?;
        }
        self.tear_down(&v, &staging, &target).await
    }

    pub(super) async fn lifecycle_block(&mut self) -> Check {
        let cap = block_cap(Mode::SingleNodeWriter);
        if !self.cfg.block {
            let name = self.name("noblock");
            let req = self.create_req(&name, cap, self.cfg.volume_size);
            return expect_code(
                self.controller.create_volume(self.req(req)).await,
                Code::InvalidArgument,
                "a raw block volume from a driver that serves none",
            );
        }
        let (v, staging, target, _) = self.bring_up(cap, "block").await?;
        let meta = std::fs::metadata(self.seen(&target)).map_err(|e| format!("target: {e}"))?;
        ensure(meta.file_type().is_block_device(), || {
            "target is not a block device".into()
        })?;
        ensure(!self.mounted(&staging), || {
            "a block volume was mounted at staging".into()
        })?;
        {
            use std::io::{Seek, SeekFrom, Write};
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .open(self.seen(&target))
                .map_err(|e| format!("opening the device: {e}"))?;
            let size = f.seek(SeekFrom::End(0)).map_err(|e| e.to_string())?;
            ensure(size as i64 == v.capacity_bytes, || {
                format!("device is {size} bytes, volume {}", v.capacity_bytes)
            })?;
            f.seek(SeekFrom::Start(0)).map_err(|e| e.to_string())?;
            f.write_all(b"raw")
                .map_err(|e| format!("writing the device: {e}"))?;
        }
        self.tear_down(&v, &staging, &target).await
    }

    /// One volume, several publishers: what one writes the other reads; a
    /// read-only publish refuses writes. A driver that shares nothing must
    /// refuse a multi-node mount volume.
    pub(super) async fn lifecycle_shared(&mut self) -> Check {
        let cap = mount_cap(&self.cfg.fs_type, Mode::MultiNodeMultiWriter);
        if !self.cfg.shared {
            let name = self.name("noshare");
            let req = self.create_req(&name, cap, self.cfg.volume_size);
            return expect_code(
                self.controller.create_volume(self.req(req)).await,
                Code::InvalidArgument,
                "a file system on several nodes from a driver that shares none",
            );
        }
        let (v, staging, a, pc) = self.bring_up(cap.clone(), "shared").await?;
        let b = self
            .cfg
            .mount_dir
            .join(format!("pods/{}/second", v.volume_id));
        let ro = self
            .cfg
            .mount_dir
            .join(format!("pods/{}/reader", v.volume_id));
        self.node_publish(&v, &pc, &staging, &b, cap.clone(), false)
            .await?;
        self.node_publish(&v, &pc, &staging, &ro, cap, true).await?;
        std::fs::write(self.seen(&a).join("shared"), b"one writer")
            .map_err(|e| format!("writing in the first publish: {e}"))?;
        let got = std::fs::read(self.seen(&b).join("shared"))
            .map_err(|e| format!("reading in the second publish: {e}"))?;
        ensure(got == b"one writer", || {
            "the second publisher does not see the first's write".into()
        })?;
        ensure(
            std::fs::write(self.seen(&ro).join("nope"), b"x").is_err(),
            || "a read-only publish accepted a write".into(),
        )?;
        self.node_unpublish(&v, &b).await?;
        self.node_unpublish(&v, &ro).await?;
        self.tear_down(&v, &staging, &a).await
    }

    /// ReadWriteOncePod's guarantee on the node (csi-test #602): a volume
    /// published SINGLE_NODE_SINGLE_WRITER at one target path is refused
    /// at another, and nothing is mounted there; the same path again is
    /// fine. SINGLE_NODE_MULTI_WRITER publishes at several paths.
    pub(super) async fn single_writer_publish(&mut self) -> Check {
        for (mode, second_allowed) in [
            (Mode::SingleNodeSingleWriter, false),
            (Mode::SingleNodeMultiWriter, true),
        ] {
            let cap = mount_cap(&self.cfg.fs_type, mode);
            let (v, staging, a, pc) = self.bring_up(cap.clone(), "onewriter").await?;
            let b = self
                .cfg
                .mount_dir
                .join(format!("pods/{}/second", v.volume_id));
            let publish = csi::NodePublishVolumeRequest {
                volume_id: v.volume_id.clone(),
                publish_context: pc.clone(),
                staging_target_path: staging.to_string_lossy().into_owned(),
                target_path: b.to_string_lossy().into_owned(),
                volume_capability: Some(cap.clone()),
                readonly: false,
                secrets: self.cfg.secrets.clone(),
                volume_context: v.volume_context.clone(),
            };
            let r = self.node.node_publish_volume(self.req(publish)).await;
            if second_allowed {
                ok(
                    r,
                    "NodePublishVolume at a second path (SINGLE_NODE_MULTI_WRITER)",
                )?;
                self.node_unpublish(&v, &b).await?;
            } else {
                expect_code(
                    r,
                    Code::FailedPrecondition,
                    "NodePublishVolume at a second path of a SINGLE_NODE_SINGLE_WRITER volume",
                )?;
                ensure(!self.mounted(&b), || {
                    format!("{} mounted although refused", b.display())
                })?;
                // the first path again: still fine
                self.node_publish(&v, &pc, &staging, &a, cap.clone(), false)
                    .await?;
            }
            self.tear_down(&v, &staging, &a).await?;
        }
        Ok(())
    }

    pub(super) async fn lifecycle_expand(&mut self) -> Check {
        let cap = mount_cap(&self.cfg.expansion_fs_type, Mode::SingleNodeWriter);
        let (v, staging, target, _) = self.bring_up(cap.clone(), "grow").await?;
        std::fs::write(self.seen(&target).join("keep"), b"data").map_err(|e| e.to_string())?;
        let want = v.capacity_bytes + GIB;
        let r = ok(
            self.controller
                .controller_expand_volume(self.req(csi::ControllerExpandVolumeRequest {
                    volume_id: v.volume_id.clone(),
                    capacity_range: Some(csi::CapacityRange {
                        required_bytes: want,
                        limit_bytes: 0,
                    }),
                    secrets: self.cfg.secrets.clone(),
                    volume_capability: Some(cap.clone()),
                }))
                .await,
            "ControllerExpandVolume",
        )?;
        ensure(r.capacity_bytes >= want, || {
            format!("controller reports {} < {want}", r.capacity_bytes)
        })?;
        let node_expands = self.node_caps.contains(&NRpc::ExpandVolume);
        if node_expands {
            ensure(r.node_expansion_required, || {
                "a filesystem volume needs node expansion".into()
            })?;
            let n = ok(
                self.node
                    .node_expand_volume(self.req(csi::NodeExpandVolumeRequest {
                        volume_id: v.volume_id.clone(),
                        volume_path: target.to_string_lossy().into_owned(),
                        capacity_range: Some(csi::CapacityRange {
                            required_bytes: want,
                            limit_bytes: 0,
                        }),
                        staging_target_path: staging.to_string_lossy().into_owned(),
                        volume_capability: Some(cap),
                        secrets: HashMap::new(),
                    }))
                    .await,
                "NodeExpandVolume",
            )?;
            ensure(n.capacity_bytes >= want, || {
                format!("node reports {} < {want}", n.capacity_bytes)
            })?;
        } else {
            ensure(!r.node_expansion_required, || {
                "node expansion required from a node without EXPAND_VOLUME".into()
            })?;
        }
        if node_expands || self.cfg.quota_on_node {
            let mut total = 0;
            // a quota shows on the node's side a moment later
            for _ in 0..50 {
                let st = ok(
                    self.node
                        .node_get_volume_stats(self.req(csi::NodeGetVolumeStatsRequest {
                            volume_id: v.volume_id.clone(),
                            volume_path: target.to_string_lossy().into_owned(),
                            staging_target_path: String::new(),
                        }))
                        .await,
                    "NodeGetVolumeStats",
                )?;
                total = st
                    .usage
                    .iter()
                    .find(|u| u.unit == csi::volume_usage::Unit::Bytes as i32)
                    .map(|u| u.total)
                    .unwrap_or(0);
                if total > v.capacity_bytes {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            ensure(total > v.capacity_bytes, || {
                format!(
                    "filesystem is {total} bytes after growing past {}",
                    v.capacity_bytes
                )
            })?;
        }
        let kept = std::fs::read(self.seen(&target).join("keep")).map_err(|e| e.to_string())?;
        ensure(kept == b"data", || "data changed by the expansion".into())?;
        self.tear_down(&v, &staging, &target).await
    }
}
