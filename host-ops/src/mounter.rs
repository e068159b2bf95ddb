//! Mounting through the kernel API: the filesystem type is always given
//! (never guessed) and a bind mount that should be read-only is remounted
//! read-only, so it really is.

use std::fmt;
use std::path::{Path, PathBuf};

use nix::mount::{MntFlags, MsFlags, mount, umount2};

use crate::beneath::{Beneath, fd_path};
use crate::mountinfo::{self, MountEntry};
use crate::{HostError, Result};

/// Options of a mount: flags the kernel knows by bit, the rest passed to
/// the filesystem as its data string.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MountOptions {
    pub flags: MsFlagsBits,
    pub data: Vec<String>,
}

/// A plain-data copy of [`MsFlags`] so callers need not depend on nix.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MsFlagsBits(pub u64);

impl MountOptions {
    /// Splits option names (as in `mount -o`) into flags and data. Options
    /// that would change what gets mounted (`bind`, `remount`, `move`, ...)
    /// are refused: a request must not turn a mount into something else.
    pub fn parse(options: &[String]) -> Result<Self> {
        let mut flags = MsFlags::empty();
        let mut data = Vec::new();
        for o in options.iter().flat_map(|o| o.split(',')) {
            let o = o.trim();
            if o.is_empty() || o == "defaults" || o == "rw" {
                continue;
            }
            if o.contains('\0') {
                return Err(HostError::Refused(format!(
                    "mount option {o:?} contains NUL"
                )));
            }
            let f = match o {
                "ro" => MsFlags::MS_RDONLY,
                "nosuid" => MsFlags::MS_NOSUID,
                "nodev" => MsFlags::MS_NODEV,
                "noexec" => MsFlags::MS_NOEXEC,
                "sync" => MsFlags::MS_SYNCHRONOUS,
                "dirsync" => MsFlags::MS_DIRSYNC,
                "noatime" => MsFlags::MS_NOATIME,
                "nodiratime" => MsFlags::MS_NODIRATIME,
                "relatime" => MsFlags::MS_RELATIME,
                "strictatime" => MsFlags::MS_STRICTATIME,
                "lazytime" => MsFlags::MS_LAZYTIME,
                "mand" => MsFlags::MS_MANDLOCK,
                "suid" | "dev" | "exec" | "async" | "atime" | "diratime" | "nomand" => {
                    MsFlags::empty()
                }
                "bind" | "rbind" | "remount" | "move" | "shared" | "rshared" | "slave"
                | "rslave" | "private" | "rprivate" | "unbindable" | "runbindable" | "loop" => {
                    return Err(HostError::Refused(format!(
                        "mount option {o:?} is not allowed in a volume's mount flags"
                    )));
                }
                other => {
                    data.push(other.to_string());
                    continue;
                }
            };
            flags |= f;
        }
        Ok(Self {
            flags: MsFlagsBits(flags.bits()),
            data,
        })
    }

    fn ms_flags(&self) -> MsFlags {
        MsFlags::from_bits_truncate(self.flags.0)
    }

    pub fn read_only(&self) -> bool {
        self.ms_flags().contains(MsFlags::MS_RDONLY)
    }
}

/// Mount operations a node plugin needs.
pub trait Mounter: Send + Sync + fmt::Debug {
    /// Mounts the filesystem on `device` at `target` with its type named.
    /// `target` is reached through its resolved descriptor.
    fn mount_filesystem(
        &self,
        device: &Path,
        target: &Beneath,
        fs_type: &str,
        options: &MountOptions,
    ) -> Result<()>;
    /// Bind-mounts `source` (a directory or a device node) onto `target`;
    /// `read_only` makes the new mount read-only without touching the
    /// source's. `target` is reached through its resolved descriptor.
    fn bind(
        &self,
        source: &Path,
        target: &Beneath,
        read_only: bool,
        options: &MountOptions,
    ) -> Result<()>;
    /// Unmounts `target`; `Ok(false)` if nothing was mounted there.
    fn unmount(&self, target: &Path) -> Result<bool>;
    /// What is mounted at exactly `target` (bottom first).
    fn mounts_at(&self, target: &Path) -> Result<Vec<MountEntry>>;
    /// Every mount below `root`.
    fn mounts_below(&self, root: &Path) -> Result<Vec<MountEntry>>;
}

#[derive(Debug, Clone, Default)]
pub struct LinuxMounter;

/// The descriptor of a mount target that must exist by now.
fn resolved(target: &Beneath) -> Result<std::os::fd::OwnedFd> {
    target.open()?.ok_or_else(|| HostError::Sys {
        what: "resolving",
        path: target.path().to_path_buf(),
        errno: nix::Error::ENOENT,
    })
}

fn sys(what: &'static str, path: &Path) -> impl FnOnce(nix::Error) -> HostError {
    let path = path.to_path_buf();
    move |errno| HostError::Sys { what, path, errno }
}

