//! The campaign's workload (writers and sharers) and the operations that
//! run while a fault lasts.

use std::time::Duration;

use super::witness::{WITNESS_ROOT, WORKLOAD_LOOP};
use super::{Campaign, Operation, SHARERS, WRITERS};
use crate::{Cluster, MULTI_NODE_TAINT_KEY, PodOptions, Result, claim, pod};

/// How long the workload's pods stay on an unreachable or NotReady node
/// before they are evicted: 15 s, not the default 300 s, as operators of
/// stateful apps shorten it, so that a kubelet stopped past it fits a
/// campaign's step.
const EVICTED_AFTER_SECS: u32 = 15;

/// The workload's tolerations: of the test nodes' own taint, and of an
/// unreachable or NotReady node for [`EVICTED_AFTER_SECS`].
fn tolerations() -> String {
    let mut t = format!(
        "      tolerations:\n      - key: {MULTI_NODE_TAINT_KEY}\n        operator: Exists\n        effect: NoSchedule\n"
    );
    for key in [
        "node.kubernetes.io/unreachable",
        "node.kubernetes.io/not-ready",
    ] {
        t.push_str(&format!(
            "      - key: {key}\n        operator: Exists\n        effect: NoExecute\n        tolerationSeconds: {EVICTED_AFTER_SECS}\n"
        ));
    }
    t
}

/// The node label that keeps the writers, and only them, off a node: a
/// move sets it on the node its writer leaves. Cordoning that node
/// instead kept every new pod off it, the controllers' too, which run on
/// node A alone here (the test cloud listens on its loopback): when a
/// fault deleted their pod during a move away from A, the cluster had no
/// attacher until the move gave up (the long campaign's step 43, seed
/// 1795817858: the controller's pod unschedulable for 6.7 minutes).
const WRITERS_AWAY: &str = "csi-cluster-tier/writers-away";

/// [`WRITERS_AWAY`] on a node until dropped.
struct WritersAway {
    kubeconfig: std::path::PathBuf,
    node: String,
}

impl WritersAway {
    async fn on(c: &Cluster, node: &str) -> Result<Self> {
        c.kubectl(&[
            "label",
            "node",
            node,
            &format!("{WRITERS_AWAY}=true"),
            "--overwrite",
        ])
        .await?;
        Ok(Self {
            kubeconfig: c.kubeconfig.clone(),
            node: node.to_string(),
        })
    }
}

impl Drop for WritersAway {
    fn drop(&mut self) {
        let _ = std::process::Command::new("kubectl")
            .arg(format!("--kubeconfig={}", self.kubeconfig.display()))
            .args(["label", "node", &self.node, &format!("{WRITERS_AWAY}-")])
            .output();
    }
}

/// The container's command: the workload's loop on `file`, witnessed in
/// `/witness/$HOSTNAME` (a YAML block, at the container's indentation).
fn workload_command(file: &str) -> String {
    let mut s = "        command:\n        - sh\n        - -c\n        - |\n".to_string();
    for line in format!("f={file}\nw=/witness/$HOSTNAME\n{WORKLOAD_LOOP}").lines() {
        s.push_str(&format!("          {line}\n"));
    }
    s
}

/// The witness's folder on the host, in the workload's pods at
/// `/witness` (a volume of the pod spec, at its indentation).
fn witness_volume(n: &str) -> String {
    format!(
        "      - name: witness\n        hostPath: {{path: {WITNESS_ROOT}/{n}, type: Directory}}\n"
    )
}

/// The writers: a StatefulSet whose claims are ReadWriteOncePod, what an
/// app that must never have two writers asks for (the node plugin refuses
/// a second publish of such a volume while the first is mounted). It does
/// not cover a container whose mount kubelet tore down before killing it:
/// see the kubelet stopped past eviction in `faults.rs`.
fn writers_manifest(n: &str) -> String {
    let tolerate = tolerations();
    format!(
        "apiVersion: apps/v1\nkind: StatefulSet\nmetadata:\n  name: writer\nspec:\n  replicas: {WRITERS}\n  podManagementPolicy: Parallel\n  serviceName: writer\n  selector:\n    matchLabels: {{app: writer}}\n  template:\n    metadata:\n      labels: {{app: writer}}\n    spec:\n      terminationGracePeriodSeconds: 2\n{tolerate}      affinity:\n        nodeAffinity:\n          requiredDuringSchedulingIgnoredDuringExecution:\n            nodeSelectorTerms:\n            - matchExpressions:\n              - {{key: {WRITERS_AWAY}, operator: DoesNotExist}}\n      containers:\n      - name: app\n        image: {}\n{}        volumeMounts:\n        - {{name: data, mountPath: /data}}\n        - {{name: witness, mountPath: /witness}}\n      volumes:\n{}  volumeClaimTemplates:\n  - metadata:\n      name: data\n    spec:\n      accessModes: [ReadWriteOncePod]\n      storageClassName: csi-cinder-sc-xfs\n      resources:\n        requests:\n          storage: 1Gi\n",
        crate::APP_IMAGE,
        workload_command("/data/seq"),
        witness_volume(n)
    )
}

