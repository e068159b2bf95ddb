//! `cinder-csi-plugin`'s attach limit through its socket against the
//! emulator: `[BlockStorage] node-volume-attach-limit` where Nova sets
//! none, Nova's own disk limit, publishes at once and a moment apart onto
//! one server, and what the node reports. Tests needing root return early
//! without it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use csi_sanity::harness::{CinderOnEmulator, HarnessOptions};
use openstack_emulator::{FaultAction, FaultRule};
use proto::csi::v1 as csi;
use proto::csi::v1::controller_client::ControllerClient;
use proto::csi::v1::node_client::NodeClient;
use proto::csi::v1::volume_capability::access_mode::Mode;
use tonic::Code;
use tonic::transport::Channel;

mod common;
use common::*;

/// The plugin on the emulator with `[BlockStorage]
/// node-volume-attach-limit = limit`, ready, and a channel to it.
async fn with_attach_limit(limit: u32) -> (CinderOnEmulator, Channel) {
    let mut o = HarnessOptions::new(BIN);
    o.extra_cloud_conf = format!("\n[BlockStorage]\nnode-volume-attach-limit = {limit}\n");
    let h = CinderOnEmulator::start(o).await.unwrap();
    let ch = plugin_runtime::connect_unix(&h.socket).await.unwrap();
    csi_sanity::harness::wait_until_ready(&h.socket)
        .await
        .unwrap();
    (h, ch)
}

