//! GroupController checks: csi-sanity's argument and unknown-id rules,
//! and a data lifecycle (several volumes written, snapshotted as one group,
//! each member restored and read, the group snapshot deleted).

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use proto::csi::v1 as csi;
use proto::csi::v1::volume_capability::access_mode::Mode;
use tonic::Code;

use super::*;

impl Suite {
    pub(super) fn group_skip(&self) -> Skip {
        if !self.has_group_controller {
            Skip::Because("no GROUP_CONTROLLER_SERVICE".into())
        } else if !self
            .group_caps
            .contains(&GRpc::CreateDeleteGetVolumeGroupSnapshot)
        {
            Skip::Because("CREATE_DELETE_GET_VOLUME_GROUP_SNAPSHOT not advertised".into())
        } else {
            Skip::No
        }
    }

    fn group_create_req(
        &self,
        name: &str,
        volumes: &[String],
    ) -> csi::CreateVolumeGroupSnapshotRequest {
        csi::CreateVolumeGroupSnapshotRequest {
            name: name.into(),
            source_volume_ids: volumes.to_vec(),
            secrets: self.cfg.secrets.clone(),
            parameters: self.cfg.group_snapshot_parameters.clone(),
        }
    }

    pub(super) async fn group_rules(&mut self) -> Check {
        let caps = ok(
            self.group_controller
                .group_controller_get_capabilities(csi::GroupControllerGetCapabilitiesRequest {})
                .await,
            "GroupControllerGetCapabilities",
        )?;
        for c in caps.capabilities {
            match c.r#type {
                Some(csi::group_controller_service_capability::Type::Rpc(r))
                    if GRpc::try_from(r.r#type).is_ok_and(|t| t != GRpc::Unknown) => {}
                other => return Err(format!("unknown group controller capability {other:?}")),
            }
        }
        let secrets = self.cfg.secrets.clone();
        expect_code(
            self.group_controller
                .create_volume_group_snapshot(self.req(self.group_create_req("", &[])))
                .await,
            Code::InvalidArgument,
            "CreateVolumeGroupSnapshot without a name",
        )?;
        let name = self.name("group-novol");
        expect_code(
            self.group_controller
                .create_volume_group_snapshot(self.req(self.group_create_req(&name, &[])))
                .await,
            Code::InvalidArgument,
            "CreateVolumeGroupSnapshot without volumes",
        )?;
        let get = |id: &str| csi::GetVolumeGroupSnapshotRequest {
            group_snapshot_id: id.into(),
            snapshot_ids: vec![],
            secrets: secrets.clone(),
        };
        expect_code(
            self.group_controller
                .get_volume_group_snapshot(self.req(get("")))
                .await,
            Code::InvalidArgument,
            "GetVolumeGroupSnapshot without an id",
        )?;
        for id in [FAKE_VOLUME, "not-a-group-snapshot-id"] {
            expect_code(
                self.group_controller
                    .get_volume_group_snapshot(self.req(get(id)))
                    .await,
                Code::NotFound,
                &format!("GetVolumeGroupSnapshot of unknown {id:?}"),
            )?;
        }
        let del = |id: &str| csi::DeleteVolumeGroupSnapshotRequest {
            group_snapshot_id: id.into(),
            snapshot_ids: vec![],
            secrets: secrets.clone(),
        };
        expect_code(
            self.group_controller
                .delete_volume_group_snapshot(self.req(del("")))
                .await,
            Code::InvalidArgument,
            "DeleteVolumeGroupSnapshot without an id",
        )?;
        for id in [FAKE_VOLUME, "not-a-group-snapshot-id"] {
            ok(
                self.group_controller
                    .delete_volume_group_snapshot(self.req(del(id)))
                    .await,
                &format!("DeleteVolumeGroupSnapshot of unknown {id:?}"),
            )?;
        }
        let name = self.name("group-unknown");
        expect_code(
            self.group_controller
                .create_volume_group_snapshot(
                    self.req(self.group_create_req(&name, &[FAKE_VOLUME.to_string()])),
                )
                .await,
            Code::NotFound,
            "CreateVolumeGroupSnapshot of an unknown volume",
        )
    }

