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
//! Bound, every pod Running) within a bound of the faults' end; the
//! workload writes again, and every write it acknowledged (told an
//! outside witness of, after its fsync) is in its file, in order, never
//! written again by another incarnation; a single-attach volume is never
//! on two nodes (each node's mounts sampled every 2 s through the whole
//! step, a failed sample a violation) nor attached to two servers
//! (Cinder's and Nova's records); nothing leaked (the controllers' own
//! orphan report, for what the campaign made, after every step); nothing
//! left behind (every CSI mount on a node and every attachment of the
//! cluster's volumes to a node's server owned by a pod or a
//! VolumeAttachment not being deleted); the calls to the cloud of a step,
//! every service's, stay within [`PRESSURE_FACTOR`] times what its
//! operation costs without faults, measured first, and one a second of
//! the step's length; every fault the proxy serves served at least once
//! (its rules' counts), the operation polled while the faults end. A
//! violation names the invariant, the step and the seed, and the campaign
//! replays from it.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use openstack_emulator::proxy::ProxyControl;

use crate::{Cluster, ClusterError, Result, TestNamespace};

mod checks;
mod faults;
mod holders;
mod leftovers;
mod operations;
mod plan;
mod report;
mod witness;

pub use plan::{Plan, Rng, StepDraw};
pub use report::Report;

