//! The orphan report through the binary: `cinder-csi-plugin orphans`
//! against the emulator and a stand-in apiserver that lists the cluster's
//! PersistentVolumes and VolumeSnapshotContents (a page at a time), and
//! the controller's `cinder_csi_orphans{kind}`. What the cluster made and
//! names no more is reported (named, with its age) and deleted only when
//! asked: never one attached, never one a PV names again by then, never
//! one of another cluster or made by hand. Tests needing root return
//! early (and say so) without it.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use csi_sanity::harness::kube::StandInApiserver;
use csi_sanity::harness::{free_port, wait_for_metrics};
use openstack_client::cinder::CreateVolume;
use proto::csi::v1::volume_capability::access_mode::Mode;
use serde_json::{Value, json};

mod common;
use common::*;

const DRIVER: &str = "cinder.csi.openstack.org";

/// `cinder-csi-plugin orphans ...` as JSON (the stand-in apiserver runs
/// on this test's runtime: the command is awaited, not waited for).
async fn orphans(e: &Env, api: &StandInApiserver, extra: &[&str]) -> Value {
    let out = tokio::process::Command::new(BIN)
        .arg("orphans")
        .arg(format!("--cloud-config={}", e.h.cloud_conf.display()))
        .arg("--cluster=sanity")
        .args(api.flags())
        .arg("--output=json")
        .args(extra)
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn ids(v: &Value) -> Vec<String> {
    let mut ids: Vec<String> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["id"].as_str().unwrap().to_string())
        .collect();
    ids.sort();
    ids
}

#[tokio::test]
async fn what_the_cluster_names_no_more_is_reported_and_deleted_only_when_asked() {
    if !root() {
        return;
    }
    let mut e = env().await;
    let cap = mount_cap("ext4", Mode::SingleNodeWriter);
    let named = e.create("orphans-named", cap.clone(), 1).await.volume_id;
    let other_driver = e
        .create("orphans-other-driver", cap.clone(), 1)
        .await
        .volume_id;
    let gone = e.create("orphans-gone", cap.clone(), 1).await.volume_id;
    let late = e.create("orphans-late", cap.clone(), 1).await.volume_id;
    let attached = e.create("orphans-attached", cap.clone(), 1).await.volume_id;
    e.publish(&attached, cap.clone()).await;
    let snap = |name: &str, source: &str| snapshot_req(source, name, &[]);
    let kept_snap =
        e.c.create_snapshot(snap("orphans-snap-named", &named))
            .await
            .unwrap()
            .into_inner()
            .snapshot
            .unwrap()
            .snapshot_id;
    let lost_snap =
        e.c.create_snapshot(snap("orphans-snap-gone", &named))
            .await
            .unwrap()
            .into_inner()
            .snapshot
            .unwrap()
            .snapshot_id;
    // made by hand, not by the driver: no cluster tag, never reported
    let by_hand = e
        .cinder
        .create_volume(&CreateVolume {
            name: "by-hand".into(),
            size_gib: 1,
            ..Default::default()
        })
        .await
        .unwrap()
        .id;

    let api = StandInApiserver::start().await.unwrap();
    {
        let mut o = api.objects();
        o.pvs = vec![
            (DRIVER.into(), named.clone()),
            ("other.csi.example.com".into(), other_driver.clone()),
        ];
        o.contents = vec![(DRIVER.into(), kept_snap.clone())];
        o.late_pv = Some((DRIVER.into(), late.clone()));
        o.late_from = usize::MAX;
    }

    // too young to count
    let young = orphans(&e, &api, &["--older-than=1h"]).await;
    assert_eq!(young["report"]["orphans"], json!([]));
    assert_eq!(young["report"]["young"].as_array().unwrap().len(), 5);

    let report = orphans(&e, &api, &["--older-than=0s"]).await;
    println!("{report:#}");
    let mut want = vec![
        other_driver.clone(),
        gone.clone(),
        late.clone(),
        attached.clone(),
        lost_snap.clone(),
    ];
    want.sort();
    assert_eq!(ids(&report["report"]["orphans"]), want);
    assert_eq!(report["report"]["tagged"], 7, "by_hand is not tagged");
    let attached_entry = report["report"]["orphans"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["id"] == attached.as_str())
        .unwrap()
        .clone();
    assert!(
        attached_entry["keep"]
            .as_str()
            .unwrap()
            .starts_with("attached to"),
        "{attached_entry}"
    );
    assert!(
        report["deleted"].as_array().unwrap().is_empty(),
        "nothing deleted unasked"
    );
    assert_eq!(e.status(&gone).await, "available");

    // deletion, asked for: a PV that appears between the command's report
    // and its deletions (its second listing) keeps its volume
    {
        let mut o = api.objects();
        o.late_from = o.pv_lists + 2;
    }
    let done = orphans(&e, &api, &["--older-than=0s", "--delete"]).await;
    println!("{done:#}");
    let deleted: Vec<String> = done["deleted"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_str().unwrap().to_string())
        .collect();
    let kept: Vec<String> = done["kept"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_str().unwrap().to_string())
        .collect();
    for id in [&gone, &other_driver, &lost_snap] {
        assert!(
            deleted.iter().any(|d| d.contains(id.as_str())),
            "{id}: {deleted:?}"
        );
    }
    assert!(
        kept.iter()
            .any(|k| k.contains(late.as_str()) && k.contains("named by the cluster now")),
        "{kept:?}"
    );
    assert!(
        kept.iter()
            .any(|k| k.contains(attached.as_str()) && k.contains("attached to")),
        "{kept:?}"
    );
    for id in [&named, &late, &attached, &by_hand] {
        assert!(
            e.cinder
                .get_volume(id)
                .await
                .is_ok_and(|v| v.status.as_str() != "deleting"),
            "{id} must stay"
        );
    }
    assert!(e.cinder.get_snapshot(&kept_snap).await.is_ok());
    for id in [&gone, &other_driver] {
        let left = e.cinder.get_volume(id).await;
        assert!(
            left.as_ref().is_err_and(|err| err.is_not_found())
                || left.as_ref().is_ok_and(|v| v.status.as_str() == "deleting"),
            "{id}: {left:?}"
        );
    }
}

#[tokio::test]
async fn the_controller_counts_the_orphans_in_its_metrics() {
    if !root() {
        return;
    }
    let api = StandInApiserver::start().await.unwrap();
    let port = free_port().unwrap();
    let mut flags = vec![
        format!("--http-endpoint=127.0.0.1:{port}"),
        "--orphan-report-interval=2s".into(),
        "--orphan-grace=0s".into(),
    ];
    flags.extend(api.flags());
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let mut e = env_with(&flags).await;
    let cap = mount_cap("ext4", Mode::SingleNodeWriter);
    let kept = e.create("counted-kept", cap.clone(), 1).await.volume_id;
    e.create("counted-orphan-1", cap.clone(), 1).await;
    e.create("counted-orphan-2", cap.clone(), 1).await;
    api.objects().pvs = vec![(DRIVER.into(), kept)];
    let page = wait_for_metrics(
        port,
        &[
            ("cinder_csi_orphans{kind=\"volume\"}", 2.0),
            ("cinder_csi_orphans{kind=\"snapshot\"}", 0.0),
        ],
    )
    .await
    .unwrap();
    assert!(
        page.contains("cinder_csi_orphan_scans_total{result=\"ok\"}"),
        "{page}"
    );
}
