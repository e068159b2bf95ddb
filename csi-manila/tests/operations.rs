//! What an operator sees and changes under a running `manila-csi-plugin`:
//! logs that never carry a secret or key, and credentials rotated without
//! a restart.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use proto::csi::v1 as csi;
use tonic::Code;

mod common;
use common::*;

#[tokio::test]
async fn secrets_and_keys_never_reach_the_log() {
    if !root() {
        return;
    }
    let log_dir = tempfile::tempdir().unwrap();
    let log = log_dir.path().join("plugin.log");
    let log_path = log.clone();
    let mut e = env_with("CEPHFS", move |o| {
        o.log_file = Some(log_path);
        o.log_level = "debug".into();
    })
    .await;
    let v = e.create("pvc-secret", 1, &[("type", "cephfs")]).await;
    e.stage(&v, rwx()).await;
    let t = e.publish(&v, "pod-a", false).await;
    e.stats(&t).await;
    e.unpublish(&v, "pod-a").await;
    e.unstage(&v).await;
    let key = e.manila.list_access_rules(&v.volume_id).await.unwrap()[0]
        .access_key
        .clone()
        .unwrap();
    e.delete(&v.volume_id).await.unwrap();
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("NodeStageVolume"),
        "the debug log was written"
    );
    assert!(
        !text.contains("demo-secret"),
        "the password leaked into the log"
    );
    assert!(!text.contains(&key), "the cephx key leaked into the log");
    for c in e.h.helper_calls() {
        assert!(
            !format!("{c:?}").contains(&key),
            "key on a command line: {c:?}"
        );
    }
}

#[tokio::test]
async fn rotated_credentials_apply_without_a_restart() {
    if !root() {
        return;
    }
    let mut e = env("NFS").await;
    let list = || csi::ListVolumesRequest::default();
    // calls without secrets use the plugin's own credentials
    e.c.list_volumes(list()).await.unwrap();
    let ctl = e.h.emulator.control();
    assert!(ctl.set_password("demo", "rotated-secret"));
    let err = e.c.list_volumes(list()).await.unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated, "{}", err.message());
    // the file edited in place (no symlink): picked up without a restart
    let text = std::fs::read_to_string(&e.h.cloud_conf).unwrap();
    std::fs::write(
        &e.h.cloud_conf,
        text.replace("demo-secret", "rotated-secret"),
    )
    .unwrap();
    let mut done = false;
    for _ in 0..100 {
        match e.c.list_volumes(list()).await {
            Ok(_) => {
                done = true;
                break;
            }
            Err(s) => assert_eq!(s.code(), Code::Unauthenticated, "{}", s.message()),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(done, "the new password was never used");
}