fn sharers_manifest(n: &str) -> String {
    format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: sharer\nspec:\n  replicas: {SHARERS}\n  selector:\n    matchLabels: {{app: sharer}}\n  template:\n    metadata:\n      labels: {{app: sharer}}\n    spec:\n      terminationGracePeriodSeconds: 2\n{}      containers:\n      - name: app\n        image: {}\n{}        volumeMounts:\n        - {{name: data, mountPath: /data}}\n        - {{name: witness, mountPath: /witness}}\n      volumes:\n      - name: data\n        persistentVolumeClaim: {{claimName: shared}}\n{}",
        tolerations(),
        crate::APP_IMAGE,
        workload_command("/data/$HOSTNAME"),
        witness_volume(n)
    )
}

/// The writers and the sharers, with the sharers' claim.
pub(super) async fn apply_workload(c: &Cluster, n: &str) -> Result<()> {
    // a move of a run that ended on the way may have left its label
    c.kubectl(&["label", "nodes", "--all", &format!("{WRITERS_AWAY}-")])
        .await?;
    c.apply_in(
        n,
        &[
            writers_manifest(n),
            claim("shared", "csi-manila-cephfs", "1Gi", "ReadWriteMany", false),
            sharers_manifest(n),
        ]
        .join("---\n"),
    )
    .await
}

impl Campaign {
    /// A writer that can move: one whose node's zone has another node
    /// (the first writer when none can).
    pub(super) async fn movable_writer(&self) -> Result<usize> {
        let zones = self.c.node_zones().await?;
        for i in 0..WRITERS {
            let p = self
                .c
                .get("pod", &format!("writer-{i}"), Some(self.n()))
                .await?
                .unwrap_or_default();
            let from = p["spec"]["nodeName"].as_str().unwrap_or_default();
            let zone = zones.get(from);
            if zones
                .iter()
                .any(|(node, z)| Some(z) == zone && node != from)
            {
                return Ok(i);
            }
        }
        Ok(0)
    }

