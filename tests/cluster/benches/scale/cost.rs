//! What the scale bench's work cost: the controllers' RPC times from their
//! metrics, the sidecars' waits on their own API rate limit from their
//! logs, the plugins' CPU and memory from /proc, the cluster's volumes in
//! Cinder.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use cluster_tests::Cluster;
use openstack_client::cinder::BlockStorage;

/// The Cinder controller's metrics port (on the host network here).
pub(super) const CINDER_CONTROLLER_METRICS: u16 = 9828;

/// A Go duration as client-go logs it (`850ms`, `1.5s`, `2m3.4s`).
pub(super) fn go_duration(text: &str) -> Option<Duration> {
    let mut total = 0.0;
    let mut number = String::new();
    let mut chars = text.chars().peekable();
    while let Some(ch) = chars.next() {
        if ch.is_ascii_digit() || ch == '.' {
            number.push(ch);
            continue;
        }
        let value: f64 = number.parse().ok()?;
        number.clear();
        let unit = match (ch, chars.peek()) {
            ('m', Some('s')) => {
                chars.next();
                0.001
            }
            ('u' | 'µ', Some('s')) => {
                chars.next();
                0.000_001
            }
            ('h', _) => 3600.0,
            ('m', _) => 60.0,
            ('s', _) => 1.0,
            _ => return None,
        };
        total += value * unit;
    }
    number.is_empty().then(|| Duration::from_secs_f64(total))
}

/// What a controller's sidecar logged about its own client-side rate
/// limit (its --kube-api-qps and --kube-api-burst) since `since`: client-go
/// logs a wait over 1 s at -v=2, at most once a second. The number of such
/// lines and the longest wait.
pub(super) async fn throttled(
    c: &Cluster,
    app: &str,
    container: &str,
    since: Instant,
) -> (usize, Duration) {
    throttle_waits(&suite_logs(c, app, container, since).await)
}

/// What the `container` of the suite's pods labelled `app` logged since
/// `since` (every replica's, the node plugins' on every node).
pub(super) async fn suite_logs(c: &Cluster, app: &str, container: &str, since: Instant) -> String {
    let window = format!("--since={}s", since.elapsed().as_secs() + 5);
    let selector = format!("app={app}");
    c.kubectl(&[
        "-n",
        cluster_tests::SUITE_NAMESPACE,
        "logs",
        "-l",
        &selector,
        "-c",
        container,
        &window,
        "--tail=-1",
    ])
    .await
    .unwrap_or_default()
}

/// Where kube-controller-manager's log ends now: [`controller_manager_throttled`]
/// reads what it logs after.
pub(super) fn controller_manager_log_end(c: &Cluster) -> u64 {
    std::fs::metadata(c.dir.join("logs/kube-controller-manager.log")).map_or(0, |m| m.len())
}

/// What kube-controller-manager (whose PV controller binds the claims)
/// logged about its own client-side rate limit (its --kube-api-qps, 20 a
/// second by default) after `from`: the waits over 1 s, how many and the
/// longest.
pub(super) fn controller_manager_throttled(c: &Cluster, from: u64) -> (usize, Duration) {
    use std::io::{Read, Seek};
    let mut text = String::new();
    if let Ok(mut f) = std::fs::File::open(c.dir.join("logs/kube-controller-manager.log")) {
        let _ = f.seek(std::io::SeekFrom::Start(from));
        let _ = f.read_to_string(&mut text);
    }
    throttle_waits(&text)
}

/// The client-side throttling waits client-go logged in `logs`: how many,
/// and the longest.
fn throttle_waits(logs: &str) -> (usize, Duration) {
    let waits: Vec<Duration> = logs
        .lines()
        .filter(|l| l.contains("client-side throttling"))
        .filter_map(|l| {
            let rest = &l[l.find("delay=")? + "delay=".len()..];
            let value = rest.trim_start_matches('"');
            let end = value.find(['"', ' ']).unwrap_or(value.len());
            go_duration(&value[..end])
        })
        .collect();
    (waits.len(), waits.iter().max().copied().unwrap_or_default())
}

