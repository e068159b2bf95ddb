//! Contract tests: the same client calls against the emulator (default)
//! or the real test cloud (`OPENSTACK_TEST_BACKEND=real`, state directory
//! from `OPENSTACK_TEST_CLOUD_DIR`, default `.openstack-cloud` in the
//! repository; start it with `tests/openstack/cloud.py up`). A service the
//! real cloud's profile lacks is reported as skipped.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use openstack_client::barbican::{CreateSecret, KeyManager};
use openstack_client::config::{CloudConf, ConfigEnv};
use openstack_client::{Error, ServiceType, Session, SessionOptions};
use openstack_emulator::{Emulator, EmulatorConfig};
use zeroize::Zeroizing;

enum Backend {
    Emulator(Emulator),
    Real { dir: PathBuf, services: Vec<String> },
}

#[derive(Clone, Copy)]
enum User {
    Admin,
    Member,
}

impl Backend {
    async fn new() -> Self {
        match std::env::var("OPENSTACK_TEST_BACKEND").as_deref() {
            Ok("real") => {
                let dir = std::env::var_os("OPENSTACK_TEST_CLOUD_DIR")
                    .map(PathBuf::from)
                    .unwrap_or_else(|| {
                        PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.openstack-cloud"))
                    });
                let profile = std::fs::read_to_string(dir.join("profile")).unwrap_or_else(|e| {
                    panic!(
                        "no test cloud in {}: {e} (run tests/openstack/cloud.py up)",
                        dir.display()
                    )
                });
                let services = match profile.trim() {
                    "kms" => vec!["keystone", "barbican"],
                    "block" => vec!["keystone", "cinder", "nova"],
                    "file" => vec!["keystone", "manila"],
                    _ => vec!["keystone", "barbican", "cinder", "nova", "manila"],
                };
                Backend::Real {
                    dir,
                    services: services.into_iter().map(String::from).collect(),
                }
            }
            Ok("emulator") | Err(_) => {
                Backend::Emulator(Emulator::start(EmulatorConfig::default()).await.unwrap())
            }
            Ok(other) => panic!("OPENSTACK_TEST_BACKEND must be emulator or real, not {other:?}"),
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Backend::Emulator(_) => "emulator",
            Backend::Real { .. } => "real cloud",
        }
    }

    /// Whether the backend runs `service`; prints why a test is skipped.
    fn has(&self, service: &str, test: &str) -> bool {
        let has = match self {
            Backend::Emulator(_) => true,
            Backend::Real { services, .. } => services.iter().any(|s| s == service),
        };
        if !has {
            eprintln!("skipped {test}: the test cloud runs no {service}");
        }
        has
    }

    fn session(&self, user: User) -> Session {
        let (text, section) = match (self, user) {
            (Backend::Emulator(e), User::Admin) => (e.cloud_conf(), ""),
            (Backend::Emulator(e), User::Member) => (e.cloud_conf(), "member"),
            (Backend::Real { dir, .. }, User::Admin) => (
                std::fs::read_to_string(dir.join("cloud-admin.conf")).unwrap(),
                "",
            ),
            (Backend::Real { dir, .. }, User::Member) => (
                std::fs::read_to_string(dir.join("cloud-member.conf")).unwrap(),
                "",
            ),
        };
        let conf =
            CloudConf::from_texts(&[(PathBuf::from("test.conf"), text)], ConfigEnv::default())
                .unwrap();
        Session::new(
            conf.cloud(section).unwrap(),
            SessionOptions {
                default_timeout: Duration::from_secs(60),
                ..Default::default()
            },
        )
        .unwrap()
    }
}

fn unique(prefix: &str) -> String {
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        Instant::now().elapsed().as_nanos() ^ rand_suffix()
    )
}

fn rand_suffix() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
        % 1_000_000_007
}

fn deadline() -> Instant {
    Instant::now() + Duration::from_secs(60)
}

#[tokio::test]
async fn keystone_scoped_tokens_and_catalog() {
    let b = Backend::new().await;
    for user in [User::Admin, User::Member] {
        let s = b.session(user);
        s.authenticate()
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", b.name()));
        assert!(s.project_id().await.unwrap().is_some());
        assert!(s.user_id().await.unwrap().is_some());
    }
    let admin = b.session(User::Admin);
    assert_ne!(
        admin.project_id().await.unwrap(),
        b.session(User::Member).project_id().await.unwrap()
    );
    for (service, ty) in [
        ("barbican", ServiceType::KeyManager),
        ("cinder", ServiceType::BlockStorage),
        ("nova", ServiceType::Compute),
        ("manila", ServiceType::SharedFileSystem),
    ] {
        if b.has(service, "catalog lookup") {
            let url = admin
                .endpoint(ty)
                .await
                .unwrap_or_else(|e| panic!("{service}: {e}"));
            assert!(url.host_str().is_some());
        }
    }
}

