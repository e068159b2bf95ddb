//! Bad and hostile input to `manila-csi-plugin`: requests refused before
//! any Manila call, Secrets that would turn the plugin's own files against
//! it, volume contexts borrowing another share's rule, and a hostile
//! cloud's answers. Tests needing root return early (and say so) without
//! it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use openstack_emulator::{FaultAction, FaultRule};
use proto::csi::v1 as csi;
use proto::csi::v1::volume_capability::access_mode::Mode;
use tonic::Code;

mod common;
use common::*;

// ------------------------------------------------------------- bad input

#[tokio::test]
async fn bad_input_is_refused_before_any_manila_call() {
    let mut e = env_with("NFS", |o| o.stand_ins = false).await;
    csi_sanity::harness::wait_until_ready(&e.h.socket)
        .await
        .unwrap();
    e.h.emulator.control().clear_calls();
    let good = e.create_req("pvc-x", 1, &[("nfs-shareClient", "10.0.0.1")]);
    let block = csi::VolumeCapability {
        access_type: Some(csi::volume_capability::AccessType::Block(
            csi::volume_capability::BlockVolume {},
        )),
        access_mode: Some(csi::volume_capability::AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
    };
    let mut cases: Vec<(&str, csi::CreateVolumeRequest)> = Vec::new();
    let mut r = good.clone();
    r.name.clear();
    cases.push(("no name", r));
    let mut r = good.clone();
    r.volume_capabilities.clear();
    cases.push(("no capabilities", r));
    let mut r = good.clone();
    r.volume_capabilities = vec![block];
    cases.push(("block", r));
    for (k, v) in [
        ("nfs-shareClient", "anyone"),
        ("cephfs-mounter", "nfs"),
        ("type", ""),
        ("appendShareMetadata", "{"),
        ("autoTopology", "maybe"),
    ] {
        let mut r = good.clone();
        r.parameters.insert(k.into(), v.into());
        cases.push((k, r));
    }
    let mut r = good.clone();
    r.secrets.remove("os-authURL");
    cases.push(("secret without os-authURL", r));
    let mut r = good.clone();
    r.capacity_range = Some(csi::CapacityRange {
        required_bytes: -1,
        limit_bytes: 0,
    });
    cases.push(("negative size", r));
    for (what, req) in cases {
        let err = e.c.create_volume(req).await.unwrap_err();
        assert_eq!(
            err.code(),
            Code::InvalidArgument,
            "{what}: {}",
            err.message()
        );
    }
    let malformed = "../../etc";
    assert!(e.delete(malformed).await.is_ok(), "no share has that id");
    let err =
        e.c.create_snapshot(csi::CreateSnapshotRequest {
            source_volume_id: malformed.into(),
            name: "s".into(),
            secrets: e.secrets.clone(),
            parameters: HashMap::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);

    // node: paths outside the root, traversal, malformed ids
    let outside = tempfile::tempdir().unwrap();
    let (staging, target) = e.h.paths("v", "pod");
    let cap = Some(rwx());
    for (what, staging_path, target_path) in [
        (
            "staging outside",
            outside.path().to_string_lossy().into_owned(),
            target.to_string_lossy().into_owned(),
        ),
        (
            "staging with ..",
            format!("{}/../../..{}", staging.display(), outside.path().display()),
            target.to_string_lossy().into_owned(),
        ),
        (
            "relative target",
            staging.to_string_lossy().into_owned(),
            "pods/x".into(),
        ),
    ] {
        let err =
            e.n.node_publish_volume(csi::NodePublishVolumeRequest {
                volume_id: "v".into(),
                staging_target_path: staging_path.clone(),
                target_path,
                volume_capability: cap.clone(),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{what}");
        let err =
            e.n.node_stage_volume(csi::NodeStageVolumeRequest {
                volume_id: "v".into(),
                staging_target_path: staging_path,
                volume_capability: cap.clone(),
                secrets: e.secrets.clone(),
                ..Default::default()
            })
            .await
            .unwrap_err();
        if what != "relative target" {
            assert_eq!(err.code(), Code::InvalidArgument, "{what}");
        }
    }
    let err =
        e.n.node_stage_volume(csi::NodeStageVolumeRequest {
            volume_id: malformed.into(),
            staging_target_path: staging.to_string_lossy().into(),
            volume_capability: cap.clone(),
            secrets: e.secrets.clone(),
            volume_context: params(&[("shareID", malformed), ("shareAccessIDs", "a")]),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{}", err.message());
    let err =
        e.n.node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
            volume_id: "v".into(),
            volume_path: "some/path".into(),
            staging_target_path: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    assert!(
        e.share_calls().is_empty(),
        "no Manila call for bad input: {:?}",
        e.share_calls()
    );
    assert!(outside.path().exists());
}

/// Connections a listener accepted: a stand-in for a server a Secret's
/// author controls.
async fn listener_counting() -> (String, Arc<std::sync::atomic::AtomicUsize>) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let n = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = n.clone();
    tokio::spawn(async move {
        while let Ok((_s, _)) = l.accept().await {
            seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    });
    (format!("http://{addr}/v3"), n)
}

#[tokio::test]
async fn a_secret_cannot_turn_the_plugins_own_files_against_it() {
    let allowed = tempfile::tempdir().unwrap();
    let private = tempfile::tempdir().unwrap();
    let allowed_dir = allowed.path().to_path_buf();
    let mut e = env_with("NFS", |o| {
        o.extra_args
            .push(format!("--secret-file-dir={}", allowed_dir.display()));
    })
    .await;
    let s = e.secrets.clone();
    // the plugin's own clouds.yaml, as OpenShift's operator mounts it
    let clouds = allowed.path().join("clouds.yaml");
    std::fs::write(
        &clouds,
        format!(
            "clouds:\n  admin:\n    region_name: RegionOne\n    auth:\n      auth_url: {}\n      username: {}\n      password: {}\n      project_name: {}\n      user_domain_name: Default\n      project_domain_name: Default\n",
            s["os-authURL"], s["os-userName"], s["os-password"], s["os-projectName"]
        ),
    )
    .unwrap();
    // a file the plugin holds that a Secret must not reach
    let conf = private.path().join("cloud.conf");
    std::fs::write(&conf, "[Global]\npassword = operator-password\n").unwrap();
    let (attacker, connections) = listener_counting().await;
    let secret = |pairs: &[(&str, String)]| -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect()
    };
    let create = |name: &str, secrets: HashMap<String, String>| csi::CreateVolumeRequest {
        name: name.into(),
        volume_capabilities: vec![rwx()],
        parameters: params(&[("nfs-shareClient", "10.0.0.1")]),
        secrets,
        ..Default::default()
    };
    let use_clouds = |file: &Path, cloud: &str| {
        vec![
            ("os-useClouds", "true".to_string()),
            ("os-cloudsFile", file.display().to_string()),
            ("os-cloud", cloud.to_string()),
        ]
    };

    // credentials loaded from the plugin's file, sent elsewhere: refused
    for extra in [
        ("os-authURL", attacker.clone()),
        ("os-TLSInsecure", "true".to_string()),
        ("os-endpointType", "internal".to_string()),
        (
            "os-certAuthority",
            "-----BEGIN CERTIFICATE-----".to_string(),
        ),
    ] {
        let mut pairs = use_clouds(&clouds, "admin");
        pairs.push(extra.clone());
        let err =
            e.c.create_volume(create("pvc-steal", secret(&pairs)))
                .await
                .unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{}", err.message());
        assert!(err.message().contains(extra.0), "{}", err.message());
    }
    assert_eq!(connections.load(std::sync::atomic::Ordering::SeqCst), 0);

    // files outside the allowed directories: one answer whether they exist
    // or not, never their content
    let answer = |path: &Path| -> Vec<(&'static str, HashMap<String, String>)> {
        let mut plain: Vec<(&str, String)> =
            s.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
        let mut ca = plain.clone();
        ca.push(("os-certAuthorityPath", path.display().to_string()));
        plain.push(("os-clientCertPath", path.display().to_string()));
        plain.push(("os-clientKeyPath", path.display().to_string()));
        vec![
            ("os-cloudsFile", secret(&use_clouds(path, "admin"))),
            ("os-certAuthorityPath", secret(&ca)),
            ("os-clientCertPath", secret(&plain)),
        ]
    };
    let missing = private.path().join("missing");
    let link = allowed.path().join("link");
    std::os::unix::fs::symlink(&conf, &link).unwrap();
    for ((key, present), (_, absent)) in answer(&conf).into_iter().zip(answer(&missing)) {
        let a =
            e.c.create_volume(create("pvc-read", present))
                .await
                .unwrap_err();
        let b =
            e.c.create_volume(create("pvc-read", absent))
                .await
                .unwrap_err();
        assert_eq!(a.code(), Code::InvalidArgument, "{}", a.message());
        assert_eq!(b.code(), Code::InvalidArgument, "{}", b.message());
        assert!(a.message().contains(key), "{}", a.message());
        assert!(
            !a.message().contains("operator-password") && !a.message().contains("Global"),
            "{}",
            a.message()
        );
        assert_eq!(
            a.message().replace(&conf.display().to_string(), "P"),
            b.message().replace(&missing.display().to_string(), "P"),
            "an existing file and a missing one get the same answer"
        );
    }
    // a symlink in an allowed directory that leads out is refused alike
    let err =
        e.c.create_volume(create("pvc-link", secret(&use_clouds(&link, "admin"))))
            .await
            .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{}", err.message());
    assert!(
        !err.message().contains("operator-password"),
        "{}",
        err.message()
    );
    // a cloud the file does not define: the answer does not list the others
    let err =
        e.c.create_volume(create("pvc-cloud", secret(&use_clouds(&clouds, "nope"))))
            .await
            .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{}", err.message());
    assert!(!err.message().contains("admin"), "{}", err.message());

    // upstream's uses keep working: the plugin's clouds.yaml as it is
    let v =
        e.c.create_volume(create("pvc-clouds", secret(&use_clouds(&clouds, "admin"))))
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
    e.delete(&v.volume_id).await.unwrap();
    assert_eq!(connections.load(std::sync::atomic::Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_volume_context_cannot_borrow_another_shares_access_rule() {
    if !root() {
        return;
    }
    let mut e = env("CEPHFS").await;
    let a = e.create("pvc-a", 1, &[("type", "cephfs")]).await;
    let b = e.create("pvc-b", 1, &[("type", "cephfs")]).await;
    let b_rule = b.volume_context["shareAccessIDs"].clone();
    let calls_before = e.h.helper_calls().len();
    // share a's handle with share b's rule (and its cephx key)
    let mut req = e.stage_req(&a, rwx());
    req.volume_context
        .insert("shareAccessIDs".into(), b_rule.clone());
    let err = e.n.node_stage_volume(req).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{}", err.message());
    assert_eq!(
        e.h.helper_calls().len(),
        calls_before,
        "nothing was mounted with another share's key"
    );
    // its own rule still stages
    e.stage(&a, rwx()).await;
    e.unstage(&a).await;
    e.delete(&a.volume_id).await.unwrap();
    e.delete(&b.volume_id).await.unwrap();
}

#[tokio::test]
async fn what_a_hostile_cloud_answers_never_reaches_mount_or_a_ceph_file() {
    if !root() {
        return;
    }
    // NFS: an export location that would be read as mount options
    let mut e = env("NFS").await;
    let created = e
        .create("pvc-hostile-nfs", 1, &[("nfs-shareClient", "10.0.0.1")])
        .await;
    // a context without export locations (a static PV): Manila is asked
    let mut v = created.clone();
    v.volume_context.remove("exportLocations");
    let lie = |path_contains: &str, body: serde_json::Value| {
        FaultRule::new(
            Some("GET"),
            path_contains,
            FaultAction::Json { status: 200, body },
        )
    };
    for export in [
        "-oexec,suid:/x",
        "127.0.0.1:/shares/a b",
        "127.0.0.1:/shares/a\nb",
    ] {
        e.h.emulator.control().clear_faults();
        e.h.emulator.control().add_fault(lie(
            "/export_locations",
            serde_json::json!({"export_locations": [
                {"id": "x", "path": export, "preferred": true, "is_admin_only": false}
            ]}),
        ));
        let before = e.h.helper_calls().len();
        let err =
            e.n.node_stage_volume(e.stage_req(&v, rwx()))
                .await
                .unwrap_err();
        assert_eq!(
            err.code(),
            Code::FailedPrecondition,
            "{export:?}: {}",
            err.message()
        );
        assert_eq!(e.h.helper_calls().len(), before, "{export:?}: mount(8) ran");
    }
    e.h.emulator.control().clear_faults();
    // the same answers written into the volume context are never
    // mounted: the stage looks the share up and mounts what Manila says
    for export in ["-oexec,suid:/x", "127.0.0.1:/shares/a b"] {
        let mut ctx = created.clone();
        ctx.volume_context.insert(
            "exportLocations".into(),
            serde_json::json!([[export, true]]).to_string(),
        );
        e.stage(&ctx, rwx()).await;
        let call = e.h.helper_calls().pop().unwrap();
        assert!(
            call.source.starts_with("127.0.0.1:/shares/share-"),
            "{call:?}"
        );
        e.unstage(&ctx).await;
    }

    // CephFS: monitors and a cephx user or key that would write into the
    // ceph.conf or the keyring, or add mount options
    let mut e = env("CEPHFS").await;
    let mut v = e.create("pvc-hostile-ceph", 1, &[("type", "cephfs")]).await;
    v.volume_context.remove("exportLocations");
    let rule_id = v.volume_context["shareAccessIDs"].clone();
    let rule = |to: &str, key: &str| {
        serde_json::json!({"access": {
            "id": rule_id, "share_id": v.volume_id, "access_type": "cephx",
            "access_to": to, "access_level": "rw", "state": "active", "access_key": key
        }})
    };
    let good_key = "AQBv4n1mAAAAABAA7n7b5aXfJ0mD0pZJ1S6L9w==";
    let cases = vec![
        lie(
            "/share-access-rules/",
            rule("a,secretfile=/etc/shadow", good_key),
        ),
        lie("/share-access-rules/", rule("a\n[client.admin]", good_key)),
        lie(
            "/share-access-rules/",
            rule("user", "AQ==\n\tcaps mon = allow *"),
        ),
        lie(
            "/export_locations",
            serde_json::json!({"export_locations": [{"id": "x",
                "path": "127.0.0.1:6789\nkeyring = /etc/shadow:/volumes/x",
                "preferred": true, "is_admin_only": false}]}),
        ),
    ];
    for fault in cases {
        e.h.emulator.control().clear_faults();
        e.h.emulator.control().add_fault(fault.clone());
        let before = e.h.helper_calls().len();
        let err =
            e.n.node_stage_volume(e.stage_req(&v, rwx()))
                .await
                .unwrap_err();
        assert_eq!(
            err.code(),
            Code::FailedPrecondition,
            "{fault:?}: {}",
            err.message()
        );
        assert!(
            !err.message().contains("caps mon"),
            "the key is never quoted"
        );
        assert_eq!(e.h.helper_calls().len(), before, "{fault:?}: a mount ran");
        assert!(
            !std::fs::read_dir(e.h.state_dir.join("volumes"))
                .map(|d| d.flatten().any(|f| f.path().join("keyring").exists()))
                .unwrap_or(false),
            "no keyring written"
        );
    }
    e.h.emulator.control().clear_faults();
    // the real answers still stage
    e.stage(&v, rwx()).await;
    e.unstage(&v).await;
}
