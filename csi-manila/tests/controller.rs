//! `manila-csi-plugin`'s controller through its socket against the
//! emulator's Manila: safe access rules, read-only rules, snapshots,
//! restores and clones, lists, expansion and capacity, calls without
//! secrets, Manila's failures leaving nothing behind, and topology.
//! Tests needing root return early (and say so) without it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::time::Duration;

use openstack_client::manila::CreateShare;
use openstack_emulator::{Delays, FaultAction, FaultRule};
use proto::csi::v1 as csi;
use proto::csi::v1::volume_capability::access_mode::Mode;
use tonic::Code;

mod common;
use common::*;

// ------------------------------------------------------------ controller

#[tokio::test]
async fn nfs_access_is_never_opened_without_being_asked() {
    let rc_dir = tempfile::tempdir().unwrap();
    let rc = rc_dir.path().join("runtime.json");
    std::fs::write(&rc, "{}").unwrap();
    let rc_flag = format!("--runtime-config-file={}", rc.display());
    let mut e = env_with("NFS", |o| {
        o.stand_ins = false;
        o.extra_args.push(rc_flag);
    })
    .await;
    e.h.emulator.control().clear_calls();
    let err =
        e.c.create_volume(e.create_req("pvc-open", 1, &[]))
            .await
            .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message().contains("nfs-shareClient"),
        "{}",
        err.message()
    );
    assert!(
        !e.share_calls().iter().any(|c| c.starts_with("POST")),
        "nothing created: {:?}",
        e.share_calls()
    );
    // the runtime configuration's default applies at once
    std::fs::write(&rc, r#"{"nfs":{"defaultShareClient":"192.168.10.0/24"}}"#).unwrap();
    let v = e.create("pvc-default", 1, &[]).await;
    let rules = e.manila.list_access_rules(&v.volume_id).await.unwrap();
    assert_eq!(rules.len(), 1);
    assert_eq!(rules[0].access_to, "192.168.10.0/24");
    // the world only when written
    let w = e
        .create("pvc-world", 1, &[("nfs-shareClient", "0.0.0.0/0")])
        .await;
    assert_eq!(
        e.manila.list_access_rules(&w.volume_id).await.unwrap()[0].access_to,
        "0.0.0.0/0"
    );
}

#[tokio::test]
async fn a_share_only_ever_read_gets_read_only_rules() {
    for protocol in ["NFS", "CEPHFS"] {
        let mut e = env_with(protocol, |o| o.stand_ins = false).await;
        let clients = [("nfs-shareClient", "10.0.0.0/24")];
        for (i, (modes, want)) in [
            (vec![Mode::MultiNodeReaderOnly], "ro"),
            (
                vec![Mode::SingleNodeReaderOnly, Mode::MultiNodeReaderOnly],
                "ro",
            ),
            (
                vec![Mode::MultiNodeReaderOnly, Mode::MultiNodeMultiWriter],
                "rw",
            ),
            (vec![Mode::SingleNodeWriter], "rw"),
        ]
        .into_iter()
        .enumerate()
        {
            let mut req = e.create_req(&format!("pvc-{i}"), 1, &clients);
            req.volume_capabilities = modes.iter().map(|m| mount_cap(*m, &[])).collect();
            let v =
                e.c.create_volume(req.clone())
                    .await
                    .unwrap()
                    .into_inner()
                    .volume
                    .unwrap();
            let rules = e.manila.list_access_rules(&v.volume_id).await.unwrap();
            assert_eq!(rules.len(), 1, "{protocol} {modes:?}: {rules:?}");
            assert_eq!(rules[0].access_level, want, "{protocol} {modes:?}");
            // a retry finds the rule it granted and grants no other
            e.c.create_volume(req).await.unwrap();
            assert_eq!(
                e.manila
                    .list_access_rules(&v.volume_id)
                    .await
                    .unwrap()
                    .len(),
                1
            );
            e.delete(&v.volume_id).await.unwrap();
        }
    }
}

