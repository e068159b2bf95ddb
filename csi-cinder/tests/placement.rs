//! `--pvc-annotations`: a new volume placed as its claim's annotations ask,
//! through the binary, against the emulator (one Cinder backend per zone,
//! as in the real test cloud) and a stand-in apiserver holding the claims.
//! The affinity annotation puts the volume on the backend of a volume it
//! names (by name or id), the anti-affinity one off it; a name that is no
//! volume yet, too long a list, or a volume named in both fail the create
//! before anything is made; a claim's namespace or name that is not one
//! is never sent; without the flag no claim is read.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use csi_common::parameters::{PVC_NAME, PVC_NAMESPACE};
use csi_sanity::harness::kube::StandInApiserver;
use proto::csi::v1 as csi;
use proto::csi::v1::volume_capability::access_mode::Mode;
use tonic::Code;

mod common;
use common::*;

const AFFINITY: &str = "cinder.csi.openstack.org/affinity";
const ANTI_AFFINITY: &str = "cinder.csi.openstack.org/anti-affinity";

async fn env_reading_claims(api: &StandInApiserver, read: bool) -> Env {
    let mut flags = api.flags();
    if read {
        flags.push("--pvc-annotations".into());
    }
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    env_with(&flags).await
}

fn claim(api: &StandInApiserver, name: &str, annotations: &[(&str, &str)]) {
    api.objects().pvcs.insert(
        ("apps".into(), name.into()),
        annotations
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<BTreeMap<_, _>>(),
    );
}

/// CreateVolume as the provisioner sends it with --extra-create-metadata.
fn for_claim(
    name: &str,
    namespace: &str,
    claim: &str,
    zone: Option<&str>,
) -> csi::CreateVolumeRequest {
    let mut r = create_req(name, mount_cap("ext4", Mode::SingleNodeWriter), 1);
    r.parameters.insert(PVC_NAMESPACE.into(), namespace.into());
    r.parameters.insert(PVC_NAME.into(), claim.into());
    if let Some(z) = zone {
        r.parameters.insert("availability".into(), z.into());
    }
    r
}

#[tokio::test]
async fn a_claims_annotations_place_its_volume_with_or_apart_from_the_volumes_they_name() {
    if !root() {
        return;
    }
    let api = StandInApiserver::start().await.unwrap();
    let mut e = env_reading_claims(&api, true).await;
    let host = |e: &Env, id: &str| e.h.emulator.control().volume_host(id).unwrap();
    let anchor = e
        .create(
            "placement-anchor",
            mount_cap("ext4", Mode::SingleNodeWriter),
            1,
        )
        .await
        .volume_id;
    let elsewhere =
        e.c.create_volume(for_claim(
            "placement-elsewhere",
            "apps",
            "none",
            Some("zone-b"),
        ))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap()
        .volume_id;
    assert_ne!(host(&e, &anchor), host(&e, &elsewhere));

    // by name: with the anchor, on its backend
    claim(&api, "near", &[(AFFINITY, "placement-anchor")]);
    let near =
        e.c.create_volume(for_claim("placement-near", "apps", "near", None))
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
    assert_eq!(host(&e, &near.volume_id), host(&e, &anchor));
    assert_eq!(near.volume_context.get("affinity"), Some(&anchor));

    // by id: apart from the anchor, which only the other zone's backend is
    claim(&api, "far", &[(ANTI_AFFINITY, anchor.as_str())]);
    let far =
        e.c.create_volume(for_claim("placement-far", "apps", "far", Some("zone-b")))
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
    assert_ne!(host(&e, &far.volume_id), host(&e, &anchor));
    assert_eq!(far.volume_context.get("anti-affinity"), Some(&anchor));
    // in the anchor's own zone no backend is apart from it: Cinder puts
    // the volume in error; the create says why and leaves nothing
    let err =
        e.c.create_volume(for_claim("placement-nowhere", "apps", "far", None))
            .await
            .unwrap_err();
    assert!(err.message().contains(ANTI_AFFINITY), "{err:?}");
    assert!(
        e.named("placement-nowhere").await.is_empty(),
        "a failed volume was left"
    );

    let refused = async |e: &mut Env, claim: &str, namespace: &str| {
        let name = format!("placement-refused-{}", claim.len() + namespace.len());
        let err =
            e.c.create_volume(for_claim(&name, namespace, claim, None))
                .await
                .unwrap_err();
        assert!(
            e.named(&name).await.is_empty(),
            "{claim}: a volume was made"
        );
        err
    };
    // a volume that is not there (yet): tried again by the provisioner
    claim(&api, "early", &[(AFFINITY, "placement-later")]);
    let err = refused(&mut e, "early", "apps").await;
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains("placement-later"), "{err:?}");
    // named in both lists
    claim(
        &api,
        "torn",
        &[
            (AFFINITY, anchor.as_str()),
            (ANTI_AFFINITY, "placement-anchor"),
        ],
    );
    let err = refused(&mut e, "torn", "apps").await;
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    // more names than are looked up
    let many: Vec<String> = (0..17).map(|i| format!("v{i}")).collect();
    claim(&api, "greedy", &[(AFFINITY, many.join(",").as_str())]);
    let err = refused(&mut e, "greedy", "apps").await;
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    // a namespace that is no name never reaches the apiserver
    let reads = api.objects().pvc_reads;
    let err = refused(&mut e, "near", "../../nodes").await;
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert_eq!(
        api.objects().pvc_reads,
        reads,
        "a path was sent to the apiserver"
    );
    // a claim without the annotations, and one that is gone: placed anywhere
    claim(&api, "plain", &[]);
    for c in ["plain", "gone"] {
        e.c.create_volume(for_claim(&format!("placement-{c}"), "apps", c, None))
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn without_the_flag_no_claim_is_read() {
    if !root() {
        return;
    }
    let api = StandInApiserver::start().await.unwrap();
    let mut e = env_reading_claims(&api, false).await;
    claim(&api, "near", &[(AFFINITY, "placement-missing")]);
    let v =
        e.c.create_volume(for_claim("placement-unread", "apps", "near", None))
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
    assert!(!v.volume_context.contains_key("affinity"));
    assert_eq!(api.objects().pvc_reads, 0);
}
