//! Orphans: what a cluster's driver made in OpenStack (a volume, a share,
//! a snapshot, tagged with the cluster's id) that no PersistentVolume or
//! VolumeSnapshotContent of the cluster names any more. A provisioner
//! stopped between CreateVolume and the PV, with the claim deleted
//! meanwhile, leaves one for good (external-provisioner #486), and so
//! does a PV deleted by hand with its reclaim policy `Retain` forgotten.
//! Upstream leaks them silently.
//!
//! The controller reports them ([`spawn_reporter`]): a gauge per kind, the
//! time of the last scan, and a log line naming them; `<plugin> orphans`
//! prints the same report and, only when asked (`--delete`), deletes
//! those older than `--older-than`, never one in use, and only after
//! reading the cluster's PVs again. Something younger than the grace
//! period is not an orphan yet: its PV may still be on its way.

use std::collections::HashSet;
use std::future::Future;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serde::Serialize;

/// The first argument that runs the report instead of the plugin.
pub const SUBCOMMAND: &str = "orphans";

/// Whether this process was started as `<plugin> orphans`.
pub fn invoked() -> bool {
    std::env::args().nth(1).as_deref() == Some(SUBCOMMAND)
}

/// Which of the cluster's lists names a resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NamedBy {
    /// A PersistentVolume's `spec.csi.volumeHandle`.
    PersistentVolume,
    /// A VolumeSnapshotContent's snapshot handle.
    SnapshotContent,
}

/// A resource of the cloud that carries this cluster's id.
#[derive(Debug, Clone, Serialize)]
pub struct Tagged {
    /// `volume`, `share`, `snapshot`: the metric's label.
    pub kind: &'static str,
    pub id: String,
    pub name: String,
    pub status: String,
    /// Seconds since the Unix epoch.
    pub created: Option<u64>,
    pub named_by: NamedBy,
    /// Why it is never deleted here, orphan or not (attached to a server,
    /// busy): it is reported with the reason.
    pub keep: Option<String>,
}

/// What the cluster names: its driver's volume and snapshot handles.
#[derive(Debug, Clone, Default)]
pub struct ClusterRefs {
    pub volumes: HashSet<String>,
    /// None: the cluster has no snapshot API, so it names no snapshot.
    pub snapshots: Option<HashSet<String>>,
}

impl ClusterRefs {
    /// The driver's PVs and snapshot contents, as the apiserver lists them.
    pub async fn of(kube: &kube_api::Client, driver: &str) -> Result<Self, kube_api::KubeError> {
        Ok(Self {
            volumes: kube.csi_volume_handles(driver).await?,
            snapshots: kube.csi_snapshot_handles(driver).await?,
        })
    }

    fn names(&self, t: &Tagged) -> bool {
        match t.named_by {
            NamedBy::PersistentVolume => self.volumes.contains(&t.id),
            NamedBy::SnapshotContent => self.snapshots.as_ref().is_some_and(|s| s.contains(&t.id)),
        }
    }
}

/// The report of one scan.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    /// Tagged, named by nothing, older than the grace period.
    pub orphans: Vec<Tagged>,
    /// Named by nothing yet, but younger than the grace period.
    pub young: Vec<Tagged>,
    /// Everything tagged with the cluster's id.
    pub tagged: usize,
}

impl Report {
    /// Sorts what the cloud holds for the cluster against what the
    /// cluster names.
    pub fn new(tagged: Vec<Tagged>, refs: &ClusterRefs, grace: Duration, now: SystemTime) -> Self {
        let now = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let mut r = Report {
            tagged: tagged.len(),
            ..Default::default()
        };
        for t in tagged.into_iter().filter(|t| !refs.names(t)) {
            // no creation time: old enough (it cannot be told apart)
            let age = t.created.map_or(u64::MAX, |c| now.saturating_sub(c));
            if age >= grace.as_secs() {
                r.orphans.push(t);
            } else {
                r.young.push(t);
            }
        }
        // by kind, oldest first, the undated last
        r.orphans
            .sort_by_key(|t| (t.kind, t.created.unwrap_or(u64::MAX)));
        r
    }

