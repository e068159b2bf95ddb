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
//! controllers' own orphan report, for what the campaign made); the calls
//! to the cloud per operation stay bounded. A violation names the
//! invariant, the step and the seed, and the campaign replays from it.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use openstack_emulator::proxy::ProxyControl;
use openstack_emulator::{FaultAction, FaultRule, RetryHint};
use serde_json::Value;

use crate::{
    Cluster, ClusterError, MULTI_NODE_TAINT_KEY, PodOptions, Result, SUITE_NAMESPACE,
    TestNamespace, claim, pod,
};

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
    /// Cinder and Nova answer 429 past 3 calls a second (SAP's hint).
    CloudThrottled,
    /// Nova answers half the attaches with its 409 for a busy server.
    NovaBusy,
    /// A create, an attach and a detach done, and their answers lost.
    AnswersLost,
    /// Half of Cinder's and Nova's answers 1.5 s late.
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
}

impl FaultClass {
    pub const ALL: [FaultClass; 9] = [
        FaultClass::CloudThrottled,
        FaultClass::NovaBusy,
        FaultClass::AnswersLost,
        FaultClass::CloudSlow,
        FaultClass::CinderOutage,
        FaultClass::KeystoneOutage,
        FaultClass::ControllerKilled,
        FaultClass::NodePluginRestarted,
        FaultClass::KubeletRestarted,
    ];

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
        }
    }
}

/// What runs while a fault lasts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
}

/// The invariants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Invariant {
    Converges,
    NoAcknowledgedWriteLost,
    NeverTwoWriters,
    NothingLeaked,
    BoundedPressure,
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
}

/// What a campaign did.
#[derive(Debug, Default)]
pub struct Report {
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
        Some((*t.get(t.len() / 2)?, *t.last()?))
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
        s.push_str("| fault | injected | converged p50 | max |\n| --- | --- | --- | --- |\n");
        for (class, n) in self.faults_by_class() {
            let (p50, max) = self.convergence(class).unwrap_or_default();
            s.push_str(&format!(
                "| {class:?} | {n} | {:.1} s | {:.1} s |\n",
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
        for v in &self.violations {
            s.push_str(&format!("VIOLATION {v}\n"));
        }
        s
    }
}

const WRITERS: usize = 3;
const SHARERS: usize = 2;
const MINUTE: Duration = Duration::from_secs(60);

fn writers_manifest() -> String {
    let tolerate = format!(
        "      tolerations:\n      - key: {MULTI_NODE_TAINT_KEY}\n        operator: Exists\n        effect: NoSchedule\n"
    );
    format!(
        "apiVersion: apps/v1\nkind: StatefulSet\nmetadata:\n  name: writer\nspec:\n  replicas: {WRITERS}\n  podManagementPolicy: Parallel\n  serviceName: writer\n  selector:\n    matchLabels: {{app: writer}}\n  template:\n    metadata:\n      labels: {{app: writer}}\n    spec:\n      terminationGracePeriodSeconds: 2\n{tolerate}      containers:\n      - name: app\n        image: {}\n        command: [sh, -c, 'i=$(tail -n 1 /data/seq 2>/dev/null); i=${{i:-0}}; while true; do i=$((i+1)); echo $i >> /data/seq && (fsync /data/seq 2>/dev/null || sync); sleep 0.2; done']\n        volumeMounts:\n        - {{name: data, mountPath: /data}}\n  volumeClaimTemplates:\n  - metadata:\n      name: data\n    spec:\n      accessModes: [ReadWriteOnce]\n      storageClassName: csi-cinder-sc-xfs\n      resources:\n        requests:\n          storage: 1Gi\n",
        crate::APP_IMAGE
    )
}

fn sharers_manifest() -> String {
    format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: sharer\nspec:\n  replicas: {SHARERS}\n  selector:\n    matchLabels: {{app: sharer}}\n  template:\n    metadata:\n      labels: {{app: sharer}}\n    spec:\n      terminationGracePeriodSeconds: 2\n      tolerations:\n      - key: {MULTI_NODE_TAINT_KEY}\n        operator: Exists\n        effect: NoSchedule\n      containers:\n      - name: app\n        image: {}\n        command: [sh, -c, 'i=0; while true; do i=$((i+1)); echo $i >> /data/$HOSTNAME && (fsync /data/$HOSTNAME 2>/dev/null || sync); sleep 0.2; done']\n        volumeMounts:\n        - {{name: data, mountPath: /data}}\n      volumes:\n      - name: data\n        persistentVolumeClaim: {{claimName: shared}}\n",
        crate::APP_IMAGE
    )
}

/// Each writer's acknowledged number (by pod), each sharer file's (by
/// path).
pub type Acknowledged = (HashMap<String, u64>, HashMap<String, u64>);

/// A single-attach volume held by two servers, by Cinder's records or
/// Nova's.
pub fn two_writers(volume: &str, in_cinder: &[String], in_nova: &[String]) -> Option<String> {
    let distinct = |v: &[String]| {
        let mut v = v.to_vec();
        v.sort_unstable();
        v.dedup();
        v.len()
    };
    (distinct(in_cinder) > 1 || distinct(in_nova) > 1)
        .then(|| format!("volume {volume} on two servers: Cinder {in_cinder:?}, Nova {in_nova:?}"))
}

/// What a file holds now (`text`, its last line) against what was
/// acknowledged.
pub fn write_lost(what: &str, acknowledged: u64, text: &str) -> Option<String> {
    let now = last_number(text).unwrap_or(0);
    (now < acknowledged).then(|| format!("{what}: acknowledged {acknowledged}, holds {now}"))
}

/// The last number a pod's file holds (the one before it counts as
/// acknowledged: written and fsynced before the next was started).
fn last_number(text: &str) -> Option<u64> {
    text.lines().rev().find_map(|l| l.trim().parse().ok())
}

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
        for service in ["cinder", "keystone"] {
            let _ = std::process::Command::new("python3")
                .arg(crate::repo().join("tests/openstack/cloud.py"))
                .args(["outage", "start", service])
                .status();
        }
    }
}

