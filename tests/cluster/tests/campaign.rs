//! The quick campaign of production faults (`cluster_tests::campaign`):
//! every fault class at least once, five at a time, each while an operation that
//! needs the cloud runs, with every invariant checked after each step;
//! then the checks shown to see what they guard against (a fault that
//! served nothing among them).
//! The seed is printed; `CAMPAIGN_SEED=<seed>` replays a campaign. The
//! long one is `cargo bench -p cluster-tests --bench campaign`.
//!
//! Needs `tests/cluster/cluster.py up`; run with `--ignored
//! --test-threads=1`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::time::{Duration, Instant};

use cluster_tests::Cluster;
use cluster_tests::campaign::{Campaign, FaultClass, Plan, hint_ignored, seed_from_env};
use openstack_emulator::{FaultAction, FaultRule, RetryHint};

/// A tmpfs mounted at `below` in node A's kubelet directory (a pod's
/// publish or a staging), with the `vol_data.json` kubelet would have
/// written beside it; unmounted and removed when dropped.
struct FakeMount {
    top: std::path::PathBuf,
    target: String,
}

impl FakeMount {
    fn new(below: &str, vol_data: &str) -> Self {
        let kubelet = std::path::Path::new("/var/lib/kubelet");
        let target = kubelet.join(below);
        // the first folder made for it, removed with it
        let top = target
            .ancestors()
            .filter(|a| a.starts_with(kubelet) && *a != kubelet && !a.exists())
            .last()
            .expect("a folder of its own")
            .to_path_buf();
        std::fs::create_dir_all(&target).unwrap();
        std::fs::write(target.parent().unwrap().join("vol_data.json"), vol_data).unwrap();
        let status = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "campaign-mutation"])
            .arg(&target)
            .status()
            .unwrap();
        assert!(status.success());
        Self {
            top,
            target: target.to_string_lossy().into_owned(),
        }
    }
}

impl Drop for FakeMount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg(&self.target)
            .status();
        let _ = std::fs::remove_dir_all(&self.top);
    }
}

/// How long a node stays cut off from the cloud or the apiservers: the
/// issue's shorter cut (the bench runs the 100 s one).
const CUT_SECS: u64 = 20;

