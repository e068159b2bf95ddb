//! The plugin's lifecycle: read the configuration, serve KMS v2 on the
//! socket, keep the key fresh, and apply configuration changes (SIGHUP,
//! or cloud.conf rewritten or swapped by kubelet) without a restart:
//! rotated credentials take effect for the next call to Barbican, and a
//! new `[KeyManager] key-id` is a rotation that is remembered and retried
//! until Barbican hands the key out.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use openstack_client::barbican::KeyManager;
use openstack_client::config::{CloudConf, ConfigEnv, ConfigError};
use openstack_client::reload::SessionReload;
use openstack_client::{ApiMetrics, Session, SessionOptions};
use plugin_runtime::config_watch::ConfigWatch;
use plugin_runtime::reload::{ReloadMetrics, spawn_reloader};
use plugin_runtime::{KMS_SOCKET_MODE, PluginServer};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use proto::kms::v2::key_management_service_server::KeyManagementServiceServer;
use tokio::sync::Notify;

use crate::key_record::{KeyRecord, is_uuid};
use crate::keyring::KeyRing;
use crate::keystore::{BarbicanKeyStore, KeyStore};
use crate::options::Options;
use crate::service::{KmsService, RefusedLabels};

/// Why the plugin stops (or never starts).
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    #[error("reading --cloud-config: {0}")]
    Config(#[from] ConfigError),
    #[error("{path}: [KeyManager] key-id (the Barbican secret UUID of the key) is required")]
    NoKeyId { path: String },
    #[error("{0}")]
    KeyList(String),
    #[error("{0}")]
    Client(#[from] openstack_client::Error),
    #[error(transparent)]
    Runtime(#[from] plugin_runtime::RuntimeError),
}

fn key_id_of(conf: &CloudConf, opts: &Options) -> Result<String, PluginError> {
    conf.key_manager
        .key_id
        .clone()
        .ok_or_else(|| PluginError::NoKeyId {
            path: opts.cloud_config.display().to_string(),
        })
}

/// `[KeyManager] decrypt-key-ids` and `retired-key-ids` name Barbican
/// secrets by UUID; anything else is a mistake worth refusing.
fn check_key_lists(conf: &CloudConf) -> Result<(), String> {
    let km = &conf.key_manager;
    for (key, list) in [
        ("decrypt-key-ids", &km.decrypt_key_ids),
        ("retired-key-ids", &km.retired_key_ids),
    ] {
        if let Some(bad) = list.iter().find(|s| !is_uuid(s)) {
            return Err(format!(
                "[KeyManager] {key}: {bad:?} is not a Barbican secret UUID"
            ));
        }
    }
    Ok(())
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KeyLabels {
    current_secret: String,
    wanted_secret: String,
}

/// The key's metrics: its age, refresh failures, and which Barbican secret
/// is current and which the configuration wants (they differ while a
/// rotation is pending).
#[derive(Debug, Clone, Default)]
struct KeyMetrics {
    age: Gauge<f64, AtomicU64>,
    refresh_failures: Counter,
    rotation_pending_seconds: Gauge<f64, AtomicU64>,
    rotation_failures: Counter,
    info: Family<KeyLabels, Gauge>,
}

impl KeyMetrics {
    fn register(&self, r: &mut Registry) {
        r.register(
            "kms_key_age_seconds",
            "Seconds since Barbican last confirmed the current key",
            self.age.clone(),
        );
        r.register(
            "kms_key_refresh_failures",
            "Failed fetches of the current key from Barbican",
            self.refresh_failures.clone(),
        );
        r.register(
            "kms_key_rotation_pending_seconds",
            "How long a rotation the configuration asks for has not applied (0: none pending)",
            self.rotation_pending_seconds.clone(),
        );
        r.register(
            "kms_key_rotation_failures",
            "Failed attempts at a pending rotation",
            self.rotation_failures.clone(),
        );
        r.register(
            "kms_key_info",
            "The Barbican secret of the current key and the one the configuration names",
            self.info.clone(),
        );
    }

    fn update<S: KeyStore>(&self, ring: &KeyRing<S>) {
        self.age
            .set(ring.key_age().map_or(f64::NAN, |a| a.as_secs_f64()));
        let pending = ring.pending();
        self.rotation_pending_seconds.set(
            pending
                .as_ref()
                .map_or(0.0, |p| p.since.elapsed().as_secs_f64()),
        );
        let current = ring.current_secret();
        let labels = KeyLabels {
            wanted_secret: pending.map_or_else(|| current.clone(), |p| p.secret),
            current_secret: current,
        };
        if self.info.get(&labels).is_none() {
            self.info.clear();
            self.info.get_or_create(&labels).set(1);
        }
    }
}

/// Serves until SIGTERM or SIGINT.
pub async fn run(opts: Options) -> Result<(), PluginError> {
    tracing::info!(
        what = "the KMS v1 API (EncryptionConfiguration must say apiVersion: v2)",
        "not served by this instance"
    );
    let conf = CloudConf::load(
        std::slice::from_ref(&opts.cloud_config),
        ConfigEnv::from_process(),
    )?;
    for w in &conf.warnings {
        tracing::warn!(warning = %w, "cloud.conf");
    }
    let key_id = key_id_of(&conf, &opts)?;
    check_key_lists(&conf).map_err(PluginError::KeyList)?;
    let server = PluginServer::new(opts.socketpath.clone())
        .socket_mode(KMS_SOCKET_MODE)
        .http_endpoint(opts.http_endpoint);

    let api_metrics = ApiMetrics::default();
    let key_metrics = KeyMetrics::default();
    let reload_metrics = ReloadMetrics::default();
    let decrypt_refused = Family::<RefusedLabels, Counter>::default();
    {
        let registry = server.registry();
        let mut r = registry.lock().unwrap_or_else(|p| p.into_inner());
        api_metrics.register(&mut r);
        key_metrics.register(&mut r);
        reload_metrics.register(&mut r);
        r.register(
            "kms_decrypt_refused",
            "Decrypts refused for their key, by key: a retired key's Barbican secret (data a storage migration missed), or unnamed",
            decrypt_refused.clone(),
        );
    }
    let session = Session::new(
        conf.cloud("")?,
        SessionOptions {
            metrics: Some(api_metrics),
            ..Default::default()
        },
    )?;
    // a fetch never outlasts the refresh interval (nor 10 s): a failed
    // attempt is reported and retried on schedule rather than hidden in
    // one long call; but it always gets 2 s, which a loaded Barbican may
    // take (a refresh interval of 200 ms made every fetch time out there)
    let fetch_timeout = opts
        .refresh_interval
        .clamp(MIN_FETCH_TIMEOUT, MAX_FETCH_TIMEOUT);
    let store = BarbicanKeyStore::new(KeyManager::new(session.clone()), fetch_timeout);
    let record = KeyRecord::new(opts.key_record_path());
    if let Some(legacy) = opts.legacy_key_record_path() {
        match record.adopt(&legacy) {
            Ok(0) => {}
            Ok(n) => tracing::info!(
                keys = n,
                from = %legacy.display(),
                to = %record.path().display(),
                "the keys of the directory's shared record are this plugin's own record now"
            ),
            // its own record is then made from the keys it seals under;
            // the shared one stays as it is, for an operator to look at
            Err(e) => {
                tracing::warn!(error = %e, "the directory's shared key record was not taken over")
            }
        }
    }
    let ring = Arc::new(KeyRing::new(store, key_id, opts.max_staleness, record));
    ring.name_previous(&opts.previous_key_ids);
    for change in ring.configure_keys(
        &conf.key_manager.decrypt_key_ids,
        &conf.key_manager.retired_key_ids,
    ) {
        tracing::info!(%change, "[KeyManager]");
    }

    // configuration changes: new credentials at once, a new key id as a
    // pending rotation the key loop applies
    let wake = Arc::new(Notify::new());
    {
        let reload = SessionReload::new(
            vec![opts.cloud_config.clone()],
            vec![(String::new(), session)],
        );
        let ring = ring.clone();
        let wake = wake.clone();
        spawn_reloader(
            ConfigWatch::new(conf.watched_files()),
            reload_metrics,
            move |_| {
                let done = reload.reload().map_err(|e| e.to_string())?;
                let wanted = done.conf.key_manager.key_id.clone().ok_or_else(|| {
                    "[KeyManager] key-id is missing from the new configuration".to_string()
                })?;
                check_key_lists(&done.conf)?;
                let mut applied = Vec::new();
                if !done.changed.is_empty() {
                    applied.push("new Barbican credentials".to_string());
                }
                applied.extend(ring.configure_keys(
                    &done.conf.key_manager.decrypt_key_ids,
                    &done.conf.key_manager.retired_key_ids,
                ));
                if ring.want(&wanted) {
                    applied.push(if ring.pending().is_some() {
                        format!("rotation to Barbican secret {wanted} requested")
                    } else {
                        "pending rotation cancelled: the current key is wanted again".into()
                    });
                    wake.notify_one();
                }
                Ok((!applied.is_empty()).then(|| applied.join("; ")))
            },
        );
    }
    tokio::spawn(refresh_loop(
        ring.clone(),
        opts.clone(),
        key_metrics.clone(),
    ));
    tokio::spawn(rotation_loop(
        ring.clone(),
        opts.refresh_interval,
        key_metrics.clone(),
        wake,
    ));
    {
        // the gauges follow the ring whatever the loops are waiting for
        let ring = ring.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(250));
            loop {
                tick.tick().await;
                key_metrics.update(&ring);
            }
        });
    }

    let health_ring = ring.clone();
    let server = server.health_check(Arc::new(move || {
        let h = health_ring.health();
        Box::pin(async move {
            match h.problem {
                Some(p) => Err(p),
                None => Ok(h.note),
            }
        })
    }));
    let routes = tonic::service::Routes::new(KeyManagementServiceServer::new(KmsService::new(
        ring,
        decrypt_refused,
    )));
    server
        .serve(routes, plugin_runtime::shutdown_signal())
        .await?;
    Ok(())
}

