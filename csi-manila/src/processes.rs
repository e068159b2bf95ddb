//! The node's child processes: commands run within a deadline, and the
//! FUSE daemons they leave behind, checked and reaped.

use std::path::Path;
use std::time::{Duration, Instant};

use csi_common::node_ops::io_ctx;
use csi_common::{DriverError, DriverResult};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// Running and not a zombie.
pub fn alive(pid: Pid) -> bool {
    if kill(pid, None).is_err() {
        return false;
    }
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").map(|(_, rest)| !rest.starts_with('Z')))
        .unwrap_or(false)
}

/// Runs a command until it exits or the deadline passes (then it is
/// killed); non-zero exit is an error carrying its output.
pub(crate) async fn run_bounded(
    program: &str,
    args: &[String],
    deadline: Instant,
    what: &str,
    output: Option<&Path>,
) -> DriverResult<()> {
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args)
        .stdin(std::process::Stdio::null())
        .env("LC_ALL", "C")
        .kill_on_drop(true);
    // a daemonizing child keeps stdout/stderr: point them at a file, not
    // a pipe we would wait on forever
    match output {
        Some(p) => {
            let f = io_ctx(
                std::fs::File::create(p),
                format!("creating {}", p.display()),
            )?;
            let g = io_ctx(f.try_clone(), format!("opening {}", p.display()))?;
            cmd.stdout(f).stderr(g);
        }
        None => {
            cmd.stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped());
        }
    }
    let child = cmd.spawn().map_err(|e| {
        DriverError::FailedPrecondition(format!("{what}: cannot run {program}: {e}"))
    })?;
    let wait = deadline.saturating_duration_since(Instant::now());
    let out = match tokio::time::timeout(wait, child.wait_with_output()).await {
        Ok(Ok(o)) => o,
        Ok(Err(e)) => return Err(DriverError::Internal(format!("{what}: {program}: {e}"))),
        Err(_) => {
            return Err(DriverError::DeadlineExceeded(format!(
                "{what}: {program} did not finish in time; a retry starts over"
            )));
        }
    };
    if out.status.success() {
        return Ok(());
    }
    let mut text = String::from_utf8_lossy(&out.stderr).trim().to_string();
    if text.is_empty() {
        text = String::from_utf8_lossy(&out.stdout).trim().to_string();
    }
    if let Some(p) = output {
        text = std::fs::read_to_string(p)
            .unwrap_or_default()
            .trim()
            .to_string();
    }
    let tail: String = text
        .lines()
        .rev()
        .take(5)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect::<Vec<_>>()
        .join("; ");
    Err(DriverError::Internal(format!(
        "{what}: {program} failed ({}): {tail}",
        out.status
    )))
}

/// Waits a moment for a FUSE daemon process to exit after its unmount,
/// then kills it.
pub async fn reap_process(pid: Pid) {
    let until = Instant::now() + Duration::from_secs(2);
    while alive(pid) && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if alive(pid) {
        tracing::warn!(%pid, "ceph-fuse did not exit after its unmount; killing it");
        let _ = kill(pid, Signal::SIGKILL);
    }
}
