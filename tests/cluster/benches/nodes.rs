//! Figures of the suite on many nodes, printed and never asserted:
//!
//! - a StatefulSet's pod moved between nodes A and B (the old node
//!   cordoned, the pod deleted): deleted → Running on the other node, p50
//!   and max over 10 moves;
//! - a node drained of N Cinder pods (N = 1, 4, 8: a node takes 8 test
//!   volumes): the drain's time until every pod runs elsewhere, against the
//!   time the Cinder controller spent in ControllerUnpublishVolume and
//!   ControllerPublishVolume meanwhile (OpenStack's detaches and attaches
//!   as the plugin saw them, summed);
//! - claims and pods made at once, spread over the nodes: each pod's time
//!   from creation to Running, p50 and max over 10;
//! - failover of a dead node (`cluster.py kill-node`: its processes killed,
//!   its server SHUTOFF) holding two Cinder pods: from the operator's
//!   out-of-service taint until both run on A, p50 and max over 5 (and how
//!   long the node controller took to call the node not Ready);
//! - the memory of the whole tier (`cluster.py status`: every process of
//!   the control plane and the nodes, the pods and their shims).
//!
//! Needs the cluster tier up with two nodes or more
//! (`tests/cluster/cluster.py up`): `cargo bench -p cluster-tests --bench
//! nodes`. `BENCH_QUICK=1` (as the test command runs it): one move, a
//! drain of one pod, two spread pods, no failover (the test
//! `a_dead_nodes_pods_run_elsewhere_…` measures one); no cluster is a
//! failure, not a skip.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use cluster_tests::nodes::{deployment, stateful_set};
use cluster_tests::{
    Cluster, PodOptions, bench_cluster, bench_quick, claim, controller_rpc_seconds, placed_on, pod,
};

const MINUTE: Duration = Duration::from_secs(60);
/// The Cinder controller's metrics port (deploy/cinder, host network).
const CINDER_CONTROLLER_METRICS: u16 = 9828;

fn quantiles(mut v: Vec<Duration>) -> (f64, f64) {
    v.sort();
    (
        v[v.len() / 2].as_secs_f64(),
        v.last().copied().unwrap_or_default().as_secs_f64(),
    )
}

fn all(v: &[Duration]) -> String {
    v.iter()
        .map(|d| format!("{:.1}", d.as_secs_f64()))
        .collect::<Vec<_>>()
        .join(" ")
}

