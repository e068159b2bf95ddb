//! Contract tests: the same client calls against the emulator (default)
//! or the real test cloud (`OPENSTACK_TEST_BACKEND=real`, state directory
//! from `OPENSTACK_TEST_CLOUD_DIR`, default `.openstack-cloud` in the
//! repository; start it with `tests/openstack/cloud.py up`). A service the
//! real cloud's profile lacks is reported as skipped.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use openstack_client::barbican::{CreateSecret, KeyManager};
use openstack_client::cinder::{
    BlockStorage, CreateBackup, CreateGroup, CreateSnapshot, CreateVolume, ListSnapshots,
    ListVolumes, Volume, VolumeStatus,
};
use openstack_client::common::{Poll, poll_until};
use openstack_client::config::{CloudConf, ConfigEnv};
use openstack_client::manila::{
    AccessRuleState, CreateShare, GrantAccess, ListPage, ShareSnapshotStatus, ShareStatus,
    SharedFileSystems,
};
use openstack_client::nova::Compute;
use openstack_client::{Error, ServiceType, Session, SessionOptions};
use openstack_emulator::{Emulator, EmulatorConfig};
use zeroize::Zeroizing;

mod common;
use common::{
    deadline, wait_backup, wait_gone, wait_group, wait_group_snapshot, wait_rule, wait_share,
    wait_share_size, wait_snapshot, wait_volume, wait_volume_size,
};

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
                    "block" => vec!["keystone", "cinder", "cinder-backup", "nova"],
                    "file" => vec!["keystone", "manila"],
                    _ => vec![
                        "keystone",
                        "barbican",
                        "cinder",
                        "cinder-backup",
                        "nova",
                        "manila",
                    ],
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
    /// Whether the cloud runs `service`. A real cloud without it fails
    /// the test, unless OPENSTACK_TEST_MISSING_SERVICES (comma-separated)
    /// names it: a smaller profile of the test cloud is a choice someone
    /// states, never a test counted as passed by accident.
    fn has(&self, service: &str, test: &str) -> bool {
        let services = match self {
            Backend::Emulator(_) => return true,
            Backend::Real { services, .. } => services,
        };
        if services.iter().any(|s| s == service) {
            return true;
        }
        let missing = std::env::var("OPENSTACK_TEST_MISSING_SERVICES").unwrap_or_default();
        assert!(
            missing.split(',').any(|s| s.trim() == service),
            "{test}: the test cloud runs no {service} (it runs {services:?}); \
             set OPENSTACK_TEST_MISSING_SERVICES={service} to skip what needs it"
        );
        eprintln!(
            "skipped {test}: the test cloud runs no {service} (OPENSTACK_TEST_MISSING_SERVICES)"
        );
        false
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

impl Backend {
    /// A server of the admin project that volumes can be attached to.
    fn server(&self) -> String {
        match self {
            Backend::Emulator(e) => e
                .control()
                .create_server("admin", "contract-node", "nova")
                .unwrap(),
            Backend::Real { dir, .. } => std::fs::read_to_string(dir.join("test-server-id"))
                .unwrap()
                .trim()
                .to_string(),
        }
    }
}

/// Tests that attach to the real cloud's one test server take turns, so
/// that a count of its devices holds.
static TEST_SERVER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn new_volume(c: &BlockStorage, name: &str, size: u64) -> Volume {
    let v = c
        .create_volume(&CreateVolume {
            name: name.into(),
            size_gib: size,
            ..Default::default()
        })
        .await
        .unwrap();
    wait_volume(c, &v.id, VolumeStatus::Available).await
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
async fn keystone_application_credentials_rotate() {
    let b = Backend::new().await;
    let admin = b.session(User::Admin);
    let identity = openstack_client::identity::Identity::new(admin.clone());
    let cred = identity
        .create_application_credential(&unique("contract-ac"))
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", b.name()));
    // a session on it works, in the same project
    let mut cfg = admin.config();
    cfg.auth = openstack_client::config::AuthMethod::ApplicationCredentialId {
        id: cred.id.clone(),
        secret: cred.secret.clone(),
    };
    // an application credential is scoped already
    cfg.scope = None;
    let s = Session::new(cfg.clone(), SessionOptions::default()).unwrap();
    s.authenticate()
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", b.name()));
    assert_eq!(
        s.project_id().await.unwrap(),
        admin.project_id().await.unwrap()
    );
    // a restricted credential may not make more
    let err = openstack_client::identity::Identity::new(s.clone())
        .create_application_credential(&unique("contract-ac-2"))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Forbidden(_)), "{}: {err}", b.name());
    identity
        .delete_application_credential(&cred.id)
        .await
        .unwrap();
    // gone: it authenticates no more
    let err = Session::new(cfg, SessionOptions::default())
        .unwrap()
        .authenticate()
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Unauthorized(_)), "{}: {err}", b.name());
    let err = identity
        .delete_application_credential(&cred.id)
        .await
        .unwrap_err();
    assert!(err.is_not_found(), "{}: {err}", b.name());
}

