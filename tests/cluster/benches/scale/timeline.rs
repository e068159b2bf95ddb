//! Where one move's time goes (issue 38, item 5): a StatefulSet's pod with
//! a Cinder claim moved from node A to node B of one zone (A cordoned, the
//! pod deleted), drawn as one timeline from what the apiserver reported
//! (watched), our plugins' log lines for the volume (each RPC that changes
//! something logs "answered OK" with its time) and the OpenStack calls the
//! fault proxy saw (each with its arrival and its answer); every
//! millisecond from the delete until the pod runs on B is given to one of
//! Kubernetes, our node plugins, our controller inside an OpenStack call,
//! or our controller between its calls (Nova's work under way, and how
//! late our polls saw it). Against OpenStack's own time for the same
//! detach and attach straight through Nova.

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use cluster_tests::Cluster;
use cluster_tests::nodes::stateful_set;
use openstack_client::cinder::BlockStorage;
use openstack_emulator::CallRecord;

use super::cost::suite_logs;
use super::direct::move_through_nova;
use super::floor::{FLOOR_CLASS, Floor, floor_app};
use super::watch::Watch;

const CLASS: &str = "csi-cinder-sc-delete";
const MINUTE: Duration = Duration::from_secs(60);

/// Who a millisecond of the move belongs to, in the order they are told.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Owner {
    Kubernetes,
    NodePlugin,
    OpenStackCall,
    BetweenCalls,
}

impl Owner {
    fn says(self) -> &'static str {
        match self {
            Owner::Kubernetes => {
                "Kubernetes (kubelet, the attach-detach controller, the external attacher, the scheduler, the container)"
            }
            Owner::NodePlugin => {
                "our node plugins (NodeUnpublish, NodeUnstage, NodeStage, NodePublish)"
            }
            Owner::OpenStackCall => {
                "our controller inside OpenStack API calls (queued at the API and served)"
            }
            Owner::BetweenCalls => {
                "our controller between its calls (Nova's detach or attach under way, and how late our polls saw it done)"
            }
        }
    }
}

/// One RPC of ours for the volume, from its log line: its name, and its
/// start and end in milliseconds since the move began.
struct Rpc {
    method: String,
    start: i64,
    end: i64,
}

/// What the apiserver reported during the move, in milliseconds since it
/// began.
#[derive(Default)]
struct Marks {
    deleting: Option<i64>,
    old_gone: Option<i64>,
    created: Option<i64>,
    scheduled: Option<i64>,
    running: Option<i64>,
    detach_asked: Option<i64>,
    detached: Option<i64>,
    attachment_made: Option<i64>,
    attached: Option<i64>,
}

fn ms(d: Duration) -> i64 {
    d.as_millis() as i64
}

fn unix_ms(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH).unwrap_or_default().as_millis() as i64
}

/// Two nodes of one zone, and the zone: a volume moves only within its
/// zone.
async fn pair_in_a_zone(c: &Cluster) -> Option<(String, String, String)> {
    let zones = c.node_zones().await.unwrap();
    let mut by_zone: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (node, zone) in &zones {
        by_zone
            .entry(zone.as_str())
            .or_default()
            .push(node.as_str());
    }
    by_zone
        .iter()
        .find(|(_, nodes)| nodes.len() >= 2)
        .map(|(zone, nodes)| (nodes[0].to_string(), nodes[1].to_string(), zone.to_string()))
}

/// One move's shares (s): all of it, Kubernetes', our controller's on
/// the move's path, and OpenStack's own for the same detach and attach;
/// and the part from the detach's ask until Running (what comes before it
/// is Kubernetes' alone, up to 10 s of it waiting for kubelet's next
/// node status: the part of a move that varies most between moves).
pub(super) struct Shares {
    pub(super) total: f64,
    pub(super) from_detach: f64,
    pub(super) kubernetes: f64,
    pub(super) controller: f64,
    pub(super) openstack_own: f64,
}

