//! The walk's command line.

use std::path::PathBuf;

/// Shows the three plugins of the suite at work, driven over their sockets
/// the way Kubernetes drives them: a Cinder volume, a Manila share shared by
/// two pods, and KMS v2 envelope encryption under a Barbican key. With no
/// cloud named it runs on the embedded OpenStack emulator; with `--cloud`
/// or `--cloud-config` it is a preflight of a real cloud.
#[derive(Debug, Clone, clap::Parser)]
#[command(name = "suite-walk", version)]
pub struct Options {
    /// Where the plugin binaries are (cinder-csi-plugin, manila-csi-plugin,
    /// barbican-kms-plugin); default: beside this program.
    #[arg(long)]
    pub bin_dir: Option<PathBuf>,
    /// Walk only these parts (volume, share, secrets); default: all.
    #[arg(long = "only", value_parser = ["volume", "share", "secrets"])]
    pub only: Vec<String>,
    /// Keep the plugins' logs here (default: a temporary directory, kept
    /// and named only when a step fails).
    #[arg(long)]
    pub log_dir: Option<PathBuf>,

    /// Preflight a real cloud: the entry of clouds.yaml to use.
    #[arg(long, conflicts_with = "cloud_config")]
    pub cloud: Option<String>,
    /// Preflight a real cloud: a cloud.conf (the plugins' own format).
    #[arg(long)]
    pub cloud_config: Option<PathBuf>,
    /// Preflight: a server to attach the test volume to (else the volume is
    /// created and deleted without an attachment).
    #[arg(long)]
    pub server: Option<String>,
    /// Preflight: the volume type to create with (default: the cloud's).
    #[arg(long)]
    pub volume_type: Option<String>,
    /// Preflight: the share type to create with (default: the cloud's).
    #[arg(long)]
    pub share_type: Option<String>,
    /// Preflight: the share protocol (NFS or CEPHFS).
    #[arg(long, default_value = "NFS")]
    pub share_protocol: String,
    /// Preflight: the Barbican secret the KMS plugin will use (default: the
    /// cloud.conf's `[KeyManager] key-id`; none: a test secret is created,
    /// read and deleted).
    #[arg(long)]
    pub key_id: Option<String>,
    /// Preflight: how long one resource may take to become ready.
    #[arg(long, default_value = "300")]
    pub wait_secs: u64,
}

impl Options {
    pub fn wants(&self, part: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|p| p == part)
    }

    pub fn preflight(&self) -> bool {
        self.cloud.is_some() || self.cloud_config.is_some()
    }
}