#[tokio::test]
async fn keystone_rejects_a_wrong_password() {
    let b = Backend::new().await;
    let mut cfg = b.session(User::Member).config();
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

#[tokio::test]
async fn cinder_volume_lifecycle_listing_and_errors() {
    let b = Backend::new().await;
    if !b.has("cinder", "cinder_volume_lifecycle_listing_and_errors") {
        return;
    }
    let c = BlockStorage::new(b.session(User::Admin));
    let name = unique("contract-vol");
    let metadata: std::collections::BTreeMap<String, String> = [(
        "cinder.csi.openstack.org/cluster".to_string(),
        "contract".to_string(),
    )]
    .into();
    let created = c
        .create_volume(&CreateVolume {
            name: name.clone(),
            size_gib: 1,
            metadata: metadata.clone(),
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", b.name()));
    assert_eq!(created.status, VolumeStatus::Creating, "{}", b.name());
    let v = wait_volume(&c, &created.id, VolumeStatus::Available).await;
    assert_eq!(v.name, name);
    assert_eq!(v.size, 1);
    assert_eq!(v.availability_zone, "nova");
    assert!(!v.multiattach);
    assert!(v.attachments.is_empty());
    assert_eq!(
        v.metadata
            .get("cinder.csi.openstack.org/cluster")
            .map(String::as_str),
        Some("contract")
    );
    let named = c.volumes_named(&name).await.unwrap();
    assert_eq!(
        named.iter().map(|v| v.id.as_str()).collect::<Vec<_>>(),
        vec![v.id.as_str()],
        "{}",
        b.name()
    );

    // metadata merges
    c.update_volume_metadata(&v.id, &[("extra".to_string(), "1".to_string())].into())
        .await
        .unwrap();
    let md = c.get_volume_metadata(&v.id).await.unwrap();
    assert_eq!(md.len(), 2, "{}: {md:?}", b.name());

    // offline extend
    c.extend_volume(&v.id, 2, false).await.unwrap();
    wait_volume_size(&c, &v.id, 2, VolumeStatus::Available).await;
    let err = c.extend_volume(&v.id, 1, false).await.unwrap_err();
    assert!(
        matches!(err, Error::BadRequest(_)),
        "{}: shrinking: {err}",
        b.name()
    );

    // types and limits
    let types = c.list_volume_types().await.unwrap();
    assert!(
        types
            .iter()
            .any(|t| t.name == "multiattach" && t.multiattach()),
        "{}: {types:?}",
        b.name()
    );
    assert!(
        types.iter().any(|t| t.name == "__DEFAULT__"),
        "{}: {types:?}",
        b.name()
    );
    assert_eq!(
        c.get_volume_type("multiattach").await.unwrap().name,
        "multiattach"
    );
    let limits = c.absolute_limits().await.unwrap();
    assert!(limits.total_volumes_used >= 1, "{}: {limits:?}", b.name());

    // errors
    let err = c
        .get_volume("00000000-0000-0000-0000-000000000000")
        .await
        .unwrap_err();
    assert!(err.is_not_found(), "{}: {err}", b.name());
    assert!(
        err.to_string().contains("could not be found"),
        "{}: {err}",
        b.name()
    );
    let err = c
        .create_volume(&CreateVolume {
            name: "bad".into(),
            size_gib: 1,
            volume_type: Some("no-such-type".into()),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(
        err.is_not_found() || matches!(err, Error::BadRequest(_)),
        "{}: {err}",
        b.name()
    );
    let err = c
        .create_volume(&CreateVolume {
            name: "bad".into(),
            size_gib: 1,
            availability_zone: Some("mars".into()),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(matches!(err, Error::BadRequest(_)), "{}: {err}", b.name());

    c.delete_volume(&v.id).await.unwrap();
    wait_gone("volume delete", || c.get_volume(&v.id)).await;
    let err = c.delete_volume(&v.id).await.unwrap_err();
    assert!(err.is_not_found(), "{}: {err}", b.name());
}

#[tokio::test]
async fn cinder_marker_pagination() {
    let b = Backend::new().await;
    if !b.has("cinder", "cinder_marker_pagination") {
        return;
    }
    let c = BlockStorage::new(b.session(User::Member));
    let mut ids = Vec::new();
    for i in 0..3 {
        ids.push(
            new_volume(&c, &unique(&format!("contract-page{i}")), 1)
                .await
                .id,
        );
    }
    let mut seen = Vec::new();
    let mut marker = None;
    for _ in 0..100 {
        let page = c
            .list_volumes(&ListVolumes {
                limit: Some(2),
                marker: marker.clone(),
                ..Default::default()
            })
            .await
            .unwrap();
        assert!(page.items.len() <= 2);
        seen.extend(page.items.into_iter().map(|v| v.id));
        match page.next_marker {
            Some(m) => marker = Some(m),
            None => break,
        }
    }
    for id in &ids {
        assert!(
            seen.contains(id),
            "{}: {id} missing from the paged listing",
            b.name()
        );
    }
    let err = c
        .list_volumes(&ListVolumes {
            marker: Some("00000000-0000-0000-0000-00000000dead".into()),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::BadRequest(_) | Error::NotFound(_)),
        "{}: unknown marker: {err}",
        b.name()
    );
    for id in ids {
        c.delete_volume(&id).await.unwrap();
    }
}

#[tokio::test]
async fn cinder_snapshots_and_restore() {
    let b = Backend::new().await;
    if !b.has("cinder", "cinder_snapshots_and_restore") {
        return;
    }
    let c = BlockStorage::new(b.session(User::Admin));
    let v = new_volume(&c, &unique("contract-snapsrc"), 1).await;
    let name = unique("contract-snap");
    let snap = c
        .create_snapshot(&CreateSnapshot {
            volume_id: v.id.clone(),
            name: name.clone(),
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", b.name()));
    assert_eq!(snap.volume_id, v.id);
    wait_snapshot(&c, &snap.id).await;
    let by_name = c
        .list_snapshots(&ListSnapshots {
            name: Some(name.clone()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(by_name.items.len(), 1, "{}", b.name());
    let by_volume = c
        .list_snapshots(&ListSnapshots {
            volume_id: Some(v.id.clone()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(by_volume.items.len(), 1, "{}", b.name());
    assert_eq!(by_volume.items[0].size, 1);

    // a volume with a snapshot cannot be deleted
    let err = c.delete_volume(&v.id).await.unwrap_err();
    assert!(matches!(err, Error::BadRequest(_)), "{}: {err}", b.name());

    // restore, larger than the snapshot
    let restored = c
        .create_volume(&CreateVolume {
            name: unique("contract-restored"),
            size_gib: 2,
            snapshot_id: Some(snap.id.clone()),
            ..Default::default()
        })
        .await
        .unwrap();
    let restored = wait_volume(&c, &restored.id, VolumeStatus::Available).await;
    assert_eq!(restored.snapshot_id.as_deref(), Some(snap.id.as_str()));
    assert_eq!(restored.size, 2);
    // smaller than the snapshot: refused
    let err = c
        .create_volume(&CreateVolume {
            name: "small".into(),
            size_gib: 0,
            snapshot_id: Some(snap.id.clone()),
            ..Default::default()
        })
        .await;
    if let Err(e) = &err {
        assert!(matches!(e, Error::BadRequest(_)), "{}: {e}", b.name());
    }
    // clone
    let clone = c
        .create_volume(&CreateVolume {
            name: unique("contract-clone"),
            size_gib: 1,
            source_volume_id: Some(v.id.clone()),
            ..Default::default()
        })
        .await
        .unwrap();
    let clone = wait_volume(&c, &clone.id, VolumeStatus::Available).await;
    assert_eq!(clone.source_volid.as_deref(), Some(v.id.as_str()));

    for id in [&restored.id, &clone.id] {
        c.delete_volume(id).await.unwrap();
        wait_gone("volume delete", || c.get_volume(id)).await;
    }
    c.delete_snapshot(&snap.id).await.unwrap();
    wait_gone("snapshot delete", || c.get_snapshot(&snap.id)).await;
    c.delete_volume(&v.id).await.unwrap();
}

#[tokio::test]
async fn cinder_backups_and_restore() {
    let b = Backend::new().await;
    if !b.has("cinder-backup", "cinder_backups_and_restore") {
        return;
    }
    let c = BlockStorage::new(b.session(User::Admin));
    let v = new_volume(&c, &unique("contract-bksrc"), 1).await;
    // of the volume itself
    let name = unique("contract-backup");
    let whole = c
        .create_backup(&CreateBackup {
            volume_id: v.id.clone(),
            name: name.clone(),
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", b.name()));
    assert_eq!(whole.name, name);
    assert_eq!(whole.volume_id, v.id);
    let whole = wait_backup(&c, &whole.id).await;
    assert_eq!(whole.size, 1);
    let named = c.backups_named(&name, Some(&v.id)).await.unwrap();
    assert_eq!(named.len(), 1, "{}", b.name());
    assert!(
        c.backups_named(&name, Some(&whole.id))
            .await
            .unwrap()
            .is_empty()
    );
    // of a snapshot of it
    let snap = c
        .create_snapshot(&CreateSnapshot {
            volume_id: v.id.clone(),
            name: unique("contract-bksnap"),
            ..Default::default()
        })
        .await
        .unwrap();
    wait_snapshot(&c, &snap.id).await;
    let of_snap = c
        .create_backup(&CreateBackup {
            volume_id: v.id.clone(),
            name: unique("contract-backup-snap"),
            snapshot_id: Some(snap.id.clone()),
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", b.name()));
    let of_snap = wait_backup(&c, &of_snap.id).await;
    assert_eq!(of_snap.snapshot_id.as_deref(), Some(snap.id.as_str()));
    wait_snapshot(&c, &snap.id).await;
    c.delete_snapshot(&snap.id).await.unwrap();
    wait_gone("snapshot delete", || c.get_snapshot(&snap.id)).await;
    // a backup outlives its volume
    c.delete_volume(&v.id).await.unwrap();
    wait_gone("volume delete", || c.get_volume(&v.id)).await;
    let restored = c
        .create_volume(&CreateVolume {
            name: unique("contract-from-backup"),
            size_gib: 2,
            backup_id: Some(of_snap.id.clone()),
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", b.name()));
    let restored = wait_volume(&c, &restored.id, VolumeStatus::Available).await;
    assert_eq!(restored.size, 2);
    wait_backup(&c, &of_snap.id).await;
    // smaller than the backup: refused
    let err = c
        .create_volume(&CreateVolume {
            name: "small".into(),
            size_gib: 0,
            backup_id: Some(of_snap.id.clone()),
            ..Default::default()
        })
        .await;
    if let Err(e) = &err {
        assert!(matches!(e, Error::BadRequest(_)), "{}: {e}", b.name());
    }
    for id in [&whole.id, &of_snap.id] {
        c.delete_backup(id).await.unwrap();
        wait_gone("backup delete", || c.get_backup(id)).await;
    }
    let err = c.get_backup(&whole.id).await.unwrap_err();
    assert!(err.is_not_found(), "{}: {err}", b.name());
    c.delete_volume(&restored.id).await.unwrap();
}

#[tokio::test]
async fn cinder_groups_and_group_snapshots() {
    let b = Backend::new().await;
    if !b.has("cinder", "cinder_groups_and_group_snapshots") {
        return;
    }
    let c = BlockStorage::new(b.session(User::Admin));
    let types = c
        .list_group_types()
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", b.name()));
    assert!(
        types.iter().any(|t| t.name == "default"),
        "{}: {types:?}",
        b.name()
    );
    let v1 = new_volume(&c, &unique("contract-grp-a"), 1).await;
    let v2 = new_volume(&c, &unique("contract-grp-b"), 1).await;
    let name = unique("contract-group");
    let group = c
        .create_group(&CreateGroup {
            name: name.clone(),
            group_type: "default".into(),
            volume_types: vec![v1.volume_type.clone().unwrap()],
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", b.name()));
    let group = wait_group(&c, &group.id).await;
    assert!(group.volumes.is_empty());
    assert_eq!(c.groups_named(&name).await.unwrap().len(), 1);
    c.update_group_volumes(&group.id, &[v1.id.clone(), v2.id.clone()], &[])
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", b.name()));
    let mut members = wait_group(&c, &group.id).await.volumes;
    members.sort();
    let mut want = vec![v1.id.clone(), v2.id.clone()];
    want.sort();
    assert_eq!(members, want, "{}", b.name());
    // a grouped volume cannot be deleted
    let err = c.delete_volume(&v1.id).await.unwrap_err();
    assert!(matches!(err, Error::BadRequest(_)), "{}: {err}", b.name());

    let gs = c
        .create_group_snapshot(&group.id, &unique("contract-gsnap"), Some("contract"))
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", b.name()));
    let gs = wait_group_snapshot(&c, &gs.id).await;
    assert_eq!(gs.group_id, group.id);
    assert!(c.group_snapshots_named(&gs.name).await.unwrap().len() == 1);
    let snaps = c.group_snapshot_members(&gs).await.unwrap();
    let mut of: Vec<String> = snaps.iter().map(|s| s.volume_id.clone()).collect();
    of.sort();
    assert_eq!(of, want, "{}: {snaps:?}", b.name());
    for s in &snaps {
        wait_snapshot(&c, &s.id).await;
        assert_eq!(
            c.get_snapshot(&s.id)
                .await
                .unwrap()
                .group_snapshot_id
                .as_deref(),
            Some(gs.id.as_str())
        );
    }
    // members go with their group snapshot, not alone
    let err = c.delete_snapshot(&snaps[0].id).await.unwrap_err();
    assert!(matches!(err, Error::BadRequest(_)), "{}: {err}", b.name());
    // each member restores on its own
    let restored = c
        .create_volume(&CreateVolume {
            name: unique("contract-from-member"),
            size_gib: 1,
            snapshot_id: Some(snaps[0].id.clone()),
            ..Default::default()
        })
        .await
        .unwrap();
    wait_volume(&c, &restored.id, VolumeStatus::Available).await;
    // the volumes leave the group; the group cannot go while it has a
    // snapshot
    c.update_group_volumes(&group.id, &[], &want).await.unwrap();
    assert!(wait_group(&c, &group.id).await.volumes.is_empty());
    let err = c.delete_group(&group.id).await.unwrap_err();
    assert!(matches!(err, Error::BadRequest(_)), "{}: {err}", b.name());
    c.delete_group_snapshot(&gs.id).await.unwrap();
    wait_gone("group snapshot delete", || c.get_group_snapshot(&gs.id)).await;
    for s in &snaps {
        wait_gone("member delete", || c.get_snapshot(&s.id)).await;
    }
    c.delete_group(&group.id).await.unwrap();
    wait_gone("group delete", || c.get_group(&group.id)).await;
    for id in [&restored.id, &v1.id, &v2.id] {
        c.delete_volume(id).await.unwrap();
    }
}

#[tokio::test]
async fn nova_attach_extend_detach() {
    let b = Backend::new().await;
    if !b.has("nova", "nova_attach_extend_detach") {
        return;
    }
    let _server = TEST_SERVER.lock().await;
    let s = b.session(User::Admin);
    let c = BlockStorage::new(s.clone());
    let nova = Compute::new(s.clone());
    let server = b.server();
    let srv = nova
        .get_server(&server)
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", b.name()));
    assert_eq!(srv.id, server);
    assert_eq!(
        srv.availability_zone.as_deref(),
        Some("nova"),
        "{}",
        b.name()
    );

    let v = new_volume(&c, &unique("contract-attach"), 1).await;
    let att = nova
        .attach_volume(&server, &v.id, false)
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", b.name()));
    assert_eq!(att.volume_id, v.id);
    let attached = wait_volume(&c, &v.id, VolumeStatus::InUse).await;
    assert_eq!(
        attached.attached_servers().collect::<Vec<_>>(),
        vec![server.as_str()],
        "{}",
        b.name()
    );
    assert!(attached.attachments[0].attachment_id.is_some());
    let listed = nova.list_volume_attachments(&server).await.unwrap();
    assert!(
        listed.iter().any(|a| a.volume_id == v.id),
        "{}: {listed:?}",
        b.name()
    );

    // attached twice to the same server: refused
    let err = nova.attach_volume(&server, &v.id, false).await.unwrap_err();
    assert!(
        matches!(err, Error::BadRequest(_) | Error::Conflict(_)),
        "{}: {err}",
        b.name()
    );
    // deleting an attached volume: refused
    let err = c.delete_volume(&v.id).await.unwrap_err();
    assert!(matches!(err, Error::BadRequest(_)), "{}: {err}", b.name());
    // snapshot of an attached volume needs force
    let err = c
        .create_snapshot(&CreateSnapshot {
            volume_id: v.id.clone(),
            name: "no-force".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(matches!(err, Error::BadRequest(_)), "{}: {err}", b.name());
    let forced = c
        .create_snapshot(&CreateSnapshot {
            volume_id: v.id.clone(),
            name: unique("forced"),
            force: true,
            ..Default::default()
        })
        .await
        .unwrap();
    wait_snapshot(&c, &forced.id).await;
    c.delete_snapshot(&forced.id).await.unwrap();
    // Cinder deletes asynchronously: the volume can go once it is gone
    wait_gone("snapshot delete", || c.get_snapshot(&forced.id)).await;

    // online extend (3.42)
    c.extend_volume(&v.id, 2, true)
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", b.name()));
    wait_volume_size(&c, &v.id, 2, VolumeStatus::InUse).await;

    nova.detach_volume(&server, &v.id).await.unwrap();
    let detached = wait_volume(&c, &v.id, VolumeStatus::Available).await;
    assert!(detached.attachments.is_empty());
    // detaching again: the attachment is gone
    let err = nova.detach_volume(&server, &v.id).await.unwrap_err();
    assert!(err.is_not_found(), "{}: {err}", b.name());
    let err = nova
        .get_server("00000000-0000-0000-0000-000000000000")
        .await
        .unwrap_err();
    assert!(err.is_not_found(), "{}: {err}", b.name());
    c.delete_volume(&v.id).await.unwrap();
}

#[tokio::test]
async fn nova_refuses_attach_past_max_disk_devices() {
    let b = Backend::new().await;
    if !b.has("nova", "nova_refuses_attach_past_max_disk_devices") {
        return;
    }
    let _server = TEST_SERVER.lock().await;
    // `[compute] max_disk_devices_to_attach`, the root disk included
    let max: usize = match &b {
        Backend::Emulator(e) => {
            e.control().set_max_disk_devices(4);
            4
        }
        Backend::Real { dir, .. } => std::fs::read_to_string(dir.join("max-disk-devices"))
            .expect("the test cloud records Nova's disk limit")
            .trim()
            .parse()
            .unwrap(),
    };
    let s = b.session(User::Admin);
    let c = BlockStorage::new(s.clone());
    let nova = Compute::new(s);
    let server = b.server();
    let in_use = nova.list_volume_attachments(&server).await.unwrap().len();
    // the root disk: a volume on the real cloud's server (listed), an
    // image on the emulator's (not listed)
    let devices = match &b {
        Backend::Emulator(_) => in_use + 1,
        Backend::Real { .. } => in_use,
    };
    assert!(devices < max, "{}: the server is already full", b.name());
    let mut attached = Vec::new();
    for i in 0..(max - devices) {
        let v = new_volume(&c, &unique(&format!("contract-full-{i}")), 1).await;
        nova.attach_volume(&server, &v.id, false)
            .await
            .unwrap_or_else(|e| panic!("{}: attach {i}: {e}", b.name()));
        wait_volume(&c, &v.id, VolumeStatus::InUse).await;
        attached.push(v.id);
    }
    let one_more = new_volume(&c, &unique("contract-full-extra"), 1).await;
    let err = nova
        .attach_volume(&server, &one_more.id, false)
        .await
        .unwrap_err();
    match &err {
        Error::Forbidden(e) => assert!(
            e.message.contains("maximum allowed number of disk devices"),
            "{}: {}",
            b.name(),
            e.message
        ),
        other => panic!("{}: expected 403, got {other}", b.name()),
    }
    // refused before anything was reserved
    let v = c.get_volume(&one_more.id).await.unwrap();
    assert_eq!(v.status, VolumeStatus::Available, "{}", b.name());
    assert!(v.attachments.is_empty(), "{}", b.name());
    for id in &attached {
        nova.detach_volume(&server, id).await.unwrap();
    }
    for id in attached.iter().chain([&one_more.id]) {
        wait_volume(&c, id, VolumeStatus::Available).await;
        c.delete_volume(id).await.unwrap();
    }
}

#[tokio::test]
async fn nova_multiattach_needs_2_60() {
    let b = Backend::new().await;
    if !b.has("nova", "nova_multiattach_needs_2_60") {
        return;
    }
    let _server = TEST_SERVER.lock().await;
    let s = b.session(User::Admin);
    let c = BlockStorage::new(s.clone());
    let nova = Compute::new(s.clone());
    let server = b.server();
    let v = c
        .create_volume(&CreateVolume {
            name: unique("contract-multi"),
            size_gib: 1,
            volume_type: Some("multiattach".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    let v = wait_volume(&c, &v.id, VolumeStatus::Available).await;
    assert!(
        v.multiattach,
        "{}: the multiattach type makes multiattach volumes",
        b.name()
    );
    let err = nova.attach_volume(&server, &v.id, false).await.unwrap_err();
    assert!(
        matches!(err, Error::BadRequest(_)) && err.to_string().contains("2.60"),
        "{}: {err}",
        b.name()
    );
    nova.attach_volume(&server, &v.id, true).await.unwrap();
    wait_volume(&c, &v.id, VolumeStatus::InUse).await;
    nova.detach_volume(&server, &v.id).await.unwrap();
    wait_volume(&c, &v.id, VolumeStatus::Available).await;
    c.delete_volume(&v.id).await.unwrap();
}

fn nfs(name: &str, size: u64) -> CreateShare {
    CreateShare {
        protocol: "NFS".into(),
        size_gib: size,
        name: name.into(),
        ..Default::default()
    }
}

#[tokio::test]
async fn manila_nfs_share_lifecycle() {
    let b = Backend::new().await;
    if !b.has("manila", "manila_nfs_share_lifecycle") {
        return;
    }
    let member = SharedFileSystems::new(b.session(User::Member));
    let admin = SharedFileSystems::new(b.session(User::Admin));
    assert_eq!(
        member.microversion().await.unwrap().to_string(),
        "2.65",
        "{}",
        b.name()
    );
    let types = member.list_share_types().await.unwrap();
    assert!(
        types.iter().any(|t| t.name == "default"),
        "{}: {types:?}",
        b.name()
    );

    let name = unique("contract-share");
    let created = member
        .create_share(&nfs(&name, 1))
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", b.name()));
    assert_eq!(created.status, ShareStatus::Creating);
    let share = wait_share(&member, &created.id, ShareStatus::Available).await;
    assert_eq!(share.share_proto, "NFS");
    assert_eq!(share.size, 1);
    assert_eq!(
        member.list_shares_named(&name).await.unwrap().len(),
        1,
        "{}",
        b.name()
    );

    // export locations: the member sees no admin-only path, the admin does
    let seen_by_member = member.list_export_locations(&share.id).await.unwrap();
    assert!(!seen_by_member.is_empty());
    assert!(
        seen_by_member.iter().all(|e| !e.is_admin_only),
        "{}: {seen_by_member:?}",
        b.name()
    );
    assert!(
        seen_by_member
            .iter()
            .any(|e| e.preferred && e.path.starts_with("127.0.0.1:/")),
        "{}: {seen_by_member:?}",
        b.name()
    );
    let seen_by_admin = admin.list_export_locations(&share.id).await.unwrap();
    assert!(
        seen_by_admin.iter().any(|e| e.is_admin_only),
        "{}: {seen_by_admin:?}",
        b.name()
    );
    for e in seen_by_admin.iter().chain(&seen_by_member) {
        assert!(
            e.path.starts_with("127.0.0."),
            "{}: export on a non-loopback address: {}",
            b.name(),
            e.path
        );
    }

    // ip access rule: queued, then active; then denied and gone
    let rule = member
        .grant_access(
            &share.id,
            &GrantAccess {
                access_type: "ip".into(),
                access_to: "127.0.0.1/32".into(),
                access_level: "rw".into(),
            },
        )
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", b.name()));
    assert!(
        matches!(
            rule.state,
            AccessRuleState::QueuedToApply | AccessRuleState::Applying | AccessRuleState::Active
        ),
        "{}: {:?}",
        b.name(),
        rule.state
    );
    let active = wait_rule(&member, &share.id, &rule.id, AccessRuleState::Active).await;
    assert_eq!(active.access_to, "127.0.0.1/32");
    assert_eq!(active.access_level, "rw");
    let listed = member.list_access_rules(&share.id).await.unwrap();
    assert_eq!(listed.len(), 1, "{}", b.name());
    let err = member
        .grant_access(
            &share.id,
            &GrantAccess {
                access_type: "ip".into(),
                access_to: "127.0.0.1/32".into(),
                access_level: "rw".into(),
            },
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::BadRequest(_)),
        "{}: duplicate rule: {err}",
        b.name()
    );
    member.revoke_access(&share.id, &rule.id).await.unwrap();
    wait_gone("rule removal", || {
        member.get_access_rule(&share.id, &rule.id)
    })
    .await;

    // resize
    member.extend_share(&share.id, 2).await.unwrap();
    wait_share_size(&member, &share.id, 2).await;
    member.shrink_share(&share.id, 1).await.unwrap();
    wait_share_size(&member, &share.id, 1).await;
    let err = member.extend_share(&share.id, 1).await.unwrap_err();
    assert!(matches!(err, Error::BadRequest(_)), "{}: {err}", b.name());

    // snapshot, and a share made from it
    let snap = member
        .create_snapshot(&share.id, &unique("contract-ssnap"), None)
        .await
        .unwrap();
    poll_until(
        "share snapshot",
        deadline(),
        Duration::from_millis(50),
        Duration::from_millis(500),
        || async {
            let x = member.get_snapshot(&snap.id).await?;
            Ok(if x.status == ShareSnapshotStatus::Available {
                Poll::Ready(())
            } else {
                Poll::Pending(x.status.to_string())
            })
        },
    )
    .await
    .unwrap();
    assert_eq!(
        member.list_snapshots_named(&snap.name).await.unwrap().len(),
        1
    );
    let from_snap = member
        .create_share(&CreateShare {
            snapshot_id: Some(snap.id.clone()),
            ..nfs(&unique("contract-fromsnap"), 1)
        })
        .await
        .unwrap();
    let from_snap = wait_share(&member, &from_snap.id, ShareStatus::Available).await;
    assert_eq!(from_snap.snapshot_id.as_deref(), Some(snap.id.as_str()));

    member.delete_share(&from_snap.id).await.unwrap();
    wait_gone("share delete", || member.get_share(&from_snap.id)).await;
    member.delete_snapshot(&snap.id).await.unwrap();
    wait_gone("snapshot removal", || member.get_snapshot(&snap.id)).await;
    member.delete_share(&share.id).await.unwrap();
    wait_gone("share delete", || member.get_share(&share.id)).await;
    let err = member.get_share(&share.id).await.unwrap_err();
    assert!(err.is_not_found(), "{}: {err}", b.name());
}

#[tokio::test]
async fn manila_cephfs_share_and_cephx_rule() {
    let b = Backend::new().await;
    if !b.has("manila", "manila_cephfs_share_and_cephx_rule") {
        return;
    }
    let m = SharedFileSystems::new(b.session(User::Member));
    let share = m
        .create_share(&CreateShare {
            protocol: "CEPHFS".into(),
            size_gib: 1,
            name: unique("contract-ceph"),
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", b.name()));
    let share = wait_share(&m, &share.id, ShareStatus::Available).await;
    assert_eq!(
        share.metadata.get("__mount_options").map(String::as_str),
        Some("fs=cephfs"),
        "{}: {:?}",
        b.name(),
        share.metadata
    );
    let exports = m.list_export_locations(&share.id).await.unwrap();
    assert_eq!(exports.len(), 1, "{}: {exports:?}", b.name());
    let path = &exports[0].path;
    assert!(
        path.starts_with("127.0.0.1:6789:/volumes/_nogroup/"),
        "{}: {path}",
        b.name()
    );
    assert!(path.contains(&share.id), "{}: {path}", b.name());

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
        active.access_key.as_deref().is_some_and(|k| k.len() >= 16),
        "{}: {:?}",
        b.name(),
        active.access_key
    );
    m.revoke_access(&share.id, &rule.id).await.unwrap();
    wait_gone("rule removal", || m.get_access_rule(&share.id, &rule.id)).await;
    m.delete_share(&share.id).await.unwrap();
    wait_gone("share delete", || m.get_share(&share.id)).await;
}

#[tokio::test]
async fn manila_unschedulable_share_is_explained_by_user_messages() {
    let b = Backend::new().await;
    if !b.has(
        "manila",
        "manila_unschedulable_share_is_explained_by_user_messages",
    ) {
        return;
    }
    let m = SharedFileSystems::new(b.session(User::Member));
    // far larger than the backend's pool
    let share = m
        .create_share(&nfs(&unique("contract-huge"), 100_000))
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", b.name()));
    let failed = wait_share(&m, &share.id, ShareStatus::Error).await;
    assert!(failed.status.is_error());
    let messages = poll_until(
        "user message",
        deadline(),
        Duration::from_millis(50),
        Duration::from_millis(500),
        || async {
            let msgs = m.list_user_messages(&share.id).await?;
            Ok(if msgs.is_empty() {
                Poll::Pending("no message yet".into())
            } else {
                Poll::Ready(msgs)
            })
        },
    )
    .await
    .unwrap();
    assert!(
        messages[0]
            .user_message
            .contains("No storage could be allocated"),
        "{}: {messages:?}",
        b.name()
    );
    // the capacity filter's own detail, which the Manila driver maps to
    // ResourceExhausted
    assert_eq!(
        messages[0].detail_id.as_deref(),
        Some("009"),
        "{}: {messages:?}",
        b.name()
    );
    m.delete_share(&share.id).await.unwrap();
    wait_gone("share delete", || m.get_share(&share.id)).await;
}

/// The by-id directory where attached volumes appear as block devices:
/// the emulator's hypervisor simulation, or the real cloud's agent.
#[tokio::test]
async fn attached_volumes_become_block_devices() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test drives real loop devices and must run as root"
    );
    let scratch = tempfile::tempdir().unwrap();
    let b = match Backend::new().await {
        Backend::Emulator(e) => {
            e.shutdown().await;
            let emu = Emulator::start(EmulatorConfig {
                hypervisor: Some(openstack_emulator::HypervisorConfig {
                    by_id_dir: scratch.path().join("by-id"),
                    image_dir: scratch.path().join("images"),
                }),
                ..Default::default()
            })
            .await
            .unwrap();
            Backend::Emulator(emu)
        }
        real => real,
    };
    if !b.has("nova", "attached_volumes_become_block_devices") {
        return;
    }
    let _server = TEST_SERVER.lock().await;
    let by_id = match &b {
        Backend::Emulator(_) => scratch.path().join("by-id"),
        Backend::Real { dir, .. } => dir.join("by-id"),
    };
    let s = b.session(User::Admin);
    let c = BlockStorage::new(s.clone());
    let nova = Compute::new(s);
    let server = b.server();
    let v = new_volume(&c, &unique("contract-dev"), 1).await;
    let link = by_id.join(openstack_emulator::hypervisor::by_id_name(&v.id));
    let name = b.name();
    nova.attach_volume(&server, &v.id, false).await.unwrap();
    wait_volume(&c, &v.id, VolumeStatus::InUse).await;
    wait_device(&link, Some(1 << 30), name).await;
    c.extend_volume(&v.id, 2, true).await.unwrap();
    wait_device(&link, Some(2 << 30), name).await;
    nova.detach_volume(&server, &v.id).await.unwrap();
    wait_volume(&c, &v.id, VolumeStatus::Available).await;
    wait_device(&link, None, name).await;
    c.delete_volume(&v.id).await.unwrap();
}

fn device_bytes(link: &std::path::Path) -> Option<u64> {
    let dev = std::fs::canonicalize(link).ok()?;
    let name = dev.file_name()?.to_string_lossy().to_string();
    let sectors: u64 = std::fs::read_to_string(format!("/sys/block/{name}/size"))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(sectors * 512)
}

/// Waits until the device behind `link` has `want` bytes (None: no device).
async fn wait_device(link: &std::path::Path, want: Option<u64>, backend: &str) {
    poll_until(
        "block device",
        deadline(),
        Duration::from_millis(50),
        Duration::from_millis(500),
        || async {
            let now = device_bytes(link);
            Ok(if now == want {
                Poll::Ready(())
            } else {
                Poll::Pending(format!("{now:?}"))
            })
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{backend}: {e}"));
}

/// Offset paging oldest first (what the Manila CSI driver's ListVolumes
/// and ListSnapshots tokens rely on), pools readable by admins only, and
/// the share quota in `limits`.
#[tokio::test]
async fn manila_paging_pools_and_limits() {
    let b = Backend::new().await;
    if !b.has("manila", "manila_paging_pools_and_limits") {
        return;
    }
    let member = SharedFileSystems::new(b.session(User::Member));
    let admin = SharedFileSystems::new(b.session(User::Admin));
    let prefix = unique("contract-page");
    let mut ids = Vec::new();
    for i in 0..3 {
        let s = member
            .create_share(&nfs(&format!("{prefix}-{i}"), 1))
            .await
            .unwrap();
        ids.push(s.id.clone());
        // created_at has second resolution on some backends: keep them apart
        tokio::time::sleep(Duration::from_millis(1100)).await;
    }
    for id in &ids {
        wait_share(&member, id, ShareStatus::Available).await;
    }
    let mut seen = Vec::new();
    let mut offset = 0;
    loop {
        let page = member
            .list_shares(&ListPage {
                limit: Some(2),
                offset,
                ..Default::default()
            })
            .await
            .unwrap();
        assert!(page.len() <= 2, "{}", b.name());
        offset += page.len() as u64;
        let done = page.len() < 2;
        seen.extend(page.into_iter().map(|s| s.id));
        if done {
            break;
        }
    }
    let positions: Vec<usize> = ids
        .iter()
        .map(|id| {
            seen.iter()
                .position(|s| s == id)
                .unwrap_or_else(|| panic!("{}: {id} not paged", b.name()))
        })
        .collect();
    assert!(
        positions.windows(2).all(|w| w[0] < w[1]),
        "{}: oldest first: {positions:?}",
        b.name()
    );
    let snap = member
        .create_snapshot(&ids[0], &unique("contract-psnap"), None)
        .await
        .unwrap();
    wait_snapshot_available(&member, &snap.id).await;
    let of_share = member
        .list_snapshots(&ListPage {
            limit: Some(10),
            share_id: Some(ids[0].clone()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(of_share.len(), 1, "{}", b.name());
    assert!(
        member
            .list_snapshots(&ListPage {
                share_id: Some(ids[1].clone()),
                ..Default::default()
            })
            .await
            .unwrap()
            .is_empty(),
        "{}",
        b.name()
    );
    let err = member.list_pools().await.unwrap_err();
    assert!(matches!(err, Error::Forbidden(_)), "{}: {err}", b.name());
    let pools = admin.list_pools().await.unwrap();
    assert!(
        pools
            .iter()
            .any(|p| p.capabilities.free_gib().is_some_and(|g| g > 0.0)),
        "{}: {pools:?}",
        b.name()
    );
    let limits = member.share_limits().await.unwrap();
    assert!(limits.used_gib >= 3, "{}: {limits:?}", b.name());
    member.delete_snapshot(&snap.id).await.unwrap();
    wait_gone("snapshot removal", || member.get_snapshot(&snap.id)).await;
    for id in &ids {
        member.delete_share(id).await.unwrap();
    }
    for id in &ids {
        wait_gone("share delete", || member.get_share(id)).await;
    }
}

async fn wait_snapshot_available(m: &SharedFileSystems, id: &str) {
    poll_until(
        "share snapshot",
        deadline(),
        Duration::from_millis(50),
        Duration::from_millis(500),
        || async {
            let x = m.get_snapshot(id).await?;
            Ok(if x.status == ShareSnapshotStatus::Available {
                Poll::Ready(())
            } else {
                Poll::Pending(x.status.to_string())
            })
        },
    )
    .await
    .unwrap();
}
