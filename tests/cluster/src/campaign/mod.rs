//! A seeded campaign of production faults on the cluster tier, with the
//! invariants checked after every one.
//!
//! The workload: writers (a StatefulSet, one Cinder xfs claim each) that
//! append and fsync a sequence number, sharers (a Deployment on one
//! CephFS claim) doing the same to a file each; and, while a fault lasts,
//! an operation that needs the cloud: a writer moved, a scratch claim
//! provisioned and deleted, a snapshot taken and restored, a writer's
//! claim expanded. The faults, drawn by the seed from [`FaultClass`]: the
//! cloud throttled, busy, slow or losing answers (through the test
//! cloud's fault proxy, which the cluster's plugins reach the cloud by),
//! Cinder's or Keystone's API gone, the Cinder controller killed, a node
//! plugin or kubelet restarted.
//!
//! After each step, [`Invariant`]s: everything converges (every claim
//! Bound, every pod Running) within a bound; no acknowledged write is
//! lost; a single-attach volume is never attached to two servers (sampled
//! every 2 s, in Cinder and in Nova, throughout); nothing leaked (the
//! controllers' own orphan report, for what the campaign made); nothing
//! left behind (every CSI mount on a node and every attachment of the
//! cluster's volumes to a node's server owned by a pod or a
//! VolumeAttachment); the calls to the cloud of a step stay within
//! [`PRESSURE_FACTOR`] times what its operation costs without faults,
//! measured first, and one a second of the step's length; every fault the
//! proxy serves served at least once (its rules' counts), the operation
//! polled while the faults end. A violation names the invariant, the step
//! and the seed, and the campaign replays from it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use openstack_emulator::proxy::ProxyControl;

use crate::{Cluster, ClusterError, Result, TestNamespace};

mod checks;
mod faults;
mod leftovers;
mod operations;

pub use checks::{Acknowledged, two_writers, write_lost};
pub use leftovers::{CsiMount, Owners, unowned};

/// A small, seedable generator (splitmix64): the same seed, the same
/// campaign.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn draw(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.draw() % n.max(1) as u64) as usize
    }

    /// `items` in an order of the seed's.
    pub fn shuffled<T: Clone>(&mut self, items: &[T]) -> Vec<T> {
        let mut v = items.to_vec();
        for i in (1..v.len()).rev() {
            let j = self.below(i + 1);
            v.swap(i, j);
        }
        v
    }
}

/// What a fault imitates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FaultClass {
    /// Cinder and Nova each answer 429 past one call every 5 s, with
    /// SAP's hint.
    CloudThrottled,
    /// Nova answers the first two attaches with its 409 for a busy
    /// server.
    NovaBusy,
    /// A create, an attach and a detach done, and their answers lost.
    AnswersLost,
    /// The first eight calls to Cinder and to Nova each answered 1.5 s
    /// late.
    CloudSlow,
    /// Cinder's API stopped for the fault's window.
    CinderOutage,
    /// Keystone stopped for the window (tokens cannot be checked).
    KeystoneOutage,
    /// The Cinder controller's pod force-deleted (its processes killed).
    ControllerKilled,
    /// The Cinder node plugin of the first writer's node deleted.
    NodePluginRestarted,
    /// Kubelet of node A stopped and started again.
    KubeletRestarted,
    /// A writer's node (B or C) cut off from the cloud (its APIs and
    /// Ceph) for the plan's cut length: its packets dropped.
    NodeCutFromCloud,
    /// The same node cut off from both apiservers.
    NodeCutFromApiserver,
    /// A writer's node's kubelet stopped past the eviction timeout: its
    /// node NotReady, its workload pods evicted and then force-deleted
    /// (as an operator does to get them rescheduled), and the kubelet
    /// started again only after their replacements waited on volumes
    /// still attached there.
    KubeletStoppedPastEviction,
    /// Every kubelet, the controllers, both apiservers and etcd stopped
    /// and started again, with the volumes in use.
    ClusterRestarted,
    /// The pods of the controllers' sidecars (Cinder's and Manila's
    /// controllers) and of the snapshot controller deleted gracefully, as
    /// a rollout or a node drain does, while an operation is in flight.
    SidecarPodsDeleted,
}

