//! Controller checks of volumes, in the manner of csi-sanity: capabilities,
//! CreateVolume's arguments, idempotency and conflicts, DeleteVolume,
//! ValidateVolumeCapabilities, ListVolumes and ControllerGetVolume,
//! ControllerPublishVolume's arguments and idempotency, expansion, the
//! single-node access modes, and that a deleted volume is gone.

use super::*;

impl Suite {
    pub(super) async fn controller_caps_known(&mut self) -> Check {
        let r = ok(
            self.controller
                .controller_get_capabilities(csi::ControllerGetCapabilitiesRequest {})
                .await,
            "ControllerGetCapabilities",
        )?;
        for c in r.capabilities {
            match c.r#type {
                Some(csi::controller_service_capability::Type::Rpc(r))
                    if CRpc::try_from(r.r#type).is_ok_and(|t| t != CRpc::Unknown) => {}
                other => return Err(format!("unknown capability {other:?}")),
            }
        }
        Ok(())
    }

    pub(super) async fn create_bad_args(&mut self) -> Check {
        let mut r = self.create_req(
            "",
            mount_cap(&self.cfg.fs_type, Mode::SingleNodeWriter),
            GIB,
        );
        expect_code(
            self.controller.create_volume(self.req(r.clone())).await,
            Code::InvalidArgument,
            "no name",
        )?;
        r.name = self.name("nocaps");
        r.volume_capabilities.clear();
        expect_code(
            self.controller.create_volume(self.req(r.clone())).await,
            Code::InvalidArgument,
            "no capabilities",
        )?;
        r.volume_capabilities = vec![csi::VolumeCapability {
            access_type: None,
            access_mode: None,
        }];
        expect_code(
            self.controller.create_volume(self.req(r.clone())).await,
            Code::InvalidArgument,
            "empty capability",
        )?;
        r.volume_capabilities = vec![mount_cap(&self.cfg.fs_type, Mode::SingleNodeWriter)];
        r.capacity_range = Some(csi::CapacityRange {
            required_bytes: -1,
            limit_bytes: 0,
        });
        expect_code(
            self.controller.create_volume(self.req(r)).await,
            Code::InvalidArgument,
            "negative capacity",
        )
    }

    pub(super) async fn create_idempotent(&mut self) -> Check {
        let name = self.name("idem");
        let a = self
            .create_volume(&name, mount_cap(&self.cfg.fs_type, Mode::SingleNodeWriter))
            .await?;
        let b = self
            .create_volume(&name, mount_cap(&self.cfg.fs_type, Mode::SingleNodeWriter))
            .await?;
        ensure(a.volume_id == b.volume_id, || {
            format!(
                "two volumes for one name: {} and {}",
                a.volume_id, b.volume_id
            )
        })?;
        ensure(a.capacity_bytes >= self.cfg.volume_size, || {
            format!(
                "capacity {} < requested {}",
                a.capacity_bytes, self.cfg.volume_size
            )
        })?;
        self.delete_volume(&a.volume_id).await?;
        // no capacity range: the driver picks the size, the same each time
        let name = self.name("nosize");
        let mut req = self.create_req(
            &name,
            mount_cap(&self.cfg.fs_type, Mode::SingleNodeWriter),
            0,
        );
        req.capacity_range = None;
        let mut ids = Vec::new();
        for what in ["CreateVolume without a capacity range", "the same again"] {
            ids.push(self.send_create(req.clone(), what).await?.volume_id);
        }
        ensure(ids[0] == ids[1], || {
            format!("two volumes for one name without a size: {ids:?}")
        })?;
        self.delete_volume(&ids[0]).await
    }