    /// Orphans per kind.
    pub fn counts(&self) -> std::collections::BTreeMap<&'static str, usize> {
        let mut c = std::collections::BTreeMap::new();
        for o in &self.orphans {
            *c.entry(o.kind).or_default() += 1;
        }
        c
    }

    /// One line naming the orphans (the first 20 of them).
    pub fn summary(&self) -> String {
        const SHOWN: usize = 20;
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let mut names: Vec<String> = self
            .orphans
            .iter()
            .take(SHOWN)
            .map(|o| {
                format!(
                    "{} {} ({:?}, {}{})",
                    o.kind,
                    o.id,
                    o.name,
                    o.status,
                    o.created
                        .map(|c| format!(", {} old", human(now.saturating_sub(c))))
                        .unwrap_or_default()
                )
            })
            .collect();
        if self.orphans.len() > SHOWN {
            names.push(format!("and {} more", self.orphans.len() - SHOWN));
        }
        names.join("; ")
    }
}

/// `3h05m`, `12m`, `40s`.
fn human(secs: u64) -> String {
    match secs {
        s if s >= 86400 => format!("{}d{:02}h", s / 86400, s % 86400 / 3600),
        s if s >= 3600 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        s if s >= 60 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

/// OpenStack's `created_at` as seconds since the epoch.
pub fn created(created_at: Option<&str>) -> Option<u64> {
    crate::request::timestamp(created_at).and_then(|t| u64::try_from(t.seconds).ok())
}

/// What a driver lists and deletes of its own in the cloud.
pub trait Inventory: Send + Sync {
    /// Everything tagged with the cluster's id (volumes and their
    /// snapshots, or shares and theirs).
    fn tagged(&self) -> impl Future<Output = Result<Vec<Tagged>, openstack_client::Error>> + Send;
    /// Deletes one orphan (asked again: it may have changed since).
    fn delete(
        &self,
        t: &Tagged,
    ) -> impl Future<Output = Result<(), openstack_client::Error>> + Send;
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: &'static str,
}

/// `<prefix>_orphans{kind}`, `<prefix>_orphan_scans_total{result}` and
/// `<prefix>_orphan_scan_timestamp_seconds`. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct OrphanMetrics {
    orphans: Family<KindLabel, Gauge>,
    scans: Family<ResultLabel, Counter>,
    last_scan: Gauge,
}

impl OrphanMetrics {
    /// Registers under `prefix` (`cinder_csi`, `manila_csi`), with every
    /// kind the driver has at 0 until the first scan says otherwise.
    pub fn register(&self, registry: &mut Registry, prefix: &str, kinds: &[&'static str]) {
        for kind in kinds {
            self.orphans.get_or_create(&KindLabel { kind }).set(0);
        }
        registry.register(
            format!("{prefix}_orphans"),
            "Volumes, shares and snapshots tagged with this cluster that no PersistentVolume or VolumeSnapshotContent names, older than the grace period",
            self.orphans.clone(),
        );
        registry.register(
            format!("{prefix}_orphan_scans"),
            "Orphan scans, by result",
            self.scans.clone(),
        );
        registry.register(
            format!("{prefix}_orphan_scan_timestamp_seconds"),
            "When the last orphan scan succeeded (Unix time)",
            self.last_scan.clone(),
        );
    }

    fn record(&self, report: &Report, kinds: &[&'static str]) {
        let counts = report.counts();
        for kind in kinds {
            self.orphans
                .get_or_create(&KindLabel { kind })
                .set(counts.get(kind).copied().unwrap_or(0) as i64);
        }
        self.scans
            .get_or_create(&ResultLabel { result: "ok" })
            .inc();
        self.last_scan.set(
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs() as i64),
        );
    }
}

/// Why a scan failed.
#[derive(Debug, thiserror::Error)]
pub enum ScanError {
    #[error("listing the cluster's volumes: {0}")]
    Kube(#[from] kube_api::KubeError),
    #[error("listing what the cloud holds for the cluster: {0}")]
    Cloud(#[from] openstack_client::Error),
}

/// One scan: the cluster's names first, then the cloud (something made
/// between the two is young, and so no orphan).
pub async fn scan<I: Inventory>(
    inventory: &I,
    kube: &kube_api::Client,
    driver: &str,
    grace: Duration,
) -> Result<Report, ScanError> {
    let refs = ClusterRefs::of(kube, driver).await?;
    let tagged = inventory.tagged().await?;
    Ok(Report::new(tagged, &refs, grace, SystemTime::now()))
}

/// Scans every `interval` (the first after a tenth of it), sets the
/// metrics and logs the orphans by name.
pub fn spawn_reporter<I: Inventory + 'static>(
    inventory: I,
    kube: kube_api::Client,
    driver: String,
    interval: Duration,
    grace: Duration,
    metrics: OrphanMetrics,
    kinds: &'static [&'static str],
) {
    tokio::spawn(async move {
        let mut wait = interval / 10;
        loop {
            tokio::time::sleep(wait).await;
            wait = interval;
            match scan(&inventory, &kube, &driver, grace).await {
                Ok(report) => {
                    metrics.record(&report, kinds);
                    if report.orphans.is_empty() {
                        tracing::debug!(
                            tagged = report.tagged,
                            young = report.young.len(),
                            "no orphans"
                        );
                    } else {
                        tracing::warn!(
                            orphans = report.orphans.len(),
                            tagged = report.tagged,
                            "tagged with this cluster and named by no PersistentVolume or VolumeSnapshotContent (`orphans --delete` removes them): {}",
                            report.summary()
                        );
                    }
                }
                Err(e) => {
                    metrics
                        .scans
                        .get_or_create(&ResultLabel { result: "error" })
                        .inc();
                    tracing::warn!(error = %e, "orphan scan failed");
                }
            }
        }
    });
}

/// How the plugin reaches the apiserver: in a pod, with the pod's own
/// credentials; outside one, with these.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct KubeArgs {
    /// The apiserver, when not in a pod (e.g. https://10.0.0.1:6443;
    /// `http://` only for tests).
    #[arg(long = "kube-apiserver")]
    pub kube_apiserver: Option<url::Url>,
    /// A file holding a bearer token for it (`kubectl create token ...`).
    #[arg(long = "kube-token-file", requires = "kube_apiserver")]
    pub kube_token_file: Option<std::path::PathBuf>,
    /// The apiserver's CA certificate (PEM).
    #[arg(long = "kube-ca-file", requires = "kube_apiserver")]
    pub kube_ca_file: Option<std::path::PathBuf>,
}

impl KubeArgs {
    /// A client of the apiserver: the one named, else the pod's own.
    pub fn client(&self) -> Result<kube_api::Client, kube_api::KubeError> {
        let Some(base) = &self.kube_apiserver else {
            return kube_api::Client::in_cluster();
        };
        let ca = match &self.kube_ca_file {
            Some(f) => Some(
                std::fs::read(f)
                    .map_err(|e| kube_api::KubeError::Config(format!("{}: {e}", f.display())))?,
            ),
            None => None,
        };
        let token = self.kube_token_file.clone().ok_or_else(|| {
            kube_api::KubeError::Config("--kube-apiserver needs --kube-token-file".into())
        })?;
        kube_api::Client::new(base.clone(), ca.as_deref(), kube_api::Token::File(token))
    }
}

/// The controller's orphan report: its flags, both drivers alike.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// How often the controller looks for orphans (`0` turns it off):
    /// `<prefix>_orphans{kind}` and a log line naming them.
    #[arg(long = "orphan-report-interval", default_value = "10m", value_parser = parse_duration)]
    pub orphan_report_interval: Duration,
    /// Only what is at least this old counts as an orphan (its PV may be
    /// on its way).
    #[arg(long = "orphan-grace", default_value = "15m", value_parser = parse_duration)]
    pub orphan_grace: Duration,
    #[command(flatten)]
    pub kube: KubeArgs,
}