impl FaultClass {
    pub const ALL: [FaultClass; 14] = [
        FaultClass::CloudThrottled,
        FaultClass::NovaBusy,
        FaultClass::AnswersLost,
        FaultClass::CloudSlow,
        FaultClass::CinderOutage,
        FaultClass::KeystoneOutage,
        FaultClass::ControllerKilled,
        FaultClass::NodePluginRestarted,
        FaultClass::KubeletRestarted,
        FaultClass::NodeCutFromCloud,
        FaultClass::NodeCutFromApiserver,
        FaultClass::KubeletStoppedPastEviction,
        FaultClass::ClusterRestarted,
        FaultClass::SidecarPodsDeleted,
    ];

    /// Where a proxy fault's rules go among a step's (the proxy serves
    /// a request the first rule that takes it): those served a set
    /// number of times first, so that a delay or a throttle of the same
    /// calls never takes all of theirs.
    pub fn proxy_precedence(self) -> u8 {
        match self {
            FaultClass::NovaBusy => 0,
            FaultClass::AnswersLost => 1,
            FaultClass::CloudThrottled => 2,
            FaultClass::CloudSlow => 3,
            _ => 4,
        }
    }

    /// A fault the cloud's fault proxy serves: what it served is counted,
    /// and a step whose proxy fault served nothing fails the campaign.
    pub fn at_the_proxy(self) -> bool {
        matches!(
            self,
            FaultClass::CloudThrottled
                | FaultClass::NovaBusy
                | FaultClass::AnswersLost
                | FaultClass::CloudSlow
        )
    }

    /// What users of the upstream drivers see in the same case.
    pub fn upstream(self) -> &'static str {
        match self {
            FaultClass::CloudThrottled => {
                "no 429 handling in the CSI paths (gophercloud retries only on Retry-After): RPCs fail, sidecars back off item by item"
            }
            FaultClass::NovaBusy => {
                "the attach fails with the 409 (FailedPrecondition) until a sidecar retry finds the server idle"
            }
            FaultClass::AnswersLost => {
                "a lost create answer is found again by name; a lost attach is waited for until the RPC times out"
            }
            FaultClass::CloudSlow => "as here, within the sidecars' timeouts",
            FaultClass::CinderOutage | FaultClass::KeystoneOutage => {
                "RPCs fail and are retried by the sidecars"
            }
            FaultClass::ControllerKilled => {
                "a claim deleted while the provisioner is down between CreateVolume and the PV leaks its volume for good (external-provisioner #486); nobody reports it"
            }
            FaultClass::NodePluginRestarted | FaultClass::KubeletRestarted => "as here",
            FaultClass::NodeCutFromCloud => {
                "the node's mounts of CephFS shares stall while it is cut and resume after (ceph-fuse reconnects); no cloud call comes from a node"
            }
            FaultClass::NodeCutFromApiserver => {
                "the node's pods run on; past the node monitor's grace the node is NotReady, and its pods stay until their toleration ends"
            }
            FaultClass::KubeletStoppedPastEviction => {
                "the replacement of a force-deleted pod waits on its volume (Multi-Attach error) until the node's kubelet is back and unstages it"
            }
            FaultClass::ClusterRestarted => {
                "as here: the plugins keep serving the mounts; the sidecars reconnect to the apiservers"
            }
            FaultClass::SidecarPodsDeleted => {
                "a sidecar stopped mid-call leaves the call to the next leader, which repeats it (idempotent by name)"
            }
        }
    }
}

/// What runs while a fault lasts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Operation {
    MoveWriter,
    ProvisionScratch,
    SnapshotAndRestore,
    ExpandWriter,
}

impl Operation {
    pub const ALL: [Operation; 4] = [
        Operation::MoveWriter,
        Operation::ProvisionScratch,
        Operation::SnapshotAndRestore,
        Operation::ExpandWriter,
    ];

