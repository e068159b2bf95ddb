//! The node plugin's preStop hook (`<plugin> pre-stop-hook`): on a node
//! being drained, the plugin must be the last to leave. Kubelet unmounts
//! and unstages a pod's volumes only after the pod stopped, through this
//! very plugin; a plugin that exits first (a node going away takes its
//! DaemonSet pods too) leaves them mounted, attached to the server, and
//! its pods' successors blocked behind "Multi-Attach" until someone
//! detaches by hand. So, when the node is cordoned or tainted for
//! removal, the hook returns only once no VolumeAttachment of the driver
//! names the node and no mount of the driver is left below the kubelet
//! directory; kubelet's grace period for the pod bounds the wait. On a
//! node that is not being drained (a rolling update of the DaemonSet) it
//! returns at once: the new plugin takes over the mounts.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The first argument that runs the hook instead of the plugin.
pub const SUBCOMMAND: &str = "pre-stop-hook";

/// Taints that mean the node is being emptied: kubectl's cordon (and the
/// node lifecycle controller's mirror of it), the cluster autoscaler's and
/// Karpenter's.
const DRAIN_TAINTS: [&str; 3] = [
    "node.kubernetes.io/unschedulable",
    REMOVAL_TAINTS[0],
    REMOVAL_TAINTS[1],
];

/// Taints that mean the node is going away for good (the cluster
/// autoscaler's and Karpenter's), not merely cordoned: a cordon alone is
/// also what a node under maintenance carries for hours, on which a
/// plugin rollout must not wait for volumes that are not leaving.
const REMOVAL_TAINTS: [&str; 2] = ["ToBeDeletedByClusterAutoscaler", "karpenter.sh/disrupted"];

#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "pre-stop-hook",
    about = "Waits, on a node being drained, until the driver's volumes have left the node"
)]
pub struct PreStopArgs {
    /// The node this pod runs on (the downward API's spec.nodeName).
    #[arg(long, env = "NODE_NAME")]
    pub node_name: String,
    /// The CSI driver whose VolumeAttachments and mounts to wait for
    /// (default: the plugin's own default name).
    #[arg(long = "driver-name", alias = "drivername")]
    pub driver_name: Option<String>,
    /// Kubelet's directory as the plugin sees it.
    #[arg(long, default_value = "/var/lib/kubelet")]
    pub path_root: PathBuf,
    /// How often to look again, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    pub poll_interval_ms: u64,
    /// On a node only cordoned (no autoscaler's or Karpenter's taint),
    /// stop once none of the driver's volumes has left for this long, in
    /// seconds: a drain keeps the plugin while its volumes keep leaving,
    /// and a plugin rolled out on a node cordoned for maintenance waits
    /// this long rather than its whole grace period.
    #[arg(long, default_value_t = 30)]
    pub cordoned_idle_secs: u64,
    #[command(flatten)]
    pub log: plugin_runtime::LogArgs,
}

