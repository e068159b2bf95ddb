//! Applying configuration changes as they come (see [`crate::config_watch`]):
//! each change is applied once, what it did is logged once, and a change
//! that cannot be applied keeps the running configuration, says why, and
//! shows in the metrics until a later change applies.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::config_watch::{ConfigWatch, Reload};

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: &'static str,
}

/// `config_reloads_total{result="applied|unchanged|failed"}`,
/// `config_reload_failing` (1 while the newest configuration could not be
/// applied), `config_last_reload_timestamp_seconds` (of the last one
/// applied).
#[derive(Debug, Clone, Default)]
pub struct ReloadMetrics {
    reloads: Family<ResultLabel, Counter>,
    failing: Gauge,
    last_applied: Gauge<f64, AtomicU64>,
}

impl ReloadMetrics {
    pub fn register(&self, registry: &mut Registry) {
        // every result at 0 from the start: a dashboard's rate() and alerts
        // see the series before the first reload
        for result in ["applied", "unchanged", "failed"] {
            let _ = self.reloads.get_or_create(&ResultLabel { result });
        }
        registry.register(
            "config_reloads",
            "Configuration reloads, by result",
            self.reloads.clone(),
        );
        registry.register(
            "config_reload_failing",
            "1 while the newest configuration could not be applied (the previous one is in use)",
            self.failing.clone(),
        );
        registry.register(
            "config_last_reload_timestamp_seconds",
            "When a changed configuration was last applied (Unix time)",
            self.last_applied.clone(),
        );
    }

    fn count(&self, result: &'static str) {
        self.reloads.get_or_create(&ResultLabel { result }).inc();
    }
}

/// Runs `apply` for every change `watch` reports: `Ok(Some(what))` it
/// applied something, `Ok(None)` nothing had changed (a SIGHUP after a
/// file change already applied), `Err(why)` it could not (the running
/// configuration stays). The same failure repeated is logged once.
pub fn spawn_reloader<F>(
    watch: ConfigWatch,
    metrics: ReloadMetrics,
    mut apply: F,
) -> tokio::task::JoinHandle<()>
where
    F: FnMut(&Reload) -> Result<Option<String>, String> + Send + 'static,
{
    let files: Vec<String> = watch
        .paths()
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    tracing::info!(files = ?files, "watching the configuration (and SIGHUP)");
    let mut changes = watch.spawn();
    tokio::spawn(async move {
        let mut last_failure: Option<String> = None;
        while let Some(why) = changes.recv().await {
            match apply(&why) {
                Ok(Some(what)) => {
                    metrics.count("applied");
                    metrics.failing.set(0);
                    metrics.last_applied.set(
                        std::time::SystemTime::now()
                            .duration_since(std::time::UNIX_EPOCH)
                            .map_or(0.0, |d| d.as_secs_f64()),
                    );
                    last_failure = None;
                    tracing::info!(trigger = %why, applied = %what, "configuration reloaded");
                }
                Ok(None) => {
                    metrics.count("unchanged");
                    if last_failure.take().is_some() {
                        metrics.failing.set(0);
                        tracing::info!(trigger = %why, "the configuration is usable again");
                    } else {
                        tracing::debug!(trigger = %why, "configuration unchanged");
                    }
                }
                Err(e) => {
                    metrics.count("failed");
                    metrics.failing.set(1);
                    if last_failure.as_deref() == Some(e.as_str()) {
                        tracing::debug!(trigger = %why, error = %e, "configuration still unusable");
                    } else {
                        tracing::error!(trigger = %why, error = %e, "configuration not reloaded; the running one stays");
                        last_failure = Some(e);
                    }
                }
            }
        }
    })
}