    pub(super) async fn create_conflict(&mut self) -> Check {
        let name = self.name("conflict");
        let a = self
            .create_volume(&name, mount_cap(&self.cfg.fs_type, Mode::SingleNodeWriter))
            .await?;
        let mut r = self.create_req(
            &name,
            mount_cap(&self.cfg.fs_type, Mode::SingleNodeWriter),
            0,
        );
        r.capacity_range = Some(csi::CapacityRange {
            required_bytes: a.capacity_bytes + 2 * GIB,
            limit_bytes: a.capacity_bytes + 3 * GIB,
        });
        expect_code(
            self.controller.create_volume(self.req(r)).await,
            Code::AlreadyExists,
            "same name, larger size",
        )?;
        self.delete_volume(&a.volume_id).await
    }

    pub(super) async fn delete_rules(&mut self) -> Check {
        let req = |id: &str, s: &HashMap<String, String>| csi::DeleteVolumeRequest {
            volume_id: id.into(),
            secrets: s.clone(),
        };
        expect_code(
            self.controller
                .delete_volume(self.req(req("", &self.cfg.secrets)))
                .await,
            Code::InvalidArgument,
            "no id",
        )?;
        ok(
            self.controller
                .delete_volume(self.req(req(FAKE_VOLUME, &self.cfg.secrets)))
                .await,
            "unknown id",
        )?;
        ok(
            self.controller
                .delete_volume(self.req(req("not-a-volume-id", &self.cfg.secrets)))
                .await,
            "malformed id",
        )?;
        let name = self.name("delete");
        let v = self
            .create_volume(&name, mount_cap(&self.cfg.fs_type, Mode::SingleNodeWriter))
            .await?;
        self.delete_volume(&v.volume_id).await?;
        self.delete_volume(&v.volume_id).await
    }

    pub(super) async fn validate_rules(&mut self) -> Check {
        let caps = vec![mount_cap(&self.cfg.fs_type, Mode::SingleNodeWriter)];
        let secrets = self.cfg.secrets.clone();
        let req =
            |id: &str, caps: Vec<csi::VolumeCapability>| csi::ValidateVolumeCapabilitiesRequest {
                volume_id: id.into(),
                volume_capabilities: caps,
                secrets: secrets.clone(),
                ..Default::default()
            };
        expect_code(
            self.controller
                .validate_volume_capabilities(self.req(req("", caps.clone())))
                .await,
            Code::InvalidArgument,
            "no id",
        )?;
        expect_code(
            self.controller
                .validate_volume_capabilities(self.req(req(FAKE_VOLUME, caps.clone())))
                .await,
            Code::NotFound,
            "unknown volume",
        )?;
        let name = self.name("validate");
        let v = self.create_volume(&name, caps[0].clone()).await?;
        expect_code(
            self.controller
                .validate_volume_capabilities(self.req(req(&v.volume_id, vec![])))
                .await,
            Code::InvalidArgument,
            "no capabilities",
        )?;
        let r = ok(
            self.controller
                .validate_volume_capabilities(self.req(req(&v.volume_id, caps.clone())))
                .await,
            "valid request",
        )?;
        ensure(r.confirmed.is_some(), || {
            format!("SINGLE_NODE_WRITER not confirmed: {}", r.message)
        })?;
        self.delete_volume(&v.volume_id).await
    }

    pub(super) async fn list_volumes_rules(&mut self) -> Check {
        let mut ids = Vec::new();
        for _ in 0..3 {
            let name = self.name("list");
            ids.push(
                self.create_volume(&name, mount_cap(&self.cfg.fs_type, Mode::SingleNodeWriter))
                    .await?
                    .volume_id,
            );
        }
        let mut seen = Vec::new();
        let mut token = String::new();
        for _ in 0..10_000 {
            let r = ok(
                self.controller
                    .list_volumes(self.req(csi::ListVolumesRequest {
                        max_entries: 1,
                        starting_token: token.clone(),
                    }))
                    .await,
                "ListVolumes",
            )?;
            ensure(r.entries.len() <= 1, || {
                format!("max_entries 1 returned {}", r.entries.len())
            })?;
            seen.extend(
                r.entries
                    .into_iter()
                    .filter_map(|e| e.volume.map(|v| v.volume_id)),
            );
            if r.next_token.is_empty() {
                break;
            }
            token = r.next_token;
        }
        for id in &ids {
            ensure(seen.contains(id), || {
                format!("volume {id} missing from the paginated listing")
            })?;
        }
        expect_code(
            self.controller
                .list_volumes(self.req(csi::ListVolumesRequest {
                    max_entries: 0,
                    starting_token: "no-such-token".into(),
                }))
                .await,
            Code::Aborted,
            "bad token",
        )?;
        expect_code(
            self.controller
                .list_volumes(self.req(csi::ListVolumesRequest {
                    max_entries: -1,
                    starting_token: String::new(),
                }))
                .await,
            Code::InvalidArgument,
            "negative max_entries",
        )?;
        for id in ids {
            self.delete_volume(&id).await?;
        }
        Ok(())
    }

