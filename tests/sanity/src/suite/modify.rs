//! What csi-sanity checks of names and of VolumeAttributesClasses, held
//! here at least as strictly: a 128-character name (csi-sanity's longest)
//! is a volume and a snapshot, the same on a repeat; ControllerModifyVolume's
//! argument, unknown-volume and unsupported-parameter rules, on volumes
//! created without and with a class, and a class the driver cannot apply
//! refused at creation.

use std::collections::HashMap;

use proto::csi::v1 as csi;
use proto::csi::v1::volume_capability::access_mode::Mode;
use tonic::Code;

use super::*;

/// The longest name csi-sanity sends (its `MaxNameLength`).
const MAX_NAME_LENGTH: usize = 128;

impl Suite {
    /// A unique name padded to exactly [`MAX_NAME_LENGTH`] characters.
    fn max_length_name(&mut self, what: &str) -> String {
        let mut n = self.name(what);
        n.push('-');
        while n.len() < MAX_NAME_LENGTH {
            n.push('x');
        }
        n
    }

    pub(super) async fn max_length_names(&mut self) -> Check {
        let cap = mount_cap(&self.cfg.fs_type, Mode::SingleNodeWriter);
        let name = self.max_length_name("longest");
        let req = self.create_req(&name, cap, self.cfg.volume_size);
        let first = self
            .send_create(req.clone(), "CreateVolume with a 128-character name")
            .await?;
        let again = self.send_create(req, "the same CreateVolume again").await?;
        ensure(again.volume_id == first.volume_id, || {
            format!(
                "two volumes for one 128-character name: {} {}",
                first.volume_id, again.volume_id
            )
        })?;
        if self.controller_caps.contains(&CRpc::CreateDeleteSnapshot) {
            let req = csi::CreateSnapshotRequest {
                source_volume_id: first.volume_id.clone(),
                name: self.max_length_name("longest-snap"),
                secrets: self.cfg.secrets.clone(),
                parameters: HashMap::new(),
            };
            let snap = ok(
                self.controller.create_snapshot(self.req(req.clone())).await,
                "CreateSnapshot with a 128-character name",
            )?
            .snapshot
            .ok_or("CreateSnapshot returned no snapshot")?;
            self.snapshots.push(snap.snapshot_id.clone());
            let again = ok(
                self.controller.create_snapshot(self.req(req)).await,
                "the same CreateSnapshot again",
            )?
            .snapshot
            .ok_or("CreateSnapshot returned no snapshot")?;
            ensure(again.snapshot_id == snap.snapshot_id, || {
                "two snapshots for one 128-character name".into()
            })?;
            self.delete_snapshot(&snap.snapshot_id).await?;
        }
        self.delete_volume(&first.volume_id).await
    }

    pub(super) fn modify_skip(&self) -> Skip {
        match self.controller_skip(CRpc::ModifyVolume) {
            Skip::No if self.cfg.mutable_parameters.is_empty() => Skip::Because(
                "MODIFY_VOLUME advertised, but no mutable parameters given to check it with".into(),
            ),
            s => s,
        }
    }

    fn modify_req(
        &self,
        volume_id: &str,
        mutable: &HashMap<String, String>,
    ) -> csi::ControllerModifyVolumeRequest {
        csi::ControllerModifyVolumeRequest {
            volume_id: volume_id.into(),
            secrets: self.cfg.secrets.clone(),
            mutable_parameters: mutable.clone(),
        }
    }

    pub(super) async fn modify_rules(&mut self) -> Check {
        let supported = self.cfg.mutable_parameters.clone();
        let unsupported: HashMap<String, String> =
            [("csi-sanity-unsupported-parameter".into(), "x".into())].into();
        expect_code(
            self.controller
                .controller_modify_volume(self.req(self.modify_req("", &supported)))
                .await,
            Code::InvalidArgument,
            "no volume id",
        )?;
        expect_code(
            self.controller
                .controller_modify_volume(self.req(self.modify_req(FAKE_VOLUME, &supported)))
                .await,
            Code::NotFound,
            "an unknown volume",
        )?;
        let cap = mount_cap(&self.cfg.fs_type, Mode::SingleNodeWriter);
        let plain = self.new_volume("modify", cap.clone()).await?;
        expect_code(
            self.controller
                .controller_modify_volume(self.req(self.modify_req(&plain.volume_id, &unsupported)))
                .await,
            Code::InvalidArgument,
            "a parameter the driver cannot change",
        )?;
        for what in [
            "ControllerModifyVolume",
            "the same ControllerModifyVolume again",
        ] {
            ok(
                self.controller
                    .controller_modify_volume(
                        self.req(self.modify_req(&plain.volume_id, &supported)),
                    )
                    .await,
                what,
            )?;
        }
        // created with a VolumeAttributesClass: its parameters at creation;
        // a class with a parameter the driver cannot change creates nothing
        let name = self.name("modify-badclass");
        let mut bad = self.create_req(&name, cap.clone(), self.cfg.volume_size);
        bad.mutable_parameters = unsupported.clone();
        expect_code(
            self.controller.create_volume(self.req(bad)).await,
            Code::InvalidArgument,
            "CreateVolume with a parameter the driver cannot change",
        )?;
        let name = self.name("modify-class");
        let mut req = self.create_req(&name, cap, self.cfg.volume_size);
        req.mutable_parameters = supported.clone();
        let classed = self
            .send_create(req, "CreateVolume with mutable parameters")
            .await?;
        ok(
            self.controller
                .controller_modify_volume(self.req(self.modify_req(&classed.volume_id, &supported)))
                .await,
            "ControllerModifyVolume of a volume created with a class",
        )?;
        expect_code(
            self.controller
                .controller_modify_volume(
                    self.req(self.modify_req(&classed.volume_id, &unsupported)),
                )
                .await,
            Code::InvalidArgument,
            "a parameter the driver cannot change, on a volume created with a class",
        )?;
        self.delete_volume(&classed.volume_id).await?;
        self.delete_volume(&plain.volume_id).await
    }
}
