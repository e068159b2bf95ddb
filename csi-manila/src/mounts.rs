//! How a share is mounted on the node, natively (no partner plugin):
//!
//! - CephFS through **ceph-fuse**: a ceph.conf naming only the monitors
//!   and a keyring (mode 0600) in the share's state directory, never the
//!   key on a command line (`ps` shows it); the daemon ceph-fuse leaves
//!   behind is the mount, and its PID is recorded;
//! - CephFS through the **kernel**: `mount -t ceph <mons>:<path> -o
//!   name=<id>,secretfile=<file>,fs=<name>`;
//! - **NFS**: `mount -t nfs <server>:<path> -o <mount flags>`.
//!
//! Each staged share has a [`StageRecord`] under the state directory, so
//! that unstage, repair of a dead FUSE mount, and shutdown need nothing
//! from OpenStack. Everything that touches a FUSE mount is bounded: a
//! mount whose cluster is gone hangs every access, unmount included,
//! until its daemon is killed.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use csi_common::node_ops::io_ctx;
use csi_common::{DriverError, DriverResult};
use host_ops::Mounter;
use nix::mount::{MntFlags, umount2};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};

use crate::daemons::{Daemon, FuseDaemons};

/// How long one look at a FUSE mount may take before it counts as hung.
pub const HEALTH_TIMEOUT: Duration = Duration::from_secs(2);
/// How long an unmount may block before the FUSE daemon is killed.
const UNMOUNT_PATIENCE: Duration = Duration::from_secs(2);

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum MountKind {
    CephFuse {
        monitors: String,
        root: String,
        client_id: String,
        fs_name: Option<String>,
        options: Option<String>,
    },
    CephKernel {
        monitors: String,
        root: String,
        client_id: String,
        fs_name: Option<String>,
        options: Option<String>,
    },
    Nfs {
        export: String,
        options: Vec<String>,
    },
}

impl MountKind {
    pub fn is_fuse(&self) -> bool {
        matches!(self, MountKind::CephFuse { .. })
    }
}

/// What a staged share is mounted as.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StageRecord {
    pub volume_id: String,
    pub share_id: String,
    pub staging: PathBuf,
    pub mount: MountKind,
    /// Target paths published from this staging path.
    #[serde(default)]
    pub targets: Vec<PathBuf>,
    /// Those of them published read-only (a repaired bind keeps it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub read_only_targets: Vec<PathBuf>,
}

/// The node's records, one directory per staging path (root only: the
/// keyrings live there).
#[derive(Debug, Clone)]
pub struct StateDir {
    root: PathBuf,
}

fn digest_hex(s: &str) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, s.as_bytes());
    d.as_ref()[..12]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn write_private(path: &Path, text: &str) -> DriverResult<()> {
    let _ = std::fs::remove_file(path);
    let mut f = io_ctx(
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path),
        format!("creating {}", path.display()),
    )?;
    io_ctx(
        f.write_all(text.as_bytes()),
        format!("writing {}", path.display()),
    )
}

