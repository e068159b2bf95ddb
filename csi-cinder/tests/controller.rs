//! `cinder-csi-plugin`'s controller through its socket against the
//! emulator, beyond the conformance suite: topology, metadata and
//! multi-attach, idempotent creation, quotas and failures, attachments,
//! retypes, snapshots and backups, and faults (the attach limit:
//! `attach_limit.rs`).
//! Tests needing root return early (and say so) without it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::time::Duration;

use openstack_emulator::{Delays, FaultAction, FaultRule, Quotas};
use proto::csi::v1 as csi;
use proto::csi::v1::volume_capability::access_mode::Mode;
use tonic::Code;

mod common;
use common::*;

#[tokio::test]
async fn create_volume_topology_metadata_and_multiattach() {
    if !root() {
        return;
    }
    let mut e = env().await;
    // preferred zone wins over requisite; the answer is the volume's zone
    let mut r = create_req("topo", mount_cap("ext4", Mode::SingleNodeWriter), 1);
    let zone = |z: &str| csi::Topology {
        segments: HashMap::from([(csi_cinder::TOPOLOGY_KEY.to_string(), z.to_string())]),
    };
    r.accessibility_requirements = Some(csi::TopologyRequirement {
        requisite: vec![zone("nova"), zone("zone-b")],
        preferred: vec![zone("zone-b")],
    });
    r.parameters
        .insert("csi.storage.k8s.io/pvc/name".into(), "data".into());
    r.parameters
        .insert("csi.storage.k8s.io/pvc/namespace".into(), "team-a".into());
    let v =
        e.c.create_volume(r)
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
    assert_eq!(v.accessible_topology, vec![zone("zone-b")]);
    let got = e.cinder.get_volume(&v.volume_id).await.unwrap();
    assert_eq!(got.availability_zone, "zone-b");
    assert_eq!(
        got.status.as_str(),
        "available",
        "CreateVolume answers once the volume is available"
    );
    assert_eq!(
        got.metadata
            .get("csi.storage.k8s.io/pvc/name")
            .map(String::as_str),
        Some("data")
    );
    assert_eq!(
        got.metadata
            .get("cinder.csi.openstack.org/cluster")
            .map(String::as_str),
        Some("sanity")
    );

    // `availability` overrides topology
    let mut r = create_req("avail", mount_cap("ext4", Mode::SingleNodeWriter), 1);
    r.parameters.insert("availability".into(), "nova".into());
    r.accessibility_requirements = Some(csi::TopologyRequirement {
        requisite: vec![],
        preferred: vec![zone("zone-b")],
    });
    let v =
        e.c.create_volume(r)
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
    assert_eq!(v.accessible_topology, vec![zone("nova")]);

    // several nodes: only raw block on a multiattach type
    let mut r = create_req("shared", block_cap(Mode::MultiNodeMultiWriter), 1);
    let err = e.c.create_volume(r.clone()).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{}", err.message());
    r.parameters.insert("type".into(), "multiattach".into());
    let v =
        e.c.create_volume(r)
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
    assert!(e.cinder.get_volume(&v.volume_id).await.unwrap().multiattach);
    // the same name with another type is a different volume
    let mut other = create_req("shared", block_cap(Mode::SingleNodeWriter), 1);
    other.parameters.insert("type".into(), "__DEFAULT__".into());
    assert_eq!(
        e.c.create_volume(other).await.unwrap_err().code(),
        Code::AlreadyExists
    );
}

#[tokio::test]
async fn a_restore_lands_in_its_sources_zone_or_is_refused_never_a_lying_topology() {
    if !root() {
        return;
    }
    let mut e = env().await;
    let zone = |z: &str| csi::Topology {
        segments: HashMap::from([(csi_cinder::TOPOLOGY_KEY.to_string(), z.to_string())]),
    };
    let cap = || mount_cap("ext4", Mode::SingleNodeWriter);
    let mut r = create_req("zoned-src", cap(), 1);
    r.accessibility_requirements = Some(csi::TopologyRequirement {
        requisite: vec![zone("nova")],
        preferred: vec![zone("nova")],
    });
    let src =
        e.c.create_volume(r)
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
    let snap =
        e.c.create_snapshot(snapshot_req(&src.volume_id, "zoned-snap", &[]))
            .await
            .unwrap()
            .into_inner()
            .snapshot
            .unwrap();
    let sources = [
        ("snapshot", from_snapshot(&snap.snapshot_id)),
        ("source volume", from_volume(&src.volume_id)),
    ];
    for (what, source) in sources {
        // preferred elsewhere, but the request allows the source's zone:
        // created there, and the answer says so
        let name = format!("zoned-ok-{}", what.replace(' ', "-"));
        let mut r = create_req(&name, cap(), 1);
        r.volume_content_source = source.clone();
        r.accessibility_requirements = Some(csi::TopologyRequirement {
            requisite: vec![zone("zone-b"), zone("nova")],
            preferred: vec![zone("zone-b"), zone("nova")],
        });
        let v =
            e.c.create_volume(r)
                .await
                .unwrap()
                .into_inner()
                .volume
                .unwrap();
        assert_eq!(v.accessible_topology, vec![zone("nova")], "{what}");
        let got = e.cinder.get_volume(&v.volume_id).await.unwrap();
        assert_eq!(got.availability_zone, "nova", "{what}");

        // only another zone allowed: refused, saying where the source is,
        // and nothing created
        let name = format!("zoned-no-{}", what.replace(' ', "-"));
        let mut r = create_req(&name, cap(), 1);
        r.volume_content_source = source.clone();
        r.accessibility_requirements = Some(csi::TopologyRequirement {
            requisite: vec![zone("zone-b")],
            preferred: vec![zone("zone-b")],
        });
        let err = e.c.create_volume(r).await.unwrap_err();
        assert_eq!(
            err.code(),
            Code::ResourceExhausted,
            "{what}: {}",
            err.message()
        );
        assert!(
            err.message().contains(&format!("the {what}")) && err.message().contains("\"nova\""),
            "{}",
            err.message()
        );
        assert!(e.named(&name).await.is_empty(), "{what}: a volume was left");

        // a StorageClass that names another zone: a clear InvalidArgument
        let name = format!("zoned-class-{}", what.replace(' ', "-"));
        let mut r = create_req(&name, cap(), 1);
        r.volume_content_source = source;
        r.parameters.insert("availability".into(), "zone-b".into());
        let err = e.c.create_volume(r).await.unwrap_err();
        assert_eq!(
            err.code(),
            Code::InvalidArgument,
            "{what}: {}",
            err.message()
        );
        assert!(err.message().contains("zone-b"), "{}", err.message());
        assert!(e.named(&name).await.is_empty(), "{what}: a volume was left");
    }
}

