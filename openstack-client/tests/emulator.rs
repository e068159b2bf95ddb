//! The client library against the emulator, over real HTTP.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use openstack_client::barbican::{CreateSecret, KeyManager};
use openstack_client::cinder::{
    BlockStorage, CreateSnapshot, CreateVolume, ListSnapshots, ListVolumes, SnapshotStatus,
    VolumeStatus,
};
use openstack_client::common::{Poll, poll_until};
use openstack_client::config::{CloudConf, ConfigEnv, MetadataOptions, MetadataSource};
use openstack_client::manila::{
    AccessRuleState, CreateShare, GrantAccess, ShareStatus, SharedFileSystems,
};
use openstack_client::metadata::MetadataReader;
use openstack_client::nova::Compute;
use openstack_client::{ApiMetrics, Error, RetryPolicy, ServiceType, Session, SessionOptions};
use openstack_emulator::{Emulator, EmulatorConfig, FaultAction, FaultRule};
use zeroize::Zeroizing;

mod common;
use common::{wait_rule, wait_share, wait_volume};

async fn start() -> Emulator {
    Emulator::start(EmulatorConfig::default()).await.unwrap()
}

fn conf(emu: &Emulator) -> CloudConf {
    CloudConf::from_texts(
        &[(PathBuf::from("emulator.conf"), emu.cloud_conf())],
        ConfigEnv::default(),
    )
    .unwrap()
}

fn fast_options() -> SessionOptions {
    SessionOptions {
        retry: RetryPolicy {
            min_delay: Duration::from_millis(5),
            max_delay: Duration::from_millis(40),
            max_attempts: 5,
        },
        default_timeout: Duration::from_secs(20),
        ..Default::default()
    }
}

fn session(emu: &Emulator, cloud: &str) -> Session {
    Session::new(conf(emu).cloud(cloud).unwrap(), fast_options()).unwrap()
}

fn soon() -> Instant {
    Instant::now() + Duration::from_secs(10)
}

fn count_calls(emu: &Emulator, method: &str, path_contains: &str) -> usize {
    emu.control()
        .calls()
        .iter()
        .filter(|c| c.method == method && c.path.contains(path_contains))
        .count()
}

