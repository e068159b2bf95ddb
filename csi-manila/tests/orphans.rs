//! The orphan report through the binary: `manila-csi-plugin orphans`
//! against the emulator's Manila and a stand-in apiserver listing the
//! cluster's PVs and snapshot contents and answering with the cluster's
//! identity, and the controller's `manila_csi_orphans{kind}`. The CephFS
//! instance reports its own protocol's shares of the cluster and the
//! snapshots it made of them that nothing names, never the NFS
//! instance's, one made by hand, another cluster's, a static PV's (by
//! `shareID` or `shareName`) or a backup's snapshot, and deletes only
//! when asked, and never on a view of the cluster that looks wrong. An
//! NFS share whose access rule grants a node of the cluster alone is in
//! use by that node.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::collections::BTreeMap;
use std::time::Duration;

use csi_sanity::harness::kube::{CLUSTER_UID, StandInApiserver};
use csi_sanity::harness::{free_port, wait_for_metrics};
use openstack_client::manila::CreateShare;
use openstack_emulator::{FaultAction, FaultRule};
use proto::csi::v1 as csi;

mod common;
use common::*;

const DRIVER: &str = "cephfs.manila.csi.openstack.org";
const CLUSTER_KEY: &str = "manila.csi.openstack.org/cluster";
const IDENTITY_KEY: &str = "manila.csi.openstack.org/cluster-uid";
const LONG_AGO: Duration = Duration::from_secs(2 * 3600);

/// `manila-csi-plugin orphans ...` for CephFS shares: its exit, standard
/// output and error.
async fn orphans_run(api: &StandInApiserver, e: &Env, extra: &[&str]) -> (bool, String, String) {
    orphans_of("CEPHFS", api, e, extra).await
}

/// The same for shares of `protocol`.
async fn orphans_of(
    protocol: &str,
    api: &StandInApiserver,
    e: &Env,
    extra: &[&str],
) -> (bool, String, String) {
    let out = tokio::process::Command::new(BIN)
        .arg("orphans")
        .arg(format!("--cloud-config={}", e.h.cloud_conf.display()))
        .arg("--cluster-id=sanity")
        .arg(format!("--share-protocol-selector={protocol}"))
        .args(api.flags())
        .args(extra)
        .output()
        .await
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The same with the deployment's driver name; it must succeed.
async fn orphans(e: &Env, api: &StandInApiserver, extra: &[&str]) -> String {
    let mut extra = extra.to_vec();
    let driver = format!("--drivername={DRIVER}");
    extra.push(&driver);
    let (ok, out, err) = orphans_run(api, e, &extra).await;
    assert!(ok, "{err}");
    out
}

async fn share_by_hand(e: &Env, protocol: &str, name: &str, metadata: &[(&str, &str)]) -> String {
    e.manila
        .create_share(&CreateShare {
            protocol: protocol.into(),
            size_gib: 1,
            name: name.into(),
            metadata: metadata
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>(),
            ..Default::default()
        })
        .await
        .unwrap()
        .id
}

async fn share_stays(e: &Env, id: &str) -> bool {
    e.manila
        .get_share(id)
        .await
        .is_ok_and(|s| !s.status.to_string().starts_with("deleting"))
}

async fn snapshot_stays(e: &Env, id: &str) -> bool {
    e.manila
        .get_snapshot(id)
        .await
        .is_ok_and(|s| !s.status.to_string().starts_with("deleting"))
}

/// A CephFS controller that knows the stand-in's cluster identity.
async fn env_of(api: &StandInApiserver, extra: &[String]) -> Env {
    let mut flags = api.flags();
    flags.extend(extra.iter().cloned());
    env_with("CEPHFS", |o| o.extra_args.extend(flags)).await
}

fn line_with<'a>(text: &'a str, start: &str, id: &str) -> Option<&'a str> {
    text.lines()
        .find(|l| l.starts_with(start) && l.contains(id))
}