/// Starts the controller's reporter, or says why there is none: turned
/// off, no cluster id (nothing is tagged), no credentials of its own, no
/// apiserver to ask.
pub fn start<I: Inventory + 'static>(
    inventory: Option<I>,
    cluster: &str,
    driver: &str,
    args: &ServeArgs,
    registry: &std::sync::Mutex<Registry>,
    prefix: &str,
    kinds: &'static [&'static str],
) {
    let off = |why: &str| tracing::info!("no orphan report: {why}");
    if args.orphan_report_interval.is_zero() {
        return off("--orphan-report-interval=0");
    }
    if cluster.is_empty() {
        return off(
            "no cluster id (what this driver makes carries none, so none of it can be told apart)",
        );
    }
    let Some(inventory) = inventory else {
        return off("the controller has no credentials of its own in its cloud.conf");
    };
    let kube = match args.kube.client() {
        Ok(k) => k,
        Err(e) => return off(&format!("no apiserver to ask ({e})")),
    };
    let metrics = OrphanMetrics::default();
    metrics.register(
        &mut registry.lock().unwrap_or_else(|p| p.into_inner()),
        prefix,
        kinds,
    );
    spawn_reporter(
        inventory,
        kube,
        driver.to_string(),
        args.orphan_report_interval,
        args.orphan_grace,
        metrics,
        kinds,
    );
}

