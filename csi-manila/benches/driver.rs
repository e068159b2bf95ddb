//! Figures for `manila-csi-plugin` (printed; nothing is asserted).
//!
//! `cargo bench -p csi-manila --bench driver` (`BENCH_QUICK=1`: a handful
//! of iterations per figure, as the test command runs it); with
//! `OPENSTACK_TEST_BACKEND=real` (and the test cloud's `file` or `all`
//! profile up, as root) figure 2 runs against real Manila and Ceph.
//!
//! 1. 100 shares created at concurrency 25 against the emulator, every API
//!    call delayed 50 ms: wall time against the critical path (the fewest
//!    calls a driver must make for a share with an active access rule,
//!    each paying the latency), in waves of 25.
//! 2. NodeStage of a CephFS share through ceph-fuse against a bare
//!    `ceph-fuse` mount of the same subvolume with the same key (medians
//!    of 5; the stage asks Manila for the access rule, the volume context
//!    carrying the export), against the bare mount plus one Manila round
//!    trip.
//! 3. Peak RSS (VmHWM) of an idle node plugin (ceph-fuse daemons are
//!    processes of their own, counted apart) and of the controller after
//!    figure 1.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use csi_sanity::harness::{ManilaOnEmulator, ManilaOnRealCloud, ManilaOptions};
use openstack_emulator::{Delays, FaultAction, FaultRule};
use proto::csi::v1 as csi;
use proto::csi::v1::controller_client::ControllerClient;
use proto::csi::v1::node_client::NodeClient;
use proto::csi::v1::volume_capability::access_mode::Mode;

const BIN: &str = env!("CARGO_BIN_EXE_manila-csi-plugin");

/// A handful of iterations per figure (`BENCH_QUICK`): the bench runs
/// through, its figures mean little.
fn quick() -> bool {
    std::env::var_os("BENCH_QUICK").is_some()
}

/// Figure 1's shares and concurrency; figure 2's runs.
fn shares() -> usize {
    if quick() { 10 } else { 100 }
}
fn concurrency() -> usize {
    if quick() { 5 } else { 25 }
}
fn runs() -> usize {
    if quick() { 2 } else { 5 }
}
const LATENCY_MS: u64 = 50;

fn cap() -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_type: Some(csi::volume_capability::AccessType::Mount(
            csi::volume_capability::MountVolume::default(),
        )),
        access_mode: Some(csi::volume_capability::AccessMode {
            mode: Mode::MultiNodeMultiWriter as i32,
        }),
    }
}

fn vm_hwm_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        .unwrap_or(0)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

