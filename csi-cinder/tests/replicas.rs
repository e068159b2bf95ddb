//! Two controller replicas acting at once (leader election off, or a lease
//! that briefly allows two), each asked for the same volumes: each looks
//! the name up, finds nothing and creates one. They must settle on one
//! volume per name, both answering it, and leave no second volume behind.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use csi_sanity::harness::{CinderOnEmulator, HarnessOptions};
use openstack_emulator::{FaultAction, FaultRule};
use proto::csi::v1::controller_client::ControllerClient;
use proto::csi::v1::volume_capability::access_mode::Mode;

mod common;
use common::*;

/// A second controller of the same cloud, on a socket of its own.
struct Replica {
    child: Child,
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn second_replica(
    h: &CinderOnEmulator,
) -> (Replica, ControllerClient<tonic::transport::Channel>) {
    let socket = h.dir.path().join("csi/replica-2.sock");
    let args: Vec<String> = h
        .plugin_args()
        .into_iter()
        .map(|a| {
            if a.starts_with("--endpoint=") {
                format!("--endpoint=unix://{}", socket.display())
            } else {
                a
            }
        })
        .chain(["--provide-node-service=false".to_string()])
        .collect();
    let child = Command::new(BIN)
        .args(&args)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let replica = Replica { child };
    csi_sanity::harness::wait_for_socket(&socket).await.unwrap();
    csi_sanity::harness::wait_until_ready(&socket)
        .await
        .unwrap();
    let ch = plugin_runtime::connect_unix(&socket).await.unwrap();
    (replica, ControllerClient::new(ch))
}

#[tokio::test]
async fn two_replicas_creating_the_same_volumes_settle_on_one_each() {
    if !root() {
        return;
    }
    let h = CinderOnEmulator::start(HarnessOptions::new(BIN))
        .await
        .unwrap();
    csi_sanity::harness::wait_until_ready(&h.socket)
        .await
        .unwrap();
    let mut first = ControllerClient::new(plugin_runtime::connect_unix(&h.socket).await.unwrap());
    let (_replica, mut second) = second_replica(&h).await;
    let cinder = cinder_of(&h);
    // both look the name up before either create lands: the creates wait
    // a little on their way, as behind a busy API
    h.emulator.control().add_fault(FaultRule::new(
        Some("POST"),
        "/volumes",
        FaultAction::Delay { millis: 400 },
    ));
    let cap = mount_cap("ext4", Mode::SingleNodeWriter);
    for i in 0..4 {
        let name = format!("pvc-twin-{i}");
        let (a, b) = tokio::join!(
            first.create_volume(create_req(&name, cap.clone(), 1)),
            second.create_volume(create_req(&name, cap.clone(), 1)),
        );
        let (a, b) = (
            a.unwrap().into_inner().volume.unwrap().volume_id,
            b.unwrap().into_inner().volume.unwrap().volume_id,
        );
        assert_eq!(a, b, "{name}: both replicas answer the same volume");
        // the loser's deletion is under way: wait for it to finish
        let left = csi_sanity::harness::left_once_settled(|| async {
            cinder
                .volumes_named(&name)
                .await
                .unwrap()
                .into_iter()
                .filter(|v| v.status.as_str() != "deleting")
                .map(|v| v.id)
                .collect()
        })
        .await;
        assert_eq!(
            left,
            vec![a.clone()],
            "{name}: one volume left, the one answered"
        );
    }
    // the race really happened: each name was created twice
    let creates = h
        .emulator
        .control()
        .calls()
        .iter()
        .filter(|c| c.method == "POST" && c.path.ends_with("/volumes"))
        .count();
    assert_eq!(creates, 8, "both replicas created each volume");
}

/// The same race for snapshots: both replicas of a CreateSnapshot look
/// the name up, find nothing and ask Cinder, which takes both. They must
/// answer the same snapshot, and the other must be gone (a
/// VolumeSnapshotContent names one; the other would be billed forever).
#[tokio::test]
async fn two_replicas_taking_the_same_snapshots_settle_on_one_each() {
    if !root() {
        return;
    }
    let h = CinderOnEmulator::start(HarnessOptions::new(BIN))
        .await
        .unwrap();
    csi_sanity::harness::wait_until_ready(&h.socket)
        .await
        .unwrap();
    let mut first = ControllerClient::new(plugin_runtime::connect_unix(&h.socket).await.unwrap());
    let (_replica, mut second) = second_replica(&h).await;
    let cinder = cinder_of(&h);
    let cap = mount_cap("ext4", Mode::SingleNodeWriter);
    let source = first
        .create_volume(create_req("pvc-snapshot-source", cap, 1))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap()
        .volume_id;
    h.emulator.control().add_fault(FaultRule::new(
        Some("POST"),
        "/snapshots",
        FaultAction::Delay { millis: 400 },
    ));
    for i in 0..3 {
        let name = format!("snapshot-twin-{i}");
        let (a, b) = tokio::join!(
            first.create_snapshot(snapshot_req(&source, &name, &[])),
            second.create_snapshot(snapshot_req(&source, &name, &[])),
        );
        let (a, b) = (
            a.unwrap().into_inner().snapshot.unwrap().snapshot_id,
            b.unwrap().into_inner().snapshot.unwrap().snapshot_id,
        );
        assert_eq!(a, b, "{name}: both replicas answer the same snapshot");
        let left = csi_sanity::harness::left_once_settled(|| async {
            cinder
                .snapshots_named(&name)
                .await
                .unwrap()
                .into_iter()
                .filter(|s| s.status.as_str() != "deleting")
                .map(|s| s.id)
                .collect()
        })
        .await;
        assert_eq!(
            left,
            vec![a.clone()],
            "{name}: one snapshot left, the one answered"
        );
    }
    let creates = h
        .emulator
        .control()
        .calls()
        .iter()
        .filter(|c| c.method == "POST" && c.path.ends_with("/snapshots"))
        .count();
    assert_eq!(creates, 6, "both replicas created each snapshot");
}

/// A replica killed between its create and its yield leaves its twin
/// behind: the next call of that name keeps the older and deletes the
/// other. Volumes of one name that this driver did not both make (one
/// made by hand) are never touched: the call names them.
#[tokio::test]
async fn a_twin_left_by_a_killed_replica_is_deleted_by_the_next_call_and_foreign_ones_never() {
    if !root() {
        return;
    }
    let h = CinderOnEmulator::start(HarnessOptions::new(BIN))
        .await
        .unwrap();
    csi_sanity::harness::wait_until_ready(&h.socket)
        .await
        .unwrap();
    let mut c = ControllerClient::new(plugin_runtime::connect_unix(&h.socket).await.unwrap());
    let cinder = cinder_of(&h);
    let ours = |name: &str| openstack_client::cinder::CreateVolume {
        name: name.into(),
        size_gib: 1,
        description: Some("Created by OpenStack Cinder CSI driver".into()),
        metadata: [(
            csi_cinder::controller::CLUSTER_KEY.to_string(),
            "sanity".to_string(),
        )]
        .into(),
        ..Default::default()
    };
    let older = cinder.create_volume(&ours("pvc-left")).await.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let newer = cinder.create_volume(&ours("pvc-left")).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let cap = mount_cap("ext4", Mode::SingleNodeWriter);
    let got = c
        .create_volume(create_req("pvc-left", cap.clone(), 1))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(got.volume_id, older.id, "the older is kept");
    let mut status = String::new();
    for _ in 0..100 {
        status = match cinder.get_volume(&newer.id).await {
            Ok(v) => v.status.to_string(),
            Err(e) if e.is_not_found() => "gone".into(),
            Err(e) => panic!("{e}"),
        };
        if status == "gone" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(status, "gone", "the twin is deleted");

    // one of them made by hand: both kept, the call refused naming them
    let mine = cinder.create_volume(&ours("pvc-foreign")).await.unwrap();
    let by_hand = cinder
        .create_volume(&openstack_client::cinder::CreateVolume {
            name: "pvc-foreign".into(),
            size_gib: 1,
            ..Default::default()
        })
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let err = c
        .create_volume(create_req("pvc-foreign", cap, 1))
        .await
        .unwrap_err();
    assert!(
        err.message().contains(&mine.id) && err.message().contains(&by_hand.id),
        "{}",
        err.message()
    );
    for id in [&mine.id, &by_hand.id] {
        assert_eq!(
            cinder.get_volume(id).await.unwrap().status.as_str(),
            "available"
        );
    }
}
