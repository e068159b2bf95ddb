//! What both plugin binaries' lifecycles share: the flags every CSI
//! driver takes the same way, the configuration they read, and the errors
//! that stop a plugin.

/// Why a plugin stops (or never starts).
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    #[error("{0}")]
    Flags(String),
    #[error("reading --cloud-config: {0}")]
    Config(#[from] openstack_client::config::ConfigError),
    #[error("{0}")]
    Client(#[from] openstack_client::Error),
    #[error("{0}")]
    Driver(#[from] crate::DriverError),
    #[error(transparent)]
    Runtime(#[from] plugin_runtime::RuntimeError),
}

/// The flags both drivers take alike: which services to serve (Go-style
/// booleans, as upstream's manifests write them: `--flag`, `--flag=false`)
/// and where request paths may point.
#[derive(Debug, Clone, clap::Args)]
pub struct ServiceFlags {
    /// Serve the Controller service.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub provide_controller_service: bool,
    /// Serve the Node service.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub provide_node_service: bool,
    /// Node: staging and target paths must lie below one of these
    /// directories (repeatable). Set it to the kubelet's root directory.
    #[arg(long = "path-root", default_values_t = vec!["/var/lib/kubelet".to_string()])]
    pub path_root: Vec<String>,
}

impl ServiceFlags {
    /// A valid driver name, at least one service, request-path roots that
    /// are absolute and free of `..`.
    pub fn check(&self, driver_name: &str) -> Result<(), String> {
        plugin_runtime::csi_identity::validate_driver_name(driver_name)?;
        if !self.provide_controller_service && !self.provide_node_service {
            return Err(
                "at least one of --provide-controller-service and --provide-node-service must be true"
                    .into(),
            );
        }
        for r in &self.path_root {
            if !r.starts_with('/') || r.split('/').any(|c| c == "..") {
                return Err(format!(
                    "--path-root {r:?} must be an absolute path without \"..\""
                ));
            }
        }
        Ok(())
    }

    pub fn path_roots(&self) -> Vec<std::path::PathBuf> {
        self.path_root
            .iter()
            .map(std::path::PathBuf::from)
            .collect()
    }
}

/// The plugin's cloud.conf files (none: an empty configuration), its
/// warnings logged.
pub fn load_cloud_conf(
    paths: &[std::path::PathBuf],
) -> Result<openstack_client::config::CloudConf, PluginError> {
    use openstack_client::config::{CloudConf, ConfigEnv};
    let conf = if paths.is_empty() {
        CloudConf::default()
    } else {
        CloudConf::load(paths, ConfigEnv::from_process())?
    };
    for w in &conf.warnings {
        tracing::warn!(warning = %w, "cloud.conf");
    }
    Ok(conf)
}

/// Credentials rotated without a restart: when the cloud.conf files (or
/// the clouds.yaml they name) change, or on SIGHUP, the controller's
/// sessions get the new credentials; calls under way finish on the old
/// ones. A file that cannot be read or parsed keeps the running sessions
/// and says why (log, `config_reload_failing`). Keystone is asked at once
/// whether it takes the new credentials, and the answer is logged.
pub fn reload_credentials_on_change(
    conf: &openstack_client::config::CloudConf,
    paths: &[std::path::PathBuf],
    sessions: Vec<(String, openstack_client::Session)>,
    registry: &std::sync::Mutex<prometheus_client::registry::Registry>,
) {
    use plugin_runtime::config_watch::ConfigWatch;
    use plugin_runtime::reload::{ReloadMetrics, spawn_reloader};
    let metrics = ReloadMetrics::default();
    metrics.register(&mut registry.lock().unwrap_or_else(|p| p.into_inner()));
    let reload = openstack_client::reload::SessionReload::new(paths.to_vec(), sessions.clone());
    spawn_reloader(ConfigWatch::new(conf.watched_files()), metrics, move |_| {
        let done = reload.reload().map_err(|e| e.to_string())?;
        for w in &done.conf.warnings {
            tracing::warn!(warning = %w, "cloud.conf");
        }
        if done.changed.is_empty() {
            return Ok(None);
        }
        for (name, session) in &sessions {
            if done.changed.contains(name) {
                let (name, session) = (name.clone(), session.clone());
                tokio::spawn(async move {
                    match session.authenticate().await {
                        Ok(()) => {
                            tracing::info!(cloud = %name, "Keystone accepts the new credentials")
                        }
                        Err(e) => {
                            tracing::error!(cloud = %name, error = %e, "Keystone refuses the new credentials; calls will fail until the configuration is fixed")
                        }
                    }
                });
            }
        }
        let names: Vec<String> = done
            .changed
            .iter()
            .map(|n| {
                if n.is_empty() {
                    "[Global]".to_string()
                } else {
                    format!("[Global {n:?}]")
                }
            })
            .collect();
        Ok(Some(format!("new credentials for {}", names.join(", "))))
    });
}

/// Serves `routes` and the Identity service (the driver's name and
/// version, `capabilities`; Probe and `/healthz` from the readiness
/// `parts`) until SIGTERM or SIGINT.
pub async fn serve_with_identity(
    server: plugin_runtime::PluginServer,
    routes: tonic::service::Routes,
    driver_name: &str,
    capabilities: Vec<proto::csi::v1::PluginCapability>,
    parts: Vec<crate::readiness::Readiness>,
) -> Result<(), plugin_runtime::RuntimeError> {
    use crate::readiness::Readiness;
    let identity = plugin_runtime::csi_identity::IdentityService::new(
        driver_name.to_string(),
        env!("CARGO_PKG_VERSION").to_string(),
        capabilities,
        Readiness::probe(parts.clone()),
    );
    server
        .health_check(Readiness::health(parts))
        .serve(
            routes.add_service(proto::csi::v1::identity_server::IdentityServer::new(
                identity,
            )),
            plugin_runtime::shutdown_signal(),
        )
        .await
}
