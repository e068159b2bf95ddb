//! Noticing configuration changes the ways they happen in a cluster: a
//! mounted Secret is a symlink (`cloud.conf -> ..data/cloud.conf`) and
//! kubelet swaps `..data` to a new directory; an operator edits a file in
//! place, or sends SIGHUP. The watcher polls what each path resolves to
//! (device, inode, size, modification time: a swapped symlink or a
//! rewritten file changes at least one) and listens for SIGHUP; each
//! change is reported once, and changes that arrive while the last one is
//! still being handled are folded into one.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use tokio::sync::mpsc;

/// Why a reload is asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reload {
    /// SIGHUP.
    Signal,
    /// These files changed (appeared, disappeared, were rewritten or
    /// swapped).
    Changed(Vec<PathBuf>),
}

impl std::fmt::Display for Reload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Reload::Signal => f.write_str("SIGHUP"),
            Reload::Changed(p) => {
                let names: Vec<String> = p.iter().map(|p| p.display().to_string()).collect();
                write!(f, "{} changed", names.join(", "))
            }
        }
    }
}

/// What a path resolves to now; `None`: it does not exist.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Identity {
    dev: u64,
    ino: u64,
    len: u64,
    modified: Option<SystemTime>,
}

fn identity(path: &Path) -> Option<Identity> {
    use std::os::unix::fs::MetadataExt;
    // metadata follows symlinks: a swapped `..data` is a new inode
    let m = std::fs::metadata(path).ok()?;
    Some(Identity {
        dev: m.dev(),
        ino: m.ino(),
        len: m.len(),
        modified: m.modified().ok(),
    })
}

#[derive(Debug, Clone)]
pub struct ConfigWatch {
    paths: Vec<PathBuf>,
    interval: Duration,
    signal: bool,
}

impl ConfigWatch {
    /// Watches `paths` every second and SIGHUP.
    pub fn new(paths: impl IntoIterator<Item = PathBuf>) -> Self {
        let mut paths: Vec<PathBuf> = paths.into_iter().collect();
        paths.sort();
        paths.dedup();
        Self {
            paths,
            interval: Duration::from_secs(1),
            signal: true,
        }
    }

    pub fn interval(mut self, interval: Duration) -> Self {
        self.interval = interval;
        self
    }

    /// Files only, no SIGHUP (a process with several watchers lets one
    /// of them take the signal).
    pub fn without_signal(mut self) -> Self {
        self.signal = false;
        self
    }

    pub fn paths(&self) -> &[PathBuf] {
        &self.paths
    }

    /// Starts watching in the background; the task ends when the receiver
    /// is dropped.
    pub fn spawn(self) -> mpsc::Receiver<Reload> {
        let (tx, rx) = mpsc::channel(1);
        tokio::spawn(self.run(tx));
        rx
    }

    async fn run(self, tx: mpsc::Sender<Reload>) {
        let mut hup = if self.signal {
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
                Ok(s) => Some(s),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot watch SIGHUP; reloads follow file changes only");
                    None
                }
            }
        } else {
            None
        };
        let mut seen: Vec<Option<Identity>> = self.paths.iter().map(|p| identity(p)).collect();
        let mut tick = tokio::time::interval(self.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let signalled = tokio::select! {
                _ = tick.tick() => false,
                Some(()) = async {
                    match hup.as_mut() {
                        Some(h) => h.recv().await,
                        None => std::future::pending().await,
                    }
                } => true,
                () = tx.closed() => return,
            };
            let now: Vec<Option<Identity>> = self.paths.iter().map(|p| identity(p)).collect();
            let changed: Vec<PathBuf> = self
                .paths
                .iter()
                .zip(seen.iter().zip(now.iter()))
                .filter(|(_, (a, b))| a != b)
                .map(|(p, _)| p.clone())
                .collect();
            seen = now;
            let event = if signalled {
                Reload::Signal
            } else if !changed.is_empty() {
                Reload::Changed(changed)
            } else {
                continue;
            };
            // full: a reload is pending already and will read the newest
            // files
            match tx.try_send(event) {
                Ok(()) | Err(mpsc::error::TrySendError::Full(_)) => {}
                Err(mpsc::error::TrySendError::Closed(_)) => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn next(rx: &mut mpsc::Receiver<Reload>) -> Option<Reload> {
        tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .ok()
            .flatten()
    }

    #[tokio::test]
    async fn edits_and_kubelet_symlink_swaps_are_seen_once() {
        let dir = tempfile::tempdir().unwrap();
        // kubelet's layout: ..data -> ..<timestamp>/, cloud.conf -> ..data/cloud.conf
        let v1 = dir.path().join("..2026_v1");
        std::fs::create_dir(&v1).unwrap();
        std::fs::write(v1.join("cloud.conf"), "one").unwrap();
        std::os::unix::fs::symlink("..2026_v1", dir.path().join("..data")).unwrap();
        let conf = dir.path().join("cloud.conf");
        std::os::unix::fs::symlink("..data/cloud.conf", &conf).unwrap();
        let mut rx = ConfigWatch::new([conf.clone()])
            .interval(Duration::from_millis(20))
            .without_signal()
            .spawn();
        // nothing changes: nothing is reported
        assert!(
            tokio::time::timeout(Duration::from_millis(150), rx.recv())
                .await
                .is_err()
        );
        // the swap: a new directory, then ..data renamed over
        let v2 = dir.path().join("..2026_v2");
        std::fs::create_dir(&v2).unwrap();
        std::fs::write(v2.join("cloud.conf"), "two").unwrap();
        std::os::unix::fs::symlink("..2026_v2", dir.path().join("..data_tmp")).unwrap();
        std::fs::rename(dir.path().join("..data_tmp"), dir.path().join("..data")).unwrap();
        assert_eq!(
            next(&mut rx).await,
            Some(Reload::Changed(vec![conf.clone()]))
        );
        // an edit in place
        std::fs::write(v2.join("cloud.conf"), "three, longer").unwrap();
        assert_eq!(
            next(&mut rx).await,
            Some(Reload::Changed(vec![conf.clone()]))
        );
        // a file that goes away, and comes back
        std::fs::remove_file(dir.path().join("..data")).unwrap();
        assert_eq!(
            next(&mut rx).await,
            Some(Reload::Changed(vec![conf.clone()]))
        );
    }
}
