//! The cluster tier's harness: the Kubernetes that `tests/cluster/cluster.py
//! up` runs (node A, and B... in their own namespaces; deploy/suite from
//! our images, on the real test cloud), driven as users drive it: kubectl,
//! app pods, and OpenStack's own view of what the drivers did.
//!
//! Every test namespace is labelled `csi-cluster-tier=test` and deleted
//! (with its claims, and so its volumes) when its guard drops; what a
//! failed run leaves, `cluster.py down` deletes before stopping.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use openstack_client::cinder::BlockStorage;
use openstack_client::config::{CloudConf, ConfigEnv};
use openstack_client::manila::SharedFileSystems;
use openstack_client::{Session, SessionOptions};
use serde_json::Value;

pub mod campaign;
pub mod metrics;
pub mod nodes;

pub use metrics::{controller_metrics, controller_rpc_seconds, metric_value};

/// The label of every namespace a test makes.
pub const TEST_LABEL: &str = "csi-cluster-tier=test";
/// The image of the test pods.
pub const APP_IMAGE: &str = "docker.io/library/busybox:1.35";
/// The namespace deploy/suite installs into.
pub const SUITE_NAMESPACE: &str = "openstack-system";

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("the cluster tier is not up ({0}): run tests/cluster/cluster.py up")]
    NotUp(String),
    #[error("{command}: {message}")]
    Command { command: String, message: String },
    #[error("{what}: not within {timeout:?}; last seen: {last}")]
    Timeout {
        what: String,
        timeout: Duration,
        last: String,
    },
    #[error("{0}")]
    Other(String),
}

pub type Result<T> = std::result::Result<T, ClusterError>;

/// The checkout this harness belongs to.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap_or_else(|_| PathBuf::from("."))
}

#[derive(Debug, Clone)]
pub struct Cluster {
    pub dir: PathBuf,
    pub kubeconfig: PathBuf,
    pub cloud_dir: PathBuf,
    pub node: String,
}

