//! Node checks: NodeGetInfo, the node calls' missing and invalid
//! arguments, unknown paths, and the attach limit a node reports, held
//! by the controller.

use super::*;

impl Suite {
    pub(super) async fn node_info_rules(&mut self) -> Check {
        let caps = ok(
            self.node
                .node_get_capabilities(csi::NodeGetCapabilitiesRequest {})
                .await,
            "NodeGetCapabilities",
        )?;
        for c in caps.capabilities {
            match c.r#type {
                Some(csi::node_service_capability::Type::Rpc(r))
                    if NRpc::try_from(r.r#type).is_ok_and(|t| t != NRpc::Unknown) => {}
                other => return Err(format!("unknown node capability {other:?}")),
            }
        }
        let info = ok(
            self.node.node_get_info(csi::NodeGetInfoRequest {}).await,
            "NodeGetInfo",
        )?;
        ensure(!info.node_id.is_empty(), || "empty node_id".into())?;
        ensure(info.max_volumes_per_node >= 0, || {
            "negative max_volumes_per_node".into()
        })
    }

    pub(super) async fn node_bad_args(&mut self) -> Check {
        let cap = mount_cap(&self.cfg.fs_type, Mode::SingleNodeWriter);
        let staging = self
            .cfg
            .mount_dir
            .join("bad-args/staging")
            .to_string_lossy()
            .into_owned();
        let target = self
            .cfg
            .mount_dir
            .join("bad-args/target")
            .to_string_lossy()
            .into_owned();
        let stage = |id: &str, path: &str, cap: Option<csi::VolumeCapability>| {
            csi::NodeStageVolumeRequest {
                volume_id: id.into(),
                staging_target_path: path.into(),
                volume_capability: cap,
                ..Default::default()
            }
        };
        for (what, req) in [
            (
                "stage: no volume id",
                stage("", &staging, Some(cap.clone())),
            ),
            (
                "stage: no staging path",
                stage(FAKE_VOLUME, "", Some(cap.clone())),
            ),
            ("stage: no capability", stage(FAKE_VOLUME, &staging, None)),
            (
                "stage: relative path",
                stage(FAKE_VOLUME, "relative/path", Some(cap.clone())),
            ),
        ] {
            expect_code(
                self.node.node_stage_volume(self.req(req)).await,
                Code::InvalidArgument,
                what,
            )?;
        }
        let publish =
            |id: &str, t: &str, cap: Option<csi::VolumeCapability>| csi::NodePublishVolumeRequest {
                volume_id: id.into(),
                staging_target_path: staging.clone(),
                target_path: t.into(),
                volume_capability: cap,
                ..Default::default()
            };
        let dotdot = format!("{target}/../../../../etc");
        for (what, req) in [
            (
                "publish: no volume id",
                publish("", &target, Some(cap.clone())),
            ),
            (
                "publish: no target path",
                publish(FAKE_VOLUME, "", Some(cap.clone())),
            ),
            (
                "publish: no capability",
                publish(FAKE_VOLUME, &target, None),
            ),
            (
                "publish: path with ..",
                publish(FAKE_VOLUME, &dotdot, Some(cap.clone())),
            ),
        ] {
            expect_code(
                self.node.node_publish_volume(self.req(req)).await,
                Code::InvalidArgument,
                what,
            )?;
        }
        expect_code(
            self.node
                .node_unpublish_volume(self.req(csi::NodeUnpublishVolumeRequest {
                    volume_id: String::new(),
                    target_path: target.clone(),
                }))
                .await,
            Code::InvalidArgument,
            "unpublish: no volume id",
        )?;
        expect_code(
            self.node
                .node_unpublish_volume(self.req(csi::NodeUnpublishVolumeRequest {
                    volume_id: FAKE_VOLUME.into(),
                    target_path: String::new(),
                }))
                .await,
            Code::InvalidArgument,
            "unpublish: no target",
        )?;
        expect_code(
            self.node
                .node_unstage_volume(self.req(csi::NodeUnstageVolumeRequest {
                    volume_id: String::new(),
                    staging_target_path: staging.clone(),
                }))
                .await,
            Code::InvalidArgument,
            "unstage: no volume id",
        )?;
        expect_code(
            self.node
                .node_unstage_volume(self.req(csi::NodeUnstageVolumeRequest {
                    volume_id: FAKE_VOLUME.into(),
                    staging_target_path: String::new(),
                }))
                .await,
            Code::InvalidArgument,
            "unstage: no staging path",
        )?;
        if self.node_caps.contains(&NRpc::GetVolumeStats) {
            expect_code(
                self.node
                    .node_get_volume_stats(self.req(csi::NodeGetVolumeStatsRequest {
                        volume_id: String::new(),
                        volume_path: target.clone(),
                        staging_target_path: String::new(),
                    }))
                    .await,
                Code::InvalidArgument,
                "stats: no volume id",
            )?;
            expect_code(
                self.node
                    .node_get_volume_stats(self.req(csi::NodeGetVolumeStatsRequest {
                        volume_id: FAKE_VOLUME.into(),
                        volume_path: String::new(),
                        staging_target_path: String::new(),
                    }))
                    .await,
                Code::InvalidArgument,
                "stats: no path",
            )?;
        }
        if self.node_caps.contains(&NRpc::ExpandVolume) {
            expect_code(
                self.node
                    .node_expand_volume(self.req(csi::NodeExpandVolumeRequest {
                        volume_id: String::new(),
                        volume_path: target.clone(),
                        ..Default::default()
                    }))
                    .await,
                Code::InvalidArgument,
                "expand: no volume id",
            )?;
            expect_code(
                self.node
                    .node_expand_volume(self.req(csi::NodeExpandVolumeRequest {
                        volume_id: FAKE_VOLUME.into(),
                        volume_path: String::new(),
                        ..Default::default()
                    }))
                    .await,
                Code::InvalidArgument,
                "expand: no path",
            )?;
        }
        Ok(())
    }

