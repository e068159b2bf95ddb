//! Two controller replicas acting at once (leader election off, or a lease
//! that briefly allows two), each asked for the same shares: each looks
//! the name up, finds nothing and creates one. They must settle on one
//! share per name, both answering it, and leave no second share behind.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Child, Command, Stdio};

use openstack_emulator::{FaultAction, FaultRule};
use proto::csi::v1::controller_client::ControllerClient;

mod common;
use common::*;

/// A second controller of the same cloud, on a socket of its own.
struct Replica(Child);

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A second controller of the same cloud as `e`'s, on a socket of its own.
async fn second_replica(e: &Env) -> (Replica, ControllerClient<tonic::transport::Channel>) {
    let socket = e.h.dir.path().join("replica-2.sock");
    let args: Vec<String> =
        e.h.plugin_args()
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
    let replica = Replica(
        Command::new(BIN)
            .args(&args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    csi_sanity::harness::wait_for_socket(&socket).await.unwrap();
    csi_sanity::harness::wait_until_ready(&socket)
        .await
        .unwrap();
    let second = ControllerClient::new(plugin_runtime::connect_unix(&socket).await.unwrap());
    (replica, second)
}

#[tokio::test]
async fn two_replicas_creating_the_same_shares_settle_on_one_each() {
    let mut e = env("NFS").await;
    let (_replica, mut second) = second_replica(&e).await;
    // both look the name up before either create lands
    e.h.emulator.control().add_fault(FaultRule::new(
        Some("POST"),
        "/shares",
        FaultAction::Delay { millis: 400 },
    ));
    for i in 0..3 {
        let name = format!("pvc-twin-share-{i}");
        let req = e.create_req(&name, 1, &[("nfs-shareClient", "10.0.0.0/8")]);
        let (a, b) = tokio::join!(e.c.create_volume(req.clone()), second.create_volume(req));
        let (a, b) = (
            a.unwrap().into_inner().volume.unwrap().volume_id,
            b.unwrap().into_inner().volume.unwrap().volume_id,
        );
        assert_eq!(a, b, "{name}: both replicas answer the same share");
        let left = csi_sanity::harness::left_once_settled(|| async {
            e.manila
                .list_shares_named(&name)
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
            "{name}: one share left, the one answered"
        );
    }
    let creates =
        e.h.emulator
            .control()
            .calls()
            .iter()
            .filter(|c| c.method == "POST" && c.path.ends_with("/shares"))
            .count();
    assert_eq!(creates, 6, "both replicas created each share");
}

/// The same race for snapshots: both replicas answer one snapshot, and
/// the other is gone.
#[tokio::test]
async fn two_replicas_taking_the_same_snapshots_settle_on_one_each() {
    let mut e = env_with("NFS", |o| {
        o.stand_ins = false;
        o.extra_args
            .push("--default-nfs-share-client=10.0.0.0/8".into());
    })
    .await;
    let (_replica, mut second) = second_replica(&e).await;
    let source = e.create("pvc-snapshot-source", 1, &[]).await.volume_id;
    e.h.emulator.control().add_fault(FaultRule::new(
        Some("POST"),
        "/snapshots",
        FaultAction::Delay { millis: 400 },
    ));
    for i in 0..3 {
        let name = format!("snapshot-twin-{i}");
        let req = proto::csi::v1::CreateSnapshotRequest {
            source_volume_id: source.clone(),
            name: name.clone(),
            secrets: e.secrets.clone(),
            ..Default::default()
        };
        let (a, b) = tokio::join!(
            e.c.create_snapshot(req.clone()),
            second.create_snapshot(req)
        );
        let (a, b) = (
            a.unwrap().into_inner().snapshot.unwrap().snapshot_id,
            b.unwrap().into_inner().snapshot.unwrap().snapshot_id,
        );
        assert_eq!(a, b, "{name}: both replicas answer the same snapshot");
        let left = csi_sanity::harness::left_once_settled(|| async {
            e.manila
                .list_snapshots_named(&name)
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
    let creates =
        e.h.emulator
            .control()
            .calls()
            .iter()
            .filter(|c| c.method == "POST" && c.path.ends_with("/snapshots"))
            .count();
    assert_eq!(creates, 6, "both replicas created each snapshot");
}