/// How many of a CSI Controller RPC a controller answered so far, and the
/// seconds it spent in them (summed over every answer, whatever its
/// code), from its gRPC metrics on the host network.
pub(super) async fn controller_rpc_totals(port: u16, method: &str) -> (f64, f64) {
    let text = cluster_tests::controller_metrics(port).await;
    let value = |series: &str| {
        cluster_tests::metric_value(
            &text,
            &format!("{series}{{method=\"/csi.v1.Controller/{method}\"}}"),
        )
    };
    (
        value("grpc_server_handling_seconds_count"),
        value("grpc_server_handling_seconds_sum"),
    )
}

/// The Cinder controller's attach (or detach) waits so far: how many, and
/// their seconds in all (`cinder_csi_attachment_wait_seconds`): the part
/// of a ControllerPublish spent waiting for Cinder to show the attachment.
pub(super) async fn attachment_wait_totals(operation: &str) -> (f64, f64) {
    let text = cluster_tests::controller_metrics(CINDER_CONTROLLER_METRICS).await;
    let value = |series: &str| {
        cluster_tests::metric_value(
            &text,
            &format!("cinder_csi_attachment_wait_seconds_{series}{{operation=\"{operation}\"}}"),
        )
    };
    (value("count"), value("sum"))
}

/// How many answers of a CSI Controller RPC the Cinder controller gave
/// so far, by gRPC code (its `grpc_server_handled_total`).
pub(super) async fn controller_rpc_codes(method: &str) -> BTreeMap<String, f64> {
    let text = cluster_tests::controller_metrics(CINDER_CONTROLLER_METRICS).await;
    let prefix =
        format!("grpc_server_handled_total{{method=\"/csi.v1.Controller/{method}\",code=\"");
    text.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix(&prefix)?;
            let (code, rest) = rest.split_once('"')?;
            Some((
                code.to_string(),
                rest.split_whitespace().last()?.parse().ok()?,
            ))
        })
        .collect()
}

/// The answers of each code given from `before` until `after`, as
/// `OK 24, Aborted 11`.
pub(super) fn codes_between(
    before: &BTreeMap<String, f64>,
    after: &BTreeMap<String, f64>,
) -> String {
    let answers: Vec<String> = after
        .iter()
        .map(|(code, n)| (code, n - before.get(code).copied().unwrap_or(0.0)))
        .filter(|(_, n)| *n > 0.0)
        .map(|(code, n)| format!("{code} {n:.0}"))
        .collect();
    answers.join(", ")
}

/// The calls of a controller RPC answered since `before`, and their mean time.
/// What a pair of totals (how many, their seconds) gained since
/// `before`: how many, and their mean.
pub(super) fn since_totals(now: (f64, f64), before: (f64, f64)) -> (f64, f64) {
    let count = now.0 - before.0;
    (count, (now.1 - before.1) / count.max(1.0))
}

pub(super) async fn rpc_since(method: &str, before: (f64, f64)) -> (f64, f64) {
    since_totals(
        controller_rpc_totals(CINDER_CONTROLLER_METRICS, method).await,
        before,
    )
}

/// Clock ticks per second: 100 on Linux for /proc's utime and stime.
const TICKS: f64 = 100.0;

/// Every process on this host (every node's pods run here, each in its
/// own namespaces): its /proc folder and its command line.
fn processes() -> impl Iterator<Item = (std::path::PathBuf, String)> {
    std::fs::read_dir("/proc").unwrap().flatten().map(|entry| {
        let cmd = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        (
            entry.path(),
            String::from_utf8_lossy(&cmd).replace('\0', " "),
        )
    })
}

/// A process's CPU time so far (s): after the command's closing
/// parenthesis in its stat, state is field 3, utime and stime 14 and 15.
fn cpu_seconds(proc_dir: &std::path::Path) -> f64 {
    let stat = std::fs::read_to_string(proc_dir.join("stat")).unwrap_or_default();
    let Some(rest) = stat.rfind(')').map(|i| &stat[i + 2..]) else {
        return 0.0;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / TICKS
}

/// The resident memory (MiB) and CPU time (s) of the Cinder plugin's
/// processes on this host, summed: the controller's
/// (`--provide-node-service=false`) or the node plugins'.
pub(super) fn cinder_plugin_usage(controller: bool) -> (f64, f64) {
    let (mut rss, mut cpu) = (0.0, 0.0);
    for (dir, cmd) in processes() {
        let is_plugin = cmd
            .split_whitespace()
            .next()
            .is_some_and(|exe| exe.ends_with("cinder-csi-plugin"));
        if !is_plugin || cmd.contains("--provide-node-service=false") != controller {
            continue;
        }
        let status = std::fs::read_to_string(dir.join("status")).unwrap_or_default();
        rss += status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse::<f64>().ok())
            .unwrap_or(0.0)
            / 1024.0;
        cpu += cpu_seconds(&dir);
    }
    (rss, cpu)
}

