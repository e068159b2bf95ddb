//! Many nodes: volumes that follow their pods between nodes, shares read
//! on several nodes at once, and one node's trouble staying on that node.
//! Node A runs in the host's namespaces, the others each in their own
//! network and mount namespaces, each a Nova server of the test cloud
//! seeing only the disks attached to it (tests/cluster/cluster.py).
//!
//! Needs `tests/cluster/cluster.py up` with two nodes or more (the
//! default); run with `--ignored --test-threads=1`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use cluster_tests::nodes::{deployment, preferring, stateful_set};
use cluster_tests::{Cluster, PodOptions, SUITE_NAMESPACE, claim, placed_on, pod, prober};
use serde_json::Value;

const MINUTE: Duration = Duration::from_secs(60);

fn name(v: &Value) -> String {
    v["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// The cluster and its nodes (A first); at least two.
async fn cluster() -> (Cluster, Vec<String>) {
    let c = Cluster::from_env().unwrap();
    let nodes = c.nodes().await.unwrap();
    assert!(
        nodes.len() >= 2,
        "the multi-node scenarios need two nodes or more; the cluster has {nodes:?}"
    );
    (c, nodes)
}

/// The servers holding an attachment of the volume, as Cinder and Nova
/// each say: (Cinder's attachments, Nova's servers listing it).
async fn holders(c: &Cluster, volume: &str, servers: &[String]) -> (Vec<String>, Vec<String>) {
    let cinder = c.cinder().unwrap();
    let nova = c.nova().unwrap();
    let v = cinder.get_volume(volume).await.unwrap();
    let by_cinder: Vec<String> = v.attached_servers().map(str::to_string).collect();
    let mut by_nova = Vec::new();
    for s in servers {
        let atts = nova.list_volume_attachments(s).await.unwrap();
        if atts.iter().any(|a| a.volume_id == volume) {
            by_nova.push(s.clone());
        }
    }
    (by_cinder, by_nova)
}

/// What the sampler saw of a volume's holders while a pod moved.
#[derive(Debug, Default)]
struct HolderSamples {
    /// the most servers seen holding it at once, by either service
    most: usize,
    seen_then: String,
    samples: usize,
    /// when the first server (`servers[0]`) was last seen holding it
    first_released_at: Option<SystemTime>,
}

/// Samples who holds the volume until stopped.
fn sample_holders(
    c: &Cluster,
    volume: &str,
    servers: Vec<String>,
) -> (Arc<AtomicBool>, tokio::task::JoinHandle<HolderSamples>) {
    let stop = Arc::new(AtomicBool::new(false));
    let (c, volume, flag) = (c.clone(), volume.to_string(), stop.clone());
    let task = tokio::spawn(async move {
        let mut out = HolderSamples::default();
        while !flag.load(Ordering::Relaxed) {
            let before = SystemTime::now();
            let (by_cinder, by_nova) = holders(&c, &volume, &servers).await;
            let distinct: BTreeSet<&String> = by_cinder.iter().chain(&by_nova).collect();
            out.samples += 1;
            if distinct.len() > out.most {
                out.most = distinct.len();
                out.seen_then = format!("Cinder {by_cinder:?}, Nova {by_nova:?}");
            }
            if distinct.contains(&servers[0]) {
                out.first_released_at = None;
            } else if out.first_released_at.is_none() {
                out.first_released_at = Some(before);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        out
    });
    (stop, task)
}

/// Seconds since the epoch of an RFC 3339 UTC time (`2026-11-26T13:20:01Z`,
/// fractions ignored), as the API writes event times.
fn rfc3339_secs(t: &str) -> Option<u64> {
    let num = |r: std::ops::Range<usize>| t.get(r)?.parse::<i64>().ok();
    let (y, m, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hh, mm, ss) = (num(11..13)?, num(14..16)?, num(17..19)?);
    // days from the civil date (Howard Hinnant's algorithm)
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (m + if m > 2 { -3 } else { 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    u64::try_from(days * 86_400 + hh * 3600 + mm * 60 + ss).ok()
}

/// The events of a namespace whose message contains `needle`: (message,
/// when it was last reported, in seconds since the epoch).
async fn events_saying(c: &Cluster, ns: &str, needle: &str) -> Vec<(String, Option<u64>)> {
    c.list("events", &["-n", ns])
        .await
        .unwrap()
        .iter()
        .filter(|e| e["message"].as_str().is_some_and(|m| m.contains(needle)))
        .map(|e| {
            let when = ["lastTimestamp", "eventTime", "firstTimestamp"]
                .iter()
                .find_map(|k| e[*k].as_str().and_then(rfc3339_secs));
            (format!("{}: {}", e["reason"], e["message"]), when)
        })
        .collect()
}

// ------------------------------------------------------ RWO follows its pod

#[tokio::test]
#[ignore = "needs the cluster tier with two nodes or more: tests/cluster/cluster.py up"]
async fn an_rwo_volume_follows_its_pod_to_another_node_never_attached_twice() {
    let (c, nodes) = cluster().await;
    let (a, b) = (nodes[0].as_str(), nodes[1].as_str());
    let ns = c.namespace("follow").await.unwrap();
    let n = ns.name.clone();
    // first on A: B cordoned until the pod runs
    let cordon_b = c.cordon(b).await.unwrap();
    c.apply_in(
        &n,
        &stateful_set(
            "app",
            "csi-cinder-sc-delete",
            &[a, b],
            "[ -f /data/token ] || cat /proc/sys/kernel/random/uuid > /data/token; while true; do date >> /data/log; sleep 1; done",
        ),
    )
    .await
    .unwrap();
    let first = c.wait_running(&n, "app-0", 3 * MINUTE).await.unwrap();
    assert_eq!(first["spec"]["nodeName"], a, "the pod started on A");
    let token = c.exec(&n, "app-0", "cat /data/token").await.unwrap();
    let pv = c.volume_of(&n, "data-app-0", MINUTE).await.unwrap();
    let volume = pv["spec"]["csi"]["volumeHandle"]
        .as_str()
        .unwrap()
        .to_string();
    let (server_a, server_b) = (c.server_of(a).unwrap(), c.server_of(b).unwrap());
    assert_eq!(
        holders(&c, &volume, &[server_a.clone(), server_b.clone()]).await,
        (vec![server_a.clone()], vec![server_a.clone()]),
        "attached to A's server only"
    );

    // A cordoned, the pod deleted: its successor runs on B with the data
    drop(cordon_b);
    let _cordon_a = c.cordon(a).await.unwrap();
    let (stop, sampler) = sample_holders(&c, &volume, vec![server_a.clone(), server_b.clone()]);
    let moved = Instant::now();
    let old_uid = first["metadata"]["uid"].as_str().unwrap().to_string();
    c.kubectl(&["delete", "pod", "app-0", "-n", &n, "--wait=false"])
        .await
        .unwrap();
    c.wait_running_on(&n, "app-0", b, &old_uid).await.unwrap();
    let took = moved.elapsed();
    stop.store(true, Ordering::Relaxed);
    let seen = sampler.await.unwrap();
    println!(
        "pod moved from {a} to {b} in {took:?} (deleted → Running); {} samples of Cinder and Nova",
        seen.samples
    );
    assert_eq!(
        c.exec(&n, "app-0", "cat /data/token").await.unwrap(),
        token,
        "the data followed the pod"
    );
    assert!(
        seen.most <= 1,
        "two servers held the volume at once: {}",
        seen.seen_then
    );
    assert_eq!(
        holders(&c, &volume, &[server_a.clone(), server_b.clone()]).await,
        (vec![server_b.clone()], vec![server_b.clone()]),
        "attached to B's server only"
    );
    // Kubernetes' attach/detach controller says "Multi-Attach" once when
    // the new pod is scheduled while A's detach is still under way (the
    // old pod already gone): that is its design, for every driver. What
    // users report against the upstream driver is the lasting kind: a pod
    // still holding the volume elsewhere, or an attachment that never
    // goes. Neither may happen: no event names a pod, and none came after
    // A's server let the volume go.
    let multi = events_saying(&c, &n, "Multi-Attach").await;
    println!("Multi-Attach events: {multi:?}");
    assert!(
        multi
            .iter()
            .all(|(m, _)| !m.contains("already used by pod")),
        "a pod elsewhere still held the volume: {multi:?}"
    );
    assert!(multi.len() <= 1, "Multi-Attach reported again: {multi:?}");
    let released = seen
        .first_released_at
        .expect("A's server let the volume go")
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    for (m, when) in &multi {
        let when = when.unwrap_or_else(|| panic!("an event without a time: {m}"));
        assert!(
            when <= released + 1,
            "Multi-Attach reported {}s after A's server let the volume go: {m}",
            when.saturating_sub(released)
        );
    }
    let pv_name = name(&pv);
    assert!(
        c.node_mounts_containing(a, &pv_name).unwrap().is_empty(),
        "A still mounts the volume"
    );
    assert!(
        !c.node_mounts_containing(b, &pv_name).unwrap().is_empty(),
        "B mounts the volume"
    );
    ns.close().await.unwrap();
}

// ------------------------------------------------------- RWX across nodes

#[tokio::test]
#[ignore = "needs the cluster tier with two nodes or more: tests/cluster/cluster.py up"]
async fn a_cephfs_share_is_read_on_every_node_at_once_each_with_its_own_mount() {
    let (c, nodes) = cluster().await;
    let ns = c.namespace("rwx").await.unwrap();
    let n = ns.name.clone();
    let mut docs = vec![claim(
        "shared",
        "csi-manila-cephfs",
        "1Gi",
        "ReadWriteMany",
        false,
    )];
    docs.push(placed_on(
        &pod(
            "writer",
            "shared",
            "cat /proc/sys/kernel/random/uuid > /data/token; sleep 100000",
            PodOptions::default(),
        ),
        &[&nodes[0]],
    ));
    for (i, node) in nodes.iter().enumerate().skip(1) {
        docs.push(placed_on(
            &pod(
                &format!("reader-{i}"),
                "shared",
                "sleep 100000",
                PodOptions::default(),
            ),
            &[node],
        ));
    }
    c.apply_in(&n, &docs.join("---\n")).await.unwrap();
    c.wait_running(&n, "writer", 3 * MINUTE).await.unwrap();
    let token = c.exec(&n, "writer", "cat /data/token").await.unwrap();
    for (i, node) in nodes.iter().enumerate().skip(1) {
        let r = format!("reader-{i}");
        c.wait_running(&n, &r, 3 * MINUTE).await.unwrap();
        assert_eq!(
            c.exec(&n, &r, "cat /data/token").await.unwrap(),
            token,
            "{r} on {node} reads what A wrote"
        );
    }
    // a write on B is seen on A at once: one share, not copies
    c.exec(&n, "reader-1", "echo from-b > /data/from-b")
        .await
        .unwrap();
    assert_eq!(
        c.exec(&n, "writer", "cat /data/from-b")
            .await
            .unwrap()
            .trim(),
        "from-b"
    );

    let pv = c.volume_of(&n, "shared", MINUTE).await.unwrap();
    let share = pv["spec"]["csi"]["volumeHandle"]
        .as_str()
        .unwrap()
        .to_string();
    let mount_pods_of_share = || async {
        c.mount_pods()
            .await
            .unwrap()
            .into_iter()
            .filter(|p| {
                p["metadata"]["annotations"]["manila.csi.openstack.org/volume-id"] == share.as_str()
            })
            .map(|p| {
                p["spec"]["nodeName"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string()
            })
            .collect::<Vec<String>>()
    };
    let mut on: Vec<String> = mount_pods_of_share().await;
    on.sort();
    let mut want = nodes.clone();
    want.sort();
    assert_eq!(on, want, "one mount pod per node for the share");

    // B's reader gone: B's mount goes, A's stays and keeps working
    c.delete("pod", "reader-1", Some(&n)).await.unwrap();
    let b = nodes[1].clone();
    c.wait_for("B's mount pod of the share gone", 2 * MINUTE, || {
        let b = b.clone();
        let f = mount_pods_of_share();
        async move {
            let on = f.await;
            Ok(if on.contains(&b) {
                Err(format!("{on:?}"))
            } else {
                Ok(())
            })
        }
    })
    .await
    .unwrap();
    assert!(
        mount_pods_of_share().await.contains(&nodes[0]),
        "A's mount pod stays"
    );
    assert!(
        c.node_mounts_containing(&nodes[1], &name(&pv))
            .unwrap()
            .is_empty(),
        "B still mounts the share"
    );
    c.exec(&n, "writer", "echo again >> /data/token && sync")
        .await
        .unwrap();
    assert!(
        c.exec(&n, "writer", "cat /data/token")
            .await
            .unwrap()
            .contains("again")
    );
    ns.close().await.unwrap();
}

// -------------------------------------- one node's restart stays on that node

/// The node plugins' pods on `node`: name → (uid, restarts).
async fn plugins_on(c: &Cluster, node: &str) -> Vec<(String, String, i64)> {
    let mut out: Vec<(String, String, i64)> = c
        .list("pods", &["-n", SUITE_NAMESPACE])
        .await
        .unwrap()
        .iter()
        .filter(|p| name(p).contains("-nodeplugin-") && p["spec"]["nodeName"] == node)
        .map(|p| {
            let restarts = p["status"]["containerStatuses"]
                .as_array()
                .map(|s| s.iter().filter_map(|c| c["restartCount"].as_i64()).sum())
                .unwrap_or(0);
            (
                name(p),
                p["metadata"]["uid"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                restarts,
            )
        })
        .collect();
    out.sort();
    out
}

#[tokio::test]
#[ignore = "needs the cluster tier with two nodes or more: tests/cluster/cluster.py up"]
async fn restarting_one_nodes_plugins_leaves_the_other_nodes_volumes_untouched() {
    let (c, nodes) = cluster().await;
    let (a, b) = (nodes[0].as_str(), nodes[1].as_str());
    let ns = c.namespace("one-node").await.unwrap();
    let n = ns.name.clone();
    let docs = [
        claim("blk", "csi-cinder-sc-xfs", "1Gi", "ReadWriteOnce", false),
        claim("fs", "csi-manila-cephfs", "1Gi", "ReadWriteMany", false),
        placed_on(&prober("probe-cinder", "blk"), &[b]),
        placed_on(&prober("probe-cephfs", "fs"), &[b]),
    ];
    c.apply_in(&n, &docs.join("---\n")).await.unwrap();
    for p in ["probe-cinder", "probe-cephfs"] {
        let pod = c.wait_running(&n, p, 3 * MINUTE).await.unwrap();
        assert_eq!(pod["spec"]["nodeName"], b);
    }
    let on_b = plugins_on(&c, b).await;
    let on_a = plugins_on(&c, a).await;
    assert_eq!(on_a.len(), 3, "three node plugins on A: {on_a:?}");
    tokio::time::sleep(Duration::from_secs(3)).await;

    // A's node plugins replaced, as an upgrade rolling through A does
    let mut args = vec!["delete", "pods", "-n", SUITE_NAMESPACE, "--timeout=120s"];
    args.extend(on_a.iter().map(|(p, _, _)| p.as_str()));
    let restarted = Instant::now();
    c.kubectl(&args).await.unwrap();
    c.wait_for("A's node plugins back", 3 * MINUTE, || async {
        let now = plugins_on(&c, a).await;
        let ready = c
            .list("pods", &["-n", SUITE_NAMESPACE])
            .await?
            .iter()
            .filter(|p| name(p).contains("-nodeplugin-") && p["spec"]["nodeName"] == a)
            .all(|p| {
                p["status"]["containerStatuses"]
                    .as_array()
                    .is_some_and(|s| s.iter().all(|c| c["ready"] == true))
            });
        Ok(
            if now.len() == 3
                && ready
                && now
                    .iter()
                    .all(|(p, _, _)| !on_a.iter().any(|(o, _, _)| o == p))
            {
                Ok(())
            } else {
                Err(format!("{now:?}"))
            },
        )
    })
    .await
    .unwrap();
    println!("A's node plugins replaced in {:?}", restarted.elapsed());
    tokio::time::sleep(Duration::from_secs(3)).await;

    assert_eq!(
        plugins_on(&c, b).await,
        on_b,
        "B's node plugins were touched"
    );
    for p in ["probe-cinder", "probe-cephfs"] {
        let (gap, writes, fails) = c.probe_report(&n, p).await;
        println!("{p} on {b}: {writes} writes, {fails} failed, longest gap {gap:?}");
        assert_eq!(
            fails, 0,
            "{p} on B: writes failed while A's plugins restarted"
        );
        assert!(gap < Duration::from_secs(2), "{p} on B stalled {gap:?}");
        assert!(writes > 50, "{p}: {writes} writes");
    }
    ns.close().await.unwrap();
}

#[test]
fn event_times_are_read_as_the_api_writes_them() {
    assert_eq!(rfc3339_secs("1970-01-01T00:00:00Z"), Some(0));
    assert_eq!(rfc3339_secs("2026-11-26T13:20:01Z"), Some(1_795_699_201));
    assert_eq!(
        rfc3339_secs("2000-03-01T00:00:00.123456Z"),
        Some(951_868_800)
    );
    assert_eq!(rfc3339_secs("yesterday"), None);
}

// ------------------------------------------- attach limits steer the scheduler

/// The Cinder volumes a node still takes, as its CSINode says.
async fn cinder_allocatable(c: &Cluster, node: &str) -> i64 {
    let n = c.get("csinode", node, None).await.unwrap().unwrap();
    n["spec"]["drivers"]
        .as_array()
        .and_then(|d| d.iter().find(|d| d["name"] == "cinder.csi.openstack.org"))
        .and_then(|d| d["allocatable"]["count"].as_i64())
        .unwrap_or_else(|| panic!("no Cinder allocatable count on {node}: {n}"))
}

/// Some(node) once the pod runs; None once the scheduler holds it back
/// because a node's CSI volume limit is reached (its PodScheduled
/// condition); else what it waits for.
async fn scheduled_or_refused_for_volumes(
    c: &Cluster,
    ns: &str,
    pod: &str,
) -> cluster_tests::Result<Result<Option<String>, String>> {
    let Some(p) = c.get("pod", pod, Some(ns)).await? else {
        return Ok(Err("no such pod".into()));
    };
    if p["status"]["phase"] == "Running" {
        return Ok(Ok(Some(
            p["spec"]["nodeName"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        )));
    }
    let refused = p["status"]["conditions"].as_array().is_some_and(|cs| {
        cs.iter().any(|cond| {
            cond["type"] == "PodScheduled"
                && cond["status"] == "False"
                && cond["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("exceed max volume count"))
        })
    });
    if refused {
        return Ok(Ok(None));
    }
    Ok(Err(format!("{}", p["status"])))
}

#[tokio::test]
#[ignore = "needs the cluster tier with two nodes or more: tests/cluster/cluster.py up"]
async fn a_node_at_its_attach_limit_sends_the_next_pod_elsewhere() {
    let (c, nodes) = cluster().await;
    let (a, b) = (nodes[0].as_str(), nodes[1].as_str());
    let ns = c.namespace("limits").await.unwrap();
    let n = ns.name.clone();
    let room = cinder_allocatable(&c, a).await;
    assert!(
        (1..=16).contains(&room),
        "A takes {room} volumes: expected the test cloud's small limit"
    );
    // A filled to what it takes, B cordoned meanwhile
    let cordon_b = c.cordon(b).await.unwrap();
    let mut docs = Vec::new();
    for i in 0..room {
        docs.push(claim(
            &format!("fill-{i}"),
            "csi-cinder-sc-delete",
            "1Gi",
            "ReadWriteOnce",
            false,
        ));
        docs.push(placed_on(
            &pod(
                &format!("fill-{i}"),
                &format!("fill-{i}"),
                "sleep 100000",
                PodOptions::default(),
            ),
            &[a, b],
        ));
    }
    c.apply_in(&n, &docs.join("---\n")).await.unwrap();
    let filled = Instant::now();
    for i in 0..room {
        let p = c
            .wait_running(&n, &format!("fill-{i}"), 5 * MINUTE)
            .await
            .unwrap();
        assert_eq!(p["spec"]["nodeName"], a);
    }
    println!(
        "{room} Cinder pods running on {a} in {:?}",
        filled.elapsed()
    );
    // One more at a time, allowed on either node and preferring A, while
    // B is still cordoned: the first that A's scheduler refuses for its
    // volume limit is the pod beyond A's limit. A's count is its node
    // plugin's (the server's limit less the disks Kubernetes does not
    // manage), which kubelet refreshes every 30 s: a disk of an earlier
    // test still leaving A when `room` was read raises it since, and a pod
    // that still fits on A joins the fill (its count must then have grown)
    let mut filled_on_a = room;
    let mut beyond = None;
    for k in 0..3 {
        let name = format!("extra-{k}");
        let extra_pod = placed_on(
            &pod(&name, &name, "sleep 100000", PodOptions::default()),
            &[a, b],
        );
        let extra = [
            claim(&name, "csi-cinder-sc-delete", "1Gi", "ReadWriteOnce", false),
            preferring(&extra_pod, a),
        ];
        assert!(extra[1].contains("preferredDuring"));
        c.apply_in(&n, &extra.join("---\n")).await.unwrap();
        let placed = c
            .wait_for(
                &format!("{name} running on {a} or refused for A's volume limit"),
                3 * MINUTE,
                || scheduled_or_refused_for_volumes(&c, &n, &name),
            )
            .await
            .unwrap();
        match placed {
            None => {
                println!(
                    "{name} refused on {a} for its volume limit ({filled_on_a} Cinder pods there)"
                );
                beyond = Some(name);
                break;
            }
            Some(node) => {
                assert_eq!(node, a, "{name} ran beside cordoned B");
                filled_on_a += 1;
                let count = cinder_allocatable(&c, a).await;
                assert!(
                    count >= filled_on_a,
                    "{name} was placed on {a} beyond its count: {filled_on_a} Cinder pods there, \
                     its count {count}"
                );
                println!("{name} still fitted on {a}: its count grew from {room} to {count}");
            }
        }
    }
    let beyond = beyond.unwrap_or_else(|| {
        panic!("{a}'s scheduler refused none of three pods beyond its count of {room}")
    });
    // B opened: only A's limit can send the preferring pod there
    drop(cordon_b);
    let p = c.wait_running(&n, &beyond, 3 * MINUTE).await.unwrap();
    assert_eq!(
        p["spec"]["nodeName"], b,
        "the pod beyond A's limit went to B"
    );
    let failed = events_saying(&c, &n, "AttachVolume").await;
    assert!(
        failed
            .iter()
            .all(|(m, _)| !m.contains("FailedAttachVolume")),
        "an attach failed: {failed:?}"
    );
    let server_a = c.server_of(a).unwrap();
    let attached = c
        .nova()
        .unwrap()
        .list_volume_attachments(&server_a)
        .await
        .unwrap()
        .len();
    println!("{a}'s server holds {attached} disks (its root included)");
    ns.close().await.unwrap();
}

// ------------------------------------------------------------------ drain

/// What is left of the drivers on a node: Cinder VolumeAttachments naming
/// it, and its mounts of the given volumes.
async fn left_on(c: &Cluster, node: &str, pvs: &[String]) -> (usize, usize) {
    let attachments = c
        .list("volumeattachments", &[])
        .await
        .unwrap_or_default()
        .iter()
        .filter(|va| va["spec"]["nodeName"] == node)
        .count();
    let mounts = pvs
        .iter()
        .map(|pv| c.node_mounts_containing(node, pv).unwrap_or_default().len())
        .sum();
    (attachments, mounts)
}

/// Samples until stopped: when the node's given plugin pods were last
/// seen, and when the node last held anything of the volumes.
fn sample_departures(
    c: &Cluster,
    node: &str,
    plugins: Vec<String>,
    pvs: Vec<String>,
) -> (Arc<AtomicBool>, tokio::task::JoinHandle<(Instant, Instant)>) {
    let stop = Arc::new(AtomicBool::new(false));
    let (c, node, flag) = (c.clone(), node.to_string(), stop.clone());
    let task = tokio::spawn(async move {
        let (mut plugin_seen, mut volumes_seen) = (Instant::now(), Instant::now());
        while !flag.load(Ordering::Relaxed) {
            let pods: Vec<String> = c
                .list("pods", &["-n", SUITE_NAMESPACE])
                .await
                .unwrap_or_default()
                .iter()
                .map(name)
                .collect();
            let now = Instant::now();
            if plugins.iter().any(|p| pods.contains(p)) {
                plugin_seen = now;
            }
            if left_on(&c, &node, &pvs).await != (0, 0) {
                volumes_seen = now;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        (plugin_seen, volumes_seen)
    });
    (stop, task)
}

#[tokio::test]
#[ignore = "needs the cluster tier with two nodes or more: tests/cluster/cluster.py up"]
async fn a_drained_node_keeps_its_plugins_until_its_volumes_have_left() {
    let (c, nodes) = cluster().await;
    let (a, b) = (nodes[0].as_str(), nodes[1].as_str());
    let ns = c.namespace("drain").await.unwrap();
    let n = ns.name.clone();
    // three Cinder apps and a CephFS one on B (A cordoned meanwhile); the
    // CephFS share's mount pod on B is owned by the mount pod template:
    // drain needs no --force, and the evicted mount pod's preStop keeps
    // ceph-fuse until the app's mount is gone
    let cordon_a = c.cordon(a).await.unwrap();
    let apps = ["cinder-1", "cinder-2", "cinder-3", "cephfs"];
    let mut docs = Vec::new();
    for app in apps {
        let (class, mode) = if app == "cephfs" {
            ("csi-manila-cephfs", "ReadWriteMany")
        } else {
            ("csi-cinder-sc-delete", "ReadWriteOnce")
        };
        docs.push(claim(app, class, "1Gi", mode, false));
        docs.push(deployment(app, app, &[a, b]));
    }
    c.apply_in(&n, &docs.join("---\n")).await.unwrap();
    let mut tokens = Vec::new();
    let (cr, nr) = (&c, n.as_str());
    for app in apps {
        let (pod, on) = c
            .wait_for(&format!("{app} running"), 4 * MINUTE, || async move {
                Ok(cr.app_pod(nr, app).await.ok_or("not yet".to_string()))
            })
            .await
            .unwrap();
        assert_eq!(on, b, "{app} started on B");
        tokens.push(
            c.exec(&n, &pod, &format!("cat /data/token-{app}"))
                .await
                .unwrap(),
        );
    }
    let mut pvs = Vec::new();
    let mut cinder_ids = Vec::new();
    for app in apps {
        let pv = c.volume_of(&n, app, MINUTE).await.unwrap();
        if app != "cephfs" {
            cinder_ids.push(
                pv["spec"]["csi"]["volumeHandle"]
                    .as_str()
                    .unwrap()
                    .to_string(),
            );
        }
        pvs.push(name(&pv));
    }
    drop(cordon_a);

    // the node going away as autoscalers take it: cordoned, its node
    // plugins evicted first on purpose, then drained
    let _cordon_b = c.cordon(b).await.unwrap();
    let plugins: Vec<String> = plugins_on(&c, b).await.into_iter().map(|p| p.0).collect();
    let (stop, sampler) = sample_departures(&c, b, plugins.clone(), pvs.clone());
    let started = Instant::now();
    let mut evict = vec!["delete", "pods", "-n", SUITE_NAMESPACE, "--wait=false"];
    evict.extend(plugins.iter().map(String::as_str));
    c.kubectl(&evict).await.unwrap();
    c.kubectl(&[
        "drain",
        b,
        "--ignore-daemonsets",
        "--delete-emptydir-data",
        "--timeout=300s",
    ])
    .await
    .unwrap();
    for (app, token) in apps.iter().zip(&tokens) {
        let (pod, on) = c
            .wait_for(
                &format!("{app} running elsewhere"),
                4 * MINUTE,
                || async move {
                    Ok(match cr.app_pod(nr, app).await {
                        Some((p, on)) if on != b => Ok((p, on)),
                        other => Err(format!("{other:?}")),
                    })
                },
            )
            .await
            .unwrap();
        assert_eq!(on, a);
        assert_eq!(
            &c.exec(&n, &pod, &format!("cat /data/token-{app}"))
                .await
                .unwrap(),
            token,
            "{app}'s data followed it"
        );
    }
    let drained = started.elapsed();
    // the old plugins leave once the volumes have (the hook), then the
    // DaemonSet's new ones come
    c.wait_for("B's old node plugins gone", 3 * MINUTE, || async {
        let now: Vec<String> = plugins_on(&c, b).await.into_iter().map(|p| p.0).collect();
        Ok(if plugins.iter().any(|p| now.contains(p)) {
            Err(format!("{now:?}"))
        } else {
            Ok(())
        })
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::Relaxed);
    let (plugin_seen, volumes_seen) = sampler.await.unwrap();
    println!(
        "{b} drained of 3 Cinder volumes and a CephFS share in {drained:?}; its volumes left after {:?}, its evicted node plugins after {:?}",
        volumes_seen - started,
        plugin_seen - started
    );
    assert_eq!(left_on(&c, b, &pvs).await, (0, 0), "B still holds volumes");
    assert!(
        plugin_seen >= volumes_seen,
        "a node plugin left B {:?} before B's volumes did",
        volumes_seen - plugin_seen
    );
    let server_b = c.server_of(b).unwrap();
    let nova = c.nova().unwrap();
    let on_b: Vec<String> = nova
        .list_volume_attachments(&server_b)
        .await
        .unwrap()
        .into_iter()
        .map(|att| att.volume_id)
        .filter(|v| cinder_ids.contains(v))
        .collect();
    assert!(on_b.is_empty(), "still attached to B's server: {on_b:?}");
    let mount_pods_on_b: Vec<String> = c
        .mount_pods()
        .await
        .unwrap()
        .iter()
        .filter(|p| p["spec"]["nodeName"] == b)
        .map(name)
        .collect();
    assert!(
        mount_pods_on_b.is_empty(),
        "mount pods left on B: {mount_pods_on_b:?}"
    );
    ns.close().await.unwrap();
}

// ------------------------------------------------------------------ zones

const ZONE_KEY: &str = "topology.cinder.csi.openstack.org/zone";

/// The zone the Cinder node plugin reported for a node (its label).
async fn zone_of(c: &Cluster, node: &str) -> String {
    let n = c.get("node", node, None).await.unwrap().unwrap();
    n["metadata"]["labels"][ZONE_KEY]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// The zones a PV's node affinity allows.
fn pv_zones(pv: &Value) -> Vec<String> {
    let mut zones = Vec::new();
    for term in pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"]
        .as_array()
        .into_iter()
        .flatten()
    {
        for e in term["matchExpressions"].as_array().into_iter().flatten() {
            if e["key"] == ZONE_KEY {
                zones.extend(
                    e["values"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(Value::as_str)
                        .map(str::to_string),
                );
            }
        }
    }
    zones
}

/// The claim's PV, its zones, and its Cinder volume's zone.
async fn zones_of_claim(c: &Cluster, ns: &str, claim: &str) -> (Vec<String>, String) {
    let pv = c.volume_of(ns, claim, 3 * MINUTE).await.unwrap();
    let id = pv["spec"]["csi"]["volumeHandle"].as_str().unwrap();
    let v = c.cinder().unwrap().get_volume(id).await.unwrap();
    (pv_zones(&pv), v.availability_zone)
}

/// A Cinder StorageClass of this test (cluster-scoped: deleted when the
/// guard drops).
struct TestClass {
    cluster: Cluster,
    name: String,
}

impl TestClass {
    async fn new(c: &Cluster, name: &str, body: &str) -> Self {
        c.apply(&format!(
            "apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata:\n  name: {name}\n  labels:\n    csi-cluster-tier: test\nprovisioner: cinder.csi.openstack.org\nreclaimPolicy: Delete\n{body}"
        ))
        .await
        .unwrap();
        TestClass {
            cluster: c.clone(),
            name: name.to_string(),
        }
    }
}

impl Drop for TestClass {
    fn drop(&mut self) {
        let _ = std::process::Command::new("kubectl")
            .arg(format!(
                "--kubeconfig={}",
                self.cluster.kubeconfig.display()
            ))
            .args(["delete", "storageclass", &self.name, "--ignore-not-found"])
            .output();
    }
}

fn restore_claim(name: &str, class: &str, snapshot: &str) -> String {
    format!(
        "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata:\n  name: {name}\nspec:\n  accessModes: [ReadWriteOnce]\n  storageClassName: {class}\n  dataSource:\n    apiGroup: snapshot.storage.k8s.io\n    kind: VolumeSnapshot\n    name: {snapshot}\n  resources:\n    requests:\n      storage: 1Gi\n"
    )
}

#[tokio::test]
#[ignore = "needs the cluster tier with a node in a second zone (three nodes): tests/cluster/cluster.py up"]
async fn volumes_live_and_attach_only_in_their_zone_and_restores_never_lie_about_it() {
    let (c, nodes) = cluster().await;
    assert!(
        nodes.len() >= 3,
        "the zones scenario needs node C in the second zone; the cluster has {nodes:?}"
    );
    let (a, b, cz) = (nodes[0].as_str(), nodes[1].as_str(), nodes[2].as_str());
    let (az1, az2) = (zone_of(&c, a).await, zone_of(&c, cz).await);
    assert_eq!(zone_of(&c, b).await, az1, "A and B share a zone");
    assert!(
        !az1.is_empty() && !az2.is_empty() && az1 != az2,
        "A is in {az1:?}, C in {az2:?}: two zones expected"
    );
    let ns = c.namespace("zones").await.unwrap();
    let n = ns.name.clone();
    let sleeper = |name: &str, claim: &str, script: &str| {
        pod(
            name,
            claim,
            &format!("{script}; sleep 100000"),
            PodOptions::default(),
        )
    };

    // a class of this test: Immediate, allowed in az2 only
    let az2_only = TestClass::new(
        &c,
        &format!("{n}-az2"),
        &format!(
            "volumeBindingMode: Immediate\nallowedTopologies:\n- matchLabelExpressions:\n  - key: {ZONE_KEY}\n    values: [{az2}]\n"
        ),
    )
    .await;

    // 1. WaitForFirstConsumer: the volume is made in the zone of the node
    // the pod was scheduled to, whichever the scheduler picked (with the
    // Immediate claim of step 2 alongside)
    let docs = [
        claim("immediate", &az2_only.name, "1Gi", "ReadWriteOnce", false),
        claim(
            "on-c",
            "csi-cinder-sc-delete",
            "1Gi",
            "ReadWriteOnce",
            false,
        ),
        placed_on(&sleeper("on-c", "on-c", "echo c > /data/where"), &[cz]),
        claim(
            "either",
            "csi-cinder-sc-delete",
            "1Gi",
            "ReadWriteOnce",
            false,
        ),
        placed_on(&sleeper("either", "either", "true"), &[a, cz]),
        claim("src", "csi-cinder-sc-delete", "1Gi", "ReadWriteOnce", false),
        placed_on(
            &sleeper(
                "src",
                "src",
                "cat /proc/sys/kernel/random/uuid > /data/token; sync",
            ),
            &[a],
        ),
    ];
    c.apply_in(&n, &docs.join("---\n")).await.unwrap();
    for (p, claim_name) in [("on-c", "on-c"), ("either", "either"), ("src", "src")] {
        let pod = c.wait_running(&n, p, 5 * MINUTE).await.unwrap();
        let node = pod["spec"]["nodeName"].as_str().unwrap().to_string();
        let node_zone = zone_of(&c, &node).await;
        let (pv_zones, volume_zone) = zones_of_claim(&c, &n, claim_name).await;
        println!(
            "claim {claim_name}: pod on {node} ({node_zone}), volume in {volume_zone}, PV {pv_zones:?}"
        );
        assert_eq!(
            volume_zone, node_zone,
            "{claim_name}: made where its pod runs"
        );
        assert_eq!(
            pv_zones,
            vec![node_zone.clone()],
            "{claim_name}: the PV says so"
        );
    }
    let token = c.exec(&n, "src", "cat /data/token").await.unwrap();

    // 2. Immediate, for the second zone only: the PV names that zone only,
    // and its pod (allowed everywhere) runs on C
    let (pv_zones, volume_zone) = zones_of_claim(&c, &n, "immediate").await;
    assert_eq!(pv_zones, vec![az2.clone()], "an Immediate claim for {az2}");
    assert_eq!(volume_zone, az2);
    c.apply_in(
        &n,
        &placed_on(&sleeper("immediate", "immediate", "true"), &[a, b, cz]),
    )
    .await
    .unwrap();

    // 3. a snapshot of the az1 volume (taken while the pod of step 2
    // starts): restored for a pod in az1, it holds the data
    c.apply_in(
        &n,
        "apiVersion: snapshot.storage.k8s.io/v1\nkind: VolumeSnapshot\nmetadata:\n  name: snap\nspec:\n  volumeSnapshotClassName: csi-cinder-snapclass\n  source:\n    persistentVolumeClaimName: src\n",
    )
    .await
    .unwrap();
    let p = c.wait_running(&n, "immediate", 5 * MINUTE).await.unwrap();
    assert_eq!(
        p["spec"]["nodeName"], cz,
        "the {az2} volume's pod runs on C"
    );
    c.wait_snapshot_ready(&n, "snap", 3 * MINUTE).await.unwrap();
    // restores, all at once: for a pod in az1; for a pod that prefers C
    // but may run on A (the restore goes to the snapshot's zone, the PV
    // says so, and the pod follows it to A); and one only az2 may hold
    let docs = [
        restore_claim("restored-az2", &az2_only.name, "snap"),
        restore_claim("restored-a", "csi-cinder-sc-delete", "snap"),
        placed_on(&sleeper("restored-a", "restored-a", "true"), &[a]),
        restore_claim("restored-pref-c", "csi-cinder-sc-delete", "snap"),
        preferring(
            &placed_on(
                &sleeper("restored-pref-c", "restored-pref-c", "true"),
                &[a, cz],
            ),
            cz,
        ),
    ];
    c.apply_in(&n, &docs.join("---\n")).await.unwrap();
    // the one only az2 may hold: refused with a clear event, no PV at all
    let refused = c
        .wait_for("the az2 restore refused", 3 * MINUTE, || async {
            let said = events_saying(&c, &n, "only in the source's zone").await;
            Ok(if said.is_empty() {
                Err("no event yet".to_string())
            } else {
                Ok(said)
            })
        })
        .await
        .unwrap();
    println!("restored-az2: {}", refused[0].0);
    assert!(refused[0].0.contains(&az1), "{refused:?}");
    let pvc = c
        .get("pvc", "restored-az2", Some(&n))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(pvc["status"]["phase"], "Pending");
    assert!(pvc["spec"]["volumeName"].is_null(), "{pvc}");
    // gone now: the provisioner's sweep (1 min in deploy/) then frees the
    // snapshot it held, while the rest runs
    c.delete("pvc", "restored-az2", Some(&n)).await.unwrap();
    for p in ["restored-a", "restored-pref-c"] {
        let pod = c.wait_running(&n, p, 5 * MINUTE).await.unwrap();
        assert_eq!(pod["spec"]["nodeName"], a, "{p} runs where its data is");
        let (pv_zones, volume_zone) = zones_of_claim(&c, &n, p).await;
        assert_eq!(volume_zone, az1, "{p}: restored in the snapshot's zone");
        assert_eq!(pv_zones, vec![az1.clone()], "{p}: the PV says so");
        assert_eq!(
            c.exec(&n, p, "cat /data/token").await.unwrap(),
            token,
            "{p} holds the snapshot's data"
        );
    }
    let selected = c
        .get("pvc", "restored-pref-c", Some(&n))
        .await
        .unwrap()
        .unwrap()["metadata"]["annotations"]["volume.kubernetes.io/selected-node"]
        .clone();
    println!("restored-pref-c: the scheduler first selected {selected}");

    // 4. never an attachment across zones: every volume of the namespace
    // is attached only to servers of its own zone, and no attach failed
    let nova = c.nova().unwrap();
    let cinder = c.cinder().unwrap();
    let mut seen = 0;
    for claim_name in [
        "on-c",
        "either",
        "src",
        "immediate",
        "restored-a",
        "restored-pref-c",
    ] {
        let pv = c.volume_of(&n, claim_name, MINUTE).await.unwrap();
        let v = cinder
            .get_volume(pv["spec"]["csi"]["volumeHandle"].as_str().unwrap())
            .await
            .unwrap();
        for server in v.attached_servers() {
            let s = nova.get_server(server).await.unwrap();
            assert_eq!(
                s.availability_zone.as_deref(),
                Some(v.availability_zone.as_str()),
                "{claim_name}: volume in {} attached to server {server}",
                v.availability_zone
            );
            seen += 1;
        }
    }
    assert_eq!(seen, 6, "each running pod's volume is attached once");
    let failed = events_saying(&c, &n, "AttachVolume").await;
    assert!(
        failed
            .iter()
            .all(|(m, _)| !m.contains("FailedAttachVolume")),
        "an attach failed: {failed:?}"
    );
    ns.close().await.unwrap();
    drop(az2_only);
}

// ------------------------------------------- a node dies; a new one joins

/// The node's taints, as `key:effect`.
async fn taints_of(c: &Cluster, node: &str) -> Option<Vec<String>> {
    let n = c.get("node", node, None).await.ok()??;
    Some(
        n["spec"]["taints"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|t| {
                format!(
                    "{}:{}",
                    t["key"].as_str().unwrap_or_default(),
                    t["effect"].as_str().unwrap_or_default()
                )
            })
            .collect(),
    )
}

fn is_startup_taint(t: &str) -> bool {
    t.split(':')
        .next()
        .is_some_and(|k| k.ends_with("/agent-not-ready"))
}

/// What the sampler saw of a node joining while a pod waits for it.
#[derive(Debug, Default)]
struct JoinSamples {
    samples: usize,
    /// samples of the node carrying a startup taint
    tainted: usize,
    /// samples of the node Ready (kubelet's not-ready taint gone) while a
    /// startup taint was still on: the window the startup taint closes
    ready_but_tainted: usize,
    /// the pod bound to the node while a startup taint was on
    bound_while_tainted: Option<String>,
    /// the startup taints all gone, after they were seen
    untainted_at: Option<Instant>,
}

/// Samples the node's taints and the pod's binding until stopped.
fn sample_join(
    c: &Cluster,
    node: &str,
    ns: &str,
    pod: &str,
) -> (Arc<AtomicBool>, tokio::task::JoinHandle<JoinSamples>) {
    let stop = Arc::new(AtomicBool::new(false));
    let (c, node, ns, pod, flag) = (
        c.clone(),
        node.to_string(),
        ns.to_string(),
        pod.to_string(),
        stop.clone(),
    );
    let task = tokio::spawn(async move {
        let mut out = JoinSamples::default();
        while !flag.load(Ordering::Relaxed) {
            if let Some(taints) = taints_of(&c, &node).await {
                // the pod after the taints: a binding seen here happened
                // after that look at the node
                let bound = c
                    .get("pod", &pod, Some(&ns))
                    .await
                    .ok()
                    .flatten()
                    .and_then(|p| p["spec"]["nodeName"].as_str().map(str::to_string));
                out.samples += 1;
                let startup: Vec<&String> = taints.iter().filter(|t| is_startup_taint(t)).collect();
                if startup.is_empty() {
                    // the old node, before it is deleted, has none either
                    if out.tainted > 0 {
                        out.untainted_at.get_or_insert_with(Instant::now);
                    }
                } else {
                    out.tainted += 1;
                    if !taints
                        .iter()
                        .any(|t| t.starts_with("node.kubernetes.io/not-ready:"))
                    {
                        out.ready_but_tainted += 1;
                    }
                    if bound.as_deref() == Some(node.as_str()) && out.bound_while_tainted.is_none()
                    {
                        out.bound_while_tainted = Some(format!("{taints:?}"));
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        out
    });
    (stop, task)
}

#[tokio::test]
#[ignore = "needs the cluster tier with two nodes or more: tests/cluster/cluster.py up"]
async fn a_dead_nodes_pods_run_elsewhere_once_it_is_out_of_service_and_a_new_node_waits_for_its_drivers()
 {
    let (c, nodes) = cluster().await;
    let (a, b) = (nodes[0].as_str(), nodes[1].as_str());
    let ns = c.namespace("dead-node").await.unwrap();
    let n = ns.name.clone();
    // two Cinder pods on B (A cordoned meanwhile), their data fsynced
    let cordon_a = c.cordon(a).await.unwrap();
    let apps = ["db-1", "db-2"];
    for app in apps {
        c.apply_in(
            &n,
            &stateful_set(
                app,
                "csi-cinder-sc-delete",
                &[a, b],
                "[ -f /data/token ] || { cat /proc/sys/kernel/random/uuid > /data/token; sync; }; while true; do date >> /data/log; sleep 1; done",
            ),
        )
        .await
        .unwrap();
    }
    let mut before = Vec::new();
    for app in apps {
        let pod = format!("{app}-0");
        let p = c.wait_running(&n, &pod, 3 * MINUTE).await.unwrap();
        assert_eq!(p["spec"]["nodeName"], b, "{pod} started on B");
        let token = c.exec(&n, &pod, "cat /data/token").await.unwrap();
        let pv = c
            .volume_of(&n, &format!("data-{pod}"), MINUTE)
            .await
            .unwrap();
        before.push((
            pod,
            p["metadata"]["uid"].as_str().unwrap().to_string(),
            token,
            pv,
        ));
    }
    drop(cordon_a);

    // B dies; the node controller notices; the operator, sure it is down
    // (its server SHUTOFF), puts the out-of-service taint on it
    let (server_a, server_b) = (c.server_of(a).unwrap(), c.server_of(b).unwrap());
    let dead = c.kill_node(b).await.unwrap();
    assert_eq!(
        c.nova()
            .unwrap()
            .get_server(&server_b)
            .await
            .unwrap()
            .status,
        "SHUTOFF"
    );
    let noticed = c.wait_node_not_ready(b).await.unwrap();
    let moving: Vec<(&str, &str)> = before
        .iter()
        .map(|(pod, uid, _, _)| (pod.as_str(), uid.as_str()))
        .collect();
    let took = c.fail_over(&n, b, &moving, a).await.unwrap();
    println!(
        "{b} dead: not Ready after {noticed:?}; its {} Cinder pods running on {a} {took:?} after the out-of-service taint",
        apps.len()
    );
    for (pod, _, token, pv) in &before {
        assert_eq!(
            &c.exec(&n, pod, "cat /data/token").await.unwrap(),
            token,
            "{pod}: what was fsynced on B is read on A"
        );
        let volume = pv["spec"]["csi"]["volumeHandle"].as_str().unwrap();
        assert_eq!(
            holders(&c, volume, &[server_a.clone(), server_b.clone()]).await,
            (vec![server_a.clone()], vec![server_a.clone()]),
            "{pod}: its volume detached from B's stopped server and attached to A's only"
        );
    }

    // B replaced: a new machine of that name registers with the startup
    // taints. A pod with a volume, allowed only on B, waits until B's
    // drivers are registered
    c.apply_in(
        &n,
        &[
            claim(
                "fresh",
                "csi-cinder-sc-delete",
                "1Gi",
                "ReadWriteOnce",
                false,
            ),
            placed_on(
                &pod(
                    "fresh",
                    "fresh",
                    "echo ok > /data/ok; sleep 100000",
                    PodOptions::default(),
                ),
                &[b],
            ),
        ]
        .join("---\n"),
    )
    .await
    .unwrap();
    let (stop, sampler) = sample_join(&c, b, &n, "fresh");
    let joined = Instant::now();
    c.revive_node(dead, true).await.unwrap();
    let ready = joined.elapsed();
    c.wait_running(&n, "fresh", 3 * MINUTE).await.unwrap();
    stop.store(true, Ordering::Relaxed);
    let seen = sampler.await.unwrap();
    let untainted = seen
        .untainted_at
        .map(|t| t.duration_since(joined))
        .expect("the startup taints were removed");
    println!(
        "{b} replaced (Node deleted, server started, kubelet Ready) in {ready:?}; its startup taints gone {untainted:?} after the replacement began; {} samples, {} tainted, {} of them Ready and still tainted",
        seen.samples, seen.tainted, seen.ready_but_tainted
    );
    assert!(
        seen.tainted > 0,
        "the new node was never seen with its startup taints"
    );
    assert_eq!(
        seen.bound_while_tainted, None,
        "a pod with a volume was scheduled to B before its drivers were registered"
    );
    let taints = taints_of(&c, b).await.unwrap();
    assert!(
        !taints
            .iter()
            .any(|t| t.starts_with("node.kubernetes.io/out-of-service")),
        "the new node carries the old one's taint: {taints:?}"
    );
    // what the dead node had mounted is gone, and its successor's volume
    // is B's alone
    for (_, _, _, pv) in &before {
        assert!(
            c.node_mounts_containing(b, &name(pv)).unwrap().is_empty(),
            "B still mounts {}",
            name(pv)
        );
    }
    assert_eq!(
        c.exec(&n, "fresh", "cat /data/ok").await.unwrap().trim(),
        "ok"
    );
    ns.close().await.unwrap();
}
