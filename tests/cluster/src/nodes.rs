//! What the many-node scenarios and figures share: cordoned nodes that
//! come back, nodes that die and come back, workloads placed on given
//! nodes, and waits for a pod on a given node.

use std::time::Duration;

use serde_json::Value;

use crate::{APP_IMAGE, Cluster, Result, placement};

/// A node cordoned for as long as the guard lives.
#[derive(Debug)]
pub struct Cordoned {
    kubeconfig: std::path::PathBuf,
    node: String,
}

impl Drop for Cordoned {
    fn drop(&mut self) {
        let _ = std::process::Command::new("kubectl")
            .arg(format!("--kubeconfig={}", self.kubeconfig.display()))
            .args(["uncordon", &self.node])
            .output();
    }
}

/// The taint an operator puts on a node known to be shut down
/// (Kubernetes' non-graceful node shutdown): its pods are deleted at once
/// and their volumes detached without the 6 minutes' wait.
pub const OUT_OF_SERVICE: &str = "node.kubernetes.io/out-of-service=nodeshutdown:NoExecute";

/// A node killed by `cluster.py kill-node`. Dropped before
/// [`Cluster::revive_node`] (a test that failed on the way), it brings the
/// node back as a new machine, so that the tests after it find the
/// cluster whole.
#[derive(Debug)]
pub struct DeadNode {
    pub name: String,
    revived: bool,
}

impl Drop for DeadNode {
    fn drop(&mut self) {
        if !self.revived {
            let _ = std::process::Command::new("python3")
                .arg(crate::repo().join("tests/cluster/cluster.py"))
                .args(["revive-node", &self.name, "--as-new"])
                .status();
        }
    }
}

impl Cluster {
    /// The node dies: its processes killed at once, its server SHUTOFF
    /// (`cluster.py kill-node`).
    pub async fn kill_node(&self, node: &str) -> Result<DeadNode> {
        let dead = DeadNode {
            name: node.to_string(),
            revived: false,
        };
        self.cluster_py(&["kill-node", node]).await?;
        Ok(dead)
    }

    /// The dead node back (`cluster.py revive-node`), until Ready; with
    /// `as_new`, registered anew as a replacement machine. Without, the
    /// operator's out-of-service taint is taken off once it is back.
    pub async fn revive_node(&self, mut dead: DeadNode, as_new: bool) -> Result<()> {
        let name = dead.name.clone();
        let mut args = vec!["revive-node", name.as_str()];
        if as_new {
            args.push("--as-new");
        }
        let revived = self.cluster_py(&args).await;
        dead.revived = revived.is_ok();
        revived?;
        if !as_new {
            let key = OUT_OF_SERVICE.split('=').next().unwrap_or_default();
            self.kubectl(&["taint", "node", &name, &format!("{key}-")])
                .await?;
        }
        Ok(())
    }