impl StateDir {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// Creates the directory, closed to everyone but root.
    pub fn ensure(&self) -> DriverResult<()> {
        let v = self.root.join("volumes");
        io_ctx(
            std::fs::create_dir_all(&v),
            format!("creating {}", v.display()),
        )?;
        for d in [&self.root, &v] {
            io_ctx(
                std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o700)),
                format!("restricting {}", d.display()),
            )?;
        }
        Ok(())
    }

    pub fn dir_for(&self, staging: &Path) -> PathBuf {
        self.root
            .join("volumes")
            .join(digest_hex(&staging.to_string_lossy()))
    }

    pub fn load(&self, staging: &Path) -> Option<StageRecord> {
        let text = std::fs::read_to_string(self.dir_for(staging).join("stage.json")).ok()?;
        serde_json::from_str(&text).ok()
    }

    pub fn save(&self, r: &StageRecord) -> DriverResult<()> {
        let dir = self.dir_for(&r.staging);
        io_ctx(
            std::fs::create_dir_all(&dir),
            format!("creating {}", dir.display()),
        )?;
        io_ctx(
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)),
            format!("restricting {}", dir.display()),
        )?;
        let text = serde_json::to_string_pretty(r)
            .map_err(|e| DriverError::Internal(format!("recording the stage: {e}")))?;
        let tmp = dir.join("stage.json.tmp");
        write_private(&tmp, &text)?;
        io_ctx(
            std::fs::rename(&tmp, dir.join("stage.json")),
            format!("recording the stage in {}", dir.display()),
        )
    }

    /// Forgets a staging path: its record and its keys.
    pub fn remove(&self, staging: &Path) -> DriverResult<()> {
        let dir = self.dir_for(staging);
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => io_ctx(Err(e), format!("removing {}", dir.display())),
        }
    }

    pub fn all(&self) -> Vec<StageRecord> {
        let Ok(entries) = std::fs::read_dir(self.root.join("volumes")) else {
            return Vec::new();
        };
        entries
            .filter_map(Result::ok)
            .filter_map(|e| std::fs::read_to_string(e.path().join("stage.json")).ok())
            .filter_map(|t| serde_json::from_str(&t).ok())
            .collect()
    }

    /// The record a target path was published from.
    pub fn for_target(&self, target: &Path) -> Option<StageRecord> {
        self.all()
            .into_iter()
            .find(|r| r.targets.iter().any(|t| t == target))
    }

    fn pid_file(&self, staging: &Path) -> PathBuf {
        self.dir_for(staging).join("ceph-fuse.pid")
    }

    /// The ceph-fuse daemon of a staging path, if it still runs.
    pub fn fuse_pid(&self, staging: &Path) -> Option<Pid> {
        let pid: i32 = std::fs::read_to_string(self.pid_file(staging))
            .ok()?
            .trim()
            .parse()
            .ok()?;
        let pid = Pid::from_raw(pid);
        alive(pid).then_some(pid)
    }
}

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

/// The longest path a Unix socket can have (sun_path, with its NUL).
const MAX_SOCKET_PATH: usize = 107;

/// Writes what a mount needs beside its record: a ceph.conf (monitors,
/// and where the client's own files go: all in `dir`, as the container's
/// root may be read-only) and the key. `pid_file`: the daemon's PID means
/// something here (it runs beside the plugin, not in a pod).
fn write_ceph_files(
    dir: &Path,
    monitors: &str,
    client_id: &str,
    key: &str,
    pid_file: bool,
) -> DriverResult<()> {
    io_ctx(
        std::fs::create_dir_all(dir),
        format!("creating {}", dir.display()),
    )?;
    io_ctx(
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)),
        format!("restricting {}", dir.display()),
    )?;
    let d = dir.display();
    // the admin socket (`ceph daemon <asok> ...`) only where its path fits
    // a Unix socket; otherwise none (a longer one makes ceph-fuse fail)
    let asok = format!("{d}/asok");
    let asok = if asok.len() <= MAX_SOCKET_PATH {
        asok
    } else {
        String::new()
    };
    let pid = if pid_file {
        format!("pid_file = {d}/ceph-fuse.pid\n")
    } else {
        String::new()
    };
    write_private(
        &dir.join("ceph.conf"),
        &format!(
            "[global]\nmon_host = {monitors}\nrun_dir = {d}\n\n[client]\nlog_file = {d}/ceph-client.log\n\
             admin_socket = {asok}\n{pid}"
        ),
    )?;
    write_private(
        &dir.join("keyring"),
        &format!("[client.{client_id}]\n\tkey = {key}\n"),
    )?;
    write_private(&dir.join("secret"), key)
}