impl Campaign {
    /// The workload, running, and the holder sampler started.
    pub async fn start(c: &Cluster) -> Result<Self> {
        let proxy_file = c.cloud_dir.join("fault-proxy");
        let admin = std::fs::read_to_string(&proxy_file)
            .map_err(|e| ClusterError::Other(format!("{}: {e}", proxy_file.display())))?
            .trim()
            .parse()
            .map_err(|e| ClusterError::Other(format!("{}: {e}", proxy_file.display())))?;
        let proxy = ProxyControl { admin };
        proxy.clear_faults().await.map_err(ClusterError::Other)?;
        let started = now_secs();
        let ns = c.namespace("campaign").await?;
        let n = ns.name.clone();
        c.apply_in(
            &n,
            &[
                writers_manifest(),
                claim("shared", "csi-manila-cephfs", "1Gi", "ReadWriteMany", false),
                sharers_manifest(),
            ]
            .join("---\n"),
        )
        .await?;
        let mut campaign = Self {
            c: c.clone(),
            ns: Some(ns),
            proxy,
            started,
            violations: Arc::default(),
            samples: Arc::default(),
            step: Arc::new(Mutex::new("setting up".into())),
            sampler: None,
        };
        campaign.converged(3 * MINUTE).await?;
        campaign.sampler = Some(campaign.sample_holders());
        Ok(campaign)
    }

    /// The campaign's namespace.
    pub fn n(&self) -> &str {
        self.ns.as_ref().map_or("", |ns| ns.name.as_str())
    }

