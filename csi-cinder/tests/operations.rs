//! What an operator sees and changes under a running `cinder-csi-plugin`:
//! its JSON logs, and credentials rotated without a restart.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use csi_sanity::harness::{CinderOnEmulator, HarnessOptions};
use proto::csi::v1 as csi;
use proto::csi::v1::controller_client::ControllerClient;
use proto::csi::v1::node_client::NodeClient;
use proto::csi::v1::volume_capability::access_mode::Mode;
use tonic::Code;

mod common;
use common::*;

#[tokio::test]
async fn json_logs_have_unique_keys_and_name_what_each_call_works_on() {
    if !root() {
        return;
    }
    let logs = tempfile::tempdir().unwrap();
    let log = logs.path().join("plugin.log");
    let mut o = HarnessOptions::new(BIN);
    o.extra_args = vec!["--log-format=json".into()];
    o.log_file = Some(log.clone());
    let h = CinderOnEmulator::start(o).await.unwrap();
    csi_sanity::harness::wait_until_ready(&h.socket)
        .await
        .unwrap();
    let ch = plugin_runtime::connect_unix(&h.socket).await.unwrap();
    let mut c = ControllerClient::new(ch.clone());
    let mut n = NodeClient::new(ch);
    let cap = mount_cap("ext4", Mode::SingleNodeWriter);
    let mut r = create_req("pvc-logged", cap.clone(), 1);
    r.parameters
        .insert("csi.storage.k8s.io/pvc/name".into(), "data".into());
    let v = c
        .create_volume(r)
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    let snap = c
        .create_snapshot(snapshot_req(&v.volume_id, "snap-logged", &[]))
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap();
    c.delete_snapshot(csi::DeleteSnapshotRequest {
        snapshot_id: snap.snapshot_id.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    c.controller_publish_volume(csi::ControllerPublishVolumeRequest {
        volume_id: v.volume_id.clone(),
        node_id: h.node_id.clone(),
        volume_capability: Some(cap.clone()),
        ..Default::default()
    })
    .await
    .unwrap();
    let (staging, _) = h.paths(&v.volume_id);
    n.node_stage_volume(csi::NodeStageVolumeRequest {
        volume_id: v.volume_id.clone(),
        staging_target_path: staging.to_string_lossy().into(),
        volume_capability: Some(cap.clone()),
        ..Default::default()
    })
    .await
    .unwrap();
    n.node_unstage_volume(csi::NodeUnstageVolumeRequest {
        volume_id: v.volume_id.clone(),
        staging_target_path: staging.to_string_lossy().into(),
    })
    .await
    .unwrap();
    c.controller_unpublish_volume(csi::ControllerUnpublishVolumeRequest {
        volume_id: v.volume_id.clone(),
        node_id: h.node_id.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    // a failing call logs too
    let _ = c
        .controller_publish_volume(csi::ControllerPublishVolumeRequest {
            volume_id: v.volume_id.clone(),
            node_id: "00000000-0000-4000-8000-00000000dead".into(),
            volume_capability: Some(cap),
            ..Default::default()
        })
        .await
        .unwrap_err();
    c.delete_volume(csi::DeleteVolumeRequest {
        volume_id: v.volume_id.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    drop(h);
    let text = std::fs::read_to_string(&log).unwrap();
    let problems = csi_sanity::logs::check_json_log(&text);
    assert!(problems.is_empty(), "{problems:#?}");
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let in_span = |rpc: &str, field: &str, value: &str| {
        lines
            .iter()
            .any(|l| l["span"]["name"] == rpc && l["span"][field].as_str() == Some(value))
    };
    assert!(
        in_span("CreateVolume", "volume_name", "pvc-logged"),
        "{text}"
    );
    assert!(in_span("DeleteVolume", "volume_id", &v.volume_id), "{text}");
    assert!(
        in_span("ControllerPublishVolume", "volume_id", &v.volume_id),
        "{text}"
    );
    // the refused publish to a node that does not exist: its code and why,
    // in the call's span
    assert!(
        lines
            .iter()
            .any(|l| l["span"]["name"] == "ControllerPublishVolume"
                && l["span"]["volume_id"].as_str() == Some(v.volume_id.as_str())
                && l["message"] == "request refused"
                && l["code"] == "NotFound"
                && l["error"]
                    .as_str()
                    .is_some_and(|e| e.contains("00000000-0000-4000-8000-00000000dead"))),
        "the failing call is not logged: {text}"
    );
}

#[tokio::test]
async fn rotated_credentials_apply_without_a_restart() {
    if !root() {
        return;
    }
    let logs = tempfile::tempdir().unwrap();
    let log = logs.path().join("plugin.log");
    let mut o = HarnessOptions::new(BIN);
    o.log_file = Some(log.clone());
    let h = CinderOnEmulator::start(o).await.unwrap();
    csi_sanity::harness::wait_until_ready(&h.socket)
        .await
        .unwrap();
    let pid = h.plugin_pid().unwrap();
    let mut c = ControllerClient::new(plugin_runtime::connect_unix(&h.socket).await.unwrap());
    let create = |name: &str| create_req(name, mount_cap("ext4", Mode::SingleNodeWriter), 1);
    c.create_volume(create("before")).await.unwrap();

    // the password changes in Keystone (its tokens are revoked): the old
    // credentials stop working
    let ctl = h.emulator.control();
    // (the plugin runs as the project's member `demo`)
    assert!(ctl.set_password(openstack_emulator::MEMBER_USER, "rotated-secret"));
    let err = c.create_volume(create("stale")).await.unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated, "{}", err.message());
    // kubelet updates the mounted Secret: the next calls use it
    let conf = std::fs::read_to_string(&h.cloud_conf).unwrap();
    h.update_cloud_conf(&conf.replace(openstack_emulator::MEMBER_PASSWORD, "rotated-secret"))
        .unwrap();
    let mut ok = None;
    for _ in 0..100 {
        match c.create_volume(create("after")).await {
            Ok(r) => {
                ok = Some(r);
                break;
            }
            Err(e) => assert_eq!(e.code(), Code::Unauthenticated, "{}", e.message()),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(ok.is_some(), "the new credentials were never used");

    // a broken update keeps the running credentials
    h.update_cloud_conf("[Global]\nauth-url = \"not a url")
        .unwrap();
    csi_sanity::harness::wait_until_logged(&log, "configuration not reloaded", 1)
        .await
        .unwrap();
    c.create_volume(create("still")).await.unwrap();
    // SIGHUP with the same broken file: nothing new to say
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGHUP,
    )
    .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    c.create_volume(create("still-2")).await.unwrap();
    drop(c);
    drop(h);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        !text.contains('\u{1b}'),
        "colour codes in a log file: {text}"
    );
    assert_eq!(
        text.matches("configuration reloaded").count(),
        1,
        "one reload applied: {text}"
    );
    assert_eq!(
        text.matches("configuration not reloaded").count(),
        1,
        "one failure, said once: {text}"
    );
    assert!(
        text.contains("Keystone accepts the new credentials"),
        "{text}"
    );
    assert!(
        !text.contains("rotated-secret"),
        "a password reached the log"
    );
}