#[tokio::test]
#[ignore = "needs the cluster tier: tests/cluster/cluster.py up (after tests/openstack/cloud.py up all)"]
async fn every_fault_class_once_every_invariant_holds_and_the_checks_see_what_they_guard() {
    let c = Cluster::from_env().unwrap();
    let seed = seed_from_env();
    println!("campaign seed {seed} (CAMPAIGN_SEED={seed} replays it)");
    let plan = Plan {
        seed,
        // every class once in as few steps as five at once allow (three
        // for fourteen classes): each step's checks cost a minute or more
        // of the test command's time
        steps: FaultClass::ALL.len().div_ceil(5),
        faults_per_step: 5,
        window: Duration::from_secs(10),
        converge_bound: Duration::from_secs(300),
        cut: Duration::from_secs(CUT_SECS),
        stop_after: None,
    };
    let mut campaign = Campaign::start(&c).await.unwrap();
    let report = campaign.run(&plan).await.unwrap();
    println!("{}", report.table(seed));
    assert_eq!(
        report.faults_by_class().len(),
        FaultClass::ALL.len(),
        "every fault class once"
    );
    assert!(
        report.violations.is_empty(),
        "seed {seed}: {:#?}",
        report.violations
    );

    // and each check sees what it guards against, on the same workload:
    // a mutation of what it guards, then the step's checks, which must
    // report it with its invariant and the mutation's label, and nothing
    // else (what a mutation leaves behind on purpose is given little time)
    campaign.set_catch_up(Duration::from_secs(10));
    let n = campaign.n().to_string();
    let bound = Duration::from_secs(300);

    // five mutations at once, each of an invariant of its own, checked by
    // one step's checks (each step's checks cost half a minute or more of
    // the test command's time): every check must report its own
    // mutation, and nothing else may be reported
    let label = "mutations 1-4 and 6 (a volume leaked mid-campaign, a writer's volume staged on a second node, a writer's filesystem read-only, a mount left behind, a claim that never binds)";
    campaign.begin_step(label);
    let began = Instant::now();

    // 1. a leak in the middle of a campaign: tagged with the cluster,
    // named by no PV
    let cinder = c.cinder().unwrap();
    let leaked = cinder
        .create_volume(&openstack_client::cinder::CreateVolume {
            name: "leaked-by-hand".into(),
            size_gib: 1,
            metadata: [(
                "cinder.csi.openstack.org/cluster".to_string(),
                "kubernetes".to_string(),
            )]
            .into(),
            ..Default::default()
        })
        .await
        .unwrap();

    // 2. a single-attach volume staged on two nodes: a writer's volume
    // mounted at a staging path of node A's as well, seen by the sampler
    // at once and in the step's samples
    let (writer, _) = writer_away_from(&c, &n, &c.node).await;
    let staged_twice = volume_handle(&c, &n, &writer).await;
    let staged = FakeMount::new(
        "plugins/kubernetes.io/csi/cinder.csi.openstack.org/0000two0writers0000/globalmount",
        &format!(r#"{{"driverName":"cinder.csi.openstack.org","volumeHandle":"{staged_twice}"}}"#),
    );
    let once = campaign.two_writers_on_nodes(label).await.unwrap();
    reported(&once, "NeverTwoWriters", label, &staged_twice);
    tokio::time::sleep(Duration::from_secs(8)).await;
    drop(staged);

    // 3. a writer whose filesystem went read-only: Ready, converged, dead
    let (silenced, node) = writer_away_from(&c, &n, "").await;
    let handle = volume_handle(&c, &n, &silenced).await;
    let mounts = c.cluster_py(&["csi-mounts", &node]).await.unwrap();
    let mounts: serde_json::Value =
        serde_json::from_str(mounts.lines().rev().find(|l| l.starts_with('[')).unwrap()).unwrap();
    let staging = mounts
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["kind"] == "staging" && m["volume_handle"] == handle.as_str())
        .and_then(|m| m["target"].as_str())
        .unwrap()
        .to_string();
    let read_only = ReadOnly::new(&c, &node, &staging).await;

    // 4. a mount nothing owns: a publish mount of a pod that does not
    // exist, as a NodePublish answered with a final error after it
    // mounted would leave
    let left = FakeMount::new(
        "pods/00000000-0000-0000-0000-1eftbe41nd00/volumes/kubernetes.io~csi/pvc-left-behind/mount",
        r#"{"driverName":"cinder.csi.openstack.org","volumeHandle":"left-behind","specVolID":"pvc-left-behind"}"#,
    );

    // 6. convergence slower than the bound: a claim that never binds
    c.apply_in(
        &n,
        &cluster_tests::claim(
            "never-bound",
            "no-such-class",
            "1Gi",
            "ReadWriteOnce",
            false,
        ),
    )
    .await
    .unwrap();

    let checked = campaign
        .after_step(label, began, Instant::now(), Duration::from_secs(10))
        .await;
    let _ = cinder.delete_volume(&leaked.id).await;
    drop(read_only);
    let target = left.target.clone();
    drop(left);
    // (the next step must converge)
    c.kubectl(&["delete", "pvc", "-n", &n, "never-bound"])
        .await
        .unwrap();
    reported_each(
        &checked.unwrap().1,
        label,
        &[
            ("NothingLeaked", &leaked.id),
            ("NeverTwoWriters", &staged_twice),
            ("WorkloadAlive", &silenced),
            ("NothingLeftBehind", &target),
            ("Converges", "never-bound"),
        ],
    );

    // a lost tail of acknowledged writes: with the writers stopped, the
    // last 150 records of writer-0's file cut (by another pod on its
    // claim), then the writers started again, resuming from what is left
    let label = "mutation 5 (the tail of a writer's acknowledged writes removed)";
    campaign.begin_step(label);
    let began = Instant::now();
    let node = c.get("pod", "writer-0", Some(&n)).await.unwrap().unwrap()["spec"]["nodeName"]
        .as_str()
        .unwrap()
        .to_string();
    c.kubectl(&["scale", "statefulset", "writer", "-n", &n, "--replicas=0"])
        .await
        .unwrap();
    c.wait_for("the writers stopped", Duration::from_secs(120), || async {
        let left = c.list("pods", &["-n", &n, "-l", "app=writer"]).await?;
        Ok(if left.is_empty() {
            Ok(())
        } else {
            Err(format!("{} left", left.len()))
        })
    })
    .await
    .unwrap();
    let cut = cluster_tests::placed_on(
        &cluster_tests::pod(
            "cut-tail",
            "data-writer-0",
            "n=$(wc -l < /data/seq); head -n $((n - 150)) /data/seq > /data/kept && cat /data/kept > /data/seq && rm /data/kept && sync",
            cluster_tests::PodOptions {
                run_once: true,
                ..Default::default()
            },
        ),
        &[&node],
    );
    c.apply_in(&n, &cut).await.unwrap();
    c.wait_succeeded(&n, "cut-tail", Duration::from_secs(180))
        .await
        .unwrap();
    c.kubectl(&["delete", "pod", "-n", &n, "cut-tail"])
        .await
        .unwrap();
    c.kubectl(&["scale", "statefulset", "writer", "-n", &n, "--replicas=3"])
        .await
        .unwrap();
    let checked = campaign
        .after_step(label, began, Instant::now(), bound)
        .await;
    reported(
        &checked.unwrap().1,
        "NoAcknowledgedWriteLost",
        label,
        "writer-0",
    );
    // what was cut stays cut: its witness goes, and writer-0's next
    // records start a new one
    std::fs::remove_file(campaign.witness_dir().join("writer-0")).unwrap();

    // a detach that fails for good: a scratch claim used on node A, then
    // its pod and claim deleted while Nova answers every detach with a
    // 500; its VolumeAttachment stays, being deleted, and the server
    // holds the volume
    let label = "mutation 8 (a detach that fails for good)";
    c.apply_in(
        &n,
        &[
            cluster_tests::claim(
                "undetached",
                "csi-cinder-sc-delete",
                "1Gi",
                "ReadWriteOnce",
                false,
            ),
            cluster_tests::placed_on(
                &cluster_tests::pod(
                    "undetached",
                    "undetached",
                    "exec sleep 3600",
                    cluster_tests::PodOptions::default(),
                ),
                &[&c.node],
            ),
        ]
        .join("---\n"),
    )
    .await
    .unwrap();
    c.wait_running(&n, "undetached", Duration::from_secs(180))
        .await
        .unwrap();
    campaign.begin_step(label);
    let began = Instant::now();
    campaign
        .proxy_rule(
            FaultClass::AnswersLost,
            FaultRule::new(
                Some("DELETE"),
                "/os-volume_attachments/",
                FaultAction::Status {
                    status: 500,
                    message: Some("the detach fails for good".into()),
                    retry_after: None,
                    hint: RetryHint::None,
                },
            ),
        )
        .await
        .unwrap();
    for kind in ["pod", "pvc"] {
        c.kubectl(&["delete", kind, "-n", &n, "undetached", "--wait=false"])
            .await
            .unwrap();
    }
    // the detach tried (and refused) before the checks look
    let (served, _) = campaign
        .until_served(&[FaultClass::AnswersLost], Duration::from_secs(180))
        .await
        .unwrap();
    let checked = campaign
        .after_step(label, began, Instant::now(), bound)
        .await;
    campaign.clear_proxy_faults().await.unwrap();
    println!(
        "{label}: the detach refused {} times",
        served[&FaultClass::AnswersLost]
    );
    reported(
        &checked.unwrap().1,
        "NothingLeftBehind",
        label,
        "no VolumeAttachment says so",
    );
    // the detach goes through once Nova takes it again
    let left = campaign
        .wait_nothing_left_behind(Duration::from_secs(180))
        .await
        .unwrap();
    assert!(left.is_empty(), "the detach never went through: {left:?}");

    // a retry loop that ignores the hint: a throttle of Keystone's at the
    // proxy (calls nobody else makes), and a client asking again every
    // 100 ms whatever the hint says
    let label = "mutation 7 (a retry loop that ignores the throttle's hint)";
    campaign
        .proxy_rule(
            FaultClass::CloudThrottled,
            FaultRule::new(
                Some("GET"),
                "/identity/v3/campaign-mutation",
                FaultAction::Throttle {
                    per_second: 0.2,
                    burst: 1,
                    hint: RetryHint::XRateLimitRetryAfter,
                },
            ),
        )
        .await
        .unwrap();
    let throttled = Instant::now();
    let keystone = keystone_via_proxy(&c);
    let (mut answers, mut refused) = (0, 0);
    while throttled.elapsed() < Duration::from_secs(10) {
        if let Some(status) = get_status(&keystone, "campaign-mutation").await {
            answers += 1;
            if status == 429 {
                refused += 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (served, _) = campaign
        .until_served(&[FaultClass::CloudThrottled], Duration::from_secs(1))
        .await
        .unwrap();
    campaign.clear_proxy_faults().await.unwrap();
    let n429 = served[&FaultClass::CloudThrottled];
    println!("{label}: {answers} answers, {refused} of them 429; the proxy served {n429}");
    let found: Vec<String> = hint_ignored(label, 1, n429, throttled.elapsed().as_secs())
        .into_iter()
        .collect();
    reported(&found, "BoundedPressure", label, "hint not honoured");
    // and a client that waits as told stays within it
    assert_eq!(
        hint_ignored(label, 1, throttled.elapsed().as_secs() / 5 + 1, 10),
        None
    );

    // a fault that is never felt: a rule for calls nobody makes
    campaign
        .proxy_rule(
            FaultClass::NovaBusy,
            FaultRule::new(Some("POST"), "/no-such-api/", FaultAction::Drop),
        )
        .await
        .unwrap();
    let (served, unserved) = campaign
        .until_served(&[FaultClass::NovaBusy], Duration::from_secs(6))
        .await
        .unwrap();
    campaign.clear_proxy_faults().await.unwrap();
    assert_eq!(
        unserved,
        [FaultClass::NovaBusy],
        "the fault that served nothing is seen: {served:?}"
    );
    campaign.close().await.unwrap();
}

/// The step's checks found the mutation (a violation of `invariant`, at
/// `label`, naming `what`), and nothing else.
fn reported(found: &[String], invariant: &str, label: &str, what: &str) {
    println!("{label}: {found:#?}");
    assert!(
        found
            .iter()
            .any(|v| v.starts_with(invariant) && v.contains(label) && v.contains(what)),
        "{label}: {invariant} naming {what} not reported: {found:#?}"
    );
    assert!(
        found
            .iter()
            .all(|v| v.starts_with(invariant) && v.contains(label)),
        "{label}: more than {invariant} reported: {found:#?}"
    );
}

/// The step's checks found each mutation (a violation of its invariant,
/// at `label`, naming what it mutated), and nothing else: no other
/// invariant, and no invariant of a mutation twice for another thing
/// than what that mutation did (a check that reports whatever it sees
/// would name the others' things too).
fn reported_each(found: &[String], label: &str, mutations: &[(&str, &str)]) {
    println!("{label}: {found:#?}");
    for (invariant, what) in mutations {
        assert!(
            found
                .iter()
                .any(|v| v.starts_with(invariant) && v.contains(label) && v.contains(what)),
            "{label}: {invariant} naming {what} not reported: {found:#?}"
        );
    }
    for v in found {
        assert!(
            v.contains(label)
                && mutations
                    .iter()
                    .any(|(invariant, _)| v.starts_with(invariant))
                && !mutations
                    .iter()
                    .any(|(invariant, what)| !v.starts_with(invariant) && v.contains(what)),
            "{label}: reported beyond the mutations, or a mutation under another's invariant: {v}"
        );
    }
}

/// Keystone's v3 API as the plugins reach it, through the fault proxy
/// (`cloud-member-via-proxy.conf`'s auth-url, `http://host:port/path`):
/// its address and path.
fn keystone_via_proxy(c: &Cluster) -> (String, String) {
    let conf = std::fs::read_to_string(c.cloud_conf("member-via-proxy")).unwrap();
    let url = conf
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once('=')?;
            (k.trim() == "auth-url").then(|| v.trim().trim_matches('"').to_string())
        })
        .unwrap();
    let rest = url.strip_prefix("http://").unwrap();
    let (address, path) = rest.split_once('/').unwrap_or((rest, ""));
    (
        address.to_string(),
        format!("/{}", path.trim_end_matches('/')),
    )
}

/// The status of a GET of `below` the API at `(address, path)`, plain
/// HTTP on loopback (a client that reads no hint).
async fn get_status((address, path): &(String, String), below: &str) -> Option<u16> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(address).await.ok()?;
    s.write_all(
        format!("GET {path}/{below} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n")
            .as_bytes(),
    )
    .await
    .ok()?;
    let mut head = vec![0; 64];
    let n = s.read(&mut head).await.ok()?;
    let line = String::from_utf8_lossy(&head[..n]).into_owned();
    line.split_whitespace().nth(1)?.parse().ok()
}

