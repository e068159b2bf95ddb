//! Snapshot checks: CreateSnapshot's and DeleteSnapshot's rules,
//! ListSnapshots and GetSnapshot, volumes created from snapshots and from
//! volumes, and a snapshot class's lifecycle.

use super::*;

impl Suite {
    pub(super) async fn snapshot_rules(&mut self) -> Check {
        let s = self.cfg.secrets.clone();
        let snap = |name: &str, src: &str| csi::CreateSnapshotRequest {
            source_volume_id: src.into(),
            name: name.into(),
            secrets: s.clone(),
            parameters: HashMap::new(),
        };
        expect_code(
            self.controller
                .create_snapshot(self.req(snap("", FAKE_VOLUME)))
                .await,
            Code::InvalidArgument,
            "no name",
        )?;
        let n = self.name("snap");
        expect_code(
            self.controller
                .create_snapshot(self.req(snap(&n, "")))
                .await,
            Code::InvalidArgument,
            "no source",
        )?;
        let a = self
            .new_volume(
                "snapsrc",
                mount_cap(&self.cfg.fs_type, Mode::SingleNodeWriter),
            )
            .await?;
        let b = self
            .new_volume(
                "snapsrc",
                mount_cap(&self.cfg.fs_type, Mode::SingleNodeWriter),
            )
            .await?;
        let s1 = ok(
            self.controller
                .create_snapshot(self.req(snap(&n, &a.volume_id)))
                .await,
            "CreateSnapshot",
        )?
        .snapshot
        .ok_or("no snapshot")?;
        self.snapshots.push(s1.snapshot_id.clone());
        let s2 = ok(
            self.controller
                .create_snapshot(self.req(snap(&n, &a.volume_id)))
                .await,
            "CreateSnapshot again",
        )?
        .snapshot
        .ok_or("no snapshot")?;
        ensure(s1.snapshot_id == s2.snapshot_id, || {
            format!(
                "two snapshots for one name: {} {}",
                s1.snapshot_id, s2.snapshot_id
            )
        })?;
        ensure(s1.source_volume_id == a.volume_id, || {
            "wrong source_volume_id".into()
        })?;
        expect_code(
            self.controller
                .create_snapshot(self.req(snap(&n, &b.volume_id)))
                .await,
            Code::AlreadyExists,
            "same name, other source",
        )?;
        let del = |id: &str| csi::DeleteSnapshotRequest {
            snapshot_id: id.into(),
            secrets: s.clone(),
        };
        expect_code(
            self.controller.delete_snapshot(self.req(del(""))).await,
            Code::InvalidArgument,
            "delete without id",
        )?;
        ok(
            self.controller
                .delete_snapshot(self.req(del(FAKE_VOLUME)))
                .await,
            "delete unknown snapshot",
        )?;
        // an id of no shape the driver makes is merely not found
        ok(
            self.controller
                .delete_snapshot(self.req(del("reallyfakesnapshotid")))
                .await,
            "delete a malformed snapshot id",
        )?;
        ok(
            self.controller
                .delete_snapshot(self.req(del(&s1.snapshot_id)))
                .await,
            "DeleteSnapshot",
        )?;
        ok(
            self.controller
                .delete_snapshot(self.req(del(&s1.snapshot_id)))
                .await,
            "DeleteSnapshot again",
        )?;
        self.snapshots.retain(|x| *x != s1.snapshot_id);
        self.snapshot_gone(&s1.snapshot_id).await?;
        self.delete_volume(&a.volume_id).await?;
        self.delete_volume(&b.volume_id).await
    }

    /// Deleted means gone: right after DeleteSnapshot answers, the
    /// snapshot is listed nowhere and GetSnapshot does not find it.
    pub(super) async fn snapshot_gone(&mut self, id: &str) -> Check {
        let r = ok(
            self.controller
                .list_snapshots(self.req(csi::ListSnapshotsRequest {
                    snapshot_id: id.into(),
                    secrets: self.cfg.secrets.clone(),
                    ..Default::default()
                }))
                .await,
            "ListSnapshots after DeleteSnapshot",
        )?;
        ensure(r.entries.is_empty(), || {
            format!("snapshot {id} still listed after DeleteSnapshot answered")
        })?;
        if self.controller_caps.contains(&CRpc::GetSnapshot) {
            expect_code(
                self.controller
                    .get_snapshot(self.req(csi::GetSnapshotRequest {
                        snapshot_id: id.into(),
                        secrets: self.cfg.secrets.clone(),
                    }))
                    .await,
                Code::NotFound,
                "GetSnapshot after DeleteSnapshot",
            )?;
        }
        Ok(())
    }

    pub(super) async fn create_snapshot(&mut self, source: &str) -> Result<csi::Snapshot, String> {
        let name = self.name("snap");
        let req = csi::CreateSnapshotRequest {
            source_volume_id: source.into(),
            name,
            secrets: self.cfg.secrets.clone(),
            parameters: HashMap::new(),
        };
        let s = ok(
            self.controller.create_snapshot(self.req(req)).await,
            "CreateSnapshot",
        )?
        .snapshot
        .ok_or("no snapshot")?;
        self.snapshots.push(s.snapshot_id.clone());
        Ok(s)
    }

