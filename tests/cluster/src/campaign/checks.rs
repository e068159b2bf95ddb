//! The campaign's invariant checks: convergence, acknowledged writes,
//! single-attach volumes on one server, orphans, calls to the cloud.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::{Campaign, Invariant, SHARERS, WRITERS};
use crate::{ClusterError, Result, SUITE_NAMESPACE};

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
    pub(super) fn sample_holders(&self) -> tokio::task::JoinHandle<()> {
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
                if o["created"].as_u64().unwrap_or(0) >= self.started {
                    found.push(format!("{} {} {}", o["kind"], o["id"], o["name"]));
                }
            }
        }
        Ok(found)
    }
    pub(super) async fn cloud_calls(&self) -> usize {
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
}

#[cfg(test)]
mod tests {
    use super::*;

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