/// A writer (its pod's name and node) on another node than `not_on`.
async fn writer_away_from(c: &Cluster, n: &str, not_on: &str) -> (String, String) {
    for p in c
        .list("pods", &["-n", n, "-l", "app=writer"])
        .await
        .unwrap()
    {
        let node = p["spec"]["nodeName"].as_str().unwrap_or_default();
        if node != not_on && !node.is_empty() {
            return (
                p["metadata"]["name"].as_str().unwrap().to_string(),
                node.to_string(),
            );
        }
    }
    panic!("no writer away from {not_on}");
}

/// The Cinder volume of a writer's claim.
async fn volume_handle(c: &Cluster, n: &str, writer: &str) -> String {
    let claim = c
        .get("pvc", &format!("data-{writer}"), Some(n))
        .await
        .unwrap()
        .unwrap();
    let pv = c
        .get("pv", claim["spec"]["volumeName"].as_str().unwrap(), None)
        .await
        .unwrap()
        .unwrap();
    pv["spec"]["csi"]["volumeHandle"]
        .as_str()
        .unwrap()
        .to_string()
}

/// A filesystem of a node read-only until dropped.
struct ReadOnly {
    node: String,
    target: String,
}

impl ReadOnly {
    async fn new(c: &Cluster, node: &str, target: &str) -> Self {
        c.cluster_py(&["remount", node, target, "ro"])
            .await
            .unwrap();
        Self {
            node: node.to_string(),
            target: target.to_string(),
        }
    }
}