#[tokio::test]
async fn snapshots_restores_and_clones() {
    let mut e = env_with("NFS", |o| {
        o.stand_ins = false;
        o.extra_args
            .push("--default-nfs-share-client=10.0.0.0/8".into());
    })
    .await;
    let src = e.create("pvc-src", 1, &[]).await;
    let snap_req =
        |name: &str, source: &str, s: &HashMap<String, String>| csi::CreateSnapshotRequest {
            source_volume_id: source.into(),
            name: name.into(),
            secrets: s.clone(),
            parameters: params(&[("csi.storage.k8s.io/volumesnapshot/name", "snap")]),
        };
    let s1 =
        e.c.create_snapshot(snap_req("snap-1", &src.volume_id, &e.secrets))
            .await
            .unwrap()
            .into_inner()
            .snapshot
            .unwrap();
    assert!(s1.ready_to_use);
    assert_eq!(s1.source_volume_id, src.volume_id);
    assert_eq!(s1.size_bytes, GIB);
    assert!(s1.creation_time.is_some());
    let again =
        e.c.create_snapshot(snap_req("snap-1", &src.volume_id, &e.secrets))
            .await
            .unwrap()
            .into_inner()
            .snapshot
            .unwrap();
    assert_eq!(again.snapshot_id, s1.snapshot_id);
    let other = e.create("pvc-other", 1, &[]).await;
    let err =
        e.c.create_snapshot(snap_req("snap-1", &other.volume_id, &e.secrets))
            .await
            .unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists);

    // lists: by id, by source, paginated
    let list = |e: &Env, id: &str, src: &str, max: i32, token: &str| {
        let mut c = e.c.clone();
        let req = csi::ListSnapshotsRequest {
            max_entries: max,
            starting_token: token.into(),
            source_volume_id: src.into(),
            snapshot_id: id.into(),
            secrets: e.secrets.clone(),
        };
        async move { c.list_snapshots(req).await.map(|r| r.into_inner()) }
    };
    let by_id = list(&e, &s1.snapshot_id, "", 0, "").await.unwrap();
    assert_eq!(by_id.entries.len(), 1);
    assert!(
        list(&e, "00000000-0000-4000-8000-000000000000", "", 0, "")
            .await
            .unwrap()
            .entries
            .is_empty()
    );
    assert!(
        list(&e, "", &other.volume_id, 0, "")
            .await
            .unwrap()
            .entries
            .is_empty()
    );
    let s2 =
        e.c.create_snapshot(snap_req("snap-2", &other.volume_id, &e.secrets))
            .await
            .unwrap()
            .into_inner()
            .snapshot
            .unwrap();
    let mut seen = Vec::new();
    let mut token = String::new();
    loop {
        let page = list(&e, "", "", 1, &token).await.unwrap();
        assert!(page.entries.len() <= 1);
        seen.extend(
            page.entries
                .into_iter()
                .map(|x| x.snapshot.unwrap().snapshot_id),
        );
        if page.next_token.is_empty() {
            break;
        }
        token = page.next_token;
    }
    assert!(
        seen.contains(&s1.snapshot_id) && seen.contains(&s2.snapshot_id),
        "{seen:?}"
    );
    assert_eq!(
        list(&e, "", "", 0, "bogus").await.unwrap_err().code(),
        Code::Aborted
    );

    // restore into a larger share
    let mut req = e.create_req("pvc-restored", 3, &[]);
    req.volume_content_source = Some(csi::VolumeContentSource {
        r#type: Some(csi::volume_content_source::Type::Snapshot(
            csi::volume_content_source::SnapshotSource {
                snapshot_id: s1.snapshot_id.clone(),
            },
        )),
    });
    let restored =
        e.c.create_volume(req.clone())
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
    assert_eq!(restored.capacity_bytes, 3 * GIB);
    assert_eq!(restored.content_source, req.volume_content_source);
    let share = e.manila.get_share(&restored.volume_id).await.unwrap();
    assert_eq!(share.snapshot_id.as_deref(), Some(s1.snapshot_id.as_str()));
    assert_eq!(share.size, 3);
    // made at the snapshot's size, then extended: the resize a backend
    // runs on extend, and may skip on a larger clone, is always run. A
    // share's actions are its access grants and its extends: one more
    // than for a restore at the snapshot's own size
    let mut same = e.create_req("pvc-same-size", 1, &[]);
    same.volume_content_source = req.volume_content_source.clone();
    let same =
        e.c.create_volume(same)
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
    let actions = |id: &str| {
        let path = format!("/shares/{id}/action");
        e.h.emulator
            .control()
            .calls()
            .into_iter()
            .filter(|c| c.method == "POST" && c.path.ends_with(&path))
            .count()
    };
    assert_eq!(
        actions(&restored.volume_id),
        actions(&same.volume_id) + 1,
        "the larger restore is extended once"
    );
    assert_eq!(
        e.c.create_volume(req)
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap()
            .volume_id,
        restored.volume_id
    );

    // a clone: through a temporary snapshot that is gone afterwards
    let mut req = e.create_req("pvc-clone", 1, &[]);
    req.volume_content_source = Some(csi::VolumeContentSource {
        r#type: Some(csi::volume_content_source::Type::Volume(
            csi::volume_content_source::VolumeSource {
                volume_id: src.volume_id.clone(),
            },
        )),
    });
    let clone =
        e.c.create_volume(req.clone())
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
    assert_eq!(clone.content_source, req.volume_content_source);
    // Manila deletes the temporary snapshot on its own time
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !e
        .manila
        .list_snapshots_named("pvc-clone-clone-source")
        .await
        .unwrap()
        .is_empty()
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the temporary snapshot is never removed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let again =
        e.c.create_volume(req)
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
    assert_eq!(again.volume_id, clone.volume_id);

    // a share with snapshots cannot go; without them, at once
    let err = e.delete(&src.volume_id).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{}", err.message());
    e.c.delete_snapshot(csi::DeleteSnapshotRequest {
        snapshot_id: s1.snapshot_id.clone(),
        secrets: e.secrets.clone(),
    })
    .await
    .unwrap();
    assert!(
        list(&e, &s1.snapshot_id, "", 0, "")
            .await
            .unwrap()
            .entries
            .is_empty()
    );
    e.delete(&src.volume_id).await.unwrap();

    // a type without snapshots says so
    let plain = e.create("pvc-nosnap", 1, &[("type", "no-snapshots")]).await;
    let err =
        e.c.create_snapshot(snap_req("snap-3", &plain.volume_id, &e.secrets))
            .await
            .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert!(
        err.message().contains("snapshot_support"),
        "{}",
        err.message()
    );
    let mut req = e.create_req("pvc-noclone", 1, &[]);
    req.volume_content_source = Some(csi::VolumeContentSource {
        r#type: Some(csi::volume_content_source::Type::Volume(
            csi::volume_content_source::VolumeSource {
                volume_id: plain.volume_id.clone(),
            },
        )),
    });
    let err = e.c.create_volume(req).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{}", err.message());
}