#[derive(Debug, thiserror::Error)]
pub enum PreStopError {
    #[error("{0}")]
    Kube(#[from] kube_api::KubeError),
    #[error(transparent)]
    Log(#[from] plugin_runtime::logging::LogError),
}

/// What the hook found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Not cordoned nor tainted for removal: stop at once.
    NotDraining,
    /// The API knows no such node.
    NoSuchNode,
    /// Drained: nothing of the driver was left on the node after `waited`.
    Released { waited: Duration },
    /// Cordoned only, and none of the driver's volumes left it for
    /// `--cordoned-idle-secs` (a node under maintenance, not a drain).
    CordonedIdle { waited: Duration },
}

/// Whether this process was started as the hook.
pub fn invoked() -> bool {
    std::env::args().nth(1).as_deref() == Some(SUBCOMMAND)
}

/// The hook's `main`: parses the arguments after the subcommand, logs to
/// stderr, and waits with the pod's own credentials.
pub async fn main(default_driver: &str) -> Result<Outcome, PreStopError> {
    use clap::Parser;
    let args = PreStopArgs::parse_from(std::env::args().skip(1));
    plugin_runtime::logging::init(&args.log)?;
    let client = kube_api::Client::in_cluster()?;
    let driver = args
        .driver_name
        .clone()
        .unwrap_or_else(|| default_driver.to_string());
    let outcome = run(&client, &args, &driver).await?;
    tracing::info!(node = %args.node_name, driver = %driver, outcome = ?outcome, "pre-stop hook done");
    Ok(outcome)
}

/// Waits until the driver's volumes left the node, if it is being drained.
pub async fn run(
    client: &kube_api::Client,
    args: &PreStopArgs,
    driver: &str,
) -> Result<Outcome, PreStopError> {
    let poll = Duration::from_millis(args.poll_interval_ms.max(50));
    // a passing error must not end the hook: kubelet counts a failed hook
    // as done, and the plugin would leave a drained node's volumes
    // behind; kubelet's grace period bounds the wait. A refusal (401,
    // 403: the driver's RBAC removed, as when it is uninstalled) does
    // not pass: it ends the hook rather than hold every node plugin for
    // its whole grace period
    let node = loop {
        match client.get_node(&args.node_name).await {
            Ok(node) => break node,
            Err(e) if matches!(e.status(), Some(401 | 403)) => return Err(e.into()),
            Err(e) => {
                tracing::warn!(node = %args.node_name, error = %e, "cannot read the node; trying again");
                tokio::time::sleep(poll).await;
            }
        }
    };
    let Some(node) = node else {
        return Ok(Outcome::NoSuchNode);
    };
    if !draining(&node) {
        tracing::info!(node = %args.node_name, "node not being drained: stopping at once");
        return Ok(Outcome::NotDraining);
    }
    let started = Instant::now();
    let idle_limit = Duration::from_secs(args.cordoned_idle_secs);
    let mut removal = being_removed(&node);
    let mut last: Option<(BTreeSet<String>, BTreeSet<PathBuf>)> = None;
    let mut last_change = Instant::now();
    loop {
        let attachments = match client.list_volume_attachments().await {
            Ok(list) => list
                .into_iter()
                .filter(|va| va.spec.attacher == driver && va.spec.node_name == args.node_name)
                .map(|va| va.metadata.name)
                .collect::<BTreeSet<String>>(),
            Err(e) => {
                // keep waiting: leaving early is what the hook prevents,
                // and kubelet's grace period ends it anyway
                tracing::warn!(error = %e, "cannot list VolumeAttachments; trying again");
                tokio::time::sleep(poll).await;
                continue;
            }
        };
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let mounts = driver_mounts(&mountinfo, &args.path_root, driver);
        if attachments.is_empty() && mounts.is_empty() {
            return Ok(Outcome::Released {
                waited: started.elapsed(),
            });
        }
        let now = (attachments, mounts);
        if last.as_ref().is_some_and(|l| *l != now) {
            last_change = Instant::now();
        }
        if !removal && last_change.elapsed() >= idle_limit {
            // an autoscaler may have begun to remove the node meanwhile
            match client.get_node(&args.node_name).await {
                Ok(Some(n)) if being_removed(&n) => removal = true,
                Ok(Some(n)) if draining(&n) => {
                    tracing::info!(
                        node = %args.node_name,
                        idle_s = idle_limit.as_secs(),
                        "node cordoned, but none of the driver's volumes left it meanwhile: stopping"
                    );
                    return Ok(Outcome::CordonedIdle {
                        waited: started.elapsed(),
                    });
                }
                Ok(_) => return Ok(Outcome::NotDraining),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read the node; trying again");
                }
            }
        }
        if last.as_ref() != Some(&now) {
            tracing::info!(
                node = %args.node_name,
                attachments = ?now.0,
                mounts = now.1.len(),
                "node being drained: waiting for the driver's volumes to leave before stopping"
            );
            last = Some(now);
        }
        tokio::time::sleep(poll).await;
    }
}

/// The path the node plugin serves the hook on (with `--http-endpoint`),
/// for the node-driver-registrar's preStop (`httpGet`): the registrar
/// deregisters the driver from kubelet as soon as it is told to stop, and
/// kubelet unmounts nothing of a driver it no longer knows, so on a
/// drained node it must wait as long as the plugin does. Its image holds
/// only its own binary: it waits by asking the plugin.
pub const HTTP_PATH: &str = "/pre-stop";