#[tokio::test]
async fn keystone_rejects_a_wrong_password() {
    let b = Backend::new().await;
    let mut cfg = b.session(User::Member).config().clone();
    if let openstack_client::config::AuthMethod::Password { password, .. } = &mut cfg.auth {
        *password = openstack_client::SecretString::new("not-the-password");
    }
    let err = Session::new(cfg, SessionOptions::default())
        .unwrap()
        .authenticate()
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Unauthorized(_)), "{}: {err}", b.name());
    assert!(
        err.request_id().is_some() || matches!(b, Backend::Real { .. }),
        "{err}"
    );
}

#[tokio::test]
async fn barbican_secrets_and_orders() {
    let b = Backend::new().await;
    if !b.has("barbican", "barbican_secrets_and_orders") {
        return;
    }
    for user in [User::Admin, User::Member] {
        let km = KeyManager::new(b.session(user));
        let name = unique("contract-kek");
        let payload = Zeroizing::new((0u8..32).collect::<Vec<_>>());
        let id = km
            .create_secret(&CreateSecret {
                name: name.clone(),
                payload: Some(payload.clone()),
                algorithm: Some("aes".into()),
                bit_length: Some(256),
                mode: Some("gcm".into()),
                secret_type: "symmetric".into(),
            })
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", b.name()));
        let meta = km.get_secret(&id).await.unwrap();
        assert_eq!(meta.uuid(), id);
        assert_eq!(meta.name.as_deref(), Some(name.as_str()));
        assert_eq!(meta.status.as_deref(), Some("ACTIVE"));
        assert_eq!(meta.algorithm.as_deref(), Some("aes"));
        assert_eq!(meta.bit_length, Some(256));
        assert_eq!(meta.secret_type.as_deref(), Some("symmetric"));
        assert_eq!(
            *km.get_secret_payload(&id).await.unwrap(),
            *payload,
            "{}",
            b.name()
        );
        let listed = km.list_secrets(Some(&name), 10, 0).await.unwrap();
        assert_eq!(listed.len(), 1, "{}", b.name());
        assert_eq!(listed[0].uuid(), id);

        let order = km
            .create_key_order(&unique("contract-order"), "aes", 256, "cbc")
            .await
            .unwrap();
        let generated = km
            .wait_for_order(&order, deadline())
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", b.name()));
        assert_eq!(km.get_secret_payload(&generated).await.unwrap().len(), 32);
        assert_eq!(km.get_order(&order).await.unwrap().status, "ACTIVE");

        km.delete_secret(&id).await.unwrap();
        km.delete_secret(&generated).await.unwrap();
        let err = km.get_secret(&id).await.unwrap_err();
        assert!(err.is_not_found(), "{}: {err}", b.name());
        let err = km.get_secret_payload(&id).await.unwrap_err();
        assert!(err.is_not_found(), "{}: {err}", b.name());
        let err = km.delete_secret(&id).await.unwrap_err();
        assert!(err.is_not_found(), "{}: {err}", b.name());
    }
}

#[tokio::test]
async fn barbican_refuses_bad_input_clearly() {
    let b = Backend::new().await;
    if !b.has("barbican", "barbican_refuses_bad_input_clearly") {
        return;
    }
    let km = KeyManager::new(b.session(User::Admin));
    // an algorithm no plugin can generate: the order is accepted and fails
    let order = km
        .create_key_order("bad", "rot13", 256, "cbc")
        .await
        .unwrap();
    let err = km.wait_for_order(&order, deadline()).await.unwrap_err();
    assert!(
        matches!(&err, Error::ResourceFailed { status, .. } if status == "ERROR"),
        "{}: {err}",
        b.name()
    );
    assert!(
        err.to_string().contains("plugin not found"),
        "{}: {err}",
        b.name()
    );
    // an impossible AES key length is refused at once
    let err = km
        .create_key_order("bad", "aes", 100, "cbc")
        .await
        .unwrap_err();
    assert!(matches!(err, Error::BadRequest(_)), "{}: {err}", b.name());
    // a secret id that is not a UUID, and one that does not exist
    let err = km
        .get_secret("00000000-0000-0000-0000-000000000000")
        .await
        .unwrap_err();
    assert!(err.is_not_found(), "{}: {err}", b.name());
    // a secret of another project is invisible
    let member = KeyManager::new(b.session(User::Member));
    let id = km
        .create_secret(&CreateSecret {
            name: unique("private"),
            payload: Some(Zeroizing::new(vec![1; 32])),
            secret_type: "opaque".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let err = member.get_secret_payload(&id).await.unwrap_err();
    assert!(
        err.is_not_found() || matches!(err, Error::Forbidden(_)),
        "{}: {err}",
        b.name()
    );
    km.delete_secret(&id).await.unwrap();
}