    pub(super) async fn list_snapshots_rules(&mut self) -> Check {
        let v = self
            .new_volume(
                "lsnap",
                mount_cap(&self.cfg.fs_type, Mode::SingleNodeWriter),
            )
            .await?;
        let mut ids = Vec::new();
        for _ in 0..3 {
            ids.push(self.create_snapshot(&v.volume_id).await?.snapshot_id);
        }
        let base = csi::ListSnapshotsRequest {
            secrets: self.cfg.secrets.clone(),
            ..Default::default()
        };
        let r = ok(
            self.controller
                .list_snapshots(self.req(csi::ListSnapshotsRequest {
                    snapshot_id: ids[0].clone(),
                    ..base.clone()
                }))
                .await,
            "by id",
        )?;
        ensure(
            r.entries.len() == 1
                && r.entries[0]
                    .snapshot
                    .as_ref()
                    .is_some_and(|s| s.snapshot_id == ids[0]),
            || format!("by id returned {:?}", r.entries),
        )?;
        let r = ok(
            self.controller
                .list_snapshots(self.req(csi::ListSnapshotsRequest {
                    snapshot_id: FAKE_VOLUME.into(),
                    ..base.clone()
                }))
                .await,
            "unknown id",
        )?;
        ensure(r.entries.is_empty(), || {
            "an unknown snapshot id listed something".into()
        })?;
        let r = ok(
            self.controller
                .list_snapshots(self.req(csi::ListSnapshotsRequest {
                    source_volume_id: v.volume_id.clone(),
                    ..base.clone()
                }))
                .await,
            "by source",
        )?;
        let by_source: Vec<String> = r
            .entries
            .iter()
            .filter_map(|e| e.snapshot.as_ref().map(|s| s.snapshot_id.clone()))
            .collect();
        ensure(
            ids.iter().all(|i| by_source.contains(i)) && by_source.len() == 3,
            || format!("by source: {by_source:?}, expected {ids:?}"),
        )?;
        let mut seen = Vec::new();
        let mut token = String::new();
        for _ in 0..10_000 {
            let r = ok(
                self.controller
                    .list_snapshots(self.req(csi::ListSnapshotsRequest {
                        max_entries: 2,
                        starting_token: token.clone(),
                        ..base.clone()
                    }))
                    .await,
                "paginated",
            )?;
            ensure(r.entries.len() <= 2, || {
                format!("max_entries 2 returned {}", r.entries.len())
            })?;
            seen.extend(
                r.entries
                    .into_iter()
                    .filter_map(|e| e.snapshot.map(|s| s.snapshot_id)),
            );
            if r.next_token.is_empty() {
                break;
            }
            token = r.next_token;
        }
        ensure(ids.iter().all(|i| seen.contains(i)), || {
            "pagination lost snapshots".into()
        })?;
        expect_code(
            self.controller
                .list_snapshots(self.req(csi::ListSnapshotsRequest {
                    starting_token: "bogus".into(),
                    ..base.clone()
                }))
                .await,
            Code::Aborted,
            "bad token",
        )?;
        for id in ids {
            self.delete_snapshot(&id).await?;
        }
        self.delete_volume(&v.volume_id).await
    }

