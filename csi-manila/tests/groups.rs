//! Volume group snapshots through the plugin's socket against the
//! emulator's Manila: shares placed in a share group by the class's
//! `groupID`, the group snapshotted whole, each member restored on its own
//! (one clone per member, into one restore group), what no restore took
//! deleted with the group snapshot, each restore group once it is empty;
//! every bad request refused with its code and nothing left.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use openstack_client::manila::{CreateShareGroup, ShareGroupStatus};
use openstack_emulator::{FaultAction, FaultRule};
use proto::csi::v1 as csi;
use proto::csi::v1::group_controller_client::GroupControllerClient;
use tonic::Code;
use tonic::transport::Channel;

mod common;
use common::*;

async fn groups_client(e: &Env) -> GroupControllerClient<Channel> {
    GroupControllerClient::new(plugin_runtime::connect_unix(&e.h.socket).await.unwrap())
}

/// A share group of the `cephfs` type, made as an operator would.
async fn share_group(e: &Env, name: &str) -> String {
    let types = e.manila.list_share_types().await.unwrap();
    let cephfs = types.iter().find(|t| t.name == "cephfs").unwrap();
    let g = e
        .manila
        .create_share_group(&CreateShareGroup {
            name: name.into(),
            share_types: vec![cephfs.id.clone()],
            ..Default::default()
        })
        .await
        .unwrap();
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let now = e.manila.get_share_group(&g.id).await.unwrap();
        if now.status == ShareGroupStatus::Available {
            return g.id;
        }
        assert!(
            Instant::now() < until,
            "share group {} stayed {}",
            g.id,
            now.status
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn group_req(e: &Env, name: &str, ids: &[&str]) -> csi::CreateVolumeGroupSnapshotRequest {
    csi::CreateVolumeGroupSnapshotRequest {
        name: name.into(),
        source_volume_ids: ids.iter().map(|s| s.to_string()).collect(),
        secrets: e.secrets.clone(),
        parameters: Default::default(),
    }
}

fn restore_req(e: &Env, name: &str, snapshot: &str) -> csi::CreateVolumeRequest {
    let mut r = e.create_req(name, 1, &[("type", "cephfs")]);
    r.volume_content_source = Some(csi::VolumeContentSource {
        r#type: Some(csi::volume_content_source::Type::Snapshot(
            csi::volume_content_source::SnapshotSource {
                snapshot_id: snapshot.into(),
            },
        )),
    });
    r
}

fn posts(e: &Env, path: &str) -> usize {
    e.share_calls()
        .iter()
        .filter(|c| c.starts_with("POST") && c.ends_with(path))
        .count()
}

/// Every share group of the project: id → (name, its shares' names).
async fn groups_and_shares(e: &Env) -> BTreeMap<String, BTreeSet<String>> {
    let shares = e.manila.list_shares(&Default::default()).await.unwrap();
    let mut out = BTreeMap::<String, BTreeSet<String>>::new();
    for s in shares {
        if let Some(g) = s.share_group_id {
            out.entry(g).or_default().insert(s.name);
        }
    }
    out
}

