//! The campaign's faults: what starts each class and what ends it.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use openstack_emulator::{FaultAction, FaultRule, RetryHint};

use super::MINUTE;
use super::{Campaign, FaultClass};
use crate::{ClusterError, Result, SUITE_NAMESPACE};

impl Campaign {
    /// Adds a rule of `class`'s at the proxy, labelled with the class so
    /// that what it served is read back as the class's.
    pub async fn proxy_rule(&self, class: FaultClass, rule: FaultRule) -> Result<()> {
        self.proxy
            .add_fault(&rule.labelled(&format!("{class:?}")))
            .await
            .map_err(ClusterError::Other)
    }

    /// Ends a step's faults: every fault but the proxy's (a stopped
    /// kubelet last: it starts only on a node that can reach the
    /// apiservers again, once a cut of the same node ended), then the
    /// proxy's once each was felt or 2 minutes passed (an operation held
    /// up by an outage or a restart reaches the cloud late). What each
    /// fault is shown to have done (the proxy's: what it served; a pod
    /// deletion: the pods gone, by uid; an outage: a call that failed
    /// during it, and for Keystone's a plugin's call refused for its
    /// expired token while Keystone was down; a cut: a probe from the node that failed; a kubelet
    /// stopped: its node unreachable; a restart: cluster.py's own wait),
    /// and those shown to have done nothing.
    pub(super) async fn end_faults(
        &self,
        faults: &[FaultClass],
        patience: Duration,
    ) -> Result<(BTreeMap<FaultClass, u64>, Vec<FaultClass>)> {
        let mut ending = faults.to_vec();
        ending.sort_by_key(|f| *f == FaultClass::KubeletStoppedPastEviction);
        for f in &ending {
            self.end(*f).await?;
        }
        // a proxy fault stays armed until the operation meets it, as long
        // as convergence may take: after an outage the sidecars back off
        // (up to 5 minutes a volume), and the attach a busy Nova waits
        // for may come minutes after the window (seen: a move's attach
        // past the window and 2 minutes more, after a Keystone outage)
        let (mut served, mut unserved) = self.until_served(faults, patience).await?;
        self.clear_proxy_faults().await?;
        self.prove_pods_gone(2 * MINUTE).await?;
        let proofs = self
            .proofs
            .lock()
            .map(|mut p| std::mem::take(&mut *p))
            .unwrap_or_default();
        for f in faults.iter().filter(|f| !f.at_the_proxy()) {
            let n = proofs.get(f).copied().unwrap_or(0);
            served.insert(*f, n);
            if n == 0 {
                unserved.push(*f);
            }
        }
        Ok((served, unserved))
    }