    pub(super) async fn get_volume_rules(&mut self) -> Check {
        let req = |id: &str| csi::ControllerGetVolumeRequest {
            volume_id: id.into(),
        };
        expect_code(
            self.controller
                .controller_get_volume(self.req(req("")))
                .await,
            Code::InvalidArgument,
            "no id",
        )?;
        expect_code(
            self.controller
                .controller_get_volume(self.req(req(FAKE_VOLUME)))
                .await,
            Code::NotFound,
            "unknown id",
        )?;
        let name = self.name("get");
        let v = self
            .create_volume(&name, mount_cap(&self.cfg.fs_type, Mode::SingleNodeWriter))
            .await?;
        let r = ok(
            self.controller
                .controller_get_volume(self.req(req(&v.volume_id)))
                .await,
            "ControllerGetVolume",
        )?;
        let got = r.volume.ok_or("no volume in the answer")?;
        ensure(got.volume_id == v.volume_id, || {
            format!("asked for {}, got {}", v.volume_id, got.volume_id)
        })?;
        let status = r.status.ok_or("no status")?;
        ensure(status.published_node_ids.is_empty(), || {
            format!(
                "unpublished volume lists nodes {:?}",
                status.published_node_ids
            )
        })?;
        self.delete_volume(&v.volume_id).await
    }

    pub(super) async fn publish_bad_args(&mut self) -> Check {
        let cap = mount_cap(&self.cfg.fs_type, Mode::SingleNodeWriter);
        let node = self.node_id.clone().unwrap_or_else(|| FAKE_NODE.into());
        let r = self.publish_req("", &node, cap.clone());
        expect_code(
            self.controller.controller_publish_volume(self.req(r)).await,
            Code::InvalidArgument,
            "no volume id",
        )?;
        let r = self.publish_req(FAKE_VOLUME, "", cap.clone());
        expect_code(
            self.controller.controller_publish_volume(self.req(r)).await,
            Code::InvalidArgument,
            "no node id",
        )?;
        let mut r = self.publish_req(FAKE_VOLUME, &node, cap.clone());
        r.volume_capability = None;
        expect_code(
            self.controller.controller_publish_volume(self.req(r)).await,
            Code::InvalidArgument,
            "no capability",
        )?;
        let r = self.publish_req(FAKE_VOLUME, &node, cap.clone());
        expect_code(
            self.controller.controller_publish_volume(self.req(r)).await,
            Code::NotFound,
            "unknown volume",
        )?;
        let name = self.name("pubargs");
        let v = self.create_volume(&name, cap.clone()).await?;
        let r = self.publish_req(&v.volume_id, FAKE_NODE, cap.clone());
        expect_code(
            self.controller.controller_publish_volume(self.req(r)).await,
            Code::NotFound,
            "unknown node",
        )?;
        let r = csi::ControllerUnpublishVolumeRequest {
            volume_id: String::new(),
            node_id: node,
            secrets: self.cfg.secrets.clone(),
        };
        expect_code(
            self.controller
                .controller_unpublish_volume(self.req(r))
                .await,
            Code::InvalidArgument,
            "unpublish without volume id",
        )?;
        self.delete_volume(&v.volume_id).await
    }

