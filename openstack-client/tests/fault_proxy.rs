//! The fault proxy (`openstack_emulator::proxy`, which puts the emulator's
//! faults in front of the real test cloud) in front of the emulator: a
//! client given the proxied Keystone reaches every service through the
//! proxy (the token's catalog is rewritten), the proxy's rules apply as
//! the emulator's do, and it counts the calls.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::time::Duration;

use openstack_client::cinder::{BlockStorage, CreateVolume};
use openstack_client::config::{CloudConf, ConfigEnv};
use openstack_client::{Error, RetryPolicy, Session, SessionOptions};
use openstack_emulator::proxy::{FaultProxy, ProxyControl, Upstream};
use openstack_emulator::{Emulator, EmulatorConfig, FaultAction, FaultRule, RetryHint};

/// The emulator behind a fault proxy, a session given the proxied
/// Keystone (so every call goes through the proxy), and the proxy's
/// listener for the emulator.
async fn proxied() -> (
    Emulator,
    FaultProxy,
    ProxyControl,
    Session,
    std::net::SocketAddr,
) {
    let emu = Emulator::start(EmulatorConfig::default()).await.unwrap();
    let target: std::net::SocketAddr = format!(
        "{}:{}",
        emu.url().host_str().unwrap(),
        emu.url().port().unwrap()
    )
    .parse()
    .unwrap();
    let listen = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    // the emulator serves every service on one port: one upstream
    let proxy = FaultProxy::start(
        vec![Upstream {
            service: "emulator".into(),
            listen,
            target,
        }],
        "127.0.0.1:0".parse().unwrap(),
    )
    .await
    .unwrap();
    let control = ProxyControl { admin: proxy.admin };
    let conf = emu
        .cloud_conf()
        .replace(&target.to_string(), &listen.to_string());
    let conf =
        CloudConf::from_texts(&[(PathBuf::from("p.conf"), conf)], ConfigEnv::default()).unwrap();
    let session = Session::new(
        conf.cloud("").unwrap(),
        SessionOptions {
            retry: RetryPolicy {
                min_delay: Duration::from_millis(5),
                max_delay: Duration::from_millis(40),
                max_attempts: 5,
            },
            ..Default::default()
        },
    )
    .unwrap();
    (emu, proxy, control, session, listen)
}

#[tokio::test]
async fn tokens_expired_at_the_proxy_refuse_each_old_token_once_and_let_a_new_one_through() {
    let (_emu, _proxy, control, session, _) = proxied().await;
    let cinder = BlockStorage::new(session);
    // a token issued before the rule
    cinder.list_volume_types().await.unwrap();
    control
        .add_fault(&FaultRule::new(None, "/", FaultAction::TokensExpired).except("/identity"))
        .await
        .unwrap();
    // its holder is refused, logs in again (a login carries no token and
    // is not matched) and goes on with the new token
    cinder.list_volume_types().await.unwrap();
    cinder.list_volume_types().await.unwrap();
    let rules = control.faults().await.unwrap();
    assert_eq!(
        rules.iter().map(|r| r.served).collect::<Vec<_>>(),
        [1],
        "{rules:#?}"
    );
    let calls = control.calls().await.unwrap();
    let logins = calls
        .iter()
        .filter(|c| c.method == "POST" && c.path.ends_with("/auth/tokens"))
        .count();
    assert_eq!(
        logins, 2,
        "one login, and one after the refusal: {calls:#?}"
    );
    let refused: Vec<_> = calls
        .iter()
        .filter(|c| c.fault.as_deref() == Some("token expired (401)"))
        .map(|c| (c.path.as_str(), c.status))
        .collect();
    assert_eq!(refused.len(), 1, "{calls:#?}");
    assert_eq!(refused[0].1, Some(401), "{calls:#?}");
}