/// The arguments of ceph-fuse for a staged share (its files in `dir`).
fn ceph_fuse_args(dir: &Path, record: &StageRecord) -> Vec<String> {
    let MountKind::CephFuse {
        root,
        client_id,
        fs_name,
        options,
        ..
    } = &record.mount
    else {
        return Vec::new();
    };
    let mut args = vec![
        "--conf".to_string(),
        dir.join("ceph.conf").to_string_lossy().into_owned(),
        "--id".into(),
        client_id.clone(),
        "--keyring".into(),
        dir.join("keyring").to_string_lossy().into_owned(),
        "-r".into(),
        root.clone(),
    ];
    if let Some(fs) = fs_name {
        args.push(format!("--client_fs={fs}"));
    }
    args.push(record.staging.to_string_lossy().into_owned());
    if let Some(o) = options {
        args.push("-o".into());
        args.push(o.clone());
    }
    args
}

/// Mounts a share at the record's staging path; a FUSE mount's daemon is
/// started by `daemons`. `key`: the share's secret, written beside the
/// record (None: mount again with the files written before).
pub async fn mount(
    state: &StateDir,
    daemons: &FuseDaemons,
    mounter: &dyn Mounter,
    record: &StageRecord,
    key: Option<&str>,
    deadline: Instant,
) -> DriverResult<()> {
    let dir = state.dir_for(&record.staging);
    let staging = record.staging.to_string_lossy().into_owned();
    match &record.mount {
        MountKind::CephFuse {
            monitors,
            client_id,
            ..
        } => {
            if let Some(key) = key {
                write_ceph_files(&dir, monitors, client_id, key, daemons.pid_files())?;
            }
            let _ = std::fs::remove_file(dir.join("ceph-fuse.pid"));
            daemons
                .start(
                    state,
                    record,
                    mounter,
                    &ceph_fuse_args(&dir, record),
                    deadline,
                )
                .await
        }
        MountKind::CephKernel {
            monitors,
            root,
            client_id,
            fs_name,
            options,
        } => {
            if let Some(key) = key {
                write_ceph_files(&dir, monitors, client_id, key, false)?;
            }
            let mut opts = vec![
                format!("name={client_id}"),
                format!("secretfile={}", dir.join("secret").display()),
            ];
            if let Some(fs) = fs_name {
                opts.push(format!("fs={fs}"));
            }
            if let Some(o) = options {
                opts.push(o.clone());
            }
            // options first, then `--`: nothing positional is read as
            // an option
            let args = vec![
                "-t".into(),
                "ceph".into(),
                "-o".into(),
                opts.join(","),
                "--".into(),
                format!("{monitors}:{root}"),
                staging,
            ];
            run_bounded("mount", &args, deadline, "mounting CephFS (kernel)", None).await
        }
        MountKind::Nfs { export, options } => {
            let mut args = vec!["-t".into(), "nfs".into()];
            if !options.is_empty() {
                args.push("-o".into());
                args.push(options.join(","));
            }
            args.push("--".into());
            args.push(export.clone());
            args.push(staging);
            run_bounded("mount", &args, deadline, "mounting NFS", None).await
        }
    }
}

/// The state of a mounted share.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Health {
    Answering(host_ops::VolumeUsage),
    /// The filesystem errs (a FUSE daemon gone: ENOTCONN; an evicted
    /// client: ESHUTDOWN, ...).
    Broken(String),
    /// No answer within [`HEALTH_TIMEOUT`].
    Hung,
}

/// Looks at a mount without ever blocking past [`HEALTH_TIMEOUT`] (the
/// thread of a hung look is left to the kernel, which ends it when the
/// FUSE daemon goes).
pub async fn health(path: &Path) -> Health {
    let p = path.to_path_buf();
    let look = tokio::task::spawn_blocking(move || host_ops::volume_usage(&p));
    match tokio::time::timeout(HEALTH_TIMEOUT, look).await {
        Ok(Ok(Ok(u))) => Health::Answering(u),
        Ok(Ok(Err(e))) => Health::Broken(e.to_string()),
        Ok(Err(e)) => Health::Broken(format!("the look at the mount failed: {e}")),
        Err(_) => Health::Hung,
    }
}

