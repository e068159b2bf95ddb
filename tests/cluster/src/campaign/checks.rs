//! The campaign's invariant checks after a step: convergence within the
//! bound, the workload alive and every acknowledged write kept, nothing
//! left behind, nothing leaked, the nodes sampled throughout; and the
//! calls to the cloud.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::{Campaign, Invariant, SHARERS, WRITERS};
use crate::{ClusterError, Result, SUITE_NAMESPACE};

impl Campaign {
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

    pub(super) async fn pods(&self, app: &str) -> Result<Vec<Value>> {
        self.c
            .list("pods", &["-n", self.n(), "-l", &format!("app={app}")])
            .await
    }

    /// The controllers' orphan reports, for what the campaign made: the
    /// orphans, and what is tagged and unnamed but not proven the
    /// cluster's (a leak all the same).
    pub async fn orphans(&self) -> Result<Vec<String>> {
        let mut found = Vec::new();
        for (deployment, container, command) in [
            (
                "csi-cinder-controllerplugin",
                "cinder-csi-plugin",
                "cinder-csi-plugin orphans --cloud-config=/etc/config/cloud.conf --cluster=kubernetes --drivername=cinder.csi.openstack.org",
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
            let listed = |key: &str| {
                report["report"][key]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
            };
            for o in listed("orphans").into_iter().chain(listed("unproven")) {
                // one without a creation time cannot be shown to predate
                // the campaign: it counts, and says so
                match o["created"].as_u64() {
                    Some(t) if t < self.started => {}
                    Some(_) => found.push(format!("{} {} {}", o["kind"], o["id"], o["name"])),
                    None => found.push(format!(
                        "{} {} {} (no creation time)",
                        o["kind"], o["id"], o["name"]
                    )),
                }
            }
        }
        Ok(found)
    }
    /// The calls the proxy saw since its log was cleared, by service
    /// (the first part of the path: `volume`, `compute`, `identity`,
    /// `share`, `key-manager`, `placement`). A log that cannot be read is
    /// an error, never none.
    pub(super) async fn cloud_calls(&self) -> Result<BTreeMap<String, usize>> {
        let calls = self.proxy.calls().await.map_err(|e| {
            ClusterError::Other(format!("the fault proxy's call log cannot be read: {e}"))
        })?;
        let mut by_service = BTreeMap::new();
        for call in calls {
            let service = call
                .path
                .trim_start_matches('/')
                .split('/')
                .next()
                .unwrap_or_default()
                .to_string();
            *by_service.entry(service).or_default() += 1;
        }
        Ok(by_service)
    }

    /// Every check of a step once its faults ended at `faults_ended`
    /// (its window began at `began`): the cluster converged within
    /// `bound` of the faults' end, the workload writing again, every
    /// acknowledged write kept, nothing left behind once the cluster
    /// caught up, nothing leaked, the nodes sampled throughout. The
    /// violations, each with its invariant and `label`; and how long
    /// convergence took.
    pub async fn after_step(
        &self,
        label: &str,
        began: Instant,
        faults_ended: Instant,
        bound: Duration,
    ) -> Result<(Duration, Vec<String>)> {
        let mut found = Vec::new();
        let left = bound
            .saturating_sub(faults_ended.elapsed())
            .max(Duration::from_secs(1));
        if let Err(e) = self.converged(left).await {
            found.push(format!("{:?} at {label}: {e}", Invariant::Converges));
        }
        let converged_in = faults_ended.elapsed();
        if converged_in > bound {
            found.push(format!(
                "{:?} at {label}: converged {:.0} s after the faults ended, past the bound of {} s",
                Invariant::Converges,
                converged_in.as_secs_f64(),
                bound.as_secs()
            ));
        }
        found.extend(self.check_alive(label).await?);
        found.extend(self.check_acknowledged(label).await?);
        // what was unmounted, detached or deleted for good is gone from
        // the nodes and their servers once the cluster caught up
        for left in self.wait_nothing_left_behind(self.catch_up).await? {
            found.push(format!(
                "{:?} at {label}: {left}",
                Invariant::NothingLeftBehind
            ));
        }
        for leaked in self.new_orphans(self.catch_up).await? {
            found.push(format!(
                "{:?} at {label}: {leaked}",
                Invariant::NothingLeaked
            ));
        }
        found.extend(self.check_samples(label, began, Instant::now()));
        Ok((converged_in, found))
    }

    /// The orphans not reported before, once deletions under way had
    /// `bound` to finish; each is reported once.
    async fn new_orphans(&self, bound: Duration) -> Result<Vec<String>> {
        let until = Instant::now() + bound;
        loop {
            let reported = self
                .orphans_reported
                .lock()
                .map(|r| r.clone())
                .unwrap_or_default();
            let found: Vec<String> = self
                .orphans()
                .await?
                .into_iter()
                .filter(|o| !reported.contains(o))
                .collect();
            if found.is_empty() || Instant::now() >= until {
                if let Ok(mut r) = self.orphans_reported.lock() {
                    r.extend(found.iter().cloned());
                }
                return Ok(found);
            }
            tokio::time::sleep(Duration::from_secs(10)).await;
        }
    }
}
