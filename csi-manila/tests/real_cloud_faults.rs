//! `manila-csi-plugin`'s controller against real Manila as production
//! clouds behave: its requests' Keystone is the test cloud's fault proxy,
//! whose catalog names the proxy for Manila, and real Manila throttles
//! (429 with SAP's hint), does the work and loses the answer, and goes
//! away for a while (`cloud.py outage stop manila`). Each fault is shown
//! served (the proxy's count, and its mark on the call), and afterwards
//! Manila (asked directly, not through the proxy) holds what one
//! fault-free call leaves: one share per name. Start the cloud with
//! `python3 tests/openstack/cloud.py up file` (or `all`), then
//! `OPENSTACK_TEST_BACKEND=real cargo test -p csi-manila --test
//! real_cloud_faults -- --ignored --test-threads=1`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::time::{Duration, Instant};

use csi_sanity::harness::{real_cloud_fault_proxy, real_cloud_outage};
use openstack_emulator::proxy::ProxyControl;
use openstack_emulator::{FaultAction, FaultRule, RetryHint};
use proto::csi::v1 as csi;
use proto::csi::v1::volume_capability::access_mode::Mode;
use tonic::Code;

mod real_common;
use real_common::*;

/// A CephFS controller whose requests name the proxied Keystone.
async fn proxied() -> (Env, ProxyControl) {
    let proxy = real_cloud_fault_proxy().unwrap();
    proxy.clear_faults().await.unwrap();
    let mut e = env("CEPHFS", &[("type", "cephfs")]).await;
    let via_proxy = std::fs::read_to_string(cloud_dir().join("cloud-member-via-proxy.conf"))
        .unwrap()
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once('=')?;
            (k.trim() == "auth-url").then(|| v.trim().trim_matches('"').to_string())
        })
        .unwrap();
    e.h.secrets.insert("os-authURL".into(), via_proxy);
    proxy.clear_calls().await.unwrap();
    (e, proxy)
}

fn create_req(e: &Env, name: &str) -> tonic::Request<csi::CreateVolumeRequest> {
    let mut r = tonic::Request::new(csi::CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: GIB,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![cap(Mode::MultiNodeMultiWriter)],
        parameters: e.parameters.clone(),
        secrets: e.h.secrets.clone(),
        ..Default::default()
    });
    r.set_timeout(Duration::from_secs(20));
    r
}

