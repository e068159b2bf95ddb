//! The long campaign of production faults (`cluster_tests::campaign`):
//! `CAMPAIGN_STEPS` steps (default 70) of `CAMPAIGN_FAULTS_PER_STEP`
//! faults at once (default 3; every class once before any twice, drawn
//! by the seed), each while an operation
//! that needs the cloud runs, with every invariant checked after each
//! step. Prints, never asserts: faults injected by class, the operations
//! done, the invariant violations (there must be none), the time to
//! converge after each class (p50 and max), the Cinder and Nova calls per
//! operation, the orphans found. `CAMPAIGN_SEED` replays a campaign;
//! `CAMPAIGN_CUT_SECS` sets a node cut's length (default 100);
//! `CAMPAIGN_MINUTES` begins no step past that many minutes (the table
//! says how many steps ran).
//!
//! Needs the cluster tier up (`tests/cluster/cluster.py up`): `cargo bench
//! -p cluster-tests --bench campaign`. `BENCH_QUICK=1`: one step.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::time::{Duration, Instant};

use cluster_tests::campaign::{Campaign, Plan, seed_from_env};
use cluster_tests::{bench_cluster, bench_quick};

/// How long a node stays cut off by default (the longer cut; the
/// test runs the 20 s one).
const CUT_SECS: u64 = 100;

fn env_number(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|s| s.parse().ok())
}

#[tokio::main]
async fn main() {
    let Some(c) = bench_cluster() else {
        return;
    };
    let seed = seed_from_env();
    let steps = if bench_quick() {
        1
    } else {
        std::env::var("CAMPAIGN_STEPS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(70)
    };
    let faults_per_step = std::env::var("CAMPAIGN_FAULTS_PER_STEP")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    println!(
        "campaign seed {seed}, {steps} steps of {faults_per_step} faults (CAMPAIGN_SEED={seed} replays it)"
    );
    let plan = Plan {
        seed,
        steps,
        faults_per_step,
        window: Duration::from_secs(20),
        converge_bound: Duration::from_secs(300),
        cut: Duration::from_secs(env_number("CAMPAIGN_CUT_SECS").unwrap_or(CUT_SECS)),
        stop_after: env_number("CAMPAIGN_MINUTES").map(|m| Duration::from_secs(60 * m)),
    };
    let started = Instant::now();
    let mut campaign = Campaign::start(&c).await.unwrap();
    let report = campaign.run(&plan).await.unwrap();
    println!("{}", report.table(seed));
    println!("the campaign took {:?}", started.elapsed());
    campaign.close().await.unwrap();
    // its figures are printed, not judged; a violation is a failure
    if !report.violations.is_empty() {
        eprintln!(
            "{} invariant violations (listed above): the campaign failed",
            report.violations.len()
        );
        std::process::exit(1);
    }
}
