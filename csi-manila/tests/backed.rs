//! Read-only volumes backed by a snapshot (`backingSnapshot: "true"`)
//! through the plugin's socket against the emulator's Manila: no share
//! made, a read-only rule that names its snapshot, the snapshot's own
//! directory published read-only, the snapshot and its share kept while
//! the volume reads them, every bad request refused with nothing left.
//! The stand-in ceph-fuse binds a local directory for the share; the test
//! makes in it what CephFS shows of a snapshot (`.snap/_<id>_<inode>`, as
//! seen on the real test cloud's Ceph).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use openstack_client::manila::{AccessRuleState, GrantAccess};
use proto::csi::v1 as csi;
use proto::csi::v1::volume_capability::access_mode::Mode;
use tonic::Code;

mod common;
use common::*;

const BACKING_KEY: &str = "manila.csi.openstack.org/backing-snapshot";

fn rox() -> csi::VolumeCapability {
    mount_cap(Mode::MultiNodeReaderOnly, &[])
}

fn from_snapshot(
    e: &Env,
    name: &str,
    snapshot: Option<&str>,
    caps: Vec<csi::VolumeCapability>,
    gib: i64,
) -> csi::CreateVolumeRequest {
    let mut r = e.create_req(
        name,
        gib,
        &[("type", "cephfs"), ("backingSnapshot", "true")],
    );
    r.volume_capabilities = caps;
    r.volume_content_source = snapshot.map(|s| csi::VolumeContentSource {
        r#type: Some(csi::volume_content_source::Type::Snapshot(
            csi::volume_content_source::SnapshotSource {
                snapshot_id: s.into(),
            },
        )),
    });
    r
}

/// The share's rules: id, cephx id, level, state, backing snapshot.
async fn rules(
    e: &Env,
    share: &str,
) -> Vec<(String, String, String, AccessRuleState, Option<String>)> {
    e.manila
        .list_access_rules(share)
        .await
        .unwrap()
        .into_iter()
        .map(|r| {
            let backing = r.metadata.get(BACKING_KEY).cloned();
            (r.id, r.access_to, r.access_level, r.state, backing)
        })
        .collect()
}