/// The plugin's `/pre-stop` route: a request joins the run of the hook
/// under way, or starts one (so callers cannot multiply its API calls, and
/// every answer is of now); a run starts at most once per poll interval,
/// so that anyone who reaches the port, asking in a loop, costs the API at
/// most one read of the node per interval (all nodes share one service
/// account, whose calls the apiserver throttles together); answers 200
/// with the outcome, or 503 when the API refused.
///
/// The answer lets the registrar stop, and it then removes the driver's
/// registration socket by path: with `handover`, the socket the path
/// holds is kept first and put back if a successor serves on it
/// ([`crate::registration`]), the plugin not exiting before that is done.
pub fn http_handler(
    client: kube_api::Client,
    args: PreStopArgs,
    driver: String,
    handover: Option<(
        crate::registration::RegistrationSocket,
        plugin_runtime::ExitHolds,
    )>,
) -> plugin_runtime::http_endpoint::HttpHandler {
    type Shared = tokio::sync::watch::Receiver<Option<(u16, String)>>;
    let running: std::sync::Arc<std::sync::Mutex<(Option<Shared>, Option<Instant>)>> =
        Default::default();
    let gap = Duration::from_millis(args.poll_interval_ms.max(50));
    std::sync::Arc::new(move || {
        let mut rx = {
            let mut slot = running.lock().unwrap_or_else(|p| p.into_inner());
            let (run_rx, last_start) = &mut *slot;
            match run_rx.as_ref() {
                // a run under way (or about to start): wait for its answer
                Some(rx) if rx.borrow().is_none() => rx.clone(),
                // none yet, or an answer of earlier: ask afresh (an early
                // "not draining", from anyone who can reach the port, must
                // not answer the registrar's call at the real drain), once
                // the interval since the last run began has passed
                _ => {
                    let now = Instant::now();
                    let start_at = last_start.map_or(now, |t| (t + gap).max(now));
                    *last_start = Some(start_at);
                    let (tx, rx) = tokio::sync::watch::channel(None);
                    let (client, args, driver) = (client.clone(), args.clone(), driver.clone());
                    let handover = handover.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep_until(start_at.into()).await;
                        let outcome = run(&client, &args, &driver).await;
                        // whatever the answer, the registrar stops after it
                        if let Some((socket, holds)) = &handover
                            && let Ok(put_back) = socket.keep_for_successor()
                        {
                            holds.spawn(async move {
                                put_back.await;
                            });
                        }
                        let answer = match outcome {
                            Ok(outcome) => {
                                tracing::info!(outcome = ?outcome, "pre-stop wait over (asked over HTTP)");
                                (200, format!("{outcome:?}\n"))
                            }
                            Err(e) => {
                                tracing::warn!(error = %e, "pre-stop wait failed");
                                (503, format!("{e}\n"))
                            }
                        };
                        let _ = tx.send(Some(answer));
                    });
                    *run_rx = Some(rx.clone());
                    rx
                }
            }
        };
        Box::pin(async move {
            match rx.wait_for(Option::is_some).await {
                Ok(v) => v.clone().unwrap_or((500, String::new())),
                Err(_) => (
                    500,
                    "the pre-stop wait ended without an answer\n".to_string(),
                ),
            }
        })
    })
}

/// Adds the `/pre-stop` route to a node plugin's server, on `addr` (its
/// `--pre-stop-endpoint`, a loopback address: kubelet asks from the node,
/// and nobody else may make the plugin read the API or learn the drain
/// state), when it runs in a pod that can ask the API (NODE_NAME and a
/// service account token); otherwise says why not and leaves the server
/// as it is.
pub fn serve_on(
    server: plugin_runtime::PluginServer,
    driver: &str,
    path_root: &Path,
    addr: Option<std::net::SocketAddr>,
) -> plugin_runtime::PluginServer {
    let Some(addr) = addr else {
        return server;
    };
    let Ok(node_name) = std::env::var("NODE_NAME") else {
        tracing::info!("NODE_NAME is not set: no {HTTP_PATH} endpoint");
        return server;
    };
    let client = match kube_api::Client::in_cluster() {
        Ok(c) => c,
        Err(e) => {
            tracing::info!(error = %e, "no Kubernetes API credentials: no {HTTP_PATH} endpoint");
            return server;
        }
    };
    let args = PreStopArgs {
        node_name,
        driver_name: Some(driver.to_string()),
        path_root: path_root.to_path_buf(),
        poll_interval_ms: 1000,
        cordoned_idle_secs: 30,
        log: plugin_runtime::LogArgs::default(),
    };
    with_route(server, client, args, driver, addr)
}