#[tokio::test]
async fn a_cephfs_instance_reports_and_deletes_only_its_own_orphans() {
    let api = StandInApiserver::start().await.unwrap();
    let mut e = env_of(&api, &[]).await;
    let named = e.create("orphan-named", 1, &[]).await.volume_id;
    let gone = e.create("orphan-gone", 1, &[]).await.volume_id;
    let static_by_id = e.create("orphan-static-by-id", 1, &[]).await.volume_id;
    let static_by_name_id = e.create("orphan-static-by-name", 1, &[]).await.volume_id;
    let static_by_name = e.manila.get_share(&static_by_name_id).await.unwrap().name;
    let snapshot = e.snapshot(&named, "orphan-snapshot").await.snapshot_id;
    assert_eq!(
        e.manila
            .get_share(&gone)
            .await
            .unwrap()
            .metadata
            .get(IDENTITY_KEY)
            .map(String::as_str),
        Some(CLUSTER_UID),
        "the controller wrote the identity the apiserver answered with"
    );
    // a backup job's snapshot of one of the cluster's shares
    let backup = e
        .manila
        .create_snapshot(&named, "nightly-backup", Some("made by the backup job"))
        .await
        .unwrap()
        .id;
    // the same cluster id's NFS share (the NFS instance's), one by hand,
    // another cluster's under the same id, and an older version's
    let tag = [(CLUSTER_KEY, "sanity"), (IDENTITY_KEY, CLUSTER_UID)];
    let nfs = share_by_hand(&e, "NFS", "nfs-of-the-cluster", &tag).await;
    let by_hand = share_by_hand(&e, "CEPHFS", "by-hand", &[]).await;
    let theirs = share_by_hand(
        &e,
        "CEPHFS",
        "pvc-of-another-cluster",
        &[(CLUSTER_KEY, "sanity"), (IDENTITY_KEY, "uid-of-another")],
    )
    .await;
    let old_version = share_by_hand(
        &e,
        "CEPHFS",
        "pvc-of-an-older-version",
        &[(CLUSTER_KEY, "sanity")],
    )
    .await;
    let control = e.h.emulator.control();
    for id in [
        &named,
        &gone,
        &static_by_id,
        &static_by_name_id,
        &snapshot,
        &backup,
        &nfs,
        &by_hand,
        &theirs,
        &old_version,
    ] {
        assert!(control.backdate(id, LONG_AGO), "{id}");
    }
    {
        let mut o = api.objects();
        o.pvs = vec![(DRIVER.into(), named.clone())];
        // upstream's static PVs: the share named by id, or by name
        o.static_pvs = vec![
            (
                DRIVER.into(),
                BTreeMap::from([("shareID".to_string(), static_by_id.clone())]),
            ),
            (
                DRIVER.into(),
                BTreeMap::from([("shareName".to_string(), static_by_name.clone())]),
            ),
        ];
    }

    // a share deleted between the list and the read of its rules (Manila
    // answers 404 for a share being deleted): the report goes on
    control.add_fault(
        FaultRule::new(
            Some("GET"),
            "/share-access-rules",
            FaultAction::Status {
                status: 404,
                message: Some("Share could not be found.".into()),
                retry_after: None,
                hint: Default::default(),
            },
        )
        .times(1),
    );
    let text = orphans(&e, &api, &[]).await;
    println!("{text}");
    assert_eq!(
        control.faults().iter().map(|f| f.served).sum::<u64>(),
        1,
        "the 404 was not served"
    );
    assert!(
        text.contains("3 PV(s); 8 tagged, 3 in use, 0 used by its nodes, 2 orphan(s) older than 1h00m, 0 younger not counted, 3 not proven"),
        "{text}"
    );
    for id in [&gone, &snapshot] {
        assert!(line_with(&text, "orphan", id).is_some(), "{id}: {text}");
    }
    for (id, why) in [
        (&backup, "a snapshot the driver did not make"),
        (&theirs, "another cluster's identity"),
        (&old_version, "no cluster identity"),
    ] {
        assert!(
            line_with(&text, "not proven", id).is_some_and(|l| l.contains(why)),
            "{id}: {text}"
        );
    }
    for id in [&named, &static_by_id, &static_by_name_id, &nfs, &by_hand] {
        assert!(!text.contains(id.as_str()), "{id}: {text}");
    }
    assert!(
        !text.lines().any(|l| l.starts_with("deleted")),
        "nothing deleted unasked: {text}"
    );

    let text = orphans(&e, &api, &["--delete"]).await;
    println!("{text}");
    for id in [&gone, &snapshot] {
        assert!(line_with(&text, "deleted", id).is_some(), "{id}: {text}");
    }
    for id in [
        &named,
        &static_by_id,
        &static_by_name_id,
        &nfs,
        &by_hand,
        &theirs,
        &old_version,
    ] {
        assert!(share_stays(&e, id).await, "{id} must stay");
    }
    assert!(
        snapshot_stays(&e, &backup).await,
        "the backup's snapshot must stay"
    );
    assert!(!share_stays(&e, &gone).await);

    // an older version's share, adopted by name, is this cluster's
    let text = orphans(&e, &api, &[&format!("--adopt={old_version}")]).await;
    println!("{text}");
    assert!(
        line_with(&text, "adopted", &old_version).is_some(),
        "{text}"
    );
    assert!(line_with(&text, "orphan", &old_version).is_some(), "{text}");
}

