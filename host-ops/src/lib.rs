//! What a CSI node plugin does to its host: find block devices, probe and
//! format them, mount, bind, unmount, grow filesystems, read usage.
//!
//! Drivers see two capability traits, [`Mounter`] and [`BlockDevices`];
//! [`LinuxMounter`] and [`LinuxBlockDevices`] implement them with the
//! kernel's mount API (no `mount(8)` guessing of filesystem types, no
//! loop-mounting of image files) and the e2fsprogs/xfsprogs tools.

pub mod beneath;
pub mod devices;
pub mod mounter;
pub mod mountinfo;
pub mod paths;

pub use beneath::{Beneath, Removal, fd_path};
pub use devices::{
    BlockDevices, DeviceContent, Filesystem, GuestDisk, LinuxBlockDevices, OfflineGrowth,
};
pub use mounter::{LinuxMounter, MountOptions, Mounter, VolumeUsage, device_path_of, volume_usage};
pub use mountinfo::{MountEntry, mounts_at};
pub use paths::{PathError, validate_host_path};

use std::io;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    #[error("{command} failed (exit {code:?}): {stderr}")]
    Command {
        command: String,
        code: Option<i32>,
        stderr: String,
    },
    #[error("{what} {path}: {errno}")]
    Sys {
        what: &'static str,
        path: PathBuf,
        errno: nix::Error,
    },
    #[error("unsupported filesystem type {0:?} (ext2, ext3, ext4, xfs and btrfs are)")]
    UnsupportedFilesystem(String),
    #[error("{0}")]
    Refused(String),
    /// Asked to remove something that is not a mount point.
    #[error("{0}")]
    NotAMountPoint(String),
}

pub type Result<T> = std::result::Result<T, HostError>;

pub(crate) fn io_err(
    what: &'static str,
    path: impl Into<PathBuf>,
) -> impl FnOnce(io::Error) -> HostError {
    let path = path.into();
    move |source| HostError::Io { what, path, source }
}

/// Runs a tool and returns its stdout; a non-zero exit is an error carrying
/// stderr.
pub(crate) fn run(program: &str, args: &[&str]) -> Result<String> {
    let out = std::process::Command::new(program)
        .args(args)
        .env("LC_ALL", "C")
        .output()
        .map_err(io_err("running", program))?;
    if !out.status.success() {
        return Err(HostError::Command {
            command: format!("{program} {}", args.join(" ")),
            code: out.status.code(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