/// How long the plugin, told to stop, watches the registration socket
/// for its registrar's removal (the registrar is told to stop beside it).
const HANDOVER_ON_STOP: Duration = Duration::from_secs(3);

/// The `/pre-stop` route on `addr` with the registration socket's
/// handover ([`crate::registration`]), started when the registrar asks
/// and when the plugin is told to stop, whichever comes first: kubelet
/// runs the preStop hooks of a pod's containers side by side, and the
/// plugin's own may end, and the plugin be told to stop, before the
/// registrar's request arrives. The route then still answers, the
/// process held until the handover ends. Until then the registration
/// socket is guarded ([`crate::registration::RegistrationSocket::guard`]):
/// another release's registrar that removes it is undone.
pub fn with_route(
    server: plugin_runtime::PluginServer,
    client: kube_api::Client,
    args: PreStopArgs,
    driver: &str,
    addr: std::net::SocketAddr,
) -> plugin_runtime::PluginServer {
    let registration = crate::registration::RegistrationSocket::new(&args.path_root, driver);
    registration.remove_stale_keep();
    match tokio::runtime::Handle::try_current() {
        Ok(rt) => drop(rt.spawn(registration.clone().guard())),
        Err(e) => {
            tracing::warn!(error = %e, "no runtime: the registration socket is not guarded")
        }
    }
    let holds = server.exit_holds();
    let on_stop = (
        registration.clone().with_removal_bound(HANDOVER_ON_STOP),
        holds.clone(),
    );
    server
        .on_shutdown(move || {
            let (registration, holds) = on_stop;
            registration.stop_guard();
            if let Ok(put_back) = registration.keep_for_successor() {
                holds.spawn(async move {
                    put_back.await;
                });
            }
        })
        .local_route(
            addr,
            HTTP_PATH,
            http_handler(
                client,
                args,
                driver.to_string(),
                Some((registration, holds)),
            ),
        )
}

fn being_removed(node: &kube_api::Node) -> bool {
    node.spec
        .taints
        .iter()
        .any(|t| REMOVAL_TAINTS.contains(&t.key.as_str()))
}

fn draining(node: &kube_api::Node) -> bool {
    node.spec.unschedulable
        || node
            .spec
            .taints
            .iter()
            .any(|t| DRAIN_TAINTS.contains(&t.key.as_str()))
}

/// The mount points below `root` that belong to `driver`: its staging
/// directories (`plugins/kubernetes.io/csi/<driver>/...`), and the pod and
/// raw-block publish mounts whose `vol_data.json` names it.
pub fn driver_mounts(mountinfo: &str, root: &Path, driver: &str) -> BTreeSet<PathBuf> {
    let csi = root.join("plugins/kubernetes.io/csi");
    let staging = csi.join(driver);
    let devices = csi.join("volumeDevices");
    let pods = root.join("pods");
    host_ops::mountinfo::parse(mountinfo)
        .into_iter()
        .map(|m| m.mount_point)
        .filter(|p| {
            if p.starts_with(&staging) {
                return true;
            }
            if let Ok(rest) = p.strip_prefix(&devices) {
                // volumeDevices/{staging,publish}/<pv>/...: the PV's data
                // file is volumeDevices/<pv>/data/vol_data.json
                let mut parts = rest.components();
                let (_, Some(pv)) = (parts.next(), parts.next()) else {
                    return false;
                };
                return names_driver(&devices.join(pv).join("data/vol_data.json"), driver);
            }
            if let Ok(rest) = p.strip_prefix(&pods) {
                // pods/<uid>/volumes/kubernetes.io~csi/<pv>/mount
                let parts: Vec<_> = rest.components().collect();
                if parts.len() == 5
                    && parts[1].as_os_str() == "volumes"
                    && parts[2].as_os_str() == "kubernetes.io~csi"
                    && parts[4].as_os_str() == "mount"
                {
                    let dir = pods.join(rest).with_file_name("vol_data.json");
                    return names_driver(&dir, driver);
                }
            }
            false
        })
        .collect()
}