    /// Runs an operation to its end (each sidecar retries what the faults
    /// refuse; the bound is generous).
    /// Runs one operation of the workload; each of its waits lasts at most
    /// `patience` (the faults' longest plus the convergence bound: the
    /// operation is judged as the workload is, after the faults end).
    pub(super) async fn operate(
        &self,
        op: Operation,
        step: usize,
        rng_pick: usize,
        patience: Duration,
    ) -> Result<()> {
        let n = self.n().to_string();
        let c = &self.c;
        match op {
            Operation::MoveWriter => {
                // to another node of its zone (its volume attaches there
                // only), which means a detach and an attach; a writer
                // alone in its zone restarts where it is
                let pod = format!("writer-{}", rng_pick % WRITERS);
                let p = c.get("pod", &pod, Some(&n)).await?.unwrap_or_default();
                let (from, uid) = (
                    p["spec"]["nodeName"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                    p["metadata"]["uid"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                );
                let zones = c.node_zones().await?;
                let zone = zones.get(&from).cloned().unwrap_or_default();
                let to = zones
                    .iter()
                    .find(|(node, z)| **z == zone && **node != from)
                    .map(|(node, _)| node.clone());
                let _away = match &to {
                    Some(_) => Some(WritersAway::on(c, &from).await?),
                    None => None,
                };
                c.kubectl(&["delete", "pod", "-n", &n, &pod, "--wait=false"])
                    .await?;
                if let Some(to) = to {
                    c.wait_running_on_within(&n, &pod, &to, &uid, patience)
                        .await?;
                }
            }
            Operation::ProvisionScratch => {
                let name = format!("scratch-{step}");
                c.apply_in(
                    &n,
                    &[
                        claim(&name, "csi-cinder-sc-delete", "1Gi", "ReadWriteOnce", false),
                        crate::placed_on(
                            &pod(
                                &name,
                                &name,
                                "echo ok > /data/ok && exec sleep 3600",
                                PodOptions::default(),
                            ),
                            &[&c.node],
                        ),
                    ]
                    .join("---\n"),
                )
                .await?;
                c.wait_running(&n, &name, patience).await?;
                c.kubectl(&["delete", "pod", "-n", &n, &name, "--grace-period=1"])
                    .await?;
                c.kubectl(&["delete", "pvc", "-n", &n, &name, "--wait=false"])
                    .await?;
            }
            Operation::SnapshotAndRestore => {
                let snap = format!("snap-{step}");
                let source = format!("data-writer-{}", rng_pick % WRITERS);
                c.apply_in(
                    &n,
                    &format!(
                        "apiVersion: snapshot.storage.k8s.io/v1\nkind: VolumeSnapshot\nmetadata:\n  name: {snap}\nspec:\n  volumeSnapshotClassName: csi-cinder-snapclass\n  source:\n    persistentVolumeClaimName: {source}\n"
                    ),
                )
                .await?;
                c.wait_snapshot_ready(&n, &snap, patience).await?;
                // at least the snapshot's size (its claim may have grown)
                let size = c
                    .get("volumesnapshot", &snap, Some(&n))
                    .await?
                    .unwrap_or_default()["status"]["restoreSize"]
                    .as_str()
                    .unwrap_or("1Gi")
                    .to_string();
                // Cinder restores only in the snapshot's zone: the pod
                // that reads the restored volume goes to a node there
                let readers = c.nodes_that_reach_claim(&n, &source).await?;
                let readers: Vec<&str> = if readers.is_empty() {
                    vec![c.node.as_str()]
                } else {
                    readers.iter().map(String::as_str).collect()
                };
                let restored = format!("restored-{step}");
                c.apply_in(
                    &n,
                    &format!(
                        "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata:\n  name: {restored}\nspec:\n  accessModes: [ReadWriteOnce]\n  storageClassName: csi-cinder-sc-xfs\n  dataSource:\n    name: {snap}\n    kind: VolumeSnapshot\n    apiGroup: snapshot.storage.k8s.io\n  resources:\n    requests:\n      storage: {size}\n---\n{}",
                        crate::placed_on(
                            &pod(
                                &restored,
                                &restored,
                                "test -s /data/seq && echo RESTORED",
                                PodOptions {
                                    run_once: true,
                                    ..Default::default()
                                },
                            ),
                            &readers,
                        )
                    ),
                )
                .await?;
                c.wait_succeeded(&n, &restored, patience).await?;
                for (kind, name) in [
                    ("pod", &restored),
                    ("pvc", &restored),
                    ("volumesnapshot", &snap),
                ] {
                    c.kubectl(&["delete", kind, "-n", &n, name, "--wait=false"])
                        .await?;
                }
            }
            Operation::ExpandWriter => {
                let claim = format!("data-writer-{}", rng_pick % WRITERS);
                let now = c.get("pvc", &claim, Some(&n)).await?.unwrap_or_default();
                let gib = now["spec"]["resources"]["requests"]["storage"]
                    .as_str()
                    .and_then(|s| s.trim_end_matches("Gi").parse::<u64>().ok())
                    .unwrap_or(1);
                let want = format!("{}Gi", gib + 1);
                c.kubectl(&[
                    "patch",
                    "pvc",
                    "-n",
                    &n,
                    &claim,
                    "--type=merge",
                    "-p",
                    &format!(
                        "{{\"spec\":{{\"resources\":{{\"requests\":{{\"storage\":\"{want}\"}}}}}}}}"
                    ),
                ])
                .await?;
                c.wait_for(&format!("{claim} grown to {want}"), patience, || {
                    let (c, n, claim, want) = (c.clone(), n.clone(), claim.clone(), want.clone());
                    async move {
                        let p = c.get("pvc", &claim, Some(&n)).await?.unwrap_or_default();
                        Ok(if p["status"]["capacity"]["storage"] == want.as_str() {
                            Ok(())
                        } else {
                            Err(p["status"].to_string())
                        })
                    }
                })
                .await?;
            }
        }
        Ok(())
    }
}
