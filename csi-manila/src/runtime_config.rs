//! `--runtime-config-file`: JSON the operator may change while the plugin
//! runs (a ConfigMap), re-read whenever the file changes:
//!
//! ```json
//! {"nfs": {"matchExportLocationAddress": "10.0.0.0/24",
//!          "defaultShareClient": "10.0.0.0/24,10.1.0.0/24"}}
//! ```
//!
//! `matchExportLocationAddress` (upstream's) picks the NFS export location
//! on the node's network; `defaultShareClient` (ours) is who gets access
//! to a share whose StorageClass names no `nfs-shareClient`. A file that
//! does not parse keeps the last good configuration and says why.

use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::SystemTime;

use serde::Deserialize;

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct RuntimeConfig {
    #[serde(default)]
    pub nfs: NfsConfig,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NfsConfig {
    #[serde(default)]
    pub match_export_location_address: Option<String>,
    #[serde(default)]
    pub default_share_client: Option<String>,
}

/// An address or network (`10.0.0.1` is `10.0.0.1/32`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    pub addr: IpAddr,
    pub prefix: u8,
}

impl Cidr {
    pub fn parse(s: &str) -> Result<Self, String> {
        let s = s.trim();
        let (a, p) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr: IpAddr = a
            .parse()
            .map_err(|_| format!("{s:?} is not an IP address or CIDR"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match p {
            None => max,
            Some(p) => p
                .parse::<u8>()
                .ok()
                .filter(|n| *n <= max)
                .ok_or_else(|| format!("{s:?} has an invalid prefix length"))?,
        };
        Ok(Self { addr, prefix })
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip) {
            (IpAddr::V4(n), IpAddr::V4(a)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(n) & mask == u32::from(a) & mask
            }
            (IpAddr::V6(n), IpAddr::V6(a)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(n) & mask == u128::from(a) & mask
            }
            _ => false,
        }
    }
}

#[derive(Debug)]
struct Loaded {
    stamp: Option<(SystemTime, u64)>,
    config: RuntimeConfig,
}

/// The file and what was last read from it.
#[derive(Debug)]
pub struct RuntimeConfigFile {
    path: Option<PathBuf>,
    loaded: Mutex<Loaded>,
}

impl RuntimeConfigFile {
    pub fn new(path: Option<PathBuf>) -> Self {
        Self {
            path,
            loaded: Mutex::new(Loaded {
                stamp: None,
                config: RuntimeConfig::default(),
            }),
        }
    }

    /// The configuration now: the file is read again when its modification
    /// time or size changed since the last read.
    pub fn current(&self) -> RuntimeConfig {
        let Some(path) = &self.path else {
            return RuntimeConfig::default();
        };
        let mut loaded = self.loaded.lock().unwrap_or_else(|p| p.into_inner());
        let stamp = std::fs::metadata(path)
            .ok()
            .map(|m| (m.modified().unwrap_or(SystemTime::UNIX_EPOCH), m.len()));
        if stamp.is_some() && stamp == loaded.stamp {
            return loaded.config.clone();
        }
        loaded.stamp = stamp;
        match std::fs::read_to_string(path)
            .map_err(|e| e.to_string())
            .and_then(|t| {
                let c: RuntimeConfig = serde_json::from_str(&t).map_err(|e| e.to_string())?;
                if let Some(a) = &c.nfs.match_export_location_address {
                    Cidr::parse(a).map_err(|e| format!("nfs.matchExportLocationAddress: {e}"))?;
                }
                if let Some(d) = &c.nfs.default_share_client {
                    crate::parameters::parse_share_clients(d)
                        .map_err(|e| format!("nfs.defaultShareClient: {e}"))?;
                }
                Ok(c)
            }) {
            Ok(c) => {
                if c != loaded.config {
                    tracing::info!(file = %path.display(), "runtime configuration read");
                }
                loaded.config = c;
            }
            Err(e) => {
                tracing::error!(file = %path.display(), error = %e, "runtime configuration not usable; keeping the previous one");
            }
        }
        loaded.config.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidrs_match() {
        let c = Cidr::parse("10.0.0.0/24").unwrap();
        assert!(c.contains("10.0.0.7".parse().unwrap()));
        assert!(!c.contains("10.0.1.7".parse().unwrap()));
        let host = Cidr::parse("10.0.0.1").unwrap();
        assert_eq!(host.prefix, 32);
        assert!(
            Cidr::parse("0.0.0.0/0")
                .unwrap()
                .contains("8.8.8.8".parse().unwrap())
        );
        assert!(
            Cidr::parse("fd00::/8")
                .unwrap()
                .contains("fd12::1".parse().unwrap())
        );
        assert!(Cidr::parse("10.0.0.0/40").is_err());
    }

    #[test]
    fn the_file_is_reread_when_it_changes_and_a_bad_one_keeps_the_last() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("rc.json");
        std::fs::write(
            &p,
            r#"{"nfs":{"matchExportLocationAddress":"10.0.0.0/24"}}"#,
        )
        .unwrap();
        let f = RuntimeConfigFile::new(Some(p.clone()));
        assert_eq!(
            f.current().nfs.match_export_location_address.as_deref(),
            Some("10.0.0.0/24")
        );
        std::fs::write(
            &p,
            r#"{"nfs":{"matchExportLocationAddress":"10.1.0.0/16","defaultShareClient":"10.1.0.0/16"}}"#,
        )
        .unwrap();
        let c = f.current();
        assert_eq!(
            c.nfs.match_export_location_address.as_deref(),
            Some("10.1.0.0/16")
        );
        std::fs::write(&p, "{not json").unwrap();
        assert_eq!(f.current(), c);
    }
}
