//! `suite-walk` through its binary: the walk on the emulator (as root with
//! real loop devices and mounts, and as an unprivileged user), and the
//! preflight against an emulated cloud: tagged resources deleted after
//! success, after a failed step and after Ctrl-C.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use openstack_client::cinder::{BlockStorage, ListVolumes};
use openstack_client::manila::{ListPage, SharedFileSystems};
use openstack_emulator::{Delays, Emulator, EmulatorConfig, FaultAction, FaultRule};

const WALK: &str = env!("CARGO_BIN_EXE_suite-walk");

/// The plugin binaries, built as the workspace's tests build them.
fn plugins_built() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| csi_sanity::harness::workspace_binaries().expect("building the plugins"))
}

fn walk(args: &[&str]) -> (Output, String) {
    let out = Command::new(WALK)
        .args(["--bin-dir", plugins_built().to_str().unwrap()])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    (out, text)
}

fn is_root() -> bool {
    nix::unistd::Uid::effective().is_root()
}

/// Every step of every part runs and passes, with real mounts.
#[test]
fn the_walk_drives_all_three_plugins_with_real_mounts() {
    // scripts/test.sh runs as root; the next test covers the other case
    if !openstack_emulator::preconditions::root("loop devices, mounts") {
        return;
    }
    let (out, text) = walk(&[]);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for line in [
        "ok    NodeStageVolume (mkfs + mount)",
        "xfs on /dev/loop",
        "ok    NodeExpandVolume (df grows)",
        "ok    the restored volume holds the file",
        "no mount, no loop device left",
        "mount -t nfs 127.0.0.1:/shares/",
        "ok    write in pod-a, read in pod-b",
        "access rule denied, share deleted",
        "ok    the old ciphertext still decrypts",
        "2 key fetches (one per key)",
        "400 calls, 0 Barbican requests made by them",
    ] {
        assert!(text.contains(line), "no {line:?} in:\n{text}");
    }
    let all = text
        .lines()
        .find(|l| l.trim_start().starts_with("all "))
        .unwrap();
    let n: Vec<&str> = all.split_whitespace().collect();
    assert_eq!((n[1], n[2], n[3], n[4]), ("33", "33", "0", "0"), "{all}");
    assert!(
        !text.contains("plugin logs:"),
        "logs are kept only after a failure"
    );
}

/// Without root the node steps say why they are skipped; the rest runs.
#[test]
fn without_root_the_node_steps_are_skipped_and_said_so() {
    let mut cmd = if is_root() {
        // the same binary as an unprivileged user
        let mut c = Command::new("runuser");
        c.args(["-u", "nobody", "--", WALK]);
        c
    } else {
        Command::new(WALK)
    };
    let out = cmd
        .args(["--bin-dir", plugins_built().to_str().unwrap()])
        .current_dir(std::env::temp_dir())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("skip  NodeStageVolume (mkfs + mount)"),
        "{text}"
    );
    assert!(
        text.contains("needs root: loop devices and mounts"),
        "{text}"
    );
    assert!(text.contains("skip  NodePublishVolume (pod-a)"), "{text}");
    assert!(
        text.contains("ok    ControllerExpandVolume (to 2 GiB)"),
        "{text}"
    );
    assert!(text.contains("ok    Encrypt uses the new key"), "{text}");
    let all = text
        .lines()
        .find(|l| l.trim_start().starts_with("all "))
        .unwrap();
    let n: Vec<&str> = all.split_whitespace().collect();
    assert_eq!((n[2], n[3], n[4]), ("23", "9", "0"), "{all}");
}

/// An emulated cloud for the preflight, with a server to attach to.
struct Cloud {
    emulator: Emulator,
    _dir: tempfile::TempDir,
    conf: PathBuf,
    server: String,
}

