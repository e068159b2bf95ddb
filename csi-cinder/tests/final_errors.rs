//! A final error leaves nothing behind. The sidecars and kubelet treat
//! every code but Canceled, DeadlineExceeded, Unavailable,
//! ResourceExhausted and Aborted as final: after one, the external
//! provisioner forgets a CreateVolume whose claim is then deleted, the
//! attacher a ControllerPublish, and kubelet never calls NodeUnstage or
//! NodeUnpublish for a stage or publish that failed so. Whatever such a
//! call made before it failed would leak for good. Each case here drives
//! an RPC as its caller does (the same request again after a retryable
//! answer) until a final answer, and then checks that nothing it could
//! have made remains: no volume or snapshot of its name, no attachment
//! of the volume to the node (in Cinder or Nova), no mount at its path.
//! Tests needing root return early (and say so) without it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Duration;

use openstack_emulator::{FaultAction, FaultRule, RetryHint};
use proto::csi::v1 as csi;
use proto::csi::v1::volume_capability::access_mode::Mode;
use tonic::{Code, Status};

mod common;
use common::*;

/// The codes the sidecars and kubelet call again after.
fn retryable(code: Code) -> bool {
    matches!(
        code,
        Code::Cancelled
            | Code::DeadlineExceeded
            | Code::Unavailable
            | Code::ResourceExhausted
            | Code::Aborted
    )
}

/// Calls until an answer that is not retryable (at most 20 times): that
/// answer, which each case expects to be a final error.
async fn until_final<T, F, Fut>(what: &str, mut call: F) -> Status
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, Status>>,
{
    for _ in 0..20 {
        match call().await {
            Ok(_) => panic!("{what}: answered OK, the case expects a final error"),
            Err(s) if retryable(s.code()) => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(s) => return s,
        }
    }
    panic!("{what}: still retryable after 20 calls")
}

/// No volume named `name` remains (those being deleted may take a moment
/// to go).
async fn no_volume_named(e: &Env, name: &str, after: &Status) {
    let mut left = Vec::new();
    for _ in 0..100 {
        left = e
            .cinder
            .volumes_named(name)
            .await
            .unwrap()
            .into_iter()
            .map(|v| format!("{} {}", v.id, v.status))
            .collect();
        if left.is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "CreateVolume {name} answered {:?} ({}), and left {left:?}",
        after.code(),
        after.message()
    );
}

/// The volume is attached to the node neither in Cinder (no attachment,
/// no reservation) nor in Nova.
async fn not_attached(e: &Env, id: &str, after: &Status) {
    let v = e.cinder.get_volume(id).await.unwrap();
    let nova = admin_nova(&e.h)
        .list_volume_attachments(&e.h.node_id)
        .await
        .unwrap()
        .into_iter()
        .filter(|a| a.volume_id == id)
        .count();
    assert!(
        v.attachments.is_empty() && v.status.as_str() == "available" && nova == 0,
        "ControllerPublish of {id} answered {:?} ({}), and left it {} with attachments {:?} in Cinder, {nova} in Nova",
        after.code(),
        after.message(),
        v.status,
        v.attachments
    );
}

/// Nothing is mounted at `path`, in any way.
fn not_mounted(path: &Path, after: &Status) {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let path = path.to_string_lossy();
    let mounts: Vec<&str> = mountinfo
        .lines()
        .filter(|l| l.split(' ').nth(4) == Some(path.as_ref()))
        .collect();
    assert!(
        mounts.is_empty(),
        "answered {:?} ({}), and left mounted at {path}: {mounts:?}",
        after.code(),
        after.message()
    );
}

#[tokio::test]
async fn a_create_answered_with_a_final_error_leaves_no_volume() {
    if !root() {
        return;
    }
    let mut e = env().await;
    let cap = mount_cap("ext4", Mode::SingleNodeWriter);

    // Cinder fails every volume of the name (its scheduler finds no room)
    e.h.emulator.control().fail_next_volume_creates(20);
    let r = create_req("always-fails", cap.clone(), 1);
    let s = until_final("CreateVolume", || {
        let (mut c, r) = (e.c.clone(), r.clone());
        async move { c.create_volume(r).await }
    })
    .await;
    no_volume_named(&e, "always-fails", &s).await;

    // the same, and Cinder refuses the first deletion of the failed
    // volume (as it does while the volume's status is still being
    // updated): the volume is still there, so the answer may not be final
    // yet
    e.h.emulator.control().add_fault(
        FaultRule::new(
            Some("DELETE"),
            "/volumes/",
            FaultAction::Status {
                status: 400,
                message: Some(
                    "Invalid volume: Volume status must be available or error or error_restoring or error_extending or error_managing and must not be migrating, attached, belong to a group, have snapshots, awaiting a transfer, or be disassociated from snapshots after volume transfer.".into(),
                ),
                retry_after: None,
                hint: RetryHint::None,
            },
        )
        .times(1),
    );
    let r = create_req("fails-and-stays", cap.clone(), 1);
    let s = until_final("CreateVolume", || {
        let (mut c, r) = (e.c.clone(), r.clone());
        async move { c.create_volume(r).await }
    })
    .await;
    no_volume_named(&e, "fails-and-stays", &s).await;
    e.h.emulator.control().fail_next_volume_creates(0);

    // a snapshot source that does not exist
    let mut r = create_req("from-nothing", cap.clone(), 1);
    r.volume_content_source = from_snapshot("5bd0e9c2-1b1f-4c8e-9a61-1d6b7a1c0e42");
    let s = until_final("CreateVolume", || {
        let (mut c, r) = (e.c.clone(), r.clone());
        async move { c.create_volume(r).await }
    })
    .await;
    assert_eq!(s.code(), Code::NotFound, "{}", s.message());
    no_volume_named(&e, "from-nothing", &s).await;

    // a volume type Cinder does not know
    let mut r = create_req("no-such-type", cap.clone(), 1);
    r.parameters.insert("type".into(), "no-such-type".into());
    let s = until_final("CreateVolume", || {
        let (mut c, r) = (e.c.clone(), r.clone());
        async move { c.create_volume(r).await }
    })
    .await;
    no_volume_named(&e, "no-such-type", &s).await;

    // a snapshot of a volume in use, without force-create
    let v = e.create("in-use", cap.clone(), 1).await;
    e.publish(&v.volume_id, cap).await;
    let r = snapshot_req(&v.volume_id, "of-in-use", &[]);
    let s = until_final("CreateSnapshot", || {
        let (mut c, r) = (e.c.clone(), r.clone());
        async move { c.create_snapshot(r).await }
    })
    .await;
    assert_eq!(s.code(), Code::FailedPrecondition, "{}", s.message());
    let left = e
        .cinder
        .list_snapshots(&openstack_client::cinder::ListSnapshots {
            name: Some("of-in-use".into()),
            ..Default::default()
        })
        .await
        .unwrap()
        .items;
    assert!(left.is_empty(), "CreateSnapshot left {left:?}");
}

