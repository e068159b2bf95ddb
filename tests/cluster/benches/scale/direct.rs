//! OpenStack's own time for the scale bench's work: the same volumes and
//! shares made, attached, detached and deleted straight through Cinder,
//! Nova and Manila at the same concurrency (polling every `POLL`, as the
//! driver does at most).

use std::time::{Duration, Instant};

use cluster_tests::Cluster;
use openstack_client::cinder::{BlockStorage, CreateSnapshot, CreateVolume, ListVolumes};
use openstack_client::manila::{
    AccessRuleState, CreateShare, GrantAccess, ListPage, ShareStatus, SharedFileSystems,
};
use openstack_emulator::proxy::ProxyControl;

use super::{Burst, POLL, TIMEOUT, Wave};

/// The same N volumes straight through Cinder, at once: each made and
/// watched until `available`, then all deleted and watched until gone.
/// What an earlier run left is cleared first through `housekeeping` (a
/// client outside the proxy: the bench's housekeeping is neither side's
/// work).
pub(super) async fn through_cinder(
    cinder: &BlockStorage,
    housekeeping: &BlockStorage,
    n: usize,
) -> Burst {
    clear_volumes_named(housekeeping, (0..n).map(|i| format!("scale-direct-{i}"))).await;
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
    let (ids, ready) = finished(tasks).await;
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

/// Each task's object and the time it took, in the tasks' order.
async fn finished(
    tasks: Vec<tokio::task::JoinHandle<(String, Duration)>>,
) -> (Vec<String>, Vec<Duration>) {
    let mut done = Vec::new();
    for t in tasks {
        done.push(t.await.unwrap());
    }
    done.into_iter().unzip()
}

/// Deletes what a run stopped on the way left under `names` (a volume
/// still attached is left: its delete is refused).
async fn clear_volumes_named(cinder: &BlockStorage, names: impl Iterator<Item = String>) {
    let mut deleted = Vec::new();
    for name in names {
        for v in cinder.volumes_named(&name).await.unwrap() {
            if cinder.delete_volume(&v.id).await.is_ok() {
                deleted.push(v.id);
            }
        }
    }
    until_gone(cinder, deleted).await;
}

/// Waits until none of `ids` is in Cinder any more.
pub(super) async fn until_gone(cinder: &BlockStorage, ids: Vec<String>) {
    until_none_left("volumes", ids, |id| {
        let cinder = cinder.clone();
        async move { !matches!(cinder.get_volume(&id).await, Err(e) if e.is_not_found()) }
    })
    .await
}

/// Waits until `there` says none of `ids` is there any more.
async fn until_none_left<F, Fut>(what: &str, mut ids: Vec<String>, there: F)
where
    F: Fn(String) -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let started = Instant::now();
    while !ids.is_empty() {
        assert!(
            started.elapsed() < TIMEOUT,
            "{} {what} still there",
            ids.len()
        );
        let mut left = Vec::new();
        for id in ids {
            if there(id.clone()).await {
                left.push(id);
            }
        }
        ids = left;
        if !ids.is_empty() {
            tokio::time::sleep(POLL).await;
        }
    }
}