    pub(super) async fn publish_idempotent(&mut self) -> Check {
        let node = self.node_id.clone().ok_or("no node id")?;
        let cap = mount_cap(&self.cfg.fs_type, Mode::SingleNodeWriter);
        let name = self.name("pubidem");
        let v = self.create_volume(&name, cap.clone()).await?;
        let a = ok(
            self.controller
                .controller_publish_volume(self.req(self.publish_req(
                    &v.volume_id,
                    &node,
                    cap.clone(),
                )))
                .await,
            "publish",
        )?;
        let b = ok(
            self.controller
                .controller_publish_volume(self.req(self.publish_req(
                    &v.volume_id,
                    &node,
                    cap.clone(),
                )))
                .await,
            "publish again",
        )?;
        ensure(a.publish_context == b.publish_context, || {
            format!(
                "publish contexts differ: {:?} vs {:?}",
                a.publish_context, b.publish_context
            )
        })?;
        if self.controller_caps.contains(&CRpc::GetVolume) {
            let r = ok(
                self.controller
                    .controller_get_volume(self.req(csi::ControllerGetVolumeRequest {
                        volume_id: v.volume_id.clone(),
                    }))
                    .await,
                "get",
            )?;
            let nodes = r.status.map(|s| s.published_node_ids).unwrap_or_default();
            ensure(nodes == vec![node.clone()], || {
                format!("published nodes {nodes:?}, expected [{node}]")
            })?;
        }
        let un = || csi::ControllerUnpublishVolumeRequest {
            volume_id: v.volume_id.clone(),
            node_id: node.clone(),
            secrets: self.cfg.secrets.clone(),
        };
        ok(
            self.controller
                .controller_unpublish_volume(self.req(un()))
                .await,
            "unpublish",
        )?;
        ok(
            self.controller
                .controller_unpublish_volume(self.req(un()))
                .await,
            "unpublish again",
        )?;
        self.delete_volume(&v.volume_id).await
    }

    pub(super) async fn controller_expand_rules(&mut self) -> Check {
        let range = |b: i64| {
            Some(csi::CapacityRange {
                required_bytes: b,
                limit_bytes: 0,
            })
        };
        let req = |id: &str, r: Option<csi::CapacityRange>, s: &HashMap<String, String>| {
            csi::ControllerExpandVolumeRequest {
                volume_id: id.into(),
                capacity_range: r,
                secrets: s.clone(),
                volume_capability: None,
            }
        };
        expect_code(
            self.controller
                .controller_expand_volume(self.req(req("", range(2 * GIB), &self.cfg.secrets)))
                .await,
            Code::InvalidArgument,
            "no id",
        )?;
        expect_code(
            self.controller
                .controller_expand_volume(self.req(req(
                    FAKE_VOLUME,
                    range(2 * GIB),
                    &self.cfg.secrets,
                )))
                .await,
            Code::NotFound,
            "unknown volume",
        )?;
        let v = self
            .new_volume(
                "cexpand",
                mount_cap(&self.cfg.fs_type, Mode::SingleNodeWriter),
            )
            .await?;
        expect_code(
            self.controller
                .controller_expand_volume(self.req(req(&v.volume_id, None, &self.cfg.secrets)))
                .await,
            Code::InvalidArgument,
            "no capacity range",
        )?;
        let want = v.capacity_bytes + GIB;
        let a = ok(
            self.controller
                .controller_expand_volume(self.req(req(
                    &v.volume_id,
                    range(want),
                    &self.cfg.secrets,
                )))
                .await,
            "expand",
        )?;
        ensure(a.capacity_bytes >= want, || {
            format!("expanded to {} < {want}", a.capacity_bytes)
        })?;
        let b = ok(
            self.controller
                .controller_expand_volume(self.req(req(
                    &v.volume_id,
                    range(want),
                    &self.cfg.secrets,
                )))
                .await,
            "expand again",
        )?;
        ensure(b.capacity_bytes == a.capacity_bytes, || {
            "repeat changed the size".into()
        })?;
        self.delete_volume(&v.volume_id).await
    }