    /// Keeps Keystone stopped until a plugin felt it, or `patience` is
    /// over: a call of a plugin's met its expired token, or a plugin's
    /// login failed at the proxy (Keystone not answering; a controller
    /// started during the outage holds no token to be refused, as in a
    /// replay of seed 1796497017, where 12 logins failed and the outage
    /// was taken for unfelt). The outage's proof is then the number of
    /// those refusals and failed logins while Keystone was down, and none
    /// if there was none (or no fresh client was refused).
    async fn keystone_outage_felt(&self, patience: Duration) -> Result<()> {
        let class = FaultClass::KeystoneOutage;
        let since = self
            .keystone_down_since
            .lock()
            .ok()
            .and_then(|mut s| s.take())
            .unwrap_or_else(now_ms);
        let until = Instant::now() + patience;
        let felt = loop {
            let refused = self
                .served_by_class()
                .await?
                .get(&format!("{class:?}"))
                .copied()
                .unwrap_or(0);
            let calls = self.proxy.calls().await.map_err(|e| {
                ClusterError::Other(format!("the fault proxy's call log cannot be read: {e}"))
            })?;
            let felt = refused + failed_logins(&calls, since);
            if felt > 0 || Instant::now() >= until {
                break felt;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        };
        if let Ok(mut p) = self.proofs.lock() {
            let refused = p.get(&class).copied().unwrap_or(0) > 0;
            p.insert(class, if refused { felt } else { 0 });
        }
        Ok(())
    }

    /// Counts `n` proofs that `class` happened.
    fn prove(&self, class: FaultClass, n: u64) {
        if let Ok(mut p) = self.proofs.lock() {
            *p.entry(class).or_default() += n;
        }
    }

    /// Deletes the pods `selector` (kubectl's `-l`, and `more` of its
    /// arguments) picks in `namespace`, their uids kept: the fault is
    /// proven by each of them gone.
    async fn delete_pods(
        &self,
        class: FaultClass,
        namespace: &str,
        selector: &str,
        more: &[&str],
    ) -> Result<()> {
        let mut args = vec!["-n", namespace, "-l", selector];
        args.extend_from_slice(more);
        let uids: Vec<String> = self
            .c
            .list("pods", &args)
            .await?
            .iter()
            .filter_map(|p| p["metadata"]["uid"].as_str().map(str::to_string))
            .collect();
        let mut delete = vec!["delete", "pod"];
        delete.extend_from_slice(&args);
        delete.push("--wait=false");
        if class == FaultClass::ControllerKilled {
            delete.extend_from_slice(&["--grace-period=0", "--force"]);
        }
        self.c.kubectl(&delete).await?;
        if let Ok(mut d) = self.doomed.lock() {
            d.push((class, uids));
        }
        Ok(())
    }

    /// The pods the step's faults deleted, gone (by uid: a replacement
    /// of the same name is another pod), within `patience`; each one
    /// gone proves its fault.
    async fn prove_pods_gone(&self, patience: Duration) -> Result<()> {
        let doomed = self
            .doomed
            .lock()
            .map(|mut d| std::mem::take(&mut *d))
            .unwrap_or_default();
        if doomed.is_empty() {
            return Ok(());
        }
        let until = Instant::now() + patience;
        loop {
            let alive: std::collections::HashSet<String> = self
                .c
                .list("pods", &["-A"])
                .await?
                .iter()
                .filter_map(|p| p["metadata"]["uid"].as_str().map(str::to_string))
                .collect();
            let all_gone = doomed
                .iter()
                .all(|(_, uids)| uids.iter().all(|u| !alive.contains(u)));
            if all_gone || Instant::now() >= until {
                for (class, uids) in &doomed {
                    let gone = uids.iter().filter(|u| !alive.contains(*u)).count();
                    self.prove(*class, gone as u64);
                }
                return Ok(());
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    }

    /// Whether the cloud refuses a fresh client now (a new session asks
    /// Keystone for a token, then Cinder for its volume types): what
    /// proves an outage of either.
    async fn cloud_refuses(&self) -> bool {
        let Ok(cinder) = self.c.cinder() else {
            return true;
        };
        !matches!(
            tokio::time::timeout(Duration::from_secs(15), cinder.list_volume_types()).await,
            Ok(Ok(_))
        )
    }

    /// Whether `node` reaches `what` (cloud, apiserver) now, probed from
    /// its own network namespace.
    async fn node_reaches(&self, node: &str, what: &str) -> Result<bool> {
        let out = self.c.cluster_py(&["probe-node", node, what]).await?;
        Ok(out.lines().any(|l| l.trim() == "reachable"))
    }

    /// Takes every rule away from the proxy.
    pub async fn clear_proxy_faults(&self) -> Result<()> {
        self.proxy.clear_faults().await.map_err(ClusterError::Other)
    }

    /// What the proxy's rules served, by the class they belong to.
    pub(super) async fn served_by_class(&self) -> Result<BTreeMap<String, u64>> {
        let mut by_class = BTreeMap::new();
        for rule in self.proxy.faults().await.map_err(ClusterError::Other)? {
            *by_class.entry(rule.label.unwrap_or_default()).or_default() += rule.served;
        }
        Ok(by_class)
    }

    /// Keeps the step's proxy faults in place until each has served at
    /// least once, or `patience` is over (an operation slowed by the
    /// step's other faults reaches the cloud late): a fault that was
    /// never felt proves nothing. What each class served, and the classes
    /// that served nothing.
    pub async fn until_served(
        &self,
        faults: &[FaultClass],
        patience: Duration,
    ) -> Result<(BTreeMap<FaultClass, u64>, Vec<FaultClass>)> {
        let until = Instant::now() + patience;
        loop {
            let by_label = self.served_by_class().await?;
            let served: BTreeMap<FaultClass, u64> = faults
                .iter()
                .filter(|f| f.at_the_proxy())
                .map(|f| (*f, by_label.get(&format!("{f:?}")).copied().unwrap_or(0)))
                .collect();
            let unserved: Vec<FaultClass> = served
                .iter()
                .filter(|(_, n)| **n == 0)
                .map(|(f, _)| *f)
                .collect();
            if unserved.is_empty() || Instant::now() >= until {
                return Ok((served, unserved));
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    }

    /// The node the first writer runs on, if it runs.
    async fn first_writers_node(&self) -> Result<Option<String>> {
        Ok(self
            .pods("writer")
            .await?
            .first()
            .and_then(|p| p["spec"]["nodeName"].as_str().map(str::to_string)))
    }

    /// A node other than A (this host, which cannot be cut off): the
    /// first writer's, else the first of the others.
    async fn node_to_cut(&self) -> Result<String> {
        match self.first_writers_node().await? {
            Some(n) if n != self.c.node => Ok(n),
            _ => self
                .c
                .nodes()
                .await?
                .into_iter()
                .find(|n| *n != self.c.node)
                .ok_or_else(|| ClusterError::Other("no node but A to cut off".into())),
        }
    }

    /// Cuts a node off from `what` (cloud, apiserver) for `length`.
    async fn cut_node(&self, what: &str, length: Duration) -> Result<()> {
        let node = {
            let known = self
                .cut
                .lock()
                .ok()
                .and_then(|c| c.as_ref().map(|c| c.0.clone()));
            match known {
                Some(n) => n,
                None => self.node_to_cut().await?,
            }
        };
        self.c.cluster_py(&["cut-node", &node, what]).await?;
        let class = if what == "cloud" {
            FaultClass::NodeCutFromCloud
        } else {
            FaultClass::NodeCutFromApiserver
        };
        if !self.node_reaches(&node, what).await? {
            self.prove(class, 1);
        }
        if let Ok(mut c) = self.cut.lock()
            && c.is_none()
        {
            *c = Some((node, Instant::now(), length));
        }
        Ok(())
    }

    /// Ends a node's cuts once they lasted their length.
    async fn mend_node(&self) -> Result<()> {
        let cut = self.cut.lock().ok().and_then(|mut c| c.take());
        if let Some((node, since, length)) = cut {
            tokio::time::sleep(length.saturating_sub(since.elapsed())).await;
            self.c.cluster_py(&["mend-node", &node]).await?;
        }
        Ok(())
    }

    /// Starts a fault; what ends it when its window is over.
    pub(super) async fn inject(&self, class: FaultClass, cut: Duration) -> Result<()> {
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
                // a rate an operation exceeds (any two calls to a service
                // within 5 s): the throttle is felt, and its hint tells
                // how long to wait
                for service in ["/volume/", "/compute/"] {
                    self.proxy_rule(
                        class,
                        FaultRule::new(
                            None,
                            service,
                            FaultAction::Throttle {
                                per_second: 0.2,
                                burst: 1,
                                hint: RetryHint::XRateLimitRetryAfter,
                            },
                        ),
                    )
                    .await?;
                }
            }
            FaultClass::NovaBusy => {
                // the first two attaches: one busy answer, then one more
                // after the retry (the draw pairs this with an attach)
                self.proxy_rule(
                    class,
                    FaultRule::new(Some("POST"), "/os-volume_attachments", busy).times(2),
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
                        class,
                        FaultRule::new(Some(method), path, FaultAction::LoseAnswer).times(1),
                    )
                    .await?;
                }
            }
            FaultClass::CloudSlow => {
                for service in ["/volume/", "/compute/"] {
                    self.proxy_rule(
                        class,
                        // the first eight calls to each: an API slow for a
                        // while, felt by any operation (a draw, or every
                        // second call, could spare all of a few)
                        FaultRule::new(None, service, FaultAction::Delay { millis: 1500 }).times(8),
                    )
                    .await?;
                }
            }
            FaultClass::CinderOutage => {
                self.outage("stop", "cinder").await?;
                if self.cloud_refuses().await {
                    self.prove(class, 1);
                }
            }
            FaultClass::KeystoneOutage => {
                self.outage("stop", "keystone").await?;
                // every token held now is expired: its next call is
                // refused, and its holder must ask the stopped Keystone
                self.proxy_rule(
                    class,
                    FaultRule::new(None, "/", FaultAction::TokensExpired).except("/identity"),
                )
                .await?;
                if self.cloud_refuses().await {
                    self.prove(class, 1);
                }
                if let Ok(mut since) = self.keystone_down_since.lock() {
                    *since = Some(now_ms());
                }
            }
            FaultClass::ControllerKilled => {
                self.delete_pods(
                    class,
                    SUITE_NAMESPACE,
                    "app=csi-cinder-controllerplugin",
                    &[],
                )
                .await?;
            }
            FaultClass::NodePluginRestarted => {
                let node = self
                    .first_writers_node()
                    .await?
                    .unwrap_or_else(|| self.c.node.clone());
                self.delete_pods(
                    class,
                    SUITE_NAMESPACE,
                    "app=csi-cinder-nodeplugin",
                    &["--field-selector", &format!("spec.nodeName={node}")],
                )
                .await?;
            }
            FaultClass::KubeletRestarted => {
                // cluster.py stops it, starts it and waits for its node
                // Ready again, or fails
                self.c.cluster_py(&["restart-kubelet"]).await?;
                self.prove(class, 1);
            }
            FaultClass::NodeCutFromCloud => self.cut_node("cloud", cut).await?,
            FaultClass::NodeCutFromApiserver => self.cut_node("apiserver", cut).await?,
            FaultClass::KubeletStoppedPastEviction => {
                let node = self.node_to_cut().await?;
                self.c.cluster_py(&["stop-kubelet", &node]).await?;
                if let Ok(mut k) = self.kubelet_stopped.lock() {
                    *k = Some(node);
                }
            }
            FaultClass::ClusterRestarted => {
                // as a kubelet's restart: every process stopped, started
                // and waited for, or the command fails
                self.c.cluster_py(&["restart-cluster"]).await?;
                self.prove(class, 1);
            }
            FaultClass::SidecarPodsDeleted => {
                for (namespace, app) in [
                    (SUITE_NAMESPACE, "csi-cinder-controllerplugin"),
                    (SUITE_NAMESPACE, "csi-manila-cephfs-controllerplugin"),
                    ("kube-system", "snapshot-controller"),
                ] {
                    self.delete_pods(class, namespace, &format!("app={app}"), &[])
                        .await?;
                }
            }
        }
        Ok(())
    }

    /// Ends a kubelet's stop once it lasted past the eviction timeout:
    /// the node is unreachable and the workload's pods there evicted;
    /// those are force-deleted (their containers still run, unwatched),
    /// and the kubelet starts again only after their replacements have
    /// waited a while on the volumes still attached to the node.
    async fn start_stopped_kubelet(&self) -> Result<()> {
        let Some(node) = self.kubelet_stopped.lock().ok().and_then(|mut k| k.take()) else {
            return Ok(());
        };
        let n = self.n().to_string();
        let workload = ["-n", &n, "-l", "app in (writer,sharer)", "--field-selector"];
        let on_node = format!("spec.nodeName={node}");
        let evicted = self
            .c
            .wait_for(
                &format!("{node} unreachable and the workload's pods there evicted"),
                3 * MINUTE,
                || async {
                    let taints = self.c.get("node", &node, None).await?.unwrap_or_default()["spec"]
                        ["taints"]
                        .as_array()
                        .cloned()
                        .unwrap_or_default();
                    let unreachable = taints
                        .iter()
                        .any(|t| t["key"] == "node.kubernetes.io/unreachable");
                    let mut args = workload.to_vec();
                    args.push(&on_node);
                    let pods = self.c.list("pods", &args).await?;
                    let waiting = pods
                        .iter()
                        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
                        .count();
                    Ok(if unreachable && waiting == 0 {
                        Ok(pods.len())
                    } else {
                        Err(format!(
                            "unreachable: {unreachable}; {waiting} pods not evicted yet"
                        ))
                    })
                },
            )
            .await;
        // the kubelet starts again whatever happened: a fault never
        // outlives its step
        if let Ok(pods) = &evicted {
            // the node was seen unreachable: the stop was felt
            self.prove(FaultClass::KubeletStoppedPastEviction, 1);
            eprintln!(
                "{node}'s kubelet stopped: the node unreachable, {pods} workload pods there evicted"
            );
        }
        // a writer is force-deleted only where its volume can go to
        // another node (its zone has one): a replacement on the stopped
        // node itself starts when the kubelet is back, and kubelet (v1.36)
        // tears down the volumes of a pod it had not seen deleted before
        // it kills that pod's containers, so the old writer went on
        // writing, through its container's own mount, next to its
        // replacement for a second (the witness saw both incarnations
        // acknowledge the same numbers: seed 1796476471, step 0, kubelet-c
        // "UnmountVolume.TearDown succeeded" at 13:21:58.300, "Killing
        // container" at 13:21:59.268). Force-deleting a StatefulSet's pod
        // whose containers may still run is what Kubernetes warns
        // against; there the writers stay Terminating until the kubelet
        // is back and stops them first, as an operator who knows it does
        let zones = self.c.node_zones().await?;
        let zone = zones.get(&node);
        let writers_may_move = zones
            .iter()
            .any(|(other, z)| Some(z) == zone && *other != node);
        let forced_apps = if writers_may_move {
            "app in (writer,sharer)"
        } else {
            "app=sharer"
        };
        eprintln!("{node}: the evicted pods force-deleted: {forced_apps}");
        let forced = match evicted {
            Ok(0) => Ok(()),
            Ok(_) => self
                .c
                .kubectl(&[
                    "delete",
                    "pod",
                    "-n",
                    &n,
                    "-l",
                    forced_apps,
                    "--field-selector",
                    &on_node,
                    "--grace-period=0",
                    "--force",
                    "--wait=false",
                ])
                .await
                .map(|_| ()),
            Err(e) => Err(e),
        };
        if forced.is_ok() {
            tokio::time::sleep(Duration::from_secs(10)).await;
        }
        self.c.cluster_py(&["start-kubelet", &node]).await?;
        forced
    }

    pub(super) async fn end(&self, class: FaultClass) -> Result<()> {
        match class {
            FaultClass::CinderOutage => self.outage("start", "cinder").await,
            FaultClass::KeystoneOutage => {
                self.keystone_outage_felt(MINUTE).await?;
                self.outage("start", "keystone").await
            }
            FaultClass::NodeCutFromCloud | FaultClass::NodeCutFromApiserver => {
                self.mend_node().await
            }
            FaultClass::KubeletStoppedPastEviction => self.start_stopped_kubelet().await,
            _ => Ok(()),
        }
    }

    pub(super) async fn outage(&self, action: &str, service: &str) -> Result<()> {
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
}

/// Now, in milliseconds since the Unix epoch (the proxy's call log's
/// clock).
fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The logins (a POST of a token to Keystone) that failed at Keystone
/// since `since_ms`: the proxy could not reach it, or it answered 5xx
/// itself; a plugin that could not get a token. A failure another rule
/// of the step injected (a lost answer, a status) is not Keystone's.
fn failed_logins(calls: &[openstack_emulator::CallRecord], since_ms: u64) -> u64 {
    let failed = calls
        .iter()
        .filter(|c| {
            let keystones = match c.fault.as_deref() {
                Some(f) => f == "service unreachable",
                None => c.status.is_some_and(|s| s >= 500),
            };
            c.at_ms >= since_ms
                && c.method == "POST"
                && c.path.trim_end_matches('/').ends_with("/auth/tokens")
                && keystones
        })
        .count();
    u64::try_from(failed).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(
        path: &str,
        status: Option<u16>,
        fault: Option<&str>,
        at_ms: u64,
    ) -> openstack_emulator::CallRecord {
        openstack_emulator::CallRecord {
            method: "POST".into(),
            path: path.into(),
            query: String::new(),
            status,
            at_ms,
            took_ms: 1,
            fault: fault.map(str::to_string),
        }
    }

    #[test]
    fn a_login_keystone_could_not_answer_counts_and_nothing_else() {
        let login = "/identity/v3/auth/tokens";
        let calls = [
            // Keystone stopped: the proxy could not reach it
            call(login, None, Some("service unreachable"), 2_000),
            // a front of Keystone's answering for it
            call(login, Some(503), None, 2_100),
            // before the outage (the campaign's own probe)
            call(login, None, Some("service unreachable"), 900),
            // a login that worked, one another rule lost, one refused
            call(login, Some(201), None, 2_200),
            call(login, None, Some("answer lost"), 2_300),
            call(login, Some(401), None, 2_400),
            // not a login
            call(
                "/volume/v3/p/volumes",
                None,
                Some("service unreachable"),
                2_500,
            ),
        ];
        assert_eq!(failed_logins(&calls, 1_000), 2);
        assert_eq!(failed_logins(&calls, 3_000), 0);
    }
}