#[tokio::test]
async fn a_wrong_driver_name_apiserver_or_snapshot_api_deletes_nothing() {
    let api = StandInApiserver::start().await.unwrap();
    let mut e = env_of(&api, &[]).await;
    let kept = e.create("wrong-view-kept", 1, &[]).await.volume_id;
    let gone = e.create("wrong-view-gone", 1, &[]).await.volume_id;
    let snapshot = e.snapshot(&kept, "wrong-view-snapshot").await.snapshot_id;
    let control = e.h.emulator.control();
    for id in [&kept, &gone, &snapshot] {
        control.backdate(id, LONG_AGO);
    }
    api.objects().pvs = vec![(DRIVER.into(), kept.clone())];

    // upstream's default driver name, which no shipped deployment uses
    let (ok, text, err) = orphans_run(
        &api,
        &e,
        &["--delete", "--drivername=manila.csi.openstack.org"],
    )
    .await;
    println!("{text}{err}");
    assert!(
        !ok && err.contains("no PersistentVolume of this driver"),
        "{err}"
    );
    // no driver name at all
    let (ok, _, err) = orphans_run(&api, &e, &[]).await;
    assert!(!ok && err.contains("--drivername"), "{err}");
    // another cluster's apiserver
    let elsewhere = StandInApiserver::start().await.unwrap();
    {
        let mut o = elsewhere.objects();
        o.cluster_uid = "uid-of-the-wrong-cluster".into();
        o.pvs = vec![(DRIVER.into(), "a-share-of-that-cluster".into())];
    }
    let (ok, text, err) = orphans_run(
        &elsewhere,
        &e,
        &["--delete", &format!("--drivername={DRIVER}")],
    )
    .await;
    println!("{text}{err}");
    assert!(
        !ok && err.contains("not the cluster that made them"),
        "{err}"
    );
    // a snapshot API answering 404: no snapshot can be told unnamed
    api.objects().no_snapshot_api = true;
    let text = orphans(&e, &api, &["--delete"]).await;
    println!("{text}");
    assert!(
        line_with(&text, "not proven", &snapshot).is_some_and(|l| l.contains("no snapshot API")),
        "{text}"
    );
    assert!(line_with(&text, "deleted", &gone).is_some(), "{text}");
    assert!(snapshot_stays(&e, &snapshot).await);
    assert!(share_stays(&e, &kept).await);
}

