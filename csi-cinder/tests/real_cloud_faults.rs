//! `cinder-csi-plugin`'s controller against the real test cloud as
//! production clouds behave: through the cloud's fault proxy (its
//! Keystone's catalog names the proxy for Cinder and Nova), real Cinder
//! and Nova throttle (429 with SAP's hint), are busy (Nova's 409 while a
//! server does something else), do the work and lose the answer, and
//! hold a detach until after its caller gave up; and their APIs go away
//! for a while (`cloud.py outage`). After each, what real Cinder and Nova
//! hold (asked directly, not through the proxy) is what one fault-free
//! call leaves. Start the cloud with `python3 tests/openstack/cloud.py up
//! block` (or `all`), then `OPENSTACK_TEST_BACKEND=real cargo test -p
//! csi-cinder --test real_cloud_faults -- --ignored --test-threads=1`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use csi_sanity::harness::{
    CinderOnRealCloud, real_cloud_dir, real_cloud_fault_proxy, real_cloud_outage, test_log,
    unique_name as unique,
};
use openstack_client::cinder::BlockStorage;
use openstack_client::config::{CloudConf, ConfigEnv};
use openstack_client::nova::Compute;
use openstack_client::{Session, SessionOptions};
use openstack_emulator::proxy::ProxyControl;
use openstack_emulator::{FaultAction, FaultRule, RetryHint};
use proto::csi::v1 as csi;
use proto::csi::v1::controller_client::ControllerClient;
use proto::csi::v1::volume_capability::access_mode::Mode;
use tonic::Code;
use tonic::transport::Channel;

mod common;
use common::{BIN, create_req, mount_cap, timed};

struct Env {
    h: CinderOnRealCloud,
    c: ControllerClient<Channel>,
    proxy: ProxyControl,
    /// Cinder and Nova asked directly, not through the proxy.
    cinder: BlockStorage,
    nova: Compute,
}

async fn env(test: &str) -> Env {
    let dir = real_cloud_dir();
    let proxy = real_cloud_fault_proxy().unwrap();
    proxy.clear_faults().await.unwrap();
    let via_proxy = std::fs::read_to_string(dir.join("cloud-member-via-proxy.conf")).unwrap();
    let h = CinderOnRealCloud::start_with(
        Path::new(BIN),
        &dir,
        &via_proxy,
        &[],
        Some(test_log(&format!("cinder-csi-real-faults-{test}.log"))),
    )
    .await
    .unwrap();
    csi_sanity::harness::wait_until_ready(&h.socket)
        .await
        .unwrap();
    let ch = plugin_runtime::connect_unix(&h.socket).await.unwrap();
    let direct = std::fs::read_to_string(dir.join("cloud-member.conf")).unwrap();
    let conf = CloudConf::from_texts(&[("c".into(), direct)], ConfigEnv::default()).unwrap();
    let session = Session::new(conf.cloud("").unwrap(), SessionOptions::default()).unwrap();
    Env {
        h,
        c: ControllerClient::new(ch),
        proxy,
        cinder: BlockStorage::new(session.clone()),
        nova: Compute::new(session),
    }
}

fn cap() -> csi::VolumeCapability {
    mount_cap("ext4", Mode::SingleNodeWriter)
}

impl Env {
    fn publish_req(&self, id: &str) -> csi::ControllerPublishVolumeRequest {
        csi::ControllerPublishVolumeRequest {
            volume_id: id.into(),
            node_id: self.h.node_id.clone(),
            volume_capability: Some(cap()),
            ..Default::default()
        }
    }

    fn unpublish_req(&self, id: &str) -> csi::ControllerUnpublishVolumeRequest {
        csi::ControllerUnpublishVolumeRequest {
            volume_id: id.into(),
            node_id: self.h.node_id.clone(),
            secrets: HashMap::new(),
        }
    }

    /// The volume's servers and status, as Cinder says; and how many
    /// times Nova lists it on the node.
    async fn held(&self, id: &str) -> (Vec<String>, String, usize) {
        let v = self.cinder.get_volume(id).await.unwrap();
        let in_nova = self
            .nova
            .list_volume_attachments(&self.h.node_id)
            .await
            .unwrap()
            .iter()
            .filter(|a| a.volume_id == id)
            .count();
        (
            v.attachments
                .iter()
                .filter_map(|a| a.server_id.clone())
                .collect(),
            v.status.to_string(),
            in_nova,
        )
    }