/// The orphan report's flags both drivers take.
#[derive(Debug, Clone, clap::Args)]
pub struct ReportArgs {
    /// Only what is at least this old is an orphan (its PV may still be
    /// on its way), and deleted with --delete: `90s`, `30m`, `2h`, `7d`.
    #[arg(long = "older-than", default_value = "1h", value_parser = parse_duration)]
    pub older_than: Duration,
    /// Delete the orphans found (never one in use), after reading the
    /// cluster's PVs and snapshot contents again.
    #[arg(long)]
    pub delete: bool,
    /// `text` or `json`.
    #[arg(long, default_value = "text", value_parser = ["text", "json"])]
    pub output: String,
    #[command(flatten)]
    pub kube: KubeArgs,
}

/// `90s`, `30m`, `2h`, `7d`, or plain seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (n, unit) = s
        .find(|c: char| !c.is_ascii_digit())
        .map_or((s, "s"), |i| s.split_at(i));
    let n: u64 = n
        .parse()
        .map_err(|_| format!("{s:?} is not a duration (90s, 30m, 2h, 7d)"))?;
    let secs = match unit {
        "s" => n,
        "m" => n.saturating_mul(60),
        "h" => n.saturating_mul(3600),
        "d" => n.saturating_mul(86400),
        _ => return Err(format!("{s:?} is not a duration (90s, 30m, 2h, 7d)")),
    };
    Ok(Duration::from_secs(secs))
}