/// The same N CephFS shares straight through Manila, at once: each made,
/// given a cephx rule once `available`, watched until the rule is
/// `active` (what the driver waits for); then all deleted.
/// What an earlier run left is cleared first through `housekeeping`, as
/// for Cinder.
pub(super) async fn shares_through_manila(
    manila: &SharedFileSystems,
    housekeeping: &SharedFileSystems,
    n: usize,
) -> (Burst, usize) {
    // what a run stopped on the way left under these names
    let mut leftovers = Vec::new();
    for i in 0..n {
        for share in housekeeping
            .list_shares_named(&format!("scale-direct-share-{i}"))
            .await
            .unwrap()
        {
            housekeeping.delete_share(&share.id).await.unwrap();
            leftovers.push(share.id);
        }
    }
    until_shares_gone(housekeeping, leftovers).await;
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
    let (ids, ready) = finished(tasks).await;
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

/// How long the proxy must have carried no call for the cloud to count
/// as quiet.
const QUIET_CALLS: Duration = Duration::from_secs(2);
/// How long a side waits at most for the cloud to be quiet.
const QUIET_PATIENCE: Duration = Duration::from_secs(300);

/// Waits until the cloud is quiet, so that the next side starts as the
/// last one did: no volume of the project in a passing state (creating,
/// deleting, attaching, ...), no share either, and no call through the
/// proxy (the plugins') for `QUIET_CALLS`. Read through `cinder` and
/// `manila`, clients outside the proxy; the proxy's record of calls is
/// cleared at the end, so the wait is counted as neither side's work.
/// How long it waited.
pub(super) async fn quiet_cloud(
    cinder: &BlockStorage,
    manila: &SharedFileSystems,
    proxy: &ProxyControl,
) -> Duration {
    let started = Instant::now();
    loop {
        if started.elapsed() > QUIET_PATIENCE {
            println!(
                "(the cloud was not quiet after {} s: the next side starts all the same)",
                QUIET_PATIENCE.as_secs()
            );
            proxy.clear_calls().await.unwrap();
            return started.elapsed();
        }
        let volumes_settled = cinder
            .list_volumes(&ListVolumes::default())
            .await
            .unwrap()
            .items
            .iter()
            .all(|v| {
                matches!(v.status.as_str(), "available" | "in-use")
                    || v.status.as_str().contains("error")
            });
        let shares_settled = manila
            .list_shares(&ListPage::default())
            .await
            .unwrap()
            .iter()
            .all(|s| s.status == ShareStatus::Available || s.status.is_error());
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let last_call = proxy
            .calls()
            .await
            .unwrap()
            .iter()
            .map(|c| c.at_ms)
            .max()
            .unwrap_or(0);
        let calls_settled = now_ms.saturating_sub(last_call) >= QUIET_CALLS.as_millis() as u64;
        if volumes_settled && shares_settled && calls_settled {
            proxy.clear_calls().await.unwrap();
            return started.elapsed();
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Waits until none of `ids` is in Manila any more.
pub(super) async fn until_shares_gone(manila: &SharedFileSystems, ids: Vec<String>) {
    until_none_left("shares", ids, |id| {
        let manila = manila.clone();
        async move { !matches!(manila.get_share(&id).await, Err(e) if e.is_not_found()) }
    })
    .await
}

/// Straight through Cinder and Nova: each volume's attach alone, from
/// Nova's attach call until Cinder said `in-use`.
pub(super) struct DirectAttaches(pub(super) Vec<Duration>);

/// The same volumes straight through Cinder and Nova, at once: each made,
/// attached to a server with room once `available`, watched until
/// `in-use`; then all detached and watched until `available`, then deleted.
pub(super) async fn wave_through_openstack(
    c: &Cluster,
    cinder: &BlockStorage,
    rooms: &[(String, usize)],
) -> (Wave, DirectAttaches) {
    // through the fault proxy, as the plugins reach Nova
    let nova = openstack_client::nova::Compute::new(c.member_via_proxy().unwrap());
    // each volume in its server's zone (Nova attaches none across zones)
    let zones = c.node_zones().await.unwrap();
    let servers: Vec<(String, String)> = rooms
        .iter()
        .flat_map(|(node, room)| {
            std::iter::repeat_n((c.server_of(node).unwrap(), zones[node].clone()), *room)
        })
        .collect();
    let n = servers.len();
    clear_volumes_named(cinder, (0..n).map(|i| format!("scale-wave-{i}"))).await;
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
    // every detach asked at once, as the attacher's workers do, each
    // timed from the same start until its volume is available again
    let detaching = Instant::now();
    let detaches: Vec<_> = done
        .iter()
        .map(|(id, server, _, _)| {
            let (cinder, nova, id, server) =
                (cinder.clone(), nova.clone(), id.clone(), server.clone());
            tokio::spawn(async move {
                nova.detach_volume(&server, &id).await.unwrap();
                while cinder.get_volume(&id).await.unwrap().status.as_str() != "available" {
                    tokio::time::sleep(POLL).await;
                }
                detaching.elapsed()
            })
        })
        .collect();
    let mut detached = Vec::new();
    for d in detaches {
        detached.push(d.await.unwrap());
    }
    let ids: Vec<String> = done.iter().map(|(id, _, _, _)| id.clone()).collect();
    for id in &ids {
        cinder.delete_volume(id).await.unwrap();
    }
    until_gone(cinder, ids).await;
    (
        Wave {
            running: done.iter().map(|(_, _, took, _)| *took).collect(),
            detached: super::quantiles(&detached),
        },
        DirectAttaches(done.iter().map(|(_, _, _, attach)| *attach).collect()),
    )
}

/// OpenStack's own time for one move's work: a volume attached to
/// `servers[0]`, detached from it (until `available`), then attached to
/// `servers[1]` (until `in-use`), straight through Nova (through the fault
/// proxy, as the plugins are), one after the other as a move must.
pub(super) async fn move_through_nova(
    c: &Cluster,
    cinder: &BlockStorage,
    servers: &[String; 2],
    zone: &str,
) -> (Duration, Duration) {
    let nova = openstack_client::nova::Compute::new(c.member_via_proxy().unwrap());
    let name = "scale-move-direct";
    clear_volumes_named(cinder, std::iter::once(name.to_string())).await;
    let v = cinder
        .create_volume(&CreateVolume {
            name: name.into(),
            size_gib: 1,
            availability_zone: Some(zone.into()),
            ..Default::default()
        })
        .await
        .unwrap();
    let until = |status: &'static str| {
        let (cinder, id) = (cinder.clone(), v.id.clone());
        async move {
            let t = Instant::now();
            loop {
                tokio::time::sleep(POLL).await;
                let now = cinder.get_volume(&id).await.unwrap();
                match now.status.as_str() {
                    s if s == status => return t.elapsed(),
                    "error" | "error_attaching" | "error_detaching" => {
                        panic!("{id} went {}", now.status)
                    }
                    _ => {}
                }
            }
        }
    };
    until("available").await;
    nova.attach_volume(&servers[0], &v.id, false).await.unwrap();
    until("in-use").await;
    let t = Instant::now();
    nova.detach_volume(&servers[0], &v.id).await.unwrap();
    until("available").await;
    let detach = t.elapsed();
    let t = Instant::now();
    // Cinder may still hold the old attachment for a moment after the
    // volume shows `available` (seen once: "already attached to
    // instances"): asked again until it lets go, on OpenStack's clock
    loop {
        match nova.attach_volume(&servers[1], &v.id, false).await {
            Ok(_) => break,
            Err(openstack_client::Error::BadRequest(e))
                if e.message.contains("already attached")
                    && t.elapsed() < Duration::from_secs(120) =>
            {
                tokio::time::sleep(POLL).await;
            }
            Err(e) => panic!("attaching {} to {}: {e}", v.id, servers[1]),
        }
    }
    until("in-use").await;
    let attach = t.elapsed();
    nova.detach_volume(&servers[1], &v.id).await.unwrap();
    until("available").await;
    cinder.delete_volume(&v.id).await.unwrap();
    until_gone(cinder, vec![v.id.clone()]).await;
    (detach, attach)
}

/// OpenStack's own time for part 4's work: `m` volumes (made first,
/// untimed), a snapshot of each asked at once, each until `available`;
/// then each volume extended to 2 GiB at 5 a second, each until Cinder
/// shows its new size and `available` again, from its own ask.
pub(super) async fn snapshots_and_expansion_through_cinder(
    cinder: &BlockStorage,
    m: usize,
) -> (Vec<Duration>, Vec<Duration>) {
    let names = (0..m).map(|i| format!("scale-snap-direct-{i}"));
    clear_volumes_named(cinder, names.clone()).await;
    let made: Vec<_> = names
        .map(|name| {
            let cinder = cinder.clone();
            tokio::spawn(async move {
                let v = cinder
                    .create_volume(&CreateVolume {
                        name,
                        size_gib: 1,
                        ..Default::default()
                    })
                    .await
                    .unwrap();
                until_volume(&cinder, &v.id, |v| v.status.as_str() == "available").await;
                (v.id, Duration::ZERO)
            })
        })
        .collect();
    let (ids, _) = finished(made).await;
    let started = Instant::now();
    let snapshots: Vec<_> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| {
            let (cinder, id) = (cinder.clone(), id.clone());
            tokio::spawn(async move {
                let s = cinder
                    .create_snapshot(&CreateSnapshot {
                        volume_id: id,
                        name: format!("scale-snap-direct-{i}"),
                        ..Default::default()
                    })
                    .await
                    .unwrap();
                loop {
                    tokio::time::sleep(POLL).await;
                    let now = cinder.get_snapshot(&s.id).await.unwrap();
                    assert!(
                        !now.status.is_error(),
                        "{} went {}",
                        s.id,
                        now.status.as_str()
                    );
                    if now.status.as_str() == "available" {
                        return (s.id, started.elapsed());
                    }
                }
            })
        })
        .collect();
    let (snapshot_ids, snapshots_ready) = finished(snapshots).await;
    // at 5 a second, each timed from its own ask
    let mut extends = Vec::new();
    for id in &ids {
        let (cinder, id) = (cinder.clone(), id.clone());
        extends.push(tokio::spawn(async move {
            let asked = Instant::now();
            cinder.extend_volume(&id, 2, false).await.unwrap();
            until_volume(&cinder, &id, |v| {
                v.size == 2 && v.status.as_str() == "available"
            })
            .await;
            (id, asked.elapsed())
        }));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (_, grown) = finished(extends).await;
    for s in &snapshot_ids {
        cinder.delete_snapshot(s).await.unwrap();
    }
    until_none_left("snapshots", snapshot_ids, |id| {
        let cinder = cinder.clone();
        async move { !matches!(cinder.get_snapshot(&id).await, Err(e) if e.is_not_found()) }
    })
    .await;
    for id in &ids {
        cinder.delete_volume(id).await.unwrap();
    }
    until_gone(cinder, ids).await;
    (snapshots_ready, grown)
}

/// Polls a volume every `POLL` until `done` says so.
async fn until_volume(
    cinder: &BlockStorage,
    id: &str,
    done: impl Fn(&openstack_client::cinder::Volume) -> bool,
) {
    let started = Instant::now();
    loop {
        tokio::time::sleep(POLL).await;
        let v = cinder.get_volume(id).await.unwrap();
        assert!(!v.status.is_error(), "{id} went {}", v.status.as_str());
        if done(&v) {
            return;
        }
        assert!(
            started.elapsed() < TIMEOUT,
            "{id} still {}",
            v.status.as_str()
        );
    }
}