    /// Every claim of the campaign Bound, every writer and sharer Running
    /// and ready; how long that took.
    pub async fn converged(&self, bound: Duration) -> Result<Duration> {
        let started = Instant::now();
        let n = self.n().to_string();
        self.c
            .wait_for("the campaign converged", bound, || {
                let (c, n) = (self.c.clone(), n.clone());
                async move {
                    let sts = c
                        .get("statefulset", "writer", Some(&n))
                        .await?
                        .unwrap_or_default();
                    let dep = c
                        .get("deployment", "sharer", Some(&n))
                        .await?
                        .unwrap_or_default();
                    let claims = c.list("pvc", &["-n", &n]).await?;
                    let unbound: Vec<String> = claims
                        .iter()
                        .filter(|p| p["status"]["phase"] != "Bound")
                        .map(|p| {
                            p["metadata"]["name"]
                                .as_str()
                                .unwrap_or_default()
                                .to_string()
                        })
                        .collect();
                    let ready = sts["status"]["readyReplicas"].as_u64() == Some(WRITERS as u64)
                        && sts["status"]["updatedReplicas"].as_u64() == Some(WRITERS as u64)
                        && dep["status"]["availableReplicas"].as_u64() == Some(SHARERS as u64)
                        && dep["status"]["replicas"].as_u64() == Some(SHARERS as u64);
                    Ok(if ready && unbound.is_empty() {
                        Ok(())
                    } else {
                        Err(format!(
                            "writers ready {}, sharers available {}, unbound {unbound:?}",
                            sts["status"]["readyReplicas"], dep["status"]["availableReplicas"]
                        ))
                    })
                }
            })
            .await?;
        Ok(started.elapsed())
    }

    async fn pods(&self, app: &str) -> Result<Vec<Value>> {
        self.c
            .list("pods", &["-n", self.n(), "-l", &format!("app={app}")])
            .await
    }

