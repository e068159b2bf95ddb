//! A cloud that throttles and is busy, as public clouds are: rate
//! limiters' 429s with each way of saying when to come back, Nova's 409
//! for a server in the middle of another operation, and a wave of calls
//! against a limit. The client waits as long as it is asked (never
//! shorter), sends a refused POST again only when nothing was done, and
//! spends about one call per operation however hard it is throttled.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use openstack_client::cinder::{BlockStorage, CreateVolume, ListVolumes};
use openstack_client::config::{CloudConf, ConfigEnv};
use openstack_client::nova::Compute;
use openstack_client::{ApiMetrics, Error, RetryPolicy, Session, SessionOptions};
use openstack_emulator::{Emulator, EmulatorConfig, FaultAction, FaultRule, RetryHint};

async fn start() -> Emulator {
    Emulator::start(EmulatorConfig::default()).await.unwrap()
}

fn session(emu: &Emulator, metrics: Option<ApiMetrics>) -> Session {
    let conf = CloudConf::from_texts(
        &[(PathBuf::from("emulator.conf"), emu.cloud_conf())],
        ConfigEnv::default(),
    )
    .unwrap();
    Session::new(
        conf.cloud("").unwrap(),
        SessionOptions {
            retry: RetryPolicy {
                min_delay: Duration::from_millis(5),
                max_delay: Duration::from_millis(40),
                max_attempts: 5,
            },
            default_timeout: Duration::from_secs(30),
            metrics,
            ..Default::default()
        },
    )
    .unwrap()
}

/// When the emulator answered each call of `method` whose path contains
/// `path`, in milliseconds since the Unix epoch.
fn call_times(emu: &Emulator, method: &str, path: &str) -> Vec<(u64, Option<u16>)> {
    emu.control()
        .calls()
        .iter()
        .filter(|c| c.method == method && c.path.contains(path))
        .map(|c| (c.at_ms, c.status))
        .collect()
}

fn refusal(status: u16, message: &str, retry_after: Option<u64>, hint: RetryHint) -> FaultAction {
    FaultAction::Status {
        status,
        message: Some(message.into()),
        retry_after,
        hint,
    }
}

#[tokio::test]
async fn every_way_of_saying_when_to_come_back_is_honoured() {
    let emu = start().await;
    let cinder = BlockStorage::new(session(&emu, None));
    for hint in [
        RetryHint::RetryAfter,
        RetryHint::RetryAfterDate,
        RetryHint::XRetryAfter,
        RetryHint::XRateLimitRetryAfter,
    ] {
        emu.control().clear_calls();
        emu.control().add_fault(
            FaultRule::new(
                Some("GET"),
                "/types",
                refusal(429, "Rate limit exceeded", Some(1), hint),
            )
            .times(1),
        );
        cinder.list_volume_types().await.unwrap();
        let calls = call_times(&emu, "GET", "/types");
        assert_eq!(
            calls.iter().map(|c| c.1).collect::<Vec<_>>(),
            [Some(429), Some(200)],
            "{hint:?}"
        );
        let waited = calls[1].0 - calls[0].0;
        assert!(
            waited >= 950,
            "{hint:?}: sent again after {waited} ms, asked 1 s"
        );
        println!("{hint:?}: sent again after {waited} ms (asked 1 s)");
    }
    // no hint at all: retried after the client's own backoff
    emu.control().clear_calls();
    emu.control().add_fault(
        FaultRule::new(
            Some("GET"),
            "/types",
            refusal(429, "Rate limit exceeded", None, RetryHint::None),
        )
        .times(1),
    );
    cinder.list_volume_types().await.unwrap();
    assert_eq!(call_times(&emu, "GET", "/types").len(), 2);
}