    /// Whether it attaches a volume to a server through Nova (an
    /// expansion does not): what a busy Nova needs to be felt.
    pub fn attaches(self) -> bool {
        !matches!(self, Operation::ExpandWriter)
    }
}

/// The invariants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Invariant {
    Converges,
    NoAcknowledgedWriteLost,
    NeverTwoWriters,
    NothingLeaked,
    NothingLeftBehind,
    BoundedPressure,
    /// Each fault served (the proxy's count): a fault that never
    /// happened proves nothing.
    FaultServed,
}

/// The campaign's parameters.
#[derive(Debug, Clone)]
pub struct Plan {
    pub seed: u64,
    /// Steps; each injects `faults_per_step` faults of distinct classes
    /// at once.
    pub steps: usize,
    pub faults_per_step: usize,
    /// How long each fault lasts.
    pub window: Duration,
    /// The bound within which everything must have converged after a
    /// step's faults ended.
    pub converge_bound: Duration,
    /// How long a node stays cut off (the node cuts end at least this
    /// long after they began, past the window if need be).
    pub cut: Duration,
}

/// One step's record.
#[derive(Debug, Clone)]
pub struct StepRecord {
    pub faults: Vec<FaultClass>,
    pub operation: Operation,
    pub converged_in: Duration,
    /// Calls to Cinder and Nova the proxy saw during the step, and the
    /// operations done.
    pub cloud_calls: usize,
    /// What each of the step's proxy faults served (429s given, answers
    /// lost or delayed, busy answers).
    pub served: BTreeMap<FaultClass, u64>,
}

/// Bounded pressure: a step may cost the cloud at most this many times
/// what its operation costs without faults (Cinder and Nova calls at the
/// proxy, the convergence after it included)...
pub const PRESSURE_FACTOR: usize = 10;
/// ...counting an operation as at least this many calls (a move whose
/// volume stays put costs almost none, and a fault's own repairs, as a
/// restarted controller's, still cost a few)...
pub const PRESSURE_FLOOR: usize = 10;
/// ...and one call more for every second the step lasted: what an
/// operation waiting on the cloud for as long as a fault keeps it costs
/// (two waits, each polling at most every 2 s), far below a tight loop.
pub const PRESSURE_PER_SECOND: usize = 1;

/// The most calls a step of `op` that lasted `secs` may cost, against
/// the fault-free count.
pub fn pressure_bound(baseline: &BTreeMap<Operation, usize>, op: Operation, secs: u64) -> usize {
    PRESSURE_FACTOR * baseline.get(&op).copied().unwrap_or(0).max(PRESSURE_FLOOR)
        + PRESSURE_PER_SECOND * usize::try_from(secs).unwrap_or(usize::MAX)
}

/// What a campaign did.
#[derive(Debug, Default)]
pub struct Report {
    /// Each operation's Cinder and Nova calls without faults.
    pub baseline: BTreeMap<Operation, usize>,
    pub steps: Vec<StepRecord>,
    pub violations: Vec<String>,
    pub orphans_found: usize,
    pub holder_samples: usize,
}

impl Report {
    pub fn faults_by_class(&self) -> BTreeMap<FaultClass, usize> {
        let mut m = BTreeMap::new();
        for s in &self.steps {
            for f in &s.faults {
                *m.entry(*f).or_default() += 1;
            }
        }
        m
    }

    /// p50 and max of the convergence times of the steps a class was in.
    pub fn convergence(&self, class: FaultClass) -> Option<(Duration, Duration)> {
        let mut t: Vec<Duration> = self
            .steps
            .iter()
            .filter(|s| s.faults.contains(&class))
            .map(|s| s.converged_in)
            .collect();
        t.sort();
        // the lower median of an even count
        Some((*t.get(t.len().saturating_sub(1) / 2)?, *t.last()?))
    }