/// Fetches the key until it works, then refreshes it at the interval.
async fn refresh_loop<S: KeyStore>(ring: Arc<KeyRing<S>>, opts: Options, metrics: KeyMetrics) {
    let mut loaded = false;
    let mut retry = FIRST_RETRY;
    loop {
        let wait = match ring.refresh().await {
            Ok(()) => {
                if !loaded {
                    loaded = true;
                    // every older key Decrypt may use, held before the
                    // apiserver asks: --previous-key-id and the record's
                    let mut older = opts.previous_key_ids.clone();
                    older.extend(ring.recorded_secrets());
                    older.sort();
                    older.dedup();
                    for prev in older.iter().filter(|s| **s != ring.current_secret()) {
                        match ring.load_previous(prev).await {
                            Ok(k) => tracing::info!(key_id = %k, "previous key loaded"),
                            Err(e) => {
                                tracing::warn!(error = %e, "previous key not loaded; Decrypt will fetch it on demand")
                            }
                        }
                    }
                }
                retry = FIRST_RETRY;
                opts.refresh_interval
            }
            Err(_) => {
                metrics.refresh_failures.inc();
                // before the first success retry fast, after it keep the
                // cached key and try again at the normal pace or sooner
                let wait = if loaded {
                    retry.min(opts.refresh_interval)
                } else {
                    retry
                };
                retry = (retry * 2).min(Duration::from_secs(30));
                wait
            }
        };
        tokio::time::sleep(wait).await;
    }
}

