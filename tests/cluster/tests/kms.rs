//! Secrets at rest through the Barbican KMS plugin, as operators live with
//! it: Secrets sealed under Barbican keys, rotations that survive the
//! plugin's restart and a kill -9 without any flag, and the multi-node
//! rotation procedure on two apiservers sharing one etcd, each with its
//! own plugin (the cluster tier's control plane, doubled).
//!
//! The apiserver asks its plugin to Decrypt only when it (re)starts (it
//! caches data keys): each check that a key is still usable restarts the
//! apiservers first (`cluster.py restart-apiservers`), as a reboot would.
//! Needs `tests/cluster/cluster.py up`; run with `--ignored
//! --test-threads=1`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cluster_tests::Cluster;
use serde_json::Value;

const MINUTE: Duration = Duration::from_secs(60);

/// Prints when each step of a scenario ended, from its start: where the
/// test's time goes (most of it waits on restarts).
struct Steps(Instant);

impl Steps {
    fn start() -> Self {
        Self(Instant::now())
    }

    #[allow(clippy::print_stdout)]
    fn done(&self, what: &str) {
        println!("{:>6.1} s  {what}", self.0.elapsed().as_secs_f64());
    }
}

/// The two control-plane "nodes": each its apiserver and its plugin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Node {
    A,
    B,
}

impl Node {
    fn cloud_conf(self) -> PathBuf {
        PathBuf::from(match self {
            Node::A => "/etc/kubernetes/cloud-config/cloud.conf",
            Node::B => "/etc/kubernetes/cloud-config-b/cloud.conf",
        })
    }

    fn metrics_port(self) -> u16 {
        match self {
            Node::A => 9899,
            Node::B => 9900,
        }
    }
}

async fn scenario(prefix: &str) -> (Cluster, cluster_tests::TestNamespace, String) {
    let c = Cluster::from_env().unwrap();
    let ns = c.namespace(prefix).await.unwrap();
    let n = ns.name.clone();
    (c, ns, n)
}

/// The KMS plugin's static pod (its mirror), if any.
async fn kms_plugin_pods(c: &Cluster) -> Result<Vec<Value>, cluster_tests::ClusterError> {
    c.list(
        "pods",
        &[
            "-n",
            "kube-system",
            "-l",
            "app.kubernetes.io/name=barbican-kms-plugin",
        ],
    )
    .await
}

/// The Barbican key a node's plugin is configured with (its host
/// cloud.conf).
fn kms_key(node: Node) -> String {
    let conf = std::fs::read_to_string(node.cloud_conf()).unwrap();
    conf.lines()
        .find_map(|l| l.trim().strip_prefix("key-id"))
        .map(|v| {
            v.trim_start_matches([' ', '='])
                .trim()
                .trim_matches('"')
                .to_string()
        })
        .unwrap()
}

/// Rewrites a node's `[KeyManager]` as an operator edits the file (written
/// aside, renamed over): the plugin re-reads it.
fn set_keys(node: Node, key_id: &str, decrypt: &[&str], retired: &[&str]) {
    let path = node.cloud_conf();
    let text = std::fs::read_to_string(&path).unwrap();
    let global = text.split("\n[KeyManager]").next().unwrap().trim_end();
    let mut conf = format!("{global}\n\n[KeyManager]\nkey-id = \"{key_id}\"\n");
    if !decrypt.is_empty() {
        conf.push_str(&format!("decrypt-key-ids = {}\n", decrypt.join(", ")));
    }
    if !retired.is_empty() {
        conf.push_str(&format!("retired-key-ids = {}\n", retired.join(", ")));
    }
    let tmp = path.with_extension("new");
    std::fs::write(&tmp, conf).unwrap();
    std::fs::rename(&tmp, &path).unwrap();
}

async fn secret_in_etcd(c: &Cluster, ns: &str, name: &str) -> Vec<u8> {
    c.etcd_value(&format!("/registry/secrets/{ns}/{name}"))
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("no secret {ns}/{name} in etcd"))
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// A Secret's `password`, read through a node's apiserver.
async fn read_via(c: &Cluster, node: Node, ns: &str, name: &str) -> Result<String, String> {
    use base64::Engine;
    let args = [
        "get",
        "secret",
        name,
        "-n",
        ns,
        "-o",
        "jsonpath={.data.password}",
    ];
    let b64 = match node {
        Node::A => c.kubectl(&args).await,
        Node::B => c.kubectl_b(&args).await,
    }
    .map_err(|e| e.to_string())?;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64.trim())
        .map_err(|e| e.to_string())?;
    Ok(String::from_utf8(bytes).unwrap())
}