async fn create_many() -> u64 {
    let mut o = ManilaOptions::new(BIN, "NFS");
    o.stand_ins = false;
    let h = ManilaOnEmulator::start(o).await.unwrap();
    csi_sanity::harness::wait_until_ready(&h.socket)
        .await
        .unwrap();
    let ch = plugin_runtime::connect_unix(&h.socket).await.unwrap();
    let d = Delays::default();
    h.emulator.control().set_delays(d.clone());
    h.emulator.control().add_fault(FaultRule::new(
        None,
        "/",
        FaultAction::Delay { millis: LATENCY_MS },
    ));
    // the fewest calls: look the name up, create, one GET that sees
    // `available`, grant, one GET that sees the rule `active`; a
    // transition longer than a call adds its excess
    let excess = |t: u64| t.saturating_sub(LATENCY_MS);
    let per_share_ms = 5 * LATENCY_MS + excess(d.share_create_ms) + excess(d.access_rule_ms);
    let (shares, concurrency) = (shares(), concurrency());
    let waves = shares.div_ceil(concurrency) as u64;
    let critical = Duration::from_millis(waves * per_share_ms);
    let secrets = h.member_secrets();
    let sem = std::sync::Arc::new(tokio::sync::Semaphore::new(concurrency));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..shares {
        let sem = sem.clone();
        let mut c = ControllerClient::new(ch.clone());
        let secrets = secrets.clone();
        tasks.push(tokio::spawn(async move {
            let _permit = sem.acquire_owned().await.unwrap();
            c.create_volume(csi::CreateVolumeRequest {
                name: format!("bench-{i}"),
                volume_capabilities: vec![cap()],
                parameters: HashMap::from([(
                    "nfs-shareClient".to_string(),
                    "10.0.0.0/8".to_string(),
                )]),
                secrets,
                ..Default::default()
            })
            .await
            .unwrap();
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let total = started.elapsed();
    h.emulator.control().clear_faults();
    println!(
        "1. {shares} shares created (access rule active), concurrency {concurrency}, {LATENCY_MS} ms per API call: {:.2} s; critical path {:.2} s ({waves} waves x {per_share_ms} ms); ratio {:.2} (target <= 1.2)",
        total.as_secs_f64(),
        critical.as_secs_f64(),
        total.as_secs_f64() / critical.as_secs_f64()
    );
    vm_hwm_kib(h.plugin_pid().unwrap())
}

async fn idle_node_rss() -> u64 {
    let mut o = ManilaOptions::new(BIN, "CEPHFS");
    o.stand_ins = false;
    // as deployed: the node has no credentials of its own
    o.cloud_conf = false;
    o.extra_args = vec!["--provide-controller-service=false".into()];
    let h = ManilaOnEmulator::start(o).await.unwrap();
    csi_sanity::harness::wait_until_ready(&h.socket)
        .await
        .unwrap();
    let mut n = NodeClient::new(plugin_runtime::connect_unix(&h.socket).await.unwrap());
    n.node_get_info(csi::NodeGetInfoRequest {}).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    vm_hwm_kib(h.plugin_pid().unwrap())
}

fn cloud_dir() -> PathBuf {
    std::env::var_os("OPENSTACK_TEST_CLOUD_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.openstack-cloud"))
        })
}

/// A bare `ceph-fuse` mount of `root` with the share's cephx identity.
fn bare_ceph_fuse(dir: &Path, monitors: &str, root: &str, id: &str, key: &str) -> Duration {
    std::fs::write(
        dir.join("ceph.conf"),
        format!("[global]\nmon_host = {monitors}\n"),
    )
    .unwrap();
    let keyring = dir.join("keyring");
    std::fs::write(&keyring, format!("[client.{id}]\n\tkey = {key}\n")).unwrap();
    let mnt = dir.join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let t = Instant::now();
    let out = std::process::Command::new("ceph-fuse")
        .arg("--conf")
        .arg(dir.join("ceph.conf"))
        .args(["--id", id, "--keyring"])
        .arg(&keyring)
        .args(["-r", root, "--client_fs=cephfs"])
        .arg(&mnt)
        .output()
        .unwrap();
    let took = t.elapsed();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    nix::mount::umount2(&mnt, nix::mount::MntFlags::empty()).unwrap();
    took
}

async fn stage_vs_bare_ceph_fuse() {
    let dir = cloud_dir();
    let log = csi_sanity::harness::test_log("manila-bench-stage.log");
    let h = ManilaOnRealCloud::start(Path::new(BIN), &dir, "CEPHFS", false, &[], Some(log))
        .await
        .unwrap();
    csi_sanity::harness::wait_until_ready(&h.socket)
        .await
        .unwrap();
    let ch = plugin_runtime::connect_unix(&h.socket).await.unwrap();
    let mut c = ControllerClient::new(ch.clone());
    let mut n = NodeClient::new(ch);
    let v = c
        .create_volume(csi::CreateVolumeRequest {
            name: format!("bench-stage-{}", std::process::id()),
            volume_capabilities: vec![cap()],
            parameters: HashMap::from([("type".to_string(), "cephfs".to_string())]),
            secrets: h.secrets.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    let (staging, _) = h.paths(&v.volume_id, "bench");
    let stage = csi::NodeStageVolumeRequest {
        volume_id: v.volume_id.clone(),
        staging_target_path: staging.to_string_lossy().into(),
        volume_capability: Some(cap()),
        secrets: h.secrets.clone(),
        volume_context: v.volume_context.clone(),
        ..Default::default()
    };
    let unstage = csi::NodeUnstageVolumeRequest {
        volume_id: v.volume_id.clone(),
        staging_target_path: staging.to_string_lossy().into(),
    };
    let mut staged = Vec::new();
    for _ in 0..runs() {
        let t = Instant::now();
        n.node_stage_volume(stage.clone()).await.unwrap();
        staged.push(t.elapsed());
        n.node_unstage_volume(unstage.clone()).await.unwrap();
    }
    let m = h.member_manila().unwrap();
    let rule = m.list_access_rules(&v.volume_id).await.unwrap().remove(0);
    let export = m
        .list_export_locations(&v.volume_id)
        .await
        .unwrap()
        .remove(0);
    let (mons, root) = export.path.split_once(":/").unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let bare: Vec<Duration> = (0..runs())
        .map(|_| {
            bare_ceph_fuse(
                tmp.path(),
                mons,
                &format!("/{root}"),
                &rule.access_to,
                rule.access_key.as_deref().unwrap(),
            )
        })
        .collect();
    // one Manila round trip: what the stage may add to a bare mount
    let mut trips = Vec::new();
    for _ in 0..runs() {
        let t = Instant::now();
        m.get_access_rule(&v.volume_id, &rule.id).await.unwrap();
        trips.push(t.elapsed());
    }
    let (s, b, r) = (median(staged), median(bare), median(trips));
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "2. NodeStage through ceph-fuse {:.1} ms vs bare ceph-fuse {:.1} ms + one Manila round trip {:.1} ms = {:.1} ms: {} (target: NodeStage <= bare + one round trip; the stage asks Manila only for the access rule when the volume context carries the export)",
        ms(s),
        ms(b),
        ms(r),
        ms(b + r),
        if s <= b + r { "within" } else { "over" }
    );
    c.delete_volume(csi::DeleteVolumeRequest {
        volume_id: v.volume_id,
        secrets: h.secrets.clone(),
    })
    .await
    .unwrap();
}

#[tokio::main]
async fn main() {
    let controller_kib = create_many().await;
    if std::env::var("OPENSTACK_TEST_BACKEND").as_deref() == Ok("real") {
        stage_vs_bare_ceph_fuse().await;
    } else {
        println!(
            "2. (skipped: set OPENSTACK_TEST_BACKEND=real with the test cloud's file profile up)"
        );
    }
    let node_kib = idle_node_rss().await;
    println!(
        "3. peak RSS: idle node plugin {:.1} MiB (target <= 10; ceph-fuse daemons apart), controller after figure 1 {:.1} MiB (target <= 25)",
        node_kib as f64 / 1024.0,
        controller_kib as f64 / 1024.0
    );
}