    /// The report as the bench and the test print it.
    pub fn table(&self, seed: u64) -> String {
        let mut s = format!(
            "campaign seed {seed}: {} steps, {} faults, {} invariant violations, {} orphans, {} holder samples\n",
            self.steps.len(),
            self.faults_by_class().values().sum::<usize>(),
            self.violations.len(),
            self.orphans_found,
            self.holder_samples
        );
        s.push_str("| fault | injected | served at the proxy (steps proven) | converged p50 | max |\n| --- | --- | --- | --- | --- |\n");
        for (class, n) in self.faults_by_class() {
            let (p50, max) = self.convergence(class).unwrap_or_default();
            let served = if class.at_the_proxy() {
                let counts: Vec<u64> = self
                    .steps
                    .iter()
                    .filter_map(|st| st.served.get(&class).copied())
                    .collect();
                format!(
                    "{} ({} of {})",
                    counts.iter().sum::<u64>(),
                    counts.iter().filter(|c| **c > 0).count(),
                    counts.len()
                )
            } else {
                "not counted".to_string()
            };
            s.push_str(&format!(
                "| {class:?} | {n} | {served} | {:.1} s | {:.1} s |\n",
                p50.as_secs_f64(),
                max.as_secs_f64()
            ));
        }
        let calls: usize = self.steps.iter().map(|s| s.cloud_calls).sum();
        s.push_str(&format!(
            "Cinder and Nova calls: {calls} for {} operations ({:.1} per operation)\n",
            self.steps.len(),
            calls as f64 / self.steps.len().max(1) as f64
        ));
        s.push_str(&format!("| operation | calls without faults | mean with the cloud throttled (steps) | mean with any faults (steps) | bound ({PRESSURE_FACTOR} times, and one a second) |\n| --- | --- | --- | --- | --- |\n"));
        for (op, base) in &self.baseline {
            let mean = |throttled: bool| {
                let v: Vec<usize> = self
                    .steps
                    .iter()
                    .filter(|s| {
                        s.operation == *op
                            && (!throttled || s.faults.contains(&FaultClass::CloudThrottled))
                    })
                    .map(|s| s.cloud_calls)
                    .collect();
                if v.is_empty() {
                    "-".to_string()
                } else {
                    format!(
                        "{:.1} ({})",
                        v.iter().sum::<usize>() as f64 / v.len() as f64,
                        v.len()
                    )
                }
            };
            s.push_str(&format!(
                "| {op:?} | {base} | {} | {} | {} + the step's seconds |\n",
                mean(true),
                mean(false),
                pressure_bound(&self.baseline, *op, 0)
            ));
        }
        for v in &self.violations {
            s.push_str(&format!("VIOLATION {v}\n"));
        }
        s
    }
}

const WRITERS: usize = 3;
/// The step numbers the fault-free operations take their objects' names
/// from (past any campaign's steps).
const BASELINE_STEPS: usize = 100_000;
const SHARERS: usize = 2;
const MINUTE: Duration = Duration::from_secs(60);

/// What the campaign runs in and on.
#[derive(Debug)]
pub struct Campaign {
    pub c: Cluster,
    ns: Option<TestNamespace>,
    proxy: ProxyControl,
    started: u64,
    violations: Arc<Mutex<Vec<String>>>,
    samples: Arc<Mutex<usize>>,
    step: Arc<Mutex<String>>,
    sampler: Option<tokio::task::JoinHandle<()>>,
    /// The node cut off, when, and for how long.
    cut: Arc<Mutex<Option<(String, Instant, Duration)>>>,
    /// The node whose kubelet is stopped.
    kubelet_stopped: Arc<Mutex<Option<String>>>,
}