/// One move, its timeline printed; its shares. With `floor`, the same
/// move through the floor driver (whose cloud answers at once): no
/// OpenStack's own to compare with.
pub(super) async fn one_move(
    c: &Cluster,
    cinder: &BlockStorage,
    floor: Option<&Floor>,
) -> Option<Shares> {
    let Some((a, b, zone)) = pair_in_a_zone(c).await else {
        println!("one move's timeline: no two nodes share a zone here, nothing to move");
        return None;
    };
    let (class, prefix) = match floor {
        Some(_) => (FLOOR_CLASS, "scale-floor-move"),
        None => (CLASS, "scale-move"),
    };
    let ns = c.namespace(prefix).await.unwrap();
    let n = ns.name.clone();
    let keep_off_b = c.cordon(&b).await.unwrap();
    c.apply_in(
        &n,
        &stateful_set(
            "app",
            class,
            &[&a, &b],
            "while true; do date >> /data/log; sleep 1; done",
        ),
    )
    .await
    .unwrap();
    let pod = c.wait_running(&n, "app-0", 3 * MINUTE).await.unwrap();
    let old_uid = pod["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let pv = c.volume_of(&n, "data-app-0", MINUTE).await.unwrap();
    let pv_name = pv["metadata"]["name"].as_str().unwrap().to_string();
    let volume = pv["spec"]["csi"]["volumeHandle"]
        .as_str()
        .unwrap()
        .to_string();
    let servers = [c.server_of(&a).unwrap(), c.server_of(&b).unwrap()];
    drop(keep_off_b);
    let _keep_off_a = c.cordon(&a).await.unwrap();
    let proxy = c.fault_proxy().unwrap();
    match floor {
        Some(f) => f.clear_calls(),
        None => proxy.clear_calls().await.unwrap(),
    }

    let started = Instant::now();
    let wall_start = unix_ms(SystemTime::now());
    let mut pods = Watch::start(c, "pods", &n, started);
    let mut attachments = Watch::start(c, "volumeattachments", &n, started);
    // both watches list what is there before the delete is asked
    tokio::time::sleep(Duration::from_millis(500)).await;
    let deleted_at = ms(started.elapsed());
    c.kubectl(&["delete", "pod", "app-0", "-n", &n, "--wait=false"])
        .await
        .unwrap();
    let marks = watch_the_move(
        &mut pods,
        &mut attachments,
        started,
        &old_uid,
        &pv_name,
        &a,
        &b,
    )
    .await;
    drop((pods, attachments));
    let calls = match floor {
        Some(f) => f.calls(),
        None => proxy.calls().await.unwrap(),
    };
    let calls: Vec<CallRecord> = calls
        .into_iter()
        .filter(|r| {
            (r.path.starts_with("/volume") || r.path.starts_with("/compute"))
                && (r.path.contains(&volume) || servers.iter().any(|s| r.path.contains(s)))
        })
        .collect();
    let end = marks.running.unwrap();
    // the move's own RPCs: those that ended after the delete was asked
    // (the pod's first start on A is not part of it)
    let rpcs: Vec<Rpc> = our_rpcs(c, floor.is_some(), &volume, started, wall_start)
        .await
        .into_iter()
        .filter(|r| r.end > deleted_at && r.start < end)
        .collect();
    // a controller RPC that began once what it asks for was already
    // recorded (the attacher asking again while its cache lagged behind
    // its own write) ran beside the move, not on its path
    let off_path = |r: &Rpc| match r.method.as_str() {
        "ControllerPublishVolume" => marks.attached.is_some_and(|t| r.start >= t),
        "ControllerUnpublishVolume" => marks.detached.is_some_and(|t| r.start >= t),
        _ => false,
    };
    let calls_ms: Vec<(i64, i64)> = calls
        .iter()
        .map(|r| {
            let end = r.at_ms as i64 - wall_start;
            (end - r.took_ms as i64, end)
        })
        .collect();

    // every millisecond from the delete until Running, to one owner
    let spans = |node: bool| -> Vec<(i64, i64)> {
        rpcs.iter()
            .filter(|r| r.method.starts_with("Node") == node && !off_path(r))
            .map(|r| (r.start, r.end))
            .collect()
    };
    let (node_spans, controller_spans) = (spans(true), spans(false));
    let within = |spans: &[(i64, i64)], t: i64| spans.iter().any(|&(s, e)| s <= t && t < e);
    let mut owned: BTreeMap<Owner, i64> = BTreeMap::new();
    for t in deleted_at..end {
        let owner = if within(&node_spans, t) {
            Owner::NodePlugin
        } else if within(&controller_spans, t) {
            if within(&calls_ms, t) {
                Owner::OpenStackCall
            } else {
                Owner::BetweenCalls
            }
        } else {
            Owner::Kubernetes
        };
        *owned.entry(owner).or_default() += 1;
    }

    // the floor's OpenStack takes no time: nothing to compare with
    let theirs = match floor {
        Some(_) => (Duration::ZERO, Duration::ZERO),
        None => move_through_nova(c, cinder, &servers, &zone).await,
    };
    ns.close().await.unwrap();

    let secs = |t: i64| (t - deleted_at) as f64 / 1000.0;
    let mut lines: Vec<(i64, String)> = Vec::new();
    let mut mark = |at: Option<i64>, what: &str| {
        if let Some(t) = at {
            lines.push((t, what.to_string()));
        }
    };
    mark(Some(deleted_at), "the pod's delete asked");
    mark(
        marks.deleting,
        "the pod marked for deletion (kubelet stops its container: 2 s grace)",
    );
    mark(
        marks.created,
        "its replacement created (the StatefulSet controller)",
    );
    mark(
        marks.scheduled,
        &format!("the replacement scheduled to {b}"),
    );
    mark(marks.old_gone, &format!("the old pod gone from {a}"));
    mark(
        marks.detach_asked,
        &format!(
            "the VolumeAttachment to {a} deleted: detach asked (the attach-detach controller)"
        ),
    );
    mark(
        marks.detached,
        &format!("the VolumeAttachment to {a} gone: detached"),
    );
    mark(
        marks.attachment_made,
        &format!("the VolumeAttachment to {b} made (the attach-detach controller)"),
    );
    mark(
        marks.attached,
        &format!("the VolumeAttachment to {b} attached"),
    );
    mark(marks.running, &format!("Running on {b}"));
    for r in &rpcs {
        let inside: Vec<&CallRecord> = calls
            .iter()
            .zip(&calls_ms)
            .filter(|(_, (s, e))| *s >= r.start - 5 && *e <= r.end + 5)
            .map(|(c, _)| c)
            .collect();
        let in_calls: i64 = calls_ms
            .iter()
            .filter(|(s, e)| *s >= r.start - 5 && *e <= r.end + 5)
            .map(|(s, e)| e - s)
            .sum();
        let detail = if inside.is_empty() {
            String::new()
        } else {
            let kinds: Vec<String> = inside.iter().map(|c| short(c)).collect();
            format!(
                ": {} OpenStack calls, {:.2} s in them ({})",
                inside.len(),
                in_calls as f64 / 1000.0,
                kinds.join(", ")
            )
        };
        let aside = if off_path(r) {
            " [beside the move: what it asks for was already recorded]"
        } else {
            ""
        };
        lines.push((
            r.start,
            format!(
                "{} begins ({:.2} s){detail}{aside}",
                r.method,
                (r.end - r.start) as f64 / 1000.0
            ),
        ));
    }
    lines.sort_by_key(|l| l.0);
    println!();
    println!(
        "one move of a StatefulSet's pod with a Cinder claim from {a} to {b} ({a} cordoned, the pod deleted){}: {:.1} s from the delete until Running on {b}",
        if floor.is_some() {
            ", through the floor driver (its cloud answers at once)"
        } else {
            ""
        },
        secs(end)
    );
    for (t, what) in &lines {
        println!("  {:6.2} s  {what}", secs(*t));
    }
    let total = (end - deleted_at).max(1) as f64;
    for (owner, took) in &owned {
        println!(
            "  {:5.2} s ({:4.1} %)  {}",
            *took as f64 / 1000.0,
            100.0 * *took as f64 / total,
            owner.says()
        );
    }
    let controller: i64 = owned
        .iter()
        .filter(|(o, _)| matches!(o, Owner::OpenStackCall | Owner::BetweenCalls))
        .map(|(_, t)| t)
        .sum();
    let own = theirs.0 + theirs.1;
    let from_detach = marks
        .detach_asked
        .map_or(0.0, |t| (end - t) as f64 / 1000.0);
    if floor.is_some() {
        println!(
            "the floor's controller took {:.2} s of the move between and inside its calls to a cloud that answers at once",
            controller as f64 / 1000.0
        );
        return Some(Shares {
            total: total / 1000.0,
            from_detach,
            kubernetes: *owned.get(&Owner::Kubernetes).unwrap_or(&0) as f64 / 1000.0,
            controller: controller as f64 / 1000.0,
            openstack_own: 0.0,
        });
    }
    println!(
        "OpenStack's own for the same work, straight through Nova one after the other (polled every {} ms): detach {:.2} s, attach {:.2} s, {:.2} s in all; our controller's share of the move {:.2} s: {:.2} times OpenStack's own (goal: at most 1.2). Kubernetes' share, {:.2} s (read off this move's timeline; the floor a driver whose cloud answers at once meets is measured after the moves, in full mode)",
        super::POLL.as_millis(),
        theirs.0.as_secs_f64(),
        theirs.1.as_secs_f64(),
        own.as_secs_f64(),
        controller as f64 / 1000.0,
        controller as f64 / 1000.0 / own.as_secs_f64().max(0.001),
        *owned.get(&Owner::Kubernetes).unwrap_or(&0) as f64 / 1000.0
    );
    Some(Shares {
        total: total / 1000.0,
        from_detach,
        kubernetes: *owned.get(&Owner::Kubernetes).unwrap_or(&0) as f64 / 1000.0,
        controller: controller as f64 / 1000.0,
        openstack_own: own.as_secs_f64(),
    })
}

/// The medians of our moves against OpenStack's own, and against the
/// floor's where it was measured.
pub(super) fn print_medians(shares: &[Shares], floor_shares: &[Shares]) {
    if !shares.is_empty() {
        let median_of = |shares: &[Shares], f: &dyn Fn(&Shares) -> f64| {
            let mut v: Vec<f64> = shares.iter().map(f).collect();
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let median = |f: &dyn Fn(&Shares) -> f64| median_of(shares, f);
        println!(
            "{} moves, medians: {:.1} s in all; Kubernetes {:.1} s; our controller on the move's path {:.2} s against OpenStack's own {:.2} s: {:.2} times (each move's: {})",
            shares.len(),
            median(&|s| s.total),
            median(&|s| s.kubernetes),
            median(&|s| s.controller),
            median(&|s| s.openstack_own),
            median(&|s| s.controller / s.openstack_own.max(0.001)),
            shares
                .iter()
                .map(|s| format!("{:.2}", s.controller / s.openstack_own.max(0.001)))
                .collect::<Vec<_>>()
                .join(", ")
        );
        if !floor_shares.is_empty() {
            // from the detach's ask: before it, both drivers' moves
            // wait alike for kubelet's next node status (up to 10 s,
            // at random), which would drown the difference
            let floor_from_detach = median_of(floor_shares, &|s| s.from_detach);
            let above = median(&|s| s.from_detach) - floor_from_detach;
            println!(
                "the floor (the same {} moves through a second driver of ours whose cloud answers at once), medians: {:.1} s in all (each: {}); Kubernetes {:.1} s; its controller {:.2} s; from the detach's ask until Running {:.2} s, ours {:.2} s (each move, ours / the floor's: {}). Our move above the floor from the detach's ask: {:.2} s against OpenStack's own {:.2} s: {:.2} times (goal: at most 1.2)",
                floor_shares.len(),
                median_of(floor_shares, &|s| s.total),
                floor_shares
                    .iter()
                    .map(|s| format!("{:.1}", s.total))
                    .collect::<Vec<_>>()
                    .join(", "),
                median_of(floor_shares, &|s| s.kubernetes),
                median_of(floor_shares, &|s| s.controller),
                floor_from_detach,
                median(&|s| s.from_detach),
                shares
                    .iter()
                    .zip(floor_shares)
                    .map(|(o, f)| format!("{:.2} / {:.2}", o.from_detach, f.from_detach))
                    .collect::<Vec<_>>()
                    .join(", "),
                above,
                median(&|s| s.openstack_own),
                above / median(&|s| s.openstack_own).max(0.001)
            );
        }
    }
}

/// A call as its method and the last two parts of its path, ids as
/// `{id}` (`GET volumes/{id}`, `POST {id}/os-volume_attachments`).
fn short(call: &CallRecord) -> String {
    let kind = super::call_kind(call);
    let (method, path) = kind.split_once(' ').unwrap_or((&kind, ""));
    let path = path.split('?').next().unwrap_or_default();
    let tail: Vec<&str> = path.rsplit('/').take(2).collect();
    format!(
        "{method} {}/{} {} ms",
        tail.get(1).unwrap_or(&""),
        tail[0],
        call.took_ms
    )
}

/// Follows the pods and VolumeAttachments until the replacement runs on
/// `b`.
async fn watch_the_move(
    pods: &mut Watch,
    attachments: &mut Watch,
    started: Instant,
    old_uid: &str,
    pv_name: &str,
    a: &str,
    b: &str,
) -> Marks {
    let deadline = started + 10 * MINUTE;
    let mut m = Marks::default();
    let first = |slot: &mut Option<i64>, at: Duration| {
        slot.get_or_insert(ms(at));
    };
    while m.running.is_none() {
        tokio::select! {
            change = pods.next(deadline) => {
                let Some(change) = change else { panic!("the move did not end within 10 minutes") };
                let o = &change.object;
                if o["metadata"]["uid"] == old_uid {
                    if change.deleted {
                        first(&mut m.old_gone, change.at);
                    } else if !o["metadata"]["deletionTimestamp"].is_null() {
                        first(&mut m.deleting, change.at);
                    }
                } else if !change.deleted {
                    first(&mut m.created, change.at);
                    if o["spec"]["nodeName"] == b {
                        first(&mut m.scheduled, change.at);
                    }
                    if o["spec"]["nodeName"] == b && o["status"]["phase"] == "Running" {
                        first(&mut m.running, change.at);
                    }
                }
            }
            change = attachments.next(deadline) => {
                let Some(change) = change else { panic!("the move did not end within 10 minutes") };
                let o = &change.object;
                if o["spec"]["source"]["persistentVolumeName"] != pv_name {
                    continue;
                }
                if o["spec"]["nodeName"] == a {
                    if change.deleted {
                        first(&mut m.detached, change.at);
                    } else if !o["metadata"]["deletionTimestamp"].is_null() {
                        first(&mut m.detach_asked, change.at);
                    }
                } else if o["spec"]["nodeName"] == b && !change.deleted {
                    first(&mut m.attachment_made, change.at);
                    if o["status"]["attached"] == true {
                        first(&mut m.attached, change.at);
                    }
                }
            }
        }
    }
    m
}

/// Our plugins' RPCs for `volume` since `started` (the floor driver's
/// with `floor`), from their log lines ("answered OK", with the time each
/// took), in milliseconds since `wall_start`.
async fn our_rpcs(
    c: &Cluster,
    floor: bool,
    volume: &str,
    started: Instant,
    wall_start: i64,
) -> Vec<Rpc> {
    let mut rpcs = Vec::new();
    for app in ["csi-cinder-controllerplugin", "csi-cinder-nodeplugin"] {
        let app = if floor {
            floor_app(app)
        } else {
            app.to_string()
        };
        let logs = suite_logs(c, &app, "cinder-csi-plugin", started).await;
        for line in logs.lines() {
            let Ok(l) = serde_json::from_str::<serde_json::Value>(line) else {
                continue;
            };
            if l["message"] != "answered OK" || l["span"]["volume_id"] != volume {
                continue;
            }
            let (Some(at), Some(took)) = (
                l["timestamp"].as_str().and_then(|t| {
                    time::OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339)
                        .ok()
                }),
                l["duration_ms"].as_f64(),
            ) else {
                continue;
            };
            let end = (at.unix_timestamp_nanos() / 1_000_000) as i64 - wall_start;
            rpcs.push(Rpc {
                method: l["span"]["name"].as_str().unwrap_or_default().to_string(),
                start: end - took.round() as i64,
                end,
            });
        }
    }
    rpcs.sort_by_key(|r| r.start);
    rpcs
}
