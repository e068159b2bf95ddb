//! Who runs the ceph-fuse daemon that keeps a staged share's FUSE mount
//! alive: the plugin itself, or a mount pod of its own (`--mount-pods`).
//!
//! Beside the plugin, ceph-fuse daemonizes and its PID is recorded. Such a
//! daemon outlives a plugin that runs as a host process, but dies with the
//! plugin's container: its mounts then answer ENOTCONN until the plugin,
//! once back, mounts them again (see `NodeService::repair`). Pods that
//! use them keep the dead mount until their containers restart. In a mount
//! pod, the daemon's lifetime is the pod's, which no restart or upgrade of
//! the plugin touches.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use csi_common::{Context, DriverError, DriverResult};
use host_ops::Mounter;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::mount_pods::MountPods;
use crate::processes::{reap_process, run_bounded};
use crate::stage_record::{StageRecord, StateDir};

#[derive(Debug, Clone)]
pub enum FuseDaemons {
    /// ceph-fuse runs beside the plugin.
    InPlugin,
    /// Each ceph-fuse runs in a mount pod of its own.
    Pods(Arc<MountPods>),
}

/// The daemon of one staged share.
#[derive(Debug, Clone)]
pub enum Daemon {
    Process(Pid),
    Pod { pods: Arc<MountPods>, name: String },
}

/// How long ending a mount pod may take (its grace period and deletion).
const POD_END_PATIENCE: Duration = Duration::from_secs(30);

impl FuseDaemons {
    /// Whether ceph.conf names a PID file: a PID only means something
    /// beside the plugin.
    pub fn pid_files(&self) -> bool {
        matches!(self, FuseDaemons::InPlugin)
    }

    /// Whether a daemon that is gone shows as none in [`Self::of`]
    /// (beside the plugin, its PID says so; a mount pod is only looked
    /// at when its mount misbehaves).
    pub fn knows_when_gone(&self) -> bool {
        matches!(self, FuseDaemons::InPlugin)
    }

    /// The daemon of the share staged at `staging`.
    pub fn of(&self, state: &StateDir, staging: &Path) -> Option<Daemon> {
        match self {
            FuseDaemons::InPlugin => state.fuse_pid(staging).map(Daemon::Process),
            FuseDaemons::Pods(p) => Some(Daemon::Pod {
                pods: p.clone(),
                name: p.name_for(staging),
            }),
        }
    }

    /// Starts ceph-fuse with `args` for the record's staging path and
    /// returns once the mount is live.
    pub async fn start(
        &self,
        state: &StateDir,
        record: &StageRecord,
        mounter: &dyn Mounter,
        args: &[String],
        deadline: Instant,
    ) -> DriverResult<()> {
        match self {
            // ceph-fuse returns once the mount is live and leaves its
            // daemon behind: that daemon is the mount
            FuseDaemons::InPlugin => {
                run_bounded(
                    "ceph-fuse",
                    args,
                    deadline,
                    "mounting with ceph-fuse",
                    Some(&state.dir_for(&record.staging).join("ceph-fuse.out")),
                )
                .await
            }
            FuseDaemons::Pods(pods) => {
                let name = pods
                    .ensure(&record.volume_id, &record.staging, args, deadline)
                    .await?;
                wait_mounted(pods, &name, state, mounter, &record.staging, deadline).await
            }
        }
    }
}

/// Waits until the mount pod's ceph-fuse has mounted `staging` (the
/// mount reaches the plugin through the kubelet directory's propagation),
/// or fails with what ended it.
async fn wait_mounted(
    pods: &MountPods,
    name: &str,
    state: &StateDir,
    mounter: &dyn Mounter,
    staging: &Path,
    deadline: Instant,
) -> DriverResult<()> {
    let mut next_look = Instant::now() + Duration::from_secs(1);
    loop {
        if mounter
            .mounts_at(staging)
            .context("reading mounts")?
            .iter()
            .any(|m| m.fs_type.starts_with("fuse"))
        {
            return Ok(());
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(DriverError::DeadlineExceeded(format!(
                "mount pod {name} has not mounted {} yet; the next call waits for it again",
                staging.display()
            )));
        }
        if now >= next_look {
            next_look = now + Duration::from_secs(1);
            let pod = pods.get(name).await?;
            let ended = pod.as_ref().is_none_or(|p| p.finished());
            let stuck = pod.as_ref().and_then(|p| p.trouble()).filter(|_| !ended);
            if ended || stuck.is_some() {
                let why = pod
                    .as_ref()
                    .and_then(|p| p.trouble())
                    .unwrap_or_else(|| "the pod is gone".to_string());
                let log = log_tail(state, staging);
                // the next call starts a new one
                let _ = pods.end(name, Some(0), deadline).await;
                return Err(DriverError::Internal(format!(
                    "mounting with ceph-fuse in mount pod {name}: {why}{log}"
                )));
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The end of ceph-fuse's log, to say why a mount failed.
fn log_tail(state: &StateDir, staging: &Path) -> String {
    let text =
        std::fs::read_to_string(state.dir_for(staging).join("ceph-client.log")).unwrap_or_default();
    let lines: Vec<&str> = text.lines().rev().take(3).collect();
    if lines.is_empty() {
        return String::new();
    }
    let tail: Vec<&str> = lines.into_iter().rev().collect();
    format!("; ceph-fuse log: {}", tail.join("; "))
}

impl Daemon {
    /// Kills the daemon at once: its mount stops hanging (every waiter
    /// gets ENOTCONN).
    pub async fn kill(&self) {
        match self {
            Daemon::Process(pid) => {
                let _ = kill(*pid, Signal::SIGKILL);
            }
            Daemon::Pod { pods, name } => {
                let deadline = Instant::now() + POD_END_PATIENCE;
                if let Err(e) = pods.end(name, Some(0), deadline).await {
                    tracing::warn!(pod = %name, error = %e, "could not kill the mount pod");
                }
            }
        }
    }

    /// Ends the daemon after its mount is gone: a process exits by itself
    /// (killed if it lingers), a mount pod is deleted and waited for.
    pub async fn end(&self) -> DriverResult<()> {
        match self {
            Daemon::Process(pid) => {
                reap_process(*pid).await;
                Ok(())
            }
            Daemon::Pod { pods, name } => {
                pods.end(name, None, Instant::now() + POD_END_PATIENCE)
                    .await
            }
        }
    }
}