#[tokio::test]
async fn concurrent_identical_creates_make_one_volume() {
    if !root() {
        return;
    }
    let e = env().await;
    let mut tasks = Vec::new();
    for _ in 0..10 {
        let mut c = e.c.clone();
        tasks.push(tokio::spawn(async move {
            c.create_volume(create_req(
                "burst",
                mount_cap("ext4", Mode::SingleNodeWriter),
                1,
            ))
            .await
            .map(|r| r.into_inner().volume.unwrap().volume_id)
        }));
    }
    let mut ids = Vec::new();
    for t in tasks {
        ids.push(t.await.unwrap().unwrap());
    }
    ids.dedup();
    assert_eq!(ids.len(), 1, "{ids:?}");
    assert_eq!(e.named("burst").await.len(), 1);
}

#[tokio::test]
async fn quota_and_backend_failures_leave_nothing_behind() {
    if !root() {
        return;
    }
    let mut e = env().await;
    e.h.emulator.control().set_quotas(Quotas {
        volumes: 0,
        ..Quotas::default()
    });
    let err =
        e.c.create_volume(create_req(
            "quota",
            mount_cap("ext4", Mode::SingleNodeWriter),
            1,
        ))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{}", err.message());
    assert!(e.named("quota").await.is_empty());
    e.h.emulator.control().set_quotas(Quotas::default());

    e.h.emulator.control().fail_next_volume_creates(1);
    let err =
        e.c.create_volume(create_req(
            "fails",
            mount_cap("ext4", Mode::SingleNodeWriter),
            1,
        ))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Internal, "{}", err.message());
    assert!(err.message().contains("deleted"), "{}", err.message());
    assert!(
        e.named("fails").await.is_empty(),
        "the failed volume is deleted"
    );
    // the provisioner's retry succeeds
    let v = e
        .create("fails", mount_cap("ext4", Mode::SingleNodeWriter), 1)
        .await;
    assert_eq!(e.named("fails").await.len(), 1);
    assert_eq!(e.named("fails").await[0].id, v.volume_id);
}

/// An expansion the project's quota refuses is infeasible (OutOfRange,
/// which external-resizer takes as such: Kubernetes then lets the user
/// lower the claim's request, KEP-1790), changes nothing, and a smaller
/// size the quota allows then succeeds; once the quota is raised, the
/// resizer's retry of the first size succeeds too.
#[tokio::test]
async fn an_expansion_the_quota_refuses_is_infeasible_and_a_smaller_one_then_succeeds() {
    if !root() {
        return;
    }
    let mut e = env().await;
    let cap = mount_cap("ext4", Mode::SingleNodeWriter);
    let v = e.create("grows", cap.clone(), 1).await;
    let expand = |gib: i64| csi::ControllerExpandVolumeRequest {
        volume_id: v.volume_id.clone(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: gib * GIB,
            limit_bytes: 0,
        }),
        volume_capability: Some(cap.clone()),
        ..Default::default()
    };
    e.h.emulator.control().set_quotas(Quotas {
        gigabytes: 4,
        ..Quotas::default()
    });
    let err = e.c.controller_expand_volume(expand(10)).await.unwrap_err();
    assert_eq!(err.code(), Code::OutOfRange, "{}", err.message());
    for word in ["quota", "lower the claim's request", "from 1 to 10 GiB"] {
        assert!(err.message().contains(word), "{word}: {}", err.message());
    }
    let after = e.cinder.get_volume(&v.volume_id).await.unwrap();
    assert_eq!((after.size, after.status.as_str()), (1, "available"));

    let grown =
        e.c.controller_expand_volume(expand(3))
            .await
            .unwrap()
            .into_inner();
    assert_eq!(grown.capacity_bytes, 3 * GIB);
    assert_eq!(e.cinder.get_volume(&v.volume_id).await.unwrap().size, 3);

    e.h.emulator.control().set_quotas(Quotas::default());
    let grown =
        e.c.controller_expand_volume(expand(10))
            .await
            .unwrap()
            .into_inner();
    assert_eq!(grown.capacity_bytes, 10 * GIB);
}