pub use holders::{NodeMount, SAMPLE_GAP, two_nodes, two_servers, unsampled};
pub use leftovers::{CsiMount, Owners, unowned};
pub use witness::{WITNESS_ROOT, Witnessed, acknowledged_lost, parse_witness};

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
    /// Keystone stopped for the window, and every token issued before it
    /// expired (the proxy answers 401 to each; a token issued since
    /// passes): the plugins must log in again while they cannot, as when
    /// tokens expire during an outage. Without the expiry their cached
    /// tokens would carry them through, and nothing would be felt.
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
    /// calls never takes all of theirs; then a Keystone outage's expired
    /// tokens, before any delay or throttle: a service refuses an expired
    /// token however slow the way to it, and a delay rule ahead of it let
    /// every call through on its cached token validation, so that the
    /// outage went unfelt (seed 1796543000, step 2: CloudSlow served 7
    /// calls, the outage none). A throttle goes before the outage: it
    /// takes only the calls over its rate (the others go on to the next
    /// rule, the outage's), and behind the outage it saw only the calls
    /// after it, spaced out by the clients' back-off, and served nothing
    /// (seed 1796565886, step 6: 12 volume calls, 7 refused for their
    /// token, no two of the rest within 5 s).
    pub fn proxy_precedence(self) -> u8 {
        match self {
            FaultClass::NovaBusy => 0,
            FaultClass::AnswersLost => 1,
            FaultClass::CloudThrottled => 2,
            FaultClass::KeystoneOutage => 3,
            FaultClass::CloudSlow => 4,
            _ => 5,
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
    /// Every writer and sharer acknowledges new writes once the cluster
    /// converged (one whose filesystem went read-only stays Ready).
    WorkloadAlive,
    NeverTwoWriters,
    NothingLeaked,
    NothingLeftBehind,
    BoundedPressure,
    /// Each fault served (the proxy's count): a fault that never
    /// happened proves nothing.
    FaultServed,
}

/// One step's record.
#[derive(Debug, Clone)]
pub struct StepRecord {
    pub faults: Vec<FaultClass>,
    pub operation: Operation,
    pub converged_in: Duration,
    /// Calls to the cloud (every service) the proxy saw during the step.
    pub cloud_calls: usize,
    /// The same, by service.
    pub calls_by_service: BTreeMap<String, usize>,
    /// Records the workload acknowledged by the step's end, all told.
    pub acknowledged: usize,
    /// What shows each of the step's faults happened: what a proxy
    /// fault served (429s given, answers lost or delayed, busy answers),
    /// the pods a deletion took away (by uid), the probes an outage or a
    /// cut refused, a restart's or a stopped kubelet's own proof.
    pub served: BTreeMap<FaultClass, u64>,
}

/// Bounded pressure: a step may cost the cloud at most this many times
/// what its operation costs without faults (every service's calls at the
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

/// A throttled step's 429s: the throttle lets one call through every
/// [`THROTTLE_INTERVAL_SECS`] per service and says, in its hint, when the
/// next may come. A caller that waits as told meets at most one 429 per
/// interval; a caller that does not, one per retry. The bound allows
/// [`THROTTLE_CALLERS`] callers at once on each throttled service (the
/// controller's sidecars, the snapshot controller, the node plugins)...
pub const THROTTLE_CALLERS: u64 = 6;
/// ...the throttle's interval (one call every 5 s)...
pub const THROTTLE_INTERVAL_SECS: u64 = 5;

/// The most 429s `rules` throttles may serve in `secs` to callers that
/// honour the hint.
pub fn throttle_bound(rules: u64, secs: u64) -> u64 {
    rules * THROTTLE_CALLERS * (secs / THROTTLE_INTERVAL_SECS + 1)
}

/// A throttle's 429s past what honoured hints allow: a retry loop that
/// ignores the hint.
pub fn hint_ignored(label: &str, rules: u64, served: u64, secs: u64) -> Option<String> {
    let bound = throttle_bound(rules, secs);
    (served > bound).then(|| {
        format!(
            "{:?} at {label}: {served} answers of 429 in the {secs} s the cloud was throttled, over the {bound} that callers waiting as the hint says meet ({THROTTLE_CALLERS} callers on each of {rules} services, one 429 each every {THROTTLE_INTERVAL_SECS} s): a retry hint not honoured",
            Invariant::BoundedPressure
        )
    })
}

/// The most calls a step of `op` that lasted `secs` may cost, against
/// the fault-free count.
pub fn pressure_bound(baseline: &BTreeMap<Operation, usize>, op: Operation, secs: u64) -> usize {
    PRESSURE_FACTOR * baseline.get(&op).copied().unwrap_or(0).max(PRESSURE_FLOOR)
        + PRESSURE_PER_SECOND * usize::try_from(secs).unwrap_or(usize::MAX)
}

const WRITERS: usize = 3;
/// The step numbers the fault-free operations take their objects' names
/// from (past any campaign's steps).
const BASELINE_STEPS: usize = 100_000;
const SHARERS: usize = 2;
const MINUTE: Duration = Duration::from_secs(60);

/// The pods a fault deleted: its class and their uids.
type DeletedPods = (FaultClass, Vec<String>);

/// What the campaign runs in and on.
#[derive(Debug)]
pub struct Campaign {
    pub c: Cluster,
    ns: Option<TestNamespace>,
    proxy: ProxyControl,
    started: u64,
    samples: holders::SharedSamples,
    /// The orphans reported at earlier steps.
    orphans_reported: Arc<Mutex<HashSet<String>>>,
    step: Arc<Mutex<String>>,
    /// The samplers of the nodes and of the cloud's records.
    samplers: Vec<tokio::task::JoinHandle<()>>,
    /// How long the cluster has, once converged, to finish its detaches,
    /// unmounts and deletions before what is left counts.
    catch_up: Duration,
    /// The node cut off, when, and for how long.
    cut: Arc<Mutex<Option<(String, Instant, Duration)>>>,
    /// What shows each of the step's faults other than the proxy's
    /// happened (pods gone, probes refused), by class.
    proofs: Arc<Mutex<BTreeMap<FaultClass, u64>>>,
    /// The pods the step's faults deleted, by uid.
    doomed: Arc<Mutex<Vec<DeletedPods>>>,
    /// The node whose kubelet is stopped.
    kubelet_stopped: Arc<Mutex<Option<String>>>,
    /// When Keystone was stopped (ms since the epoch), once the
    /// campaign's own probe of it was done: logins the proxy saw fail
    /// since then were a plugin's.
    keystone_down_since: Arc<Mutex<Option<u64>>>,
}

impl Drop for Campaign {
    fn drop(&mut self) {
        for s in self.samplers.drain(..) {
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
        // its witness stays for a look at what failed (the next
        // campaign's start removes it; `close` does on success)
        if self.ns.is_some() {
            eprintln!(
                "the campaign's witness is kept at {}",
                self.witness_dir().display()
            );
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
        let mut campaign = Self {
            c: c.clone(),
            ns: Some(ns),
            proxy,
            started,
            samples: Arc::default(),
            orphans_reported: Arc::default(),
            step: Arc::new(Mutex::new("setting up".into())),
            samplers: Vec::new(),
            proofs: Arc::default(),
            keystone_down_since: Arc::default(),
            doomed: Arc::default(),
            catch_up: 2 * MINUTE,
            cut: Arc::default(),
            kubelet_stopped: Arc::default(),
        };
        // the witnesses an earlier campaign that failed kept
        if let Ok(earlier) = std::fs::read_dir(WITNESS_ROOT) {
            for e in earlier.flatten() {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
        let witness = campaign.witness_dir();
        std::fs::create_dir_all(&witness)
            .map_err(|e| ClusterError::Other(format!("{}: {e}", witness.display())))?;
        operations::apply_workload(c, &n).await?;
        campaign.converged(3 * MINUTE).await?;
        campaign.start_sampler().await?;
        Ok(campaign)
    }

    /// The step the samplers name in what they see.
    pub fn begin_step(&self, label: &str) {
        if let Ok(mut s) = self.step.lock() {
            *s = label.to_string();
        }
    }

    /// How long the cluster has to catch up after converging (the checks'
    /// own test shortens it: what it leaves stays).
    pub fn set_catch_up(&mut self, catch_up: Duration) {
        self.catch_up = catch_up;
    }

    /// The campaign's namespace.
    pub fn n(&self) -> &str {
        self.ns.as_ref().map_or("", |ns| ns.name.as_str())
    }
    /// Runs the plan; the report, violations included (the caller fails
    /// on them).
    pub async fn run(&mut self, plan: &Plan) -> Result<Report> {
        let draws = plan.draw();
        let mut report = Report::default();
        // the violations printed so far
        let mut shown = 0;
        // what each operation the steps drew costs the cloud without
        // faults: the measure of their pressure (one not drawn is not
        // measured: a minute or more of the test command's time each)
        for (i, op) in Operation::ALL.iter().enumerate() {
            if !draws.iter().any(|d| d.operation == *op) {
                continue;
            }
            if let Ok(mut s) = self.step.lock() {
                *s = format!("{op:?} without faults (seed {})", plan.seed);
            }
            self.proxy
                .clear_calls()
                .await
                .map_err(ClusterError::Other)?;
            let measured = Instant::now();
            // a move that moves: a writer whose zone has another node
            let pick = match op {
                Operation::MoveWriter => self.movable_writer().await?,
                _ => i,
            };
            self.operate(*op, BASELINE_STEPS + i, pick, 5 * MINUTE)
                .await?;
            self.converged(plan.converge_bound).await?;
            self.wait_nothing_left_behind(2 * MINUTE).await?;
            let calls = self.cloud_calls().await?;
            eprintln!(
                "{op:?} without faults: calls to the cloud {calls:?} ({:.0} s)",
                measured.elapsed().as_secs_f64()
            );
            report.baseline.insert(*op, calls.values().sum());
        }
        let started = Instant::now();
        for (step, drawn) in draws.into_iter().enumerate() {
            if plan.stop_after.is_some_and(|d| started.elapsed() > d) {
                eprintln!(
                    "the campaign stops after {step} steps: {:.0} minutes passed",
                    started.elapsed().as_secs_f64() / 60.0
                );
                break;
            }
            let StepDraw {
                faults,
                operation: op,
                mut pick,
            } = drawn;
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
            self.proxy
                .clear_calls()
                .await
                .map_err(ClusterError::Other)?;
            // a whole cluster's restart first (as drawn), the proxy's
            // rules in their precedence
            let mut injecting = faults.clone();
            injecting.sort_by_key(|f| (*f != FaultClass::ClusterRestarted, f.proxy_precedence()));
            let injected = Instant::now();
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
                let ending = self.end_faults(&faults, plan.converge_bound);
                tokio::pin!(ending);
                loop {
                    tokio::select! {
                        r = &mut operation, if op_result.is_none() => op_result = Some(r),
                        e = &mut ending => break e,
                    }
                }
            };
            let (served, unserved) = ended?;
            if let Some(n) = served.get(&FaultClass::CloudThrottled) {
                report
                    .violations
                    .extend(hint_ignored(&label, 2, *n, injected.elapsed().as_secs()));
            }
            for f in unserved {
                report.violations.push(format!(
                    "{:?} at {label}: {f:?} was not shown to happen (at the proxy: it served nothing in the window and the bound of convergence more, the operation never made the calls it targets; else no pod it deleted gone, the service still answering, the node still reaching what it was cut from)",
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
            let (converged_in, found) = self
                .after_step(&label, step_started, faults_ended, plan.converge_bound)
                .await?;
            report.violations.extend(found);
            let calls_by_service = self.cloud_calls().await?;
            let cloud_calls: usize = calls_by_service.values().sum();
            // no tight loops, hints honoured: a step costs the cloud a
            // stated factor of what its operation costs without faults
            let secs = step_started.elapsed().as_secs();
            let bound = pressure_bound(&report.baseline, op, secs);
            if cloud_calls > bound {
                report.violations.push(format!(
                    "{:?} at {label}: {cloud_calls} calls to the cloud in {secs} s ({calls_by_service:?}), over {bound} ({PRESSURE_FACTOR} times the {} of {op:?} without faults, and one a second)",
                    Invariant::BoundedPressure,
                    report.baseline.get(&op).copied().unwrap_or(0)
                ));
            }
            // progress, while a long campaign runs, with what it broke
            eprintln!(
                "{label}: converged {:.1} s after the faults ended, {:.0} s in all; calls to the cloud {calls_by_service:?}; served at the proxy {served:?}; samples of the nodes {:?}",
                converged_in.as_secs_f64(),
                step_started.elapsed().as_secs_f64(),
                self.sample_counts()
            );
            for v in &report.violations[shown..] {
                eprintln!("VIOLATION {v}");
            }
            shown = report.violations.len();
            report.steps.push(StepRecord {
                faults,
                operation: op,
                converged_in,
                cloud_calls,
                calls_by_service,
                acknowledged: self.acknowledged_count()?,
                served,
            });
        }
        report.orphans_found = self.orphans_reported.lock().map(|r| r.len()).unwrap_or(0);
        let (nodes_read, nodes_failed, cloud_read, cloud_failed) = self.sample_counts();
        report.node_samples = (nodes_read, nodes_failed);
        report.cloud_samples = (cloud_read, cloud_failed);
        Ok(report)
    }

    /// Deletes the workload and waits until it is gone.
    pub async fn close(mut self) -> Result<()> {
        for s in self.samplers.drain(..) {
            s.abort();
        }
        let witness = self.witness_dir();
        let closed = match self.ns.take() {
            Some(ns) => ns.close().await,
            None => Ok(()),
        };
        let _ = std::fs::remove_dir_all(witness);
        closed
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
    fn a_throttle_answered_more_than_honoured_hints_allow_is_seen() {
        // two services throttled for 60 s: 6 callers each, one 429 every
        // 5 s apiece
        assert_eq!(throttle_bound(2, 60), 2 * 6 * 13);
        assert_eq!(hint_ignored("s", 2, 156, 60), None);
        // one caller asking every 100 ms, whatever the hint says
        let found = hint_ignored("s", 1, 95, 10).expect("a loop ignoring the hint");
        assert!(found.starts_with("BoundedPressure at s"), "{found}");
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
