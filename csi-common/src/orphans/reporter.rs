//! The controller's orphan report: a gauge per kind, the time of the last
//! scan, and a log line naming the orphans; and how the plugin reaches
//! the apiserver for it.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::{ClusterRefs, Inventory, Report};

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
            "Volumes, shares and snapshots proven this cluster's that no PersistentVolume or VolumeSnapshotContent names, older than the grace period",
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
    #[error("reading the cluster (its identity, PVs and snapshot contents): {0}")]
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
                            unproven = report.unproven.len(),
                            "no orphans"
                        );
                    } else {
                        tracing::warn!(
                            orphans = report.orphans.len(),
                            tagged = report.tagged,
                            "this cluster's and named by no PersistentVolume or VolumeSnapshotContent (`orphans --delete` removes them): {}",
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
    /// The apiserver, when not in a pod (https://10.0.0.1:6443; plain
    /// `http://` only on a loopback address).
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
    #[arg(long = "orphan-report-interval", default_value = "10m", value_parser = super::command::parse_duration)]
    pub orphan_report_interval: Duration,
    /// Only what is at least this old counts as an orphan (its PV may be
    /// on its way).
    #[arg(long = "orphan-grace", default_value = "15m", value_parser = super::command::parse_duration)]
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