impl Cluster {
    /// The cluster `cluster.py up` left running.
    pub fn from_env() -> Result<Self> {
        let dir = std::env::var_os("K8S_TEST_CLUSTER_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| repo().join(".k8s-cluster"));
        let cloud_dir = std::env::var_os("OS_TEST_CLOUD_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| repo().join(".openstack-cloud"));
        let kubeconfig = dir.join("admin.kubeconfig");
        if !kubeconfig.exists() || !dir.join("pids/kubelet.pid").exists() {
            return Err(ClusterError::NotUp(dir.display().to_string()));
        }
        Ok(Self {
            dir,
            kubeconfig,
            cloud_dir,
            node: std::env::var("K8S_TEST_NODE").unwrap_or_else(|_| "localhost".into()),
        })
    }

    /// Runs kubectl; its stdout, or an error with its stderr.
    pub async fn kubectl(&self, args: &[&str]) -> Result<String> {
        self.kubectl_with_input(args, None).await
    }

    pub async fn kubectl_with_input(&self, args: &[&str], input: Option<&str>) -> Result<String> {
        self.kubectl_on(None, args, input).await
    }

    /// The second apiserver `cluster.py up` runs on the same etcd, with its
    /// own KMS plugin (a second control-plane node's).
    pub fn apiserver_b(&self) -> String {
        std::env::var("K8S_TEST_APISERVER_B").unwrap_or_else(|_| {
            let base = std::env::var("K8S_TEST_PORT_BASE")
                .ok()
                .and_then(|p| p.parse::<u16>().ok())
                .unwrap_or(26000);
            format!("https://127.0.0.1:{}", base + 444)
        })
    }

    /// kubectl against the second apiserver.
    pub async fn kubectl_b(&self, args: &[&str]) -> Result<String> {
        let server = self.apiserver_b();
        self.kubectl_on(Some(&server), args, None).await
    }

    /// kubectl against `server` (None: the kubeconfig's).
    pub async fn kubectl_on(
        &self,
        server: Option<&str>,
        args: &[&str],
        input: Option<&str>,
    ) -> Result<String> {
        self.run_kubectl(server, None, args, input).await
    }

    /// kubectl as whoever holds `token` (a service account's, bound to a
    /// pod: the apiserver then knows its node), not as the admin.
    pub async fn kubectl_with_token(
        &self,
        token: &str,
        args: &[&str],
        input: Option<&str>,
    ) -> Result<String> {
        self.run_kubectl(None, Some(token), args, input).await
    }

    /// The service account token kubelet gave a pod of node A (its
    /// projected volume): bound to the pod, so it carries the pod's node.
    pub fn bound_token(&self, pod: &Value) -> Result<String> {
        let uid = pod["metadata"]["uid"].as_str().unwrap_or_default();
        let dir = Path::new("/var/lib/kubelet/pods")
            .join(uid)
            .join("volumes/kubernetes.io~projected");
        std::fs::read_dir(&dir)
            .map_err(|e| ClusterError::Other(format!("{}: {e}", dir.display())))?
            .flatten()
            .find_map(|e| std::fs::read_to_string(e.path().join("token")).ok())
            .map(|t| t.trim().to_string())
            .ok_or_else(|| ClusterError::Other(format!("no token under {}", dir.display())))
    }

    async fn run_kubectl(
        &self,
        server: Option<&str>,
        token: Option<&str>,
        args: &[&str],
        input: Option<&str>,
    ) -> Result<String> {
        use tokio::io::AsyncWriteExt;
        let mut cmd = tokio::process::Command::new("kubectl");
        match token {
            None => {
                cmd.arg(format!("--kubeconfig={}", self.kubeconfig.display()));
            }
            Some(token) => {
                // the kubeconfig's server and CA, and no credential of it
                let kubeconfig = std::fs::read_to_string(&self.kubeconfig).map_err(|e| {
                    ClusterError::Other(format!("{}: {e}", self.kubeconfig.display()))
                })?;
                let own = kubeconfig
                    .lines()
                    .find_map(|l| l.trim().strip_prefix("server: "))
                    .ok_or_else(|| ClusterError::Other("no server in the kubeconfig".into()))?;
                cmd.args([
                    "--kubeconfig=/dev/null".to_string(),
                    format!("--server={}", server.unwrap_or(own)),
                    format!(
                        "--certificate-authority={}",
                        self.dir.join("pki/ca.crt").display()
                    ),
                    format!("--token={token}"),
                ]);
            }
        }
        if let (Some(s), None) = (server, token) {
            cmd.arg(format!("--server={s}"));
        }
        cmd.args(args)
            .stdin(if input.is_some() {
                std::process::Stdio::piped()
            } else {
                std::process::Stdio::null()
            })
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        let command = format!(
            "kubectl {}{}{}",
            server.map(|s| format!("--server={s} ")).unwrap_or_default(),
            token.map(|_| "--token=… ").unwrap_or_default(),
            args.join(" ")
        );
        let fail = |message: String| ClusterError::Command {
            command: command.clone(),
            message,
        };
        let mut child = cmd.spawn().map_err(|e| fail(e.to_string()))?;
        if let (Some(text), Some(mut stdin)) = (input, child.stdin.take()) {
            stdin
                .write_all(text.as_bytes())
                .await
                .map_err(|e| fail(e.to_string()))?;
        }
        let out = tokio::time::timeout(Duration::from_secs(300), child.wait_with_output())
            .await
            .map_err(|_| fail("did not finish in 300 s".into()))?
            .map_err(|e| fail(e.to_string()))?;
        if !out.status.success() {
            return Err(fail(
                String::from_utf8_lossy(&out.stderr).trim().to_string(),
            ));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `kubectl apply -f -` of a manifest.
    pub async fn apply(&self, yaml: &str) -> Result<()> {
        self.kubectl_with_input(&["apply", "-f", "-"], Some(yaml))
            .await
            .map(|_| ())
    }

    /// `kubectl apply -n NS -f -`.
    pub async fn apply_in(&self, ns: &str, yaml: &str) -> Result<()> {
        self.kubectl_with_input(&["apply", "-n", ns, "-f", "-"], Some(yaml))
            .await
            .map(|_| ())
    }

    /// An object as JSON; None when it does not exist.
    pub async fn get(
        &self,
        kind: &str,
        name: &str,
        namespace: Option<&str>,
    ) -> Result<Option<Value>> {
        let mut args = vec!["get", kind, name, "-o", "json", "--ignore-not-found"];
        if let Some(ns) = namespace {
            args.extend(["-n", ns]);
        }
        let out = self.kubectl(&args).await?;
        if out.trim().is_empty() {
            return Ok(None);
        }
        serde_json::from_str(&out)
            .map(Some)
            .map_err(|e| ClusterError::Other(format!("{kind}/{name}: {e}")))
    }

    /// Items of a list (`kubectl get KIND -o json` with more arguments).
    pub async fn list(&self, kind: &str, extra: &[&str]) -> Result<Vec<Value>> {
        let mut args = vec!["get", kind, "-o", "json"];
        args.extend_from_slice(extra);
        let out = self.kubectl(&args).await?;
        let v: Value =
            serde_json::from_str(&out).map_err(|e| ClusterError::Other(format!("{kind}: {e}")))?;
        Ok(v["items"].as_array().cloned().unwrap_or_default())
    }

    /// A new namespace for one test, deleted (with everything in it) when
    /// the guard drops.
    pub async fn namespace(&self, prefix: &str) -> Result<TestNamespace> {
        let name = format!(
            "{prefix}-{}",
            &uuid::Uuid::new_v4().simple().to_string()[..6]
        );
        self.apply(&format!(
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {name}\n  labels:\n    csi-cluster-tier: test\n"
        ))
        .await?;
        Ok(TestNamespace {
            cluster: self.clone(),
            name,
        })
    }

    /// Calls `f` until it answers Some, for at most `timeout`.
    pub async fn wait_for<T, F, Fut>(&self, what: &str, timeout: Duration, mut f: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<std::result::Result<T, String>>>,
    {
        let until = Instant::now() + timeout;
        let mut last: String;
        loop {
            match f().await {
                Ok(Ok(v)) => return Ok(v),
                Ok(Err(seen)) => last = seen,
                Err(e) => last = e.to_string(),
            }
            if Instant::now() >= until {
                return Err(ClusterError::Timeout {
                    what: what.to_string(),
                    timeout,
                    last,
                });
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Waits until the pod runs (fails at once when it failed).
    pub async fn wait_running(&self, ns: &str, pod: &str, timeout: Duration) -> Result<Value> {
        self.wait_for(&format!("pod {ns}/{pod} running"), timeout, || async move {
            let Some(p) = self.get("pod", pod, Some(ns)).await? else {
                return Ok(Err("no such pod".into()));
            };
            match p["status"]["phase"].as_str() {
                Some("Running") => Ok(Ok(p)),
                Some("Failed") => Err(ClusterError::Other(format!(
                    "pod {ns}/{pod} failed: {}",
                    p["status"]
                ))),
                _ => Ok(Err(self.why_pending(ns, pod, &p).await)),
            }
        })
        .await
    }

    /// Waits until the pod's containers ended successfully.
    pub async fn wait_succeeded(&self, ns: &str, pod: &str, timeout: Duration) -> Result<()> {
        self.wait_for(&format!("pod {ns}/{pod} done"), timeout, || async move {
            let Some(p) = self.get("pod", pod, Some(ns)).await? else {
                return Ok(Err("no such pod".into()));
            };
            match p["status"]["phase"].as_str() {
                Some("Succeeded") => Ok(Ok(())),
                Some("Failed") => Err(ClusterError::Other(format!(
                    "pod {ns}/{pod} failed: {}; logs: {}",
                    p["status"]["containerStatuses"],
                    self.logs(ns, pod).await.unwrap_or_default()
                ))),
                _ => Ok(Err(self.why_pending(ns, pod, &p).await)),
            }
        })
        .await
    }

    /// The longest gap between two successful writes of a [`prober`], how
    /// many it made, and how many failed.
    pub async fn probe_report(&self, ns: &str, pod: &str) -> (Duration, usize, usize) {
        let text = match self.exec(ns, pod, "cat /data/probe-$HOSTNAME").await {
            Ok(t) => t,
            Err(e) => panic!("{pod}: its volume no longer answers: {e}"),
        };
        // the node's uptime in seconds (busybox's date has no sub-second format)
        let times: Vec<f64> = text
            .lines()
            .filter_map(|l| l.split_whitespace().nth(1)?.parse().ok())
            .collect();
        let gap = times.windows(2).map(|w| w[1] - w[0]).fold(0.0, f64::max);
        let fails = match self.logs(ns, pod).await {
            Ok(logs) => logs.lines().filter(|l| l.starts_with("FAIL")).count(),
            Err(e) => panic!("{pod}: its logs: {e}"),
        };
        (Duration::from_secs_f64(gap.max(0.0)), times.len(), fails)
    }

    /// The pod's status and the last events about it.
    async fn why_pending(&self, ns: &str, pod: &str, p: &Value) -> String {
        let events = self
            .kubectl(&[
                "get",
                "events",
                "-n",
                ns,
                "--field-selector",
                &format!("involvedObject.name={pod}"),
                "-o",
                "jsonpath={range .items[-3:]}{.reason}: {.message}{\"\\n\"}{end}",
            ])
            .await
            .unwrap_or_default();
        format!(
            "phase {}; events: {}",
            p["status"]["phase"],
            events.trim().replace('\n', " | ")
        )
    }

    pub async fn logs(&self, ns: &str, pod: &str) -> Result<String> {
        self.kubectl(&["logs", "-n", ns, pod]).await
    }

    /// Runs a shell command in the pod's (first) container.
    pub async fn exec(&self, ns: &str, pod: &str, script: &str) -> Result<String> {
        self.kubectl(&["exec", "-n", ns, pod, "--", "sh", "-c", script])
            .await
    }

    /// Deletes and waits until it is gone.
    pub async fn delete(&self, kind: &str, name: &str, ns: Option<&str>) -> Result<()> {
        let mut args = vec!["delete", kind, name, "--ignore-not-found", "--timeout=180s"];
        if let Some(ns) = ns {
            args.extend(["-n", ns]);
        }
        self.kubectl(&args).await.map(|_| ())
    }

    /// Waits until the VolumeSnapshot is ready to use.
    pub async fn wait_snapshot_ready(&self, ns: &str, name: &str, timeout: Duration) -> Result<()> {
        self.wait_for(
            &format!("snapshot {ns}/{name} ready"),
            timeout,
            || async move {
                let s = self
                    .get("volumesnapshot", name, Some(ns))
                    .await?
                    .unwrap_or_default();
                Ok(if s["status"]["readyToUse"] == true {
                    Ok(())
                } else {
                    Err(s["status"].to_string())
                })
            },
        )
        .await
    }

    /// The PV bound to a claim.
    pub async fn volume_of(&self, ns: &str, claim: &str, timeout: Duration) -> Result<Value> {
        let pv = self
            .wait_for(
                &format!("claim {ns}/{claim} bound"),
                timeout,
                || async move {
                    let c = self.get("pvc", claim, Some(ns)).await?;
                    match c.as_ref().and_then(|c| c["spec"]["volumeName"].as_str()) {
                        Some(v) if c.as_ref().is_some_and(|c| c["status"]["phase"] == "Bound") => {
                            Ok(Ok(v.to_string()))
                        }
                        _ => Ok(Err(format!(
                            "claim: {}",
                            c.map(|c| c["status"].to_string()).unwrap_or_default()
                        ))),
                    }
                },
            )
            .await?;
        self.get("pv", &pv, None)
            .await?
            .ok_or_else(|| ClusterError::Other(format!("PV {pv} vanished")))
    }

    /// The test cloud's fault proxy, which the drivers' catalog points at:
    /// its faults, and the calls it saw.
    pub fn fault_proxy(&self) -> Result<openstack_emulator::proxy::ProxyControl> {
        let file = self.cloud_dir.join("fault-proxy");
        let admin = std::fs::read_to_string(&file)
            .map_err(|e| ClusterError::Other(format!("{}: {e}", file.display())))?
            .trim()
            .parse()
            .map_err(|e| ClusterError::Other(format!("{}: {e}", file.display())))?;
        Ok(openstack_emulator::proxy::ProxyControl { admin })
    }

    /// A cloud.conf of the test cloud (`admin` or `member`).
    pub fn cloud_conf(&self, who: &str) -> PathBuf {
        self.cloud_dir.join(format!("cloud-{who}.conf"))
    }

    /// A session of the test cloud as `admin` or `member` (its cloud.conf).
    pub fn session(&self, who: &str) -> Result<Session> {
        let conf = CloudConf::load(&[self.cloud_conf(who)], ConfigEnv::from_process())
            .map_err(|e| ClusterError::Other(e.to_string()))?;
        let cloud = conf
            .cloud("")
            .map_err(|e| ClusterError::Other(e.to_string()))?;
        Session::new(cloud, SessionOptions::default())
            .map_err(|e| ClusterError::Other(e.to_string()))
    }

    /// Cinder as the drivers' project member sees it.
    pub fn cinder(&self) -> Result<BlockStorage> {
        Ok(BlockStorage::new(self.session("member")?))
    }

    /// OpenStack as the plugins reach it: as the project member, through
    /// the fault proxy (its calls counted there, as theirs are).
    pub fn member_via_proxy(&self) -> Result<Session> {
        self.session("member-via-proxy")
    }

    /// Nova as the drivers' project member (whose the node servers are)
    /// sees it.
    pub fn nova(&self) -> Result<openstack_client::nova::Compute> {
        Ok(openstack_client::nova::Compute::new(
            self.session("member")?,
        ))
    }

    /// The Nova server the node is (its metadata service's answer).
    pub fn server_id(&self) -> Result<String> {
        std::fs::read_to_string(self.cloud_dir.join("test-server-id"))
            .map(|s| s.trim().to_string())
            .map_err(|e| ClusterError::Other(format!("the test server's id: {e}")))
    }

    /// Every node's name, A first (`cluster.py env`'s K8S_TEST_NODES, else
    /// the API's list with A first).
    pub async fn nodes(&self) -> Result<Vec<String>> {
        if let Ok(names) = std::env::var("K8S_TEST_NODES") {
            let names: Vec<String> = names.split_whitespace().map(str::to_string).collect();
            if !names.is_empty() {
                return Ok(names);
            }
        }
        let mut names: Vec<String> = self
            .list("nodes", &[])
            .await?
            .iter()
            .filter_map(|n| n["metadata"]["name"].as_str().map(str::to_string))
            .collect();
        names.sort_by_key(|n| (n != &self.node, n.clone()));
        Ok(names)
    }

    /// The Nova server a node is: A's is the test cloud's test server, the
    /// others' were booted for them (`cloud.py node-server`).
    pub fn server_of(&self, node: &str) -> Result<String> {
        if node == self.node {
            return self.server_id();
        }
        let path = self.cloud_dir.join("node-server-names.json");
        let text = std::fs::read_to_string(&path)
            .map_err(|e| ClusterError::Other(format!("{}: {e}", path.display())))?;
        let servers: Value = serde_json::from_str(&text)
            .map_err(|e| ClusterError::Other(format!("{}: {e}", path.display())))?;
        servers[node]["id"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| ClusterError::Other(format!("no server for node {node}")))
    }

    /// The mount points containing `needle` as node `node` sees them (A:
    /// the host; the others: their own mount namespace).
    pub fn node_mounts_containing(&self, node: &str, needle: &str) -> Result<Vec<String>> {
        if node == self.node {
            return Ok(host_mounts_containing(needle));
        }
        let letter = node
            .rsplit('-')
            .next()
            .filter(|l| l.len() == 1)
            .ok_or_else(|| ClusterError::Other(format!("{node} is no namespaced node")))?;
        let out = std::process::Command::new("nsenter")
            .arg(format!("--mount=/run/k8s-test-cluster/nodes/{letter}.mnt"))
            .args(["--", "cat", "/proc/self/mountinfo"])
            .output()
            .map_err(|e| ClusterError::Other(format!("nsenter: {e}")))?;
        if !out.status.success() {
            return Err(ClusterError::Other(format!(
                "the mounts of {node}: {}",
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .filter(|p| p.contains(needle))
            .map(str::to_string)
            .collect())
    }

    /// The CephFS node plugin's mount pods (one ceph-fuse each), on every
    /// node.
    pub async fn mount_pods(&self) -> Result<Vec<Value>> {
        self.list(
            "pods",
            &[
                "-n",
                SUITE_NAMESPACE,
                "-l",
                "app.kubernetes.io/component=ceph-fuse-mount",
            ],
        )
        .await
    }

    /// Waits up to `timeout` until no mount pod of `volume_id` is left: one
    /// still terminating (its preStop waits for the share's users) is
    /// not left behind yet. The mount pods still there, if any.
    pub async fn wait_mount_pods_gone(
        &self,
        volume_id: &str,
        timeout: Duration,
    ) -> Result<Vec<String>> {
        let deadline = Instant::now() + timeout;
        loop {
            let left: Vec<String> = self
                .mount_pods()
                .await?
                .into_iter()
                .filter(|p| {
                    p["metadata"]["annotations"]["manila.csi.openstack.org/volume-id"] == volume_id
                })
                .map(|p| {
                    p["metadata"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string()
                })
                .collect();
            if left.is_empty() || Instant::now() >= deadline {
                return Ok(left);
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    }

    /// Manila as the member (the shares' project) sees it.
    pub fn manila(&self) -> Result<SharedFileSystems> {
        Ok(SharedFileSystems::new(self.session("member")?))
    }

    /// One call of etcd's JSON gateway (`/v3/kv/range`, `put`,
    /// `deleterange`); its answer.
    async fn etcd(&self, call: &str, body: Value) -> Result<Value> {
        let port = std::env::var("K8S_TEST_PORT_BASE")
            .ok()
            .and_then(|p| p.parse::<u16>().ok())
            .unwrap_or(26000)
            + 379;
        let out = tokio::process::Command::new("curl")
            .args([
                "-sS",
                "--max-time",
                "10",
                "-X",
                "POST",
                &format!("http://127.0.0.1:{port}/v3/kv/{call}"),
                "-d",
                &body.to_string(),
            ])
            .output()
            .await
            .map_err(|e| ClusterError::Other(format!("curl: {e}")))?;
        serde_json::from_slice(&out.stdout)
            .map_err(|e| ClusterError::Other(format!("etcd's answer to {call}: {e}")))
    }

    /// Writes `value` under `key` in etcd, behind the apiserver's back (an
    /// object as an older apiserver left it).
    pub async fn etcd_put(&self, key: &str, value: &[u8]) -> Result<()> {
        use base64::Engine;
        let b64 = base64::engine::general_purpose::STANDARD;
        self.etcd(
            "put",
            serde_json::json!({ "key": b64.encode(key), "value": b64.encode(value) }),
        )
        .await
        .map(|_| ())
    }

    /// Removes `key` from etcd.
    pub async fn etcd_delete(&self, key: &str) -> Result<()> {
        use base64::Engine;
        let b64 = base64::engine::general_purpose::STANDARD;
        self.etcd("deleterange", serde_json::json!({ "key": b64.encode(key) }))
            .await
            .map(|_| ())
    }

    /// What etcd holds for a key: the bytes as the apiserver stored them.
    pub async fn etcd_value(&self, key: &str) -> Result<Option<Vec<u8>>> {
        use base64::Engine;
        let b64 = base64::engine::general_purpose::STANDARD;
        let v = self
            .etcd("range", serde_json::json!({ "key": b64.encode(key) }))
            .await?;
        let Some(kv) = v["kvs"].as_array().and_then(|k| k.first()) else {
            return Ok(None);
        };
        kv["value"]
            .as_str()
            .map(|s| b64.decode(s))
            .transpose()
            .map_err(|e| ClusterError::Other(format!("etcd value: {e}")))
    }

    /// `tests/cluster/cluster.py ARGS...` (restart-kubelet, ...).
    pub async fn cluster_py(&self, args: &[&str]) -> Result<String> {
        let what = format!("cluster.py {}", args.join(" "));
        let out = tokio::process::Command::new("python3")
            .arg(repo().join("tests/cluster/cluster.py"))
            .args(args)
            .output()
            .await
            .map_err(|e| ClusterError::Other(format!("{what}: {e}")))?;
        if !out.status.success() {
            return Err(ClusterError::Command {
                command: what,
                message: format!(
                    "{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                ),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

/// A namespace of one test.
#[derive(Debug)]
pub struct TestNamespace {
    cluster: Cluster,
    pub name: String,
}

impl TestNamespace {
    /// Deletes the namespace and waits until it (with its claims) is
    /// gone; also what Drop does, without the wait's verdict.
    pub async fn close(self) -> Result<()> {
        let c = self.cluster.clone();
        let name = self.name.clone();
        std::mem::forget(self);
        c.kubectl(&["delete", "namespace", &name, "--timeout=240s"])
            .await
            .map(|_| ())
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        // a failed test: delete what it made, without waiting (cluster.py
        // down waits for every labelled namespace)
        let _ = std::process::Command::new("kubectl")
            .arg(format!(
                "--kubeconfig={}",
                self.cluster.kubeconfig.display()
            ))
            .args(["delete", "namespace", &self.name, "--wait=false"])
            .output();
    }
}

/// A claim.
pub fn claim(name: &str, class: &str, size: &str, mode: &str, block: bool) -> String {
    format!(
        "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata:\n  name: {name}\nspec:\n  accessModes: [{mode}]\n  storageClassName: {class}\n  volumeMode: {}\n  resources:\n    requests:\n      storage: {size}\n",
        if block { "Block" } else { "Filesystem" }
    )
}

/// A busybox pod running `script` with the claim at /data (or, for a
/// raw block claim, the device at /dev/xvda).
pub fn pod(name: &str, claim: &str, script: &str, opts: PodOptions) -> String {
    let volume = if opts.block {
        "    volumeDevices:\n      - name: data\n        devicePath: /dev/xvda\n".to_string()
    } else {
        "    volumeMounts:\n      - name: data\n        mountPath: /data\n".to_string()
    };
    let restart = if opts.run_once { "Never" } else { "Always" };
    let script = script.replace('\'', "'\"'\"'");
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  restartPolicy: {restart}\n  terminationGracePeriodSeconds: 2\n  containers:\n  - name: app\n    image: {APP_IMAGE}\n    command: [\"sh\", \"-c\", '{script}']\n{volume}  volumes:\n  - name: data\n    persistentVolumeClaim:\n      claimName: {claim}\n      readOnly: {}\n",
        opts.read_only
    )
}

/// `BENCH_QUICK` is set (as the test command runs the benches): a handful
/// per figure, so that a bench runs through; its figures mean little.
pub fn bench_quick() -> bool {
    std::env::var_os("BENCH_QUICK").is_some()
}

/// The cluster a bench measures; without one the bench says it skipped
/// (None), except under `BENCH_QUICK`, where the test command expects a
/// cluster and its absence is a failure.
#[allow(clippy::print_stdout)]
pub fn bench_cluster() -> Option<Cluster> {
    match Cluster::from_env() {
        Ok(c) => Some(c),
        Err(e) if bench_quick() => panic!("no cluster to measure: {e}"),
        Err(e) => {
            println!("figures skipped: {e}");
            None
        }
    }
}

/// A pod that writes a line every 100 ms and says FAIL when a write fails
/// (read by [`Cluster::probe_report`]).
pub fn prober(name: &str, claim: &str) -> String {
    pod(
        name,
        claim,
        "i=0; while true; do i=$((i+1)); t=$(cut -d\" \" -f1 /proc/uptime); if echo \"$i $t\" >> /data/probe-$HOSTNAME && tail -n 1 /data/probe-$HOSTNAME > /dev/null; then :; else echo \"FAIL $t\"; fi; sleep 0.1; done",
        PodOptions::default(),
    )
}

/// The taint of the nodes beyond A (cluster.py's MULTI_NODE_TAINT): only
/// the multi-node scenarios' pods (and the node plugins) go there.
pub const MULTI_NODE_TAINT_KEY: &str = "csi-cluster-tier/multi-node";

/// A pod's (or pod template's, at `indent`) manifest placed on one of
/// `nodes`: it tolerates the multi-node taint and requires one of them.
pub fn placement(nodes: &[&str], indent: usize) -> String {
    let pad = " ".repeat(indent);
    let names = nodes.join(", ");
    format!(
        "{pad}tolerations:\n{pad}- key: {MULTI_NODE_TAINT_KEY}\n{pad}  operator: Exists\n{pad}  effect: NoSchedule\n{pad}affinity:\n{pad}  nodeAffinity:\n{pad}    requiredDuringSchedulingIgnoredDuringExecution:\n{pad}      nodeSelectorTerms:\n{pad}      - matchExpressions:\n{pad}        - key: kubernetes.io/hostname\n{pad}          operator: In\n{pad}          values: [{names}]\n"
    )
}

/// A pod manifest made by [`pod`] or [`prober`], placed on one of `nodes`.
pub fn placed_on(pod_yaml: &str, nodes: &[&str]) -> String {
    pod_yaml.replacen("\nspec:\n", &format!("\nspec:\n{}", placement(nodes, 2)), 1)
}

#[derive(Debug, Clone, Copy, Default)]
pub struct PodOptions {
    pub block: bool,
    pub read_only: bool,
    /// The pod ends when its script does.
    pub run_once: bool,
}

/// The mounts of this machine whose mount point contains `needle`.
pub fn host_mounts_containing(needle: &str) -> Vec<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|p| p.contains(needle))
        .map(str::to_string)
        .collect()
}

/// The labels of pods, as a selector string.
pub fn selector(labels: &BTreeMap<&str, &str>) -> String {
    labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}
