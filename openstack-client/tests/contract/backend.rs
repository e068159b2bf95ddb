//! Where the contract tests run: the emulator, or the real test cloud
//! with the services its profile started, as each user of it.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use openstack_client::cinder::{BlockStorage, CreateVolume, Volume, VolumeStatus};
use openstack_client::config::{CloudConf, ConfigEnv};
use openstack_client::{Session, SessionOptions};
use openstack_emulator::{Emulator, EmulatorConfig};

use crate::common::wait_volume;

/// The test cloud's zones (tests/openstack/cloud.py): Cinder's and Nova's
/// default, where the test server runs, and a second one.
pub const ZONE: &str = "az1";
pub const OTHER_ZONE: &str = "az2";

pub enum Backend {
    Emulator(Emulator),
    Real { dir: PathBuf, services: Vec<String> },
}

#[derive(Clone, Copy)]
pub enum User {
    Admin,
    Member,
}

impl Backend {
    pub async fn new() -> Self {
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
                Backend::Emulator(Emulator::start(Self::emulator_config()).await.unwrap())
            }
            Ok(other) => panic!("OPENSTACK_TEST_BACKEND must be emulator or real, not {other:?}"),
        }
    }

    /// The emulator set up as the test cloud is: two zones, the first the
    /// default, and no attach across them.
    pub fn emulator_config() -> EmulatorConfig {
        EmulatorConfig {
            availability_zones: vec![ZONE.into(), OTHER_ZONE.into()],
            cross_az_attach: false,
            ..Default::default()
        }
    }

    pub fn name(&self) -> &'static str {
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
    pub fn has(&self, service: &str, test: &str) -> bool {
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

    pub fn session(&self, user: User) -> Session {
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
    pub fn server(&self) -> String {
        match self {
            Backend::Emulator(e) => e
                .control()
                .create_server("admin", "contract-node", ZONE)
                .unwrap(),
            // the test server is the member's (the drivers run as it)
            Backend::Real { dir, .. } => std::fs::read_to_string(dir.join("admin-server-id"))
                .unwrap()
                .trim()
                .to_string(),
        }
    }
}

impl Backend {
    /// A server of the member's project whose attached volumes become
    /// block devices on this machine (the real cloud's test server, which
    /// its hypervisor agent follows).
    pub fn device_server(&self) -> String {
        match self {
            Backend::Emulator(e) => e
                .control()
                .create_server("demo", "contract-device-node", ZONE)
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
pub static TEST_SERVER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

pub async fn new_volume(c: &BlockStorage, name: &str, size: u64) -> Volume {
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

pub fn unique(prefix: &str) -> String {
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        Instant::now().elapsed().as_nanos() ^ rand_suffix()
    )
}

pub fn rand_suffix() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
        % 1_000_000_007
}