#[tokio::test]
async fn a_read_only_volume_backed_by_a_snapshot_reads_the_snapshot_and_nothing_else() {
    if !root() {
        return;
    }
    let mut e = env("CEPHFS").await;
    let src = e.create("pvc-src", 1, &[("type", "cephfs")]).await;
    e.stage(&src, rwx()).await;
    let live = e.publish(&src, "pod-a", false).await;
    std::fs::write(e.h.seen(&live).join("data"), b"before").unwrap();
    let snap = e.snapshot(&src.volume_id, "snap-1").await;
    // what CephFS shows in the share once the snapshot is taken, beside
    // another snapshot's directory, which must never be served
    let snap_dir =
        e.h.seen(&live)
            .join(format!(".snap/_{}_1099511628399", snap.snapshot_id));
    std::fs::create_dir_all(&snap_dir).unwrap();
    std::fs::write(snap_dir.join("data"), b"before").unwrap();
    let decoy =
        e.h.seen(&live)
            .join(".snap/_00000000-0000-4000-8000-000000000000_1099511628399");
    std::fs::create_dir_all(&decoy).unwrap();
    std::fs::write(decoy.join("data"), b"another snapshot").unwrap();
    std::fs::write(e.h.seen(&live).join("data"), b"after").unwrap();

    // bad requests: refused before anything is made
    let shares_before = e.share_count().await;
    let rules_before = rules(&e, &src.volume_id).await;
    for (what, req, code) in [
        (
            "a writer",
            from_snapshot(
                &e,
                "pvc-bad",
                Some(&snap.snapshot_id),
                vec![rox(), rwx()],
                1,
            ),
            Code::InvalidArgument,
        ),
        (
            "no snapshot",
            from_snapshot(&e, "pvc-bad", None, vec![rox()], 1),
            Code::InvalidArgument,
        ),
        (
            "one cephx id for every volume of the share",
            {
                let mut r = from_snapshot(&e, "pvc-bad", Some(&snap.snapshot_id), vec![rox()], 1);
                r.parameters
                    .insert("cephfs-clientID".into(), "shared".into());
                r
            },
            Code::InvalidArgument,
        ),
        (
            "larger than the snapshot",
            from_snapshot(&e, "pvc-bad", Some(&snap.snapshot_id), vec![rox()], 2),
            Code::OutOfRange,
        ),
        (
            "an unknown snapshot",
            from_snapshot(
                &e,
                "pvc-bad",
                Some("00000000-0000-4000-8000-000000000000"),
                vec![rox()],
                1,
            ),
            Code::NotFound,
        ),
    ] {
        let err = e.c.create_volume(req).await.unwrap_err();
        assert_eq!(err.code(), code, "{what}: {}", err.message());
        if code == Code::InvalidArgument {
            assert!(
                err.message().contains("backingSnapshot"),
                "{what}: {}",
                err.message()
            );
        }
    }
    assert_eq!(e.share_count().await, shares_before, "no share made");
    assert_eq!(
        rules(&e, &src.volume_id).await,
        rules_before,
        "no rule made"
    );

    // the volume: no share, a read-only rule naming the snapshot
    let req = from_snapshot(&e, "pvc-ro", Some(&snap.snapshot_id), vec![rox()], 1);
    let ro =
        e.c.create_volume(req.clone())
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
    assert!(
        ro.volume_id.starts_with("snapshot-backed:"),
        "{}",
        ro.volume_id
    );
    assert_eq!(ro.capacity_bytes, GIB);
    assert_eq!(ro.content_source, req.volume_content_source);
    assert_eq!(ro.volume_context["shareID"], src.volume_id);
    assert_eq!(ro.volume_context["backingSnapshotID"], snap.snapshot_id);
    assert_eq!(e.share_count().await, shares_before, "no copy");
    let reader: Vec<_> = rules(&e, &src.volume_id)
        .await
        .into_iter()
        .filter(|r| r.1 == "pvc-ro")
        .collect();
    assert_eq!(reader.len(), 1, "{reader:?}");
    assert_eq!(reader[0].0, ro.volume_context["shareAccessIDs"]);
    assert_eq!(
        (reader[0].2.as_str(), &reader[0].3, reader[0].4.as_deref()),
        (
            "ro",
            &AccessRuleState::Active,
            Some(snap.snapshot_id.as_str())
        )
    );
    let again =
        e.c.create_volume(req)
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
    assert_eq!(again.volume_id, ro.volume_id, "idempotent");

    // what it reads is kept while it reads it
    let err =
        e.c.delete_snapshot(csi::DeleteSnapshotRequest {
            snapshot_id: snap.snapshot_id.clone(),
            secrets: e.secrets.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{}", err.message());
    assert!(err.message().contains("pvc-ro"), "{}", err.message());
    e.manila.get_snapshot(&snap.snapshot_id).await.unwrap();
    let err = e.delete(&src.volume_id).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{}", err.message());
    assert_eq!(
        rules(&e, &src.volume_id).await.len(),
        rules_before.len() + 1,
        "the source share's rules are all kept"
    );
    // a handle naming a rule that is not a backed volume's revokes nothing
    let writer_rule = &rules_before[0].0;
    let forged = format!("snapshot-backed:{}:{writer_rule}", snap.snapshot_id);
    let err = e.delete(&forged).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{}", err.message());
    assert!(
        rules(&e, &src.volume_id)
            .await
            .iter()
            .any(|r| &r.0 == writer_rule)
    );
    // nor one naming another cluster's reader of the same snapshot
    let theirs = e
        .manila
        .grant_access_with_metadata(
            &src.volume_id,
            &GrantAccess {
                access_type: "cephx".into(),
                access_to: "another-clusters-reader".into(),
                access_level: "ro".into(),
            },
            &BTreeMap::from([
                (BACKING_KEY.to_string(), snap.snapshot_id.clone()),
                (
                    "manila.csi.openstack.org/cluster".to_string(),
                    "another-cluster".to_string(),
                ),
            ]),
        )
        .await
        .unwrap();
    let forged = format!("snapshot-backed:{}:{}", snap.snapshot_id, theirs.id);
    let err = e.delete(&forged).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{}", err.message());
    assert!(
        err.message().contains("another-cluster"),
        "{}",
        err.message()
    );
    assert!(
        rules(&e, &src.volume_id)
            .await
            .iter()
            .any(|r| r.0 == theirs.id)
    );
    e.manila
        .revoke_access(&src.volume_id, &theirs.id)
        .await
        .unwrap();

    // the node: the snapshot, read-only, whatever the publish asks
    let (staging, target) = e.h.paths(&ro.volume_id, "pod-b");
    e.n.node_stage_volume(csi::NodeStageVolumeRequest {
        volume_id: ro.volume_id.clone(),
        staging_target_path: staging.to_string_lossy().into(),
        volume_capability: Some(rox()),
        secrets: e.secrets.clone(),
        volume_context: ro.volume_context.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    let call = e.h.helper_calls().pop().unwrap();
    assert_eq!(call.program, "ceph-fuse");
    assert!(
        call.options.contains("id=pvc-ro"),
        "mounted with the read-only rule: {call:?}"
    );
    let publish = csi::NodePublishVolumeRequest {
        volume_id: ro.volume_id.clone(),
        staging_target_path: staging.to_string_lossy().into(),
        target_path: target.to_string_lossy().into(),
        volume_capability: Some(rox()),
        readonly: false,
        volume_context: ro.volume_context.clone(),
        ..Default::default()
    };
    e.n.node_publish_volume(publish.clone()).await.unwrap();
    e.n.node_publish_volume(publish).await.unwrap();
    assert_eq!(
        std::fs::read(e.h.seen(&target).join("data")).unwrap(),
        b"before"
    );
    let err = std::fs::write(e.h.seen(&target).join("x"), b"x").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(nix::libc::EROFS), "{err}");
    assert_eq!(
        std::fs::read(e.h.seen(&live).join("data")).unwrap(),
        b"after"
    );

    // the controller's answers about it
    let validate = |caps: Vec<csi::VolumeCapability>| csi::ValidateVolumeCapabilitiesRequest {
        volume_id: ro.volume_id.clone(),
        volume_capabilities: caps,
        secrets: e.secrets.clone(),
        ..Default::default()
    };
    let ok =
        e.c.validate_volume_capabilities(validate(vec![rox()]))
            .await
            .unwrap()
            .into_inner();
    assert!(ok.confirmed.is_some(), "{}", ok.message);
    let no =
        e.c.validate_volume_capabilities(validate(vec![rwx()]))
            .await
            .unwrap()
            .into_inner();
    assert!(
        no.confirmed.is_none() && no.message.contains("read-only"),
        "{}",
        no.message
    );
    let err =
        e.c.controller_expand_volume(csi::ControllerExpandVolumeRequest {
            volume_id: ro.volume_id.clone(),
            capacity_range: Some(csi::CapacityRange {
                required_bytes: 2 * GIB,
                limit_bytes: 0,
            }),
            secrets: e.secrets.clone(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{}", err.message());

    // gone: its rule and nothing else; then the snapshot may go
    for _ in 0..2 {
        e.n.node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
            volume_id: ro.volume_id.clone(),
            target_path: target.to_string_lossy().into(),
        })
        .await
        .unwrap();
        e.n.node_unstage_volume(csi::NodeUnstageVolumeRequest {
            volume_id: ro.volume_id.clone(),
            staging_target_path: staging.to_string_lossy().into(),
        })
        .await
        .unwrap();
    }
    e.delete(&ro.volume_id).await.unwrap();
    e.delete(&ro.volume_id).await.unwrap();
    assert_eq!(
        rules(&e, &src.volume_id).await,
        rules_before,
        "its rule alone revoked"
    );
    assert_eq!(
        std::fs::read(e.h.seen(&live).join("data")).unwrap(),
        b"after"
    );
    e.c.delete_snapshot(csi::DeleteSnapshotRequest {
        snapshot_id: snap.snapshot_id.clone(),
        secrets: e.secrets.clone(),
    })
    .await
    .unwrap();
    e.unpublish(&src, "pod-a").await;
    e.unstage(&src).await;
    e.delete(&src.volume_id).await.unwrap();
    assert!(
        e.h.mounts_below_dir().is_empty(),
        "{:?}",
        e.h.mounts_below_dir()
    );
}

#[tokio::test]
async fn an_nfs_volume_backed_by_a_snapshot_is_refused_naming_the_writable_restore() {
    let mut e = env_with("NFS", |o| {
        o.stand_ins = false;
        o.extra_args
            .push("--default-nfs-share-client=10.0.0.0/8".into());
    })
    .await;
    let src = e.create("pvc-src", 1, &[]).await;
    let snap = e.snapshot(&src.volume_id, "snap-1").await;
    let shares = e.share_count().await;
    let mut req = from_snapshot(&e, "pvc-ro", Some(&snap.snapshot_id), vec![rox()], 1);
    req.parameters.remove("type");
    let err = e.c.create_volume(req).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{}", err.message());
    assert!(
        err.message().contains("CephFS") && err.message().contains("writable copy"),
        "{}",
        err.message()
    );
    assert_eq!(e.share_count().await, shares);
    assert_eq!(
        e.manila
            .list_access_rules(&src.volume_id)
            .await
            .unwrap()
            .len(),
        1
    );
}
