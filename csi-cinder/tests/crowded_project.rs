//! A crowded project: the controller serving a project that already
//! holds 1,000 volumes not its own (made straight through Cinder). No
//! operation may walk the project's volumes: every list it sends is
//! narrowed by a name, the cluster's metadata or a page's limit, and each
//! operation makes as many calls as in an empty project (flat as the
//! project grows). Upstream's driver lists every volume on each attacher
//! resync when `max_entries` is 0.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use csi_sanity::harness::calls::{self, AskedByOperation, shape};
use openstack_emulator::CallRecord;
use proto::csi::v1 as csi;
use proto::csi::v1::volume_capability::access_mode::Mode;

const CROWD: usize = 1000;
const PAGE: i32 = 10;

/// Cinder's collections a driver may list.
const COLLECTIONS: &[&str] = &["volumes", "snapshots", "attachments", "backups"];

fn is_list(c: &CallRecord) -> bool {
    calls::is_list(c, COLLECTIONS)
}

/// The operations of a claim's life, each with what it asked of the cloud.
async fn one_claims_life(e: &mut Env) -> AskedByOperation {
    let ctl = e.h.emulator.control();
    let cap = mount_cap("ext4", Mode::SingleNodeWriter);
    let mut asked = AskedByOperation::new();
    let mut take = |what: &'static str| {
        let seen = ctl.calls();
        ctl.clear_calls();
        calls::assert_lists_narrowed(&seen, is_list, what);
        asked.insert(what, seen.iter().map(shape).collect::<Vec<_>>());
    };
    ctl.clear_calls();
    let v = e.create("crowded-claim", cap.clone(), 1).await;
    take("CreateVolume");
    e.publish(&v.volume_id, cap.clone()).await;
    take("ControllerPublishVolume");
    e.unpublish(&v.volume_id).await;
    take("ControllerUnpublishVolume");
    let snap =
        e.c.create_snapshot(snapshot_req(&v.volume_id, "crowded-snap", &[]))
            .await
            .unwrap()
            .into_inner()
            .snapshot
            .unwrap();
    take("CreateSnapshot");
    e.c.delete_snapshot(csi::DeleteSnapshotRequest {
        snapshot_id: snap.snapshot_id,
        ..Default::default()
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
    e.c.delete_volume(csi::DeleteVolumeRequest {
        volume_id: v.volume_id,
        ..Default::default()
    })
    .await
    .unwrap();
    take("DeleteVolume");
    asked
}

#[tokio::test]
async fn in_a_crowded_project_no_operation_walks_the_projects_volumes() {
    let mut empty = env().await;
    let alone = one_claims_life(&mut empty).await;

    let mut crowded = env().await;
    let ctl = crowded.h.emulator.control();
    ctl.seed_volumes(crowded.h.project(), CROWD, None).unwrap();
    // the controller started in the crowded project: what it asks at start
    // (its orphan report among it) is narrowed too
    ctl.clear_calls();
    crowded.h.restart_plugin().await.unwrap();
    crowded = reconnect(crowded).await;
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    calls::assert_lists_narrowed(&ctl.calls(), is_list, "at start");
    ctl.clear_calls();
    let among_many = one_claims_life(&mut crowded).await;

    calls::assert_flat(&alone, &among_many, CROWD, "/volumes/detail");
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