    pub(super) async fn create_from_sources(&mut self) -> Check {
        let cap = mount_cap(&self.cfg.fs_type, Mode::SingleNodeWriter);
        let src = self.new_volume("src", cap.clone()).await?;
        let snap = self.create_snapshot(&src.volume_id).await?;
        for _ in 0..200 {
            let r = ok(
                self.controller
                    .list_snapshots(self.req(csi::ListSnapshotsRequest {
                        snapshot_id: snap.snapshot_id.clone(),
                        secrets: self.cfg.secrets.clone(),
                        ..Default::default()
                    }))
                    .await,
                "ListSnapshots",
            )?;
            if r.entries
                .iter()
                .any(|e| e.snapshot.as_ref().is_some_and(|s| s.ready_to_use))
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let n = self.name("restore");
        let mut req = self.create_req(&n, cap.clone(), self.cfg.volume_size);
        req.volume_content_source = Some(from_snapshot(&snap.snapshot_id));
        let restored = self.send_create(req.clone(), "restore").await?;
        ensure(restored.content_source == req.volume_content_source, || {
            format!("content source not echoed: {:?}", restored.content_source)
        })?;
        let mut bad = req.clone();
        bad.name = self.name("restoremissing");
        bad.volume_content_source = Some(from_snapshot(FAKE_VOLUME));
        expect_code(
            self.controller.create_volume(self.req(bad)).await,
            Code::NotFound,
            "restore from an unknown snapshot",
        )?;
        if self.controller_caps.contains(&CRpc::CloneVolume) {
            let n = self.name("clone");
            let mut req = self.create_req(&n, cap.clone(), self.cfg.volume_size);
            req.volume_content_source = Some(from_volume(&src.volume_id));
            let clone = self.send_create(req.clone(), "clone").await?;
            ensure(clone.content_source == req.volume_content_source, || {
                "clone source not echoed".into()
            })?;
            self.delete_volume(&clone.volume_id).await?;
            let mut bad = req.clone();
            bad.name = self.name("clonemissing");
            bad.volume_content_source = Some(from_volume(FAKE_VOLUME));
            expect_code(
                self.controller.create_volume(self.req(bad)).await,
                Code::NotFound,
                "clone of an unknown volume",
            )?;
        }
        self.delete_volume(&restored.volume_id).await?;
        self.delete_snapshot(&snap.snapshot_id).await?;
        self.delete_volume(&src.volume_id).await
    }

    /// Polls ListSnapshots by id until the snapshot is ready to use, as
    /// the snapshotter does.
    pub(super) async fn wait_snapshot_ready(&mut self, id: &str) -> Check {
        for _ in 0..600 {
            let r = ok(
                self.controller
                    .list_snapshots(self.req(csi::ListSnapshotsRequest {
                        snapshot_id: id.into(),
                        secrets: self.cfg.secrets.clone(),
                        ..Default::default()
                    }))
                    .await,
                "ListSnapshots",
            )?;
            if r.entries
                .iter()
                .any(|e| e.snapshot.as_ref().is_some_and(|s| s.ready_to_use))
            {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(format!("snapshot {id} not ready after 60 s"))
    }

    pub(super) async fn get_snapshot_rules(&mut self) -> Check {
        let get = |id: &str, secrets: &HashMap<String, String>| csi::GetSnapshotRequest {
            snapshot_id: id.into(),
            secrets: secrets.clone(),
        };
        expect_code(
            self.controller
                .get_snapshot(self.req(get("", &self.cfg.secrets)))
                .await,
            Code::InvalidArgument,
            "no id",
        )?;
        expect_code(
            self.controller
                .get_snapshot(self.req(get(FAKE_VOLUME, &self.cfg.secrets)))
                .await,
            Code::NotFound,
            "unknown id",
        )?;
        expect_code(
            self.controller
                .get_snapshot(self.req(get("not-a-snapshot-id", &self.cfg.secrets)))
                .await,
            Code::NotFound,
            "malformed id",
        )?;
        let v = self
            .new_volume(
                "getsnap",
                mount_cap(&self.cfg.fs_type, Mode::SingleNodeWriter),
            )
            .await?;
        let s = self.create_snapshot(&v.volume_id).await?;
        let got = ok(
            self.controller
                .get_snapshot(self.req(get(&s.snapshot_id, &self.cfg.secrets)))
                .await,
            "GetSnapshot",
        )?
        .snapshot
        .ok_or("GetSnapshot returned no snapshot")?;
        ensure(
            got.snapshot_id == s.snapshot_id && got.source_volume_id == v.volume_id,
            || format!("GetSnapshot({}) returned {got:?}", s.snapshot_id),
        )?;
        self.wait_snapshot_ready(&s.snapshot_id).await?;
        self.delete_snapshot(&s.snapshot_id).await?;
        self.delete_volume(&v.volume_id).await
    }

    /// A snapshot taken with a class's parameters of a volume in use holds
    /// what was written, restores into a new volume, and deletes cleanly.
    pub(super) async fn snapshot_class_lifecycle(
        &mut self,
        class: HashMap<String, String>,
    ) -> Check {
        let cap = mount_cap(&self.cfg.fs_type, Mode::SingleNodeWriter);
        let (v, staging, target, _) = self.bring_up(cap.clone(), "classsrc").await?;
        std::fs::write(self.seen(&target).join("kept"), b"in the snapshot")
            .map_err(|e| format!("writing to the volume: {e}"))?;
        nix::unistd::sync();
        let req = csi::CreateSnapshotRequest {
            source_volume_id: v.volume_id.clone(),
            name: self.name("classsnap"),
            secrets: self.cfg.secrets.clone(),
            parameters: class,
        };
        let s = ok(
            self.controller.create_snapshot(self.req(req)).await,
            "CreateSnapshot",
        )?
        .snapshot
        .ok_or("no snapshot")?;
        self.snapshots.push(s.snapshot_id.clone());
        ensure(s.source_volume_id == v.volume_id, || {
            format!(
                "snapshot of {} names source {}",
                v.volume_id, s.source_volume_id
            )
        })?;
        self.wait_snapshot_ready(&s.snapshot_id).await?;
        let restored_name = self.name("classrestored");
        let mut restore = self.create_req(&restored_name, cap.clone(), self.cfg.volume_size);
        restore.volume_content_source = Some(from_snapshot(&s.snapshot_id));
        let restored = self
            .send_create(restore, "CreateVolume from the snapshot")
            .await?;
        let (restored, r_staging, r_target, _) = self.bring_up_volume(restored, cap).await?;
        let data = std::fs::read(self.seen(&r_target).join("kept"))
            .map_err(|e| format!("reading the restored volume: {e}"))?;
        ensure(data == b"in the snapshot", || {
            "the restored volume does not hold what was written".into()
        })?;
        self.tear_down(&restored, &r_staging, &r_target).await?;
        self.delete_snapshot(&s.snapshot_id).await?;
        self.tear_down(&v, &staging, &target).await
    }
}
