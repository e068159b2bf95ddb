//! What the many-node scenarios and figures share: cordoned nodes that
//! come back, workloads placed on given nodes, and waits for a pod on a
//! given node.

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

impl Cluster {
    /// Cordons the node until the guard drops.
    pub async fn cordon(&self, node: &str) -> Result<Cordoned> {
        self.kubectl(&["cordon", node]).await?;
        Ok(Cordoned {
            kubeconfig: self.kubeconfig.clone(),
            node: node.to_string(),
        })
    }

    /// The pod once it runs on `node` under another uid than `not_uid`.
    pub async fn wait_running_on(
        &self,
        ns: &str,
        pod: &str,
        node: &str,
        not_uid: &str,
    ) -> Result<Value> {
        self.wait_for(
            &format!("pod {ns}/{pod} running on {node}"),
            Duration::from_secs(240),
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