    /// A `volume_path` that does not exist, or a relative one, holds no
    /// volume: NotFound (the spec's code), never InvalidArgument, and
    /// nothing is touched.
    pub(super) async fn node_paths_not_found(&mut self) -> Check {
        let absent = self
            .cfg
            .mount_dir
            .join("never-created")
            .to_string_lossy()
            .into_owned();
        for path in [absent, "some/path".to_string()] {
            if self.node_caps.contains(&NRpc::GetVolumeStats) {
                expect_code(
                    self.node
                        .node_get_volume_stats(self.req(csi::NodeGetVolumeStatsRequest {
                            volume_id: FAKE_VOLUME.into(),
                            volume_path: path.clone(),
                            staging_target_path: String::new(),
                        }))
                        .await,
                    Code::NotFound,
                    &format!("NodeGetVolumeStats of {path:?}"),
                )?;
            }
            if self.node_caps.contains(&NRpc::ExpandVolume) {
                expect_code(
                    self.node
                        .node_expand_volume(self.req(csi::NodeExpandVolumeRequest {
                            volume_id: FAKE_VOLUME.into(),
                            volume_path: path.clone(),
                            ..Default::default()
                        }))
                        .await,
                    Code::NotFound,
                    &format!("NodeExpandVolume of {path:?}"),
                )?;
            }
        }
        Ok(())
    }

    /// Publishing one volume more than the node takes is refused with the
    /// spec's ResourceExhausted, and leaves no attachment behind.
    pub(super) async fn attach_limit(&mut self) -> Check {
        let node = self.node_id.clone().ok_or("no node id")?;
        let max = self.max_volumes_per_node as usize;
        let cap = mount_cap(&self.cfg.fs_type, Mode::SingleNodeWriter);
        let mut ids = Vec::new();
        for _ in 0..=max {
            ids.push(self.new_volume("full", cap.clone()).await?.volume_id);
        }
        let result = async {
            for id in &ids[..max] {
                ok(
                    self.controller
                        .controller_publish_volume(self.req(self.publish_req(
                            id,
                            &node,
                            cap.clone(),
                        )))
                        .await,
                    "ControllerPublishVolume within the limit",
                )?;
            }
            expect_code(
                self.controller
                    .controller_publish_volume(self.req(self.publish_req(
                        &ids[max],
                        &node,
                        cap.clone(),
                    )))
                    .await,
                Code::ResourceExhausted,
                "ControllerPublishVolume past max_volumes_per_node",
            )?;
            if self.controller_caps.contains(&CRpc::GetVolume) {
                let r = ok(
                    self.controller
                        .controller_get_volume(self.req(csi::ControllerGetVolumeRequest {
                            volume_id: ids[max].clone(),
                        }))
                        .await,
                    "ControllerGetVolume",
                )?;
                let nodes = r.status.map(|s| s.published_node_ids).unwrap_or_default();
                ensure(nodes.is_empty(), || {
                    format!("the refused volume is published to {nodes:?}")
                })?;
            }
            Ok::<(), String>(())
        }
        .await;
        for id in &ids {
            let un = csi::ControllerUnpublishVolumeRequest {
                volume_id: id.clone(),
                node_id: node.clone(),
                secrets: self.cfg.secrets.clone(),
            };
            ok(
                self.controller
                    .controller_unpublish_volume(self.req(un))
                    .await,
                "ControllerUnpublishVolume",
            )?;
        }
        for id in &ids {
            self.delete_volume(id).await?;
        }
        result
    }
}
