//! At scale, printed and never asserted (issue 38).
//!
//! 1. **Provisioning burst**: N Cinder claims at once (Immediate binding),
//!    then deleted: the time until 50/90/99/100 % are Bound and until every
//!    volume is gone from Cinder; against the same N volumes made at once
//!    and deleted straight through Cinder (a small client here, polling as
//!    the driver does): the ratio of our time to OpenStack's own, and the
//!    Cinder calls per claim (counted at the fault proxy, which the
//!    controllers' catalog points at). Where the time went: when each PV
//!    was made, how long our CreateVolume took on average (the
//!    controller's metrics), and how often the provisioner waited on its
//!    own API rate limit (its log). The same for N CephFS claims against
//!    shares made straight through Manila with a cephx rule each.
//!
//! 2. **Attach wave**: a StatefulSet (`podManagementPolicy: Parallel`)
//!    with one Cinder claim per replica, as many replicas as the nodes'
//!    attach limits allow (their CSINodes' counts), then scaled to zero:
//!    the time until 50/90/99/100 % of its pods run, and after the scale
//!    down until 50/10/1/0 % of its VolumeAttachments remain; against the
//!    same volumes made and attached straight through Cinder and Nova at
//!    once (each to the server of a node with room), then detached. Each
//!    pod's time split between Kubernetes (scheduler, attach-detach
//!    controller, kubelet) and the attach itself (external attacher, our
//!    ControllerPublish, Nova), from when each VolumeAttachment appeared,
//!    was attached, was asked to go and went.
//!
//! 3. **Churn**: three overlapping waves of short-lived Jobs, each pod with
//!    a claim of its own (a generic ephemeral volume, deleted with it): the
//!    time until every Job is done and every volume gone; nothing of the
//!    cluster's is left in Cinder, and the controller's resident memory
//!    against its baseline.
//! 4. **Snapshots and expansion at rate**: snapshots of M volumes taken at
//!    once (time until 50/90/99/100 % are ready), and M claims expanded at
//!    5 a second (until each PV has its new size).
//!
//! Needs the cluster tier up (`tests/cluster/cluster.py up`): `cargo bench
//! -p cluster-tests --bench scale`; `SCALE_N=30,100,300` and
//! `SCALE_SHARES_N=30,100` (the defaults), `SCALE_PARTS` a choice of
//! cinder, cephfs, wave, churn, snapshots (all by default).
//! `BENCH_QUICK=1`: N = 3 (2 shares), each part through once.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use cluster_tests::{Cluster, bench_cluster, bench_quick, claim};
use openstack_client::cinder::{BlockStorage, CreateVolume};
use openstack_client::manila::{
    AccessRuleState, CreateShare, GrantAccess, ShareStatus, SharedFileSystems,
};

/// A class of the bench's own: Immediate binding (deploy/'s wait for
/// their first consumer), deleting its volumes with its claims.
const CLASS: &str = "scale-cinder-immediate";
/// How often both sides look at what they wait for.
const POLL: Duration = Duration::from_millis(250);
const TIMEOUT: Duration = Duration::from_secs(30 * 60);

