//! A crowded project: the Manila controller serving a project that
//! already holds 1,000 shares not its own (made straight through Manila).
//! No operation may walk the project's shares: every list it sends is
//! narrowed by a name, the cluster's metadata, the share it is about or a
//! page's limit, and each operation makes as many calls as in an empty
//! project (flat as the project grows).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use csi_sanity::harness::calls::{self, AskedByOperation, shape};
use openstack_emulator::CallRecord;
use proto::csi::v1 as csi;

const CROWD: usize = 1000;
const PAGE: i32 = 10;

/// Manila's collections a driver may list.
const COLLECTIONS: &[&str] = &[
    "shares",
    "snapshots",
    "export_locations",
    "access-rules",
    "share-access-rules",
    "messages",
];

fn is_list(c: &CallRecord) -> bool {
    // a share's own collections (its export locations, its access rules)
    // are about that share alone
    calls::is_list(c, COLLECTIONS) && !c.path.contains("/shares/")
        || c.path.ends_with("/shares/detail")
}

/// The controller operations of a share's life, each with what it asked of
/// the cloud.
async fn one_shares_life(e: &mut Env) -> AskedByOperation {
    let ctl = e.h.emulator.control();
    let mut asked = AskedByOperation::new();
    let mut take = |what: &'static str| {
        let seen = ctl.calls();
        ctl.clear_calls();
        calls::assert_lists_narrowed(&seen, is_list, what);
        asked.insert(what, seen.iter().map(shape).collect::<Vec<_>>());
    };
    ctl.clear_calls();
    let v = e.create("crowded-share", 1, &[("type", "cephfs")]).await;
    take("CreateVolume");
    e.c.controller_expand_volume(csi::ControllerExpandVolumeRequest {
        volume_id: v.volume_id.clone(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: 2 * GIB,
            limit_bytes: 0,
        }),
        secrets: e.secrets.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    take("ControllerExpandVolume");
    let snap =
        e.c.create_snapshot(csi::CreateSnapshotRequest {
            source_volume_id: v.volume_id.clone(),
            name: "crowded-snap".into(),
            secrets: e.secrets.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap();
    take("CreateSnapshot");
    e.c.delete_snapshot(csi::DeleteSnapshotRequest {
        snapshot_id: snap.snapshot_id,
        secrets: e.secrets.clone(),
    })
    .await
    .unwrap();
    take("DeleteSnapshot");
    let page =
        e.c.list_volumes(csi::ListVolumesRequest {
            max_entries: PAGE,
            starting_token: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    take("ListVolumes");
    assert!(
        page.entries.len() <= PAGE as usize,
        "{}",
        page.entries.len()
    );
    e.delete(&v.volume_id).await.unwrap();
    take("DeleteVolume");
    asked
}

#[tokio::test]
async fn in_a_crowded_project_no_operation_walks_the_projects_shares() {
    let mut empty = env_with("CEPHFS", |o| o.stand_ins = false).await;
    let alone = one_shares_life(&mut empty).await;

    let mut crowded = env_with("CEPHFS", |o| o.stand_ins = false).await;
    let ctl = crowded.h.emulator.control();
    ctl.seed_shares("demo", CROWD, "CEPHFS").unwrap();
    // the controller started in the crowded project: what it asks at start
    // (its orphan report among it) is narrowed too
    ctl.clear_calls();
    crowded.h.restart_plugin().await.unwrap();
    crowded = reconnect(crowded).await;
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    calls::assert_lists_narrowed(&ctl.calls(), is_list, "at start");
    let among_many = one_shares_life(&mut crowded).await;

    calls::assert_flat(&alone, &among_many, CROWD, "/shares/detail");
}

/// The same plugin after a restart: a new connection to its socket.
async fn reconnect(e: Env) -> Env {
    let ch = plugin_runtime::connect_unix(&e.h.socket).await.unwrap();
    csi_sanity::harness::wait_until_ready(&e.h.socket)
        .await
        .unwrap();
    Env {
        c: proto::csi::v1::controller_client::ControllerClient::new(ch.clone()),
        n: proto::csi::v1::node_client::NodeClient::new(ch),
        ..e
    }
}
