//! Command-line flags, compatible with the upstream plugin's
//! (`--socketpath`, `--cloud-config`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use plugin_runtime::{Endpoint, LogArgs};

fn duration(s: &str) -> Result<Duration, String> {
    openstack_client::config::parse_go_duration(s)
}

#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "barbican-kms-plugin",
    version,
    about = "Kubernetes KMS v2 plugin with a key-encryption key in Barbican",
    long_about = "Kubernetes KMS v2 plugin with a key-encryption key in Barbican.\n\n\
        It serves the KMS v2 API (Status, Encrypt, Decrypt) on --socketpath, and /metrics and \
        /healthz with --http-endpoint. Not served: the KMS v1 API (removed from Kubernetes; \
        an EncryptionConfiguration must say apiVersion: v2)."
)]
pub struct Options {
    /// The plugin's Unix socket (a path or unix:///path); created 0600.
    #[arg(long, default_value = "/var/lib/kms/kms.sock")]
    pub socketpath: Endpoint,
    /// cloud.conf: [Global] credentials and [KeyManager] key-id.
    #[arg(long, default_value = "/etc/kubernetes/cloud-config")]
    pub cloud_config: PathBuf,
    /// Barbican secrets of earlier keys, loaded at start so Decrypt of old
    /// data needs no round trip (repeatable).
    #[arg(long = "previous-key-id")]
    pub previous_key_ids: Vec<String>,
    /// The record of the keys the plugin has sealed under (key ids, never
    /// key material), so that Decrypt uses them after a restart; created
    /// 0600. Default: beside the socket, named after it (`kms.sock`:
    /// `kms-keys.json`; `kms-new.sock`: `kms-new-keys.json`), so that two
    /// plugins sharing a directory (a KMS migration) keep a record each.
    #[arg(long)]
    pub key_record: Option<PathBuf>,
    /// How often the current key is fetched again from Barbican.
    #[arg(long, default_value = "5m", value_parser = duration)]
    pub refresh_interval: Duration,
    /// How long the plugin stays healthy on a cached key Barbican has not
    /// confirmed (outage tolerance).
    #[arg(long, default_value = "1h", value_parser = duration)]
    pub max_staleness: Duration,
    /// Serve /metrics and /healthz on this address (`:9899` means every
    /// interface).
    #[arg(long, value_parser = plugin_runtime::parse_listen_address)]
    pub http_endpoint: Option<SocketAddr>,
    #[command(flatten)]
    pub log: LogArgs,
}

impl Options {
    /// Where the key record lives: `--key-record`, else beside the socket,
    /// named after it.
    pub fn key_record_path(&self) -> PathBuf {
        self.key_record.clone().unwrap_or_else(|| {
            let socket = self.socketpath.path();
            let stem = socket
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .map(|n| n.strip_suffix(".sock").map(str::to_string).unwrap_or(n))
                .filter(|n| !n.is_empty())
                .unwrap_or_else(|| "kms".into());
            self.socket_dir().join(format!("{stem}-keys.json"))
        })
    }

    /// The record every plugin of a directory shared before records were
    /// named after their socket (`kms-keys.json`): read once by a plugin
    /// whose own record does not exist yet. None with `--key-record`, or
    /// when it is the plugin's own.
    pub fn legacy_key_record_path(&self) -> Option<PathBuf> {
        let legacy = self.socket_dir().join("kms-keys.json");
        (self.key_record.is_none() && legacy != self.key_record_path()).then_some(legacy)
    }

    fn socket_dir(&self) -> PathBuf {
        self.socketpath
            .path()
            .parent()
            .unwrap_or(std::path::Path::new("/"))
            .to_path_buf()
    }
}