/// Every `(name, password)` reads back through both apiservers.
async fn all_read_back<S: AsRef<str>>(c: &Cluster, ns: &str, secrets: &[(S, S)], when: &str) {
    for node in [Node::A, Node::B] {
        for (name, want) in secrets {
            assert_eq!(
                read_via(c, node, ns, name.as_ref()).await.as_deref(),
                Ok(want.as_ref()),
                "{when}: {} through apiserver {node:?}",
                name.as_ref()
            );
        }
    }
}

async fn create_via(
    c: &Cluster,
    node: Node,
    ns: &str,
    name: &str,
    value: &str,
) -> Result<(), cluster_tests::ClusterError> {
    let literal = format!("--from-literal=password={value}");
    let args = ["create", "secret", "generic", name, "-n", ns, &literal];
    match node {
        Node::A => c.kubectl(&args).await,
        Node::B => c.kubectl_b(&args).await,
    }
    .map(|_| ())
}

/// Writes Secrets through a node's apiserver until one is sealed under
/// `key`; the name of that Secret. The apiserver learns a new key_id from
/// its plugin's Status, which it asks every minute on its own, and also
/// when its `kms-providers` health check is read and its last answer is
/// older than 20 s: each attempt reads that check first, as a load
/// balancer's probe would, so a rotation shows within about 20 s instead
/// of a minute.
async fn wait_sealed_under(c: &Cluster, node: Node, ns: &str, key: &str, what: &str) -> String {
    let mut attempt = 0;
    c.wait_for(what, 3 * MINUTE, || {
        attempt += 1;
        let secret = format!("{}-{attempt}", what.replace(' ', "-"));
        async move {
            // its answer does not matter here: only that it was asked
            let probe = ["get", "--raw", "/readyz/kms-providers"];
            let _ = match node {
                Node::A => c.kubectl(&probe).await,
                Node::B => c.kubectl_b(&probe).await,
            };
            create_via(c, node, ns, &secret, "probe").await?;
            let stored = secret_in_etcd(c, ns, &secret).await;
            Ok(if contains(&stored, key.as_bytes()) {
                Ok(secret)
            } else {
                Err("not under that key yet".to_string())
            })
        }
    })
    .await
    .unwrap()
}

/// A new key in Barbican (32 random bytes), as an operator makes one.
async fn new_barbican_key(c: &Cluster, name: &str) -> String {
    let barbican = openstack_client::barbican::KeyManager::new(
        openstack_client::Session::new(
            openstack_client::config::CloudConf::load(
                &[c.cloud_conf("member")],
                openstack_client::config::ConfigEnv::from_process(),
            )
            .unwrap()
            .cloud("")
            .unwrap(),
            Default::default(),
        )
        .unwrap(),
    );
    let bytes: Vec<u8> = [uuid::Uuid::new_v4(), uuid::Uuid::new_v4()]
        .iter()
        .flat_map(|u| *u.as_bytes())
        .collect();
    barbican
        .create_secret(&openstack_client::barbican::CreateSecret {
            name: name.into(),
            payload: Some(zeroize::Zeroizing::new(bytes)),
            algorithm: Some("aes".into()),
            bit_length: Some(256),
            mode: Some("gcm".into()),
            secret_type: "symmetric".into(),
        })
        .await
        .unwrap()
}

/// Node A's static pod stopped (its manifest taken away) and started
/// again, with `between` done while it is down. What is waited for is
/// what the apiservers use, on the node: the plugin's process and its
/// socket, gone and then back (a new process). Kubernetes' own view of
/// it, the mirror pod, lags after an apiserver restart (kubelet took 40
/// to 50 s to show it again in a CI run), and nothing here needs it.
async fn restart_plugin_a(c: &Cluster, between: impl FnOnce()) {
    let manifest = c.dir.join("manifests/barbican-kms-plugin.yaml");
    let aside = c.dir.join("barbican-kms-plugin.yaml.aside");
    let socket = Path::new("/var/lib/kms/kms.sock");
    let before = plugin_a_pid();
    std::fs::rename(&manifest, &aside).unwrap();
    c.wait_for("the KMS plugin stopped", 2 * MINUTE, || async {
        Ok(match plugin_a_pid() {
            None if !socket.exists() => Ok(()),
            pid => Err(format!("process {pid:?}, socket {}", socket.exists())),
        })
    })
    .await
    .unwrap();
    between();
    std::fs::rename(&aside, &manifest).unwrap();
    c.wait_for("the KMS plugin running again", 3 * MINUTE, || async {
        Ok(match plugin_a_pid() {
            Some(pid) if Some(pid) != before && socket.exists() => Ok(()),
            pid => Err(format!("process {pid:?}, socket {}", socket.exists())),
        })
    })
    .await
    .unwrap();
}