#[tokio::test]
async fn a_share_group_is_snapshotted_whole_and_each_member_restored_once() {
    let mut e = env("cephfs").await;
    let mut g = groups_client(&e).await;
    let group = share_group(&e, "app-data").await;
    let in_group = [("type", "cephfs"), ("groupID", group.as_str())];
    let data = e.create("data", 1, &in_group).await;
    let wal = e.create("wal", 1, &in_group).await;
    let index = e.create("index", 2, &in_group).await;
    let lone = e.create("lone", 1, &[("type", "cephfs")]).await;
    for v in [&data, &wal, &index] {
        let s = e.manila.get_share(&v.volume_id).await.unwrap();
        assert_eq!(
            s.share_group_id.as_deref(),
            Some(group.as_str()),
            "groupID not honoured"
        );
    }
    let all = [
        data.volume_id.as_str(),
        wal.volume_id.as_str(),
        index.volume_id.as_str(),
    ];

    // refused before anything is made
    for (ids, code, says) in [
        (vec![all[0], all[1]], Code::FailedPrecondition, "also holds"),
        (
            vec![all[0], lone.volume_id.as_str()],
            Code::FailedPrecondition,
            "no share group",
        ),
        (
            vec!["0b5c3e62-8a41-4d6f-9c1e-2f7a6b3d9e10"],
            Code::NotFound,
            "does not exist",
        ),
    ] {
        let err = g
            .create_volume_group_snapshot(group_req(&e, "refused", &ids))
            .await
            .unwrap_err();
        assert_eq!(err.code(), code, "{ids:?}: {err:?}");
        assert!(err.message().contains(says), "{ids:?}: {}", err.message());
    }
    let mut odd = group_req(&e, "refused", &all);
    odd.parameters.insert("consistency".into(), "crash".into());
    let err = g.create_volume_group_snapshot(odd).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert_eq!(
        posts(&e, "/share-group-snapshots"),
        0,
        "a refusal made a group snapshot"
    );

    let before = e.share_calls().len();
    let started = Instant::now();
    let gs = g
        .create_volume_group_snapshot(group_req(&e, "nightly", &all))
        .await
        .unwrap()
        .into_inner()
        .group_snapshot
        .unwrap();
    println!(
        "group snapshot of 3 shares: {:?}, {} Manila calls",
        started.elapsed(),
        e.share_calls().len() - before
    );
    assert!(gs.ready_to_use);
    assert_eq!(gs.snapshots.len(), 3);
    let of: BTreeSet<&str> = gs
        .snapshots
        .iter()
        .map(|s| s.source_volume_id.as_str())
        .collect();
    assert_eq!(of, all.iter().copied().collect());
    assert!(
        gs.snapshots
            .iter()
            .all(|s| s.group_snapshot_id == gs.group_snapshot_id)
    );
    let member = |v: &csi::Volume| {
        gs.snapshots
            .iter()
            .find(|s| s.source_volume_id == v.volume_id)
            .unwrap()
            .snapshot_id
            .clone()
    };

    // the same request answers the same; the name for other volumes is taken
    let again = g
        .create_volume_group_snapshot(group_req(&e, "nightly", &all))
        .await
        .unwrap()
        .into_inner()
        .group_snapshot
        .unwrap();
    assert_eq!(again.group_snapshot_id, gs.group_snapshot_id);
    let err = g
        .create_volume_group_snapshot(group_req(&e, "nightly", &all[..2]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists, "{err:?}");
    assert_eq!(posts(&e, "/share-group-snapshots"), 1);

    let got = g
        .get_volume_group_snapshot(csi::GetVolumeGroupSnapshotRequest {
            group_snapshot_id: gs.group_snapshot_id.clone(),
            snapshot_ids: gs.snapshots.iter().map(|s| s.snapshot_id.clone()).collect(),
            secrets: e.secrets.clone(),
        })
        .await
        .unwrap()
        .into_inner()
        .group_snapshot
        .unwrap();
    assert_eq!(got, gs);
    let err = g
        .get_volume_group_snapshot(csi::GetVolumeGroupSnapshotRequest {
            group_snapshot_id: gs.group_snapshot_id.clone(),
            snapshot_ids: vec![member(&data)],
            secrets: e.secrets.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    let one =
        e.c.get_snapshot(csi::GetSnapshotRequest {
            snapshot_id: member(&wal),
            secrets: e.secrets.clone(),
        })
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap();
    assert_eq!(one.source_volume_id, wal.volume_id);

    // a member goes only with its group snapshot; its share stays while it has one
    let err =
        e.c.delete_snapshot(csi::DeleteSnapshotRequest {
            snapshot_id: member(&data),
            secrets: e.secrets.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    let err = e.delete(&data.volume_id).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains("dependent"), "{}", err.message());
    assert!(e.manila.get_share(&data.volume_id).await.is_ok());

    // each member restored on its own: one restore group for both
    let before = e.share_calls().len();
    let started = Instant::now();
    let r_data =
        e.c.create_volume(restore_req(&e, "restored-data", &member(&data)))
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
    println!(
        "restore of a first member: {:?}, {} Manila calls",
        started.elapsed(),
        e.share_calls().len() - before
    );
    // a member larger than the claim's limit is refused before anything is made
    let shares_before = e.share_count().await;
    let mut too_small = restore_req(&e, "restored-index", &member(&index));
    too_small.capacity_range.as_mut().unwrap().limit_bytes = GIB;
    let err = e.c.create_volume(too_small).await.unwrap_err();
    assert_eq!(err.code(), Code::OutOfRange, "{err:?}");
    assert!(
        err.message().contains("more than limit_bytes"),
        "{}",
        err.message()
    );
    assert_eq!(
        e.share_count().await,
        shares_before,
        "nothing made for a refused member restore"
    );
    let before = e.share_calls().len();
    let r_index =
        e.c.create_volume(restore_req(&e, "restored-index", &member(&index)))
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
    let calls = e.share_calls()[before..].to_vec();
    println!(
        "restore of a second member (its share made already): {} Manila calls",
        calls.len()
    );
    let group_snapshot_reads = calls
        .iter()
        .filter(|c| {
            c.starts_with("GET")
                && c.ends_with(&format!("/share-group-snapshots/{}", gs.group_snapshot_id))
        })
        .count();
    assert_eq!(
        group_snapshot_reads, 1,
        "a member's restore reads its group snapshot once: {calls:#?}"
    );
    assert_eq!(r_index.capacity_bytes, 2 * GIB, "the member's size");
    let again =
        e.c.create_volume(restore_req(&e, "restored-data", &member(&data)))
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
    assert_eq!(again.volume_id, r_data.volume_id);
    assert_eq!(
        posts(&e, "/share-groups"),
        2,
        "the operator's group and one restore group"
    );
    let restored = e.manila.get_share(&r_data.volume_id).await.unwrap();
    let restore_group = restored.share_group_id.clone().unwrap();
    assert_ne!(restore_group, group);
    assert_eq!(
        restored.metadata.get("manila.csi.openstack.org/cluster"),
        e.manila
            .get_share(&data.volume_id)
            .await
            .unwrap()
            .metadata
            .get("manila.csi.openstack.org/cluster"),
        "a restored share carries the cluster's keys"
    );
    // the same volume name from another member is another volume's
    let err =
        e.c.create_volume(restore_req(&e, "restored-data", &member(&wal)))
            .await
            .unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists, "{err:?}");

    // the data member a second time: taken already, so a second group
    let r_data2 =
        e.c.create_volume(restore_req(&e, "restored-data-2", &member(&data)))
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
    assert_ne!(r_data2.volume_id, r_data.volume_id);
    assert_eq!(posts(&e, "/share-groups"), 3);
    let seen = groups_and_shares(&e).await;
    assert_eq!(
        seen[&restore_group],
        BTreeSet::from([
            "restored-data".into(),
            "restored-index".into(),
            String::new()
        ]),
        "the first restore group: two taken, the wal member untaken"
    );

    // the group snapshot goes with what no restore took
    g.delete_volume_group_snapshot(csi::DeleteVolumeGroupSnapshotRequest {
        group_snapshot_id: gs.group_snapshot_id.clone(),
        snapshot_ids: gs.snapshots.iter().map(|s| s.snapshot_id.clone()).collect(),
        secrets: e.secrets.clone(),
    })
    .await
    .unwrap();
    let seen = groups_and_shares(&e).await;
    assert!(
        seen.values().all(|names| !names.contains("")),
        "untaken restored shares left: {seen:?}"
    );
    assert_eq!(seen.len(), 3, "{seen:?}");
    let err = g
        .get_volume_group_snapshot(csi::GetVolumeGroupSnapshotRequest {
            group_snapshot_id: gs.group_snapshot_id.clone(),
            snapshot_ids: vec![],
            secrets: e.secrets.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);

    // restored volumes are volumes; a restore group goes with its last one
    for v in [&r_data, &r_index, &r_data2, &data, &wal, &index, &lone] {
        e.delete(&v.volume_id).await.unwrap();
    }
    let left: Vec<String> = e
        .manila
        .list_shares(&Default::default())
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.id)
        .collect();
    assert!(left.is_empty(), "shares left: {left:?}");
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let mut groups = Vec::new();
        for id in [restore_group.as_str(), group.as_str()] {
            if e.manila.get_share_group(id).await.is_ok() {
                groups.push(id);
            }
        }
        if groups == [group.as_str()] {
            break;
        }
        assert!(Instant::now() < until, "share groups left: {groups:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    e.manila.delete_share_group(&group).await.unwrap();
}

#[tokio::test]
async fn a_failed_group_snapshot_or_restore_leaves_nothing_and_a_retry_succeeds() {
    let mut e = env("cephfs").await;
    let mut g = groups_client(&e).await;
    let group = share_group(&e, "app-data").await;
    let in_group = [("type", "cephfs"), ("groupID", group.as_str())];
    let a = e.create("a", 1, &in_group).await;
    let b = e.create("b", 1, &in_group).await;
    let ids = [a.volume_id.as_str(), b.volume_id.as_str()];

    // over Manila's share group snapshot quota: ResourceExhausted with
    // Manila's words, nothing made
    e.h.emulator
        .control()
        .set_quotas(openstack_emulator::Quotas {
            share_group_snapshots: 0,
            ..Default::default()
        });
    let err = g
        .create_volume_group_snapshot(group_req(&e, "gs", &ids))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    assert!(
        err.message().contains("share-group-snapshots"),
        "{}",
        err.message()
    );
    assert!(
        e.manila
            .share_group_snapshots_named("gs")
            .await
            .unwrap()
            .is_empty(),
        "a group snapshot over quota was made"
    );
    e.h.emulator
        .control()
        .set_quotas(openstack_emulator::Quotas::default());

    e.h.emulator.control().fail_next_share_group_snapshots(1);
    let err = g
        .create_volume_group_snapshot(group_req(&e, "gs", &ids))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Internal, "{err:?}");
    assert!(err.message().contains("deleted it"), "{}", err.message());
    let until = Instant::now() + Duration::from_secs(10);
    while !e
        .manila
        .share_group_snapshots_named("gs")
        .await
        .unwrap()
        .is_empty()
    {
        assert!(Instant::now() < until, "the failed group snapshot stayed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let gs = g
        .create_volume_group_snapshot(group_req(&e, "gs", &ids))
        .await
        .unwrap()
        .into_inner()
        .group_snapshot
        .unwrap();
    let of_a = gs
        .snapshots
        .iter()
        .find(|s| s.source_volume_id == a.volume_id)
        .unwrap()
        .snapshot_id
        .clone();

    // the restore is cut between marking the share and naming it: the
    // retry takes the same share, no second restore group is made
    let control = e.h.emulator.control();
    control.add_fault(
        FaultRule::new(
            Some("PUT"),
            "/shares/",
            FaultAction::Status {
                status: 403,
                message: Some("Policy doesn't allow share:update to be performed.".into()),
                retry_after: None,
                hint: Default::default(),
            },
        )
        .times(1),
    );
    let err =
        e.c.create_volume(restore_req(&e, "ra", &of_a))
            .await
            .unwrap_err();
    assert!(err.message().contains("naming restored share"), "{err:?}");
    assert_eq!(
        control.faults().iter().map(|f| f.served).sum::<u64>(),
        1,
        "the 403 was not served"
    );
    let ra =
        e.c.create_volume(restore_req(&e, "ra", &of_a))
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
    assert_eq!(
        posts(&e, "/share-groups"),
        2,
        "a retry made another restore group"
    );
    assert_eq!(e.manila.get_share(&ra.volume_id).await.unwrap().name, "ra");

    g.delete_volume_group_snapshot(csi::DeleteVolumeGroupSnapshotRequest {
        group_snapshot_id: gs.group_snapshot_id.clone(),
        snapshot_ids: vec![],
        secrets: e.secrets.clone(),
    })
    .await
    .unwrap();
    // deleted twice: done is done
    g.delete_volume_group_snapshot(csi::DeleteVolumeGroupSnapshotRequest {
        group_snapshot_id: gs.group_snapshot_id.clone(),
        snapshot_ids: vec![],
        secrets: e.secrets.clone(),
    })
    .await
    .unwrap();
    for v in [&ra, &a, &b] {
        e.delete(&v.volume_id).await.unwrap();
    }
    assert_eq!(e.share_count().await, 0);
}
