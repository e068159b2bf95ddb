//! At scale, printed and never asserted (issue 38).
//!
//! 1. **Provisioning burst**: N Cinder claims at once (Immediate binding),
//!    then deleted: the time until 50/90/99/100 % are Bound and until every
//!    volume is gone from Cinder; against the same N volumes made at once
//!    and deleted straight through Cinder (a small client here, polling
//!    every 250 ms, through the fault proxy as the plugins are): the ratio
//!    of our time to OpenStack's own, and the Cinder calls per claim of
//!    each (counted at the fault proxy, which the controllers' catalog
//!    points at). Who used this machine's two cores meanwhile (OpenStack,
//!    Kubernetes, our plugins), from /proc. Where the time went: when each PV
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
//!    5 a second (until each PV has its new size); against the same
//!    snapshots and extends straight through Cinder.
//!
//! 5. **Where a move's time goes**: one StatefulSet pod moved between two
//!    nodes of a zone, drawn as one timeline (the apiserver's reports, our
//!    plugins' RPCs from their log lines, the OpenStack calls at the fault
//!    proxy), every millisecond given to Kubernetes, our node plugins or
//!    our controller (inside an OpenStack call, or between its calls);
//!    against the same detach and attach straight through Nova. Then the
//!    floor: the same moves through a second driver of ours whose cloud
//!    (an emulator in this process) answers at once (`scale/floor.rs`),
//!    and our move's time above it against OpenStack's own.
//!
//! Needs the cluster tier up (`tests/cluster/cluster.py up`): `cargo bench
//! -p cluster-tests --bench scale`; `SCALE_N=30,100,300` and
//! `SCALE_SHARES_N=30,100` (the defaults), `SCALE_PARTS` a choice of
//! cinder, cephfs, wave, churn, snapshots, move (all by default).
//! `BENCH_QUICK=1`: N = 3 (2 shares), each part through once.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

// the bench's parts by role (a crate root finds its modules beside it)
#[path = "scale/cost.rs"]
mod cost;
#[path = "scale/direct.rs"]
mod direct;
#[path = "scale/floor.rs"]
mod floor;
#[path = "scale/timeline.rs"]
mod timeline;
#[path = "scale/watch.rs"]
mod watch;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use cluster_tests::{Cluster, bench_cluster, bench_quick, claim};
use openstack_client::cinder::BlockStorage;
use openstack_client::manila::SharedFileSystems;
use openstack_emulator::CallRecord;
use openstack_emulator::proxy::ProxyControl;

use cost::{
    CINDER_CONTROLLER_METRICS, MachineCpu, attachment_wait_totals, cinder_plugin_usage,
    cluster_volumes, codes_between, controller_manager_log_end, controller_manager_throttled,
    controller_rpc_codes, controller_rpc_totals, controller_rss_mib, rpc_since, since_totals,
    throttled,
};
use direct::{
    quiet_cloud, shares_through_manila, snapshots_and_expansion_through_cinder, through_cinder,
    until_gone, until_shares_gone, wave_through_openstack,
};
use watch::{Watch, name_of, ready_times};

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

/// One row of a burst's table: N, ours, OpenStack's own, the ratio, the
/// deletions, the calls per claim; returns our four marks.
/// `ratio_note` follows the ratio (what makes it more or less like with
/// like).
fn burst_row(
    n: usize,
    ours: &Burst,
    theirs: &Burst,
    calls: [usize; 2],
    ratio_note: &str,
) -> [Duration; 4] {
    let (q, t) = (quantiles(&ours.ready), quantiles(&theirs.ready));
    println!(
        "| {n} | {} | {} | {:.2}{ratio_note} | {} / {} | {:.1} / {:.1} |",
        marks(&q),
        marks(&t),
        ratio(&q, &t),
        secs(ours.gone),
        secs(theirs.gone),
        calls[0] as f64 / n as f64,
        calls[1] as f64 / n as f64
    );
    q
}

/// The calls the fault proxy saw to one service (`/volume`, `/share`)
/// since it last forgot them, each as its [`call_kind`]; it forgets them.
async fn calls_to(proxy: &ProxyControl, service: &str) -> Vec<String> {
    let calls = proxy.calls().await.unwrap();
    proxy.clear_calls().await.unwrap();
    calls
        .iter()
        .filter(|r| r.path.starts_with(service))
        .map(call_kind)
        .collect()
}