    /// Every volume id ListVolumes returns, page by page.
    pub(super) async fn listed_volumes(&mut self) -> Result<Vec<String>, String> {
        let mut seen = Vec::new();
        let mut token = String::new();
        for _ in 0..10_000 {
            let r = ok(
                self.controller
                    .list_volumes(self.req(csi::ListVolumesRequest {
                        max_entries: 100,
                        starting_token: token.clone(),
                    }))
                    .await,
                "ListVolumes",
            )?;
            seen.extend(
                r.entries
                    .into_iter()
                    .filter_map(|e| e.volume.map(|v| v.volume_id)),
            );
            if r.next_token.is_empty() {
                return Ok(seen);
            }
            token = r.next_token;
        }
        Err("ListVolumes never ended".into())
    }

    /// A backend deletes asynchronously; the driver answers when the
    /// object is gone, so what a CO does next (list, get, delete the
    /// source) sees it gone.
    pub(super) async fn deletion_complete(&mut self) -> Check {
        let v = self
            .new_volume("gone", mount_cap(&self.cfg.fs_type, Mode::SingleNodeWriter))
            .await?;
        if self.controller_caps.contains(&CRpc::CreateDeleteSnapshot) {
            let s = self.create_snapshot(&v.volume_id).await?;
            self.wait_snapshot_ready(&s.snapshot_id).await?;
            self.delete_snapshot(&s.snapshot_id).await?;
        }
        // at once: its last snapshot is gone
        self.delete_volume(&v.volume_id).await?;
        if self.controller_caps.contains(&CRpc::ListVolumes) {
            let listed = self.listed_volumes().await?;
            ensure(!listed.contains(&v.volume_id), || {
                format!(
                    "volume {} still listed after DeleteVolume answered",
                    v.volume_id
                )
            })?;
        }
        if self.controller_caps.contains(&CRpc::GetVolume) {
            expect_code(
                self.controller
                    .controller_get_volume(self.req(csi::ControllerGetVolumeRequest {
                        volume_id: v.volume_id.clone(),
                    }))
                    .await,
                Code::NotFound,
                "ControllerGetVolume after DeleteVolume",
            )?;
        }
        expect_code(
            self.controller
                .validate_volume_capabilities(self.req(csi::ValidateVolumeCapabilitiesRequest {
                    volume_id: v.volume_id.clone(),
                    volume_capabilities: vec![mount_cap(&self.cfg.fs_type, Mode::SingleNodeWriter)],
                    secrets: self.cfg.secrets.clone(),
                    ..Default::default()
                }))
                .await,
            Code::NotFound,
            "ValidateVolumeCapabilities after DeleteVolume",
        )
    }

    /// ReadWriteOncePod asks for SINGLE_NODE_SINGLE_WRITER, and a driver
    /// advertising SINGLE_NODE_MULTI_WRITER takes both modes.
    pub(super) async fn single_node_modes(&mut self) -> Check {
        for mode in [Mode::SingleNodeSingleWriter, Mode::SingleNodeMultiWriter] {
            let cap = mount_cap(&self.cfg.fs_type, mode);
            let v = self.new_volume("rwop", cap.clone()).await?;
            let r = ok(
                self.controller
                    .validate_volume_capabilities(self.req(
                        csi::ValidateVolumeCapabilitiesRequest {
                            volume_id: v.volume_id.clone(),
                            volume_capabilities: vec![cap],
                            secrets: self.cfg.secrets.clone(),
                            ..Default::default()
                        },
                    ))
                    .await,
                "ValidateVolumeCapabilities",
            )?;
            ensure(r.confirmed.is_some(), || {
                format!("{} not confirmed: {}", mode.as_str_name(), r.message)
            })?;
            self.delete_volume(&v.volume_id).await?;
        }
        Ok(())
    }
}