/// Applies a pending rotation: at once when one is asked for, then with
/// backoff (capped at the refresh interval) until Barbican hands the key
/// out. One log line per failed attempt. Runs beside the refresh, so that
/// a slow refresh does not hold a rotation back.
async fn rotation_loop<S: KeyStore>(
    ring: Arc<KeyRing<S>>,
    refresh_interval: Duration,
    metrics: KeyMetrics,
    wake: Arc<Notify>,
) {
    let mut backoff = FIRST_RETRY;
    let mut wait = None;
    loop {
        match wait {
            // nothing pending: until asked
            None => wake.notified().await,
            Some(d) => {
                tokio::select! {
                    () = tokio::time::sleep(d) => {}
                    // a newer request: try it now, with a fresh backoff
                    () = wake.notified() => backoff = FIRST_RETRY,
                }
            }
        }
        wait = match ring.rotate_pending().await {
            None => None,
            Some(Ok(secret)) => {
                tracing::info!(secret = %secret, "rotation applied: new writes use the new key");
                backoff = FIRST_RETRY;
                None
            }
            Some(Err(e)) => {
                metrics.rotation_failures.inc();
                tracing::error!(
                    error = %e,
                    retry_in_s = backoff.as_secs_f64(),
                    "cannot rotate to the new key yet; keeping the current one and retrying"
                );
                let d = backoff;
                backoff = (backoff * 2).min(refresh_interval);
                Some(d)
            }
        };
    }
}

const FIRST_RETRY: Duration = Duration::from_millis(500);
/// The bounds of one key fetch from Barbican (the refresh interval
/// between them).
const MIN_FETCH_TIMEOUT: Duration = Duration::from_secs(2);
const MAX_FETCH_TIMEOUT: Duration = Duration::from_secs(10);