async fn moves(c: &Cluster, a: &str, b: &str) {
    let count = if bench_quick() { 1 } else { 10 };
    let ns = c.namespace("fig-moves").await.unwrap();
    let n = ns.name.clone();
    let mut guard = Some(c.cordon(b).await.unwrap());
    c.apply_in(
        &n,
        &stateful_set(
            "app",
            "csi-cinder-sc-delete",
            &[a, b],
            "while true; do date >> /data/log; sleep 1; done",
        ),
    )
    .await
    .unwrap();
    let mut pod = c.wait_running(&n, "app-0", 3 * MINUTE).await.unwrap();
    let mut took = Vec::new();
    for i in 0..count {
        let (from, to) = if i % 2 == 0 { (a, b) } else { (b, a) };
        drop(guard.take());
        guard = Some(c.cordon(from).await.unwrap());
        let uid = pod["metadata"]["uid"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let t = Instant::now();
        c.kubectl(&["delete", "pod", "app-0", "-n", &n, "--wait=false"])
            .await
            .unwrap();
        pod = c.wait_running_on(&n, "app-0", to, &uid).await.unwrap();
        took.push(t.elapsed());
    }
    drop(guard);
    let (p50, max) = quantiles(took.clone());
    println!(
        "pod moves between {a} and {b} (Cinder RWO, deleted -> Running on the other node), {count}: p50 {p50:.1} s, max {max:.1} s (all: {})",
        all(&took)
    );
    ns.close().await.unwrap();
}

async fn drain(c: &Cluster, a: &str, b: &str, count: usize) {
    let ns = c.namespace(&format!("fig-drain-{count}")).await.unwrap();
    let n = ns.name.as_str();
    let keep_off_a = c.cordon(a).await.unwrap();
    let apps: Vec<String> = (0..count).map(|i| format!("app-{i}")).collect();
    let docs: Vec<String> = apps
        .iter()
        .flat_map(|app| {
            [
                claim(app, "csi-cinder-sc-delete", "1Gi", "ReadWriteOnce", false),
                deployment(app, app, &[a, b]),
            ]
        })
        .collect();
    c.apply_in(n, &docs.join("---\n")).await.unwrap();
    for app in &apps {
        c.wait_for(&format!("{app} on {b}"), 5 * MINUTE, || async move {
            Ok(match c.app_pod(n, app).await {
                Some((_, on)) if on == b => Ok(()),
                other => Err(format!("{other:?}")),
            })
        })
        .await
        .unwrap();
    }
    drop(keep_off_a);
    let methods = ["ControllerUnpublishVolume", "ControllerPublishVolume"];
    let before = controller_rpc_seconds(CINDER_CONTROLLER_METRICS, &methods).await;
    let t = Instant::now();
    c.kubectl(&["drain", b, "--ignore-daemonsets", "--timeout=600s"])
        .await
        .unwrap();
    for app in &apps {
        c.wait_for(&format!("{app} on {a}"), 5 * MINUTE, || async move {
            Ok(match c.app_pod(n, app).await {
                Some((_, on)) if on == a => Ok(()),
                other => Err(format!("{other:?}")),
            })
        })
        .await
        .unwrap();
    }
    let took = t.elapsed();
    let openstack = controller_rpc_seconds(CINDER_CONTROLLER_METRICS, &methods).await - before;
    c.kubectl(&["uncordon", b]).await.unwrap();
    println!(
        "drain of {b} with {count} Cinder pod(s): every pod running on {a} after {:.1} s; the controller's detaches + attaches took {openstack:.1} s summed ({:.2}x the drain)",
        took.as_secs_f64(),
        openstack / took.as_secs_f64()
    );
    ns.close().await.unwrap();
}

async fn spread(c: &Cluster, nodes: &[&str]) {
    let count = if bench_quick() { 2 } else { 10 };
    let ns = c.namespace("fig-spread").await.unwrap();
    let n = ns.name.clone();
    let docs: Vec<String> = (0..count)
        .flat_map(|i| {
            let node = nodes[i % nodes.len()];
            [
                claim(
                    &format!("c{i}"),
                    "csi-cinder-sc-delete",
                    "1Gi",
                    "ReadWriteOnce",
                    false,
                ),
                placed_on(
                    &pod(
                        &format!("p{i}"),
                        &format!("c{i}"),
                        "exec sleep 3600",
                        PodOptions::default(),
                    ),
                    &[node],
                ),
            ]
        })
        .collect();
    let t = Instant::now();
    c.apply_in(&n, &docs.join("---\n")).await.unwrap();
    let mut running: BTreeMap<String, Duration> = BTreeMap::new();
    let deadline = t + 10 * MINUTE;
    while running.len() < count {
        assert!(Instant::now() < deadline, "pods not running: {running:?}");
        for p in c.list("pods", &["-n", &n]).await.unwrap() {
            let name = p["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            if p["status"]["phase"] == "Running" {
                running.entry(name).or_insert_with(|| t.elapsed());
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let took: Vec<Duration> = running.values().copied().collect();
    let (p50, max) = quantiles(took.clone());
    println!(
        "{count} Cinder claims and pods at once, spread over {} nodes: claim -> Running p50 {p50:.1} s, max {max:.1} s (all: {})",
        nodes.len(),
        all(&took)
    );
    ns.close().await.unwrap();
}

async fn failovers(c: &Cluster, a: &str, b: &str) {
    let count = 5;
    let ns = c.namespace("fig-failover").await.unwrap();
    let n = ns.name.clone();
    let apps = ["db-1", "db-2"];
    let mut took = Vec::new();
    let mut noticed = Vec::new();
    // the uid of each pod where it last ran (none yet)
    let mut uids = vec![String::new(); apps.len()];
    for i in 0..count {
        // the pods on B (A cordoned): made there the first time, moved
        // back from A after
        let cordon_a = c.cordon(a).await.unwrap();
        for app in apps {
            if i == 0 {
                c.apply_in(
                    &n,
                    &stateful_set(
                        app,
                        "csi-cinder-sc-delete",
                        &[a, b],
                        "while true; do date >> /data/log; sleep 1; done",
                    ),
                )
                .await
                .unwrap();
            } else {
                c.kubectl(&[
                    "delete",
                    "pod",
                    &format!("{app}-0"),
                    "-n",
                    &n,
                    "--wait=false",
                ])
                .await
                .unwrap();
            }
        }
        let pods: Vec<String> = apps.iter().map(|app| format!("{app}-0")).collect();
        for (pod, uid) in pods.iter().zip(uids.iter_mut()) {
            let p = c.wait_running_on(&n, pod, b, uid).await.unwrap();
            *uid = p["metadata"]["uid"].as_str().unwrap().to_string();
        }
        drop(cordon_a);
        let dead = c.kill_node(b).await.unwrap();
        noticed.push(c.wait_node_not_ready(b).await.unwrap());
        let moving: Vec<(&str, &str)> = pods
            .iter()
            .zip(&uids)
            .map(|(p, u)| (p.as_str(), u.as_str()))
            .collect();
        took.push(c.fail_over(&n, b, &moving, a).await.unwrap());
        for (pod, uid) in pods.iter().zip(uids.iter_mut()) {
            let p = c.get("pod", pod, Some(&n)).await.unwrap().unwrap();
            *uid = p["metadata"]["uid"].as_str().unwrap().to_string();
        }
        c.revive_node(dead, false).await.unwrap();
    }
    let (p50, max) = quantiles(took.clone());
    let (np50, nmax) = quantiles(noticed.clone());
    println!(
        "failover of a dead node with {} Cinder pods (out-of-service taint -> all Running on {a}), {count}: p50 {p50:.1} s, max {max:.1} s (all: {}); the node not Ready after p50 {np50:.1} s, max {nmax:.1} s (--node-monitor-grace-period=20s)",
        apps.len(),
        all(&took)
    );
    ns.close().await.unwrap();
}

async fn memory(c: &Cluster) {
    // the status verb prints each process group's, the pods' and the
    // shims' resident memory, and their sum
    let status = c
        .cluster_py(&["status"])
        .await
        .unwrap_or_else(|e| e.to_string());
    for line in status.lines().filter(|l| l.contains("MiB")) {
        println!(
            "memory: {}",
            line.split_whitespace().collect::<Vec<_>>().join(" ")
        );
    }
}

#[tokio::main]
async fn main() {
    let Some(c) = bench_cluster() else {
        return;
    };
    let nodes = c.nodes().await.unwrap();
    assert!(nodes.len() >= 2, "needs two nodes or more: {nodes:?}");
    let (a, b) = (nodes[0].as_str(), nodes[1].as_str());
    moves(&c, a, b).await;
    let counts: &[usize] = if bench_quick() { &[1] } else { &[1, 4, 8] };
    for &count in counts {
        drain(&c, a, b, count).await;
    }
    let names: Vec<&str> = nodes.iter().map(String::as_str).collect();
    spread(&c, &names).await;
    if !bench_quick() {
        failovers(&c, a, b).await;
    }
    memory(&c).await;
}