#[tokio::test]
async fn full_flow_keystone_cinder_nova_manila_barbican() {
    let emu = start().await;
    let s = session(&emu, "");
    s.authenticate().await.unwrap();
    assert!(s.project_id().await.unwrap().is_some());

    // Cinder
    let cinder = BlockStorage::new(s.clone());
    let types = cinder.list_volume_types().await.unwrap();
    let multi = types.iter().find(|t| t.name == "multiattach").unwrap();
    assert!(multi.multiattach());
    let vol = cinder
        .create_volume(&CreateVolume {
            name: "pvc-flow".into(),
            size_gib: 1,
            metadata: [(
                "cinder.csi.openstack.org/cluster".to_string(),
                "k8s".to_string(),
            )]
            .into(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(vol.status, VolumeStatus::Creating);
    let vol = wait_volume(&cinder, &vol.id, VolumeStatus::Available).await;
    assert_eq!(
        vol.metadata
            .get("cinder.csi.openstack.org/cluster")
            .map(String::as_str),
        Some("k8s")
    );
    assert_eq!(cinder.volumes_named("pvc-flow").await.unwrap().len(), 1);

    // Nova attach, then Cinder shows the attachment
    let server = emu
        .control()
        .create_server("admin", "node-1", "nova")
        .unwrap();
    let nova = Compute::new(s.clone());
    assert_eq!(
        nova.get_server(&server)
            .await
            .unwrap()
            .availability_zone
            .as_deref(),
        Some("nova")
    );
    let att = nova.attach_volume(&server, &vol.id, false).await.unwrap();
    assert_eq!(att.volume_id, vol.id);
    let attached = wait_volume(&cinder, &vol.id, VolumeStatus::InUse).await;
    assert_eq!(
        attached.attached_servers().collect::<Vec<_>>(),
        vec![server.as_str()]
    );
    assert_eq!(
        nova.list_volume_attachments(&server).await.unwrap().len(),
        1
    );
    // online extend (3.42) while attached
    cinder.extend_volume(&vol.id, 2, true).await.unwrap();
    let grown = wait_volume(&cinder, &vol.id, VolumeStatus::InUse).await;
    assert_eq!(grown.size, 2);
    nova.detach_volume(&server, &vol.id).await.unwrap();
    let detached = wait_volume(&cinder, &vol.id, VolumeStatus::Available).await;
    assert!(detached.attachments.is_empty());

    // snapshots
    let snap = cinder
        .create_snapshot(&CreateSnapshot {
            volume_id: vol.id.clone(),
            name: "snap-1".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    poll_until(
        "snap",
        soon(),
        Duration::from_millis(10),
        Duration::from_millis(50),
        || async {
            let s = cinder.get_snapshot(&snap.id).await?;
            Ok(if s.status == SnapshotStatus::Available {
                Poll::Ready(())
            } else {
                Poll::Pending(s.status.to_string())
            })
        },
    )
    .await
    .unwrap();
    let by_vol = cinder
        .list_snapshots(&ListSnapshots {
            volume_id: Some(vol.id.clone()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(by_vol.items.len(), 1);
    let restored = cinder
        .create_volume(&CreateVolume {
            name: "restored".into(),
            size_gib: 2,
            snapshot_id: Some(snap.id.clone()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(restored.snapshot_id.as_deref(), Some(snap.id.as_str()));
    wait_volume(&cinder, &restored.id, VolumeStatus::Available).await;
    cinder.delete_snapshot(&snap.id).await.unwrap();

    // Manila
    let manila = SharedFileSystems::new(s.clone());
    assert_eq!(manila.microversion().await.unwrap().to_string(), "2.65");
    let share = manila
        .create_share(&CreateShare {
            protocol: "NFS".into(),
            size_gib: 1,
            name: "pvc-share".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    wait_share(&manila, &share.id, ShareStatus::Available).await;
    let exports = manila.list_export_locations(&share.id).await.unwrap();
    assert!(
        exports
            .iter()
            .any(|e| e.preferred && e.path.starts_with("127.0.0.1:/"))
    );
    let rule = manila
        .grant_access(
            &share.id,
            &GrantAccess {
                access_type: "ip".into(),
                access_to: "127.0.0.1/32".into(),
                access_level: "rw".into(),
            },
        )
        .await
        .unwrap();
    assert_eq!(rule.state, AccessRuleState::QueuedToApply);
    wait_rule(&manila, &share.id, &rule.id, AccessRuleState::Active).await;
    manila.extend_share(&share.id, 3).await.unwrap();

    // Barbican
    let barbican = KeyManager::new(s.clone());
    let key = Zeroizing::new(vec![7u8; 32]);
    let secret = barbican
        .create_secret(&CreateSecret {
            name: "kek".into(),
            payload: Some(key.clone()),
            algorithm: Some("aes".into()),
            bit_length: Some(256),
            mode: Some("gcm".into()),
            secret_type: "symmetric".into(),
        })
        .await
        .unwrap();
    assert_eq!(barbican.get_secret(&secret).await.unwrap().uuid(), secret);
    assert_eq!(*barbican.get_secret_payload(&secret).await.unwrap(), *key);
    let order = barbican
        .create_key_order("generated", "aes", 256, "gcm")
        .await
        .unwrap();
    let generated = barbican.wait_for_order(&order, soon()).await.unwrap();
    assert_eq!(
        barbican.get_secret_payload(&generated).await.unwrap().len(),
        32
    );
    assert_eq!(
        barbican
            .list_secrets(Some("kek"), 10, 0)
            .await
            .unwrap()
            .len(),
        1
    );
    barbican.delete_secret(&secret).await.unwrap();
    assert!(
        barbican
            .get_secret(&secret)
            .await
            .unwrap_err()
            .is_not_found()
    );
    emu.shutdown().await;
}

#[tokio::test]
async fn catalog_aliases_are_all_understood() {
    let emu = start().await;
    for (service, types) in [
        ("block-storage", &["volumev3"][..]),
        ("block-storage", &["volume"][..]),
        ("block-storage", &["block-storage"][..]),
        ("shared-file-system", &["shared-file-system"][..]),
        ("shared-file-system", &["share"][..]),
        ("shared-file-system", &["sharev2"][..]),
    ] {
        emu.control().set_catalog_types(service, types);
        let s = session(&emu, "");
        if service == "block-storage" {
            BlockStorage::new(s)
                .list_volume_types()
                .await
                .unwrap_or_else(|e| panic!("{types:?}: {e}"));
        } else {
            SharedFileSystems::new(s)
                .list_share_types()
                .await
                .unwrap_or_else(|e| panic!("{types:?}: {e}"));
        }
    }
    // a service missing from the catalog is a clear error
    emu.control().set_catalog_types("key-manager", &[]);
    let err = KeyManager::new(session(&emu, ""))
        .list_secrets(None, 1, 0)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::EndpointNotFound {
                service: "key-manager",
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("no key-manager endpoint"), "{err}");
}

#[tokio::test]
async fn endpoint_override_wins_over_catalog() {
    let emu = start().await;
    let s = session(&emu, "");
    let real = s.endpoint(ServiceType::BlockStorage).await.unwrap();
    let mut cfg = conf(&emu).cloud("").unwrap();
    cfg.endpoint_overrides.insert(
        ServiceType::BlockStorage,
        url::Url::parse("http://127.0.0.1:9/volume/v3/x").unwrap(),
    );
    let overridden = Session::new(cfg.clone(), fast_options()).unwrap();
    assert_eq!(
        overridden
            .endpoint(ServiceType::BlockStorage)
            .await
            .unwrap()
            .as_str(),
        "http://127.0.0.1:9/volume/v3/x"
    );
    cfg.endpoint_overrides
        .insert(ServiceType::BlockStorage, real.clone());
    let s2 = Session::new(cfg, fast_options()).unwrap();
    BlockStorage::new(s2).list_volume_types().await.unwrap();
}

#[tokio::test]
async fn token_expiry_refreshes_and_401_reauthenticates_once() {
    let emu = start().await;
    let s = session(&emu, "");
    let cinder = BlockStorage::new(s.clone());
    cinder.list_volume_types().await.unwrap();
    assert_eq!(s.authentications(), 1);
    cinder.list_volume_types().await.unwrap();
    assert_eq!(s.authentications(), 1, "a fresh token is reused");

    // revoked server-side: the next call gets a 401, re-authenticates once
    emu.control().revoke_tokens();
    cinder.list_volume_types().await.unwrap();
    assert_eq!(s.authentications(), 2);
    assert_eq!(
        emu.control()
            .calls()
            .iter()
            .filter(|c| c.status == Some(401))
            .count(),
        1
    );

    // concurrent callers hit by the same 401 share one re-authentication
    emu.control().revoke_tokens();
    let calls: Vec<_> = (0..12)
        .map(|_| {
            let c = cinder.clone();
            tokio::spawn(async move { c.list_volume_types().await })
        })
        .collect();
    for c in calls {
        c.await.unwrap().unwrap();
    }
    assert_eq!(s.authentications(), 3);

    // a short-lived token is renewed before it expires
    emu.control().set_token_lifetime(Duration::from_secs(2));
    let short = session(&emu, "");
    BlockStorage::new(short.clone())
        .list_volume_types()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    BlockStorage::new(short.clone())
        .list_volume_types()
        .await
        .unwrap();
    assert_eq!(
        short.authentications(),
        2,
        "renewed within the refresh margin (half its lifetime)"
    );

    // a token that keeps being refused is not retried forever
    emu.control().add_fault(FaultRule::new(
        Some("GET"),
        "/types",
        FaultAction::Status {
            status: 401,
            message: None,
            retry_after: None,
            hint: Default::default(),
        },
    ));
    let err = cinder.list_volume_types().await.unwrap_err();
    assert!(matches!(err, Error::Unauthorized(_)), "{err}");
}

#[tokio::test]
async fn application_credentials_and_member_user() {
    let emu = start().await;
    let ac = session(&emu, "appcred");
    BlockStorage::new(ac.clone())
        .list_volume_types()
        .await
        .unwrap();
    let member = session(&emu, "member");
    let admin = session(&emu, "");
    assert_ne!(
        member.project_id().await.unwrap(),
        admin.project_id().await.unwrap()
    );

    // policy differences: reset-status is admin only; admin-only export
    // locations are hidden from members
    let cinder = BlockStorage::new(member.clone());
    let v = cinder
        .create_volume(&CreateVolume {
            name: "m".into(),
            size_gib: 1,
            ..Default::default()
        })
        .await
        .unwrap();
    wait_volume(&cinder, &v.id, VolumeStatus::Available).await;
    let err = cinder
        .reset_volume_status(&v.id, "error")
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Forbidden(_)), "{err}");

    let m = SharedFileSystems::new(member.clone());
    let share = m
        .create_share(&CreateShare {
            protocol: "NFS".into(),
            size_gib: 1,
            name: "s".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    wait_share(&m, &share.id, ShareStatus::Available).await;
    let as_member = m.list_export_locations(&share.id).await.unwrap();
    assert!(as_member.iter().all(|e| !e.is_admin_only));
    // the admin sees the member's share (admin context) with the admin-only path
    let as_admin_count = {
        let base = admin.endpoint(ServiceType::SharedFileSystem).await.unwrap();
        assert!(base.as_str().contains("/share/v2/"));
        as_member.len()
    };
    assert_eq!(as_admin_count, 1);
}

#[tokio::test]
async fn a_server_made_under_a_real_machines_id_is_the_members_and_attaches() {
    let emu = Emulator::start(EmulatorConfig {
        availability_zones: vec!["az1".into(), "az2".into()],
        ..Default::default()
    })
    .await
    .unwrap();
    let id = "6f1c3a52-0d5e-4c8e-9a41-2b7d9e3f8a10";
    assert!(
        emu.control()
            .create_server_as(id, "demo", "node-b", "az2", 1)
    );
    // an id taken, or a project nobody knows: refused
    assert!(
        !emu.control()
            .create_server_as(id, "demo", "again", "az2", 1)
    );
    assert!(
        !emu.control()
            .create_server_as("other", "nobody", "x", "az1", 1)
    );

    let member = session(&emu, "member");
    let nova = Compute::new(member.clone());
    let server = nova.get_server(id).await.unwrap();
    assert_eq!(
        (server.id.as_str(), server.availability_zone.as_deref()),
        (id, Some("az2"))
    );
    let cinder = BlockStorage::new(member);
    let v = cinder
        .create_volume(&CreateVolume {
            name: "v".into(),
            size_gib: 1,
            availability_zone: Some("az2".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    wait_volume(&cinder, &v.id, VolumeStatus::Available).await;
    nova.attach_volume(id, &v.id, false).await.unwrap();
    wait_volume(&cinder, &v.id, VolumeStatus::InUse).await;
}

#[tokio::test]
async fn idempotent_requests_retry_and_posts_never_do() {
    let emu = start().await;
    let s = session(&emu, "");
    let cinder = BlockStorage::new(s.clone());
    let v = cinder
        .create_volume(&CreateVolume {
            name: "r".into(),
            size_gib: 1,
            ..Default::default()
        })
        .await
        .unwrap();
    emu.control().clear_calls();

    // two 503s then success
    emu.control().add_fault(
        FaultRule::new(
            Some("GET"),
            &format!("/volumes/{}", v.id),
            FaultAction::Status {
                status: 503,
                message: None,
                retry_after: None,
                hint: Default::default(),
            },
        )
        .times(2),
    );
    cinder.get_volume(&v.id).await.unwrap();
    assert_eq!(count_calls(&emu, "GET", &format!("/volumes/{}", v.id)), 3);

    // a dropped connection on GET is retried
    emu.control().add_fault(
        FaultRule::new(
            Some("GET"),
            &format!("/volumes/{}", v.id),
            FaultAction::Drop,
        )
        .times(1),
    );
    cinder.get_volume(&v.id).await.unwrap();

    // 429 with Retry-After is retried after waiting
    emu.control().add_fault(
        FaultRule::new(
            Some("GET"),
            "/types",
            FaultAction::Status {
                status: 429,
                message: Some("slow down".into()),
                retry_after: Some(0),
                hint: Default::default(),
            },
        )
        .times(1),
    );
    cinder.list_volume_types().await.unwrap();

    // DELETE is idempotent too
    emu.control().add_fault(
        FaultRule::new(
            Some("DELETE"),
            "/snapshots/",
            FaultAction::Status {
                status: 502,
                message: None,
                retry_after: None,
                hint: Default::default(),
            },
        )
        .times(1),
    );
    let err = cinder
        .delete_snapshot("no-such-snapshot")
        .await
        .unwrap_err();
    assert!(err.is_not_found(), "retried then 404: {err}");

    // a POST is not repeated, neither after a 503 nor after a dropped connection
    emu.control().clear_calls();
    emu.control().add_fault(
        FaultRule::new(
            Some("POST"),
            "/volumes",
            FaultAction::Status {
                status: 503,
                message: None,
                retry_after: None,
                hint: Default::default(),
            },
        )
        .times(1),
    );
    let err = cinder
        .create_volume(&CreateVolume {
            name: "p".into(),
            size_gib: 1,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Unavailable(_)), "{err}");
    emu.control()
        .add_fault(FaultRule::new(Some("POST"), "/volumes", FaultAction::Drop).times(1));
    let err = cinder
        .create_volume(&CreateVolume {
            name: "p".into(),
            size_gib: 1,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Unavailable(_)), "{err}");
    assert_eq!(
        count_calls(&emu, "POST", "/volumes"),
        2,
        "one POST per create, no retry"
    );

    // persistent failure: bounded attempts, then the last error
    emu.control().clear_calls();
    emu.control().add_fault(FaultRule::new(
        Some("GET"),
        "/limits",
        FaultAction::Status {
            status: 500,
            message: Some("db down".into()),
            retry_after: None,
            hint: Default::default(),
        },
    ));
    let err = cinder.absolute_limits().await.unwrap_err();
    assert!(err.to_string().contains("db down"), "{err}");
    assert_eq!(count_calls(&emu, "GET", "/limits"), 5);
}

#[tokio::test]
async fn the_caller_deadline_bounds_retries_and_slow_answers() {
    let emu = start().await;
    let cinder = BlockStorage::new(session(&emu, ""));
    cinder.list_volume_types().await.unwrap();
    emu.control().add_fault(FaultRule::new(
        Some("GET"),
        "/limits",
        FaultAction::Delay { millis: 3000 },
    ));
    let started = Instant::now();
    let err = cinder
        .with_deadline(Instant::now() + Duration::from_millis(300))
        .absolute_limits()
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Timeout { .. }), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );

    emu.control().clear_faults();
    emu.control().add_fault(FaultRule::new(
        Some("GET"),
        "/types",
        FaultAction::Status {
            status: 503,
            message: None,
            retry_after: None,
            hint: Default::default(),
        },
    ));
    let slow_retries = Session::new(
        conf(&emu).cloud("").unwrap(),
        SessionOptions {
            retry: RetryPolicy {
                min_delay: Duration::from_millis(200),
                max_delay: Duration::from_secs(1),
                max_attempts: 50,
            },
            ..fast_options()
        },
    )
    .unwrap();
    let started = Instant::now();
    let err = BlockStorage::new(slow_retries)
        .with_deadline(Instant::now() + Duration::from_millis(700))
        .list_volume_types()
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Timeout { last: Some(_), .. }), "{err}");
    assert!(started.elapsed() < Duration::from_millis(1500));
}

#[tokio::test]
async fn errors_carry_kind_message_and_request_id() {
    let emu = start().await;
    let s = session(&emu, "");
    let cinder = BlockStorage::new(s.clone());
    let err = cinder
        .get_volume("00000000-0000-0000-0000-000000000000")
        .await
        .unwrap_err();
    match &err {
        Error::NotFound(e) => {
            assert_eq!(e.status, Some(404));
            assert!(e.message.contains("could not be found"), "{}", e.message);
            assert!(
                e.request_id
                    .as_deref()
                    .is_some_and(|r| r.starts_with("req-"))
            );
        }
        other => panic!("{other}"),
    }
    // quota → OverQuota
    emu.control().set_quotas(openstack_emulator::Quotas {
        gigabytes: 3,
        ..Default::default()
    });
    let err = cinder
        .create_volume(&CreateVolume {
            name: "big".into(),
            size_gib: 5,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(matches!(err, Error::OverQuota(_)), "{err}");
    assert!(err.to_string().contains("gigabytes"), "{err}");
    // bad request: unknown availability zone
    let err = cinder
        .create_volume(&CreateVolume {
            name: "az".into(),
            size_gib: 1,
            availability_zone: Some("mars".into()),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::BadRequest(_)) && err.to_string().contains("mars"),
        "{err}"
    );
    // unknown volume type
    let err = cinder.get_volume_type("nope").await.unwrap_err();
    assert!(err.is_not_found());
    // Nova: unknown server
    let err = Compute::new(s.clone())
        .get_server("missing")
        .await
        .unwrap_err();
    assert!(
        err.is_not_found() && err.to_string().contains("Instance missing"),
        "{err}"
    );
    // a volume that fails to create ends in error
    emu.control().fail_next_volume_creates(1);
    let v = cinder
        .create_volume(&CreateVolume {
            name: "doomed".into(),
            size_gib: 1,
            ..Default::default()
        })
        .await
        .unwrap();
    wait_volume(&cinder, &v.id, VolumeStatus::Error).await;
    assert!(VolumeStatus::Error.is_error());
}

#[tokio::test]
async fn wrong_password_and_unreachable_keystone_are_clear_errors() {
    let emu = start().await;
    let text = emu.cloud_conf().replace("admin-secret", "wrong");
    let c = CloudConf::from_texts(&[(PathBuf::from("c"), text)], ConfigEnv::default()).unwrap();
    let err = Session::new(c.cloud("").unwrap(), fast_options())
        .unwrap()
        .authenticate()
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Unauthorized(_)), "{err}");
    assert!(
        err.to_string().contains("refused password authentication"),
        "{err}"
    );

    // a port nothing listens on
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = dead.local_addr().unwrap().port();
    drop(dead);
    let text = emu
        .cloud_conf()
        .replace(&emu.url().to_string(), &format!("http://127.0.0.1:{port}/"));
    let c = CloudConf::from_texts(&[(PathBuf::from("c"), text)], ConfigEnv::default()).unwrap();
    let err = Session::new(c.cloud("").unwrap(), fast_options())
        .unwrap()
        .authenticate()
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Unavailable(_)), "{err}");
    assert!(err.to_string().to_lowercase().contains("connect"), "{err}");
}

#[tokio::test]
async fn pagination_follows_markers_and_rejects_unknown_ones() {
    let emu = start().await;
    let cinder = BlockStorage::new(session(&emu, ""));
    for i in 0..5 {
        cinder
            .create_volume(&CreateVolume {
                name: format!("p{i}"),
                size_gib: 1,
                ..Default::default()
            })
            .await
            .unwrap();
    }
    let mut seen = Vec::new();
    let mut marker = None;
    let mut pages = 0;
    loop {
        let page = cinder
            .list_volumes(&ListVolumes {
                limit: Some(2),
                marker,
                ..Default::default()
            })
            .await
            .unwrap();
        pages += 1;
        seen.extend(page.items.into_iter().map(|v| v.name));
        match page.next_marker {
            Some(m) => marker = Some(m),
            None => break,
        }
    }
    assert_eq!(pages, 3);
    seen.sort();
    assert_eq!(seen, vec!["p0", "p1", "p2", "p3", "p4"]);
    let err = cinder
        .list_volumes(&ListVolumes {
            marker: Some("bogus".into()),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::BadRequest(_)) && err.to_string().contains("marker"),
        "{err}"
    );
}

#[tokio::test]
async fn microversions_are_negotiated_and_honoured() {
    let emu = start().await;
    let s = session(&emu, "");
    // Manila: an older server is met at its maximum, with the older
    // access-list call
    emu.control().set_manila_max_microversion(40);
    let m = SharedFileSystems::new(s.clone());
    assert_eq!(m.microversion().await.unwrap().to_string(), "2.40");
    let share = m
        .create_share(&CreateShare {
            protocol: "CEPHFS".into(),
            size_gib: 1,
            name: "c".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    wait_share(&m, &share.id, ShareStatus::Available).await;
    let rule = m
        .grant_access(
            &share.id,
            &GrantAccess {
                access_type: "cephx".into(),
                access_to: "alice".into(),
                access_level: "rw".into(),
            },
        )
        .await
        .unwrap();
    let active = wait_rule(&m, &share.id, &rule.id, AccessRuleState::Active).await;
    assert!(
        active.access_key.as_deref().is_some_and(|k| !k.is_empty()),
        "cephx rules get a key"
    );
    let exports = m.list_export_locations(&share.id).await.unwrap();
    assert!(
        exports[0].path.contains(":6789:/volumes/_nogroup/"),
        "{exports:?}"
    );
    let err = m
        .grant_access(
            &share.id,
            &GrantAccess {
                access_type: "ip".into(),
                access_to: "10.0.0.1".into(),
                access_level: "rw".into(),
            },
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::BadRequest(_)),
        "ip rules on CephFS: {err}"
    );

    // too old for this client: a clear error naming both ranges
    emu.control().set_manila_max_microversion(30);
    let err = SharedFileSystems::new(s.clone())
        .microversion()
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("2.0..2.30") && err.to_string().contains("2.37..2.65"),
        "{err}"
    );

    // Cinder: extending an attached volume needs 3.42
    let cinder = BlockStorage::new(s.clone());
    let v = cinder
        .create_volume(&CreateVolume {
            name: "mv".into(),
            size_gib: 1,
            ..Default::default()
        })
        .await
        .unwrap();
    wait_volume(&cinder, &v.id, VolumeStatus::Available).await;
    let server = emu.control().create_server("admin", "n", "nova").unwrap();
    Compute::new(s.clone())
        .attach_volume(&server, &v.id, false)
        .await
        .unwrap();
    wait_volume(&cinder, &v.id, VolumeStatus::InUse).await;
    let err = cinder
        .clone()
        .without_microversions()
        .extend_volume(&v.id, 2, true)
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::BadRequest(_)) && err.to_string().contains("in-use"),
        "{err}"
    );
    cinder.extend_volume(&v.id, 2, true).await.unwrap();

    // Nova: a multiattach volume needs 2.60
    let t = cinder.get_volume_type("multiattach").await;
    let tname = t.map(|t| t.name).unwrap_or_else(|_| "multiattach".into());
    let mv = cinder
        .create_volume(&CreateVolume {
            name: "ma".into(),
            size_gib: 1,
            volume_type: Some(tname),
            ..Default::default()
        })
        .await
        .unwrap();
    let mv = wait_volume(&cinder, &mv.id, VolumeStatus::Available).await;
    assert!(mv.multiattach);
    let nova = Compute::new(s.clone());
    let err = nova
        .attach_volume(&server, &mv.id, false)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("2.60"), "{err}");
    nova.attach_volume(&server, &mv.id, true).await.unwrap();
    let other = emu.control().create_server("admin", "n2", "nova").unwrap();
    wait_volume(&cinder, &mv.id, VolumeStatus::InUse).await;
    nova.attach_volume(&other, &mv.id, true).await.unwrap();
    poll_until(
        "two attachments",
        soon(),
        Duration::from_millis(10),
        Duration::from_millis(50),
        || async {
            let v = cinder.get_volume(&mv.id).await?;
            Ok(if v.attachments.len() == 2 {
                Poll::Ready(())
            } else {
                Poll::Pending(format!("{} attachments", v.attachments.len()))
            })
        },
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn manila_error_is_explained_by_user_messages() {
    let emu = start().await;
    let m = SharedFileSystems::new(session(&emu, ""));
    emu.control().fail_next_share_creates(1);
    let share = m
        .create_share(&CreateShare {
            protocol: "NFS".into(),
            size_gib: 1,
            name: "bad".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    poll_until(
        "share",
        soon(),
        Duration::from_millis(10),
        Duration::from_millis(50),
        || async {
            let sh = m.get_share(&share.id).await?;
            Ok(if sh.status.is_error() {
                Poll::Ready(())
            } else {
                Poll::Pending(sh.status.to_string())
            })
        },
    )
    .await
    .unwrap();
    let msgs = m.list_user_messages(&share.id).await.unwrap();
    assert!(
        msgs[0]
            .user_message
            .contains("No storage could be allocated"),
        "{msgs:?}"
    );
    m.delete_share(&share.id).await.unwrap();
    let types = m.list_share_types().await.unwrap();
    assert_eq!(
        types[0]
            .extra_specs
            .get("snapshot_support")
            .map(String::as_str),
        Some("True")
    );
}

#[tokio::test]
async fn volume_metadata_and_retype() {
    let emu = start().await;
    let cinder = BlockStorage::new(session(&emu, ""));
    let v = cinder
        .create_volume(&CreateVolume {
            name: "md".into(),
            size_gib: 1,
            ..Default::default()
        })
        .await
        .unwrap();
    wait_volume(&cinder, &v.id, VolumeStatus::Available).await;
    let md: BTreeMap<String, String> = [("a".to_string(), "1".to_string())].into();
    cinder.update_volume_metadata(&v.id, &md).await.unwrap();
    assert_eq!(
        cinder
            .get_volume_metadata(&v.id)
            .await
            .unwrap()
            .get("a")
            .map(String::as_str),
        Some("1")
    );
    let fast = cinder
        .create_volume_type(
            "fast",
            &[("volume_backend_name".to_string(), "ssd".to_string())].into(),
        )
        .await
        .unwrap();
    cinder.retype_volume(&v.id, &fast.name).await.unwrap();
    let v = wait_volume(&cinder, &v.id, VolumeStatus::Available).await;
    poll_until(
        "retype",
        soon(),
        Duration::from_millis(10),
        Duration::from_millis(50),
        || async {
            let x = cinder.get_volume(&v.id).await?;
            Ok(if x.volume_type.as_deref() == Some("fast") {
                Poll::Ready(())
            } else {
                Poll::Pending("old type".into())
            })
        },
    )
    .await
    .unwrap();
    let limits = cinder.absolute_limits().await.unwrap();
    assert_eq!(limits.total_volumes_used, 1);
    cinder.set_bootable(&v.id, true).await.unwrap();
    assert!(cinder.get_volume(&v.id).await.unwrap().bootable);
    cinder.delete_volume(&v.id).await.unwrap();
    let gone = poll_until(
        "delete",
        soon(),
        Duration::from_millis(10),
        Duration::from_millis(50),
        || async { Poll::gone(cinder.get_volume(&v.id).await, |x| x.status.to_string()) },
    )
    .await;
    assert!(gone.is_ok());
}

#[tokio::test]
async fn metrics_count_calls_by_operation_and_status() {
    let emu = start().await;
    let metrics = ApiMetrics::default();
    let mut registry = prometheus_client::registry::Registry::default();
    metrics.register(&mut registry);
    let s = Session::new(
        conf(&emu).cloud("").unwrap(),
        SessionOptions {
            metrics: Some(metrics),
            ..fast_options()
        },
    )
    .unwrap();
    let cinder = BlockStorage::new(s);
    cinder.list_volume_types().await.unwrap();
    let _ = cinder.get_volume("missing").await;
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    assert!(text.contains(r#"openstack_api_requests_total{service="block-storage",request="volume_type_list",status="200"} 1"#), "{text}");
    assert!(text.contains(r#"openstack_api_requests_total{service="block-storage",request="volume_get",status="404"} 1"#), "{text}");
    assert!(
        text.contains(
            r#"openstack_api_request_errors_total{service="block-storage",request="volume_get"} 1"#
        ),
        "{text}"
    );
    assert!(text.contains(r#"openstack_api_requests_total{service="identity",request="token_issue",status="201"} 1"#), "{text}");
    assert!(
        text.contains("openstack_api_request_duration_seconds_bucket"),
        "{text}"
    );
}

#[tokio::test]
async fn metadata_service_and_search_order() {
    let emu = start().await;
    let server = emu
        .control()
        .create_server("admin", "worker-7", "nova")
        .unwrap();
    emu.control().set_metadata_instance(Some(server.clone()));
    let mut reader = MetadataReader::new(MetadataOptions {
        search_order: vec![MetadataSource::ConfigDrive, MetadataSource::MetadataService],
        request_timeout: Some(Duration::from_secs(5)),
    });
    reader.service_url = emu.url().clone();
    let dir = tempfile::tempdir().unwrap();
    reader.by_label_dir = dir.path().to_path_buf();
    reader.config_drive_label = format!("no-such-label-{}", std::process::id());
    let md = reader.read().await.unwrap();
    assert_eq!(md.uuid, server);
    assert_eq!(md.availability_zone, "nova");
    assert_eq!(md.name, "worker-7");

    reader.options.search_order = vec![MetadataSource::ConfigDrive];
    let err = reader.read().await.unwrap_err();
    assert!(err.to_string().contains("no config drive"), "{err}");

    emu.control().set_metadata_instance(None);
    reader.options.search_order = vec![MetadataSource::MetadataService];
    let err = reader.read().await.unwrap_err();
    assert!(err.to_string().contains("HTTP 404"), "{err}");
}

#[tokio::test]
async fn clouds_yaml_written_by_the_emulator_works() {
    let emu = start().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("clouds.yaml"), emu.clouds_yaml()).unwrap();
    let env = ConfigEnv {
        clouds_yaml: openstack_client::config::CloudsYamlSearch {
            dirs: vec![dir.path().to_path_buf()],
            ..Default::default()
        },
        os_cloud: Some("emulator-member".into()),
        ..Default::default()
    };
    let cfg = openstack_client::config::clouds_yaml::cloud_from_clouds_yaml(&env, None).unwrap();
    let s = Session::new(cfg, fast_options()).unwrap();
    s.authenticate().await.unwrap();
    BlockStorage::new(s).list_volume_types().await.unwrap();
}

/// A server that answers every request with a 302 to `location`, and
/// counts the connections it gets.
async fn redirector(location: String) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let n = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = n.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let location = location.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 65536];
                let _ = s.read(&mut buf).await;
                let answer = format!(
                    "HTTP/1.1 302 Found\r\nLocation: {location}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                );
                let _ = s.write_all(answer.as_bytes()).await;
            });
        }
    });
    (format!("http://{addr}"), n)
}

#[tokio::test]
async fn no_token_or_password_follows_a_redirect() {
    let emu = start().await;
    // where a redirect would lead: a server that must never be reached
    let (elsewhere, reached) = redirector("http://127.0.0.1:9/".into()).await;
    let (keystone, _) = redirector(format!("{elsewhere}/v3/auth/tokens")).await;
    let mut cfg = conf(&emu).cloud("").unwrap();
    cfg.auth_url = format!("{keystone}/v3").parse().unwrap();
    let s = Session::new(cfg, fast_options()).unwrap();
    let err = s.authenticate().await.unwrap_err().to_string();
    assert!(err.contains("302") && err.contains(&elsewhere), "{err}");

    // an API endpoint that redirects: the token is not sent on
    let (cinder, _) = redirector(format!("{elsewhere}/v3/types")).await;
    let mut cfg = conf(&emu).cloud("").unwrap();
    cfg.endpoint_overrides.insert(
        ServiceType::BlockStorage,
        format!("{cinder}/v3/p").parse().unwrap(),
    );
    let s = Session::new(cfg, fast_options()).unwrap();
    let err = BlockStorage::new(s).list_volume_types().await.unwrap_err();
    assert!(
        matches!(err, Error::InvalidResponse { .. }) && err.to_string().contains("redirect"),
        "{err}"
    );
    assert_eq!(
        reached.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "nothing followed a redirect"
    );
}

#[tokio::test]
async fn a_hung_keystone_login_holds_no_caller_past_its_own_deadline() {
    use tokio::io::AsyncReadExt;
    // Keystone that takes the request and never answers
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let (got, mut logins) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((mut s, _)) = l.accept().await {
            let mut buf = vec![0u8; 65536];
            let _ = s.read(&mut buf).await;
            let _ = got.send(());
            held.push(s);
        }
    });
    let emu = start().await;
    let mut cfg = conf(&emu).cloud("").unwrap();
    cfg.auth_url = format!("http://{addr}/v3").parse().unwrap();
    let s = Session::new(
        cfg,
        SessionOptions {
            default_timeout: Duration::from_secs(3600),
            login_timeout: Duration::from_secs(5),
            ..fast_options()
        },
    )
    .unwrap();
    // a call without a deadline of its own starts the login...
    let first = tokio::spawn({
        let s = s.clone();
        async move { BlockStorage::new(s).list_volume_types().await }
    });
    logins.recv().await.unwrap();
    // ...and a call with a short deadline does not wait for it
    let err = BlockStorage::new(s.clone())
        .with_deadline(Instant::now() + Duration::from_millis(300))
        .list_volume_types()
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Timeout { .. }), "{err}");
    assert!(
        !first.is_finished(),
        "the second call did not wait for the login"
    );
    // the login itself is bounded, not the first caller's hour
    let err = tokio::time::timeout(Duration::from_secs(60), first)
        .await
        .expect("the login is bounded")
        .unwrap()
        .unwrap_err();
    assert!(matches!(err, Error::Timeout { .. }), "{err}");
}
