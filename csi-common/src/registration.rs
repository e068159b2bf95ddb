//! Kubelet's registration socket of a driver
//! (`<kubelet>/plugins_registry/<driver>-reg.sock`), as node-driver-registrar
//! makes it and, told to stop, removes it: by path, whoever's socket the
//! path holds by then.
//!
//! That is a problem when another release of the driver took over on the
//! node while this one was still running. Going back from our release to
//! upstream's (a Helm rollback makes upstream's DaemonSet before it
//! deletes ours), upstream's registrar replaces the socket at the path
//! with its own; our registrar, stopped a moment later, removes it, and
//! kubelet drops the driver on the node: no volume mounts there until
//! someone restarts upstream's pod (its registrar has no liveness probe).
//!
//! So when our registrar is about to stop (its preStop asks the plugin's
//! `/pre-stop`), the plugin keeps a hard link to the socket at the path
//! under a name kubelet ignores (a dotfile), waits for the registrar to
//! remove the path, and puts the socket back there if something still
//! serves on it: a registrar that stopped closes its own socket as it
//! exits, so a live one is a successor's. Kubelet sees a new socket and
//! registers the driver again through it. A successor that replaces the
//! socket after it was kept (its registrar starting in the same second as
//! ours stops) is kept in its turn: what goes back is what the path held
//! last.
//!
//! The plugin keeps the socket both when the registrar asks and when the
//! plugin itself is told to stop: kubelet stops a pod's containers side
//! by side, so either may come first.
//!
//! The other direction needs the same from the successor: replacing
//! upstream's release by ours, our registrar may make its socket while
//! upstream's pod is still stopping, and upstream's registrar then removes
//! the path, ours by then; upstream's plugin, which cannot see the
//! registration folder, puts nothing back. So while our plugin runs it
//! guards its own registrar's socket ([`RegistrationSocket::guard`]): a
//! link kept to whatever socket the path holds, put back when the path is
//! removed while that socket still serves, as a handover does. Kubelet
//! registers the driver again within seconds, not at our registrar's next
//! failed liveness probe (28 s measured on Kubernetes 1.35).

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// How often a removed path's last socket is asked whether it still serves.
const PROBE_INTERVAL: Duration = Duration::from_millis(100);
/// How long it must go on serving, the path removed, to be put back.
const STILL_SERVED: Duration = Duration::from_secs(1);

/// What the handover did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handover {
    /// No socket at the path: nothing to keep.
    NoSocket,
    /// Another handover is under way.
    AlreadyKeeping,
    /// The path kept its socket all along (the registrar did not stop).
    Untouched,
    /// The path was removed, and the socket it held served nobody any
    /// more: the registrar's own, gone with it.
    RegistrarGone,
    /// The path was removed while another process still served on it:
    /// its socket was put back.
    PutBack,
    /// The path holds another socket (a new registrar's) that was never
    /// removed until the bound.
    Replaced,
}

#[derive(Debug, Clone)]
pub struct RegistrationSocket {
    path: PathBuf,
    kept: PathBuf,
    /// How long the registrar may take to remove the path once it was told to stop.
    removal_bound: Duration,
    keeping: Arc<AtomicBool>,
    /// The guard's own link (a dotfile), apart from a handover's.
    guarded: PathBuf,
    /// Set when the plugin stops: the guard ends.
    stopping: Arc<AtomicBool>,
}

/// How often the guard looks at the registration path.
const GUARD_INTERVAL: Duration = Duration::from_millis(200);

impl RegistrationSocket {
    pub fn new(kubelet_dir: &Path, driver: &str) -> Self {
        let registry = kubelet_dir.join("plugins_registry");
        Self {
            path: registry.join(format!("{driver}-reg.sock")),
            // kubelet's plugin watcher skips names that begin with a dot
            kept: registry.join(format!(".{driver}-reg.sock.kept")),
            removal_bound: Duration::from_secs(10),
            keeping: Arc::default(),
            guarded: registry.join(format!(".{driver}-reg.sock.guard")),
            stopping: Arc::default(),
        }
    }

    pub fn with_removal_bound(mut self, bound: Duration) -> Self {
        self.removal_bound = bound;
        self
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Called as the registrar is about to be stopped: keeps the socket
    /// the path holds now, and returns the wait that puts it back once
    /// the registrar removed the path, if another process still serves
    /// on it; or why nothing is kept.
    pub fn keep_for_successor(
        &self,
    ) -> Result<impl std::future::Future<Output = Handover> + Send + 'static, Handover> {
        let Some(held) = socket_at(&self.path) else {
            return Err(Handover::NoSocket);
        };
        if self.keeping.swap(true, Ordering::SeqCst) {
            return Err(Handover::AlreadyKeeping);
        }
        if let Err(e) = self.keep(&self.path) {
            tracing::warn!(socket = %self.path.display(), error = %e, "cannot keep the registration socket through the registrar's stop");
            self.keeping.store(false, Ordering::SeqCst);
            return Err(Handover::NoSocket);
        }
        let this = self.clone();
        Ok(async move {
            let outcome = this.put_back_after_removal(held).await;
            let _ = std::fs::remove_file(&this.kept);
            let _ = std::fs::remove_file(this.kept_fresh());
            this.keeping.store(false, Ordering::SeqCst);
            tracing::info!(socket = %this.path.display(), outcome = ?outcome, "registration socket handover");
            outcome
        })
    }

    /// Where a new link is made before it is renamed over the kept one (a
    /// dotfile too: kubelet's watcher skips it).
    fn kept_fresh(&self) -> PathBuf {
        self.kept.with_extension("kept.new")
    }