/// Where Nova sets no limit (its default), the controller keeps the
/// server within `[BlockStorage] node-volume-attach-limit`, counting the
/// server's own disks as Nova does; the node reports the same limit less
/// the disks Kubernetes does not manage, live: a volume attached and not
/// staged (by hand) takes one, a staged one does not.
#[tokio::test]
async fn the_attach_limit_holds_without_nova_and_the_node_reports_what_is_left() {
    if !root() {
        return;
    }
    let (h, ch) = with_attach_limit(4).await;
    let (mut c, mut n) = (ControllerClient::new(ch.clone()), NodeClient::new(ch));
    let own = csi_sanity::harness::cinder::own_disks_of_this_machine() as i64;
    let max = |n: &mut NodeClient<Channel>| {
        let mut n = n.clone();
        async move {
            n.node_get_info(csi::NodeGetInfoRequest {})
                .await
                .unwrap()
                .into_inner()
                .max_volumes_per_node
        }
    };
    assert_eq!(
        max(&mut n).await,
        4 - own,
        "the limit less the server's own disks"
    );
    let cap = mount_cap("ext4", Mode::SingleNodeWriter);
    let fits = (4 - own) as usize;
    let mut ids = Vec::new();
    for i in 0..=fits {
        let v = c
            .create_volume(create_req(&format!("lim-{i}"), cap.clone(), 1))
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
        ids.push(v);
    }
    let publish = |id: &str| csi::ControllerPublishVolumeRequest {
        volume_id: id.into(),
        node_id: h.node_id.clone(),
        volume_capability: Some(cap.clone()),
        ..Default::default()
    };
    // attached and not staged: the node counts it as not Kubernetes'
    c.controller_publish_volume(publish(&ids[0].volume_id))
        .await
        .unwrap();
    assert_eq!(max(&mut n).await, 4 - own - 1, "a volume attached by hand");
    // staged: Kubernetes' own again
    let (staging, _) = h.paths(&ids[0].volume_id);
    n.node_stage_volume(csi::NodeStageVolumeRequest {
        volume_id: ids[0].volume_id.clone(),
        staging_target_path: staging.to_string_lossy().into(),
        volume_capability: Some(cap.clone()),
        volume_context: ids[0].volume_context.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    assert_eq!(max(&mut n).await, 4 - own);
    for v in &ids[1..fits] {
        c.controller_publish_volume(publish(&v.volume_id))
            .await
            .unwrap();
    }
    // one more: refused, and nothing attached
    let last = &ids[fits].volume_id;
    let err = c
        .controller_publish_volume(publish(last))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{}", err.message());
    assert!(
        err.message().contains("node-volume-attach-limit"),
        "{}",
        err.message()
    );
    let v = cinder_of(&h).get_volume(last).await.unwrap();
    assert!(v.attachments.is_empty(), "{v:?}");
    n.node_unstage_volume(csi::NodeUnstageVolumeRequest {
        volume_id: ids[0].volume_id.clone(),
        staging_target_path: staging.to_string_lossy().into(),
    })
    .await
    .unwrap();
}

/// Publishes to one server at once, more than its limit takes, while
/// Nova answers each call late (so that every publish counts the server's
/// disks while the others' attaches are on their way): exactly as many as
/// fit are attached, the others refused, never one more.
#[tokio::test]
async fn publishes_to_one_server_at_once_never_pass_its_limit() {
    if !root() {
        return;
    }
    let (h, ch) = with_attach_limit(6).await;
    let c = ControllerClient::new(ch);
    let own = csi_sanity::harness::cinder::own_disks_of_this_machine() as usize;
    let fits = 6 - own;
    let cap = mount_cap("ext4", Mode::SingleNodeWriter);
    let mut ids = Vec::new();
    for i in 0..fits + 4 {
        ids.push(
            c.clone()
                .create_volume(create_req(&format!("burst-{i}"), cap.clone(), 1))
                .await
                .unwrap()
                .into_inner()
                .volume
                .unwrap()
                .volume_id,
        );
    }
    h.emulator.control().add_fault(FaultRule::new(
        None,
        "/servers/",
        FaultAction::Delay { millis: 100 },
    ));
    let mut publishes = tokio::task::JoinSet::new();
    for id in &ids {
        let mut c = c.clone();
        let r = csi::ControllerPublishVolumeRequest {
            volume_id: id.clone(),
            node_id: h.node_id.clone(),
            volume_capability: Some(cap.clone()),
            ..Default::default()
        };
        publishes.spawn(async move { c.controller_publish_volume(r).await.map(drop) });
    }
    let answers = publishes.join_all().await;
    let ok = answers.iter().filter(|a| a.is_ok()).count();
    let refused: Vec<&tonic::Status> = answers.iter().filter_map(|a| a.as_ref().err()).collect();
    assert!(
        refused.iter().all(|s| s.code() == Code::ResourceExhausted),
        "{refused:?}"
    );
    let cinder = cinder_of(&h);
    let mut attached = 0;
    for id in &ids {
        if !cinder.get_volume(id).await.unwrap().attachments.is_empty() {
            attached += 1;
        }
    }
    assert_eq!(
        (ok, attached),
        (fits, fits),
        "as many publishes answered OK and volumes attached as fit"
    );
}

/// Publishes to one server a moment apart share one listing of it (the
/// attach-detach controller sends a wave's over a few seconds, and each
/// listing is two Nova calls); a slot a detach freed since is still seen:
/// a publish the reused listing would refuse lists the server afresh.
#[tokio::test]
async fn publishes_a_moment_apart_share_a_listing_and_a_freed_slot_is_seen() {
    if !root() {
        return;
    }
    let (h, ch) = with_attach_limit(5).await;
    let mut c = ControllerClient::new(ch);
    let own = csi_sanity::harness::cinder::own_disks_of_this_machine() as usize;
    let fits = 5 - own;
    let cap = mount_cap("ext4", Mode::SingleNodeWriter);
    let mut ids = Vec::new();
    for i in 0..=fits {
        ids.push(
            c.create_volume(create_req(&format!("apart-{i}"), cap.clone(), 1))
                .await
                .unwrap()
                .into_inner()
                .volume
                .unwrap()
                .volume_id,
        );
    }
    let listings = || {
        h.emulator
            .control()
            .calls()
            .iter()
            .filter(|r| r.method == "GET" && r.path.ends_with(&format!("/servers/{}", h.node_id)))
            .count()
    };
    let publish = |id: &str| csi::ControllerPublishVolumeRequest {
        volume_id: id.into(),
        node_id: h.node_id.clone(),
        volume_capability: Some(cap.clone()),
        ..Default::default()
    };
    // the first lists the server beside its read of the volume, not after
    h.emulator.control().add_fault(
        FaultRule::new(
            Some("GET"),
            &format!("/volumes/{}", ids[0]),
            FaultAction::Delay { millis: 300 },
        )
        .times(1),
    );
    // one after another, each answered before the next is asked
    for id in &ids[..fits] {
        c.controller_publish_volume(publish(id)).await.unwrap();
    }
    assert_eq!(
        listings(),
        1,
        "{fits} publishes a moment apart, one listing"
    );
    // asked again once attached (the external attacher does, once its
    // cache shows the attach): no listing, and Nova's record of the
    // attachment not read again (this controller asked Nova for it)
    let nova_reads = || {
        h.emulator
            .control()
            .calls()
            .iter()
            .filter(|r| {
                r.method == "GET"
                    && r.path
                        .contains(&format!("/servers/{}/os-volume_attachments", h.node_id))
            })
            .count()
    };
    let reads = nova_reads();
    c.controller_publish_volume(publish(&ids[1])).await.unwrap();
    assert_eq!((listings(), nova_reads()), (1, reads));
    let calls = h.emulator.control().calls();
    let first = |what: &dyn Fn(&openstack_emulator::CallRecord) -> bool| {
        calls
            .iter()
            .find(|r| r.method == "GET" && what(r))
            .cloned()
            .unwrap()
    };
    // the publish's read, held 300 ms by the fault
    let read = first(&|r| r.path.ends_with(&format!("/volumes/{}", ids[0])) && r.took_ms >= 300);
    let listing = first(&|r| r.path.ends_with(&format!("/servers/{}", h.node_id)));
    assert!(
        listing.at_ms - listing.took_ms < read.at_ms,
        "the server listed only after the volume's read was answered: {read:?} {listing:?}"
    );
    // full: one detached, and the last fits though the listing still
    // reused shows the detached one
    c.controller_unpublish_volume(csi::ControllerUnpublishVolumeRequest {
        volume_id: ids[0].clone(),
        node_id: h.node_id.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    c.controller_publish_volume(publish(&ids[fits]))
        .await
        .unwrap();
    assert_eq!(listings(), 2, "listed afresh before refusing");
    // and full again: refused, on a fresh count
    let err = c
        .controller_publish_volume(publish(&ids[0]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{}", err.message());
}

#[tokio::test]
async fn publishing_past_novas_disk_limit_is_resource_exhausted_and_attaches_nothing() {
    if !root() {
        return;
    }
    let mut e = env().await;
    // Nova counts the root disk: three data volumes fit in four devices
    e.h.emulator.control().set_max_disk_devices(4);
    let cap = block_cap(Mode::SingleNodeWriter);
    let mut ids = Vec::new();
    for i in 0..4 {
        ids.push(
            e.create(&format!("full-{i}"), cap.clone(), 1)
                .await
                .volume_id,
        );
    }
    for id in &ids[..3] {
        e.publish(id, cap.clone()).await;
    }
    let node_id = e.h.node_id.clone();
    let publish = |id: &str| csi::ControllerPublishVolumeRequest {
        volume_id: id.into(),
        node_id: node_id.clone(),
        volume_capability: Some(cap.clone()),
        ..Default::default()
    };
    let req = publish(&ids[3]);
    let err = e.c.controller_publish_volume(req).await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{}", err.message());
    let last = e.cinder.get_volume(&ids[3]).await.unwrap();
    assert_eq!(last.status.as_str(), "available");
    assert!(last.attachments.is_empty(), "{:?}", last.attachments);
    // room again once one is detached
    e.unpublish(&ids[0]).await;
    let req = publish(&ids[3]);
    e.c.controller_publish_volume(req).await.unwrap();
    for id in &ids[1..] {
        e.unpublish(id).await;
    }
}