    /// Waits until the node controller calls the node not Ready (its
    /// kubelet stopped renewing its lease); how long that took.
    pub async fn wait_node_not_ready(&self, node: &str) -> Result<Duration> {
        let t = std::time::Instant::now();
        self.wait_for(
            &format!("node {node} not Ready"),
            Duration::from_secs(180),
            || async move {
                let n = self.get("node", node, None).await?.unwrap_or_default();
                let ready = n["status"]["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|c| c["type"] == "Ready")
                    .map(|c| c["status"].as_str().unwrap_or_default().to_string());
                Ok(if ready.as_deref() == Some("True") {
                    Err("Ready".to_string())
                } else {
                    Ok(())
                })
            },
        )
        .await?;
        Ok(t.elapsed())
    }

    /// The operator's step after making sure the node is down: the
    /// out-of-service taint; then waits until each pod of `apps` (a
    /// StatefulSet's `<app>-0`, uid in `uids`) runs again on `to`. Returns
    /// the time from the taint until the last of them ran.
    pub async fn fail_over(
        &self,
        ns: &str,
        dead: &str,
        apps: &[(&str, &str)],
        to: &str,
    ) -> Result<Duration> {
        let t = std::time::Instant::now();
        self.kubectl(&["taint", "node", dead, OUT_OF_SERVICE])
            .await?;
        for (pod, uid) in apps {
            self.wait_running_on(ns, pod, to, uid).await?;
        }
        Ok(t.elapsed())
    }

    /// Each node's zone (`topology.kubernetes.io/zone`).
    pub async fn node_zones(&self) -> Result<std::collections::BTreeMap<String, String>> {
        Ok(self
            .list("nodes", &[])
            .await?
            .iter()
            .filter_map(|n| {
                Some((
                    n["metadata"]["name"].as_str()?.to_string(),
                    n["metadata"]["labels"]["topology.kubernetes.io/zone"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                ))
            })
            .collect())
    }

    /// The nodes a bound claim's volume can be used on: those whose labels
    /// match its PV's node affinity (every node when it has none).
    pub async fn nodes_that_reach_claim(&self, ns: &str, claim: &str) -> Result<Vec<String>> {
        let pvc = self.get("pvc", claim, Some(ns)).await?.unwrap_or_default();
        let pv_name = pvc["spec"]["volumeName"].as_str().unwrap_or_default();
        let pv = self.get("pv", pv_name, None).await?.unwrap_or_default();
        let terms = pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let nodes = self.list("nodes", &[]).await?;
        let matches = |node: &Value, term: &Value| {
            term["matchExpressions"]
                .as_array()
                .into_iter()
                .flatten()
                .all(|e| {
                    let label = &node["metadata"]["labels"][e["key"].as_str().unwrap_or_default()];
                    e["operator"] == "In"
                        && e["values"]
                            .as_array()
                            .is_some_and(|vs| vs.iter().any(|v| v == label))
                })
        };
        Ok(nodes
            .iter()
            .filter(|node| terms.is_empty() || terms.iter().any(|t| matches(node, t)))
            .filter_map(|node| node["metadata"]["name"].as_str().map(str::to_string))
            .collect())
    }

    /// Cordons the node until the guard drops.
    pub async fn cordon(&self, node: &str) -> Result<Cordoned> {
        self.kubectl(&["cordon", node]).await?;
        Ok(Cordoned {
            kubeconfig: self.kubeconfig.clone(),
            node: node.to_string(),
        })
    }

    /// The pod once it runs on `node` under another uid than `not_uid`
    /// (within 4 minutes).
    pub async fn wait_running_on(
        &self,
        ns: &str,
        pod: &str,
        node: &str,
        not_uid: &str,
    ) -> Result<Value> {
        self.wait_running_on_within(ns, pod, node, not_uid, Duration::from_secs(240))
            .await
    }

    /// The same, within `timeout`.
    pub async fn wait_running_on_within(
        &self,
        ns: &str,
        pod: &str,
        node: &str,
        not_uid: &str,
        timeout: Duration,
    ) -> Result<Value> {
        self.wait_for(
            &format!("pod {ns}/{pod} running on {node}"),
            timeout,
            || async move {
                let Some(p) = self.get("pod", pod, Some(ns)).await? else {
                    return Ok(Err("no such pod".into()));
                };
                let (phase, on, uid) = (
                    p["status"]["phase"].as_str().unwrap_or_default(),
                    p["spec"]["nodeName"].as_str().unwrap_or_default(),
                    p["metadata"]["uid"].as_str().unwrap_or_default(),
                );
                Ok(if phase == "Running" && on == node && uid != not_uid {
                    Ok(p)
                } else {
                    Err(format!("{phase} on {on:?} (uid {uid})"))
                })
            },
        )
        .await
    }

    /// The running pod (not being deleted) labelled `app=<app>`, and its
    /// node.
    pub async fn app_pod(&self, ns: &str, app: &str) -> Option<(String, String)> {
        self.list("pods", &["-n", ns, "-l", &format!("app={app}")])
            .await
            .ok()?
            .into_iter()
            .find(|p| {
                p["status"]["phase"] == "Running" && p["metadata"]["deletionTimestamp"].is_null()
            })
            .map(|p| {
                (
                    p["metadata"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                    p["spec"]["nodeName"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                )
            })
    }
}

/// A StatefulSet of one pod on one of `nodes` running `script`, with a
/// 1 GiB claim of `class` at /data.
pub fn stateful_set(name: &str, class: &str, nodes: &[&str], script: &str) -> String {
    let script = script.replace('\'', "'\"'\"'");
    format!(
        "apiVersion: apps/v1\nkind: StatefulSet\nmetadata:\n  name: {name}\nspec:\n  replicas: 1\n  serviceName: {name}\n  selector:\n    matchLabels:\n      app: {name}\n  template:\n    metadata:\n      labels:\n        app: {name}\n    spec:\n      terminationGracePeriodSeconds: 2\n{}      containers:\n      - name: app\n        image: {APP_IMAGE}\n        command: [\"sh\", \"-c\", '{script}']\n        volumeMounts:\n        - name: data\n          mountPath: /data\n  volumeClaimTemplates:\n  - metadata:\n      name: data\n    spec:\n      accessModes: [ReadWriteOnce]\n      storageClassName: {class}\n      resources:\n        requests:\n          storage: 1Gi\n",
        placement(nodes, 6),
    )
}

/// A Deployment of one pod on one of `nodes`, with the claim at /data,
/// writing /data/token-<name> once.
pub fn deployment(name: &str, claim: &str, nodes: &[&str]) -> String {
    format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: {name}\nspec:\n  replicas: 1\n  strategy:\n    type: Recreate\n  selector:\n    matchLabels:\n      app: {name}\n  template:\n    metadata:\n      labels:\n        app: {name}\n    spec:\n      terminationGracePeriodSeconds: 2\n{}      containers:\n      - name: app\n        image: {APP_IMAGE}\n        command: [\"sh\", \"-c\", '[ -f /data/token-{name} ] || cat /proc/sys/kernel/random/uuid > /data/token-{name}; sleep 100000']\n        volumeMounts:\n        - name: data\n          mountPath: /data\n      volumes:\n      - name: data\n        persistentVolumeClaim:\n          claimName: {claim}\n",
        placement(nodes, 6),
    )
}

/// A pod manifest placed by [`crate::placed_on`], preferring `node` among
/// its nodes (a soft preference the scheduler weighs, never a must).
pub fn preferring(placed_pod_yaml: &str, node: &str) -> String {
    let prefer = format!(
        "    nodeAffinity:\n      preferredDuringSchedulingIgnoredDuringExecution:\n      - weight: 100\n        preference:\n          matchExpressions:\n          - key: kubernetes.io/hostname\n            operator: In\n            values: [{node}]\n"
    );
    placed_pod_yaml.replacen("    nodeAffinity:\n", &prefer, 1)
}