    /// The acknowledged numbers: each writer's (by pod), each sharer's
    /// file (by name).
    pub async fn acknowledged(&self) -> Result<Acknowledged> {
        let mut writers = HashMap::new();
        for p in self.pods("writer").await? {
            let name = p["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let out = self.c.exec(self.n(), &name, "tail -n 2 /data/seq").await?;
            writers.insert(name, last_number(&out).unwrap_or(0).saturating_sub(1));
        }
        let mut files = HashMap::new();
        if let Some(p) = self.pods("sharer").await?.first() {
            let name = p["metadata"]["name"].as_str().unwrap_or_default();
            let out = self
                .c
                .exec(
                    self.n(),
                    name,
                    "for f in /data/*; do echo \"$f $(tail -n 1 $f)\"; done",
                )
                .await?;
            for l in out.lines() {
                if let Some((f, v)) = l.split_once(' ')
                    && let Ok(v) = v.trim().parse::<u64>()
                {
                    files.insert(f.to_string(), v.saturating_sub(1));
                }
            }
        }
        Ok((writers, files))
    }

    /// What was acknowledged before is there now.
    pub async fn check_acknowledged(&self, before: &Acknowledged) -> Result<Vec<String>> {
        let mut lost = Vec::new();
        let (writers, files) = before;
        for (pod, acked) in writers {
            let out = self.c.exec(self.n(), pod, "tail -n 1 /data/seq").await?;
            lost.extend(write_lost(pod, *acked, &out));
        }
        if let Some(p) = self.pods("sharer").await?.first() {
            let name = p["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            for (file, acked) in files {
                let out = self
                    .c
                    .exec(self.n(), &name, &format!("tail -n 1 {file}"))
                    .await?;
                lost.extend(write_lost(file, *acked, &out));
            }
        }
        Ok(lost)
    }

    /// Every 2 s, in Cinder and in each node's Nova server: no single-
    /// attach volume of the campaign on two servers.
    fn sample_holders(&self) -> tokio::task::JoinHandle<()> {
        let (c, n) = (self.c.clone(), self.n().to_string());
        let (violations, samples, step) = (
            self.violations.clone(),
            self.samples.clone(),
            self.step.clone(),
        );
        tokio::spawn(async move {
            let (Ok(cinder), Ok(nova)) = (c.cinder(), c.nova()) else {
                return;
            };
            let servers: Vec<String> = match c.nodes().await {
                Ok(nodes) => nodes
                    .iter()
                    .filter_map(|node| c.server_of(node).ok())
                    .collect(),
                Err(_) => return,
            };
            loop {
                tokio::time::sleep(Duration::from_secs(2)).await;
                let Ok(claims) = c.list("pvc", &["-n", &n]).await else {
                    continue;
                };
                let volumes: Vec<String> = claims
                    .iter()
                    .filter(|p| p["spec"]["accessModes"][0] == "ReadWriteOnce")
                    .filter_map(|p| p["spec"]["volumeName"].as_str().map(str::to_string))
                    .collect();
                let mut by_nova: HashMap<String, Vec<String>> = HashMap::new();
                for s in &servers {
                    if let Ok(atts) = nova.list_volume_attachments(s).await {
                        for a in atts {
                            by_nova.entry(a.volume_id).or_default().push(s.clone());
                        }
                    }
                }
                for pv in volumes {
                    let Ok(Some(pv)) = c.get("pv", &pv, None).await else {
                        continue;
                    };
                    let Some(id) = pv["spec"]["csi"]["volumeHandle"].as_str() else {
                        continue;
                    };
                    let Ok(v) = cinder.get_volume(id).await else {
                        continue;
                    };
                    if v.multiattach {
                        continue;
                    }
                    let in_cinder: Vec<String> = v.attached_servers().map(str::to_string).collect();
                    let in_nova = by_nova.get(id).cloned().unwrap_or_default();
                    if let Some(why) = two_writers(id, &in_cinder, &in_nova) {
                        let at = step.lock().map(|s| s.clone()).unwrap_or_default();
                        if let Ok(mut v) = violations.lock() {
                            v.push(format!(
                                "{:?} during {at}: {why}",
                                Invariant::NeverTwoWriters
                            ));
                        }
                    }
                    if let Ok(mut s) = samples.lock() {
                        *s += 1;
                    }
                }
            }
        })
    }

    /// The controllers' orphan reports, for what the campaign made.
    pub async fn orphans(&self) -> Result<Vec<String>> {
        let mut found = Vec::new();
        for (deployment, container, command) in [
            (
                "csi-cinder-controllerplugin",
                "cinder-csi-plugin",
                "cinder-csi-plugin orphans --cloud-config=/etc/config/cloud.conf --cluster=kubernetes",
            ),
            (
                "csi-manila-cephfs-controllerplugin",
                "manila-csi-plugin",
                "manila-csi-plugin orphans --cloud-config=/etc/config/cloud.conf --cluster-id=kubernetes --drivername=cephfs.manila.csi.openstack.org --share-protocol-selector=CEPHFS",
            ),
        ] {
            let out = self
                .c
                .kubectl(&[
                    "exec",
                    "-n",
                    SUITE_NAMESPACE,
                    &format!("deploy/{deployment}"),
                    "-c",
                    container,
                    "--",
                    "sh",
                    "-c",
                    &format!("{command} --older-than=0s --output=json"),
                ])
                .await?;
            let report: Value = serde_json::from_str(&out)
                .map_err(|e| ClusterError::Other(format!("{deployment} orphans: {e}: {out}")))?;
            for o in report["report"]["orphans"]
                .as_array()
                .cloned()
                .unwrap_or_default()
            {
                if o["created"].as_u64().unwrap_or(0) >= self.started {
                    found.push(format!("{} {} {}", o["kind"], o["id"], o["name"]));
                }
            }
        }
        Ok(found)
    }

    async fn cloud_calls(&self) -> usize {
        self.proxy
            .calls()
            .await
            .map(|calls| {
                calls
                    .iter()
                    .filter(|c| c.path.starts_with("/volume/") || c.path.starts_with("/compute/"))
                    .count()
            })
            .unwrap_or(0)
    }

    async fn proxy_rule(&self, rule: FaultRule) -> Result<()> {
        self.proxy
            .add_fault(&rule)
            .await
            .map_err(ClusterError::Other)
    }

    /// Starts a fault; what ends it when its window is over.
    async fn inject(&self, class: FaultClass) -> Result<()> {
        let busy = FaultAction::Status {
            status: 409,
            message: Some(
                "Cannot 'attach_volume' instance while it is in task_state rebooting".into(),
            ),
            retry_after: None,
            hint: RetryHint::None,
        };
        match class {
            FaultClass::CloudThrottled => {
                for service in ["/volume/", "/compute/"] {
                    self.proxy_rule(FaultRule::new(
                        None,
                        service,
                        FaultAction::Throttle {
                            per_second: 3.0,
                            burst: 3,
                            hint: RetryHint::XRateLimitRetryAfter,
                        },
                    ))
                    .await?;
                }
            }
            FaultClass::NovaBusy => {
                self.proxy_rule(
                    FaultRule::new(Some("POST"), "/os-volume_attachments", busy).probability(0.5),
                )
                .await?
            }
            FaultClass::AnswersLost => {
                for (method, path) in [
                    ("POST", "/volume/"),
                    ("POST", "/os-volume_attachments"),
                    ("DELETE", "/os-volume_attachments/"),
                ] {
                    self.proxy_rule(
                        FaultRule::new(Some(method), path, FaultAction::LoseAnswer).times(1),
                    )
                    .await?;
                }
            }
            FaultClass::CloudSlow => {
                for service in ["/volume/", "/compute/"] {
                    self.proxy_rule(
                        FaultRule::new(None, service, FaultAction::Delay { millis: 1500 })
                            .probability(0.5),
                    )
                    .await?;
                }
            }
            FaultClass::CinderOutage => self.outage("stop", "cinder").await?,
            FaultClass::KeystoneOutage => self.outage("stop", "keystone").await?,
            FaultClass::ControllerKilled => {
                self.c
                    .kubectl(&[
                        "delete",
                        "pod",
                        "-n",
                        SUITE_NAMESPACE,
                        "-l",
                        "app=csi-cinder-controllerplugin",
                        "--grace-period=0",
                        "--force",
                        "--wait=false",
                    ])
                    .await?;
            }
            FaultClass::NodePluginRestarted => {
                let node = self
                    .pods("writer")
                    .await?
                    .first()
                    .and_then(|p| p["spec"]["nodeName"].as_str().map(str::to_string))
                    .unwrap_or_else(|| self.c.node.clone());
                self.c
                    .kubectl(&[
                        "delete",
                        "pod",
                        "-n",
                        SUITE_NAMESPACE,
                        "-l",
                        "app=csi-cinder-nodeplugin",
                        "--field-selector",
                        &format!("spec.nodeName={node}"),
                        "--wait=false",
                    ])
                    .await?;
            }
            FaultClass::KubeletRestarted => {
                self.c.cluster_py(&["restart-kubelet"]).await?;
            }
        }
        Ok(())
    }

    async fn end(&self, class: FaultClass) -> Result<()> {
        match class {
            FaultClass::CinderOutage => self.outage("start", "cinder").await,
            FaultClass::KeystoneOutage => self.outage("start", "keystone").await,
            _ => Ok(()),
        }
    }

    async fn outage(&self, action: &str, service: &str) -> Result<()> {
        let out = tokio::process::Command::new("python3")
            .arg(crate::repo().join("tests/openstack/cloud.py"))
            .args(["outage", action, service])
            .output()
            .await
            .map_err(|e| ClusterError::Other(format!("cloud.py outage: {e}")))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(ClusterError::Other(format!(
                "cloud.py outage {action} {service}: {}",
                String::from_utf8_lossy(&out.stderr)
            )))
        }
    }