    /// Calls of `method` whose path holds `path`, as the proxy saw them.
    async fn calls(&self, method: &str, path: &str) -> Vec<Option<u16>> {
        self.proxy
            .calls()
            .await
            .unwrap()
            .into_iter()
            .filter(|c| c.method == method && c.path.contains(path))
            .map(|c| c.status)
            .collect()
    }

    /// What each fault rule in place served (in the order added): the
    /// proof that a fault happened, not only that it was asked for.
    async fn served(&self) -> Vec<u64> {
        self.proxy
            .faults()
            .await
            .unwrap()
            .iter()
            .map(|r| r.served)
            .collect()
    }

    /// How many calls the proxy marked with `fault`.
    async fn marked(&self, fault: &str) -> usize {
        self.proxy
            .calls()
            .await
            .unwrap()
            .iter()
            .filter(|c| c.fault.as_deref() == Some(fault))
            .count()
    }

    /// Sends a request again, as the sidecars do, while the answer is
    /// retryable; the OK answer, and the retryable ones before it.
    async fn until_ok<T, F, Fut>(&self, mut call: F) -> (T, Vec<Code>)
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, tonic::Status>>,
    {
        let started = Instant::now();
        let mut seen = Vec::new();
        loop {
            match call().await {
                Ok(v) => return (v, seen.iter().map(|(c, _)| *c).collect()),
                Err(s)
                    if matches!(
                        s.code(),
                        Code::Unavailable | Code::Aborted | Code::DeadlineExceeded
                    ) =>
                {
                    seen.push((s.code(), s.message().to_string()));
                }
                Err(s) => panic!("{s:?} after {seen:#?}"),
            }
            assert!(started.elapsed() < Duration::from_secs(300), "{seen:#?}");
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    async fn cleanup(&mut self, ids: &[String]) {
        self.proxy.clear_faults().await.unwrap();
        for id in ids {
            let _ = self
                .c
                .controller_unpublish_volume(self.unpublish_req(id))
                .await;
            let _ = self
                .c
                .delete_volume(csi::DeleteVolumeRequest {
                    volume_id: id.clone(),
                    ..Default::default()
                })
                .await;
        }
    }
}

#[tokio::test]
#[ignore = "needs the real test cloud (tests/openstack/cloud.py up block) and OPENSTACK_TEST_BACKEND=real"]
async fn a_throttled_cinder_and_a_busy_nova_cost_about_one_call_each() {
    let e = env("throttled").await;
    const CREATES: usize = 6;
    e.proxy.clear_calls().await.unwrap();
    e.proxy
        .add_fault(&FaultRule::new(
            Some("POST"),
            "/volume/",
            FaultAction::Throttle {
                per_second: 1.0,
                burst: 1,
                hint: RetryHint::XRateLimitRetryAfter,
            },
        ))
        .await
        .unwrap();
    let names: Vec<String> = (0..CREATES)
        .map(|i| unique(&format!("throttled-{i}")))
        .collect();
    let started = Instant::now();
    let creates: Vec<_> = names
        .iter()
        .map(|name| {
            let mut c = e.c.clone();
            let name = name.clone();
            tokio::spawn(async move {
                loop {
                    let r = timed(create_req(&name, cap(), 1), Duration::from_secs(60));
                    match c.create_volume(r).await {
                        Ok(v) => return v.into_inner().volume.unwrap().volume_id,
                        Err(s) if s.code() == Code::Unavailable => {
                            tokio::time::sleep(Duration::from_secs(1)).await
                        }
                        Err(s) => panic!("{name}: {s:?}"),
                    }
                }
            })
        })
        .collect();
    let mut ids = Vec::new();
    for c in creates {
        ids.push(c.await.unwrap());
    }
    let posts = e.calls("POST", "/volumes").await;
    let refused = posts.iter().filter(|s| **s == Some(429)).count();
    println!(
        "{CREATES} creates against real Cinder throttled to 1/s: {} POSTs ({refused} refused) in {:?}",
        posts.len(),
        started.elapsed()
    );
    for name in &names {
        assert_eq!(
            e.cinder.volumes_named(name).await.unwrap().len(),
            1,
            "{name}"
        );
    }
    assert!(
        posts.len() <= CREATES + (CREATES - 1) + 2,
        "{} POSTs for {CREATES} volumes: {posts:?}",
        posts.len()
    );
    // the throttle was felt: at least one create refused (six at once
    // against one a second), and the rule counts every 429 it gave
    assert!(refused >= 1, "the throttle refused nothing: {posts:?}");
    assert_eq!(e.served().await, [refused as u64], "{posts:?}");
    e.proxy.clear_faults().await.unwrap();

    // Nova busy with the server twice, then the attach
    let busy = format!(
        "Cannot 'attach_volume' instance {} while it is in task_state rebooting",
        e.h.node_id
    );
    e.proxy
        .add_fault(
            &FaultRule::new(
                Some("POST"),
                "/os-volume_attachments",
                FaultAction::Status {
                    status: 409,
                    message: Some(busy),
                    retry_after: None,
                    hint: RetryHint::None,
                },
            )
            .times(2),
        )
        .await
        .unwrap();
    e.proxy.clear_calls().await.unwrap();
    let (_, retried) = e
        .until_ok(|| {
            let r = e.publish_req(&ids[0]);
            let mut c = e.c.clone();
            async move { c.controller_publish_volume(r).await }
        })
        .await;
    assert_eq!(
        e.calls("POST", "/os-volume_attachments").await,
        [Some(409), Some(409), Some(200)],
        "asked again while busy (retryable answers: {retried:?})"
    );
    assert_eq!(e.served().await, [2], "both busy answers were given");
    assert_eq!(
        e.held(&ids[0]).await,
        (vec![e.h.node_id.clone()], "in-use".to_string(), 1)
    );
    let mut e = e;
    e.cleanup(&ids).await;
}

#[tokio::test]
#[ignore = "needs the real test cloud (tests/openstack/cloud.py up block) and OPENSTACK_TEST_BACKEND=real"]
async fn answers_real_cinder_and_nova_lost_after_the_work_are_found_again() {
    let mut e = env("lost").await;
    // a create
    e.proxy
        .add_fault(&FaultRule::new(Some("POST"), "/volumes", FaultAction::LoseAnswer).times(1))
        .await
        .unwrap();
    let name = unique("lost-create");
    let err =
        e.c.create_volume(create_req(&name, cap(), 1))
            .await
            .unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{}", err.message());
    let (v, _) = e
        .until_ok(|| {
            let mut c = e.c.clone();
            let r = create_req(&name, cap(), 1);
            async move { c.create_volume(r).await }
        })
        .await;
    let id = v.into_inner().volume.unwrap().volume_id;
    assert_eq!(e.cinder.volumes_named(&name).await.unwrap().len(), 1);

    // an attach
    e.proxy
        .add_fault(
            &FaultRule::new(
                Some("POST"),
                "/os-volume_attachments",
                FaultAction::LoseAnswer,
            )
            .times(1),
        )
        .await
        .unwrap();
    let err =
        e.c.controller_publish_volume(e.publish_req(&id))
            .await
            .unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{}", err.message());
    e.until_ok(|| {
        let mut c = e.c.clone();
        let r = e.publish_req(&id);
        async move { c.controller_publish_volume(r).await }
    })
    .await;
    assert_eq!(
        e.held(&id).await,
        (vec![e.h.node_id.clone()], "in-use".to_string(), 1),
        "attached once"
    );

    // a detach
    e.proxy
        .add_fault(
            &FaultRule::new(
                Some("DELETE"),
                "/os-volume_attachments/",
                FaultAction::LoseAnswer,
            )
            .times(1),
        )
        .await
        .unwrap();
    e.until_ok(|| {
        let mut c = e.c.clone();
        let r = e.unpublish_req(&id);
        async move { c.controller_unpublish_volume(r).await }
    })
    .await;
    assert_eq!(e.held(&id).await, (vec![], "available".to_string(), 0));
    // each of the three answers was lost, once
    assert_eq!(e.served().await, [1, 1, 1]);
    assert_eq!(e.marked("answer lost").await, 3);
    e.cleanup(&[id]).await;
}

/// gcp-pd-csi-driver #965 on real Nova: a detach that waits 3 s before
/// Nova sees it, its caller gone after 1 s, a publish at once: the publish
/// answers OK only once the detach is done, and the volume stays attached.
#[tokio::test]
#[ignore = "needs the real test cloud (tests/openstack/cloud.py up block) and OPENSTACK_TEST_BACKEND=real"]
async fn a_late_detach_never_undoes_a_newer_attach_on_real_nova() {
    let mut e = env("late-detach").await;
    let v =
        e.c.create_volume(create_req(&unique("late-detach"), cap(), 1))
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
    let id = v.volume_id;
    e.c.controller_publish_volume(e.publish_req(&id))
        .await
        .unwrap();
    e.proxy
        .add_fault(
            &FaultRule::new(
                Some("DELETE"),
                &format!("/os-volume_attachments/{id}"),
                FaultAction::Delay { millis: 3000 },
            )
            .times(1),
        )
        .await
        .unwrap();
    let gave_up =
        e.c.controller_unpublish_volume(timed(e.unpublish_req(&id), Duration::from_secs(1)))
            .await
            .unwrap_err();
    assert!(
        matches!(gave_up.code(), Code::DeadlineExceeded | Code::Cancelled),
        "{gave_up:?}"
    );
    assert_eq!(e.served().await, [1], "the detach was delayed");
    let started = Instant::now();
    let (_, retried) = e
        .until_ok(|| {
            let mut c = e.c.clone();
            let r = timed(e.publish_req(&id), Duration::from_secs(60));
            async move { c.controller_publish_volume(r).await }
        })
        .await;
    println!(
        "publish OK {:?} after the unpublish gave up, after {} retryable answers",
        started.elapsed(),
        retried.len()
    );
    // past the late detach and what Nova does for it
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert_eq!(
        e.held(&id).await,
        (vec![e.h.node_id.clone()], "in-use".to_string(), 1),
        "the publish answered OK: the volume stays attached"
    );
    e.cleanup(&[id]).await;
}

/// Cinder's API gone for a while: CreateVolume answers a retryable code
/// within its deadline, and succeeds once the API is back.
#[tokio::test]
#[ignore = "needs the real test cloud (tests/openstack/cloud.py up block) and OPENSTACK_TEST_BACKEND=real"]
async fn a_cinder_outage_is_ridden_out_with_retryable_answers() {
    let mut e = env("outage").await;
    // the plugin has its token and catalog before the outage
    e.c.list_volumes(csi::ListVolumesRequest::default())
        .await
        .unwrap();
    e.proxy.clear_calls().await.unwrap();
    real_cloud_outage("stop", "cinder").await.unwrap();
    let name = unique("during-outage");
    let started = Instant::now();
    let err =
        e.c.create_volume(timed(create_req(&name, cap(), 1), Duration::from_secs(10)))
            .await
            .unwrap_err();
    let answered_in = started.elapsed();
    // the outage was felt: a call of the plugin's found Cinder gone
    let unreachable = e.marked("service unreachable").await;
    let back = real_cloud_outage("start", "cinder").await;
    back.unwrap();
    assert!(unreachable >= 1, "no call found Cinder stopped");
    assert!(
        matches!(err.code(), Code::Unavailable | Code::DeadlineExceeded),
        "{err:?}"
    );
    assert!(answered_in < Duration::from_secs(12), "{answered_in:?}");
    let (v, retried) = e
        .until_ok(|| {
            let mut c = e.c.clone();
            let r = create_req(&name, cap(), 1);
            async move { c.create_volume(r).await }
        })
        .await;
    println!(
        "during the outage: {:?} in {answered_in:?}; after it, OK after {} retryable answers",
        err.code(),
        retried.len()
    );
    let id = v.into_inner().volume.unwrap().volume_id;
    assert_eq!(e.cinder.volumes_named(&name).await.unwrap().len(), 1);
    e.cleanup(&[id]).await;
}