impl Mounter for LinuxMounter {
    fn mount_filesystem(
        &self,
        device: &Path,
        target: &Beneath,
        fs_type: &str,
        options: &MountOptions,
    ) -> Result<()> {
        let data = options.data.join(",");
        let fd = resolved(target)?;
        mount(
            Some(device),
            &fd_path(&fd),
            Some(fs_type),
            options.ms_flags(),
            (!data.is_empty()).then_some(data.as_str()),
        )
        .map_err(sys("mounting onto", target))
    }

    fn bind(
        &self,
        source: &Path,
        target: &Beneath,
        read_only: bool,
        options: &MountOptions,
    ) -> Result<()> {
        let extra = options.ms_flags() - MsFlags::MS_RDONLY;
        let fd = resolved(target)?;
        mount(
            Some(source),
            &fd_path(&fd),
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(sys("bind-mounting onto", target))?;
        drop(fd);
        if read_only || !extra.is_empty() || options.read_only() {
            let mut flags = MsFlags::MS_BIND | MsFlags::MS_REMOUNT | extra;
            if read_only || options.read_only() {
                flags |= MsFlags::MS_RDONLY;
            }
            // resolved again: the descriptor taken before the bind names
            // the directory beneath it, this one the new mount
            let remounted = resolved(target).and_then(|fd| {
                mount(
                    None::<&str>,
                    &fd_path(&fd),
                    None::<&str>,
                    flags,
                    None::<&str>,
                )
                .map_err(sys("remounting", target))
            });
            if let Err(e) = remounted {
                // never leave a writable mount behind where a read-only one
                // was asked for
                let _ = umount2(target.path(), MntFlags::UMOUNT_NOFOLLOW);
                return Err(e);
            }
        }
        Ok(())
    }

    fn unmount(&self, target: &Path) -> Result<bool> {
        match umount2(target, MntFlags::UMOUNT_NOFOLLOW) {
            Ok(()) => Ok(true),
            Err(nix::Error::EINVAL) | Err(nix::Error::ENOENT) => Ok(false),
            Err(e) => Err(sys("unmounting", target)(e)),
        }
    }

    fn mounts_at(&self, target: &Path) -> Result<Vec<MountEntry>> {
        mountinfo::mounts_at(target)
    }

    fn mounts_below(&self, root: &Path) -> Result<Vec<MountEntry>> {
        mountinfo::mounts_below(root)
    }
}

/// Usage of a mounted filesystem.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VolumeUsage {
    pub total_bytes: u64,
    pub available_bytes: u64,
    pub used_bytes: u64,
    pub total_inodes: u64,
    pub free_inodes: u64,
    pub used_inodes: u64,
}

pub fn volume_usage(path: &Path) -> Result<VolumeUsage> {
    let s = nix::sys::statvfs::statvfs(path).map_err(sys("statvfs of", path))?;
    let frsize = s.fragment_size() as u64;
    let total = s.blocks() as u64 * frsize;
    let free = s.blocks_free() as u64 * frsize;
    let avail = s.blocks_available() as u64 * frsize;
    let files = s.files() as u64;
    let ffree = s.files_free() as u64;
    Ok(VolumeUsage {
        total_bytes: total,
        available_bytes: avail,
        used_bytes: total.saturating_sub(free),
        total_inodes: files,
        free_inodes: ffree,
        used_inodes: files.saturating_sub(ffree),
    })
}

/// The device node for `(major, minor)`: udev's `/dev/block` link, else
/// the kernel's name for it from sysfs (containers often lack
/// `/dev/block`).
pub fn device_path_of(number: (u64, u64)) -> Option<PathBuf> {
    let (major, minor) = number;
    if let Ok(p) = PathBuf::from(format!("/dev/block/{major}:{minor}")).canonicalize() {
        return Some(p);
    }
    let uevent = std::fs::read_to_string(format!("/sys/dev/block/{major}:{minor}/uevent")).ok()?;
    let name = uevent.lines().find_map(|l| l.strip_prefix("DEVNAME="))?;
    let p = Path::new("/dev").join(name);
    p.exists().then_some(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn splits_flags_and_data() {
        let o =
            MountOptions::parse(&opts(&["noatime", "discard,ro", "data=ordered", "rw"])).unwrap();
        assert!(o.read_only());
        assert_eq!(o.data, vec!["discard", "data=ordered"]);
        assert!(MsFlags::from_bits_truncate(o.flags.0).contains(MsFlags::MS_NOATIME));
    }

    #[test]
    fn refuses_options_that_change_the_mount() {
        for bad in ["bind", "remount", "rshared", "loop", "x\0y"] {
            assert!(MountOptions::parse(&opts(&[bad])).is_err(), "{bad}");
        }
    }
}