#[tokio::test]
async fn attachments_respect_other_servers_and_gone_servers() {
    if !root() {
        return;
    }
    let mut e = env().await;
    let cap = mount_cap("ext4", Mode::SingleNodeWriter);
    let v = e.create("att", cap.clone(), 1).await;
    e.publish(&v.volume_id, cap.clone()).await;
    let other =
        e.h.emulator
            .control()
            .create_server(e.h.project(), "node-2", "nova")
            .unwrap();
    let err =
        e.c.controller_publish_volume(csi::ControllerPublishVolumeRequest {
            volume_id: v.volume_id.clone(),
            node_id: other.clone(),
            volume_capability: Some(cap.clone()),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{}", err.message());
    // unpublishing from a node it is not attached to changes nothing
    e.c.controller_unpublish_volume(csi::ControllerUnpublishVolumeRequest {
        volume_id: v.volume_id.clone(),
        node_id: other,
        secrets: HashMap::new(),
    })
    .await
    .unwrap();
    assert_eq!(
        e.cinder
            .get_volume(&v.volume_id)
            .await
            .unwrap()
            .attachments
            .len(),
        1
    );
    // still attached: DeleteVolume refuses, ControllerGetVolume lists the node
    let err =
        e.c.delete_volume(csi::DeleteVolumeRequest {
            volume_id: v.volume_id.clone(),
            secrets: HashMap::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    let got =
        e.c.controller_get_volume(csi::ControllerGetVolumeRequest {
            volume_id: v.volume_id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        got.status.unwrap().published_node_ids,
        vec![e.h.node_id.clone()]
    );

    // a multiattach block volume goes to two servers
    let mut r = create_req("multi", block_cap(Mode::MultiNodeMultiWriter), 1);
    r.parameters.insert("type".into(), "multiattach".into());
    let m =
        e.c.create_volume(r)
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
    let node2 =
        e.h.emulator
            .control()
            .create_server(e.h.project(), "node-3", "nova")
            .unwrap();
    for node in [e.h.node_id.clone(), node2.clone()] {
        e.c.controller_publish_volume(csi::ControllerPublishVolumeRequest {
            volume_id: m.volume_id.clone(),
            node_id: node,
            volume_capability: Some(block_cap(Mode::MultiNodeMultiWriter)),
            ..Default::default()
        })
        .await
        .unwrap();
    }
    let servers: Vec<String> = e
        .cinder
        .get_volume(&m.volume_id)
        .await
        .unwrap()
        .attached_servers()
        .map(str::to_string)
        .collect();
    assert_eq!(servers.len(), 2, "{servers:?}");
    // detaching from one server keeps the other attachment
    e.c.controller_unpublish_volume(csi::ControllerUnpublishVolumeRequest {
        volume_id: m.volume_id.clone(),
        node_id: node2,
        secrets: HashMap::new(),
    })
    .await
    .unwrap();
    let servers: Vec<String> = e
        .cinder
        .get_volume(&m.volume_id)
        .await
        .unwrap()
        .attached_servers()
        .map(str::to_string)
        .collect();
    assert_eq!(servers, vec![e.h.node_id.clone()]);
}

#[tokio::test]
async fn modify_volume_retypes_records_claim_keys_and_refuses_unknown_parameters() {
    if !root() {
        return;
    }
    let mut e = env().await;
    let v = e
        .create("retype", mount_cap("ext4", Mode::SingleNodeWriter), 1)
        .await;
    let modify = |params: &[(&str, &str)]| csi::ControllerModifyVolumeRequest {
        volume_id: v.volume_id.clone(),
        secrets: HashMap::new(),
        mutable_parameters: params
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    };
    let err =
        e.c.controller_modify_volume(modify(&[("iops", "3000")]))
            .await
            .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    let err =
        e.c.controller_modify_volume(modify(&[("type", "no-such-type")]))
            .await
            .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{}", err.message());
    e.c.controller_modify_volume(modify(&[("type", "multiattach")]))
        .await
        .unwrap();
    assert_eq!(
        e.cinder
            .get_volume(&v.volume_id)
            .await
            .unwrap()
            .volume_type
            .as_deref(),
        Some("multiattach")
    );
    e.c.controller_modify_volume(modify(&[("type", "multiattach")]))
        .await
        .unwrap();
    // csi-resizer --extra-modify-metadata adds the claim's keys: accepted
    // and recorded, as the provisioner's are at creation
    e.c.controller_modify_volume(modify(&[
        ("type", "multiattach"),
        ("csi.storage.k8s.io/pvc/name", "data"),
        ("csi.storage.k8s.io/pvc/namespace", "apps"),
        ("csi.storage.k8s.io/pv/name", "pvc-1"),
    ]))
    .await
    .unwrap();
    let md = e.cinder.get_volume(&v.volume_id).await.unwrap().metadata;
    assert_eq!(
        md.get("csi.storage.k8s.io/pvc/name").map(String::as_str),
        Some("data")
    );
    assert_eq!(
        md.get("csi.storage.k8s.io/pv/name").map(String::as_str),
        Some("pvc-1")
    );
}

#[tokio::test]
async fn backup_snapshots_restore_outlive_their_volume_and_delete_cleanly() {
    if !root() {
        return;
    }
    let mut e = env().await;
    let xfs = mount_cap("xfs", Mode::SingleNodeWriter);
    let (v, staging) = e.staged("backed-up", xfs.clone(), 1).await;
    std::fs::write(staging.join("kept"), b"in the backup").unwrap();
    nix::unistd::sync();

    // an attached volume is backed up only when the class says so, and
    // the refusal says how
    let err =
        e.c.create_snapshot(snapshot_req(&v.volume_id, "bk-1", &[("type", "backup")]))
            .await
            .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{}", err.message());
    assert!(
        err.message().contains("force-create: \"true\""),
        "{}",
        err.message()
    );
    let params = [("type", "backup"), ("force-create", "true")];
    let first =
        e.c.create_snapshot(snapshot_req(&v.volume_id, "bk-1", &params))
            .await
            .unwrap()
            .into_inner()
            .snapshot
            .unwrap();
    assert_eq!(first.source_volume_id, v.volume_id);
    // the snapshotter polls until ready; the id is the backup's
    let mut ready = first.ready_to_use;
    for _ in 0..100 {
        if ready {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        let again =
            e.c.create_snapshot(snapshot_req(&v.volume_id, "bk-1", &params))
                .await
                .unwrap()
                .into_inner()
                .snapshot
                .unwrap();
        assert_eq!(again.snapshot_id, first.snapshot_id, "one backup per name");
        ready = again.ready_to_use;
    }
    assert!(ready, "backup never became ready");
    let id = first.snapshot_id.clone();
    let backup = e.cinder.get_backup(&id).await.unwrap();
    assert_eq!(backup.volume_id, v.volume_id);
    // the snapshot it was made from is not left behind
    let leftover: Vec<_> = e
        .cinder
        .list_snapshots(&openstack_client::cinder::ListSnapshots {
            volume_id: Some(v.volume_id.clone()),
            ..Default::default()
        })
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|s| s.status.as_str() != "deleting")
        .collect();
    assert!(leftover.is_empty(), "{leftover:?}");
    let got =
        e.c.get_snapshot(csi::GetSnapshotRequest {
            snapshot_id: id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap();
    assert!(got.ready_to_use);
    let listed =
        e.c.list_snapshots(csi::ListSnapshotsRequest {
            snapshot_id: id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .entries;
    assert_eq!(listed.len(), 1);

    // a backup outlives its volume
    e.unstage(&v.volume_id).await;
    e.unpublish(&v.volume_id).await;
    e.c.delete_volume(csi::DeleteVolumeRequest {
        volume_id: v.volume_id.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    let mut r = create_req("from-backup", xfs.clone(), 2);
    r.volume_content_source = from_snapshot(&id);
    let restored =
        e.c.create_volume(r.clone())
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
    assert_eq!(restored.content_source, r.volume_content_source);
    assert_eq!(
        restored
            .volume_context
            .get("cinder.csi.openstack.org/resizeRequired")
            .map(String::as_str),
        Some("true")
    );
    // idempotent: the same answer, no second volume
    let again =
        e.c.create_volume(r)
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
    assert_eq!(again.volume_id, restored.volume_id);
    e.publish(&restored.volume_id, xfs.clone()).await;
    e.stage(&restored, xfs.clone()).await.unwrap();
    let (staging_r, _) = e.h.paths(&restored.volume_id);
    assert_eq!(
        std::fs::read(staging_r.join("kept")).unwrap(),
        b"in the backup"
    );
    e.unstage(&restored.volume_id).await;

    // deleting it: gone when the call answers, and again is fine
    for _ in 0..2 {
        e.c.delete_snapshot(csi::DeleteSnapshotRequest {
            snapshot_id: id.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
        assert!(e.cinder.get_backup(&id).await.unwrap_err().is_not_found());
    }
    let err =
        e.c.get_snapshot(csi::GetSnapshotRequest {
            snapshot_id: id.clone(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);

    // a class type this driver does not know is refused, naming it
    let err =
        e.c.create_snapshot(snapshot_req(
            &restored.volume_id,
            "bk-2",
            &[("type", "replica")],
        ))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("type"), "{}", err.message());
}

#[tokio::test]
async fn legacy_fs_type_formats_and_unknown_class_keys_are_ignored() {
    if !root() {
        return;
    }
    let mut e = env().await;
    // an in-tree StorageClass: fsType, and a key upstream ignores
    let mut r = create_req("legacy", mount_cap("", Mode::SingleNodeWriter), 1);
    r.parameters.insert("fsType".into(), "xfs".into());
    r.parameters.insert("someOldKey".into(), "x".into());
    let v =
        e.c.create_volume(r)
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
    let cap = mount_cap("", Mode::SingleNodeWriter);
    e.publish(&v.volume_id, cap.clone()).await;
    e.stage(&v, cap.clone()).await.unwrap();
    let (staging, _) = e.h.paths(&v.volume_id);
    let mounts = host_ops::mounts_at(&staging).unwrap();
    assert_eq!(
        mounts.last().map(|m| m.fs_type.as_str()),
        Some("xfs"),
        "{mounts:?}"
    );
    e.unstage(&v.volume_id).await;
    e.unpublish(&v.volume_id).await;
}

// ----------------------------------------------------------------- faults

/// Retries like the external-provisioner/attacher: until success or a
/// final error, each attempt with its own deadline.
async fn retry<T, F, Fut>(mut call: F) -> (T, Vec<Code>)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
{
    let mut codes = Vec::new();
    for _ in 0..60 {
        match call().await {
            Ok(r) => return (r.into_inner(), codes),
            Err(s) => {
                assert!(
                    matches!(
                        s.code(),
                        Code::Unavailable | Code::DeadlineExceeded | Code::Aborted | Code::Internal
                    ),
                    "not retryable: {s:?}"
                );
                // the plugin answered itself, before the caller gave up
                assert!(
                    !s.message().contains("Timeout expired"),
                    "the caller's deadline passed first: {s:?}"
                );
                codes.push(s.code());
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    panic!("no success after 60 attempts: {codes:?}");
}

#[tokio::test]
async fn faults_give_retryable_codes_and_no_orphans_or_duplicates() {
    if !root() {
        return;
    }
    let mut e = env().await;
    let ctl = e.h.emulator.control();
    let cap = mount_cap("ext4", Mode::SingleNodeWriter);

    // Cinder answers 500 to the first two creates, then drops a connection
    ctl.add_fault(
        FaultRule::new(
            Some("POST"),
            "/volumes",
            FaultAction::Status {
                status: 500,
                message: None,
                retry_after: None,
                hint: Default::default(),
            },
        )
        .times(2),
    );
    let c = e.c.clone();
    let (v, codes) = retry(|| {
        let mut c = c.clone();
        async move {
            c.create_volume(timed(
                create_req("flaky", mount_cap("ext4", Mode::SingleNodeWriter), 1),
                Duration::from_secs(5),
            ))
            .await
        }
    })
    .await;
    assert!(!codes.is_empty());
    assert_eq!(e.named("flaky").await.len(), 1);
    let flaky = v.volume.unwrap();

    // creation slower than the RPC deadline: the retry adopts the volume
    ctl.set_delays(Delays {
        volume_create_ms: 1500,
        ..Delays::default()
    });
    let (v, codes) = retry(|| {
        let mut c = c.clone();
        async move {
            c.create_volume(timed(
                create_req("slow", mount_cap("ext4", Mode::SingleNodeWriter), 1),
                Duration::from_millis(600),
            ))
            .await
        }
    })
    .await;
    assert!(codes.contains(&Code::DeadlineExceeded), "{codes:?}");
    assert_eq!(e.named("slow").await.len(), 1, "no orphan volume");
    assert_eq!(e.named("slow").await[0].id, v.volume.unwrap().volume_id);

    // Nova's attach stuck in attaching past the deadline; then the API
    // answering slowly: one attachment in the end
    ctl.set_delays(Delays {
        volume_attach_ms: 1500,
        ..Delays::default()
    });
    let id = flaky.volume_id.clone();
    let node = e.h.node_id.clone();
    let (_, codes) = retry(|| {
        let mut c = c.clone();
        let req = csi::ControllerPublishVolumeRequest {
            volume_id: id.clone(),
            node_id: node.clone(),
            volume_capability: Some(cap.clone()),
            ..Default::default()
        };
        async move {
            c.controller_publish_volume(timed(req, Duration::from_millis(600)))
                .await
        }
    })
    .await;
    assert!(codes.contains(&Code::DeadlineExceeded), "{codes:?}");
    let vol = e.cinder.get_volume(&id).await.unwrap();
    assert_eq!(
        vol.attachments.len(),
        1,
        "no duplicate attachment: {:?}",
        vol.attachments
    );
    let attach_posts = ctl
        .calls()
        .iter()
        .filter(|c| c.method == "POST" && c.path.ends_with("/os-volume_attachments"))
        .count();
    assert_eq!(attach_posts, 1, "one attach request despite the retries");

    // tokens expire mid-operation: the plugin re-authenticates
    ctl.set_delays(Delays::default());
    ctl.expire_tokens();
    e.unpublish(&id).await;
    ctl.revoke_tokens();
    let w = e.create("after-revoke", cap.clone(), 1).await;

    // every GET times out once the deadline is short: an answer from the
    // plugin, in time, saying so
    ctl.add_fault(
        FaultRule::new(
            Some("GET"),
            "/volumes/",
            FaultAction::Delay { millis: 3000 },
        )
        .times(1),
    );
    let err =
        e.c.controller_get_volume(timed(
            csi::ControllerGetVolumeRequest {
                volume_id: w.volume_id.clone(),
            },
            Duration::from_secs(1),
        ))
        .await
        .unwrap_err();
    assert!(
        matches!(err.code(), Code::DeadlineExceeded | Code::Unavailable),
        "{err:?}"
    );
    assert!(
        !err.message().contains("Timeout expired"),
        "the plugin must answer before the caller's deadline: {err:?}"
    );

    // a dropped connection on a delete: retried to success, volume gone
    ctl.add_fault(FaultRule::new(Some("DELETE"), "/volumes/", FaultAction::Drop).times(1));
    let wid = w.volume_id.clone();
    retry(|| {
        let mut c = c.clone();
        let req = csi::DeleteVolumeRequest {
            volume_id: wid.clone(),
            secrets: HashMap::new(),
        };
        async move { c.delete_volume(timed(req, Duration::from_secs(5))).await }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(e.named("after-revoke").await.is_empty());
}

// ------------------------------------------- attachments stuck, repaired

/// The plugin with its /metrics on a port of its own.
async fn env_with_metrics() -> (Env, u16) {
    let port = csi_sanity::harness::free_port().unwrap();
    let e = env_with(&[&format!("--http-endpoint=127.0.0.1:{port}")]).await;
    (e, port)
}

/// `cinder_csi_attachment_repairs_total{kind}` as /metrics says.
async fn repairs(port: u16, kind: &str) -> u64 {
    let (_, body) = csi_sanity::harness::http_get(port, "/metrics")
        .await
        .unwrap();
    let series = format!("cinder_csi_attachment_repairs_total{{kind=\"{kind}\"}} ");
    body.lines()
        .find_map(|l| l.strip_prefix(&series))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {series} in /metrics:\n{body}"))
}

fn publish_req(id: &str, node: &str) -> csi::ControllerPublishVolumeRequest {
    csi::ControllerPublishVolumeRequest {
        volume_id: id.into(),
        node_id: node.into(),
        volume_capability: Some(mount_cap("ext4", Mode::SingleNodeWriter)),
        ..Default::default()
    }
}

fn unpublish_req(id: &str, node: &str) -> csi::ControllerUnpublishVolumeRequest {
    csi::ControllerUnpublishVolumeRequest {
        volume_id: id.into(),
        node_id: node.into(),
        ..Default::default()
    }
}

/// An RPC that must run into its deadline (waiting on OpenStack).
async fn times_out<T>(call: impl std::future::Future<Output = Result<T, tonic::Status>>) {
    match call.await {
        Ok(_) => panic!("answered before its deadline"),
        Err(err) => assert_eq!(err.code(), Code::DeadlineExceeded, "{}", err.message()),
    }
}

/// Longer than the plugin's default bound (`--stuck-attachment-secs`).
const LONG_AGO: Duration = Duration::from_secs(600);

#[tokio::test]
async fn a_reservation_nova_forgot_is_released_and_the_attach_tried_again() {
    if !root() {
        return;
    }
    let (mut e, port) = env_with_metrics().await;
    let cap = mount_cap("ext4", Mode::SingleNodeWriter);
    let v = e.create("reserved", cap, 1).await;
    let node = e.h.node_id.clone();
    e.h.emulator.control().fail_attaches_losing_cleanup(1);
    times_out(e.c.controller_publish_volume(timed(
        publish_req(&v.volume_id, &node),
        Duration::from_secs(3),
    )))
    .await;
    assert_eq!(e.status(&v.volume_id).await, "reserved");
    // within the bound: waited on, not repaired
    times_out(e.c.controller_publish_volume(timed(
        publish_req(&v.volume_id, &node),
        Duration::from_secs(2),
    )))
    .await;
    assert_eq!(repairs(port, "stale_reservation").await, 0);
    // past it: the reservation Nova no longer lists goes, the attach is
    // tried again and succeeds
    e.h.emulator
        .control()
        .age_volume_status(&v.volume_id, LONG_AGO);
    e.c.controller_publish_volume(publish_req(&v.volume_id, &node))
        .await
        .unwrap();
    let got = e.cinder.get_volume(&v.volume_id).await.unwrap();
    assert_eq!(got.status.as_str(), "in-use");
    assert_eq!(
        got.attached_servers().collect::<Vec<_>>(),
        vec![node.as_str()]
    );
    assert!(
        e.h.by_id_dir
            .join(openstack_emulator::hypervisor::by_id_name(&v.volume_id))
            .exists()
    );
    assert_eq!(repairs(port, "stale_reservation").await, 1);
    e.unpublish(&v.volume_id).await;
}

#[tokio::test]
async fn an_attach_its_host_never_finished_is_refused_naming_the_server() {
    if !root() {
        return;
    }
    let (mut e, port) = env_with_metrics().await;
    let cap = mount_cap("ext4", Mode::SingleNodeWriter);
    let v = e.create("stalled", cap, 1).await;
    let node = e.h.node_id.clone();
    e.h.emulator.control().stall_attaches(1);
    times_out(e.c.controller_publish_volume(timed(
        publish_req(&v.volume_id, &node),
        Duration::from_secs(3),
    )))
    .await;
    e.h.emulator
        .control()
        .age_volume_status(&v.volume_id, LONG_AGO);
    // Nova still lists it: only an operator can end it, and is told how
    let err =
        e.c.controller_publish_volume(publish_req(&v.volume_id, &node))
            .await
            .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{}", err.message());
    for needle in [
        node.as_str(),
        "attaching",
        "Nova still lists it",
        "server remove volume",
    ] {
        assert!(
            err.message().contains(needle),
            "{needle}: {}",
            err.message()
        );
    }
    // nothing deleted behind Nova's back
    assert_eq!(e.status(&v.volume_id).await, "attaching");
    assert_eq!(repairs(port, "stale_reservation").await, 0);
}

#[tokio::test]
async fn a_detach_that_never_completed_is_asked_again() {
    if !root() {
        return;
    }
    let (mut e, port) = env_with_metrics().await;
    let cap = mount_cap("ext4", Mode::SingleNodeWriter);
    let v = e.create("detaching", cap.clone(), 1).await;
    e.publish(&v.volume_id, cap).await;
    let node = e.h.node_id.clone();
    e.h.emulator.control().stall_detaches(1);
    times_out(e.c.controller_unpublish_volume(timed(
        unpublish_req(&v.volume_id, &node),
        Duration::from_secs(3),
    )))
    .await;
    assert_eq!(e.status(&v.volume_id).await, "detaching");
    e.h.emulator
        .control()
        .age_volume_status(&v.volume_id, LONG_AGO);
    e.c.controller_unpublish_volume(unpublish_req(&v.volume_id, &node))
        .await
        .unwrap();
    let got = e.cinder.get_volume(&v.volume_id).await.unwrap();
    assert_eq!(got.status.as_str(), "available");
    assert!(got.attachments.is_empty());
    assert_eq!(repairs(port, "detach_retried").await, 1);
}

/// How long a volume has been `detaching` is Cinder's `updated_at` aged
/// by Cinder's own clock (its answer's `Date`), not by the node's: a
/// cloud whose clock is an hour behind does not make a detach under way
/// look an hour old (repaired while it runs), and one an hour ahead does
/// not make a stuck detach look young (never repaired).
#[tokio::test]
async fn a_clock_off_from_cinders_neither_repairs_a_live_detach_nor_misses_a_stuck_one() {
    if !root() {
        return;
    }
    let (mut e, port) = env_with_metrics().await;
    let cap = mount_cap("ext4", Mode::SingleNodeWriter);
    let v = e.create("skewed", cap.clone(), 1).await;
    e.publish(&v.volume_id, cap).await;
    let node = e.h.node_id.clone();
    let ctl = e.h.emulator.control();
    ctl.set_clock_offset(-3600);
    ctl.stall_detaches(1);
    times_out(e.c.controller_unpublish_volume(timed(
        unpublish_req(&v.volume_id, &node),
        Duration::from_secs(3),
    )))
    .await;
    assert_eq!(e.status(&v.volume_id).await, "detaching");
    // just now by Cinder's clock: waited on, not repaired
    times_out(e.c.controller_unpublish_volume(timed(
        unpublish_req(&v.volume_id, &node),
        Duration::from_secs(2),
    )))
    .await;
    assert_eq!(repairs(port, "detach_retried").await, 0);
    assert_eq!(e.status(&v.volume_id).await, "detaching");

    // ten minutes ago by Cinder's clock, which is now an hour ahead
    ctl.set_clock_offset(3600);
    ctl.age_volume_status(&v.volume_id, LONG_AGO);
    e.c.controller_unpublish_volume(timed(
        unpublish_req(&v.volume_id, &node),
        Duration::from_secs(20),
    ))
    .await
    .unwrap();
    assert_eq!(e.status(&v.volume_id).await, "available");
    assert_eq!(repairs(port, "detach_retried").await, 1);
}

#[tokio::test]
async fn volumes_of_a_server_that_is_gone_are_released_not_held_forever() {
    if !root() {
        return;
    }
    let (mut e, port) = env_with_metrics().await;
    let cap = mount_cap("ext4", Mode::SingleNodeWriter);
    let ctl = e.h.emulator.control();
    let gone = ctl
        .create_server(e.h.project(), "gone-node", "nova")
        .unwrap();
    let other = ctl
        .create_server(e.h.project(), "other-node", "nova")
        .unwrap();
    let a = e.create("held-a", cap.clone(), 1).await;
    let b = e.create("held-b", cap.clone(), 1).await;
    for v in [&a, &b] {
        e.c.controller_publish_volume(publish_req(&v.volume_id, &gone))
            .await
            .unwrap();
    }
    // Nova loses the server; Cinder still calls both volumes in-use by it
    ctl.forget_server(&gone);
    assert_eq!(e.status(&a.volume_id).await, "in-use");
    // unpublished from the gone server: released
    e.c.controller_unpublish_volume(unpublish_req(&a.volume_id, &gone))
        .await
        .unwrap();
    let got = e.cinder.get_volume(&a.volume_id).await.unwrap();
    assert_eq!(got.status.as_str(), "available", "{got:?}");
    // published elsewhere while the gone server holds it: released, then
    // attached there
    e.c.controller_publish_volume(publish_req(&b.volume_id, &other))
        .await
        .unwrap();
    let got = e.cinder.get_volume(&b.volume_id).await.unwrap();
    assert_eq!(
        got.attached_servers().collect::<Vec<_>>(),
        vec![other.as_str()]
    );
    assert_eq!(repairs(port, "server_gone").await, 2);
    // a server that exists keeps its volume: FailedPrecondition, as before
    let err =
        e.c.controller_publish_volume(publish_req(&b.volume_id, &e.h.node_id.clone()))
            .await
            .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{}", err.message());
    assert_eq!(
        e.cinder
            .get_volume(&b.volume_id)
            .await
            .unwrap()
            .attached_servers()
            .collect::<Vec<_>>(),
        vec![other.as_str()]
    );
}

/// Nova as the admin (an operator) sees it: every project's servers.
/// Which servers Nova (the admin's view) lists the volume on.
async fn nova_holders(
    nova: &openstack_client::nova::Compute,
    servers: &[&str],
    volume: &str,
) -> Vec<String> {
    let mut holders = Vec::new();
    for s in servers {
        if nova
            .list_volume_attachments(s)
            .await
            .unwrap()
            .iter()
            .any(|a| a.volume_id == volume)
        {
            holders.push(s.to_string());
        }
    }
    holders
}

/// The plugin runs as a project member, as in production: Nova answers
/// it 404 for another project's live server, exactly as for a deleted
/// one. An operator's rescue server (admin project) holding a volume is
/// never taken for a deleted server: the publish elsewhere is refused,
/// naming the server and the attachment, and Nova keeps one writer. A
/// server of the plugin's own project that was deleted is told apart by
/// Nova's record of its actions and repaired (the test before); once an
/// operator archives Nova's database that proof is gone too, and the
/// publish is refused the same way.
#[tokio::test]
async fn a_server_the_plugin_cannot_see_keeps_its_volume_never_two_writers() {
    if !root() {
        return;
    }
    let (mut e, port) = env_with_metrics().await;
    assert_eq!(
        e.h.project(),
        "demo",
        "the harness runs the plugin as a member"
    );
    let cap = mount_cap("ext4", Mode::SingleNodeWriter);
    let ctl = e.h.emulator.control();
    let admin = admin_nova(&e.h);
    let node = e.h.node_id.clone();
    let rescue = ctl
        .create_server("admin", "operators-rescue-vm", "nova")
        .unwrap();
    let v = e.create("held-by-rescue", cap.clone(), 1).await;
    admin
        .attach_volume(&rescue, &v.volume_id, false)
        .await
        .unwrap();
    for _ in 0..200 {
        if e.status(&v.volume_id).await == "in-use" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(e.status(&v.volume_id).await, "in-use");

    let err =
        e.c.controller_publish_volume(publish_req(&v.volume_id, &node))
            .await
            .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{}", err.message());
    assert!(
        err.message().contains(&rescue) && err.message().contains("attachment delete"),
        "names the server and what an operator does: {}",
        err.message()
    );
    // an unpublish naming that server (a stale or forged VolumeAttachment)
    // releases nothing either
    let err =
        e.c.controller_unpublish_volume(unpublish_req(&v.volume_id, &rescue))
            .await
            .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{}", err.message());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        nova_holders(&admin, &[&rescue, &node], &v.volume_id).await,
        vec![rescue.clone()],
        "one writer: the rescue server alone"
    );
    let got = e.cinder.get_volume(&v.volume_id).await.unwrap();
    assert_eq!(
        got.attached_servers().collect::<Vec<_>>(),
        vec![rescue.as_str()]
    );

    // a server of the plugin's own project, deleted, then archived away
    let old = ctl
        .create_server(e.h.project(), "old-node", "nova")
        .unwrap();
    let w = e.create("held-by-archived", cap.clone(), 1).await;
    e.c.controller_publish_volume(publish_req(&w.volume_id, &old))
        .await
        .unwrap();
    ctl.forget_server(&old);
    ctl.archive_deleted_servers();
    let err =
        e.c.controller_publish_volume(publish_req(&w.volume_id, &node))
            .await
            .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{}", err.message());
    assert!(err.message().contains(&old), "{}", err.message());
    assert_eq!(e.status(&w.volume_id).await, "in-use");
    assert_eq!(
        repairs(port, "server_gone").await,
        0,
        "nothing was taken for gone"
    );
}

#[tokio::test]
async fn an_attachment_cinder_has_and_nova_never_made_is_attached_anew() {
    if !root() {
        return;
    }
    let (mut e, port) = env_with_metrics().await;
    let cap = mount_cap("ext4", Mode::SingleNodeWriter);
    let v = e.create("phantom", cap, 1).await;
    let node = e.h.node_id.clone();
    // Cinder says attached to the node; no hypervisor ever connected it
    let att = e
        .cinder
        .create_attachment(&v.volume_id, &node, Some(serde_json::json!({"host": "x"})))
        .await
        .unwrap();
    e.cinder.complete_attachment(&att.id).await.unwrap();
    assert_eq!(e.status(&v.volume_id).await, "in-use");
    e.c.controller_publish_volume(publish_req(&v.volume_id, &node))
        .await
        .unwrap();
    assert!(
        e.h.by_id_dir
            .join(openstack_emulator::hypervisor::by_id_name(&v.volume_id))
            .exists(),
        "the disk is really there now"
    );
    assert_eq!(repairs(port, "attached_without_nova").await, 1);
    e.unpublish(&v.volume_id).await;
    // unpublished while only Cinder has it: Cinder's record goes too
    let w = e
        .create("phantom-2", mount_cap("ext4", Mode::SingleNodeWriter), 1)
        .await;
    let att = e
        .cinder
        .create_attachment(&w.volume_id, &node, Some(serde_json::json!({"host": "x"})))
        .await
        .unwrap();
    e.cinder.complete_attachment(&att.id).await.unwrap();
    e.c.controller_unpublish_volume(unpublish_req(&w.volume_id, &node))
        .await
        .unwrap();
    assert_eq!(e.status(&w.volume_id).await, "available");
    assert_eq!(repairs(port, "attached_without_nova").await, 2);
}