impl Drop for ReadOnly {
    fn drop(&mut self) {
        let _ = std::process::Command::new("python3")
            .arg(cluster_tests::repo().join("tests/cluster/cluster.py"))
            .args(["remount", &self.node, &self.target, "rw"])
            .output();
    }
}

/// What `reported_each` lets through, and what it refuses (it runs
/// without a cluster).
#[test]
fn reported_each_needs_every_mutation_under_its_own_invariant_and_nothing_else() {
    let label = "mutations A and B";
    let mutations = [("NothingLeaked", "vol-1"), ("Converges", "never-bound")];
    let leaked = format!("NothingLeaked at {label}: \"volume\" \"vol-1\"");
    let slow = format!("Converges at {label}: unbound [\"never-bound\"]");
    let late = format!("Converges at {label}: converged 10 s after the faults ended");
    reported_each(&[leaked.clone(), slow.clone(), late], label, &mutations);
    let refused = |found: Vec<String>| {
        std::panic::catch_unwind(|| reported_each(&found, label, &mutations)).is_err()
    };
    assert!(refused(vec![leaked.clone()]), "a mutation not reported");
    assert!(
        refused(vec![
            leaked.clone(),
            slow.clone(),
            format!("WorkloadAlive at {label}: writer-0")
        ]),
        "another invariant reported"
    );
    assert!(
        refused(vec![
            leaked.clone(),
            slow.clone(),
            format!("Converges at {label}: \"vol-1\" not converged")
        ]),
        "a mutation's thing under another's invariant"
    );
    assert!(
        refused(vec![
            leaked,
            slow,
            "NothingLeaked at an earlier step: vol-2".into()
        ]),
        "a report of another step"
    );
}