/// CreateVolume sent again, as the provisioner does, while the answer is
/// retryable; the share's id, and the retryable codes before it.
async fn create_until_ok(e: &Env, name: &str) -> (String, Vec<Code>) {
    let started = Instant::now();
    let mut seen = Vec::new();
    loop {
        let mut c = e.c.clone();
        match c.create_volume(create_req(e, name)).await {
            Ok(v) => return (v.into_inner().volume.unwrap().volume_id, seen),
            Err(s)
                if matches!(
                    s.code(),
                    Code::Unavailable | Code::DeadlineExceeded | Code::Aborted
                ) =>
            {
                seen.push(s.code());
                assert!(started.elapsed() < Duration::from_secs(300), "{seen:?}");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(s) => panic!("{name}: {s:?}"),
        }
    }
}

/// What each rule in place served, in the order added.
async fn served(proxy: &ProxyControl) -> Vec<u64> {
    proxy
        .faults()
        .await
        .unwrap()
        .iter()
        .map(|r| r.served)
        .collect()
}

/// The calls the proxy marked with `fault`.
async fn marked(proxy: &ProxyControl, fault: &str) -> usize {
    proxy
        .calls()
        .await
        .unwrap()
        .iter()
        .filter(|c| c.fault.as_deref() == Some(fault))
        .count()
}

/// Manila, asked directly, holds one share of each name.
async fn one_share_each(e: &Env, names: &[String]) {
    for name in names {
        assert_eq!(
            e.manila.list_shares_named(name).await.unwrap().len(),
            1,
            "{name}"
        );
    }
}

#[tokio::test]
#[ignore = "needs root and the real test cloud (tests/openstack/cloud.py up file)"]
async fn a_throttled_manila_makes_each_share_once() {
    let _serial = SERIAL.lock().await;
    let (mut e, proxy) = proxied().await;
    proxy
        .add_fault(&FaultRule::new(
            Some("POST"),
            "/share/",
            FaultAction::Throttle {
                per_second: 1.0,
                burst: 1,
                hint: RetryHint::XRateLimitRetryAfter,
            },
        ))
        .await
        .unwrap();
    const CREATES: usize = 4;
    let names: Vec<String> = (0..CREATES)
        .map(|i| unique(&format!("throttled-{i}")))
        .collect();
    let started = Instant::now();
    let creates = names.iter().map(|n| create_until_ok(&e, n));
    let ids: Vec<String> = futures::future::join_all(creates)
        .await
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    let posts: Vec<Option<u16>> = proxy
        .calls()
        .await
        .unwrap()
        .into_iter()
        .filter(|c| c.method == "POST")
        .map(|c| c.status)
        .collect();
    let refused = posts.iter().filter(|s| **s == Some(429)).count();
    println!(
        "{CREATES} shares against real Manila throttled to one POST a second: {} POSTs ({refused} refused) in {:?}",
        posts.len(),
        started.elapsed()
    );
    // the throttle was felt, and counts every 429 it gave
    assert!(refused >= 1, "the throttle refused nothing: {posts:?}");
    assert_eq!(served(&proxy).await, [refused as u64], "{posts:?}");
    proxy.clear_faults().await.unwrap();
    one_share_each(&e, &names).await;
    for id in &ids {
        e.delete(id).await;
    }
}

#[tokio::test]
#[ignore = "needs root and the real test cloud (tests/openstack/cloud.py up file)"]
async fn a_share_whose_create_answer_was_lost_is_found_again() {
    let _serial = SERIAL.lock().await;
    let (mut e, proxy) = proxied().await;
    // the share's creation itself: Manila makes it, the answer is lost
    proxy
        .add_fault(
            &FaultRule::new(Some("POST"), "/shares", FaultAction::LoseAnswer)
                .except("/action")
                .times(1),
        )
        .await
        .unwrap();
    let name = unique("lost-create");
    let (id, retried) = create_until_ok(&e, &name).await;
    assert!(
        !retried.is_empty(),
        "the lost answer was answered retryable first"
    );
    assert_eq!(served(&proxy).await, [1]);
    assert_eq!(marked(&proxy, "answer lost").await, 1);
    proxy.clear_faults().await.unwrap();
    one_share_each(&e, std::slice::from_ref(&name)).await;
    e.delete(&id).await;
}

#[tokio::test]
#[ignore = "needs root and the real test cloud (tests/openstack/cloud.py up file)"]
async fn a_manila_outage_is_ridden_out_with_retryable_answers() {
    let _serial = SERIAL.lock().await;
    let (mut e, proxy) = proxied().await;
    real_cloud_outage("stop", "manila").await.unwrap();
    let name = unique("during-outage");
    let started = Instant::now();
    let mut c = e.c.clone();
    let during = c.create_volume(create_req(&e, &name)).await;
    let answered_in = started.elapsed();
    // the outage was felt: a call of the plugin's found Manila stopped
    let unreachable = marked(&proxy, "service unreachable").await;
    real_cloud_outage("start", "manila").await.unwrap();
    let err = during.unwrap_err();
    assert!(
        matches!(err.code(), Code::Unavailable | Code::DeadlineExceeded),
        "{err:?}"
    );
    assert!(answered_in < Duration::from_secs(22), "{answered_in:?}");
    assert!(unreachable >= 1, "no call found Manila stopped");
    let (id, retried) = create_until_ok(&e, &name).await;
    println!(
        "during the outage: {:?} in {answered_in:?}; after it, OK after {} retryable answers",
        err.code(),
        retried.len()
    );
    one_share_each(&e, std::slice::from_ref(&name)).await;
    e.delete(&id).await;
}