fn sizes() -> Vec<usize> {
    if bench_quick() {
        return vec![3];
    }
    std::env::var("SCALE_N")
        .ok()
        .map(|s| s.split(',').filter_map(|n| n.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![30, 100, 300])
}

/// The Cinder controller's metrics port (on the host network here).
const CINDER_CONTROLLER_METRICS: u16 = 9828;

/// A Go duration as client-go logs it (`850ms`, `1.5s`, `2m3.4s`).
fn go_duration(text: &str) -> Option<Duration> {
    let mut total = 0.0;
    let mut number = String::new();
    let mut chars = text.chars().peekable();
    while let Some(ch) = chars.next() {
        if ch.is_ascii_digit() || ch == '.' {
            number.push(ch);
            continue;
        }
        let value: f64 = number.parse().ok()?;
        number.clear();
        let unit = match (ch, chars.peek()) {
            ('m', Some('s')) => {
                chars.next();
                0.001
            }
            ('u' | 'µ', Some('s')) => {
                chars.next();
                0.000_001
            }
            ('h', _) => 3600.0,
            ('m', _) => 60.0,
            ('s', _) => 1.0,
            _ => return None,
        };
        total += value * unit;
    }
    number.is_empty().then(|| Duration::from_secs_f64(total))
}

/// What a controller's sidecar logged about its own client-side rate
/// limit (its --kube-api-qps and --kube-api-burst) since `since`: client-go
/// logs a wait over 1 s at -v=2, at most once a second. The number of such
/// lines and the longest wait.
async fn throttled(c: &Cluster, app: &str, container: &str, since: Instant) -> (usize, Duration) {
    let window = format!("--since={}s", since.elapsed().as_secs() + 5);
    let selector = format!("app={app}");
    let logs = c
        .kubectl(&[
            "-n",
            cluster_tests::SUITE_NAMESPACE,
            "logs",
            "-l",
            &selector,
            "-c",
            container,
            &window,
            "--tail=-1",
        ])
        .await
        .unwrap_or_default();
    let waits: Vec<Duration> = logs
        .lines()
        .filter(|l| l.contains("client-side throttling"))
        .filter_map(|l| {
            let rest = &l[l.find("delay=")? + "delay=".len()..];
            let value = rest.trim_start_matches('"');
            let end = value.find(['"', ' ']).unwrap_or(value.len());
            go_duration(&value[..end])
        })
        .collect();
    (waits.len(), waits.iter().max().copied().unwrap_or_default())
}

/// How many of a CSI Controller RPC a controller answered so far, and the
/// seconds it spent in them (summed over every answer, whatever its
/// code), from its gRPC metrics on the host network.
async fn controller_rpc_totals(port: u16, method: &str) -> (f64, f64) {
    let out = tokio::process::Command::new("curl")
        .args([
            "-sS",
            "--max-time",
            "5",
            &format!("http://127.0.0.1:{port}/metrics"),
        ])
        .output()
        .await;
    let text = out
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let value = |series: &str| {
        let key = format!("{series}{{method=\"/csi.v1.Controller/{method}\"}}");
        text.lines()
            .find(|l| l.starts_with(&key))
            .and_then(|l| l.split_whitespace().last()?.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (
        value("grpc_server_handling_seconds_count"),
        value("grpc_server_handling_seconds_sum"),
    )
}

/// The calls of a controller RPC answered since `before`, and their mean time.
async fn rpc_since(method: &str, before: (f64, f64)) -> (f64, f64) {
    let (count, seconds) = controller_rpc_totals(CINDER_CONTROLLER_METRICS, method).await;
    let calls = count - before.0;
    (calls, (seconds - before.1) / calls.max(1.0))
}

fn mean(times: &[Duration]) -> f64 {
    times.iter().map(Duration::as_secs_f64).sum::<f64>() / times.len().max(1) as f64
}

/// 50, 90, 99 and 100 % of `times`, sorted.
fn quantiles(times: &[Duration]) -> [Duration; 4] {
    let mut v = times.to_vec();
    v.sort();
    let at = |p: f64| v[((v.len() as f64 * p).ceil() as usize).clamp(1, v.len()) - 1];
    [at(0.5), at(0.9), at(0.99), at(1.0)]
}

fn secs(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64())
}

/// Four marks (50/90/99/100 %, or 50/10/1/0 % left) as `a / b / c / d`.
fn marks(d: &[Duration; 4]) -> String {
    d.iter().map(|x| secs(*x)).collect::<Vec<_>>().join(" / ")
}

/// Ours against OpenStack's own, at 100 %.
fn ratio(ours: &[Duration; 4], theirs: &[Duration; 4]) -> f64 {
    ours[3].as_secs_f64() / theirs[3].as_secs_f64().max(0.001)
}

/// What one burst took: each claim (or volume) until it was ready, and the
/// time until every volume was gone again.
struct Burst {
    ready: Vec<Duration>,
    gone: Duration,
    /// Through Kubernetes: when each PV was first seen (the provisioner
    /// made it once CreateVolume answered).
    made: Vec<Duration>,
}

/// What the apiserver reports of `kind` (in `ns`; cluster-scoped kinds
/// ignore it), each change as it comes with the time since `started`: one
/// long-lived `kubectl get --watch` per kind. Polling with a kubectl
/// process four times a second per kind took a large share of this
/// machine's two cores away from the cluster it measured, while the
/// direct client's polls cost next to nothing.
struct Watch {
    events: tokio::sync::mpsc::UnboundedReceiver<Change>,
    child: std::process::Child,
}

/// One change of a watched object.
struct Change {
    at: Duration,
    deleted: bool,
    object: serde_json::Value,
}

impl Watch {
    fn start(c: &Cluster, kind: &str, ns: &str, started: Instant) -> Self {
        let mut child = std::process::Command::new("kubectl")
            .arg(format!("--kubeconfig={}", c.kubeconfig.display()))
            .args([
                "get",
                kind,
                "-n",
                ns,
                "--watch",
                "--output-watch-events",
                "-o",
                "json",
            ])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, events) = tokio::sync::mpsc::unbounded_channel();
        // kubectl writes one JSON event after another
        std::thread::spawn(move || {
            for event in serde_json::Deserializer::from_reader(std::io::BufReader::new(stdout))
                .into_iter::<serde_json::Value>()
                .map_while(Result::ok)
            {
                let change = Change {
                    at: started.elapsed(),
                    deleted: event["type"] == "DELETED",
                    object: event["object"].clone(),
                };
                if tx.send(change).is_err() {
                    break;
                }
            }
        });
        Self { events, child }
    }

    /// The next change, or None once `deadline` passed.
    async fn next(&mut self, deadline: Instant) -> Option<Change> {
        let left = deadline.saturating_duration_since(Instant::now());
        tokio::time::timeout(left, self.events.recv())
            .await
            .ok()
            .flatten()
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn name_of(o: &serde_json::Value) -> String {
    o["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// The time since `started` at which each of `n` objects of `kind` in
/// `ns` was first seen `ready`, by name (as the apiserver reported it).
async fn ready_times(
    c: &Cluster,
    kind: &str,
    ns: &str,
    n: usize,
    started: Instant,
    ready: impl Fn(&serde_json::Value) -> bool,
) -> BTreeMap<String, Duration> {
    let mut watch = Watch::start(c, kind, ns, started);
    let deadline = started + TIMEOUT;
    let mut seen: BTreeMap<String, Duration> = BTreeMap::new();
    while seen.len() < n {
        let Some(change) = watch.next(deadline).await else {
            panic!("{} of {n} {kind} ready", seen.len());
        };
        if !change.deleted && ready(&change.object) {
            seen.entry(name_of(&change.object)).or_insert(change.at);
        }
    }
    seen
}

/// N claims at once through Kubernetes, then deleted.
async fn through_kubernetes(c: &Cluster, cinder: &BlockStorage, n: usize) -> Burst {
    let ns = c.namespace(&format!("scale-{n}")).await.unwrap();
    let name = ns.name.clone();
    let claims: Vec<String> = (0..n)
        .map(|i| claim(&format!("c{i}"), CLASS, "1Gi", "ReadWriteOnce", false))
        .collect();
    let started = Instant::now();
    c.apply_in(&name, &claims.join("---\n")).await.unwrap();
    let ours = name.clone();
    let (bound, made) = tokio::join!(
        ready_times(c, "pvc", &name, n, started, |p| {
            p["status"]["phase"] == "Bound"
        }),
        ready_times(c, "pv", &name, n, started, move |pv| {
            pv["spec"]["claimRef"]["namespace"] == ours.as_str()
        })
    );
    // the volumes behind the claims, then the claims deleted
    let mut handles = Vec::new();
    for pv in c.list("pv", &[]).await.unwrap() {
        if pv["spec"]["claimRef"]["namespace"] == name.as_str() {
            handles.push(
                pv["spec"]["csi"]["volumeHandle"]
                    .as_str()
                    .unwrap()
                    .to_string(),
            );
        }
    }
    assert_eq!(handles.len(), n, "one volume per claim");
    let deleting = Instant::now();
    c.kubectl(&["-n", &name, "delete", "pvc", "--all", "--wait=false"])
        .await
        .unwrap();
    until_gone(cinder, handles).await;
    let gone = deleting.elapsed();
    ns.close().await.unwrap();
    Burst {
        ready: bound.into_values().collect(),
        gone,
        made: made.into_values().collect(),
    }
}

/// The same N volumes straight through Cinder, at once: each made and
/// watched until `available`, then all deleted and watched until gone.
async fn through_cinder(cinder: &BlockStorage, n: usize) -> Burst {
    let started = Instant::now();
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let cinder = cinder.clone();
            tokio::spawn(async move {
                let v = cinder
                    .create_volume(&CreateVolume {
                        name: format!("scale-direct-{i}"),
                        size_gib: 1,
                        ..Default::default()
                    })
                    .await
                    .unwrap();
                loop {
                    let now = cinder.get_volume(&v.id).await.unwrap();
                    match now.status.as_str() {
                        "available" => return (v.id, started.elapsed()),
                        "error" => panic!("Cinder put {} in error", v.id),
                        _ => tokio::time::sleep(POLL).await,
                    }
                }
            })
        })
        .collect();
    let mut ready = Vec::new();
    let mut ids = Vec::new();
    for t in tasks {
        let (id, took) = t.await.unwrap();
        ids.push(id);
        ready.push(took);
    }
    let deleting = Instant::now();
    let deletes: Vec<_> = ids
        .iter()
        .map(|id| {
            let (cinder, id) = (cinder.clone(), id.clone());
            tokio::spawn(async move { cinder.delete_volume(&id).await.unwrap() })
        })
        .collect();
    for d in deletes {
        d.await.unwrap();
    }
    until_gone(cinder, ids).await;
    Burst {
        ready,
        gone: deleting.elapsed(),
        made: Vec::new(),
    }
}

/// Waits until none of `ids` is in Cinder any more.
async fn until_gone(cinder: &BlockStorage, mut ids: Vec<String>) {
    let started = Instant::now();
    while !ids.is_empty() {
        assert!(
            started.elapsed() < TIMEOUT,
            "{} volumes still there",
            ids.len()
        );
        let mut left = Vec::new();
        for id in ids {
            match cinder.get_volume(&id).await {
                Err(e) if e.is_not_found() => {}
                _ => left.push(id),
            }
        }
        ids = left;
        if !ids.is_empty() {
            tokio::time::sleep(POLL).await;
        }
    }
}

/// The CephFS class of deploy/manila/classes (Immediate binding).
const CEPHFS_CLASS: &str = "csi-manila-cephfs";

/// N CephFS claims at once through Kubernetes, then deleted: until each
/// is Bound (its share available and its cephx rule active), and until
/// every share is gone from Manila.
async fn shares_through_kubernetes(c: &Cluster, manila: &SharedFileSystems, n: usize) -> Burst {
    let ns = c.namespace(&format!("scale-cephfs-{n}")).await.unwrap();
    let name = ns.name.clone();
    let claims: Vec<String> = (0..n)
        .map(|i| {
            claim(
                &format!("s{i}"),
                CEPHFS_CLASS,
                "1Gi",
                "ReadWriteMany",
                false,
            )
        })
        .collect();
    let started = Instant::now();
    c.apply_in(&name, &claims.join("---\n")).await.unwrap();
    let bound = ready_times(c, "pvc", &name, n, started, |p| {
        p["status"]["phase"] == "Bound"
    })
    .await;
    let handles: Vec<String> = c
        .list("pv", &[])
        .await
        .unwrap()
        .iter()
        .filter(|pv| pv["spec"]["claimRef"]["namespace"] == name.as_str())
        .filter_map(|pv| {
            pv["spec"]["csi"]["volumeHandle"]
                .as_str()
                .map(str::to_string)
        })
        .collect();
    assert_eq!(handles.len(), n, "one share per claim");
    let deleting = Instant::now();
    c.kubectl(&["-n", &name, "delete", "pvc", "--all", "--wait=false"])
        .await
        .unwrap();
    until_shares_gone(manila, handles).await;
    let gone = deleting.elapsed();
    ns.close().await.unwrap();
    Burst {
        ready: bound.into_values().collect(),
        gone,
        made: Vec::new(),
    }
}

/// The same N CephFS shares straight through Manila, at once: each made,
/// given a cephx rule once `available`, watched until the rule is
/// `active` (what the driver waits for); then all deleted.
async fn shares_through_manila(manila: &SharedFileSystems, n: usize) -> (Burst, usize) {
    // what a run stopped on the way left under these names
    let mut leftovers = Vec::new();
    for i in 0..n {
        for share in manila
            .list_shares_named(&format!("scale-direct-share-{i}"))
            .await
            .unwrap()
        {
            manila.delete_share(&share.id).await.unwrap();
            leftovers.push(share.id);
        }
    }
    until_shares_gone(manila, leftovers).await;
    let failed = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let started = Instant::now();
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let manila = manila.clone();
            let failed = failed.clone();
            tokio::spawn(async move {
                // a share Manila puts in error is deleted and made again,
                // as the driver does
                let share = loop {
                    let share = manila
                        .create_share(&CreateShare {
                            protocol: "CEPHFS".into(),
                            size_gib: 1,
                            name: format!("scale-direct-share-{i}"),
                            share_type: Some("cephfs".into()),
                            ..Default::default()
                        })
                        .await
                        .unwrap();
                    let status = loop {
                        let now = manila.get_share(&share.id).await.unwrap();
                        if now.status == ShareStatus::Available || now.status.is_error() {
                            break now.status;
                        }
                        tokio::time::sleep(POLL).await;
                    };
                    if status == ShareStatus::Available {
                        break share;
                    }
                    failed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    manila.delete_share(&share.id).await.unwrap();
                    until_shares_gone(&manila, vec![share.id]).await;
                };
                let grant = GrantAccess {
                    access_type: "cephx".into(),
                    access_to: format!("scale-direct-{i}"),
                    access_level: "rw".into(),
                };
                manila.grant_access(&share.id, &grant).await.unwrap();
                loop {
                    let rules = manila.list_access_rules(&share.id).await.unwrap();
                    if rules.iter().any(|r| r.state == AccessRuleState::Active) {
                        return (share.id, started.elapsed());
                    }
                    assert!(
                        !rules.iter().any(|r| r.state == AccessRuleState::Error),
                        "the rule of {} went to error",
                        share.id
                    );
                    tokio::time::sleep(POLL).await;
                }
            })
        })
        .collect();
    let mut ready = Vec::new();
    let mut ids = Vec::new();
    for t in tasks {
        let (id, took) = t.await.unwrap();
        ids.push(id);
        ready.push(took);
    }
    let deleting = Instant::now();
    for id in &ids {
        manila.delete_share(id).await.unwrap();
    }
    until_shares_gone(manila, ids).await;
    let burst = Burst {
        ready,
        gone: deleting.elapsed(),
        made: Vec::new(),
    };
    (burst, failed.load(std::sync::atomic::Ordering::Relaxed))
}

/// Waits until none of `ids` is in Manila any more.
async fn until_shares_gone(manila: &SharedFileSystems, mut ids: Vec<String>) {
    let started = Instant::now();
    while !ids.is_empty() {
        assert!(
            started.elapsed() < TIMEOUT,
            "{} shares still there",
            ids.len()
        );
        let mut left = Vec::new();
        for id in ids {
            match manila.get_share(&id).await {
                Err(e) if e.is_not_found() => {}
                _ => left.push(id),
            }
        }
        ids = left;
        if !ids.is_empty() {
            tokio::time::sleep(POLL).await;
        }
    }
}

/// Whether `part` is to run: `SCALE_PARTS` (a comma-separated choice of
/// cinder, cephfs, wave, churn, snapshots), every part without it.
fn part(name: &str) -> bool {
    std::env::var("SCALE_PARTS")
        .map(|parts| parts.split(',').any(|p| p.trim() == name))
        .unwrap_or(true)
}

fn share_sizes() -> Vec<usize> {
    if bench_quick() {
        return vec![2];
    }
    std::env::var("SCALE_SHARES_N")
        .ok()
        .map(|s| s.split(',').filter_map(|n| n.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![30, 100])
}

/// The Cinder volumes each node still takes (its CSINode's count).
async fn room(c: &Cluster) -> Vec<(String, usize)> {
    let mut rooms = Vec::new();
    for node in c.nodes().await.unwrap() {
        let n = c.get("csinode", &node, None).await.unwrap().unwrap();
        let count = n["spec"]["drivers"]
            .as_array()
            .and_then(|d| d.iter().find(|d| d["name"] == "cinder.csi.openstack.org"))
            .and_then(|d| d["allocatable"]["count"].as_u64())
            .unwrap_or(0) as usize;
        rooms.push((node, count));
    }
    rooms
}

/// What an attach wave took: each pod (or volume) until it ran (or was
/// attached), and after the scale down the time until 50/10/1/0 % of the
/// attachments remained.
struct Wave {
    running: Vec<Duration>,
    detached: [Duration; 4],
}

/// Straight through Cinder and Nova: each volume's attach alone, from
/// Nova's attach call until Cinder said `in-use`.
struct DirectAttaches(Vec<Duration>);

/// Until `remaining()` falls to 50, 10, 1 and 0 % of `n`.
async fn draining<F, Fut>(n: usize, remaining: F) -> [Duration; 4]
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = usize>,
{
    let started = Instant::now();
    let marks = [0.5, 0.1, 0.01, 0.0];
    let mut at = [Duration::ZERO; 4];
    let mut next = 0;
    while next < marks.len() {
        assert!(
            started.elapsed() < TIMEOUT,
            "still attached: {}",
            remaining().await
        );
        let left = remaining().await;
        while next < marks.len() && left as f64 <= n as f64 * marks[next] {
            at[next] = started.elapsed();
            next += 1;
        }
        tokio::time::sleep(POLL).await;
    }
    at
}

/// Where each pod of an attach wave spent its time, from the changes the
/// apiserver reported (a watch of each kind): until its VolumeAttachment existed
/// (the scheduler and the attach-detach controller: Kubernetes), until
/// that was attached (the external attacher, our ControllerPublish and
/// Nova), until the pod ran (kubelet: our NodeStage and NodePublish, the
/// container's start). After the scale down: until each attachment was
/// asked to go (kubelet's unmount and NodeUnstage, the node's status, the
/// attach-detach controller), until it was gone (the external attacher,
/// our ControllerUnpublish and Nova).
#[derive(Default)]
struct Timeline {
    attachment_made: Vec<Duration>,
    attached: Vec<Duration>,
    running: Vec<Duration>,
    detach_asked: Vec<Duration>,
    detached: Vec<Duration>,
}

fn segment(from: &[Duration], to: &[Duration]) -> Vec<Duration> {
    from.iter()
        .zip(to)
        .map(|(a, b)| b.saturating_sub(*a))
        .collect()
}

async fn wave_through_kubernetes(c: &Cluster, n: usize, nodes: &[&str]) -> (Wave, Timeline) {
    let ns = c.namespace("scale-wave").await.unwrap();
    let name = ns.name.clone();
    let placement = cluster_tests::placement(nodes, 6);
    let set = format!(
        "apiVersion: apps/v1\nkind: StatefulSet\nmetadata:\n  name: wave\nspec:\n  replicas: {n}\n  podManagementPolicy: Parallel\n  serviceName: wave\n  selector:\n    matchLabels: {{app: wave}}\n  template:\n    metadata:\n      labels: {{app: wave}}\n    spec:\n      terminationGracePeriodSeconds: 1\n{placement}      containers:\n      - name: app\n        image: {}\n        command: [sh, -c, 'exec sleep 36000']\n        volumeMounts:\n        - {{name: data, mountPath: /data}}\n  volumeClaimTemplates:\n  - metadata: {{name: data}}\n    spec:\n      accessModes: [ReadWriteOnce]\n      storageClassName: csi-cinder-sc-delete\n      resources: {{requests: {{storage: 1Gi}}}}\n",
        cluster_tests::APP_IMAGE
    );
    let started = Instant::now();
    // the PVs, the VolumeAttachments and the namespace's pods, as they change
    let mut pvs = Watch::start(c, "pv", &name, started);
    let mut vas = Watch::start(c, "volumeattachments", &name, started);
    let mut pods = Watch::start(c, "pods", &name, started);
    c.apply_in(&name, &set).await.unwrap();
    let deadline = started + TIMEOUT;
    // by PV: its attachment first seen, attached, asked to go, gone
    let mut made: BTreeMap<String, Duration> = BTreeMap::new();
    let mut attached: BTreeMap<String, Duration> = BTreeMap::new();
    let mut asked: BTreeMap<String, Duration> = BTreeMap::new();
    let mut gone: BTreeMap<String, Duration> = BTreeMap::new();
    let mut present: std::collections::BTreeSet<String> = Default::default();
    // by pod (wave-i): running; and each of the namespace's PVs to its pod
    let mut running: BTreeMap<String, Duration> = BTreeMap::new();
    let mut pod_of_pv: BTreeMap<String, String> = BTreeMap::new();
    // after the scale down: when, and the attachments left at each change
    let mut scaled_down: Option<Duration> = None;
    let mut left_at: Vec<(Duration, usize)> = Vec::new();
    loop {
        let change = tokio::select! {
            Some(pv) = pvs.events.recv() => {
                let o = &pv.object;
                if o["spec"]["claimRef"]["namespace"] == name.as_str() {
                    let claim = o["spec"]["claimRef"]["name"].as_str().unwrap_or_default();
                    pod_of_pv.insert(name_of(o), claim.trim_start_matches("data-").to_string());
                }
                None
            }
            Some(va) = vas.events.recv() => Some(va),
            Some(pod) = pods.events.recv() => {
                if !pod.deleted && pod.object["status"]["phase"] == "Running" {
                    running.entry(name_of(&pod.object)).or_insert(pod.at);
                }
                None
            }
            () = tokio::time::sleep_until(deadline.into()) => {
                panic!("the wave: {} of {n} pods running, {} attachments left", running.len(), present.len())
            }
        };
        if let Some(va) = change {
            let pv = va.object["spec"]["source"]["persistentVolumeName"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            if va.deleted {
                present.remove(&pv);
                asked.entry(pv.clone()).or_insert(va.at);
                gone.entry(pv).or_insert(va.at);
            } else {
                present.insert(pv.clone());
                made.entry(pv.clone()).or_insert(va.at);
                if va.object["status"]["attached"] == true {
                    attached.entry(pv.clone()).or_insert(va.at);
                }
                if !va.object["metadata"]["deletionTimestamp"].is_null() {
                    asked.entry(pv).or_insert(va.at);
                }
            }
        }
        match scaled_down {
            None if running.len() >= n => {
                scaled_down = Some(started.elapsed());
                c.kubectl(&["-n", &name, "scale", "statefulset", "wave", "--replicas=0"])
                    .await
                    .unwrap();
            }
            Some(at) => {
                let ours = present
                    .iter()
                    .filter(|pv| pod_of_pv.contains_key(*pv))
                    .count();
                left_at.push((started.elapsed().saturating_sub(at), ours));
                if ours == 0 {
                    break;
                }
            }
            None => {}
        }
    }
    drop((pvs, vas, pods));
    ns.close().await.unwrap();
    let scaled_down = scaled_down.unwrap_or_default();
    let at = |share: f64| {
        left_at
            .iter()
            .find(|(_, left)| *left as f64 <= n as f64 * share)
            .map(|(t, _)| *t)
            .unwrap_or_default()
    };
    // each pod's times, through its PV; the detach's from the scale down
    let pv_of_pod: BTreeMap<&String, &String> =
        pod_of_pv.iter().map(|(pv, pod)| (pod, pv)).collect();
    let of = |m: &BTreeMap<String, Duration>, since: Duration| -> Vec<Duration> {
        running
            .keys()
            .map(|pod| {
                pv_of_pod
                    .get(pod)
                    .and_then(|pv| m.get(*pv))
                    .map(|t| t.saturating_sub(since))
                    .unwrap_or_default()
            })
            .collect()
    };
    let timeline = Timeline {
        attachment_made: of(&made, Duration::ZERO),
        attached: of(&attached, Duration::ZERO),
        running: running.values().copied().collect(),
        detach_asked: of(&asked, scaled_down),
        detached: of(&gone, scaled_down),
    };
    (
        Wave {
            running: running.into_values().collect(),
            detached: [at(0.5), at(0.1), at(0.01), at(0.0)],
        },
        timeline,
    )
}

/// The same volumes straight through Cinder and Nova, at once: each made,
/// attached to a server with room once `available`, watched until
/// `in-use`; then all detached and watched until `available`, then deleted.
async fn wave_through_openstack(
    c: &Cluster,
    cinder: &BlockStorage,
    rooms: &[(String, usize)],
) -> (Wave, DirectAttaches) {
    let nova = c.nova().unwrap();
    // each volume in its server's zone (Nova attaches none across zones)
    let zones = c.node_zones().await.unwrap();
    let servers: Vec<(String, String)> = rooms
        .iter()
        .flat_map(|(node, room)| {
            std::iter::repeat_n((c.server_of(node).unwrap(), zones[node].clone()), *room)
        })
        .collect();
    let n = servers.len();
    let started = Instant::now();
    let tasks: Vec<_> = servers
        .into_iter()
        .enumerate()
        .map(|(i, (server, zone))| {
            let (cinder, nova) = (cinder.clone(), nova.clone());
            tokio::spawn(async move {
                let v = cinder
                    .create_volume(&CreateVolume {
                        name: format!("scale-wave-{i}"),
                        size_gib: 1,
                        availability_zone: Some(zone),
                        ..Default::default()
                    })
                    .await
                    .unwrap();
                let mut attaching: Option<Instant> = None;
                loop {
                    let now = cinder.get_volume(&v.id).await.unwrap();
                    match now.status.as_str() {
                        "available" if attaching.is_none() => {
                            attaching = Some(Instant::now());
                            nova.attach_volume(&server, &v.id, false).await.unwrap();
                        }
                        "in-use" => {
                            let attach = attaching.map(|a| a.elapsed()).unwrap_or_default();
                            return (v.id, server, started.elapsed(), attach);
                        }
                        "error" | "error_attaching" => panic!("{} went {}", v.id, now.status),
                        _ => {}
                    }
                    tokio::time::sleep(POLL).await;
                }
            })
        })
        .collect();
    let mut done = Vec::new();
    for t in tasks {
        done.push(t.await.unwrap());
    }
    for (id, server, _, _) in &done {
        nova.detach_volume(server, id).await.unwrap();
    }
    let ids: Vec<String> = done.iter().map(|(id, _, _, _)| id.clone()).collect();
    let attached = || async {
        let mut left = 0;
        for id in &ids {
            if cinder
                .get_volume(id)
                .await
                .map(|v| v.status.as_str() != "available")
                .unwrap_or(false)
            {
                left += 1;
            }
        }
        left
    };
    let detached = draining(n, attached).await;
    for id in &ids {
        cinder.delete_volume(id).await.unwrap();
    }
    until_gone(cinder, ids).await;
    (
        Wave {
            running: done.iter().map(|(_, _, took, _)| *took).collect(),
            detached,
        },
        DirectAttaches(done.iter().map(|(_, _, _, attach)| *attach).collect()),
    )
}

/// The resident memory (MiB) and CPU time (s) of the Cinder plugin's
/// processes on this host (every node's pods run here, each in its own
/// namespaces), summed: the controller's (`--provide-node-service=false`)
/// or the node plugins'.
fn cinder_plugin_usage(controller: bool) -> (f64, f64) {
    // clock ticks per second: 100 on Linux for /proc's utime and stime
    const TICKS: f64 = 100.0;
    let (mut rss, mut cpu) = (0.0, 0.0);
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let cmd = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        let is_plugin = cmd
            .split_whitespace()
            .next()
            .is_some_and(|exe| exe.ends_with("cinder-csi-plugin"));
        if !is_plugin || cmd.contains("--provide-node-service=false") != controller {
            continue;
        }
        let status = std::fs::read_to_string(entry.path().join("status")).unwrap_or_default();
        rss += status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse::<f64>().ok())
            .unwrap_or(0.0)
            / 1024.0;
        // after the command's closing parenthesis: state is field 3,
        // utime and stime fields 14 and 15
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        if let Some(rest) = stat.rfind(')').map(|i| &stat[i + 2..]) {
            let fields: Vec<&str> = rest.split_whitespace().collect();
            let ticks = |i: usize| {
                fields
                    .get(i)
                    .and_then(|f| f.parse::<f64>().ok())
                    .unwrap_or(0.0)
            };
            cpu += (ticks(11) + ticks(12)) / TICKS;
        }
    }
    (rss, cpu)
}

/// The Cinder controller's resident memory, in MiB.
fn controller_rss_mib() -> f64 {
    cinder_plugin_usage(true).0
}

/// Volumes in Cinder that carry the cluster's id (what the controllers make).
async fn cluster_volumes(cinder: &BlockStorage) -> usize {
    let tag = BTreeMap::from([(
        "cinder.csi.openstack.org/cluster".to_string(),
        "kubernetes".to_string(),
    )]);
    cinder.volumes_with_metadata(&tag).await.unwrap().len()
}

/// The time between two waves of the churn.
const WAVE_GAP: Duration = Duration::from_secs(10);

async fn churn(c: &Cluster, cinder: &BlockStorage, per_wave: usize) {
    let ns = c.namespace("scale-churn").await.unwrap();
    let name = ns.name.clone();
    let before = cluster_volumes(cinder).await;
    let rss_before = controller_rss_mib();
    // on every node (the multi-node taint tolerated): the three nodes'
    // attach limits, not A's alone, bound how many run at once
    let names = c.nodes().await.unwrap();
    let nodes: Vec<&str> = names.iter().map(String::as_str).collect();
    let placement = cluster_tests::placement(&nodes, 6);
    let job = |wave: usize, i: usize| {
        format!(
            "apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: w{wave}-j{i}\nspec:\n  ttlSecondsAfterFinished: 0\n  backoffLimit: 0\n  template:\n    spec:\n      restartPolicy: Never\n      terminationGracePeriodSeconds: 1\n{placement}      containers:\n      - name: app\n        image: {}\n        command: [sh, -c, 'echo done > /data/out && sync']\n        volumeMounts:\n        - {{name: data, mountPath: /data}}\n      volumes:\n      - name: data\n        ephemeral:\n          volumeClaimTemplate:\n            spec:\n              accessModes: [ReadWriteOnce]\n              storageClassName: csi-cinder-sc-delete\n              resources: {{requests: {{storage: 1Gi}}}}\n",
            cluster_tests::APP_IMAGE
        )
    };
    let started = Instant::now();
    for wave in 0..3 {
        let jobs: Vec<String> = (0..per_wave).map(|i| job(wave, i)).collect();
        c.apply_in(&name, &jobs.join("---\n")).await.unwrap();
        // the next wave while this one still runs
        tokio::time::sleep(WAVE_GAP).await;
    }
    let mut rss_peak = rss_before;
    loop {
        assert!(started.elapsed() < TIMEOUT, "the churn did not end");
        rss_peak = rss_peak.max(controller_rss_mib());
        let jobs = c.list("jobs", &["-n", &name]).await.unwrap();
        let failed: Vec<_> = jobs
            .iter()
            .filter(|j| j["status"]["failed"].as_u64() > Some(0))
            .collect();
        assert!(
            failed.is_empty(),
            "a Job failed: {:?}",
            failed[0]["metadata"]["name"]
        );
        let claims = c.list("pvc", &["-n", &name]).await.unwrap();
        if jobs.is_empty() && claims.is_empty() && cluster_volumes(cinder).await <= before {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let took = started.elapsed();
    // memory once the churn is over: what stays is what it kept
    tokio::time::sleep(WAVE_GAP).await;
    let rss_after = controller_rss_mib();
    ns.close().await.unwrap();
    println!();
    println!(
        "churn: 3 waves of {per_wave} Jobs 10 s apart, each with a claim of its own: all done and every volume gone after {:.1} s; the cluster's volumes in Cinder {before} before and after; the Cinder controller's memory {rss_before:.1} MiB before, {rss_peak:.1} MiB at most, {rss_after:.1} MiB after",
        took.as_secs_f64()
    );
}

async fn snapshots_and_expansion(c: &Cluster, m: usize) {
    let ns = c.namespace("scale-snap").await.unwrap();
    let name = ns.name.clone();
    let claims: Vec<String> = (0..m)
        .map(|i| claim(&format!("c{i}"), CLASS, "1Gi", "ReadWriteOnce", false))
        .collect();
    c.apply_in(&name, &claims.join("---\n")).await.unwrap();
    let started = Instant::now();
    loop {
        assert!(started.elapsed() < TIMEOUT, "the claims never bound");
        let pvcs = c.list("pvc", &["-n", &name]).await.unwrap();
        if pvcs
            .iter()
            .filter(|p| p["status"]["phase"] == "Bound")
            .count()
            == m
        {
            break;
        }
        tokio::time::sleep(POLL).await;
    }
    let snaps: Vec<String> = (0..m)
        .map(|i| format!("apiVersion: snapshot.storage.k8s.io/v1\nkind: VolumeSnapshot\nmetadata:\n  name: s{i}\nspec:\n  volumeSnapshotClassName: csi-cinder-snapclass\n  source:\n    persistentVolumeClaimName: c{i}\n"))
        .collect();
    let started = Instant::now();
    c.apply_in(&name, &snaps.join("---\n")).await.unwrap();
    let ready = ready_times(c, "volumesnapshots", &name, m, started, |s| {
        s["status"]["readyToUse"] == true
    })
    .await;
    let q = quantiles(&ready.into_values().collect::<Vec<_>>());
    // expansion at 5 claims a second
    let started = Instant::now();
    let mut asked = Vec::new();
    for i in 0..m {
        c.kubectl(&[
            "-n",
            &name,
            "patch",
            "pvc",
            &format!("c{i}"),
            "--type=merge",
            "-p",
            r#"{"spec":{"resources":{"requests":{"storage":"2Gi"}}}}"#,
        ])
        .await
        .unwrap();
        asked.push(started.elapsed());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut grown: BTreeMap<String, Duration> = BTreeMap::new();
    while grown.len() < m {
        assert!(
            started.elapsed() < TIMEOUT,
            "{} of {m} volumes grown",
            grown.len()
        );
        for pv in c.list("pv", &[]).await.unwrap() {
            if pv["spec"]["claimRef"]["namespace"] != name.as_str() {
                continue;
            }
            let claim = pv["spec"]["claimRef"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            if pv["spec"]["capacity"]["storage"] == "2Gi" && !grown.contains_key(&claim) {
                grown.insert(claim, started.elapsed());
            }
        }
        tokio::time::sleep(POLL).await;
    }
    let took: Vec<Duration> = grown
        .iter()
        .map(|(claim, at)| {
            let i: usize = claim.trim_start_matches('c').parse().unwrap();
            at.saturating_sub(asked[i])
        })
        .collect();
    let e = quantiles(&took);
    ns.close().await.unwrap();
    println!();
    println!(
        "snapshots of {m} volumes at once: ready 50 / 90 / 99 / 100 % after {} s; {m} claims expanded at 5 a second: each PV grown {} s after its claim was",
        marks(&q),
        marks(&e)
    );
}

/// The attach wave (part 2) and where its time went, printed.
async fn attach_wave(c: &Cluster, cinder: &BlockStorage) {
    let proxy = c.fault_proxy().unwrap();
    // the attach wave: as many volumes as the nodes take
    let rooms = room(c).await;
    let names: Vec<String> = rooms.iter().map(|(n, _)| n.clone()).collect();
    let nodes: Vec<&str> = names.iter().map(String::as_str).collect();
    let capacity: usize = rooms.iter().map(|(_, r)| r).sum();
    let n = if bench_quick() {
        capacity.min(3)
    } else {
        capacity
    };
    let rooms: Vec<(String, usize)> = if bench_quick() {
        vec![(rooms[0].0.clone(), n)]
    } else {
        rooms
    };
    proxy.clear_calls().await.unwrap();
    let publish_before =
        controller_rpc_totals(CINDER_CONTROLLER_METRICS, "ControllerPublishVolume").await;
    let unpublish_before =
        controller_rpc_totals(CINDER_CONTROLLER_METRICS, "ControllerUnpublishVolume").await;
    let since = Instant::now();
    let nodes_before = cinder_plugin_usage(false);
    let controller_before = cinder_plugin_usage(true);
    let (ours, timeline) = wave_through_kubernetes(c, n, &nodes).await;
    let nodes_after = cinder_plugin_usage(false);
    let controller_after = cinder_plugin_usage(true);
    let recorded = proxy.calls().await.unwrap();
    let cinder_calls = recorded
        .iter()
        .filter(|r| r.path.starts_with("/volume"))
        .count();
    let nova_calls = recorded
        .iter()
        .filter(|r| r.path.starts_with("/compute"))
        .count();
    let (publishes, publish_mean) = rpc_since("ControllerPublishVolume", publish_before).await;
    let (unpublishes, unpublish_mean) =
        rpc_since("ControllerUnpublishVolume", unpublish_before).await;
    let (waits, longest) = throttled(c, "csi-cinder-controllerplugin", "csi-attacher", since).await;
    let (theirs, direct) = wave_through_openstack(c, cinder, &rooms).await;
    let (q, t) = (quantiles(&ours.running), quantiles(&theirs.running));
    println!();
    println!(
        "| N | pods Running 50 / 90 / 99 / 100 % (s) | made and attached straight through Cinder and Nova (s) | ratio at 100 % | after the scale down, attachments left 50 / 10 / 1 / 0 % (s) | the same, detached straight through Nova (s) | Cinder / Nova calls per pod |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    println!(
        "| {n} | {} | {} | {:.2} | {} | {} | {:.1} / {:.1} |",
        marks(&q),
        marks(&t),
        ratio(&q, &t),
        marks(&ours.detached),
        marks(&theirs.detached),
        cinder_calls as f64 / n.max(1) as f64,
        nova_calls as f64 / n.max(1) as f64
    );
    let zero = vec![Duration::ZERO; timeline.running.len()];
    println!();
    println!("where a pod of the wave spent its time, 50 / 90 / 99 / 100 % (s):");
    println!(
        "  created until its VolumeAttachment existed (scheduler, attach-detach controller): {}",
        marks(&quantiles(&segment(&zero, &timeline.attachment_made)))
    );
    println!(
        "  until attached (external attacher, our ControllerPublish, Nova): {} (ControllerPublish answered {publishes:.0} times, in {publish_mean:.2} s on average; Nova's own attach until in-use {:.2} s on average; the attacher waited on its own API rate limit {waits} times over 1 s, longest {:.1} s)",
        marks(&quantiles(&segment(
            &timeline.attachment_made,
            &timeline.attached
        ))),
        mean(&direct.0),
        longest.as_secs_f64()
    );
    println!(
        "  until Running (kubelet: our NodeStage and NodePublish, the container's start): {}",
        marks(&quantiles(&segment(&timeline.attached, &timeline.running)))
    );
    println!(
        "  after the scale down, until its detach was asked (kubelet's unmount, the node's status, the attach-detach controller): {}",
        marks(&quantiles(&segment(&zero, &timeline.detach_asked)))
    );
    println!(
        "  until detached (external attacher, our ControllerUnpublish, Nova): {} (ControllerUnpublish answered {unpublishes:.0} times, in {unpublish_mean:.2} s on average)",
        marks(&quantiles(&segment(
            &timeline.detach_asked,
            &timeline.detached
        )))
    );
    let per_100 = 100.0 / n.max(1) as f64;
    println!(
        "the wave's cost per 100 volumes attached and detached: the node plugins (three) {:.2} s of CPU, {:+.1} MiB of memory ({:.1} MiB after); the controller {:.2} s of CPU, {:+.1} MiB",
        (nodes_after.1 - nodes_before.1) * per_100,
        (nodes_after.0 - nodes_before.0) * per_100,
        nodes_after.0,
        (controller_after.1 - controller_before.1) * per_100,
        (controller_after.0 - controller_before.0) * per_100
    );
}

#[tokio::main]
async fn main() {
    let Some(c) = bench_cluster() else {
        return;
    };
    c.apply(&format!(
        "apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata:\n  name: {CLASS}\nprovisioner: cinder.csi.openstack.org\nreclaimPolicy: Delete\nvolumeBindingMode: Immediate\nallowVolumeExpansion: true\n"
    ))
    .await
    .unwrap();
    let cinder = c.cinder().unwrap();
    let proxy = c.fault_proxy().unwrap();
    println!(
        "| N | Bound 50 / 90 / 99 / 100 % (s) | Cinder's own (s) | ratio at 100 % | volumes gone after deletion, ours / Cinder's (s) | Cinder calls per claim |"
    );
    println!("| --- | --- | --- | --- | --- | --- |");
    let mut where_it_went = Vec::new();
    for n in sizes().into_iter().filter(|_| part("cinder")) {
        proxy.clear_calls().await.unwrap();
        let before = controller_rpc_totals(CINDER_CONTROLLER_METRICS, "CreateVolume").await;
        let since = Instant::now();
        let usage_before = cinder_plugin_usage(true);
        let ours = through_kubernetes(&c, &cinder, n).await;
        let usage_after = cinder_plugin_usage(true);
        let (creates, create_mean) = rpc_since("CreateVolume", before).await;
        let (waits, longest) =
            throttled(&c, "csi-cinder-controllerplugin", "csi-provisioner", since).await;
        let calls = proxy
            .calls()
            .await
            .unwrap()
            .iter()
            .filter(|r| r.path.starts_with("/volume"))
            .count();
        let theirs = through_cinder(&cinder, n).await;
        let (q, t) = (quantiles(&ours.ready), quantiles(&theirs.ready));
        println!(
            "| {n} | {} | {} | {:.2} | {} / {} | {:.1} |",
            marks(&q),
            marks(&t),
            ratio(&q, &t),
            secs(ours.gone),
            secs(theirs.gone),
            calls as f64 / n as f64
        );
        where_it_went.push(format!(
            "N = {n}: PVs made (CreateVolume answered) 50 / 90 / 99 / 100 % after {} s, claims Bound {} s; CreateVolume answered {creates:.0} times, in {create_mean:.2} s on average (Cinder's own create until available: {:.2} s); the provisioner waited on its own API rate limit {waits} times over 1 s (longest {:.1} s); the controller: {:.2} s of CPU and {:+.1} MiB of memory per 100 claims made and deleted ({:.1} MiB after)",
            marks(&quantiles(&ours.made)),
            marks(&q),
            mean(&theirs.ready),
            longest.as_secs_f64(),
            (usage_after.1 - usage_before.1) * 100.0 / n as f64,
            (usage_after.0 - usage_before.0) * 100.0 / n as f64,
            usage_after.0
        ));
    }
    println!();
    for line in where_it_went {
        println!("{line}");
    }

    // the same for CephFS shares
    let manila = c.manila().unwrap();
    println!();
    println!(
        "| N (CephFS) | Bound 50 / 90 / 99 / 100 % (s) | Manila's own, until the cephx rule is active (s) | ratio at 100 % | shares gone after deletion, ours / Manila's (s) | Manila calls per claim |"
    );
    println!("| --- | --- | --- | --- | --- | --- |");
    let mut manila_errors = Vec::new();
    for n in share_sizes().into_iter().filter(|_| part("cephfs")) {
        proxy.clear_calls().await.unwrap();
        let ours = shares_through_kubernetes(&c, &manila, n).await;
        let calls = proxy
            .calls()
            .await
            .unwrap()
            .iter()
            .filter(|r| r.path.starts_with("/share"))
            .count();
        let (theirs, failed) = shares_through_manila(&manila, n).await;
        manila_errors.push(format!(
            "N = {n}: Manila put {failed} of its own shares in error (each deleted and made again, as the driver does)"
        ));
        let (q, t) = (quantiles(&ours.ready), quantiles(&theirs.ready));
        println!(
            "| {n} | {} | {} | {:.2} | {} / {} | {:.1} |",
            marks(&q),
            marks(&t),
            ratio(&q, &t),
            secs(ours.gone),
            secs(theirs.gone),
            calls as f64 / n as f64
        );
    }

    for line in manila_errors {
        println!("{line}");
    }
    if part("wave") {
        attach_wave(&c, &cinder).await;
    }
    if part("churn") {
        churn(&c, &cinder, if bench_quick() { 1 } else { 10 }).await;
    }
    if part("snapshots") {
        snapshots_and_expansion(&c, if bench_quick() { 2 } else { 50 }).await;
    }
    c.kubectl(&["delete", "storageclass", CLASS, "--ignore-not-found"])
        .await
        .unwrap();
}
