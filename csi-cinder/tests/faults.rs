//! `cinder-csi-plugin`'s controller through its socket against a cloud
//! that behaves as production clouds do: it throttles (429 with each kind
//! of retry hint), is busy (Nova's 409 while a server does something
//! else), does the work and loses the answer, and keeps working on a
//! request whose caller gave up. After each, what the cloud holds is
//! checked: one volume per name, one attachment, never a detach that
//! lands after a newer attach. Tests needing root return early (and say
//! so) without it.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::collections::HashMap;
use std::time::{Duration, Instant};

use openstack_emulator::{FaultAction, FaultRule, RetryHint};
use proto::csi::v1 as csi;
use proto::csi::v1::volume_capability::access_mode::Mode;
use tonic::Code;

mod common;
use common::*;

fn cap() -> csi::VolumeCapability {
    mount_cap("ext4", Mode::SingleNodeWriter)
}

fn publish_req(e: &Env, id: &str) -> csi::ControllerPublishVolumeRequest {
    csi::ControllerPublishVolumeRequest {
        volume_id: id.into(),
        node_id: e.h.node_id.clone(),
        volume_capability: Some(cap()),
        ..Default::default()
    }
}

fn unpublish_req(e: &Env, id: &str) -> csi::ControllerUnpublishVolumeRequest {
    csi::ControllerUnpublishVolumeRequest {
        volume_id: id.into(),
        node_id: e.h.node_id.clone(),
        secrets: HashMap::new(),
    }
}

/// The servers Cinder says the volume is attached to, and its status.
async fn holders(e: &Env, id: &str) -> (Vec<String>, String) {
    let v = e.cinder.get_volume(id).await.unwrap();
    (
        v.attachments
            .iter()
            .filter_map(|a| a.server_id.clone())
            .collect(),
        v.status.to_string(),
    )
}

fn calls(e: &Env, method: &str, path: &str) -> usize {
    e.h.emulator
        .control()
        .calls()
        .iter()
        .filter(|c| c.method == method && c.path.contains(path))
        .count()
}