fn names_driver(vol_data: &Path, driver: &str) -> bool {
    #[derive(serde::Deserialize)]
    struct VolData {
        #[serde(rename = "driverName", default)]
        driver_name: String,
    }
    std::fs::read(vol_data)
        .ok()
        .and_then(|b| serde_json::from_slice::<VolData>(&b).ok())
        .is_some_and(|d| d.driver_name == driver)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(point: &str) -> String {
        format!("36 35 0:1 / {point} rw,relatime shared:1 - ext4 /dev/loop1 rw\n")
    }

    #[test]
    fn the_drivers_mounts_are_told_from_others() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let pv_dir = |uid: &str, pv: &str, driver: &str| {
            let d = root.join(format!("pods/{uid}/volumes/kubernetes.io~csi/{pv}"));
            std::fs::create_dir_all(d.join("mount")).unwrap();
            std::fs::write(
                d.join("vol_data.json"),
                format!(r#"{{"driverName":"{driver}","specVolID":"{pv}"}}"#),
            )
            .unwrap();
            d.join("mount")
        };
        let ours = pv_dir("u1", "pvc-1", "cinder.csi.openstack.org");
        let theirs = pv_dir("u2", "pvc-2", "other.csi.example.org");
        let blk = root.join("plugins/kubernetes.io/csi/volumeDevices/pvc-3/data");
        std::fs::create_dir_all(&blk).unwrap();
        std::fs::write(
            blk.join("vol_data.json"),
            r#"{"driverName":"cinder.csi.openstack.org"}"#,
        )
        .unwrap();
        let staging =
            root.join("plugins/kubernetes.io/csi/cinder.csi.openstack.org/abc/globalmount");
        let other_staging =
            root.join("plugins/kubernetes.io/csi/other.csi.example.org/d/globalmount");
        let publish_blk = root.join("plugins/kubernetes.io/csi/volumeDevices/publish/pvc-3/u3");
        let spaced = root.join("plugins/kubernetes.io/csi/cinder.csi.openstack.org/a b");
        let info = [
            line(&ours.to_string_lossy()),
            line(&theirs.to_string_lossy()),
            line(&staging.to_string_lossy()),
            line(&other_staging.to_string_lossy()),
            line(&publish_blk.to_string_lossy()),
            line(&spaced.to_string_lossy().replace(' ', "\\040")),
            line("/var/lib/somewhere-else"),
            line(
                &root
                    .join("pods/u4/volumes/kubernetes.io~empty-dir/x")
                    .to_string_lossy(),
            ),
        ]
        .concat();
        let got = driver_mounts(&info, root, "cinder.csi.openstack.org");
        let want: BTreeSet<PathBuf> = [ours, staging, publish_blk, spaced].into_iter().collect();
        assert_eq!(got, want);
        assert!(driver_mounts(&info, root, "nobody.example.org").is_empty());
    }

    #[test]
    fn a_node_is_drained_when_cordoned_or_tainted_for_removal() {
        let node = |unschedulable: bool, taint: &str| kube_api::Node {
            spec: kube_api::NodeSpec {
                unschedulable,
                taints: vec![kube_api::Taint {
                    key: taint.into(),
                    effect: "NoSchedule".into(),
                }],
            },
            ..Default::default()
        };
        assert!(draining(&node(true, "")));
        assert!(draining(&node(false, "ToBeDeletedByClusterAutoscaler")));
        assert!(draining(&node(false, "karpenter.sh/disrupted")));
        assert!(!draining(&node(
            false,
            "node-role.kubernetes.io/control-plane"
        )));
    }
}