impl Drop for Campaign {
    fn drop(&mut self) {
        if let Some(s) = self.sampler.take() {
            s.abort();
        }
        // no fault outlives the campaign
        let proxy = self.proxy.clone();
        let _ = std::thread::spawn(move || {
            if let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                let _ = rt.block_on(proxy.clear_faults());
            }
        })
        .join();
        // nor a node's cut
        if let Some((node, _, _)) = self.cut.lock().ok().and_then(|mut c| c.take()) {
            let _ = std::process::Command::new("python3")
                .arg(crate::repo().join("tests/cluster/cluster.py"))
                .args(["mend-node", &node])
                .output();
        }
        // nor a stopped kubelet
        if let Some(node) = self.kubelet_stopped.lock().ok().and_then(|mut k| k.take()) {
            let _ = std::process::Command::new("python3")
                .arg(crate::repo().join("tests/cluster/cluster.py"))
                .args(["start-kubelet", &node])
                .output();
        }
        // (its words captured: the test harness's own lines must stay whole)
        for service in ["cinder", "keystone"] {
            let _ = std::process::Command::new("python3")
                .arg(crate::repo().join("tests/openstack/cloud.py"))
                .args(["outage", "start", service])
                .output();
        }
    }
}

impl Campaign {
    /// The workload, running, and the holder sampler started.
    pub async fn start(c: &Cluster) -> Result<Self> {
        let proxy = c.fault_proxy()?;
        proxy.clear_faults().await.map_err(ClusterError::Other)?;
        let started = now_secs();
        let ns = c.namespace("campaign").await?;
        let n = ns.name.clone();
        operations::apply_workload(c, &n).await?;
        let mut campaign = Self {
            c: c.clone(),
            ns: Some(ns),
            proxy,
            started,
            violations: Arc::default(),
            samples: Arc::default(),
            step: Arc::new(Mutex::new("setting up".into())),
            sampler: None,
            cut: Arc::default(),
            kubelet_stopped: Arc::default(),
        };
        campaign.converged(3 * MINUTE).await?;
        campaign.sampler = Some(campaign.sample_holders());
        Ok(campaign)
    }

