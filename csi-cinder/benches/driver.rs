//! Figures for `cinder-csi-plugin` against the emulator (printed; nothing
//! is asserted). Needs root for the node figures (loop devices, mkfs).
//!
//! `cargo bench -p csi-cinder --bench driver`; with `BENCH_QUICK=1` (as
//! the test command runs it) each figure takes a handful of iterations, so
//! that a bench that no longer runs fails CI; its figures then mean little.
//!
//! 1. 200 volumes created and published at concurrency 50, every API call
//!    delayed 50 ms: wall time against the emulator's critical path (the
//!    fewest calls a driver must make, each paying the latency, plus the
//!    status transitions no call can hide), in waves of 50. The volumes
//!    are spread over as many servers as the attach limit (25 disks, the
//!    server's own included) needs, as a scheduler spreads them.
//! 2. Per-RPC time at zero latency: ControllerGetCapabilities (no OpenStack
//!    call) and ControllerGetVolume (one), p50/p99.
//! 3. NodeStage + NodePublish of a fresh 1 GiB volume against plain
//!    `mkfs.ext4` + `mount` of the same device (medians of 5).
//! 4. Peak RSS (VmHWM) of an idle node plugin and of the controller after
//!    runs 1 and 2.
//! 5. ListVolumes walks over 1,000 to 20,000 volumes, and the controller
//!    restarted among them: the time until it serves.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::time::{Duration, Instant};

use csi_sanity::harness::{CinderOnEmulator, HarnessOptions};
use openstack_emulator::{Delays, FaultAction, FaultRule};
use proto::csi::v1 as csi;
use proto::csi::v1::controller_client::ControllerClient;
use proto::csi::v1::node_client::NodeClient;
use proto::csi::v1::volume_capability::access_mode::Mode;
use tonic::transport::Channel;

const BIN: &str = env!("CARGO_BIN_EXE_cinder-csi-plugin");
const LATENCY_MS: u64 = 50;

/// A handful of iterations per figure (`BENCH_QUICK`): the bench runs
/// through, its figures mean little.
fn quick() -> bool {
    std::env::var_os("BENCH_QUICK").is_some()
}

/// Figure 1's volumes and concurrency.
fn volumes() -> usize {
    if quick() { 30 } else { 200 }
}
fn concurrency() -> usize {
    if quick() { 10 } else { 50 }
}

fn cap() -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_type: Some(csi::volume_capability::AccessType::Mount(
            csi::volume_capability::MountVolume {
                fs_type: "ext4".into(),
                ..Default::default()
            },
        )),
        access_mode: Some(csi::volume_capability::AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
    }
}

fn vm_hwm_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        .unwrap_or(0)
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

async fn start(extra: &[&str], hypervisor: bool) -> (CinderOnEmulator, Channel) {
    // BENCH_PLUGIN: another binary (or a wrapper such as strace) to measure
    let bin = std::env::var("BENCH_PLUGIN").unwrap_or_else(|_| BIN.to_string());
    let mut o = HarnessOptions::new(bin);
    o.hypervisor = hypervisor;
    o.extra_args = extra.iter().map(|s| s.to_string()).collect();
    o.availability_zones = vec!["nova".into()];
    o.log_file = std::env::var_os("BENCH_LOG").map(Into::into);
    let h = CinderOnEmulator::start(o).await.unwrap();
    let ch = plugin_runtime::connect_unix(&h.socket).await.unwrap();
    csi_sanity::harness::wait_until_ready(&h.socket)
        .await
        .unwrap();
    (h, ch)
}