impl Cloud {
    async fn start() -> Cloud {
        let emulator = Emulator::start(EmulatorConfig::default()).await.unwrap();
        let server = emulator
            .control()
            .create_server("admin", "node-1", "nova")
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let conf = dir.path().join("cloud.conf");
        std::fs::write(&conf, emulator.cloud_conf()).unwrap();
        Cloud {
            emulator,
            _dir: dir,
            conf,
            server,
        }
    }

    fn preflight(&self, extra: &[&str]) -> Command {
        let mut c = Command::new(WALK);
        c.arg("--cloud-config")
            .arg(&self.conf)
            .args(["--server", &self.server])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c
    }

    /// Volumes and shares left in the project.
    async fn left(&self) -> (usize, usize) {
        let s = suite_walk::session_of(&self.emulator.cloud_conf()).unwrap();
        let volumes = BlockStorage::new(s.clone())
            .list_volumes(&ListVolumes::default())
            .await
            .unwrap()
            .items
            .len();
        let shares = SharedFileSystems::new(s)
            .list_shares(&ListPage::default())
            .await
            .unwrap()
            .len();
        (volumes, shares)
    }
}

async fn run(mut c: Command) -> (bool, String) {
    let out = tokio::task::spawn_blocking(move || c.output().unwrap())
        .await
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn preflight_checks_each_service_and_leaves_nothing() {
    let cloud = Cloud::start().await;
    let (ok, text) = run(cloud.preflight(&[])).await;
    assert!(ok, "{text}");
    for line in [
        "ok    Keystone: a scoped token",
        "ok    catalog: block-storage",
        "ok    catalog: shared-file-system",
        "ok    catalog: key-manager",
        "ok    Cinder quota",
        "ok    attach it to the server, detach",
        "ok    grant access, see it active, revoke",
        "ok    create a secret, read it, delete it",
    ] {
        assert!(text.contains(line), "no {line:?} in:\n{text}");
    }
    assert_eq!(cloud.left().await, (0, 0));
    // the volume carried the tag while it lived
    let created = cloud
        .emulator
        .control()
        .calls()
        .into_iter()
        .filter(|c| c.method == "POST" && c.path.ends_with("/volumes"))
        .count();
    assert_eq!(created, 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failed_step_names_the_request_and_what_to_check_and_deletes_what_was_made() {
    let cloud = Cloud::start().await;
    cloud.emulator.control().add_fault(FaultRule::new(
        Some("POST"),
        "/os-volume_attachments",
        FaultAction::Status {
            status: 403,
            message: Some(
                "Policy doesn't allow os_compute_api:os-volumes-attachments:create".into(),
            ),
            retry_after: None,
            hint: Default::default(),
        },
    ));
    let (ok, text) = run(cloud.preflight(&[])).await;
    assert!(!ok, "{text}");
    assert!(
        text.contains("FAIL  attach it to the server, detach"),
        "{text}"
    );
    assert!(text.contains("request id req-"), "{text}");
    assert!(text.contains("check: the user's roles"), "{text}");
    // the preflight stopped there: no share was tried
    assert!(!text.contains("create a 1 GiB NFS share"), "{text}");
    assert!(text.contains("ok    delete volume "), "{text}");
    assert_eq!(cloud.left().await, (0, 0));
}

#[tokio::test(flavor = "multi_thread")]
async fn ctrl_c_deletes_what_the_preflight_created() {
    let cloud = Cloud::start().await;
    cloud.emulator.control().set_delays(Delays {
        volume_create_ms: 3000,
        ..Delays::default()
    });
    let child = cloud.preflight(&["--only", "volume"]).spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cloud
        .emulator
        .control()
        .calls()
        .iter()
        .any(|c| c.method == "POST" && c.path.ends_with("/volumes"))
    {
        assert!(Instant::now() < deadline, "the volume was never asked for");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let out = tokio::task::spawn_blocking(move || child.wait_with_output().unwrap())
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{text}");
    assert!(text.contains("interrupted: cleaning up"), "{text}");
    assert!(text.contains("ok    delete volume "), "{text}");
    assert_eq!(cloud.left().await, (0, 0));
}