/// Waits until node A's plugin runs, restarted more than `restarts` times.
async fn plugin_a_running(c: &Cluster, restarts: u64) {
    c.wait_for("the KMS plugin running", 3 * MINUTE, || async {
        let p = kms_plugin_pods(c).await?;
        Ok(
            if p.iter().any(|p| {
                p["status"]["phase"] == "Running"
                    && p["status"]["containerStatuses"][0]["ready"] == true
                    && p["status"]["containerStatuses"][0]["restartCount"]
                        .as_u64()
                        .unwrap_or(0)
                        >= restarts
            }) && Path::new("/var/lib/kms/kms.sock").exists()
            {
                Ok(())
            } else {
                Err(format!("{p:?}"))
            },
        )
    })
    .await
    .unwrap();
}

/// The PID of node A's plugin process.
fn plugin_a_pid() -> Option<i32> {
    std::fs::read_dir("/proc").ok()?.find_map(|d| {
        let d = d.ok()?;
        let pid: i32 = d.file_name().to_str()?.parse().ok()?;
        let cmd = std::fs::read(d.path().join("cmdline")).ok()?;
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        (cmd.contains("barbican-kms-plugin") && cmd.contains("--socketpath=/var/lib/kms/kms.sock"))
            .then_some(pid)
    })
}

async fn restart_apiservers(c: &Cluster) {
    c.cluster_py(&["restart-apiservers"]).await.unwrap();
}