#[tokio::test]
async fn a_client_of_the_proxied_keystone_goes_through_the_proxy_and_meets_its_faults() {
    let (_emu, _proxy, control, session, listen) = proxied().await;
    let cinder = BlockStorage::new(session);

    control
        .add_fault(
            &FaultRule::new(
                Some("POST"),
                "/volumes",
                FaultAction::Status {
                    status: 429,
                    message: Some("Rate limit exceeded".into()),
                    retry_after: Some(1),
                    hint: RetryHint::XRetryAfter,
                },
            )
            .times(1),
        )
        .await
        .unwrap();
    let v = cinder
        .create_volume(&CreateVolume {
            name: "through-the-proxy".into(),
            size_gib: 1,
            ..Default::default()
        })
        .await
        .unwrap();
    let calls = control.calls().await.unwrap();
    let posts: Vec<Option<u16>> = calls
        .iter()
        .filter(|c| c.method == "POST" && c.path.ends_with("/volumes"))
        .map(|c| c.status)
        .collect();
    assert_eq!(posts, [Some(429), Some(202)], "{calls:#?}");
    // the call that got the fault is marked, the other is not, and the
    // rule (spent, still listed) counts what it served
    let marks: Vec<Option<&str>> = calls
        .iter()
        .filter(|c| c.method == "POST" && c.path.ends_with("/volumes"))
        .map(|c| c.fault.as_deref())
        .collect();
    assert_eq!(marks, [Some("status 429"), None], "{calls:#?}");
    let rules = control.faults().await.unwrap();
    assert_eq!(
        rules.iter().map(|r| r.served).collect::<Vec<_>>(),
        [1],
        "{rules:#?}"
    );
    assert!(
        calls
            .iter()
            .any(|c| c.path.contains("/identity/v3/auth/tokens")),
        "the login went through the proxy: {calls:#?}"
    );
    assert!(
        calls.iter().all(|c| c.path.starts_with("/emulator/")),
        "paths carry the service's prefix"
    );

    for _ in 0..100 {
        if cinder.get_volume(&v.id).await.unwrap().status.as_str() == "available" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // the answer of a delete lost after the work: the client sees no
    // answer, the service did it
    control
        .add_fault(&FaultRule::new(Some("DELETE"), "/volumes/", FaultAction::LoseAnswer).times(1))
        .await
        .unwrap();
    let deleted = cinder.delete_volume(&v.id).await;
    // sent again (DELETE is idempotent), it finds the volume deleting:
    // Cinder refuses that (400) or it is gone already
    assert!(
        matches!(
            &deleted,
            Ok(()) | Err(Error::BadRequest(_) | Error::NotFound(_))
        ),
        "{deleted:?}"
    );
    let mut gone = false;
    for _ in 0..100 {
        if matches!(cinder.get_volume(&v.id).await, Err(e) if e.is_not_found()) {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(gone, "the service deleted it, though its answer was lost");
    let lost = control.calls().await.unwrap();
    assert_eq!(
        lost.iter()
            .filter(|c| c.fault.as_deref() == Some("answer lost"))
            .count(),
        1,
        "the lost answer is told from the others: {lost:#?}"
    );
    assert_eq!(
        control
            .faults()
            .await
            .unwrap()
            .iter()
            .map(|r| r.served)
            .collect::<Vec<_>>(),
        [1, 1]
    );
    control.clear_faults().await.unwrap();
    control.clear_calls().await.unwrap();
    let err = cinder.get_volume("no-such-volume").await.unwrap_err();
    assert!(matches!(err, Error::NotFound(_)), "{err}");
    assert_eq!(control.calls().await.unwrap().len(), 1);

    // a gateway that gives up: the caller gets its 504 at once (and, a
    // GET being safe to repeat, asks again and is answered), and the first
    // request still reaches the service later, answered to nobody
    control.clear_calls().await.unwrap();
    control
        .add_fault(
            &FaultRule::new(
                Some("GET"),
                "/volumes/gateway-probe",
                FaultAction::GatewayGaveUp {
                    status: 504,
                    serve_after_millis: 500,
                },
            )
            .times(1),
        )
        .await
        .unwrap();
    let asked = std::time::Instant::now();
    let err = cinder.get_volume("gateway-probe").await.unwrap_err();
    assert!(matches!(err, Error::NotFound(_)), "{err}");
    let probes = |calls: &[openstack_emulator::CallRecord]| {
        calls
            .iter()
            .filter(|c| c.path.ends_with("/volumes/gateway-probe"))
            .count()
    };
    let first = control.calls().await.unwrap();
    assert_eq!(
        probes(&first),
        1,
        "only the second GET served within {:?}: {first:?}",
        asked.elapsed()
    );
    let mut served = first;
    for _ in 0..100 {
        served = control.calls().await.unwrap();
        if probes(&served) == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        probes(&served),
        2,
        "the first GET reached the service later: {served:?}"
    );
    assert!(
        served
            .iter()
            .any(|c| c.fault.as_deref() == Some("gateway gave up (504)")),
        "{served:#?}"
    );

    // a rule the proxy does not take is an error, never a fault that
    // silently never happens
    let refused = ProxyControl { admin: listen }
        .add_fault(&FaultRule::new(None, "/volumes", FaultAction::Drop))
        .await;
    assert!(refused.is_err(), "{refused:?}");
}
