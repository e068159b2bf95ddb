//! Cinder volume metadata from classes, through the plugin's gRPC socket
//! against the emulator: a StorageClass's `metadata.<key>` entries are
//! written at creation with a VolumeAttributesClass's over them; a
//! ControllerModifyVolume into another VolumeAttributesClass changes the
//! metadata with metadata calls alone (no retype: the data never moves),
//! removes what the former class alone set and keeps the StorageClass's;
//! keys the driver and the sidecars own, malformed keys, values too long
//! and classes with too many keys are InvalidArgument before any call.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, HashMap};

use proto::csi::v1 as csi;
use proto::csi::v1::volume_capability::access_mode::Mode;
use tonic::Code;

mod common;
use common::*;

const RECORD: &str = "cinder.csi.openstack.org/attributes-class-metadata";

fn map(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn modify(id: &str, params: &[(&str, &str)]) -> csi::ControllerModifyVolumeRequest {
    csi::ControllerModifyVolumeRequest {
        volume_id: id.to_string(),
        secrets: HashMap::new(),
        mutable_parameters: map(params),
    }
}

/// The volume's metadata less the driver's own keys (cluster, claim).
async fn class_keys(e: &Env, id: &str) -> BTreeMap<String, String> {
    e.cinder
        .get_volume(id)
        .await
        .unwrap()
        .metadata
        .into_iter()
        .filter(|(k, _)| !k.starts_with("cinder.csi.openstack.org/cluster"))
        .filter(|(k, _)| !k.starts_with("csi.storage.k8s.io/"))
        .collect()
}

fn pairs(p: &[(&str, &str)]) -> BTreeMap<String, String> {
    p.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[tokio::test]
async fn classes_set_and_change_volume_metadata_without_a_retype() {
    let mut e = env().await;
    let mut req = create_req("billed", mount_cap("ext4", Mode::SingleNodeWriter), 1);
    req.parameters = map(&[
        ("type", "__DEFAULT__"),
        ("metadata.billing", "team-a"),
        ("metadata.owner", "ops"),
        ("csi.storage.k8s.io/pvc/name", "data"),
    ]);
    req.mutable_parameters = map(&[("metadata.backup", "daily"), ("metadata.billing", "team-b")]);
    let v =
        e.c.create_volume(req)
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
    let id = v.volume_id;
    assert_eq!(
        class_keys(&e, &id).await,
        pairs(&[
            ("backup", "daily"),
            ("billing", "team-b"),
            ("owner", "ops"),
            (RECORD, "backup,billing"),
        ]),
        "the StorageClass's keys, the VolumeAttributesClass's over them"
    );
    let md = e.cinder.get_volume(&id).await.unwrap().metadata;
    assert_eq!(
        md.get("csi.storage.k8s.io/pvc/name").map(String::as_str),
        Some("data")
    );

    // into a class that bills elsewhere and sets no backup policy
    e.h.emulator.control().clear_calls();
    e.c.controller_modify_volume(modify(
        &id,
        &[("metadata.billing", "team-c"), ("metadata.tier", "gold")],
    ))
    .await
    .unwrap();
    assert_eq!(
        class_keys(&e, &id).await,
        pairs(&[
            ("billing", "team-c"),
            ("owner", "ops"),
            ("tier", "gold"),
            (RECORD, "billing,tier"),
        ]),
        "backup (the former class's alone) removed, owner (the StorageClass's) kept"
    );
    let calls = e.h.emulator.control().calls();
    let writes: Vec<String> = calls
        .iter()
        .filter(|c| c.method != "GET")
        .map(|c| format!("{} {}", c.method, c.path))
        .collect();
    assert!(
        writes.iter().all(|w| w.contains("/metadata")),
        "a class change that sets metadata made other changes: {writes:?}"
    );
    assert_eq!(
        e.cinder
            .get_volume(&id)
            .await
            .unwrap()
            .volume_type
            .as_deref(),
        Some("__DEFAULT__"),
        "retyped"
    );

    // again: nothing to do, nothing written
    e.h.emulator.control().clear_calls();
    e.c.controller_modify_volume(modify(
        &id,
        &[("metadata.billing", "team-c"), ("metadata.tier", "gold")],
    ))
    .await
    .unwrap();
    let writes =
        e.h.emulator
            .control()
            .calls()
            .into_iter()
            .filter(|c| c.method != "GET")
            .count();
    assert_eq!(writes, 0, "a volume already in its class was written to");

    // into a class that sets no metadata: the class's keys go
    e.c.controller_modify_volume(modify(&id, &[]))
        .await
        .unwrap();
    assert_eq!(
        class_keys(&e, &id).await,
        pairs(&[("owner", "ops"), (RECORD, "")])
    );
    // a key someone removed already is no error
    e.c.controller_modify_volume(modify(&id, &[("metadata.x", "1")]))
        .await
        .unwrap();
    e.cinder.delete_volume_metadata_key(&id, "x").await.unwrap();
    e.c.controller_modify_volume(modify(&id, &[]))
        .await
        .unwrap();
    assert_eq!(
        class_keys(&e, &id).await,
        pairs(&[("owner", "ops"), (RECORD, "")])
    );
}

#[tokio::test]
async fn keys_the_driver_owns_and_malformed_ones_are_refused_before_any_call() {
    let mut e = env().await;
    let v = e
        .create("kept", mount_cap("ext4", Mode::SingleNodeWriter), 1)
        .await;
    let long = "v".repeat(256);
    let too_many: Vec<(String, String)> = (0..33)
        .map(|i| (format!("metadata.k{i}"), "1".to_string()))
        .collect();
    let too_many: Vec<(&str, &str)> = too_many
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let cases: Vec<(&str, Vec<(&str, &str)>)> = vec![
        (
            "the cluster's key",
            vec![("metadata.cinder.csi.openstack.org/cluster", "other")],
        ),
        (
            "the cluster's key, other case",
            vec![("metadata.Cinder.CSI.openstack.org/cluster-uid", "x")],
        ),
        (
            "a claim's name",
            vec![("metadata.csi.storage.k8s.io/pvc/name", "stolen")],
        ),
        ("an empty key", vec![("metadata.", "x")]),
        ("a key with a slash", vec![("metadata.team/billing", "x")]),
        (
            "a key with a character Cinder refuses",
            vec![("metadata.bill@ing", "x")],
        ),
        (
            "a value too long",
            vec![("metadata.billing", long.as_str())],
        ),
        ("too many keys", too_many.clone()),
    ];
    let before = e.cinder.get_volume(&v.volume_id).await.unwrap().metadata;
    for (what, params) in &cases {
        e.h.emulator.control().clear_calls();
        let err =
            e.c.controller_modify_volume(modify(&v.volume_id, params))
                .await
                .unwrap_err();
        assert_eq!(
            err.code(),
            Code::InvalidArgument,
            "{what}: {}",
            err.message()
        );
        if params[0].0.to_ascii_lowercase().contains(".csi.") {
            assert!(
                err.message().contains("the driver's and the sidecars' own"),
                "{what}: {}",
                err.message()
            );
        }
        let mut req = create_req(
            &format!("refused-{}", what.len()),
            mount_cap("ext4", Mode::SingleNodeWriter),
            1,
        );
        req.parameters = map(params);
        let err = e.c.create_volume(req).await.unwrap_err();
        assert_eq!(
            err.code(),
            Code::InvalidArgument,
            "{what} (StorageClass): {}",
            err.message()
        );
        assert!(
            e.h.emulator.control().calls().is_empty(),
            "{what}: the cloud was called"
        );
    }
    assert_eq!(
        e.cinder.get_volume(&v.volume_id).await.unwrap().metadata,
        before,
        "something changed"
    );
    // exactly 32 keys are taken
    let mut req = create_req("thirty-two", mount_cap("ext4", Mode::SingleNodeWriter), 1);
    req.parameters = map(&too_many[..32]);
    let made =
        e.c.create_volume(req)
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
    assert_eq!(class_keys(&e, &made.volume_id).await.len(), 32);
}
