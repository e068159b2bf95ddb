//! A crowded project: the controller serving a project that already
//! holds 1,000 volumes not its own (made straight through Cinder). No
//! operation may walk the project's volumes: every list it sends is
//! narrowed by a name, the cluster's metadata or a page's limit, and each
//! operation makes as many calls as in an empty project (flat as the
//! project grows). Upstream's driver lists every volume on each attacher
//! resync when `max_entries` is 0.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;

use common::*;
use openstack_emulator::CallRecord;
use proto::csi::v1 as csi;
use proto::csi::v1::volume_capability::access_mode::Mode;

const CROWD: usize = 1000;
const PAGE: i32 = 10;

/// What one operation asked of the cloud: its calls, each as method, the
/// path with ids set aside, and the query's keys.
type Asked = Vec<(String, String, Vec<String>)>;

fn shape(c: &CallRecord) -> (String, String, Vec<String>) {
    let path = c
        .path
        .split('/')
        .map(|seg| {
            // ids (uuids, project ids) and numbers set aside: the same
            // operation on two volumes has one shape
            if seg.len() >= 16 || seg.chars().all(|ch| ch.is_ascii_digit()) && !seg.is_empty() {
                "{id}"
            } else {
                seg
            }
        })
        .collect::<Vec<_>>()
        .join("/");
    let mut keys: Vec<String> = c
        .query
        .split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| kv.split('=').next().unwrap_or_default().to_string())
        .collect();
    keys.sort();
    (c.method.clone(), path, keys)
}

fn is_list(c: &CallRecord) -> bool {
    c.method == "GET"
        && (c.path.ends_with("/volumes/detail")
            || c.path.ends_with("/volumes")
            || c.path.ends_with("/snapshots/detail")
            || c.path.ends_with("/snapshots")
            || c.path.ends_with("/attachments")
            || c.path.ends_with("/attachments/detail"))
}

/// A list narrowed by a name, a metadata filter, the volume or server it
/// is about, or a page's limit.
fn narrowed(c: &CallRecord) -> bool {
    ["name=", "metadata=", "volume_id=", "instance_id=", "limit="]
        .iter()
        .any(|k| c.query.split('&').any(|kv| kv.starts_with(k)))
}

/// The operations of a claim's life, each with what it asked of the cloud.
async fn one_claims_life(e: &mut Env) -> BTreeMap<&'static str, Asked> {
    let ctl = e.h.emulator.control();
    let cap = mount_cap("ext4", Mode::SingleNodeWriter);
    let mut asked = BTreeMap::new();
    let mut take = |what: &'static str| {
        let calls = ctl.calls();
        ctl.clear_calls();
        let lists: Vec<_> = calls.iter().filter(|c| is_list(c)).collect();
        for l in &lists {
            assert!(
                narrowed(l),
                "{what}: {} {}?{} lists the project's volumes unnarrowed",
                l.method,
                l.path,
                l.query
            );
        }
        asked.insert(what, calls.iter().map(shape).collect::<Asked>());
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
    let at_start = ctl.calls();
    for l in at_start.iter().filter(|c| is_list(c)) {
        assert!(
            narrowed(l),
            "at start: {} {}?{} lists the project's volumes unnarrowed",
            l.method,
            l.path,
            l.query
        );
    }
    ctl.clear_calls();
    let among_many = one_claims_life(&mut crowded).await;

    for (what, calls) in &alone {
        assert_eq!(
            calls.len(),
            among_many[what].len(),
            "{what}: {} calls in an empty project, {} among {CROWD} volumes not its own:\n{calls:#?}\n{:#?}",
            calls.len(),
            among_many[what].len(),
            among_many[what]
        );
    }
    // the ListVolumes page: one list of at most a page, whatever the project
    let lists = among_many["ListVolumes"]
        .iter()
        .filter(|(m, p, _)| m == "GET" && p.ends_with("/volumes/detail"))
        .count();
    assert_eq!(lists, 1, "{:#?}", among_many["ListVolumes"]);
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
