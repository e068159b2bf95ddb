use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, bail};
use clap::Parser;
use kms_barbican::keyring::KeyRing;
use kms_barbican::keystore::{BarbicanKeyStore, KeyStore};
use kms_barbican::options::Options;
use kms_barbican::service::KmsService;
use openstack_client::barbican::KeyManager;
use openstack_client::config::{CloudConf, ConfigEnv};
use openstack_client::{ApiMetrics, Session, SessionOptions};
use plugin_runtime::{KMS_SOCKET_MODE, PluginServer};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use proto::kms::v2::key_management_service_server::KeyManagementServiceServer;

fn key_id_of(path: &Path) -> anyhow::Result<String> {
    let conf = CloudConf::load(&[path.to_path_buf()], ConfigEnv::from_process())?;
    let Some(key_id) = conf.key_manager.key_id else {
        bail!(
            "{}: [KeyManager] key-id (the Barbican secret UUID of the key) is required",
            path.display()
        );
    };
    Ok(key_id)
}

fn mtime(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let opts = Options::parse();
    plugin_runtime::logging::init(&opts.log)?;
    let conf = CloudConf::load(
        std::slice::from_ref(&opts.cloud_config),
        ConfigEnv::from_process(),
    )
    .context("reading --cloud-config")?;
    let key_id = key_id_of(&opts.cloud_config)?;
    let server = PluginServer::new(opts.socketpath.clone())
        .socket_mode(KMS_SOCKET_MODE)
        .http_endpoint(opts.http_endpoint);

    let api_metrics = ApiMetrics::default();
    let key_age = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
    let refresh_failures = Counter::<u64>::default();
    {
        let registry = server.registry();
        let mut r = registry.lock().unwrap_or_else(|p| p.into_inner());
        api_metrics.register(&mut r);
        r.register(
            "kms_key_age_seconds",
            "Seconds since Barbican last confirmed the current key",
            key_age.clone(),
        );
        r.register(
            "kms_key_refresh_failures",
            "Failed fetches of the current key from Barbican",
            refresh_failures.clone(),
        );
    }
    let session = Session::new(
        conf.cloud("").context("[Global]")?,
        SessionOptions {
            metrics: Some(api_metrics),
            ..Default::default()
        },
    )?;
    let store = BarbicanKeyStore::new(KeyManager::new(session), Duration::from_secs(10));
    let ring = Arc::new(KeyRing::new(store, key_id.clone(), opts.max_staleness));

    tokio::spawn(lifecycle(
        ring.clone(),
        opts.clone(),
        key_id,
        key_age,
        refresh_failures,
    ));

    let health_ring = ring.clone();
    let server = server.health_check(Arc::new(move || {
        let problem = health_ring.health().problem;
        Box::pin(async move { problem.map_or(Ok(()), Err) })
    }));
    let routes =
        tonic::service::Routes::new(KeyManagementServiceServer::new(KmsService::new(ring)));
    server
        .serve(routes, plugin_runtime::shutdown_signal())
        .await?;
    Ok(())
}

/// Fetches the key until it works, then refreshes it at the interval;
/// SIGHUP or a changed cloud.conf with another key-id rotates.
async fn lifecycle<S: KeyStore>(
    ring: Arc<KeyRing<S>>,
    opts: Options,
    mut key_id: String,
    key_age: Gauge<f64, std::sync::atomic::AtomicU64>,
    refresh_failures: Counter<u64>,
) {
    let mut hup = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!(error = %e, "cannot watch SIGHUP; reloads follow file changes only");
            None
        }
    };
    let mut loaded = false;
    let mut retry = Duration::from_millis(500);
    let mut next_fetch = Instant::now();
    let mut seen_mtime = mtime(&opts.cloud_config);
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    loop {
        let reload = tokio::select! {
            _ = tick.tick() => {
                let now_mtime = mtime(&opts.cloud_config);
                let changed = now_mtime != seen_mtime;
                seen_mtime = now_mtime;
                changed
            }
            Some(()) = async { match hup.as_mut() { Some(h) => h.recv().await, None => std::future::pending().await } } => {
                tracing::info!("SIGHUP: reloading the configuration");
                true
            }
        };
        if reload {
            match key_id_of(&opts.cloud_config) {
                Ok(new) if new != key_id => match ring.rotate_to(&new).await {
                    Ok(()) => {
                        key_id = new;
                        loaded = true;
                        next_fetch = Instant::now() + opts.refresh_interval;
                    }
                    Err(e) => {
                        tracing::error!(error = %e, secret = %new, "cannot rotate to the new key; keeping the current one")
                    }
                },
                Ok(_) => {}
                Err(e) => {
                    tracing::error!(error = %e, "the new configuration is unusable; keeping the current one")
                }
            }
        }
        if Instant::now() >= next_fetch {
            match ring.refresh().await {
                Ok(()) => {
                    if !loaded {
                        loaded = true;
                        for prev in &opts.previous_key_ids {
                            match ring.load_previous(prev).await {
                                Ok(k) => tracing::info!(key_id = %k, "previous key loaded"),
                                Err(e) => {
                                    tracing::warn!(error = %e, "previous key not loaded; Decrypt will fetch it on demand")
                                }
                            }
                        }
                    }
                    retry = Duration::from_millis(500);
                    next_fetch = Instant::now() + opts.refresh_interval;
                }
                Err(_) => {
                    refresh_failures.inc();
                    // before the first success retry fast, after it keep the
                    // cached key and try again at the normal pace or sooner
                    next_fetch = Instant::now()
                        + if loaded {
                            retry.min(opts.refresh_interval)
                        } else {
                            retry
                        };
                    retry = (retry * 2).min(Duration::from_secs(30));
                }
            }
        }
        key_age.set(ring.key_age().map_or(f64::NAN, |a| a.as_secs_f64()));
    }
}
