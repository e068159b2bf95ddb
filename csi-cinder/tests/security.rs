//! Bad and hostile input to `cinder-csi-plugin`: requests refused before
//! any OpenStack call, node paths outside the kubelet's roots or behind
//! symlinks, ids that would walk a URL, absurd budgets. Tests needing
//! root return early (and say so) without it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use proto::csi::v1 as csi;
use proto::csi::v1::volume_capability::access_mode::Mode;
use tonic::Code;

mod common;
use common::*;

// ------------------------------------------------------------- controller

#[tokio::test]
async fn create_volume_validates_before_calling_openstack() {
    if !root() {
        return;
    }
    let mut e = env().await;
    e.h.emulator.control().clear_calls();
    let cases: Vec<(&str, csi::CreateVolumeRequest, Code)> = vec![
        (
            "malformed class parameter",
            {
                let mut r = create_req("p1", mount_cap("ext4", Mode::SingleNodeWriter), 1);
                r.parameters.insert("fsType".into(), "zfs".into());
                r
            },
            Code::InvalidArgument,
        ),
        (
            "RWX filesystem",
            create_req("p2", mount_cap("ext4", Mode::MultiNodeMultiWriter), 1),
            Code::InvalidArgument,
        ),
        (
            "limit below a whole GiB",
            {
                let mut r = create_req("p3", mount_cap("ext4", Mode::SingleNodeWriter), 1);
                r.capacity_range = Some(csi::CapacityRange {
                    required_bytes: 10,
                    limit_bytes: 1 << 20,
                });
                r
            },
            Code::OutOfRange,
        ),
        (
            "negative size",
            {
                let mut r = create_req("p4", mount_cap("ext4", Mode::SingleNodeWriter), 1);
                r.capacity_range = Some(csi::CapacityRange {
                    required_bytes: -5,
                    limit_bytes: 0,
                });
                r
            },
            Code::InvalidArgument,
        ),
        (
            "overflowing size",
            {
                let mut r = create_req("p5", mount_cap("ext4", Mode::SingleNodeWriter), 1);
                r.capacity_range = Some(csi::CapacityRange {
                    required_bytes: i64::MAX,
                    limit_bytes: 0,
                });
                r
            },
            Code::OutOfRange,
        ),
        (
            "unknown filesystem",
            create_req("p6", mount_cap("ntfs", Mode::SingleNodeWriter), 1),
            Code::InvalidArgument,
        ),
        (
            "mount flag that rebinds",
            {
                let mut cap = mount_cap("ext4", Mode::SingleNodeWriter);
                if let Some(csi::volume_capability::AccessType::Mount(m)) = &mut cap.access_type {
                    m.mount_flags = vec!["bind".into()];
                }
                create_req("p7", cap, 1)
            },
            Code::InvalidArgument,
        ),
        (
            "unknown cloud in the secret",
            {
                let mut r = create_req("p8", mount_cap("ext4", Mode::SingleNodeWriter), 1);
                r.secrets.insert("cloud".into(), "elsewhere".into());
                r
            },
            Code::InvalidArgument,
        ),
    ];
    for (what, req, code) in cases {
        let err = e.c.create_volume(req).await.unwrap_err();
        assert_eq!(err.code(), code, "{what}: {}", err.message());
        assert!(!err.message().is_empty(), "{what}: empty message");
    }
    let calls = e.h.emulator.control().calls();
    assert!(
        calls.iter().all(|c| !c.path.contains("/volume")),
        "OpenStack was called: {calls:?}"
    );
    let err =
        e.c.create_volume({
            let mut r = create_req("p9", mount_cap("ext4", Mode::SingleNodeWriter), 1);
            // a legacy fsType the node cannot make
            r.parameters.insert("fsType".into(), "zfs".into());
            r
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message().contains("fsType"),
        "the message names the parameter: {}",
        err.message()
    );
}

// -------------------------------------------------------------- bad input

#[tokio::test]
async fn node_refuses_paths_outside_its_roots_without_touching_them() {
    if !root() {
        return;
    }
    let mut e = env().await;
    let outside = tempfile::tempdir().unwrap();
    let victim = outside.path().join("victim");
    std::fs::create_dir(&victim).unwrap();
    std::fs::write(victim.join("file"), b"x").unwrap();
    let id = "5d4d6bb2-0000-4000-8000-00000000000a";
    let inside = e.h.kubelet_dir.join("x").to_string_lossy().into_owned();
    let bad_paths = [
        victim.to_string_lossy().into_owned(),
        "relative/path".to_string(),
        format!("{inside}/../../../../{}", victim.display()),
        e.h.kubelet_dir.to_string_lossy().into_owned(),
    ];
    for p in &bad_paths {
        let err =
            e.n.node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
                volume_id: id.into(),
                target_path: p.clone(),
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{p}: {}", err.message());
        let err =
            e.n.node_unstage_volume(csi::NodeUnstageVolumeRequest {
                volume_id: id.into(),
                staging_target_path: p.clone(),
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{p}");
        let err =
            e.n.node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
                volume_id: id.into(),
                volume_path: p.clone(),
                staging_target_path: String::new(),
            })
            .await
            .unwrap_err();
        // a volume_path names a volume: one that cannot be ours is not
        // found (CSI spec), and nothing is looked at there
        assert_eq!(err.code(), Code::NotFound, "{p}: {}", err.message());
        let err =
            e.n.node_expand_volume(csi::NodeExpandVolumeRequest {
                volume_id: id.into(),
                volume_path: p.clone(),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::NotFound, "{p}: {}", err.message());
    }
    assert!(
        victim.join("file").exists(),
        "nothing outside the roots was removed"
    );

    // malformed ids: NotFound without a device search or an OpenStack call
    e.h.emulator.control().clear_calls();
    let (staging, target) = e.h.paths("x");
    let err =
        e.n.node_stage_volume(csi::NodeStageVolumeRequest {
            volume_id: "../../etc".into(),
            staging_target_path: staging.to_string_lossy().into(),
            volume_capability: Some(mount_cap("ext4", Mode::SingleNodeWriter)),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    let err =
        e.c.controller_publish_volume(csi::ControllerPublishVolumeRequest {
            volume_id: id.into(),
            node_id: "node-1.example.com".into(),
            volume_capability: Some(mount_cap("ext4", Mode::SingleNodeWriter)),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    let err =
        e.n.node_publish_volume(csi::NodePublishVolumeRequest {
            volume_id: id.into(),
            staging_target_path: staging.to_string_lossy().into(),
            target_path: target.to_string_lossy().into(),
            volume_capability: Some(mount_cap("ext4", Mode::SingleNodeWriter)),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(
        err.code(),
        Code::FailedPrecondition,
        "not staged: {}",
        err.message()
    );
    let err =
        e.c.controller_expand_volume(csi::ControllerExpandVolumeRequest {
            volume_id: id.into(),
            capacity_range: Some(csi::CapacityRange {
                required_bytes: -1,
                limit_bytes: 0,
            }),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        e.h.emulator.control().calls().is_empty(),
        "{:?}",
        e.h.emulator.control().calls()
    );
    let _ = BTreeMap::<String, String>::new();
}

/// Whether anything is mounted at or below `dir`.
fn mounted_below(dir: &Path) -> bool {
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    let at = host_ops::mountinfo::mounts_at(&dir).unwrap();
    !at.is_empty() || !host_ops::mountinfo::mounts_below(&dir).unwrap().is_empty()
}

#[tokio::test]
async fn symlinks_under_the_kubelet_dir_never_lead_a_mount_or_a_removal_outside() {
    if !root() {
        return;
    }
    let mut e = env().await;
    let ext4 = mount_cap("ext4", Mode::SingleNodeWriter);
    let (v, staging) = e.staged("links", ext4.clone(), 1).await;
    let outside = tempfile::tempdir().unwrap();
    std::fs::create_dir(outside.path().join("victim")).unwrap();
    let pods = e.h.kubelet_dir.join("pods");
    std::fs::create_dir_all(&pods).unwrap();
    // a directory on the way replaced by a symlink, and a target that is one
    std::os::unix::fs::symlink(outside.path(), pods.join("evil")).unwrap();
    std::os::unix::fs::symlink(outside.path().join("victim"), pods.join("link-target")).unwrap();
    let publish = |target: String| csi::NodePublishVolumeRequest {
        volume_id: v.volume_id.clone(),
        staging_target_path: staging.to_string_lossy().into(),
        target_path: target,
        volume_capability: Some(ext4.clone()),
        ..Default::default()
    };
    for target in [
        pods.join("evil/volumes/mount"),
        pods.join("evil/victim"),
        pods.join("link-target"),
    ] {
        let err =
            e.n.node_publish_volume(publish(target.to_string_lossy().into()))
                .await
                .unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{}", err.message());
        assert!(err.message().contains("symlink"), "{}", err.message());
    }
    assert!(!mounted_below(outside.path()), "nothing mounted outside");
    assert!(
        !outside.path().join("volumes").exists(),
        "nothing created outside"
    );

    // removal: through a symlink is refused, a file with content is kept
    let config = e.h.kubelet_dir.join("config.yaml");
    std::fs::write(&config, "kind: KubeletConfiguration\n").unwrap();
    let unpublish = |target: &Path| csi::NodeUnpublishVolumeRequest {
        volume_id: v.volume_id.clone(),
        target_path: target.to_string_lossy().into(),
    };
    let err =
        e.n.node_unpublish_volume(unpublish(&pods.join("evil/victim")))
            .await
            .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{}", err.message());
    let err =
        e.n.node_unstage_volume(csi::NodeUnstageVolumeRequest {
            volume_id: v.volume_id.clone(),
            staging_target_path: pods.join("evil/victim").to_string_lossy().into(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{}", err.message());
    assert!(
        outside.path().join("victim").is_dir(),
        "the empty directory outside is kept"
    );
    let err =
        e.n.node_unpublish_volume(unpublish(&config))
            .await
            .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{}", err.message());
    assert!(
        err.message().contains("not a mount point"),
        "{}",
        err.message()
    );
    assert_eq!(
        std::fs::read_to_string(&config).unwrap(),
        "kind: KubeletConfiguration\n"
    );
    let err =
        e.n.node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
            volume_id: v.volume_id.clone(),
            volume_path: pods.join("evil/victim").to_string_lossy().into(),
            staging_target_path: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{}", err.message());

    // a plain target beneath the root still publishes and unpublishes
    let (_, target) = e.h.paths(&v.volume_id);
    e.n.node_publish_volume(publish(target.to_string_lossy().into()))
        .await
        .unwrap();
    assert!(mounted_below(&target));
    e.n.node_unpublish_volume(unpublish(&target)).await.unwrap();
    assert!(!target.exists());
    std::fs::remove_file(pods.join("evil")).unwrap();
    std::fs::remove_file(pods.join("link-target")).unwrap();
    std::fs::remove_file(&config).unwrap();
    e.unstage(&v.volume_id).await;
    e.unpublish(&v.volume_id).await;
}

#[tokio::test]
async fn ids_from_a_storage_class_cannot_walk_the_url() {
    let mut e = env().await;
    // a multi-node capability makes the driver look the type up by name
    for walking in ["..", "."] {
        e.h.emulator.control().clear_calls();
        let mut r = create_req("walk", block_cap(Mode::MultiNodeMultiWriter), 1);
        r.parameters.insert("type".into(), walking.into());
        let err = e.c.create_volume(r).await.unwrap_err();
        assert_eq!(
            err.code(),
            Code::InvalidArgument,
            "{walking}: {}",
            err.message()
        );
        // refused before anything was sent: no GET of the project root,
        // no list of the types where one was asked for
        let calls = e.h.emulator.control().calls();
        assert!(
            !calls.iter().any(|c| c.path.contains("/types")
                || c.path
                    .trim_end_matches('/')
                    .ends_with("a0000000000000000000000000000001")),
            "{walking}: {:?}",
            calls
                .iter()
                .map(|c| format!("{} {}", c.method, c.path))
                .collect::<Vec<_>>()
        );
    }
    assert!(e.named("walk").await.is_empty(), "no volume made");
}

#[tokio::test]
async fn absurd_backup_budgets_are_refused_before_anything_is_made() {
    let mut e = env().await;
    let v = e
        .create("budget", mount_cap("ext4", Mode::SingleNodeWriter), 1)
        .await;
    e.h.emulator.control().clear_calls();
    for budget in ["18446744073709551615", "86401", "0", "-1"] {
        let err =
            e.c.create_snapshot(snapshot_req(
                &v.volume_id,
                "budget-backup",
                &[
                    ("type", "backup"),
                    ("backup-max-duration-seconds-per-gb", budget),
                ],
            ))
            .await
            .unwrap_err();
        assert_eq!(
            err.code(),
            Code::InvalidArgument,
            "{budget}: {}",
            err.message()
        );
    }
    assert!(
        !e.h.emulator
            .control()
            .calls()
            .iter()
            .any(|c| c.method == "POST"),
        "nothing was created"
    );
    // the largest allowed budget is served (and waits within the deadline)
    let snap =
        e.c.create_snapshot(snapshot_req(
            &v.volume_id,
            "budget-backup",
            &[
                ("type", "backup"),
                ("backup-max-duration-seconds-per-gb", "86400"),
            ],
        ))
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap();
    e.c.delete_snapshot(csi::DeleteSnapshotRequest {
        snapshot_id: snap.snapshot_id,
        secrets: HashMap::new(),
    })
    .await
    .unwrap();
}