/// A call as its method, its path with every id as `{id}` and the names
/// of its query's parameters.
fn call_kind(r: &CallRecord) -> String {
    let path: Vec<&str> = r
        .path
        .split('/')
        .map(|seg| {
            let id = seg.len() >= 32 && seg.chars().all(|c| c.is_ascii_hexdigit() || c == '-');
            if id { "{id}" } else { seg }
        })
        .collect();
    let keys: Vec<&str> = r
        .query
        .split('&')
        .filter_map(|kv| kv.split('=').next())
        .filter(|k| !k.is_empty())
        .collect();
    let query = if keys.is_empty() {
        String::new()
    } else {
        format!("?{}", keys.join("&"))
    };
    format!("{} {}{query}", r.method, path.join("/"))
}

/// How long the calls of each kind took at the fault proxy (from their
/// arrival to their answer: queued at a busy API, and the work), mean and
/// longest, the most frequent kinds first.
fn call_times(calls: &[CallRecord]) -> String {
    let mut kinds: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for c in calls {
        kinds.entry(call_kind(c)).or_default().push(c.took_ms);
    }
    let mut kinds: Vec<(String, Vec<u64>)> = kinds.into_iter().collect();
    kinds.sort_by_key(|k| std::cmp::Reverse(k.1.len()));
    let kinds: Vec<String> = kinds
        .iter()
        .map(|(k, took)| {
            let mean = took.iter().sum::<u64>() as f64 / took.len().max(1) as f64;
            let longest = took.iter().max().copied().unwrap_or_default();
            format!("{k} x{}: {mean:.0} ms (longest {longest})", took.len())
        })
        .collect();
    kinds.join(", ")
}

/// The calls of `calls_to` per claim, by kind, most first.
fn calls_by_kind(calls: &[String], n: usize) -> String {
    let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
    for c in calls {
        *kinds.entry(c.as_str()).or_default() += 1;
    }
    let mut kinds: Vec<(&str, usize)> = kinds.into_iter().collect();
    kinds.sort_by_key(|k| std::cmp::Reverse(k.1));
    let kinds: Vec<String> = kinds
        .iter()
        .map(|(k, c)| format!("{k} {:.1}", *c as f64 / n.max(1) as f64))
        .collect();
    kinds.join(", ")
}

/// Ours against OpenStack's own, at 100 %.
fn ratio(ours: &[Duration; 4], theirs: &[Duration; 4]) -> f64 {
    ours[3].as_secs_f64() / theirs[3].as_secs_f64().max(0.001)
}