/// Why `<plugin> orphans` failed.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    #[error("{0}")]
    Flags(String),
    #[error(transparent)]
    Plugin(#[from] crate::plugin::PluginError),
    #[error(transparent)]
    Client(#[from] openstack_client::Error),
    #[error(transparent)]
    Scan(#[from] ScanError),
    #[error(transparent)]
    Log(#[from] plugin_runtime::logging::LogError),
}

impl From<openstack_client::config::ConfigError> for CommandError {
    fn from(e: openstack_client::config::ConfigError) -> Self {
        Self::Plugin(e.into())
    }
}

/// What `<plugin> orphans` did, for its output.
#[derive(Debug, Default, Serialize)]
pub struct CommandOutcome {
    pub cluster: String,
    pub driver: String,
    pub older_than_secs: u64,
    pub report: Report,
    /// With --delete: what was deleted, and what was kept and why.
    pub deleted: Vec<String>,
    pub kept: Vec<String>,
}

/// `<plugin> orphans`: the report, and the deletions asked for.
pub async fn run_command<I: Inventory>(
    inventory: &I,
    cluster: &str,
    driver: &str,
    args: &ReportArgs,
) -> Result<CommandOutcome, ScanError> {
    let kube = args.kube.client()?;
    let report = scan(inventory, &kube, driver, args.older_than).await?;
    let mut out = CommandOutcome {
        cluster: cluster.to_string(),
        driver: driver.to_string(),
        older_than_secs: args.older_than.as_secs(),
        ..Default::default()
    };
    if args.delete && !report.orphans.is_empty() {
        // the cluster again, just before: a PV made meanwhile wins
        let refs = ClusterRefs::of(&kube, driver).await?;
        // snapshots first: a volume with snapshots cannot go
        let mut order: Vec<&Tagged> = report.orphans.iter().collect();
        order.sort_by_key(|t| t.named_by != NamedBy::SnapshotContent);
        for t in order {
            let what = format!("{} {} ({:?})", t.kind, t.id, t.name);
            if refs.names(t) {
                out.kept.push(format!("{what}: named by the cluster now"));
            } else if let Some(why) = &t.keep {
                out.kept.push(format!("{what}: {why}"));
            } else {
                match inventory.delete(t).await {
                    Ok(()) => {
                        tracing::info!(kind = t.kind, id = %t.id, name = %t.name, "orphan deleted");
                        out.deleted.push(what);
                    }
                    Err(e) => out.kept.push(format!("{what}: {e}")),
                }
            }
        }
    }
    out.report = report;
    Ok(out)
}

impl CommandOutcome {
    /// As `--output` asks: `json`, or the text an operator reads.
    pub fn render(&self, output: &str) -> String {
        if output == "json" {
            serde_json::to_string_pretty(self).unwrap_or_default() + "\n"
        } else {
            self.text()
        }
    }

    /// The text an operator reads.
    pub fn text(&self) -> String {
        let r = &self.report;
        let mut s = format!(
            "cluster {:?}, driver {}: {} tagged, {} orphan(s) older than {}, {} younger not counted\n",
            self.cluster,
            self.driver,
            r.tagged,
            r.orphans.len(),
            human(self.older_than_secs),
            r.young.len()
        );
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        for o in &r.orphans {
            s.push_str(&format!(
                "orphan {:<8} {}  {:?}  {}  {}{}\n",
                o.kind,
                o.id,
                o.name,
                o.status,
                o.created
                    .map(|c| format!("{} old", human(now.saturating_sub(c))))
                    .unwrap_or_else(|| "age unknown".into()),
                o.keep
                    .as_ref()
                    .map(|k| format!("  (kept: {k})"))
                    .unwrap_or_default()
            ));
        }
        for d in &self.deleted {
            s.push_str(&format!("deleted {d}\n"));
        }
        for k in &self.kept {
            s.push_str(&format!("kept {k}\n"));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tagged(kind: &'static str, id: &str, age_secs: Option<u64>, now: u64) -> Tagged {
        Tagged {
            kind,
            id: id.into(),
            name: format!("pvc-{id}"),
            status: "available".into(),
            created: age_secs.map(|a| now - a),
            named_by: if kind == "snapshot" {
                NamedBy::SnapshotContent
            } else {
                NamedBy::PersistentVolume
            },
            keep: None,
        }
    }

    #[test]
    fn what_nothing_names_past_the_grace_period_is_an_orphan() {
        let now = SystemTime::now();
        let secs = now.duration_since(UNIX_EPOCH).unwrap().as_secs();
        let refs = ClusterRefs {
            volumes: ["v-named".to_string()].into(),
            snapshots: Some(["s-named".to_string()].into()),
        };
        let r = Report::new(
            vec![
                tagged("volume", "v-named", Some(7200), secs),
                tagged("volume", "v-old", Some(7200), secs),
                tagged("volume", "v-young", Some(60), secs),
                tagged("volume", "v-undated", None, secs),
                tagged("snapshot", "s-named", Some(7200), secs),
                tagged("snapshot", "s-old", Some(7200), secs),
                // a snapshot id that a PV happens to name is still a snapshot
                tagged("snapshot", "v-named", Some(7200), secs),
            ],
            &refs,
            Duration::from_secs(600),
            now,
        );
        let ids: Vec<&str> = r.orphans.iter().map(|o| o.id.as_str()).collect();
        assert_eq!(ids, ["s-old", "v-named", "v-old", "v-undated"]);
        assert_eq!(r.young.len(), 1);
        assert_eq!(r.tagged, 7);
        assert_eq!(r.counts().get("volume"), Some(&2));
        assert!(
            r.summary()
                .contains("volume v-old (\"pvc-v-old\", available, 2h00m old)"),
            "{}",
            r.summary()
        );
        // without a snapshot API, no snapshot is named
        let none = ClusterRefs {
            snapshots: None,
            ..refs
        };
        let r = Report::new(
            vec![tagged("snapshot", "s-named", Some(7200), secs)],
            &none,
            Duration::ZERO,
            now,
        );
        assert_eq!(r.orphans.len(), 1);
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("30m"), Ok(Duration::from_secs(1800)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(604800)));
        assert_eq!(parse_duration("15"), Ok(Duration::from_secs(15)));
        assert!(parse_duration("1w").is_err());
        assert!(parse_duration("-1s").is_err());
        assert!(parse_duration("").is_err());
    }
}
