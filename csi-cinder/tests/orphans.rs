//! The orphan report through the binary: `cinder-csi-plugin orphans`
//! against the emulator and a stand-in apiserver that lists the cluster's
//! PersistentVolumes and VolumeSnapshotContents (a page at a time) and
//! answers with the cluster's identity, and the controller's
//! `cinder_csi_orphans{kind}`. What the cluster made and names no more is
//! reported (named, with its age and why) and deleted only when asked:
//! never one attached, never one a PV names again by then, never one of
//! another cluster (its identity), made by hand or by an older version
//! (until adopted by name), and nothing at all when the view of the
//! cluster looks wrong. Tests needing root return early (and say so)
//! without it.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::collections::BTreeMap;
use std::time::Duration;

use csi_sanity::harness::kube::{CLUSTER_UID, StandInApiserver};
use csi_sanity::harness::{free_port, wait_for_metrics};
use openstack_client::cinder::CreateVolume;
use proto::csi::v1::volume_capability::access_mode::Mode;
use serde_json::{Value, json};

mod common;
use common::*;

const DRIVER: &str = "cinder.csi.openstack.org";
const CLUSTER_KEY: &str = "cinder.csi.openstack.org/cluster";
const IDENTITY_KEY: &str = "cinder.csi.openstack.org/cluster-uid";
/// How old the test makes what it made look.
const LONG_AGO: Duration = Duration::from_secs(2 * 3600);

/// `cinder-csi-plugin orphans ...`: its exit, its standard output and
/// error (the stand-in apiserver runs on this test's runtime: the command
/// is awaited, not waited for). The deployment's driver name unless
/// `extra` gives one.
async fn orphans_run(e: &Env, api: &StandInApiserver, extra: &[&str]) -> (bool, String, String) {
    let out = tokio::process::Command::new(BIN)
        .arg("orphans")
        .arg(format!("--cloud-config={}", e.h.cloud_conf.display()))
        .arg("--cluster=sanity")
        .args(
            (!extra.iter().any(|a| a.starts_with("--drivername")))
                .then(|| format!("--drivername={DRIVER}")),
        )
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

/// The same, as JSON, and it must succeed.
async fn orphans(e: &Env, api: &StandInApiserver, extra: &[&str]) -> Value {
    let mut extra = extra.to_vec();
    extra.push("--output=json");
    let (ok, out, err) = orphans_run(e, api, &extra).await;
    assert!(ok, "{err}");
    serde_json::from_str(&out).unwrap()
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

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_str().unwrap().to_string())
        .collect()
}

/// A controller that knows the stand-in's cluster identity.
async fn env_of(api: &StandInApiserver) -> Env {
    let flags = api.flags();
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    env_with(&flags).await
}