    /// Runs an operation to its end (each sidecar retries what the faults
    /// refuse; the bound is generous).
    async fn operate(&self, op: Operation, step: usize, rng_pick: usize) -> Result<()> {
        let n = self.n().to_string();
        let c = &self.c;
        match op {
            Operation::MoveWriter => {
                // to another node of its zone (its volume attaches there
                // only), which means a detach and an attach; a writer
                // alone in its zone restarts where it is
                let pod = format!("writer-{}", rng_pick % WRITERS);
                let p = c.get("pod", &pod, Some(&n)).await?.unwrap_or_default();
                let (from, uid) = (
                    p["spec"]["nodeName"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                    p["metadata"]["uid"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                );
                let zones = c.node_zones().await?;
                let zone = zones.get(&from).cloned().unwrap_or_default();
                let to = zones
                    .iter()
                    .find(|(node, z)| **z == zone && **node != from)
                    .map(|(node, _)| node.clone());
                let _cordoned = match &to {
                    Some(_) => Some(c.cordon(&from).await?),
                    None => None,
                };
                c.kubectl(&["delete", "pod", "-n", &n, &pod, "--wait=false"])
                    .await?;
                if let Some(to) = to {
                    c.wait_running_on(&n, &pod, &to, &uid).await?;
                }
            }
            Operation::ProvisionScratch => {
                let name = format!("scratch-{step}");
                c.apply_in(
                    &n,
                    &[
                        claim(&name, "csi-cinder-sc-delete", "1Gi", "ReadWriteOnce", false),
                        crate::placed_on(
                            &pod(
                                &name,
                                &name,
                                "echo ok > /data/ok && exec sleep 3600",
                                PodOptions::default(),
                            ),
                            &[&c.node],
                        ),
                    ]
                    .join("---\n"),
                )
                .await?;
                c.wait_running(&n, &name, 5 * MINUTE).await?;
                c.kubectl(&["delete", "pod", "-n", &n, &name, "--grace-period=1"])
                    .await?;
                c.kubectl(&["delete", "pvc", "-n", &n, &name, "--wait=false"])
                    .await?;
            }
            Operation::SnapshotAndRestore => {
                let snap = format!("snap-{step}");
                let source = format!("data-writer-{}", rng_pick % WRITERS);
                c.apply_in(
                    &n,
                    &format!(
                        "apiVersion: snapshot.storage.k8s.io/v1\nkind: VolumeSnapshot\nmetadata:\n  name: {snap}\nspec:\n  volumeSnapshotClassName: csi-cinder-snapclass\n  source:\n    persistentVolumeClaimName: {source}\n"
                    ),
                )
                .await?;
                c.wait_snapshot_ready(&n, &snap, 5 * MINUTE).await?;
                // at least the snapshot's size (its claim may have grown)
                let size = c
                    .get("volumesnapshot", &snap, Some(&n))
                    .await?
                    .unwrap_or_default()["status"]["restoreSize"]
                    .as_str()
                    .unwrap_or("1Gi")
                    .to_string();
                let restored = format!("restored-{step}");
                c.apply_in(
                    &n,
                    &format!(
                        "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata:\n  name: {restored}\nspec:\n  accessModes: [ReadWriteOnce]\n  storageClassName: csi-cinder-sc-xfs\n  dataSource:\n    name: {snap}\n    kind: VolumeSnapshot\n    apiGroup: snapshot.storage.k8s.io\n  resources:\n    requests:\n      storage: {size}\n---\n{}",
                        crate::placed_on(
                            &pod(
                                &restored,
                                &restored,
                                "test -s /data/seq && echo RESTORED",
                                PodOptions {
                                    run_once: true,
                                    ..Default::default()
                                },
                            ),
                            &[&c.node],
                        )
                    ),
                )
                .await?;
                c.wait_succeeded(&n, &restored, 5 * MINUTE).await?;
                for (kind, name) in [
                    ("pod", &restored),
                    ("pvc", &restored),
                    ("volumesnapshot", &snap),
                ] {
                    c.kubectl(&["delete", kind, "-n", &n, name, "--wait=false"])
                        .await?;
                }
            }
            Operation::ExpandWriter => {
                let claim = format!("data-writer-{}", rng_pick % WRITERS);
                let now = c.get("pvc", &claim, Some(&n)).await?.unwrap_or_default();
                let gib = now["spec"]["resources"]["requests"]["storage"]
                    .as_str()
                    .and_then(|s| s.trim_end_matches("Gi").parse::<u64>().ok())
                    .unwrap_or(1);
                let want = format!("{}Gi", gib + 1);
                c.kubectl(&[
                    "patch",
                    "pvc",
                    "-n",
                    &n,
                    &claim,
                    "--type=merge",
                    "-p",
                    &format!(
                        "{{\"spec\":{{\"resources\":{{\"requests\":{{\"storage\":\"{want}\"}}}}}}}}"
                    ),
                ])
                .await?;
                c.wait_for(&format!("{claim} grown to {want}"), 5 * MINUTE, || {
                    let (c, n, claim, want) = (c.clone(), n.clone(), claim.clone(), want.clone());
                    async move {
                        let p = c.get("pvc", &claim, Some(&n)).await?.unwrap_or_default();
                        Ok(if p["status"]["capacity"]["storage"] == want.as_str() {
                            Ok(())
                        } else {
                            Err(p["status"].to_string())
                        })
                    }
                })
                .await?;
            }
        }
        Ok(())
    }

    /// Runs the plan; the report, violations included (the caller fails
    /// on them).
    pub async fn run(&mut self, plan: &Plan) -> Result<Report> {
        let mut rng = Rng::new(plan.seed);
        let mut report = Report::default();
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
            let op = Operation::ALL[rng.below(Operation::ALL.len())];
            let pick = rng.below(WRITERS);
            let label = format!("step {step} ({faults:?} during {op:?}, seed {})", plan.seed);
            if let Ok(mut s) = self.step.lock() {
                *s = label.clone();
            }
            let before = self.acknowledged().await?;
            self.proxy
                .clear_calls()
                .await
                .map_err(ClusterError::Other)?;
            for f in &faults {
                self.inject(*f).await?;
            }
            let operation = self.operate(op, step, pick);
            let window = tokio::time::sleep(plan.window);
            tokio::pin!(operation);
            tokio::pin!(window);
            let mut op_result = None;
            tokio::select! {
                r = &mut operation => { op_result = Some(r); window.await; }
                _ = &mut window => {}
            }
            self.proxy
                .clear_faults()
                .await
                .map_err(ClusterError::Other)?;
            for f in &faults {
                self.end(*f).await?;
            }
            // from here, the cloud and the cluster are whole again: how long
            // until the operation is done and everything converged
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
            let converged_in = match self.converged(plan.converge_bound).await {
                Ok(_) => faults_ended.elapsed(),
                Err(e) => {
                    report
                        .violations
                        .push(format!("{:?} at {label}: {e}", Invariant::Converges));
                    plan.converge_bound
                }
            };
            for lost in self.check_acknowledged(&before).await? {
                report.violations.push(format!(
                    "{:?} at {label}: {lost}",
                    Invariant::NoAcknowledgedWriteLost
                ));
            }
            let cloud_calls = self.cloud_calls().await;
            // no tight loops: a step's operation and its convergence cost
            // a few dozen calls, not thousands
            if cloud_calls > 2000 {
                report.violations.push(format!(
                    "{:?} at {label}: {cloud_calls} Cinder and Nova calls",
                    Invariant::BoundedPressure
                ));
            }
            // progress, while a long campaign runs
            eprintln!(
                "{label}: converged {:.1} s after the faults ended; {cloud_calls} Cinder and Nova calls",
                converged_in.as_secs_f64()
            );
            report.steps.push(StepRecord {
                faults,
                operation: op,
                converged_in,
                cloud_calls,
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

    #[test]
    fn the_acknowledged_number_is_the_one_before_the_last() {
        assert_eq!(last_number("1\n2\n3\n"), Some(3));
        assert_eq!(last_number("1\n2\n3"), Some(3));
        assert_eq!(last_number(""), None);
        assert_eq!(write_lost("w", 3, "1\n2\n3\n"), None);
        assert_eq!(write_lost("w", 3, "4\n"), None);
        assert!(
            write_lost("w", 3, "1\n2\n").is_some(),
            "a lost write is seen"
        );
        assert!(
            write_lost("w", 3, "").is_some(),
            "an empty file lost them all"
        );
    }

    #[test]
    fn two_servers_holding_one_volume_are_seen_in_either_service() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert_eq!(two_writers("v", &s(&["a"]), &s(&["a"])), None);
        assert_eq!(
            two_writers("v", &s(&["a", "a"]), &s(&[])),
            None,
            "one server twice is one"
        );
        assert!(two_writers("v", &s(&["a", "b"]), &s(&["a"])).is_some());
        assert!(two_writers("v", &s(&["a"]), &s(&["a", "b"])).is_some());
    }
}