/// Creates `docs` in `ns` in one go: `kubectl create` without its
/// client-side validation puts 100 claims into the apiserver in 0.6 s,
/// where `kubectl apply` took 3.5 s (its own CPU, object after object),
/// which made a burst's last claims start seconds after its first.
async fn create_at_once(c: &Cluster, ns: &str, docs: &[String]) {
    c.kubectl_with_input(
        &["create", "--validate=false", "-n", ns, "-f", "-"],
        Some(&docs.join("---\n")),
    )
    .await
    .unwrap();
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

/// N claims at once through Kubernetes, then deleted.
async fn through_kubernetes(c: &Cluster, cinder: &BlockStorage, n: usize) -> Burst {
    let ns = c.namespace(&format!("scale-{n}")).await.unwrap();
    let name = ns.name.clone();
    let claims: Vec<String> = (0..n)
        .map(|i| claim(&format!("c{i}"), CLASS, "1Gi", "ReadWriteOnce", false))
        .collect();
    let started = Instant::now();
    create_at_once(c, &name, &claims).await;
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
    create_at_once(c, &name, &claims).await;
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

/// Whether `part` is to run: `SCALE_PARTS` (a comma-separated choice of
/// cinder, cephfs, wave, churn, snapshots), every part without it.
fn part(name: &str) -> bool {
    std::env::var("SCALE_PARTS")
        .map(|parts| parts.split(',').any(|p| p.trim() == name))
        .unwrap_or(true)
}

fn share_sizes() -> Vec<usize> {
    if bench_quick() {
        return vec![1];
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

/// Where each pod of an attach wave spent its time, from the changes the
/// apiserver reported (a watch of each kind): until its PV existed (the
/// scheduler's choice, the provisioner, our CreateVolume and Cinder), until
/// its VolumeAttachment existed (the claim and the pod bound, the
/// attach-detach controller: Kubernetes), until
/// that was attached (the external attacher, our ControllerPublish and
/// Nova), until the pod ran (kubelet: our NodeStage and NodePublish, the
/// container's start). After the scale down: until each pod was gone
/// (kubelet: its container stopped, our NodeUnpublish and NodeUnstage),
/// until its node no longer reported the volume in use (kubelet's node
/// status), until its attachment was asked to go (the attach-detach
/// controller), until it was gone (the external attacher, our
/// ControllerUnpublish and Nova).
#[derive(Default)]
struct Timeline {
    pv_made: Vec<Duration>,
    attachment_made: Vec<Duration>,
    attached: Vec<Duration>,
    running: Vec<Duration>,
    pod_gone: Vec<Duration>,
    unreported: Vec<Duration>,
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
    let mut node_watch = Watch::start(c, "nodes", &name, started);
    c.apply_in(&name, &set).await.unwrap();
    let deadline = started + TIMEOUT;
    // by PV: its attachment first seen, attached, asked to go, gone
    let mut made: BTreeMap<String, Duration> = BTreeMap::new();
    let mut pv_made: BTreeMap<String, Duration> = BTreeMap::new();
    let mut attached: BTreeMap<String, Duration> = BTreeMap::new();
    let mut asked: BTreeMap<String, Duration> = BTreeMap::new();
    let mut gone: BTreeMap<String, Duration> = BTreeMap::new();
    let mut present: std::collections::BTreeSet<String> = Default::default();
    // by pod (wave-i): running; and each of the namespace's PVs to its pod
    let mut running: BTreeMap<String, Duration> = BTreeMap::new();
    let mut pod_of_pv: BTreeMap<String, String> = BTreeMap::new();
    // after the scale down, by pod: gone; by PV: no longer reported in use
    // by its node (its handle and node from its PV and attachment)
    let mut pod_gone: BTreeMap<String, Duration> = BTreeMap::new();
    let mut unreported: BTreeMap<String, Duration> = BTreeMap::new();
    let mut in_use_name: BTreeMap<String, String> = BTreeMap::new();
    let mut node_of_pv: BTreeMap<String, String> = BTreeMap::new();
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
                    pv_made.entry(name_of(o)).or_insert(pv.at);
                    let handle = o["spec"]["csi"]["volumeHandle"].as_str().unwrap_or_default();
                    in_use_name.insert(name_of(o), format!("kubernetes.io/csi/cinder.csi.openstack.org^{handle}"));
                }
                None
            }
            Some(va) = vas.events.recv() => {
                let pv = va.object["spec"]["source"]["persistentVolumeName"].as_str().unwrap_or_default();
                let node = va.object["spec"]["nodeName"].as_str().unwrap_or_default();
                node_of_pv.insert(pv.to_string(), node.to_string());
                Some(va)
            }
            Some(pod) = pods.events.recv() => {
                if !pod.deleted && pod.object["status"]["phase"] == "Running" {
                    running.entry(name_of(&pod.object)).or_insert(pod.at);
                }
                if pod.deleted && scaled_down.is_some() {
                    pod_gone.entry(name_of(&pod.object)).or_insert(pod.at);
                }
                None
            }
            Some(node) = node_watch.events.recv() => {
                // a node's status changes when kubelet posts it
                let in_use = node.object["status"]["volumesInUse"].as_array().cloned().unwrap_or_default();
                let node_name = name_of(&node.object);
                for (pv, on) in &node_of_pv {
                    let reported = in_use_name.get(pv).is_some_and(|v| in_use.iter().any(|u| u == v.as_str()));
                    if scaled_down.is_some() && *on == node_name && !reported {
                        unreported.entry(pv.clone()).or_insert(node.at);
                    }
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
    drop((pvs, vas, pods, node_watch));
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
        pv_made: of(&pv_made, Duration::ZERO),
        attachment_made: of(&made, Duration::ZERO),
        attached: of(&attached, Duration::ZERO),
        pod_gone: running
            .keys()
            .map(|pod| {
                pod_gone
                    .get(pod)
                    .map(|t| t.saturating_sub(scaled_down))
                    .unwrap_or_default()
            })
            .collect(),
        unreported: of(&unreported, scaled_down),
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

/// The time between two waves of the churn.
const WAVE_GAP: Duration = Duration::from_secs(10);

/// The nodes the bench's pods go to: every node, or node A alone in the
/// quick mode (which the test command runs beside the many-node figures,
/// whose drains of B must not evict the churn's Jobs).
async fn placed_nodes(c: &Cluster) -> Vec<String> {
    if bench_quick() {
        vec![c.node.clone()]
    } else {
        c.nodes().await.unwrap()
    }
}

/// The time between two waves of the churn (shorter in the quick mode,
/// which only shows the churn runs through).
fn wave_gap() -> Duration {
    if bench_quick() {
        Duration::from_secs(2)
    } else {
        WAVE_GAP
    }
}

async fn churn(c: &Cluster, cinder: &BlockStorage, per_wave: usize) {
    let ns = c.namespace("scale-churn").await.unwrap();
    let name = ns.name.clone();
    let before = cluster_volumes(cinder).await;
    let rss_before = controller_rss_mib();
    // on every node (the multi-node taint tolerated): the three nodes'
    // attach limits, not A's alone, bound how many run at once
    let names = placed_nodes(c).await;
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
        create_at_once(c, &name, &jobs).await;
        // the next wave while this one still runs
        tokio::time::sleep(wave_gap()).await;
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
    tokio::time::sleep(wave_gap()).await;
    let rss_after = controller_rss_mib();
    ns.close().await.unwrap();
    println!();
    println!(
        "churn: 3 waves of {per_wave} Jobs {} s apart, each with a claim of its own: all done and every volume gone after {:.1} s; the cluster's volumes in Cinder {before} before and after; the Cinder controller's memory {rss_before:.1} MiB before, {rss_peak:.1} MiB at most, {rss_after:.1} MiB after",
        wave_gap().as_secs(),
        took.as_secs_f64()
    );
}

async fn snapshots_and_expansion(c: &Cluster, cinder: &BlockStorage, m: usize) {
    let ns = c.namespace("scale-snap").await.unwrap();
    let name = ns.name.clone();
    let claims: Vec<String> = (0..m)
        .map(|i| claim(&format!("c{i}"), CLASS, "1Gi", "ReadWriteOnce", false))
        .collect();
    create_at_once(c, &name, &claims).await;
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
    create_at_once(c, &name, &snaps).await;
    let ready = ready_times(c, "volumesnapshots", &name, m, started, |s| {
        s["status"]["readyToUse"] == true
    })
    .await;
    let q = quantiles(&ready.into_values().collect::<Vec<_>>());
    // expansion at 5 claims a second, each PV watched from before the
    // first ask (watched only after the last ask, the first PVs' growth
    // was seen up to the whole asking's length late)
    let started = Instant::now();
    let mut pvs = Watch::start(c, "pv", &name, started);
    let asking = async {
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
        asked
    };
    let watching = async {
        let mut grown: BTreeMap<String, Duration> = BTreeMap::new();
        while grown.len() < m {
            let Some(change) = pvs.next(started + TIMEOUT).await else {
                panic!("{} of {m} volumes grown", grown.len());
            };
            let pv = &change.object;
            if pv["spec"]["claimRef"]["namespace"] == name.as_str()
                && pv["spec"]["capacity"]["storage"] == "2Gi"
            {
                let claim = pv["spec"]["claimRef"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                grown.entry(claim).or_insert(change.at);
            }
        }
        grown
    };
    let (asked, grown) = tokio::join!(asking, watching);
    drop(pvs);
    let took: Vec<Duration> = grown
        .iter()
        .map(|(claim, at)| {
            let i: usize = claim.trim_start_matches('c').parse().unwrap();
            at.saturating_sub(asked[i])
        })
        .collect();
    let e = quantiles(&took);
    ns.close().await.unwrap();
    let (snapshots, grown) = snapshots_and_expansion_through_cinder(cinder, m).await;
    let (qt, et) = (quantiles(&snapshots), quantiles(&grown));
    println!();
    println!(
        "snapshots of {m} volumes at once: ready 50 / 90 / 99 / 100 % after {} s; straight through Cinder {} s; ratio at 100 % {:.2}",
        marks(&q),
        marks(&qt),
        ratio(&q, &qt)
    );
    println!(
        "{m} claims expanded at 5 a second: each PV grown {} s after its claim was; each volume extended straight through Cinder at 5 a second, until its new size showed, {} s; ratio at 100 % {:.2}",
        marks(&e),
        marks(&et),
        ratio(&e, &et)
    );
}

/// The attach wave (part 2) and where its time went, printed.
/// `cinder`: the bench's own client, through the fault proxy.
async fn attach_wave(c: &Cluster, cinder: &BlockStorage) {
    let proxy = c.fault_proxy().unwrap();
    // the attach wave: as many volumes as the nodes take
    let placed = placed_nodes(c).await;
    let rooms: Vec<(String, usize)> = room(c)
        .await
        .into_iter()
        .filter(|(node, _)| placed.contains(node))
        .collect();
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
    let publish_codes = controller_rpc_codes("ControllerPublishVolume").await;
    let publish_before =
        controller_rpc_totals(CINDER_CONTROLLER_METRICS, "ControllerPublishVolume").await;
    let unpublish_before =
        controller_rpc_totals(CINDER_CONTROLLER_METRICS, "ControllerUnpublishVolume").await;
    let attach_waits_before = attachment_wait_totals("attach").await;
    let detach_waits_before = attachment_wait_totals("detach").await;
    let since = Instant::now();
    let nodes_before = cinder_plugin_usage(false);
    let controller_before = cinder_plugin_usage(true);
    let cpu_before = MachineCpu::now();
    let (ours, timeline) = wave_through_kubernetes(c, n, &nodes).await;
    let cpu_ours = MachineCpu::now();
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
    let publish_codes = codes_between(
        &publish_codes,
        &controller_rpc_codes("ControllerPublishVolume").await,
    );
    let (unpublishes, unpublish_mean) =
        rpc_since("ControllerUnpublishVolume", unpublish_before).await;
    let attach_waits = since_totals(attachment_wait_totals("attach").await, attach_waits_before);
    let detach_waits = since_totals(attachment_wait_totals("detach").await, detach_waits_before);
    let (waits, longest) = throttled(c, "csi-cinder-controllerplugin", "csi-attacher", since).await;
    proxy.clear_calls().await.unwrap();
    let cpu_theirs_before = MachineCpu::now();
    let (theirs, direct) = wave_through_openstack(c, cinder, &rooms).await;
    let cpu_theirs = MachineCpu::now();
    let recorded_theirs = proxy.calls().await.unwrap();
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
    let attach_note = format!(
        " (ControllerPublish answered {publishes:.0} times ({publish_codes}), in {publish_mean:.2} s on average; Nova's own attach until in-use {:.2} s on average; the attacher waited on its own API rate limit {waits} times over 1 s, longest {:.1} s)",
        mean(&direct.0),
        longest.as_secs_f64()
    );
    let detach_note = format!(
        " (ControllerUnpublish answered {unpublishes:.0} times, in {unpublish_mean:.2} s on average)"
    );
    let segments: [(&str, &[Duration], &[Duration], &str); 8] = [
        (
            "created until its PV existed (the scheduler's choice of a node, the provisioner, our CreateVolume, Cinder)",
            &zero,
            &timeline.pv_made,
            "",
        ),
        (
            "until its VolumeAttachment existed (the claim bound, the pod bound to its node, the attach-detach controller)",
            &timeline.pv_made,
            &timeline.attachment_made,
            "",
        ),
        (
            "until attached (external attacher, our ControllerPublish, Nova)",
            &timeline.attachment_made,
            &timeline.attached,
            &attach_note,
        ),
        (
            "until Running (kubelet: our NodeStage and NodePublish, the container's start)",
            &timeline.attached,
            &timeline.running,
            "",
        ),
        (
            "after the scale down, until the pod was gone (kubelet: its container stopped, our NodeUnpublish and NodeUnstage)",
            &zero,
            &timeline.pod_gone,
            "",
        ),
        (
            "until its node no longer reported the volume in use (kubelet's node status)",
            &timeline.pod_gone,
            &timeline.unreported,
            "",
        ),
        (
            "until its detach was asked (the attach-detach controller)",
            &timeline.unreported,
            &timeline.detach_asked,
            "",
        ),
        (
            "until detached (external attacher, our ControllerUnpublish, Nova)",
            &timeline.detach_asked,
            &timeline.detached,
            &detach_note,
        ),
    ];
    println!();
    println!("where a pod of the wave spent its time, 50 / 90 / 99 / 100 % (s):");
    for (what, from, to, note) in segments {
        println!("  {what}: {}{note}", marks(&quantiles(&segment(from, to))));
    }
    // where ControllerPublish's and ControllerUnpublish's time went: the
    // wait for Cinder to show the change, and the calls before it
    println!(
        "our ControllerPublish, {publish_mean:.2} s on average: waiting for Cinder to show the attachment {:.2} s ({:.0} waits), before that {:.2} s (the volume read, the server's listing, Nova's attach call); our ControllerUnpublish, {unpublish_mean:.2} s: Nova's detach call and the wait until Cinder no longer shows it {:.2} s ({:.0})",
        attach_waits.1,
        attach_waits.0,
        publish_mean - attach_waits.1 * attach_waits.0 / publishes.max(1.0),
        detach_waits.1,
        detach_waits.0
    );
    let openstack =
        |r: &&CallRecord| r.path.starts_with("/volume") || r.path.starts_with("/compute");
    let ours_calls: Vec<CallRecord> = recorded.iter().filter(openstack).cloned().collect();
    let theirs_calls: Vec<CallRecord> = recorded_theirs.iter().filter(openstack).cloned().collect();
    println!(
        "each call's time at the fault proxy (queued at the API and served), through Kubernetes: {}",
        call_times(&ours_calls)
    );
    println!(
        "straight through Cinder and Nova: {}",
        call_times(&theirs_calls)
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
    println!(
        "this machine during the wave through Kubernetes: {}; straight through Cinder and Nova: {}",
        cpu_before.until(&cpu_ours),
        cpu_theirs_before.until(&cpu_theirs)
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
    // the bench's own client reaches OpenStack as the plugins do: through
    // the fault proxy (which counts its calls too)
    let session = c.member_via_proxy().unwrap();
    let (direct_cinder, direct_manila) = (
        BlockStorage::new(session.clone()),
        SharedFileSystems::new(session.clone()),
    );
    println!(
        "| N | Bound 50 / 90 / 99 / 100 % (s) | Cinder's own (s) | ratio at 100 % | volumes gone after deletion, ours / Cinder's (s) | Cinder calls per claim, ours / the bench's client's |"
    );
    println!("| --- | --- | --- | --- | --- | --- |");
    let mut where_it_went = Vec::new();
    let manila = c.manila().unwrap();
    for n in sizes().into_iter().filter(|_| part("cinder")) {
        // both sides start from a quiet cloud (what came before finished)
        let quiet_ours = quiet_cloud(&cinder, &manila, &proxy).await;
        let before = controller_rpc_totals(CINDER_CONTROLLER_METRICS, "CreateVolume").await;
        let since = Instant::now();
        let usage_before = cinder_plugin_usage(true);
        let cpu_before = MachineCpu::now();
        let kcm_log = controller_manager_log_end(&c);
        let ours = through_kubernetes(&c, &cinder, n).await;
        let cpu_ours = MachineCpu::now();
        let (kcm_waits, kcm_longest) = controller_manager_throttled(&c, kcm_log);
        let usage_after = cinder_plugin_usage(true);
        let (creates, create_mean) = rpc_since("CreateVolume", before).await;
        let (waits, longest) =
            throttled(&c, "csi-cinder-controllerplugin", "csi-provisioner", since).await;
        let calls = calls_to(&proxy, "/volume").await;
        let calls_ours = calls_by_kind(&calls, n);
        // our deletions finished before OpenStack's own side starts
        let quiet_theirs = quiet_cloud(&cinder, &manila, &proxy).await;
        let cpu_theirs_before = MachineCpu::now();
        let theirs = through_cinder(&direct_cinder, &cinder, n).await;
        let cpu_theirs = MachineCpu::now();
        let theirs_calls = calls_to(&proxy, "/volume").await;
        let q = burst_row(n, &ours, &theirs, [calls.len(), theirs_calls.len()], "");
        where_it_went.push(format!(
            "N = {n}: the cloud quiet {:.1} s before ours, {:.1} s before Cinder's own; PVs made (CreateVolume answered) 50 / 90 / 99 / 100 % after {} s, claims Bound {} s; CreateVolume answered {creates:.0} times, in {create_mean:.2} s on average (Cinder's own create until available: {:.2} s); the provisioner waited on its own API rate limit {waits} times over 1 s (longest {:.1} s), the controller-manager (which binds the claims) {kcm_waits} times (longest {:.1} s); the controller: {:.2} s of CPU and {:+.1} MiB of memory per 100 claims made and deleted ({:.1} MiB after); this machine, through Kubernetes: {}; straight through Cinder: {}; Cinder calls per claim, ours: {calls_ours}; the bench's client's: {}",
            quiet_ours.as_secs_f64(),
            quiet_theirs.as_secs_f64(),
            marks(&quantiles(&ours.made)),
            marks(&q),
            mean(&theirs.ready),
            longest.as_secs_f64(),
            kcm_longest.as_secs_f64(),
            (usage_after.1 - usage_before.1) * 100.0 / n as f64,
            (usage_after.0 - usage_before.0) * 100.0 / n as f64,
            usage_after.0,
            cpu_before.until(&cpu_ours),
            cpu_theirs_before.until(&cpu_theirs),
            calls_by_kind(&theirs_calls, n)
        ));
    }
    println!();
    for line in where_it_went {
        println!("{line}");
    }

    // the same for CephFS shares
    println!();
    println!(
        "| N (CephFS) | Bound 50 / 90 / 99 / 100 % (s) | Manila's own, until the cephx rule is active (s) | ratio at 100 % | shares gone after deletion, ours / Manila's (s) | Manila calls per claim, ours / the bench's client's |"
    );
    println!("| --- | --- | --- | --- | --- | --- |");
    let mut manila_errors = Vec::new();
    for n in share_sizes().into_iter().filter(|_| part("cephfs")) {
        let quiet_ours = quiet_cloud(&cinder, &manila, &proxy).await;
        let cpu_before = MachineCpu::now();
        let ours = shares_through_kubernetes(&c, &manila, n).await;
        let cpu_ours = MachineCpu::now();
        let calls = calls_to(&proxy, "/share").await;
        let quiet_theirs = quiet_cloud(&cinder, &manila, &proxy).await;
        let cpu_theirs_before = MachineCpu::now();
        let (theirs, failed) = shares_through_manila(&direct_manila, &manila, n).await;
        let cpu_theirs = MachineCpu::now();
        let theirs_calls = calls_to(&proxy, "/share").await;
        // each share Manila failed is made again, on both sides: our
        // creates past N are ours it failed
        let ours_failed = calls
            .iter()
            .filter(|k| k.starts_with("POST ") && k.ends_with("/shares"))
            .count()
            .saturating_sub(n);
        manila_errors.push(format!(
            "N = {n}: the cloud quiet {:.1} s before ours, {:.1} s before Manila's own; Manila put {ours_failed} of our shares and {failed} of the bench's client's in error (each deleted and made again, as the driver does); this machine, through Kubernetes: {}; straight through Manila: {}; Manila calls per claim, ours: {}; the bench's client's: {}",
            quiet_ours.as_secs_f64(),
            quiet_theirs.as_secs_f64(),
            cpu_before.until(&cpu_ours),
            cpu_theirs_before.until(&cpu_theirs),
            calls_by_kind(&calls, n),
            calls_by_kind(&theirs_calls, n)
        ));
        // a ratio is like with like only where Manila failed about as many
        // shares on both sides: otherwise it says so, with both counts
        let unequal = ours_failed.abs_diff(failed) > (n / 10).max(1);
        let note = format!(
            " (Manila failed {ours_failed} / {failed}{})",
            if unequal { ": not like with like" } else { "" }
        );
        burst_row(n, &ours, &theirs, [calls.len(), theirs_calls.len()], &note);
    }

    for line in manila_errors {
        println!("{line}");
    }
    if part("wave") {
        attach_wave(&c, &direct_cinder).await;
    }
    if part("churn") {
        churn(&c, &cinder, if bench_quick() { 1 } else { 10 }).await;
    }
    if part("snapshots") {
        snapshots_and_expansion(&c, &direct_cinder, if bench_quick() { 2 } else { 50 }).await;
    }
    if part("move") {
        let moves = if bench_quick() { 1 } else { 5 };
        let mut shares = Vec::new();
        for _ in 0..moves {
            shares.extend(timeline::one_move(&c, &direct_cinder, None).await);
        }
        // the same moves through the floor driver (full mode: the quick
        // one only proves the part runs)
        let mut floor_shares = Vec::new();
        if !bench_quick()
            && !shares.is_empty()
            && let Some(floor) = floor::Floor::deploy(&c).await
        {
            for _ in 0..moves {
                floor_shares.extend(timeline::one_move(&c, &direct_cinder, Some(&floor)).await);
            }
            floor.remove(&c).await;
        }
        timeline::print_medians(&shares, &floor_shares);
    }
    c.kubectl(&["delete", "storageclass", CLASS, "--ignore-not-found"])
        .await
        .unwrap();
}