async fn provision_and_publish(h: &CinderOnEmulator, ch: &Channel) {
    let d = Delays::default();
    h.emulator.control().set_delays(d.clone());
    h.emulator.control().add_fault(FaultRule::new(
        None,
        "/",
        FaultAction::Delay { millis: LATENCY_MS },
    ));
    // the fewest calls: create = list by name + POST + one GET that sees
    // `available`; publish = GET volume + GET server + POST attach + one
    // GET that sees `in-use`. A transition longer than a call's latency
    // adds its excess.
    let excess = |t: u64| t.saturating_sub(LATENCY_MS);
    let per_volume_ms = 7 * LATENCY_MS + excess(d.volume_create_ms) + excess(d.volume_attach_ms);
    let (volumes, concurrency) = (volumes(), concurrency());
    let waves = volumes.div_ceil(concurrency) as u64;
    let critical = Duration::from_millis(waves * per_volume_ms);

    // the default attach limit (25 disks) counts each server's own disk
    let per_node = 24;
    let mut nodes = vec![h.node_id.clone()];
    for n in 1..volumes.div_ceil(per_node) {
        let server = h
            .emulator
            .control()
            .create_server(h.project(), &format!("bench-node-{n}"), "nova")
            .unwrap();
        nodes.push(server);
    }
    let sem = std::sync::Arc::new(tokio::sync::Semaphore::new(concurrency));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..volumes {
        let sem = sem.clone();
        let mut c = ControllerClient::new(ch.clone());
        let node = nodes[i / per_node].clone();
        tasks.push(tokio::spawn(async move {
            let _permit = sem.acquire_owned().await.unwrap();
            let v = c
                .create_volume(csi::CreateVolumeRequest {
                    name: format!("bench-{i}"),
                    volume_capabilities: vec![cap()],
                    ..Default::default()
                })
                .await
                .unwrap()
                .into_inner()
                .volume
                .unwrap();
            c.controller_publish_volume(csi::ControllerPublishVolumeRequest {
                volume_id: v.volume_id,
                node_id: node,
                volume_capability: Some(cap()),
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
        "1. {volumes} volumes created + published over {} servers, concurrency {concurrency}, {LATENCY_MS} ms per API call: {:.2} s; critical path {:.2} s ({waves} waves x {per_volume_ms} ms); ratio {:.2} (target <= 1.2)",
        nodes.len(),
        total.as_secs_f64(),
        critical.as_secs_f64(),
        total.as_secs_f64() / critical.as_secs_f64()
    );
}

async fn rpc_overhead(h: &CinderOnEmulator, ch: &Channel) {
    h.emulator.control().set_delays(Delays {
        volume_create_ms: 0,
        ..Delays::default()
    });
    let mut c = ControllerClient::new(ch.clone());
    let v = c
        .create_volume(csi::CreateVolumeRequest {
            name: "overhead".into(),
            volume_capabilities: vec![cap()],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    let mut local = Vec::new();
    let mut one_call = Vec::new();
    let calls = if quick() { 50 } else { 2000 };
    for _ in 0..calls {
        let t = Instant::now();
        c.controller_get_capabilities(csi::ControllerGetCapabilitiesRequest {})
            .await
            .unwrap();
        local.push(t.elapsed());
        let t = Instant::now();
        c.controller_get_volume(csi::ControllerGetVolumeRequest {
            volume_id: v.volume_id.clone(),
        })
        .await
        .unwrap();
        one_call.push(t.elapsed());
    }
    local.sort();
    one_call.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "2. per RPC, zero latency, {calls} calls: ControllerGetCapabilities p50 {:.3} ms p99 {:.3} ms; ControllerGetVolume (one Cinder GET) p50 {:.3} ms p99 {:.3} ms (target p99 <= 2 ms)",
        ms(pct(&local, 0.5)),
        ms(pct(&local, 0.99)),
        ms(pct(&one_call, 0.5)),
        ms(pct(&one_call, 0.99))
    );
}

fn run(cmd: &str, args: &[&str]) {
    let out = std::process::Command::new(cmd).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{cmd} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Walks ListVolumes as the external-attacher does on every resync (its
/// page: `max_entries` 0, the driver's; following `next_token`), over
/// `n` volumes all published to one node. Returns the time per page and
/// for the walk.
async fn walk_volumes(ch: &Channel, n: usize) -> (Vec<Duration>, Duration) {
    let mut c = ControllerClient::new(ch.clone());
    let mut token = String::new();
    let mut pages = Vec::new();
    let mut seen = 0;
    let started = Instant::now();
    loop {
        let t = Instant::now();
        let r = c
            .list_volumes(csi::ListVolumesRequest {
                max_entries: 0,
                starting_token: token.clone(),
            })
            .await
            .unwrap()
            .into_inner();
        pages.push(t.elapsed());
        seen += r.entries.len();
        assert!(
            r.entries.iter().all(|e| e
                .status
                .as_ref()
                .is_some_and(|s| !s.published_node_ids.is_empty())),
            "published nodes missing"
        );
        if r.next_token.is_empty() {
            break;
        }
        token = r.next_token;
    }
    assert_eq!(seen, n, "the walk saw every volume once");
    (pages, started.elapsed())
}

async fn list_scale() {
    let (mut h, ch) = start(&["--provide-node-service=false"], false).await;
    let pid = h.plugin_pid().unwrap();
    let ctl = h.emulator.control();
    ctl.add_fault(FaultRule::new(
        Some("GET"),
        "/volumes",
        FaultAction::Delay { millis: LATENCY_MS },
    ));
    let mut figures = Vec::new();
    let mut total = 0;
    let sizes: &[usize] = if quick() {
        &[600]
    } else {
        &[1_000, 10_000, 20_000]
    };
    for &n in sizes {
        ctl.seed_volumes(h.project(), n - total, Some(&h.node_id))
            .unwrap();
        total = n;
        let (mut pages, walk) = walk_volumes(&ch, n).await;
        let count = pages.len();
        pages.sort();
        figures.push((
            n,
            count,
            pct(&pages, 0.5),
            pages[count - 1],
            walk,
            vm_hwm_kib(pid),
        ));
    }
    // the controller started in that crowded project: until it serves
    // (nothing it does at start walks the project: crowded_project.rs)
    let restarted = Instant::now();
    h.restart_plugin().await.unwrap();
    csi_sanity::harness::wait_until_ready(&h.socket)
        .await
        .unwrap();
    let startup = restarted.elapsed();
    ctl.clear_faults();
    println!(
        "5. the controller restarted in a project of {total} volumes, {LATENCY_MS} ms per Cinder list: serving in {:.2} s",
        startup.as_secs_f64()
    );
    for (n, count, p50, max, walk, kib) in figures {
        println!(
            "5. ListVolumes walk over {n} volumes published to a node, {LATENCY_MS} ms per Cinder call: {count} pages of <= 500, page p50 {:.0} ms max {:.0} ms, whole walk {:.2} s; controller peak RSS after it {:.1} MiB",
            p50.as_secs_f64() * 1000.0,
            max.as_secs_f64() * 1000.0,
            walk.as_secs_f64(),
            kib as f64 / 1024.0
        );
    }
}

/// Stagings measured (and as many baselines, interleaved).
fn runs() -> usize {
    if quick() { 2 } else { 15 }
}

async fn stage_vs_mkfs() {
    let (h, ch) = start(&[], true).await;
    let mut c = ControllerClient::new(ch.clone());
    let mut n = NodeClient::new(ch.clone());
    let v = c
        .create_volume(csi::CreateVolumeRequest {
            name: "stage-bench".into(),
            volume_capabilities: vec![cap()],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    c.controller_publish_volume(csi::ControllerPublishVolumeRequest {
        volume_id: v.volume_id.clone(),
        node_id: h.node_id.clone(),
        volume_capability: Some(cap()),
        ..Default::default()
    })
    .await
    .unwrap();
    let dev = h
        .by_id_dir
        .join(openstack_emulator::hypervisor::by_id_name(&v.volume_id))
        .canonicalize()
        .unwrap();
    let dev_s = dev.to_string_lossy().to_string();
    let (staging, target) = h.paths(&v.volume_id);
    let plain_dir = h.dir.path().join("plain");
    std::fs::create_dir_all(&plain_dir).unwrap();
    let mut ours = Vec::new();
    let mut plain = Vec::new();
    let runs = runs();
    for _ in 0..runs {
        // a fresh volume reads as zeros: discard (loop devices punch holes)
        run("blkdiscard", &["-f", &dev_s]);
        let t = Instant::now();
        n.node_stage_volume(csi::NodeStageVolumeRequest {
            volume_id: v.volume_id.clone(),
            staging_target_path: staging.to_string_lossy().into(),
            volume_capability: Some(cap()),
            ..Default::default()
        })
        .await
        .unwrap();
        let staged = t.elapsed();
        n.node_publish_volume(csi::NodePublishVolumeRequest {
            volume_id: v.volume_id.clone(),
            staging_target_path: staging.to_string_lossy().into(),
            target_path: target.to_string_lossy().into(),
            volume_capability: Some(cap()),
            ..Default::default()
        })
        .await
        .unwrap();
        ours.push(t.elapsed());
        if std::env::var_os("BENCH_DETAIL").is_some() {
            println!("   stage {:?} publish {:?}", staged, t.elapsed() - staged);
        }
        n.node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
            volume_id: v.volume_id.clone(),
            target_path: target.to_string_lossy().into(),
        })
        .await
        .unwrap();
        n.node_unstage_volume(csi::NodeUnstageVolumeRequest {
            volume_id: v.volume_id.clone(),
            staging_target_path: staging.to_string_lossy().into(),
        })
        .await
        .unwrap();

        // a fresh volume reads as zeros: discard (loop devices punch holes)
        run("blkdiscard", &["-f", &dev_s]);
        let t = Instant::now();
        run("mkfs.ext4", &["-q", &dev_s]);
        run(
            "mount",
            &["-t", "ext4", &dev_s, &plain_dir.to_string_lossy()],
        );
        plain.push(t.elapsed());
        run("umount", &[&plain_dir.to_string_lossy()]);
    }
    ours.sort();
    plain.sort();
    let (o, p) = (ours[runs / 2], plain[runs / 2]);
    println!(
        "3. fresh 1 GiB volume ({runs} runs, alternating): NodeStage + NodePublish median {:.1} ms; mkfs.ext4 + mount median {:.1} ms; overhead {:.1} ms, ratio {:.2} (target <= 1.1)",
        o.as_secs_f64() * 1000.0,
        p.as_secs_f64() * 1000.0,
        (o.as_secs_f64() - p.as_secs_f64()) * 1000.0,
        o.as_secs_f64() / p.as_secs_f64()
    );
}

#[tokio::main]
async fn main() {
    if !nix::unistd::geteuid().is_root() {
        println!("needs root (the emulator's hypervisor uses loop devices)");
        return;
    }
    // BENCH_ONLY=3 or 5: just that figure (e.g. under strace)
    match std::env::var("BENCH_ONLY").as_deref() {
        Ok("3") => return stage_vs_mkfs().await,
        Ok("5") => return list_scale().await,
        _ => {}
    }
    let (controller, ch) = start(&["--provide-node-service=false"], false).await;
    provision_and_publish(&controller, &ch).await;
    rpc_overhead(&controller, &ch).await;
    let controller_kib = vm_hwm_kib(controller.plugin_pid().unwrap());
    drop(ch);
    drop(controller);

    stage_vs_mkfs().await;

    let (node, _ch) = start(&["--provide-controller-service=false"], true).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let node_kib = vm_hwm_kib(node.plugin_pid().unwrap());
    println!(
        "4. peak RSS: idle node plugin {:.1} MiB (target <= 10); controller after runs 1-2 {:.1} MiB (target <= 25)",
        node_kib as f64 / 1024.0,
        controller_kib as f64 / 1024.0
    );
    list_scale().await;
}