/// A volume made by hand with these metadata.
async fn by_hand(e: &Env, name: &str, metadata: &[(&str, &str)]) -> String {
    e.cinder
        .create_volume(&CreateVolume {
            name: name.into(),
            size_gib: 1,
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

async fn stays(e: &Env, id: &str) -> bool {
    e.cinder
        .get_volume(id)
        .await
        .is_ok_and(|v| v.status.as_str() != "deleting")
}

#[tokio::test]
async fn what_the_cluster_names_no_more_is_reported_and_deleted_only_when_asked() {
    if !root() {
        return;
    }
    let api = StandInApiserver::start().await.unwrap();
    let mut e = env_of(&api).await;
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
    // the controller wrote the identity the apiserver answered with
    let metadata = e.cinder.get_volume(&gone).await.unwrap().metadata;
    assert_eq!(
        metadata.get(IDENTITY_KEY).map(String::as_str),
        Some(CLUSTER_UID),
        "{metadata:?}"
    );
    // made by hand, not by the driver: no cluster tag, never reported
    let untagged = by_hand(&e, "by-hand", &[]).await;
    // another cluster's in the same project under the same cluster id,
    // and one an older version made (the id, no identity)
    let theirs = by_hand(
        &e,
        "pvc-of-another-cluster",
        &[
            (CLUSTER_KEY, "sanity"),
            (IDENTITY_KEY, "uid-of-another-cluster"),
        ],
    )
    .await;
    let old_version = by_hand(&e, "pvc-of-an-older-version", &[(CLUSTER_KEY, "sanity")]).await;

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
    let young = orphans(&e, &api, &[]).await;
    assert_eq!(young["report"]["orphans"], json!([]));
    assert_eq!(young["report"]["young"].as_array().unwrap().len(), 5);

    let control = e.h.emulator.control();
    for id in [
        &named,
        &other_driver,
        &gone,
        &late,
        &attached,
        &kept_snap,
        &lost_snap,
        &theirs,
        &old_version,
    ] {
        assert!(control.backdate(id, LONG_AGO), "{id}");
    }
    let report = orphans(&e, &api, &[]).await;
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
    assert_eq!(report["report"]["tagged"], 9, "the untagged is not tagged");
    let mut unproven = vec![theirs.clone(), old_version.clone()];
    unproven.sort();
    assert_eq!(ids(&report["report"]["unproven"]), unproven);
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

    // the text says why each is an orphan, and why the others are not ours
    let (ok, text, _) = orphans_run(&e, &api, &[]).await;
    assert!(ok);
    println!("{text}");
    assert!(
        text.contains(&format!("orphan volume   {gone}"))
            && text.contains("why: carries this cluster's id and identity, no PersistentVolume of cinder.csi.openstack.org names it"),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.contains(theirs.as_str()) && l.contains("another cluster's identity")),
        "{text}"
    );

    // a grace shorter than a slow provisioner's is refused for deletion
    let (ok, _, err) = orphans_run(&e, &api, &["--delete", "--older-than=0s"]).await;
    assert!(!ok && err.contains("at least 15m"), "{err}");

    // deletion, asked for: a PV that appears between the command's report
    // and its deletions (its second listing) keeps its volume
    {
        let mut o = api.objects();
        o.late_from = o.pv_lists + 2;
    }
    let done = orphans(&e, &api, &["--delete"]).await;
    println!("{done:#}");
    let deleted = strings(&done["deleted"]);
    let kept = strings(&done["kept"]);
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
    for id in [&named, &late, &attached, &untagged, &theirs, &old_version] {
        assert!(stays(&e, id).await, "{id} must stay");
    }
    assert!(e.cinder.get_snapshot(&kept_snap).await.is_ok());
    for id in [&gone, &other_driver] {
        assert!(!stays(&e, id).await, "{id} must go");
    }

    // an older version's volume, adopted by name, is this cluster's
    let adopted = orphans(&e, &api, &[&format!("--adopt={old_version},{theirs}")]).await;
    println!("{adopted:#}");
    assert!(
        strings(&adopted["adopted"])
            .iter()
            .any(|a| a.contains(old_version.as_str())),
        "{adopted:#}"
    );
    assert!(
        strings(&adopted["kept"])
            .iter()
            .any(|k| k.contains(theirs.as_str()) && k.contains("already carries an identity")),
        "another cluster's is never adopted: {adopted:#}"
    );
    assert!(ids(&adopted["report"]["orphans"]).contains(&old_version));
    assert_eq!(
        e.cinder
            .get_volume(&theirs)
            .await
            .unwrap()
            .metadata
            .get(IDENTITY_KEY)
            .map(String::as_str),
        Some("uid-of-another-cluster")
    );
}

#[tokio::test]
async fn nothing_is_deleted_on_a_view_of_the_cluster_that_looks_wrong() {
    if !root() {
        return;
    }
    let api = StandInApiserver::start().await.unwrap();
    let mut e = env_of(&api).await;
    let cap = mount_cap("ext4", Mode::SingleNodeWriter);
    let mut made = Vec::new();
    for i in 0..3 {
        made.push(
            e.create(&format!("wrong-view-{i}"), cap.clone(), 1)
                .await
                .volume_id,
        );
    }
    let control = e.h.emulator.control();
    for id in &made {
        control.backdate(id, LONG_AGO);
    }
    api.objects().pvs = vec![(DRIVER.into(), made[0].clone())];

    // the wrong driver name: no PV of it at all
    let (ok, text, err) =
        orphans_run(&e, &api, &["--delete", "--drivername=cinder.example.com"]).await;
    println!("{text}{err}");
    assert!(!ok, "a refused deletion fails the command");
    assert!(err.contains("no PersistentVolume of this driver"), "{err}");
    assert!(text.contains("refused:"), "{text}");
    // the wrong apiserver: another cluster answers
    let elsewhere = StandInApiserver::start().await.unwrap();
    {
        let mut o = elsewhere.objects();
        o.cluster_uid = "uid-of-the-wrong-cluster".into();
        o.pvs = vec![(DRIVER.into(), "a-volume-of-that-cluster".into())];
    }
    let (ok, text, err) = orphans_run(&e, &elsewhere, &["--delete"]).await;
    println!("{text}{err}");
    assert!(
        !ok && err.contains("not the cluster that made them"),
        "{err}"
    );
    for id in &made {
        assert!(stays(&e, id).await, "{id} must stay");
    }
    // named by the operator, one is deleted despite the doubt
    let (ok, text, err) = orphans_run(
        &e,
        &api,
        &[
            "--delete",
            "--drivername=cinder.example.com",
            &format!("--force-delete={}", made[1]),
        ],
    )
    .await;
    println!("{text}{err}");
    assert!(ok, "{err}");
    assert!(
        text.contains(&format!("deleted volume {}", made[1])),
        "{text}"
    );
    assert!(!stays(&e, &made[1]).await);
    assert!(stays(&e, &made[2]).await, "only the one named");
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