/// A detach of `id` from the node that waits 3 s before Nova sees it,
/// whose caller gives up after 1 s and publishes again at once, as the
/// attacher does (the same request after each retryable answer): the
/// publish may answer only once the detach is done.
async fn detach_late_then_publish_again(e: &mut Env, id: &str, cap: &csi::VolumeCapability) {
    e.h.emulator.control().add_fault(
        FaultRule::new(
            Some("DELETE"),
            &format!("/os-volume_attachments/{id}"),
            FaultAction::Delay { millis: 3000 },
        )
        .times(1),
    );
    let gave_up =
        e.c.controller_unpublish_volume(timed(unpublish_req(e, id), Duration::from_secs(1)))
            .await
            .unwrap_err();
    assert!(
        matches!(gave_up.code(), Code::DeadlineExceeded | Code::Cancelled),
        "{gave_up:?}"
    );
    let started = Instant::now();
    let mut answers = Vec::new();
    let mut publish = publish_req(e, id);
    publish.volume_capability = Some(cap.clone());
    loop {
        match e
            .c
            .controller_publish_volume(timed(publish.clone(), Duration::from_secs(60)))
            .await
        {
            Ok(_) => break,
            Err(s) if matches!(s.code(), Code::Aborted | Code::Unavailable) => {
                answers.push(format!("{:?}: {}", s.code(), s.message()));
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(s) => panic!("{s:?}"),
        }
        assert!(started.elapsed() < Duration::from_secs(60), "{answers:#?}");
    }
    println!(
        "the publish answered OK {:?} after the unpublish gave up, after {} retryable answers (the first: {:?})",
        started.elapsed(),
        answers.len(),
        answers.first()
    );
    // past the moment the late detach reached Nova, and its work
    tokio::time::sleep(Duration::from_secs(4).saturating_sub(started.elapsed())).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
}

/// gcp-pd-csi-driver #965: a detach whose RPC timed out while the cloud
/// still had it landed after a newer attach to the same server and took
/// the fresh disk away. The volume must stay attached.
#[tokio::test]
async fn a_detach_still_on_its_way_never_undoes_a_newer_attach() {
    if !root() {
        return;
    }
    let mut e = env().await;
    let v = e.create("late-detach", cap(), 1).await;
    let id = v.volume_id.clone();
    e.publish(&id, cap()).await;
    detach_late_then_publish_again(&mut e, &id, &cap()).await;
    let (servers, status) = holders(&e, &id).await;
    assert_eq!(
        (servers, status.as_str()),
        (vec![e.h.node_id.clone()], "in-use"),
        "the publish answered OK, so the volume must stay attached to the node"
    );
}

/// A gateway answers 504 for Nova's detach while the detach goes on, and
/// the controller is restarted (a crash, a rollout) before it lands: the
/// new controller, which never sent it, must still not answer a publish
/// OK on the attachment the late detach takes away. It learns of it from
/// the volume's own mark.
#[tokio::test]
async fn a_detach_a_gateway_gave_up_on_never_undoes_a_newer_attach_across_a_restart() {
    if !root() {
        return;
    }
    let mut e = env().await;
    let v = e.create("gateway-detach", cap(), 1).await;
    let id = v.volume_id.clone();
    e.publish(&id, cap()).await;
    let control = e.h.emulator.control();
    let late = Duration::from_secs(6);
    control.add_fault(
        FaultRule::new(
            Some("DELETE"),
            &format!("/os-volume_attachments/{id}"),
            FaultAction::GatewayGaveUp {
                status: 504,
                serve_after_millis: late.as_millis() as u64,
            },
        )
        .times(1),
    );
    let sent = Instant::now();
    let gave_up =
        e.c.controller_unpublish_volume(unpublish_req(&e, &id))
            .await
            .unwrap_err();
    assert_eq!(gave_up.code(), Code::Unavailable, "{gave_up:?}");
    assert_eq!(
        holders(&e, &id).await.0,
        vec![e.h.node_id.clone()],
        "not landed yet"
    );
    let marked = e.cinder.get_volume(&id).await.unwrap().metadata;
    assert!(
        marked
            .get("cinder.csi.openstack.org/unanswered-detach")
            .is_some_and(|m| m.starts_with(&e.h.node_id)),
        "{marked:?}"
    );
    // the attacher asks again: the detach on its way is waited for, not
    // sent a second time (whose answer could come first)
    let waited =
        e.c.controller_unpublish_volume(timed(unpublish_req(&e, &id), Duration::from_secs(2)))
            .await
            .unwrap_err();
    assert!(
        matches!(waited.code(), Code::DeadlineExceeded | Code::Cancelled),
        "{waited:?}"
    );
    assert_eq!(
        calls(&e, "DELETE", &format!("/os-volume_attachments/{id}")),
        0,
        "no second detach while the first is on its way"
    );
    e.h.restart_plugin().await.unwrap();
    csi_sanity::harness::wait_until_ready(&e.h.socket)
        .await
        .unwrap();
    let ch = plugin_runtime::connect_unix(&e.h.socket).await.unwrap();
    e.c = proto::csi::v1::controller_client::ControllerClient::new(ch.clone());
    e.n = proto::csi::v1::node_client::NodeClient::new(ch);
    let mut answers = Vec::new();
    loop {
        match e.c.controller_publish_volume(publish_req(&e, &id)).await {
            Ok(_) => break,
            Err(s) if matches!(s.code(), Code::Aborted | Code::Unavailable) => {
                answers.push(format!("{:?}: {}", s.code(), s.message()));
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(s) => panic!("{s:?}"),
        }
        assert!(sent.elapsed() < Duration::from_secs(90), "{answers:#?}");
    }
    println!(
        "the restarted controller answered the publish OK {:?} after the detach was sent, after {} retryable answers (the first: {:?})",
        sent.elapsed(),
        answers.len(),
        answers.first()
    );
    assert!(
        answers
            .first()
            .is_some_and(|a| a.contains("may still land")),
        "the restarted controller knew of the detach: {answers:#?}"
    );
    // past the moment the late detach reached Nova, and its work
    tokio::time::sleep((late + Duration::from_secs(2)).saturating_sub(sent.elapsed())).await;
    let (servers, status) = holders(&e, &id).await;
    assert_eq!(
        (servers, status.as_str()),
        (vec![e.h.node_id.clone()], "in-use"),
        "the publish answered OK, so the volume must stay attached to the node"
    );
    let settled = e.cinder.get_volume(&id).await.unwrap().metadata;
    assert_eq!(
        settled
            .get("cinder.csi.openstack.org/unanswered-detach")
            .map(String::as_str),
        Some("settled"),
        "the mark is cleared once the detach has shown: {settled:?}"
    );
}

/// The same for a multiattach volume, also attached to another server:
/// the late detach takes neither the node's newer attachment nor the
/// other server's.
#[tokio::test]
async fn a_late_detach_of_a_multiattach_volume_undoes_neither_a_newer_attach_nor_another_servers() {
    if !root() {
        return;
    }
    let mut e = env().await;
    let shared = block_cap(Mode::MultiNodeMultiWriter);
    let mut r = create_req("late-detach-shared", shared.clone(), 1);
    r.parameters.insert("type".into(), "multiattach".into());
    let id =
        e.c.create_volume(r)
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap()
            .volume_id;
    let other =
        e.h.emulator
            .control()
            .create_server(e.h.project(), "other-reader", "nova")
            .unwrap();
    e.publish(&id, shared.clone()).await;
    let mut elsewhere = publish_req(&e, &id);
    elsewhere.node_id = other.clone();
    elsewhere.volume_capability = Some(shared.clone());
    e.c.controller_publish_volume(elsewhere).await.unwrap();
    detach_late_then_publish_again(&mut e, &id, &shared).await;
    let (mut servers, status) = holders(&e, &id).await;
    servers.sort();
    let mut expected = vec![e.h.node_id.clone(), other];
    expected.sort();
    assert_eq!(
        (servers, status.as_str()),
        (expected, "in-use"),
        "both publishes answered OK, so the volume must stay attached to both servers"
    );
}

/// The cloud did the work and the answer was lost on the way: the RPC
/// fails with a retryable code, and the sidecar's retry finds the work
/// done instead of doing it twice.
#[tokio::test]
async fn work_whose_answer_was_lost_is_found_again_not_done_twice() {
    if !root() {
        return;
    }
    let mut e = env().await;
    let control = e.h.emulator.control();

    // a create
    control.add_fault(FaultRule::new(Some("POST"), "/volumes", FaultAction::LoseAnswer).times(1));
    let err =
        e.c.create_volume(create_req("lost-create", cap(), 1))
            .await
            .unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{}", err.message());
    let v = e.create("lost-create", cap(), 1).await;
    assert_eq!(e.named("lost-create").await.len(), 1, "one volume");

    // a snapshot
    control.add_fault(FaultRule::new(Some("POST"), "/snapshots", FaultAction::LoseAnswer).times(1));
    let err =
        e.c.create_snapshot(snapshot_req(&v.volume_id, "lost-snapshot", &[]))
            .await
            .unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{}", err.message());
    let snap =
        e.c.create_snapshot(snapshot_req(&v.volume_id, "lost-snapshot", &[]))
            .await
            .unwrap()
            .into_inner()
            .snapshot
            .unwrap();
    let snapshots = e
        .cinder
        .list_snapshots(&Default::default())
        .await
        .unwrap()
        .items;
    assert_eq!(
        snapshots
            .iter()
            .filter(|s| s.name == "lost-snapshot")
            .count(),
        1,
        "one snapshot"
    );

    // an attach
    control.add_fault(
        FaultRule::new(
            Some("POST"),
            "/os-volume_attachments",
            FaultAction::LoseAnswer,
        )
        .times(1),
    );
    let err =
        e.c.controller_publish_volume(publish_req(&e, &v.volume_id))
            .await
            .unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{}", err.message());
    e.publish(&v.volume_id, cap()).await;
    assert_eq!(
        holders(&e, &v.volume_id).await,
        (vec![e.h.node_id.clone()], "in-use".to_string())
    );

    // a detach, then a delete: done once, and nothing is left. The
    // detach whose answer was lost is not sent again (a second copy could
    // land after a newer attach): the RPC fails retryably, and its retry
    // finds it done
    control.add_fault(
        FaultRule::new(
            Some("DELETE"),
            "/os-volume_attachments/",
            FaultAction::LoseAnswer,
        )
        .times(1),
    );
    let err =
        e.c.controller_unpublish_volume(unpublish_req(&e, &v.volume_id))
            .await
            .unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{}", err.message());
    e.c.controller_unpublish_volume(unpublish_req(&e, &v.volume_id))
        .await
        .unwrap();
    assert_eq!(
        holders(&e, &v.volume_id).await,
        (vec![], "available".to_string())
    );
    assert_eq!(
        calls(&e, "DELETE", "/os-volume_attachments/"),
        1,
        "the detach sent once"
    );
    assert_eq!(
        e.cinder
            .get_volume(&v.volume_id)
            .await
            .unwrap()
            .metadata
            .get("cinder.csi.openstack.org/unanswered-detach")
            .map(String::as_str),
        Some("settled"),
        "settled once it showed"
    );
    e.c.delete_snapshot(csi::DeleteSnapshotRequest {
        snapshot_id: snap.snapshot_id,
        ..Default::default()
    })
    .await
    .unwrap();
    control
        .add_fault(FaultRule::new(Some("DELETE"), "/volumes/", FaultAction::LoseAnswer).times(1));
    // as the provisioner does: again while Cinder still deletes the
    // snapshot (FailedPrecondition)
    let started = Instant::now();
    while let Err(s) =
        e.c.delete_volume(csi::DeleteVolumeRequest {
            volume_id: v.volume_id.clone(),
            ..Default::default()
        })
        .await
    {
        assert!(
            s.code() == Code::FailedPrecondition && started.elapsed() < Duration::from_secs(30),
            "{s:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let gone = async {
        while !e.named("lost-create").await.is_empty() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(30), gone)
        .await
        .expect("the volume is deleted");
}

/// A throttled and busy cloud: every RPC is answered, with a retryable
/// code when the cloud asks to wait longer than the caller can, and a
/// wave of creates costs the cloud about one create each.
#[tokio::test]
async fn a_throttled_and_busy_cloud_gets_about_one_call_per_operation_and_retryable_answers() {
    if !root() {
        return;
    }
    const CREATES: usize = 20;
    let mut e = env().await;
    let control = e.h.emulator.control();
    control.clear_calls();
    control.add_fault(FaultRule::new(
        Some("POST"),
        "/volumes",
        FaultAction::Throttle {
            per_second: 4.0,
            burst: 2,
            hint: RetryHint::XRetryAfter,
        },
    ));
    let started = Instant::now();
    let creates: Vec<_> = (0..CREATES)
        .map(|i| {
            let mut c = e.c.clone();
            tokio::spawn(async move {
                // as the provisioner does: the same request again after a
                // retryable answer
                loop {
                    let r = timed(
                        create_req(&format!("wave-{i}"), cap(), 1),
                        Duration::from_secs(30),
                    );
                    match c.create_volume(r).await {
                        Ok(v) => return v.into_inner().volume.unwrap().volume_id,
                        Err(s) if s.code() == Code::Unavailable => {
                            tokio::time::sleep(Duration::from_secs(1)).await
                        }
                        Err(s) => panic!("wave-{i}: {s:?}"),
                    }
                }
            })
        })
        .collect();
    let mut ids = Vec::new();
    for c in creates {
        ids.push(c.await.unwrap());
    }
    let posts = calls(&e, "POST", "/volumes");
    println!(
        "{CREATES} creates against 4 per second: {posts} POSTs ({:.2} per volume) in {:?}",
        posts as f64 / CREATES as f64,
        started.elapsed()
    );
    for i in 0..CREATES {
        assert_eq!(e.named(&format!("wave-{i}")).await.len(), 1, "wave-{i}");
    }
    // one per volume, the refusals of the first burst (sent before
    // anything was known: all but the limiter's burst of 2), and few more
    assert!(
        posts <= CREATES + (CREATES - 2) + CREATES / 4,
        "{posts} POSTs for {CREATES} volumes"
    );
    control.clear_faults();

    // Nova busy with the server for longer than the caller waits: a
    // retryable answer, and the attach once the server is free
    let server = e.h.node_id.clone();
    control.add_fault(FaultRule::new(
        Some("POST"),
        "/os-volume_attachments",
        FaultAction::Status {
            status: 409,
            message: Some(format!(
                "Cannot 'attach_volume' instance {server} while it is in task_state rebuilding"
            )),
            retry_after: None,
            hint: RetryHint::None,
        },
    ));
    let err =
        e.c.controller_publish_volume(timed(publish_req(&e, &ids[0]), Duration::from_secs(3)))
            .await
            .unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{}", err.message());
    assert!(err.message().contains("task_state"), "{}", err.message());
    control.clear_faults();
    e.publish(&ids[0], cap()).await;

    // a rate limiter asking for a minute: answered at once, retryable,
    // and nothing more is sent to it meanwhile
    control.add_fault(
        FaultRule::new(
            Some("GET"),
            &format!("/volumes/{}", ids[1]),
            FaultAction::Status {
                status: 429,
                message: Some("Rate limit exceeded".into()),
                retry_after: Some(60),
                hint: RetryHint::XRateLimitRetryAfter,
            },
        )
        .times(1),
    );
    let started = Instant::now();
    let err =
        e.c.controller_publish_volume(timed(publish_req(&e, &ids[1]), Duration::from_secs(10)))
            .await
            .unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{}", err.message());
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    let before = calls(&e, "GET", &format!("/volumes/{}", ids[1]));
    let err =
        e.c.controller_publish_volume(timed(publish_req(&e, &ids[1]), Duration::from_secs(5)))
            .await
            .unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{}", err.message());
    assert_eq!(
        calls(&e, "GET", &format!("/volumes/{}", ids[1])),
        before,
        "not sent while the cloud asked to wait"
    );
}
