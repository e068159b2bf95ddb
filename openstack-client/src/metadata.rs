//! Instance metadata for the node plugins: from the config drive (a disk
//! labelled `config-2`, iso9660 or vfat) or the metadata service, in the
//! configured order.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use url::Url;

use crate::config::{MetadataOptions, MetadataSource};

const META_DATA_PATH: &str = "openstack/latest/meta_data.json";

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct MetadataDevice {
    #[serde(rename = "type", default)]
    pub device_type: String,
    #[serde(default)]
    pub bus: Option<String>,
    #[serde(default)]
    pub address: Option<String>,
    #[serde(default)]
    pub serial: Option<String>,
    #[serde(default)]
    pub tags: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct InstanceMetadata {
    /// The Nova server UUID: the CSI node id.
    pub uuid: String,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub availability_zone: String,
    #[serde(default)]
    pub project_id: Option<String>,
    #[serde(default)]
    pub devices: Vec<MetadataDevice>,
}

#[derive(Debug, thiserror::Error)]
pub enum MetadataError {
    #[error("no config drive: neither {} nor blkid finds a filesystem labelled {label:?}", by_label.display())]
    ConfigDriveNotFound { label: String, by_label: PathBuf },
    #[error("cannot mount config drive {}: {message}", device.display())]
    Mount { device: PathBuf, message: String },
    #[error("cannot read {}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("metadata service {url}: {message}")]
    Service { url: String, message: String },
    #[error("{origin}: malformed meta_data.json: {message}")]
    Malformed { origin: String, message: String },
    #[error("no instance metadata: {}", .0.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("; "))]
    AllSourcesFailed(Vec<MetadataError>),
}

/// Reads instance metadata the way the upstream plugins do, with every
/// location configurable for tests.
#[derive(Debug, Clone)]
pub struct MetadataReader {
    pub options: MetadataOptions,
    /// Base of the metadata service, default `http://169.254.169.254/`.
    pub service_url: Url,
    pub config_drive_label: String,
    /// Where udev links filesystems by label.
    pub by_label_dir: PathBuf,
    /// Filesystem types tried, in order, when mounting the config drive.
    pub config_drive_fstypes: Vec<String>,
}

impl MetadataReader {
    pub fn new(options: MetadataOptions) -> Self {
        Self {
            options,
            service_url: Url::parse("http://169.254.169.254/")
                .unwrap_or_else(|_| unreachable_url()),
            config_drive_label: "config-2".into(),
            by_label_dir: PathBuf::from("/dev/disk/by-label"),
            config_drive_fstypes: vec!["iso9660".into(), "vfat".into()],
        }
    }

    /// Tries each source of the search order; the first that answers wins.
    pub async fn read(&self) -> Result<InstanceMetadata, MetadataError> {
        let mut errors = Vec::new();
        for source in &self.options.search_order {
            let result = match source {
                MetadataSource::ConfigDrive => {
                    let this = self.clone();
                    tokio::task::spawn_blocking(move || this.read_config_drive())
                        .await
                        .unwrap_or_else(|e| {
                            Err(MetadataError::Mount {
                                device: PathBuf::new(),
                                message: format!("worker failed: {e}"),
                            })
                        })
                }
                MetadataSource::MetadataService => self.read_metadata_service().await,
            };
            match result {
                Ok(m) => return Ok(m),
                Err(e) => {
                    tracing::debug!(source = ?source, error = %e, "instance metadata source failed");
                    errors.push(e);
                }
            }
        }
        Err(MetadataError::AllSourcesFailed(errors))
    }

    pub async fn read_metadata_service(&self) -> Result<InstanceMetadata, MetadataError> {
        let url = self
            .service_url
            .join(META_DATA_PATH)
            .map_err(|e| MetadataError::Service {
                url: self.service_url.to_string(),
                message: e.to_string(),
            })?;
        let err = |message: String| MetadataError::Service {
            url: url.to_string(),
            message,
        };
        let timeout = self
            .options
            .request_timeout
            .unwrap_or(Duration::from_secs(10));
        // the link-local service must never be reached through a proxy
        let tls = crate::session::default_tls().map_err(|e| err(e.to_string()))?;
        let client = reqwest::Client::builder()
            .use_preconfigured_tls(tls)
            .no_proxy()
            .timeout(timeout)
            .build()
            .map_err(|e| err(e.to_string()))?;
        let resp = client
            .get(url.clone())
            .send()
            .await
            .map_err(|e| err(e.to_string()))?;
        if !resp.status().is_success() {
            return Err(err(format!("HTTP {}", resp.status())));
        }
        let body = resp.bytes().await.map_err(|e| err(e.to_string()))?;
        parse(&body, url.as_str())
    }

    /// Finds, mounts read-only (private temporary directory), reads and
    /// unmounts the config drive. Blocking; needs CAP_SYS_ADMIN.
    pub fn read_config_drive(&self) -> Result<InstanceMetadata, MetadataError> {
        let device = self.find_config_drive()?;
        let dir = tempfile::Builder::new()
            .prefix("config-drive-")
            .tempdir()
            .map_err(|source| MetadataError::Io {
                path: std::env::temp_dir(),
                source,
            })?;
        mount_read_only(&device, dir.path(), &self.config_drive_fstypes)?;
        let path = dir.path().join(META_DATA_PATH);
        let read = std::fs::read(&path);
        let unmounted = nix::mount::umount2(dir.path(), nix::mount::MntFlags::empty());
        if let Err(e) = unmounted {
            // leave the directory in place rather than delete through a mount
            tracing::error!(dir = %dir.path().display(), error = %e, "cannot unmount the config drive");
            let _ = dir.keep();
        }
        let bytes = read.map_err(|source| MetadataError::Io {
            path: path.clone(),
            source,
        })?;
        parse(&bytes, &device.display().to_string())
    }

    fn find_config_drive(&self) -> Result<PathBuf, MetadataError> {
        let link = self.by_label_dir.join(&self.config_drive_label);
        if link.exists() {
            return Ok(link);
        }
        let out = std::process::Command::new("blkid")
            .args([
                "-l",
                "-t",
                &format!("LABEL={}", self.config_drive_label),
                "-o",
                "device",
            ])
            .output();
        if let Ok(out) = out
            && out.status.success()
        {
            let dev = String::from_utf8_lossy(&out.stdout).trim().to_string();
            if !dev.is_empty() {
                return Ok(PathBuf::from(dev));
            }
        }
        Err(MetadataError::ConfigDriveNotFound {
            label: self.config_drive_label.clone(),
            by_label: self.by_label_dir.clone(),
        })
    }
}

fn unreachable_url() -> Url {
    // only reached if the constant above stopped parsing
    #[allow(clippy::expect_used)]
    Url::parse("http://127.0.0.1/").expect("static URL")
}

fn mount_read_only(device: &Path, target: &Path, fstypes: &[String]) -> Result<(), MetadataError> {
    use nix::mount::{MsFlags, mount};
    let flags = MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    let mut tried = Vec::new();
    for fstype in fstypes {
        match mount(
            Some(device),
            target,
            Some(fstype.as_str()),
            flags,
            None::<&str>,
        ) {
            Ok(()) => return Ok(()),
            Err(e) => tried.push(format!("{fstype}: {e}")),
        }
    }
    Err(MetadataError::Mount {
        device: device.to_path_buf(),
        message: tried.join(", "),
    })
}

fn parse(bytes: &[u8], origin: &str) -> Result<InstanceMetadata, MetadataError> {
    let md: InstanceMetadata =
        serde_json::from_slice(bytes).map_err(|e| MetadataError::Malformed {
            origin: origin.to_string(),
            message: e.to_string(),
        })?;
    if md.uuid.trim().is_empty() {
        return Err(MetadataError::Malformed {
            origin: origin.to_string(),
            message: "uuid is empty".into(),
        });
    }
    Ok(md)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_devices() {
        let md = parse(
            br#"{"uuid":"u1","name":"n","availability_zone":"az1","devices":[{"type":"disk","bus":"scsi","address":"0:0:0:1","serial":"vol","tags":["x"]}]}"#,
            "t",
        )
        .unwrap();
        assert_eq!(md.devices[0].serial.as_deref(), Some("vol"));
        assert!(parse(br#"{"uuid":""}"#, "t").is_err());
        assert!(
            parse(b"nope", "t")
                .unwrap_err()
                .to_string()
                .contains("malformed")
        );
    }
}