async fn plugin_metrics(node: Node) -> String {
    let out = tokio::process::Command::new("curl")
        .args([
            "-sS",
            "--max-time",
            "5",
            &format!("http://127.0.0.1:{}/metrics", node.metrics_port()),
        ])
        .output()
        .await
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Both nodes on `key`, nothing staged or retired; every Secret of the
/// cluster rewritten under it: the state each scenario starts from and
/// leaves behind.
async fn settle_on(c: &Cluster, ns: &str, key: &str) {
    for node in [Node::A, Node::B] {
        let current = kms_key(node);
        let keep: Vec<&str> = [current.as_str()]
            .into_iter()
            .filter(|k| *k != key)
            .collect();
        set_keys(node, key, &keep, &[]);
    }
    wait_sealed_under(c, Node::A, ns, key, "settle a").await;
    wait_sealed_under(c, Node::B, ns, key, "settle b").await;
    migrate(c).await;
}

/// The storage migration of the Kubernetes procedure: every Secret
/// rewritten (a conflicting concurrent update is retried).
async fn migrate(c: &Cluster) {
    c.wait_for("every Secret rewritten", 2 * MINUTE, || async {
        let all = c.kubectl(&["get", "secrets", "-A", "-o", "json"]).await?;
        Ok(
            match c
                .kubectl_with_input(&["replace", "-f", "-"], Some(&all))
                .await
            {
                Ok(_) => Ok(()),
                Err(e) => Err(e.to_string()),
            },
        )
    })
    .await
    .unwrap();
}

#[tokio::test]
#[ignore = "needs the cluster tier: tests/cluster/cluster.py up (after tests/openstack/cloud.py up all)"]
async fn secrets_are_stored_under_barbican_keys_and_a_rotation_survives_restarts_and_a_kill() {
    let (c, ns, n) = scenario("kms").await;
    let steps = Steps::start();
    let old_key = kms_key(Node::A);
    c.kubectl(&[
        "create",
        "secret",
        "generic",
        "s1",
        "-n",
        &n,
        "--from-literal=password=hunter2-old",
    ])
    .await
    .unwrap();
    let stored = secret_in_etcd(&c, &n, "s1").await;
    assert!(
        stored.starts_with(b"k8s:enc:kms:v2:barbican:"),
        "{:?}",
        String::from_utf8_lossy(&stored[..40.min(stored.len())])
    );
    assert!(
        !contains(&stored, b"hunter2"),
        "the secret is in etcd in clear"
    );
    assert!(
        contains(&stored, old_key.as_bytes()),
        "sealed under the Barbican key {old_key}"
    );
    assert_eq!(
        read_via(&c, Node::A, &n, "s1").await.as_deref(),
        Ok("hunter2-old")
    );

    // a rotation on both nodes: a new key in Barbican, named in each
    // plugin's cloud.conf; no flag changes, nothing else staged
    let new_key = new_barbican_key(&c, "k8s-test-kek-rotated").await;
    set_keys(Node::A, &new_key, &[], &[]);
    set_keys(Node::B, &new_key, &[], &[]);
    let rotated = wait_sealed_under(&c, Node::A, &n, &new_key, "rotated").await;
    wait_sealed_under(&c, Node::B, &n, &new_key, "rotated b").await;
    steps.done("both nodes seal under the new key");
    let secrets = [("s1", "hunter2-old"), (rotated.as_str(), "probe")];
    all_read_back(&c, &n, &secrets, "after the rotation").await;

    // node A's plugin restarts, then both apiservers (their key caches
    // gone): the old key is asked for again, and only the plugin's own
    // record names it
    restart_plugin_a(&c, || {}).await;
    steps.done("plugin A restarted");
    restart_apiservers(&c).await;
    steps.done("apiservers restarted");
    all_read_back(&c, &n, &secrets, "after the plugin's restart").await;

    // the same after kill -9 of the plugin: kubelet starts it again (its
    // restart count read once kubelet shows the pod again)
    plugin_a_running(&c, 0).await;
    let restarts =
        kms_plugin_pods(&c).await.unwrap()[0]["status"]["containerStatuses"][0]["restartCount"]
            .as_u64()
            .unwrap_or(0);
    let pid = plugin_a_pid().expect("the KMS plugin's process");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    plugin_a_running(&c, restarts + 1).await;
    steps.done("plugin A back after kill -9");
    restart_apiservers(&c).await;
    steps.done("apiservers restarted");
    all_read_back(&c, &n, &secrets, "after kill -9").await;

    // what the record guards: without it, a restarted plugin no longer
    // opens what the old key sealed (and the record, put back, fixes it)
    let record = Path::new("/var/lib/kms/kms-keys.json");
    let kept = std::fs::read(record).unwrap();
    restart_plugin_a(&c, || std::fs::remove_file(record).unwrap()).await;
    steps.done("plugin A restarted without its record");
    // an apiserver that cannot open every Secret never gets ready
    // (informer-sync), but it serves
    c.cluster_py(&["restart-apiservers", "--live"])
        .await
        .unwrap();
    steps.done("apiservers restarted (live)");
    let lost = read_via(&c, Node::A, &n, "s1").await;
    assert!(lost.is_err(), "s1 read without the key record: {lost:?}");
    assert_eq!(
        read_via(&c, Node::A, &n, &rotated).await.as_deref(),
        Ok("probe")
    );
    restart_plugin_a(&c, || std::fs::write(record, &kept).unwrap()).await;
    steps.done("plugin A restarted with its record");
    restart_apiservers(&c).await;
    steps.done("apiservers restarted");
    all_read_back(&c, &n, &secrets, "with the record put back").await;

    // rewriting moves an old Secret under the new key
    let s1 = c
        .kubectl(&["get", "secret", "s1", "-n", &n, "-o", "json"])
        .await
        .unwrap();
    c.kubectl_with_input(&["replace", "-f", "-"], Some(&s1))
        .await
        .unwrap();
    assert!(contains(
        &secret_in_etcd(&c, &n, "s1").await,
        new_key.as_bytes()
    ));
    settle_on(&c, &n, &new_key).await;
    steps.done("settled");
    ns.close().await.unwrap();
    steps.done("namespace gone");
}

#[tokio::test]
#[ignore = "needs the cluster tier: tests/cluster/cluster.py up (after tests/openstack/cloud.py up all)"]
async fn a_rotation_on_two_control_plane_nodes_follows_the_documented_steps() {
    let (c, ns, n) = scenario("kms-nodes").await;
    let steps = Steps::start();
    let old = kms_key(Node::A);
    settle_on(&c, &n, &old).await;
    create_via(&c, Node::A, &n, "before", "written-before")
        .await
        .unwrap();
    let left_behind = secret_in_etcd(&c, &n, "before").await;
    let mut secrets: Vec<(String, String)> = vec![("before".into(), "written-before".into())];
    all_read_back(&c, &n, &secrets, "at the start").await;
    let new = new_barbican_key(&c, "k8s-test-kek-multi-node").await;
    steps.done("settled on the old key, a new key made");

    // what the procedure prevents: node A switches first, node B has not
    // staged the new key, and B's apiserver cannot read what A writes
    set_keys(Node::A, &new, &[], &[]);
    let early = wait_sealed_under(&c, Node::A, &n, &new, "early").await;
    let refused = read_via(&c, Node::B, &n, &early).await;
    assert!(
        refused.is_err(),
        "B read what A sealed under a key B never staged: {refused:?}"
    );
    assert_eq!(
        read_via(&c, Node::B, &n, "before").await.as_deref(),
        Ok("written-before")
    );
    // back out: A encrypts under the old key again, keeping the new one
    set_keys(Node::A, &old, &[&new], &[]);
    wait_sealed_under(&c, Node::A, &n, &old, "back out").await;
    steps.done("A switched early and backed out");

    // 1. stage the new key on every node (each still encrypts under the
    // old one): B now reads what A wrote early
    set_keys(Node::B, &old, &[&new], &[]);
    c.wait_for(
        "B reads what A sealed under the new key",
        2 * MINUTE,
        || async { Ok(read_via(&c, Node::B, &n, &early).await.map(|_| ())) },
    )
    .await
    .unwrap();
    secrets.push((early.clone(), "probe".into()));
    all_read_back(&c, &n, &secrets, "after staging").await;
    restart_apiservers(&c).await;
    all_read_back(&c, &n, &secrets, "after staging, apiservers restarted").await;
    steps.done("staged, apiservers restarted");

    // 2. switch every node, keeping the old key for Decrypt
    set_keys(Node::A, &new, &[&old], &[]);
    set_keys(Node::B, &new, &[&old], &[]);
    let via_a = wait_sealed_under(&c, Node::A, &n, &new, "switched a").await;
    let via_b = wait_sealed_under(&c, Node::B, &n, &new, "switched b").await;
    secrets.push((via_a, "probe".into()));
    secrets.push((via_b, "probe".into()));
    all_read_back(&c, &n, &secrets, "after switching").await;

    // 3. migrate storage: every Secret rewritten under the new key
    migrate(&c).await;
    for (name, _) in &secrets {
        assert!(
            contains(&secret_in_etcd(&c, &n, name).await, new.as_bytes()),
            "{name} still under the old key after the migration"
        );
    }
    all_read_back(&c, &n, &secrets, "after migrating").await;
    steps.done("switched and migrated");

    // 4. retire the old key on every node; apiservers restarted, so that
    // every Secret's key is asked for again
    set_keys(Node::A, &new, &[], &[&old]);
    set_keys(Node::B, &new, &[], &[&old]);
    c.wait_for("the old key forgotten", MINUTE, || async {
        let text = std::fs::read_to_string("/var/lib/kms/kms-keys.json").unwrap_or_default();
        Ok(if text.contains(&old) {
            Err("still recorded".to_string())
        } else {
            Ok(())
        })
    })
    .await
    .unwrap();
    restart_apiservers(&c).await;
    all_read_back(&c, &n, &secrets, "after retiring the old key").await;
    steps.done("old key retired, apiservers restarted");

    // a Secret the migration missed (an old value put back behind the
    // apiserver's back) is refused, and the plugin says under which key
    let missed = format!("/registry/secrets/{n}/missed");
    c.etcd_put(&missed, &left_behind).await.unwrap();
    let refused = read_via(&c, Node::A, &n, "missed").await;
    assert!(refused.is_err(), "read under a retired key: {refused:?}");
    let metrics = plugin_metrics(Node::A).await;
    assert!(
        metrics.lines().any(|l| l
            .starts_with(&format!("kms_decrypt_refused_total{{key=\"{old}\"}}"))
            && !l.ends_with(" 0")),
        "no refusal counted under the retired key:\n{metrics}"
    );
    c.etcd_delete(&missed).await.unwrap();
    restart_apiservers(&c).await;
    // the retired key named again for Decrypt reads it: nothing was lost
    set_keys(Node::A, &new, &[&old], &[]);
    set_keys(Node::B, &new, &[&old], &[]);
    steps.done("a missed Secret refused, apiservers restarted");
    settle_on(&c, &n, &new).await;
    steps.done("settled");
    ns.close().await.unwrap();
    steps.done("namespace gone");
}
