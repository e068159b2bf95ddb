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

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use csi_common::node_ops::io_ctx;
use csi_common::{DriverError, DriverResult};
use host_ops::Mounter;
use nix::mount::{MntFlags, umount2};

use crate::daemons::{Daemon, FuseDaemons};
use crate::processes::run_bounded;
use crate::stage_record::{MountKind, StageRecord, StateDir, write_private};

/// How long one look at a FUSE mount may take before it counts as hung.
pub const HEALTH_TIMEOUT: Duration = Duration::from_secs(2);
/// How long an unmount may block before the FUSE daemon is killed.
const UNMOUNT_PATIENCE: Duration = Duration::from_secs(2);

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

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

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
            backing_snapshot: None,
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
