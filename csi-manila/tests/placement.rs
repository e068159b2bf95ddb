//! `--pvc-annotations` on Manila, through the binary, against the emulator
//! and a stand-in apiserver holding the claims: a claim asking for a
//! placement this driver does not make (upstream's affinity, anti-affinity
//! and share group annotations) is refused with FailedPrecondition naming
//! what it asks, and no share is made; a claim without them gets its
//! share; without the flag no claim is read.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use csi_common::parameters::{PVC_NAME, PVC_NAMESPACE};
use csi_sanity::harness::kube::StandInApiserver;
use tonic::Code;

mod common;
use common::*;

async fn env_reading_claims(api: &StandInApiserver, read: bool) -> Env {
    let mut flags = api.flags();
    if read {
        flags.push("--pvc-annotations".into());
    }
    env_with("CEPHFS", |o| o.extra_args.extend(flags)).await
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

fn creates(e: &Env) -> usize {
    e.share_calls()
        .iter()
        .filter(|c| c.starts_with("POST") && c.ends_with("/shares"))
        .count()
}

#[tokio::test]
async fn a_claim_asking_for_an_unmade_placement_is_refused_before_anything_is_made() {
    let api = StandInApiserver::start().await.unwrap();
    let mut e = env_reading_claims(&api, true).await;
    for (i, key) in [
        "manila.csi.openstack.org/affinity",
        "manila.csi.openstack.org/anti-affinity",
        "manila.csi.openstack.org/group-id",
    ]
    .into_iter()
    .enumerate()
    {
        let name = format!("asks-{i}");
        claim(&api, &name, &[(key, "some-share")]);
        let before = creates(&e);
        let err =
            e.c.create_volume(e.create_req(
                &format!("placement-{i}"),
                1,
                &[(PVC_NAMESPACE, "apps"), (PVC_NAME, &name)],
            ))
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::FailedPrecondition, "{key}: {err:?}");
        assert!(err.message().contains(key), "{err:?}");
        assert_eq!(creates(&e), before, "{key}: a share was asked for");
    }
    claim(&api, "plain", &[("unrelated.example.com/x", "y")]);
    e.create(
        "placement-plain",
        1,
        &[(PVC_NAMESPACE, "apps"), (PVC_NAME, "plain")],
    )
    .await;
    assert_eq!(api.objects().pvc_reads, 4);
}

#[tokio::test]
async fn without_the_flag_no_claim_is_read() {
    let api = StandInApiserver::start().await.unwrap();
    let mut e = env_reading_claims(&api, false).await;
    claim(&api, "asks", &[("manila.csi.openstack.org/affinity", "x")]);
    e.create(
        "placement-unread",
        1,
        &[(PVC_NAMESPACE, "apps"), (PVC_NAME, "asks")],
    )
    .await;
    assert_eq!(api.objects().pvc_reads, 0);
}