#[tokio::test]
async fn lists_gets_expansion_capacity_and_validation() {
    let mut e = env_with("CEPHFS", |o| o.stand_ins = false).await;
    let caps =
        e.c.controller_get_capabilities(csi::ControllerGetCapabilitiesRequest {})
            .await
            .unwrap()
            .into_inner()
            .capabilities;
    assert!(
        caps.len() >= 10,
        "with --cloud-config every capability: {caps:?}"
    );
    let mut ids = Vec::new();
    for i in 0..3 {
        ids.push(
            e.create(&format!("pvc-list-{i}"), 1, &[("type", "cephfs")])
                .await
                .volume_id,
        );
    }
    let mut seen = Vec::new();
    let mut token = String::new();
    loop {
        let page =
            e.c.list_volumes(csi::ListVolumesRequest {
                max_entries: 2,
                starting_token: token.clone(),
            })
            .await
            .unwrap()
            .into_inner();
        assert!(page.entries.len() <= 2);
        for en in page.entries {
            assert!(!en.status.unwrap().volume_condition.unwrap().abnormal);
            seen.push(en.volume.unwrap().volume_id);
        }
        if page.next_token.is_empty() {
            break;
        }
        token = page.next_token;
    }
    for id in &ids {
        assert!(seen.contains(id), "{id} missing from {seen:?}");
    }
    let got =
        e.c.controller_get_volume(csi::ControllerGetVolumeRequest {
            volume_id: ids[0].clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.volume.unwrap().volume_id, ids[0]);
    let err =
        e.c.controller_get_volume(csi::ControllerGetVolumeRequest {
            volume_id: "00000000-0000-4000-8000-000000000000".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);

    let grown =
        e.c.controller_expand_volume(csi::ControllerExpandVolumeRequest {
            volume_id: ids[0].clone(),
            capacity_range: Some(csi::CapacityRange {
                required_bytes: 3 * GIB - 5,
                limit_bytes: 0,
            }),
            secrets: e.secrets.clone(),
            volume_capability: Some(rwx()),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(grown.capacity_bytes, 3 * GIB);
    assert!(!grown.node_expansion_required);
    assert_eq!(e.manila.get_share(&ids[0]).await.unwrap().size, 3);

    // a member cannot read Manila's pools: the quota left is the capacity
    let err =
        e.c.get_capacity(csi::GetCapacityRequest::default())
            .await
            .unwrap_err();
    assert_eq!(
        err.code(),
        Code::FailedPrecondition,
        "unknown: {}",
        err.message()
    );
    e.h.emulator
        .control()
        .set_quotas(openstack_emulator::Quotas {
            share_gigabytes: 100,
            ..Default::default()
        });
    let cap =
        e.c.get_capacity(csi::GetCapacityRequest::default())
            .await
            .unwrap()
            .into_inner();
    assert_eq!(cap.available_capacity, (100 - 5) * GIB, "{cap:?}");

    let validate = |caps: Vec<csi::VolumeCapability>| csi::ValidateVolumeCapabilitiesRequest {
        volume_id: ids[1].clone(),
        volume_capabilities: caps,
        secrets: e.secrets.clone(),
        ..Default::default()
    };
    let ok =
        e.c.validate_volume_capabilities(validate(vec![rwx()]))
            .await
            .unwrap()
            .into_inner();
    assert!(ok.confirmed.is_some());
    let block = csi::VolumeCapability {
        access_type: Some(csi::volume_capability::AccessType::Block(
            csi::volume_capability::BlockVolume {},
        )),
        access_mode: Some(csi::volume_capability::AccessMode {
            mode: Mode::MultiNodeMultiWriter as i32,
        }),
    };
    let no =
        e.c.validate_volume_capabilities(validate(vec![block]))
            .await
            .unwrap()
            .into_inner();
    assert!(
        no.confirmed.is_none() && no.message.contains("block"),
        "{no:?}"
    );

    // a share this driver did not provision is never deleted
    let foreign = e
        .manila
        .create_share(&CreateShare {
            protocol: "CEPHFS".into(),
            size_gib: 1,
            name: "hand-made".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while e.manila.get_share(&foreign.id).await.unwrap().status
        != openstack_client::manila::ShareStatus::Available
    {
        assert!(std::time::Instant::now() < deadline, "never available");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let err = e.delete(&foreign.id).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert!(e.manila.get_share(&foreign.id).await.is_ok());
}

#[tokio::test]
async fn without_own_credentials_calls_without_secrets_are_not_advertised() {
    let mut e = env_with("NFS", |o| {
        o.stand_ins = false;
        o.cloud_conf = false;
    })
    .await;
    let caps: Vec<i32> =
        e.c.controller_get_capabilities(csi::ControllerGetCapabilitiesRequest {})
            .await
            .unwrap()
            .into_inner()
            .capabilities
            .into_iter()
            .filter_map(|c| {
                c.r#type
                    .map(|csi::controller_service_capability::Type::Rpc(r)| r.r#type)
            })
            .collect();
    use csi::controller_service_capability::rpc::Type as Rpc;
    assert!(!caps.contains(&(Rpc::ListVolumes as i32)));
    assert!(!caps.contains(&(Rpc::GetVolume as i32)));
    assert!(caps.contains(&(Rpc::CreateDeleteVolume as i32)));
    // secrets carry the credentials
    let v = e
        .create("pvc-secrets", 1, &[("nfs-shareClient", "10.0.0.1")])
        .await;
    // one Keystone session for one credential set
    for i in 0..5 {
        e.create(
            &format!("pvc-more-{i}"),
            1,
            &[("nfs-shareClient", "10.0.0.1")],
        )
        .await;
    }
    let tokens =
        e.h.emulator
            .control()
            .calls()
            .iter()
            .filter(|c| c.method == "POST" && c.path.ends_with("/auth/tokens"))
            .count();
    assert_eq!(tokens, 1, "one token for six creates");
    // a changed secret is used, not a cached session
    let mut wrong = e.secrets.clone();
    wrong.insert("os-password".into(), "not-the-password".into());
    let err =
        e.c.delete_volume(csi::DeleteVolumeRequest {
            volume_id: v.volume_id.clone(),
            secrets: wrong,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated, "{}", err.message());
    e.delete(&v.volume_id).await.unwrap();
}

#[tokio::test]
async fn manila_failures_are_explained_and_leave_nothing() {
    let mut e = env_with("NFS", |o| {
        o.stand_ins = false;
        o.extra_args
            .push("--default-nfs-share-client=10.0.0.0/8".into());
    })
    .await;
    // the scheduler finds no backend: the user message decides the code
    let err =
        e.c.create_volume(e.create_req("pvc-huge", 5000, &[]))
            .await
            .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{}", err.message());
    assert!(err.message().contains("Capacity"), "{}", err.message());
    // a scheduler refusal that may be a backend's missed report is tried
    // once more; twice is a final answer the provisioner retries with its
    // usual backoff (not InvalidArgument, after which it waits five minutes)
    e.h.emulator.control().fail_next_share_creates(1);
    let v = e.create("pvc-once", 1, &[]).await;
    let named = e.manila.list_shares_named("pvc-once").await.unwrap();
    assert_eq!(named.len(), 1, "{named:?}");
    assert_eq!(named[0].id, v.volume_id);
    e.h.emulator.control().fail_next_share_creates(2);
    let err =
        e.c.create_volume(e.create_req("pvc-fails", 1, &[]))
            .await
            .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{}", err.message());
    assert!(
        err.message().contains("Capabilities filter") && err.message().contains("twice"),
        "{}",
        err.message()
    );
    // refused once with too little of the deadline left to ask again: the
    // same final answer, not the first refusal's InvalidArgument
    e.h.emulator.control().fail_next_share_creates(1);
    let mut short = tonic::Request::new(e.create_req("pvc-late", 1, &[]));
    short.set_timeout(Duration::from_secs(10));
    let err = e.c.create_volume(short).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{}", err.message());
    assert!(
        err.message().contains("Capabilities filter") && err.message().contains("too little"),
        "{}",
        err.message()
    );
    // the failed shares are deleted (Manila takes its time to)
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    for name in ["pvc-huge", "pvc-fails", "pvc-late"] {
        while !e.manila.list_shares_named(name).await.unwrap().is_empty() {
            assert!(
                std::time::Instant::now() < deadline,
                "the failed share {name} was never deleted"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    // a 500 on create: nothing made; the retry makes one
    let ctl = e.h.emulator.control();
    ctl.add_fault(
        FaultRule::new(
            Some("POST"),
            "/shares",
            FaultAction::Status {
                status: 500,
                message: None,
                retry_after: None,
                hint: Default::default(),
            },
        )
        .times(1),
    );
    let err =
        e.c.create_volume(e.create_req("pvc-500", 1, &[]))
            .await
            .unwrap_err();
    assert!(
        matches!(err.code(), Code::Internal | Code::Unavailable),
        "{err}"
    );
    e.create("pvc-500", 1, &[]).await;
    assert_eq!(
        e.manila.list_shares_named("pvc-500").await.unwrap().len(),
        1
    );

    // slower than the caller's deadline: DeadlineExceeded, the retry
    // resumes the wait and finds the same share
    ctl.set_delays(Delays {
        share_create_ms: 1500,
        ..Delays::default()
    });
    let err =
        e.c.create_volume(timed(
            e.create_req("pvc-slow", 1, &[]),
            Duration::from_millis(600),
        ))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::DeadlineExceeded, "{}", err.message());
    ctl.set_delays(Delays::default());
    let v = e.create("pvc-slow", 1, &[]).await;
    let named = e.manila.list_shares_named("pvc-slow").await.unwrap();
    assert_eq!(named.len(), 1);
    assert_eq!(named[0].id, v.volume_id);

    // a dropped connection on the create and on the grant: the retry
    // finds what was made, never a second one
    ctl.add_fault(FaultRule::new(Some("POST"), "/shares", FaultAction::Drop).times(1));
    let _ =
        e.c.create_volume(e.create_req("pvc-drop", 1, &[]))
            .await
            .unwrap_err();
    ctl.add_fault(FaultRule::new(Some("POST"), "/action", FaultAction::Drop).times(1));
    let _ = e.c.create_volume(e.create_req("pvc-drop", 1, &[])).await;
    let v = e.create("pvc-drop", 1, &[]).await;
    assert_eq!(
        e.manila.list_shares_named("pvc-drop").await.unwrap().len(),
        1
    );
    assert_eq!(
        e.manila
            .list_access_rules(&v.volume_id)
            .await
            .unwrap()
            .len(),
        1
    );
}

#[tokio::test]
async fn topology_follows_the_node_and_auto_topology() {
    let mut e = env_with("NFS", |o| {
        o.stand_ins = false;
        o.extra_args
            .push("--default-nfs-share-client=10.0.0.0/8".into());
    })
    .await;
    let info =
        e.n.node_get_info(csi::NodeGetInfoRequest {})
            .await
            .unwrap()
            .into_inner();
    assert_eq!(info.node_id, e.h.node_id);
    assert_eq!(
        info.accessible_topology.unwrap().segments["topology.manila.csi.openstack.org/zone"],
        "nova"
    );
    let zone_b = csi::Topology {
        segments: HashMap::from([(
            "topology.manila.csi.openstack.org/zone".to_string(),
            "zone-b".to_string(),
        )]),
    };
    let mut req = e.create_req("pvc-auto", 1, &[("autoTopology", "true")]);
    req.accessibility_requirements = Some(csi::TopologyRequirement {
        requisite: vec![zone_b.clone()],
        preferred: vec![zone_b.clone()],
    });
    let v =
        e.c.create_volume(req)
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
    assert_eq!(v.accessible_topology, vec![zone_b]);
    assert_eq!(
        e.manila
            .get_share(&v.volume_id)
            .await
            .unwrap()
            .availability_zone
            .as_deref(),
        Some("zone-b")
    );
}

/// An extend the project's share quota refuses (Manila's 403) is
/// infeasible (OutOfRange: Kubernetes then lets the user lower the claim's
/// request, KEP-1790), changes nothing, and a smaller size the quota
/// allows then succeeds; once the quota is raised, the first size too.
#[tokio::test]
async fn an_expansion_the_quota_refuses_is_infeasible_and_a_smaller_one_then_succeeds() {
    let mut e = env_with("CEPHFS", |o| o.stand_ins = false).await;
    let id = e
        .create("pvc-grows", 1, &[("type", "cephfs")])
        .await
        .volume_id;
    let expand = |gib: i64| csi::ControllerExpandVolumeRequest {
        volume_id: id.clone(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: gib * GIB,
            limit_bytes: 0,
        }),
        secrets: e.secrets.clone(),
        volume_capability: Some(rwx()),
    };
    e.h.emulator
        .control()
        .set_quotas(openstack_emulator::Quotas {
            share_gigabytes: 4,
            ..Default::default()
        });
    let err = e.c.controller_expand_volume(expand(10)).await.unwrap_err();
    assert_eq!(err.code(), Code::OutOfRange, "{}", err.message());
    for word in ["quota", "lower the claim's request", "from 1 to 10 GiB"] {
        assert!(err.message().contains(word), "{word}: {}", err.message());
    }
    let after = e.manila.get_share(&id).await.unwrap();
    assert_eq!(
        (after.size, after.status.to_string()),
        (1, "available".to_string())
    );

    let grown =
        e.c.controller_expand_volume(expand(3))
            .await
            .unwrap()
            .into_inner();
    assert_eq!(grown.capacity_bytes, 3 * GIB);
    assert_eq!(e.manila.get_share(&id).await.unwrap().size, 3);

    e.h.emulator
        .control()
        .set_quotas(openstack_emulator::Quotas::default());
    let grown =
        e.c.controller_expand_volume(expand(10))
            .await
            .unwrap()
            .into_inner();
    assert_eq!(grown.capacity_bytes, 10 * GIB);
}