    /// GetVolumeGroupSnapshot until it is ready, as the snapshotter polls.
    async fn wait_group_ready(&mut self, id: &str) -> Result<csi::VolumeGroupSnapshot, String> {
        for _ in 0..600 {
            let g = ok(
                self.group_controller
                    .get_volume_group_snapshot(self.req(csi::GetVolumeGroupSnapshotRequest {
                        group_snapshot_id: id.into(),
                        snapshot_ids: vec![],
                        secrets: self.cfg.secrets.clone(),
                    }))
                    .await,
                "GetVolumeGroupSnapshot",
            )?
            .group_snapshot
            .ok_or("GetVolumeGroupSnapshot returned no group snapshot")?;
            if g.ready_to_use {
                return Ok(g);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(format!("group snapshot {id} not ready after 60 s"))
    }

    pub(super) async fn group_lifecycle(&mut self) -> Check {
        let cap = mount_cap(&self.cfg.fs_type, Mode::SingleNodeWriter);
        // two volumes in use, each with its own data
        let mut sources = Vec::new();
        for i in 0..2 {
            let up = self.bring_up(cap.clone(), "groupsrc").await?;
            std::fs::write(
                self.seen(&up.2).join("which"),
                format!("volume {i}").as_bytes(),
            )
            .map_err(|e| format!("writing to volume {i}: {e}"))?;
            sources.push(up);
        }
        nix::unistd::sync();
        let ids: Vec<String> = sources.iter().map(|s| s.0.volume_id.clone()).collect();
        let name = self.name("group");
        let req = self.group_create_req(&name, &ids);
        let first = ok(
            self.group_controller
                .create_volume_group_snapshot(self.req(req.clone()))
                .await,
            "CreateVolumeGroupSnapshot",
        )?
        .group_snapshot
        .ok_or("no group snapshot")?;
        let again = ok(
            self.group_controller
                .create_volume_group_snapshot(self.req(req))
                .await,
            "CreateVolumeGroupSnapshot again",
        )?
        .group_snapshot
        .ok_or("no group snapshot")?;
        ensure(again.group_snapshot_id == first.group_snapshot_id, || {
            format!(
                "the same request made a second group snapshot ({} then {})",
                first.group_snapshot_id, again.group_snapshot_id
            )
        })?;
        let gid = first.group_snapshot_id.clone();
        let g = self.wait_group_ready(&gid).await?;
        for s in &g.snapshots {
            self.snapshots.push(s.snapshot_id.clone());
        }
        // same name, other volumes
        expect_code(
            self.group_controller
                .create_volume_group_snapshot(self.req(self.group_create_req(&name, &ids[..1])))
                .await,
            Code::AlreadyExists,
            "CreateVolumeGroupSnapshot, same name, other volumes",
        )?;
        let of: BTreeSet<&str> = g
            .snapshots
            .iter()
            .map(|s| s.source_volume_id.as_str())
            .collect();
        ensure(
            of == ids.iter().map(String::as_str).collect::<BTreeSet<_>>(),
            || format!("members are of {of:?}, not {ids:?}"),
        )?;
        for s in &g.snapshots {
            ensure(s.group_snapshot_id == gid && s.ready_to_use, || {
                format!("member {s:?} does not name group snapshot {gid} or is not ready")
            })?;
        }
        let members: Vec<String> = g.snapshots.iter().map(|s| s.snapshot_id.clone()).collect();
        expect_code(
            self.group_controller
                .get_volume_group_snapshot(self.req(csi::GetVolumeGroupSnapshotRequest {
                    group_snapshot_id: gid.clone(),
                    snapshot_ids: members[..1].to_vec(),
                    secrets: self.cfg.secrets.clone(),
                }))
                .await,
            Code::InvalidArgument,
            "GetVolumeGroupSnapshot with a snapshot list that is not the group's",
        )?;
        // every member restores on its own, with its volume's data
        let by_source: HashMap<String, String> = g
            .snapshots
            .iter()
            .map(|s| (s.source_volume_id.clone(), s.snapshot_id.clone()))
            .collect();
        for (i, id) in ids.iter().enumerate() {
            let snap = by_source.get(id).ok_or("no member for a source")?;
            let restored_name = self.name("grouprestored");
            let mut req = self.create_req(&restored_name, cap.clone(), self.cfg.volume_size);
            req.volume_content_source = Some(from_snapshot(snap));
            let restored = self.send_create(req, "CreateVolume from a member").await?;
            ensure(restored.content_source == Some(from_snapshot(snap)), || {
                format!(
                    "the volume restored from member {snap} names {:?}",
                    restored.content_source
                )
            })?;
            let (r, staging, target, _) = self.bring_up_volume(restored, cap.clone()).await?;
            if self.cfg.restores_hold_data {
                let data = std::fs::read(self.seen(&target).join("which"))
                    .map_err(|e| format!("reading the volume restored from member {snap}: {e}"))?;
                ensure(data == format!("volume {i}").as_bytes(), || {
                    format!("the volume restored from member {snap} holds another volume's data")
                })?;
            }
            self.tear_down(&r, &staging, &target).await?;
        }
        let del = |snapshot_ids: Vec<String>, secrets: HashMap<String, String>| {
            csi::DeleteVolumeGroupSnapshotRequest {
                group_snapshot_id: gid.clone(),
                snapshot_ids,
                secrets,
            }
        };
        expect_code(
            self.group_controller
                .delete_volume_group_snapshot(
                    self.req(del(members[..1].to_vec(), self.cfg.secrets.clone())),
                )
                .await,
            Code::InvalidArgument,
            "DeleteVolumeGroupSnapshot with a snapshot list that is not the group's",
        )?;
        for what in [
            "DeleteVolumeGroupSnapshot",
            "DeleteVolumeGroupSnapshot again",
        ] {
            ok(
                self.group_controller
                    .delete_volume_group_snapshot(
                        self.req(del(members.clone(), self.cfg.secrets.clone())),
                    )
                    .await,
                what,
            )?;
        }
        self.snapshots.retain(|s| !members.contains(s));
        expect_code(
            self.group_controller
                .get_volume_group_snapshot(self.req(csi::GetVolumeGroupSnapshotRequest {
                    group_snapshot_id: gid.clone(),
                    snapshot_ids: vec![],
                    secrets: self.cfg.secrets.clone(),
                }))
                .await,
            Code::NotFound,
            "GetVolumeGroupSnapshot after deletion",
        )?;
        for m in &members {
            self.snapshot_gone(m).await?;
        }
        // the sources are ordinary volumes again: deleted at once
        for (v, staging, target, _) in sources {
            self.tear_down(&v, &staging, &target).await?;
        }
        Ok(())
    }
}