    /// Links the socket at `from` under the kept name, replacing what was
    /// kept before (a new link renamed over it: never a moment without one).
    fn keep(&self, from: &Path) -> std::io::Result<()> {
        link_replacing(from, &self.kept, &self.kept_fresh())
    }

    /// Watches the path until the bound: a successor's registrar may
    /// replace the socket there before ours removes the path (the two
    /// releases' pods start and stop in the same seconds), so the socket
    /// kept is always the one the path held last. When the path is
    /// emptied and that socket still accepts connections for a while, it
    /// was not the remover's own: it goes back.
    async fn put_back_after_removal(&self, held: (u64, u64)) -> Handover {
        let started = Instant::now();
        let mut latest = held;
        let mut replaced = false;
        let mut removed_since: Option<Instant> = None;
        let mut last_probe: Option<Instant> = None;
        loop {
            match socket_at(&self.path) {
                Some(now) if now == latest => removed_since = None,
                Some(now) => {
                    // a new registrar's socket: kept from now on instead;
                    // gone again before it could be linked, the next look
                    // sees what replaced it
                    if self.keep(&self.path).is_ok() && socket_at(&self.kept) == Some(now) {
                        latest = now;
                        replaced = true;
                    }
                    removed_since = None;
                }
                None => {
                    let since = *removed_since.get_or_insert_with(Instant::now);
                    // node-driver-registrar removes the path, then exits:
                    // its own socket refuses connections a moment later.
                    // One that keeps accepting for a while is served by
                    // another process.
                    if last_probe.is_none_or(|t| t.elapsed() >= PROBE_INTERVAL) {
                        last_probe = Some(Instant::now());
                        if std::os::unix::net::UnixStream::connect(&self.kept).is_err() {
                            return Handover::RegistrarGone;
                        }
                    }
                    if since.elapsed() >= STILL_SERVED {
                        // a new link, never a rename over the path: a
                        // socket made there meanwhile is the newer one
                        match std::fs::hard_link(&self.kept, &self.path) {
                            Ok(()) => return Handover::PutBack,
                            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                            Err(e) => {
                                tracing::warn!(socket = %self.path.display(), error = %e, "cannot put the registration socket back");
                                return Handover::RegistrarGone;
                            }
                        }
                    }
                }
            }
            if started.elapsed() >= self.removal_bound {
                return if replaced {
                    Handover::Replaced
                } else {
                    Handover::Untouched
                };
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Removes a link left by a plugin that died during a handover.
    pub fn remove_stale_keep(&self) {
        if !self.keeping.load(Ordering::SeqCst) {
            let _ = std::fs::remove_file(&self.kept);
            let _ = std::fs::remove_file(self.kept_fresh());
        }
        let _ = std::fs::remove_file(&self.guarded);
        let _ = std::fs::remove_file(self.guarded.with_extension("guard.new"));
    }

    /// Runs while the plugin does (until [`Self::stop_guard`]): keeps a
    /// link to the socket the registration path holds; when the path is
    /// removed and that socket goes on serving for a while (so it was not
    /// the remover's own: a registrar closes its socket as it exits), it
    /// is put back and kubelet registers the driver again. Idle while a
    /// handover runs (then our own registrar is stopping) and where the
    /// plugin cannot see the registration folder.
    pub async fn guard(self) {
        let fresh = self.guarded.with_extension("guard.new");
        let mut removed_since: Option<Instant> = None;
        while !self.stopping.load(Ordering::SeqCst) {
            if self.keeping.load(Ordering::SeqCst) {
                removed_since = None;
            } else {
                match socket_at(&self.path) {
                    Some(now) => {
                        removed_since = None;
                        if socket_at(&self.guarded) != Some(now) {
                            let _ = link_replacing(&self.path, &self.guarded, &fresh);
                        }
                    }
                    None if socket_at(&self.guarded).is_some() => {
                        let since = *removed_since.get_or_insert_with(Instant::now);
                        if std::os::unix::net::UnixStream::connect(&self.guarded).is_err() {
                            // its registrar is gone with it: nothing to guard
                            let _ = std::fs::remove_file(&self.guarded);
                            removed_since = None;
                        } else if since.elapsed() >= STILL_SERVED {
                            match std::fs::hard_link(&self.guarded, &self.path) {
                                Ok(()) => tracing::warn!(
                                    socket = %self.path.display(),
                                    "the registration socket was removed while our registrar still served on it (another release's registrar stopping): put back"
                                ),
                                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                                Err(e) => {
                                    tracing::warn!(socket = %self.path.display(), error = %e, "cannot put the registration socket back")
                                }
                            }
                            removed_since = None;
                        }
                    }
                    None => removed_since = None,
                }
            }
            tokio::time::sleep(GUARD_INTERVAL).await;
        }
        let _ = std::fs::remove_file(&self.guarded);
        let _ = std::fs::remove_file(&fresh);
    }

    /// Ends the guard (the plugin stops: a handover takes over).
    pub fn stop_guard(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        let _ = std::fs::remove_file(&self.guarded);
    }
}

/// Links `from` as `to`, replacing what `to` held: a new link at `fresh`
/// renamed over it, never a moment without one.
fn link_replacing(from: &Path, to: &Path, fresh: &Path) -> std::io::Result<()> {
    let _ = std::fs::remove_file(fresh);
    std::fs::hard_link(from, fresh)?;
    std::fs::rename(fresh, to)
}

/// The socket at `path` (device, inode), if a socket is there.
fn socket_at(path: &Path) -> Option<(u64, u64)> {
    std::fs::symlink_metadata(path)
        .ok()
        .filter(|m| m.file_type().is_socket())
        .map(|m| (m.dev(), m.ino()))
}