#[tokio::test]
async fn an_nfs_share_granted_to_a_node_of_the_cluster_is_in_use() {
    let api = StandInApiserver::start().await.unwrap();
    api.objects().nodes = vec![
        (
            "node-a".into(),
            vec!["10.0.0.5".into(), "2001:db8::5".into()],
        ),
        ("node-b".into(), vec!["10.0.0.6".into()]),
        ("node-c".into(), vec!["10.0.0.7".into()]),
    ];
    let mut e = env_with("NFS", |o| o.extra_args.extend(api.flags())).await;
    let named = e
        .create("nfs-named", 1, &[("nfs-shareClient", "10.0.0.0/16")])
        .await
        .volume_id;
    // granted to node-a alone (as an operator grants a node, or a class
    // per node), to node-b as a network of one, and to the whole network
    let to_a = e
        .create("nfs-to-node-a", 1, &[("nfs-shareClient", "10.0.0.5")])
        .await
        .volume_id;
    let to_b = e
        .create("nfs-to-node-b", 1, &[("nfs-shareClient", "10.0.0.6/32")])
        .await
        .volume_id;
    let to_network = e
        .create(
            "nfs-to-the-network",
            1,
            &[("nfs-shareClient", "10.0.0.0/16")],
        )
        .await
        .volume_id;
    // a network written with a node's address: still the whole network
    let to_network_by_host = e
        .create(
            "nfs-to-node-c-s-network",
            1,
            &[("nfs-shareClient", "10.0.0.7/24")],
        )
        .await
        .volume_id;
    let to_elsewhere = e
        .create(
            "nfs-to-another-host",
            1,
            &[("nfs-shareClient", "192.0.2.9")],
        )
        .await
        .volume_id;
    let control = e.h.emulator.control();
    for id in [
        &named,
        &to_a,
        &to_b,
        &to_network,
        &to_network_by_host,
        &to_elsewhere,
    ] {
        assert!(control.backdate(id, LONG_AGO), "{id}");
    }
    api.objects().pvs = vec![("nfs.manila.csi.openstack.org".into(), named.clone())];
    let (ok, text, err) = orphans_of(
        "NFS",
        &api,
        &e,
        &["--delete", "--drivername=nfs.manila.csi.openstack.org"],
    )
    .await;
    println!("{text}{err}");
    assert!(ok, "{err}");
    assert!(
        text.contains("1 in use, 2 used by its nodes, 3 orphan(s)"),
        "{text}"
    );
    assert!(
        line_with(&text, "in use", &to_a)
            .is_some_and(|l| l.contains("node node-a's address 10.0.0.5")),
        "{text}"
    );
    assert!(
        line_with(&text, "in use", &to_b).is_some_and(|l| l.contains("node node-b's")),
        "{text}"
    );
    for id in [&to_network, &to_network_by_host, &to_elsewhere] {
        assert!(line_with(&text, "deleted", id).is_some(), "{text}");
    }
    for id in [&named, &to_a, &to_b] {
        assert!(share_stays(&e, id).await, "{id}");
    }
    assert!(
        api.objects().node_lists >= 2,
        "the nodes are read again before deleting"
    );
}

/// A snapshot that a volume backed by it reads is named by no PV or
/// content (the PV names `snapshot-backed:<snapshot>:<rule>`), and
/// neither is its share once their own objects are gone: the rule on the
/// share tells, and both stay.
#[tokio::test]
async fn a_snapshot_a_backed_volume_reads_and_its_share_are_in_use() {
    let api = StandInApiserver::start().await.unwrap();
    let mut e = env_of(&api, &[]).await;
    let share = e.create("orphan-read-source", 1, &[]).await.volume_id;
    let snapshot = e.snapshot(&share, "orphan-read-snapshot").await.snapshot_id;
    let mut req = e.create_req("pvc-reader", 1, &[("backingSnapshot", "true")]);
    req.volume_capabilities = vec![mount_cap(
        proto::csi::v1::volume_capability::access_mode::Mode::MultiNodeReaderOnly,
        &[],
    )];
    req.volume_content_source = Some(csi::VolumeContentSource {
        r#type: Some(csi::volume_content_source::Type::Snapshot(
            csi::volume_content_source::SnapshotSource {
                snapshot_id: snapshot.clone(),
            },
        )),
    });
    let reader =
        e.c.create_volume(req)
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap()
            .volume_id;
    let control = e.h.emulator.control();
    for id in [&share, &snapshot] {
        assert!(control.backdate(id, LONG_AGO), "{id}");
    }
    // the reader's PV alone: the share's and the snapshot's objects gone
    api.objects().pvs = vec![(DRIVER.into(), reader.clone())];
    let text = orphans(&e, &api, &["--delete"]).await;
    println!("{text}");
    for id in [&share, &snapshot] {
        assert!(
            line_with(&text, "in use", id).is_some_and(|l| l.contains("pvc-reader")),
            "{id}: {text}"
        );
        assert!(line_with(&text, "deleted", id).is_none(), "{id}: {text}");
    }
    assert!(share_stays(&e, &share).await);
    assert!(snapshot_stays(&e, &snapshot).await);

    // once the reader is gone, they are orphans like any other: the
    // snapshot first, the share once Manila let the snapshot go
    e.delete(&reader).await.unwrap();
    let text = orphans(&e, &api, &["--delete"]).await;
    println!("{text}");
    assert!(line_with(&text, "deleted", &snapshot).is_some(), "{text}");
    let until = std::time::Instant::now() + Duration::from_secs(30);
    while snapshot_stays(&e, &snapshot).await || e.manila.get_snapshot(&snapshot).await.is_ok() {
        assert!(std::time::Instant::now() < until, "the snapshot never went");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let text = orphans(&e, &api, &["--delete"]).await;
    println!("{text}");
    assert!(line_with(&text, "deleted", &share).is_some(), "{text}");
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