#[tokio::test]
async fn a_publish_answered_with_a_final_error_leaves_no_attachment() {
    if !root() {
        return;
    }
    let mut e = env().await;
    let cap = mount_cap("ext4", Mode::SingleNodeWriter);
    let v = e.create("refused-attach", cap.clone(), 1).await;
    let publish = csi::ControllerPublishVolumeRequest {
        volume_id: v.volume_id.clone(),
        node_id: e.h.node_id.clone(),
        volume_capability: Some(cap.clone()),
        ..Default::default()
    };
    // Nova refuses the attach for good (the server's state forbids it)
    e.h.emulator.control().add_fault(FaultRule::new(
        Some("POST"),
        "/os-volume_attachments",
        FaultAction::Status {
            status: 400,
            message: Some("Invalid volume: the server cannot take this volume".into()),
            retry_after: None,
            hint: RetryHint::None,
        },
    ));
    let s = until_final("ControllerPublish", || {
        let (mut c, r) = (e.c.clone(), publish.clone());
        async move { c.controller_publish_volume(r).await }
    })
    .await;
    not_attached(&e, &v.volume_id, &s).await;
    e.h.emulator.control().clear_faults();

    // a capability the volume cannot give (several writers on a
    // single-attach volume)
    let mut shared = publish.clone();
    shared.volume_capability = Some(block_cap(Mode::MultiNodeMultiWriter));
    let s = until_final("ControllerPublish", || {
        let (mut c, r) = (e.c.clone(), shared.clone());
        async move { c.controller_publish_volume(r).await }
    })
    .await;
    not_attached(&e, &v.volume_id, &s).await;
}

#[tokio::test]
async fn a_stage_or_publish_answered_with_a_final_error_leaves_no_mount() {
    if !root() {
        return;
    }
    let mut e = env().await;
    let ext4 = mount_cap("ext4", Mode::SingleNodeWriter);

    // a mount option the kernel refuses: formatted, then the mount fails
    let v = e.create("bad-option", ext4.clone(), 1).await;
    e.publish(&v.volume_id, ext4.clone()).await;
    let mut refused = ext4.clone();
    if let Some(csi::volume_capability::AccessType::Mount(m)) = refused.access_type.as_mut() {
        m.mount_flags = vec!["no_such_option_here".into()];
    }
    let r = e.stage_req(&v, refused);
    let s = until_final("NodeStage", || {
        let (mut n, r) = (e.n.clone(), r.clone());
        async move { n.node_stage_volume(r).await }
    })
    .await;
    let (staging, target) = e.h.paths(&v.volume_id);
    not_mounted(&staging, &s);

    // another filesystem than the one the device holds
    e.stage(&v, ext4.clone()).await.unwrap();
    e.unstage(&v.volume_id).await;
    let r = e.stage_req(&v, mount_cap("xfs", Mode::SingleNodeWriter));
    let s = until_final("NodeStage", || {
        let (mut n, r) = (e.n.clone(), r.clone());
        async move { n.node_stage_volume(r).await }
    })
    .await;
    assert_eq!(s.code(), Code::FailedPrecondition, "{}", s.message());
    not_mounted(&staging, &s);

    // a publish of a volume that is not staged
    let publish = csi::NodePublishVolumeRequest {
        volume_id: v.volume_id.clone(),
        staging_target_path: staging.to_string_lossy().into(),
        target_path: target.to_string_lossy().into(),
        volume_capability: Some(ext4.clone()),
        volume_context: v.volume_context.clone(),
        ..Default::default()
    };
    let s = until_final("NodePublish", || {
        let (mut n, r) = (e.n.clone(), publish.clone());
        async move { n.node_publish_volume(r).await }
    })
    .await;
    not_mounted(&target, &s);
}
