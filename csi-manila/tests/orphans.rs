//! The orphan report through the binary: `manila-csi-plugin orphans`
//! against the emulator's Manila and a stand-in apiserver listing the
//! cluster's PVs and snapshot contents, and the controller's
//! `manila_csi_orphans{kind}`. The CephFS instance reports its own
//! protocol's shares of the cluster and their snapshots that nothing
//! names, never the NFS instance's nor one made by hand, and deletes only
//! when asked.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::collections::BTreeMap;

use csi_sanity::harness::kube::StandInApiserver;
use csi_sanity::harness::{free_port, wait_for_metrics};
use openstack_client::manila::CreateShare;
use proto::csi::v1 as csi;

mod common;
use common::*;

const DRIVER: &str = "cephfs.manila.csi.openstack.org";

async fn orphans(e: &Env, api: &StandInApiserver, extra: &[&str]) -> String {
    let out = tokio::process::Command::new(BIN)
        .arg("orphans")
        .arg(format!("--cloud-config={}", e.h.cloud_conf.display()))
        .arg("--cluster-id=sanity")
        .arg(format!("--drivername={DRIVER}"))
        .arg("--share-protocol-selector=CEPHFS")
        .args(api.flags())
        .args(extra)
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[tokio::test]
async fn a_cephfs_instance_reports_and_deletes_only_its_own_orphans() {
    let mut e = env("CEPHFS").await;
    let named = e.create("orphan-named", 1, &[]).await.volume_id;
    let gone = e.create("orphan-gone", 1, &[]).await.volume_id;
    let snapshot =
        e.c.create_snapshot(csi::CreateSnapshotRequest {
            source_volume_id: named.clone(),
            name: "orphan-snapshot".into(),
            secrets: e.secrets.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap()
        .snapshot_id;
    // the same cluster's NFS share (the NFS instance's), and one by hand
    let tag = BTreeMap::from([(
        "manila.csi.openstack.org/cluster".to_string(),
        "sanity".to_string(),
    )]);
    let nfs = e
        .manila
        .create_share(&CreateShare {
            protocol: "NFS".into(),
            size_gib: 1,
            name: "nfs-of-the-cluster".into(),
            metadata: tag,
            ..Default::default()
        })
        .await
        .unwrap()
        .id;
    let by_hand = e
        .manila
        .create_share(&CreateShare {
            protocol: "CEPHFS".into(),
            size_gib: 1,
            name: "by-hand".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .id;
    let api = StandInApiserver::start().await.unwrap();
    api.objects().pvs = vec![(DRIVER.into(), named.clone())];

    let text = orphans(&e, &api, &["--older-than=0s"]).await;
    println!("{text}");
    assert!(text.contains("3 tagged, 2 orphan(s)"), "{text}");
    for id in [&gone, &snapshot] {
        assert!(
            text.lines()
                .any(|l| l.starts_with("orphan") && l.contains(id.as_str())),
            "{id}: {text}"
        );
    }
    for id in [&named, &nfs, &by_hand] {
        assert!(!text.contains(id.as_str()), "{id}: {text}");
    }
    assert!(!text.contains("deleted"), "nothing deleted unasked: {text}");

    let text = orphans(&e, &api, &["--older-than=0s", "--delete"]).await;
    println!("{text}");
    for id in [&gone, &snapshot] {
        assert!(
            text.lines()
                .any(|l| l.starts_with("deleted") && l.contains(id.as_str())),
            "{id}: {text}"
        );
    }
    for id in [&named, &nfs, &by_hand] {
        let s = e.manila.get_share(id).await.unwrap();
        assert!(
            !s.status.to_string().starts_with("deleting"),
            "{id} must stay"
        );
    }
}

#[tokio::test]
async fn the_controller_counts_the_orphans_in_its_metrics() {
    let api = StandInApiserver::start().await.unwrap();
    let port = free_port().unwrap();
    let mut flags = vec![
        format!("--http-endpoint=127.0.0.1:{port}"),
        "--orphan-report-interval=2s".into(),
        "--orphan-grace=0s".into(),
    ];
    flags.extend(api.flags());
    let mut e = env_with("CEPHFS", |o| o.extra_args.extend(flags)).await;
    let kept = e.create("counted-kept", 1, &[]).await.volume_id;
    e.create("counted-orphan", 1, &[]).await;
    api.objects().pvs = vec![(DRIVER.into(), kept)];
    wait_for_metrics(
        port,
        &[
            ("manila_csi_orphans{kind=\"share\"}", 1.0),
            ("manila_csi_orphans{kind=\"snapshot\"}", 0.0),
        ],
    )
    .await
    .unwrap();
}