/// Unmounts `path` without hanging on a dead FUSE mount: the unmount gets
/// [`UNMOUNT_PATIENCE`]; then the FUSE daemon (if any) is killed, which
/// releases everything waiting on it; failing that the mount is detached
/// lazily. Nothing mounted is success.
pub async fn unmount_bounded(path: &Path, daemon: Option<&Daemon>) -> DriverResult<()> {
    let p = path.to_path_buf();
    let mut attempt = tokio::task::spawn_blocking(move || umount2(&p, MntFlags::UMOUNT_NOFOLLOW));
    let first = tokio::time::timeout(UNMOUNT_PATIENCE, &mut attempt).await;
    let result = match first {
        Ok(joined) => joined.map_err(|e| DriverError::Internal(format!("unmount: {e}")))?,
        Err(_) => {
            tracing::warn!(path = %path.display(), "unmount blocks: the mount does not answer");
            if let Some(d) = daemon {
                d.kill().await;
            }
            match tokio::time::timeout(UNMOUNT_PATIENCE, &mut attempt).await {
                Ok(joined) => joined.map_err(|e| DriverError::Internal(format!("unmount: {e}")))?,
                Err(_) => {
                    let p = path.to_path_buf();
                    tokio::task::spawn_blocking(move || umount2(&p, MntFlags::MNT_DETACH))
                        .await
                        .map_err(|e| DriverError::Internal(format!("unmount: {e}")))?
                }
            }
        }
    };
    match result {
        Ok(()) | Err(nix::Error::EINVAL) | Err(nix::Error::ENOENT) => Ok(()),
        // the daemon is gone (ENOTCONN) or busy: detach, the kernel
        // finishes once the last user lets go
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "unmount failed; detaching lazily");
            umount2(path, MntFlags::MNT_DETACH).or_else(|e| match e {
                nix::Error::EINVAL | nix::Error::ENOENT => Ok(()),
                e => Err(DriverError::Internal(format!(
                    "unmounting {}: {e}",
                    path.display()
                ))),
            })
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_keys_are_private() {
        let dir = tempfile::tempdir().unwrap();
        let s = StateDir::new(dir.path().join("state"));
        s.ensure().unwrap();
        let r = StageRecord {
            volume_id: "v".into(),
            share_id: "s".into(),
            staging: PathBuf::from("/var/lib/kubelet/x/globalmount"),
            mount: MountKind::CephFuse {
                monitors: "127.0.0.1:6789".into(),
                root: "/volumes/_nogroup/s/i".into(),
                client_id: "alice".into(),
                fs_name: Some("cephfs".into()),
                options: None,
            },
            targets: vec![PathBuf::from("/var/lib/kubelet/pods/p/mount")],
            read_only_targets: Vec::new(),
        };
        s.save(&r).unwrap();
        assert_eq!(s.load(&r.staging), Some(r.clone()));
        assert_eq!(s.all(), vec![r.clone()]);
        assert_eq!(s.for_target(&r.targets[0]), Some(r.clone()));
        let d = s.dir_for(&r.staging);
        write_ceph_files(&d, "127.0.0.1:6789", "alice", "c2VjcmV0", true).unwrap();
        for f in ["keyring", "secret", "ceph.conf", "stage.json"] {
            let mode = std::fs::metadata(d.join(f)).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "{f}");
        }
        let conf = std::fs::read_to_string(d.join("ceph.conf")).unwrap();
        assert!(!conf.contains("c2VjcmV0"), "the key is not in ceph.conf");
        s.remove(&r.staging).unwrap();
        assert!(!d.exists());
        assert!(s.load(&r.staging).is_none());
    }
}