    /// The campaign's namespace.
    pub fn n(&self) -> &str {
        self.ns.as_ref().map_or("", |ns| ns.name.as_str())
    }
    /// Runs the plan; the report, violations included (the caller fails
    /// on them).
    pub async fn run(&mut self, plan: &Plan) -> Result<Report> {
        let mut rng = Rng::new(plan.seed);
        let mut report = Report::default();
        // the violations printed so far, the step's and the sampler's
        let (mut shown, mut sampled_shown) = (0, 0);
        // what each operation costs the cloud without faults: the
        // measure of the steps' pressure
        for (i, op) in Operation::ALL.iter().enumerate() {
            if let Ok(mut s) = self.step.lock() {
                *s = format!("{op:?} without faults (seed {})", plan.seed);
            }
            self.proxy
                .clear_calls()
                .await
                .map_err(ClusterError::Other)?;
            // a move that moves: a writer whose zone has another node
            let pick = match op {
                Operation::MoveWriter => self.movable_writer().await?,
                _ => i,
            };
            self.operate(*op, BASELINE_STEPS + i, pick, 5 * MINUTE)
                .await?;
            self.converged(plan.converge_bound).await?;
            self.wait_nothing_left_behind(2 * MINUTE).await?;
            let calls = self.cloud_calls().await;
            eprintln!("{op:?} without faults: {calls} Cinder and Nova calls");
            report.baseline.insert(*op, calls);
        }
        // every class once before any twice
        let mut deck: Vec<FaultClass> = Vec::new();
        for step in 0..plan.steps {
            let mut faults = Vec::new();
            while faults.len() < plan.faults_per_step.min(FaultClass::ALL.len()) {
                if deck.is_empty() {
                    deck = rng.shuffled(&FaultClass::ALL);
                }
                let f = deck.remove(0);
                if !faults.contains(&f) {
                    faults.push(f);
                } else {
                    deck.push(f);
                }
            }
            // a whole cluster's restart first: it starts every kubelet,
            // a stopped one too, and is over before the operation begins
            faults.sort_by_key(|f| *f != FaultClass::ClusterRestarted);
            let mut op = Operation::ALL[rng.below(Operation::ALL.len())];
            // a busy Nova is felt only by an attach
            if faults.contains(&FaultClass::NovaBusy) && !op.attaches() {
                let attaching: Vec<Operation> = Operation::ALL
                    .into_iter()
                    .filter(|o| o.attaches())
                    .collect();
                op = attaching[rng.below(attaching.len())];
            }
            let mut pick = rng.below(WRITERS);
            let label = format!("step {step} ({faults:?} during {op:?}, seed {})", plan.seed);
            if let Ok(mut s) = self.step.lock() {
                *s = label.clone();
            }
            // a move that moves: a writer whose zone has another node, so
            // that its volume goes between servers through the cloud
            if op == Operation::MoveWriter {
                pick = self.movable_writer().await?;
            }
            let step_started = Instant::now();
            let before = self.acknowledged().await?;
            self.proxy
                .clear_calls()
                .await
                .map_err(ClusterError::Other)?;
            // a whole cluster's restart first (as drawn), the proxy's
            // rules in their precedence
            let mut injecting = faults.clone();
            injecting.sort_by_key(|f| (*f != FaultClass::ClusterRestarted, f.proxy_precedence()));
            for f in &injecting {
                self.inject(*f, plan.cut).await?;
            }
            // the operation may wait as long as the faults last and the
            // cluster then takes to converge: the invariant's bound, not a
            // shorter one of its own (a 100 s cut and a cluster restart
            // outlast four minutes from the operation's start)
            let patience = plan.cut.max(plan.window) + plan.converge_bound;
            let operation = self.operate(op, step, pick, patience);
            let window = tokio::time::sleep(plan.window);
            tokio::pin!(operation);
            tokio::pin!(window);
            let mut op_result = None;
            tokio::select! {
                r = &mut operation => { op_result = Some(r); window.await; }
                _ = &mut window => {}
            }
            // the faults end while the operation goes on (it is polled
            // throughout: its later stages meet what is left of the
            // faults, not a pause)
            let ended = {
                let ending = self.end_faults(&faults);
                tokio::pin!(ending);
                loop {
                    tokio::select! {
                        r = &mut operation, if op_result.is_none() => op_result = Some(r),
                        e = &mut ending => break e,
                    }
                }
            };
            let (served, unserved) = ended?;
            for f in unserved {
                report.violations.push(format!(
                    "{:?} at {label}: {f:?} served nothing at the proxy in the window and 2 minutes more (the operation never made the calls it targets)",
                    Invariant::FaultServed
                ));
            }
            // from here, the cloud and the cluster are whole again: the
            // operation done and everything converged within the bound of
            // the faults' end, or a violation
            let faults_ended = Instant::now();
            let op_result = match op_result {
                Some(r) => r,
                None => operation.await,
            };
            if let Err(e) = op_result {
                report.violations.push(format!(
                    "{:?} at {label}: the operation failed: {e}",
                    Invariant::Converges
                ));
            }
            let left = plan
                .converge_bound
                .saturating_sub(faults_ended.elapsed())
                .max(Duration::from_secs(1));
            let converged_in = match self.converged(left).await {
                Ok(_) => faults_ended.elapsed(),
                Err(e) => {
                    report
                        .violations
                        .push(format!("{:?} at {label}: {e}", Invariant::Converges));
                    faults_ended.elapsed()
                }
            };
            if converged_in > plan.converge_bound {
                report.violations.push(format!(
                    "{:?} at {label}: converged {:.0} s after the faults ended, past the bound of {} s",
                    Invariant::Converges,
                    converged_in.as_secs_f64(),
                    plan.converge_bound.as_secs()
                ));
            }
            for lost in self.check_acknowledged(&before).await? {
                report.violations.push(format!(
                    "{:?} at {label}: {lost}",
                    Invariant::NoAcknowledgedWriteLost
                ));
            }
            // what was unmounted, detached or deleted for good is gone
            // from the nodes and their servers once the cluster caught up
            for left in self.wait_nothing_left_behind(2 * MINUTE).await? {
                report.violations.push(format!(
                    "{:?} at {label}: {left}",
                    Invariant::NothingLeftBehind
                ));
            }
            let cloud_calls = self.cloud_calls().await;
            // no tight loops, hints honoured: a step costs the cloud a
            // stated factor of what its operation costs without faults
            let secs = step_started.elapsed().as_secs();
            let bound = pressure_bound(&report.baseline, op, secs);
            if cloud_calls > bound {
                report.violations.push(format!(
                    "{:?} at {label}: {cloud_calls} Cinder and Nova calls in {secs} s, over {bound} ({PRESSURE_FACTOR} times the {} of {op:?} without faults, and one a second)",
                    Invariant::BoundedPressure,
                    report.baseline.get(&op).copied().unwrap_or(0)
                ));
            }
            // progress, while a long campaign runs, with what it broke
            eprintln!(
                "{label}: converged {:.1} s after the faults ended; {cloud_calls} Cinder and Nova calls; served at the proxy {served:?}",
                converged_in.as_secs_f64()
            );
            for v in &report.violations[shown..] {
                eprintln!("VIOLATION {v}");
            }
            shown = report.violations.len();
            if let Ok(sampled) = self.violations.lock() {
                for v in &sampled[sampled_shown..] {
                    eprintln!("VIOLATION {v}");
                }
                sampled_shown = sampled.len();
            }
            report.steps.push(StepRecord {
                faults,
                operation: op,
                converged_in,
                cloud_calls,
                served,
            });
        }
        // the deletions of the last steps are done before nothing may leak
        let leaked = self.wait_nothing_leaked().await?;
        report.orphans_found = leaked.len();
        for o in leaked {
            report.violations.push(format!(
                "{:?} (seed {}): {o}",
                Invariant::NothingLeaked,
                plan.seed
            ));
        }
        report.holder_samples = self.samples.lock().map(|s| *s).unwrap_or(0);
        if let Ok(v) = self.violations.lock() {
            report.violations.extend(v.iter().cloned());
        }
        Ok(report)
    }

