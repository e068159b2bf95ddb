//! Figures of the suite in Kubernetes, printed and never asserted:
//!
//! - the time from a claim's creation to its pod running, p50 and max
//!   over 10 pods one after the other, for Cinder and for Manila (CephFS);
//! - a burst of claims and pods made at once: the wall time until every
//!   pod runs, against the sum of the time the controllers spent in
//!   CreateVolume and ControllerPublishVolume (OpenStack's own waits as
//!   the plugins saw them, from their gRPC metrics).
//!
//! Needs the cluster tier up (`tests/cluster/cluster.py up`):
//! `cargo bench -p cluster-tests --bench figures`. `BENCH_QUICK=1` (as the
//! test command runs it): 1 pod per latency figure and bursts of 2, and
//! no cluster is a failure, not a skip.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::time::{Duration, Instant};

use cluster_tests::{
    Cluster, PodOptions, bench_cluster, bench_quick, claim, controller_rpc_seconds, pod,
};

const MINUTE: Duration = Duration::from_secs(60);

fn quantiles(mut v: Vec<Duration>) -> (Duration, Duration) {
    v.sort();
    (v[v.len() / 2], *v.last().unwrap())
}

/// Claim → running pod, one after the other.
async fn latency(c: &Cluster, what: &str, class: &str, mode: &str) {
    let ns = c.namespace(&format!("fig-{what}")).await.unwrap();
    let n = ns.name.clone();
    let mut took = Vec::new();
    let pods = if bench_quick() { 1 } else { 10 };
    for i in 0..pods {
        let t = Instant::now();
        let yaml = format!(
            "{}---\n{}",
            claim(&format!("c{i}"), class, "1Gi", mode, false),
            pod(
                &format!("p{i}"),
                &format!("c{i}"),
                "exec sleep 3600",
                PodOptions::default()
            )
        );
        c.apply_in(&n, &yaml).await.unwrap();
        c.wait_running(&n, &format!("p{i}"), 3 * MINUTE)
            .await
            .unwrap();
        took.push(t.elapsed());
        c.delete("pod", &format!("p{i}"), Some(&n)).await.unwrap();
        c.delete("pvc", &format!("c{i}"), Some(&n)).await.unwrap();
    }
    let (p50, max) = quantiles(took.clone());
    println!(
        "{what}: claim created -> pod running, {pods} pods one after the other: p50 {:.2} s, max {:.2} s (all: {})",
        p50.as_secs_f64(),
        max.as_secs_f64(),
        took.iter()
            .map(|d| format!("{:.2}", d.as_secs_f64()))
            .collect::<Vec<_>>()
            .join(" ")
    );
    ns.close().await.unwrap();
}

/// `count` claims and pods at once.
async fn burst(c: &Cluster, what: &str, class: &str, mode: &str, count: usize, metrics_port: u16) {
    let count = if bench_quick() { count.min(2) } else { count };
    let ns = c.namespace(&format!("burst-{what}")).await.unwrap();
    let n = ns.name.clone();
    let methods = ["CreateVolume", "ControllerPublishVolume"];
    let before = controller_rpc_seconds(metrics_port, &methods).await;
    let yaml: Vec<String> = (0..count)
        .flat_map(|i| {
            [
                claim(&format!("c{i}"), class, "1Gi", mode, false),
                pod(
                    &format!("p{i}"),
                    &format!("c{i}"),
                    "exec sleep 3600",
                    PodOptions::default(),
                ),
            ]
        })
        .collect();
    let t = Instant::now();
    c.apply_in(&n, &yaml.join("---\n")).await.unwrap();
    for i in 0..count {
        c.wait_running(&n, &format!("p{i}"), 10 * MINUTE)
            .await
            .unwrap();
    }
    let total = t.elapsed();
    let waits = controller_rpc_seconds(metrics_port, &methods).await - before;
    println!(
        "{what}: {count} claims and {count} pods at once: all running after {:.1} s; the controller's CreateVolume + ControllerPublishVolume took {:.1} s in all ({:.1}x the wall time)",
        total.as_secs_f64(),
        waits,
        waits / total.as_secs_f64()
    );
    let t = Instant::now();
    ns.close().await.unwrap();
    println!(
        "{what}: the {count} pods and claims deleted (volumes gone) in {:.1} s",
        t.elapsed().as_secs_f64()
    );
}

#[tokio::main]
async fn main() {
    let Some(c) = bench_cluster() else {
        return;
    };
    latency(&c, "cinder", "csi-cinder-sc-xfs", "ReadWriteOnce").await;
    latency(&c, "manila-cephfs", "csi-manila-cephfs", "ReadWriteMany").await;
    // the test node takes 8 Cinder volumes (Nova's limit less the root disk)
    burst(&c, "cinder", "csi-cinder-sc-xfs", "ReadWriteOnce", 8, 9828).await;
    burst(
        &c,
        "manila-cephfs",
        "csi-manila-cephfs",
        "ReadWriteMany",
        20,
        9833,
    )
    .await;
}
