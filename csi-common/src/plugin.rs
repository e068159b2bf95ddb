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