    /// The orphans the campaign left, once deletions under way had time.
    async fn wait_nothing_leaked(&self) -> Result<Vec<String>> {
        let until = Instant::now() + 3 * MINUTE;
        loop {
            let found = self.orphans().await?;
            if found.is_empty() || Instant::now() >= until {
                return Ok(found);
            }
            tokio::time::sleep(Duration::from_secs(10)).await;
        }
    }

    /// Deletes the workload and waits until it is gone.
    pub async fn close(mut self) -> Result<()> {
        if let Some(s) = self.sampler.take() {
            s.abort();
        }
        match self.ns.take() {
            Some(ns) => ns.close().await,
            None => Ok(()),
        }
    }
}

/// `CAMPAIGN_SEED` (a replay), else the time: a new campaign each run.
pub fn seed_from_env() -> u64 {
    std::env::var("CAMPAIGN_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(now_secs)
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_may_cost_a_stated_factor_of_its_fault_free_calls() {
        let baseline: BTreeMap<Operation, usize> = [
            (Operation::ProvisionScratch, 24),
            (Operation::MoveWriter, 2),
        ]
        .into();
        assert_eq!(
            pressure_bound(&baseline, Operation::ProvisionScratch, 0),
            240
        );
        assert_eq!(
            pressure_bound(&baseline, Operation::MoveWriter, 0),
            PRESSURE_FACTOR * PRESSURE_FLOOR,
            "a cheap operation counts as the floor"
        );
        assert_eq!(
            pressure_bound(&baseline, Operation::ProvisionScratch, 200),
            440,
            "a long step may poll once a second"
        );
    }

    #[test]
    fn the_same_seed_draws_the_same_campaign() {
        let a: Vec<u64> = (0..5)
            .map({
                let mut r = Rng::new(7);
                move |_| r.draw()
            })
            .collect();
        let b: Vec<u64> = (0..5)
            .map({
                let mut r = Rng::new(7);
                move |_| r.draw()
            })
            .collect();
        assert_eq!(a, b);
        let mut r = Rng::new(1);
        let s = r.shuffled(&FaultClass::ALL);
        assert_eq!(s.len(), FaultClass::ALL.len());
        assert!(FaultClass::ALL.iter().all(|f| s.contains(f)));
    }
}