#[tokio::test]
async fn a_post_refused_before_any_work_is_sent_again_and_does_its_work_once() {
    let emu = start().await;
    let s = session(&emu, None);
    let cinder = BlockStorage::new(s.clone());
    let nova = Compute::new(s);

    // a rate limiter's 429 to a create: nothing was created, so it is
    // sent again, and one volume is made
    emu.control().add_fault(
        FaultRule::new(
            Some("POST"),
            "/volumes",
            refusal(
                429,
                "Rate limit exceeded",
                Some(1),
                RetryHint::XRateLimitRetryAfter,
            ),
        )
        .times(1),
    );
    let v = cinder
        .create_volume(&CreateVolume {
            name: "throttled-once".into(),
            size_gib: 1,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(call_times(&emu, "POST", "/volumes").len(), 2);
    let named = cinder
        .list_volumes(&ListVolumes {
            name: Some("throttled-once".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(named.items.len(), 1, "one volume");

    // Nova busy with another operation of the server: refused before any
    // work, so the attach is asked again until the server is free
    let server = emu
        .control()
        .create_server("admin", "busy-node", "nova")
        .unwrap();
    let busy =
        format!("Cannot 'attach_volume' instance {server} while it is in task_state rebooting");
    emu.control().add_fault(
        FaultRule::new(
            Some("POST"),
            "/os-volume_attachments",
            refusal(409, &busy, None, RetryHint::None),
        )
        .times(2),
    );
    let ready = wait_available(&cinder, &v.id).await;
    assert!(ready, "the volume became available");
    nova.attach_volume(&server, &v.id, false).await.unwrap();
    assert_eq!(
        call_times(&emu, "POST", "/os-volume_attachments").len(),
        3,
        "two busy answers, then the attach"
    );

    // a server that is shelved or in error is not busy: not asked again
    emu.control().clear_calls();
    let stuck = format!(
        "Cannot 'attach_volume' instance {server} while it is in vm_state shelved_offloaded"
    );
    emu.control().add_fault(
        FaultRule::new(
            Some("POST"),
            "/os-volume_attachments",
            refusal(409, &stuck, None, RetryHint::None),
        )
        .times(1),
    );
    let err = nova.attach_volume(&server, &v.id, false).await.unwrap_err();
    assert!(matches!(err, Error::Conflict(_)), "{err}");
    assert_eq!(call_times(&emu, "POST", "/os-volume_attachments").len(), 1);

    // a 503 to a POST may follow work done: never sent again
    emu.control().clear_calls();
    emu.control().add_fault(
        FaultRule::new(
            Some("POST"),
            "/volumes",
            refusal(503, "unavailable", Some(1), RetryHint::RetryAfter),
        )
        .times(1),
    );
    let err = cinder
        .create_volume(&CreateVolume {
            name: "after-503".into(),
            size_gib: 1,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Unavailable(_)), "{err}");
    assert_eq!(call_times(&emu, "POST", "/volumes").len(), 1);
}

async fn wait_available(cinder: &BlockStorage, id: &str) -> bool {
    for _ in 0..200 {
        if cinder.get_volume(id).await.unwrap().status.as_str() == "available" {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

#[tokio::test]
async fn a_wait_past_the_deadline_is_answered_at_once_and_nothing_more_is_sent() {
    let emu = start().await;
    let cinder = BlockStorage::new(session(&emu, None));
    emu.control().add_fault(
        FaultRule::new(
            Some("GET"),
            "/types",
            refusal(
                429,
                "Rate limit exceeded",
                Some(120),
                RetryHint::XRetryAfter,
            ),
        )
        .times(1),
    );
    let started = Instant::now();
    let err = cinder
        .with_deadline(Instant::now() + Duration::from_secs(5))
        .list_volume_types()
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::RateLimited { retry_after: Some(d), .. } if d >= Duration::from_secs(100)),
        "the service's own answer, with its hint: {err}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "answered before its deadline, not after 120 s: {:?}",
        started.elapsed()
    );
    // the next call of that operation is not sent at all while the
    // service asked to wait; another operation is
    let err = cinder
        .with_deadline(Instant::now() + Duration::from_secs(5))
        .list_volume_types()
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::RateLimited { error, .. } if error.message.starts_with("not sent")),
        "{err}"
    );
    assert_eq!(call_times(&emu, "GET", "/types").len(), 1);
    cinder.absolute_limits().await.unwrap();
}

/// 60 calls at once against a limit of 10 per second: every one is
/// answered, and the cloud sees about one call per operation more than
/// the first burst it refused, not a herd of retries round after round.
#[tokio::test]
async fn a_wave_of_calls_against_a_rate_limit_costs_about_one_call_each() {
    const CALLS: usize = 60;
    let emu = start().await;
    let metrics = ApiMetrics::default();
    let cinder = BlockStorage::new(session(&emu, Some(metrics.clone())));
    let v = cinder
        .create_volume(&CreateVolume {
            name: "read-often".into(),
            size_gib: 1,
            ..Default::default()
        })
        .await
        .unwrap();
    emu.control().clear_calls();
    emu.control().add_fault(FaultRule::new(
        Some("GET"),
        &format!("/volumes/{}", v.id),
        FaultAction::Throttle {
            per_second: 10.0,
            burst: 5,
            hint: RetryHint::XRateLimitRetryAfter,
        },
    ));
    let started = Instant::now();
    let reads: Vec<_> = (0..CALLS)
        .map(|_| {
            let cinder = cinder.clone();
            let id = v.id.clone();
            tokio::spawn(async move { cinder.get_volume(&id).await })
        })
        .collect();
    let mut failed = Vec::new();
    for r in reads {
        if let Err(e) = r.await.unwrap() {
            failed.push(e.to_string());
        }
    }
    let took = started.elapsed();
    let calls = call_times(&emu, "GET", &format!("/volumes/{}", v.id));
    let refused = calls.iter().filter(|c| c.1 == Some(429)).count();
    println!(
        "{CALLS} reads against 10/s (bursts of 5): {} calls ({:.2} per read), {refused} refused, all answered in {took:?}",
        calls.len(),
        calls.len() as f64 / CALLS as f64
    );
    assert!(failed.is_empty(), "{failed:#?}");
    // the first burst goes out before anything is known (CALLS - 5
    // refused); after it, about one call per read
    assert!(
        calls.len() <= 2 * CALLS + CALLS / 5,
        "{} calls for {CALLS} reads",
        calls.len()
    );
    let mut registry = prometheus_client::registry::Registry::default();
    metrics.register(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    let waited: f64 = text
        .lines()
        .find(|l| {
            l.starts_with("openstack_api_throttle_wait_seconds_total") && l.contains("volume_get")
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0.0);
    assert!(waited > 0.0, "the wait is counted:\n{text}");
}