/// The Cinder controller's resident memory, in MiB.
pub(super) fn controller_rss_mib() -> f64 {
    cinder_plugin_usage(true).0
}

/// Volumes in Cinder that carry the cluster's id (what the controllers make).
pub(super) async fn cluster_volumes(cinder: &BlockStorage) -> usize {
    let tag = BTreeMap::from([(
        "cinder.csi.openstack.org/cluster".to_string(),
        "kubernetes".to_string(),
    )]);
    cinder.volumes_with_metadata(&tag).await.unwrap().len()
}

/// Who on this machine used its cores: OpenStack's services (their APIs
/// are gunicorn workers; and the test hypervisor that attaches for Nova), Kubernetes (its control plane,
/// kubelets, containerd, the sidecars, the bench's kubectl watches), our
/// plugins, the fault proxy in front of OpenStack, and the rest.
const CPU_GROUPS: [&str; 5] = [
    "OpenStack",
    "Kubernetes",
    "our plugins",
    "the fault proxy",
    "the rest",
];

fn cpu_group(cmd: &str) -> usize {
    let exe = cmd.split_whitespace().next().unwrap_or("");
    let exe = exe.rsplit('/').next().unwrap_or(exe);
    const OPENSTACK: [&str; 12] = [
        "cinder-",
        "nova-",
        "keystone",
        "placement",
        "manila-",
        "barbican",
        "mariadbd",
        "mysqld",
        "beam.smp",
        "ceph-",
        "ganesha",
        "hypervisor-agent",
    ];
    const KUBERNETES: [&str; 6] = [
        "kube",
        "etcd",
        "containerd",
        "csi-",
        "snapshot-controller",
        "livenessprobe",
    ];
    if exe.ends_with("-csi-plugin") {
        2
    } else if exe == "openstack-fault-proxy" {
        3
    } else if KUBERNETES.iter().any(|k| exe.starts_with(k)) {
        1
    } else if OPENSTACK.iter().any(|o| cmd.contains(o)) || cmd.contains("_app:application") {
        0
    } else {
        4
    }
}

/// The machine's CPU at one moment: its busy and idle time (s, every core
/// summed, /proc/stat) and each group's processes' CPU time so far.
#[derive(Debug, Clone, Copy)]
pub(super) struct MachineCpu {
    busy: f64,
    idle: f64,
    groups: [f64; 5],
}

impl MachineCpu {
    pub(super) fn now() -> Self {
        let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
        let fields: Vec<f64> = stat
            .lines()
            .next()
            .unwrap_or("")
            .split_whitespace()
            .skip(1)
            .filter_map(|f| f.parse().ok())
            .collect();
        // user nice system idle iowait irq softirq steal
        let idle = fields.get(3).copied().unwrap_or(0.0) + fields.get(4).copied().unwrap_or(0.0);
        let busy = fields.iter().take(8).sum::<f64>() - idle;
        let mut groups = [0.0; 5];
        for (dir, cmd) in processes() {
            groups[cpu_group(&cmd)] += cpu_seconds(&dir);
        }
        MachineCpu {
            busy: busy / TICKS,
            idle: idle / TICKS,
            groups,
        }
    }

    /// What was used from `self` until `later`: the cores' busy share and
    /// each group's CPU seconds, as one line.
    pub(super) fn until(&self, later: &MachineCpu) -> String {
        let busy = later.busy - self.busy;
        let all = busy + later.idle - self.idle;
        let groups: Vec<String> = CPU_GROUPS
            .iter()
            .zip(self.groups.iter().zip(later.groups.iter()))
            .map(|(name, (a, b))| format!("{name} {:.0} s", (b - a).max(0.0)))
            .collect();
        format!(
            "the cores busy {:.0} % of the time ({})",
            100.0 * busy / all.max(f64::EPSILON),
            groups.join(", ")
        )
    }
}
