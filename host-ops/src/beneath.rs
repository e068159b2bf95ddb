//! A request path resolved beneath its root, never through a symlink.
//!
//! A path checked as text can still leave the kubelet directory: a
//! directory on the way may be a symlink a pod or a hostPath left there
//! (kubelet's own subPath CVEs, CVE-2017-1002101 and CVE-2021-25741, were
//! this bug). So every step here goes through `openat2(2)` from a
//! descriptor of the root with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`:
//! a symlink anywhere below the root, or a step that would leave it, fails
//! the lookup. Directories and files are created one component at a time
//! from the parent's descriptor, mounts go onto `/proc/self/fd/N` of the
//! resolved descriptor (runc's way), and removal is `unlinkat(2)` in the
//! resolved parent. nix's `openat2` is used rather than the `pathrs`
//! crate: we need five operations, which nix (already a dependency) has.
//!
//! The root itself is the operator's (`--path-root`): it may be a symlink
//! (`/var/lib/kubelet` -> `/data/kubelet`) and is resolved once, so that
//! the path kept here is the one mountinfo shows.

use std::ffi::OsStr;
use std::fmt;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{OFlag, OpenHow, ResolveFlag, open, openat2};
use nix::sys::stat::{Mode, SFlag, fstatat, mkdirat};
use nix::unistd::{UnlinkatFlags, unlinkat};

use crate::{HostError, Result};

/// A path beneath a root: `root` is resolved (canonical), `rel` has only
/// normal components.
#[derive(Clone, PartialEq, Eq)]
pub struct Beneath {
    root: PathBuf,
    rel: PathBuf,
    full: PathBuf,
}

impl fmt::Debug for Beneath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.full, f)
    }
}

impl fmt::Display for Beneath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.full.display(), f)
    }
}

impl std::ops::Deref for Beneath {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.full
    }
}

impl AsRef<Path> for Beneath {
    fn as_ref(&self) -> &Path {
        &self.full
    }
}

/// What removing a mount point did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removal {
    Removed,
    /// Nothing was there.
    Gone,
    /// A directory that still holds something: left in place.
    KeptNotEmpty,
}

/// The path `/proc/self/fd/N` through which a syscall that takes a path
/// reaches exactly the file `fd` was resolved to.
pub fn fd_path(fd: &impl AsRawFd) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

fn resolve_flags() -> ResolveFlag {
    ResolveFlag::RESOLVE_BENEATH
        | ResolveFlag::RESOLVE_NO_SYMLINKS
        | ResolveFlag::RESOLVE_NO_MAGICLINKS
}

fn openat2_beneath(dir: impl AsFd, rel: &Path, flags: OFlag, mode: Mode) -> nix::Result<OwnedFd> {
    // no O_NOFOLLOW: with O_PATH it would hand back a descriptor of a
    // trailing symlink instead of refusing it
    let how = OpenHow::new()
        .flags(flags | OFlag::O_CLOEXEC)
        .mode(mode)
        .resolve(resolve_flags());
    loop {
        // the kernel asks to retry when a rename raced the lookup
        match openat2(dir.as_fd(), rel, how) {
            Err(Errno::EAGAIN) | Err(Errno::EINTR) => continue,
            r => return r,
        }
    }
}

impl Beneath {
    /// `path` (absolute, clean, as [`crate::validate_host_path`] returns
    /// it) under the first of `roots` that holds it, the longest first.
    pub fn of(path: &Path, roots: &[PathBuf]) -> Result<Self> {
        let mut sorted: Vec<&PathBuf> = roots.iter().collect();
        sorted.sort_by_key(|r| std::cmp::Reverse(r.components().count()));
        let (root, rel) = sorted
            .iter()
            .find_map(|r| path.strip_prefix(r).ok().map(|rel| (*r, rel)))
            .ok_or_else(|| {
                HostError::Refused(format!(
                    "{} is outside the allowed roots {roots:?}",
                    path.display()
                ))
            })?;
        if rel.as_os_str().is_empty()
            || !rel.components().all(|c| matches!(c, Component::Normal(_)))
        {
            return Err(HostError::Refused(format!(
                "{} is not a path beneath {}",
                path.display(),
                root.display()
            )));
        }
        let real_root =
            std::fs::canonicalize(root).map_err(crate::io_err("resolving the root", root))?;
        Ok(Self {
            full: real_root.join(rel),
            root: real_root,
            rel: rel.to_path_buf(),
        })
    }

    /// The resolved path (the one mountinfo shows).
    pub fn path(&self) -> &Path {
        &self.full
    }

    fn open_root(&self) -> Result<OwnedFd> {
        open(
            &self.root,
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| HostError::Sys {
            what: "opening the root",
            path: self.root.clone(),
            errno: e,
        })
    }

    fn refused(&self, e: Errno) -> HostError {
        match e {
            Errno::ELOOP | Errno::EXDEV => HostError::Refused(format!(
                "{}: a component below {} is a symlink; request paths are not resolved through symlinks",
                self.full.display(),
                self.root.display()
            )),
            Errno::ENOTDIR => HostError::Refused(format!(
                "{}: a component below {} is not a directory",
                self.full.display(),
                self.root.display()
            )),
            errno => HostError::Sys {
                what: "resolving",
                path: self.full.clone(),
                errno,
            },
        }
    }

    fn open_rel(&self, root: &OwnedFd, rel: &Path, flags: OFlag) -> Result<Option<OwnedFd>> {
        match openat2_beneath(root, rel, flags, Mode::empty()) {
            Ok(fd) => Ok(Some(fd)),
            Err(Errno::ENOENT) => Ok(None),
            Err(e) => Err(self.refused(e)),
        }
    }

    /// An `O_PATH` descriptor of the path; `None` when it does not exist.
    pub fn open(&self) -> Result<Option<OwnedFd>> {
        let root = self.open_root()?;
        self.open_rel(&root, &self.rel, OFlag::O_PATH)
    }

    /// Checks the part of the path that exists: no symlink, nothing that
    /// leaves the root. What does not exist yet is fine (it is created
    /// later through [`Beneath::create_dir`] or [`Beneath::create_file`]).
    pub fn check(&self) -> Result<()> {
        let root = self.open_root()?;
        let mut prefix = PathBuf::new();
        for c in self.rel.components() {
            prefix.push(c);
            if self.open_rel(&root, &prefix, OFlag::O_PATH)?.is_none() {
                return Ok(());
            }
        }
        Ok(())
    }

    /// Creates the missing directories of `rel` one by one from their
    /// parent's descriptor; returns an `O_PATH` descriptor of the last.
    fn create_dirs(&self, root: OwnedFd, rel: &Path) -> Result<OwnedFd> {
        let mut dir = root;
        for c in rel.components() {
            let name = Path::new(c.as_os_str());
            let next = match openat2_beneath(
                &dir,
                name,
                OFlag::O_PATH | OFlag::O_DIRECTORY,
                Mode::empty(),
            ) {
                Ok(fd) => fd,
                Err(Errno::ENOENT) => {
                    match mkdirat(&dir, name, Mode::from_bits_truncate(0o750)) {
                        Ok(()) | Err(Errno::EEXIST) => {}
                        Err(e) => return Err(self.refused(e)),
                    }
                    openat2_beneath(
                        &dir,
                        name,
                        OFlag::O_PATH | OFlag::O_DIRECTORY,
                        Mode::empty(),
                    )
                    .map_err(|e| self.refused(e))?
                }
                Err(e) => return Err(self.refused(e)),
            };
            dir = next;
        }
        Ok(dir)
    }

    /// Creates the directory (and its missing parents) beneath the root;
    /// returns an `O_PATH` descriptor of it.
    pub fn create_dir(&self) -> Result<OwnedFd> {
        let root = self.open_root()?;
        self.create_dirs(root, &self.rel)
    }

    fn parent_and_name(&self) -> (&Path, &OsStr) {
        let name = self.rel.file_name().unwrap_or_default();
        (self.rel.parent().unwrap_or(Path::new("")), name)
    }

    /// Creates the file (empty, if it is missing) and its parent
    /// directories beneath the root; returns an `O_PATH` descriptor.
    pub fn create_file(&self) -> Result<OwnedFd> {
        let root = self.open_root()?;
        let (parent, name) = self.parent_and_name();
        let parent = self.create_dirs(root, parent)?;
        let file = openat2_beneath(
            &parent,
            Path::new(name),
            OFlag::O_CREAT | OFlag::O_WRONLY,
            Mode::from_bits_truncate(0o640),
        )
        .map_err(|e| self.refused(e))?;
        drop(file);
        openat2_beneath(&parent, Path::new(name), OFlag::O_PATH, Mode::empty())
            .map_err(|e| self.refused(e))
    }

    /// Removes a mount point once nothing is mounted there: an empty
    /// directory, or an empty file (a raw block target). A file with
    /// content, a symlink or a device node is not a mount point this
    /// driver made: it is left in place and the answer says why.
    pub fn remove_mount_point(&self) -> Result<Removal> {
        let root = self.open_root()?;
        let (parent, name) = self.parent_and_name();
        let parent = if parent.as_os_str().is_empty() {
            root
        } else {
            match self.open_rel(&root, parent, OFlag::O_PATH | OFlag::O_DIRECTORY)? {
                Some(fd) => fd,
                None => return Ok(Removal::Gone),
            }
        };
        let st = match fstatat(&parent, name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(Errno::ENOENT) => return Ok(Removal::Gone),
            Err(e) => return Err(self.refused(e)),
        };
        let kind = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT;
        let not_ours = |what: String| {
            Err(HostError::NotAMountPoint(format!(
                "{} {what}: it is not a mount point this driver made, so it is left in place",
                self.full.display()
            )))
        };
        if kind == SFlag::S_IFDIR {
            return match unlinkat(&parent, name, UnlinkatFlags::RemoveDir) {
                Ok(()) => Ok(Removal::Removed),
                Err(Errno::ENOTEMPTY) | Err(Errno::EEXIST) => Ok(Removal::KeptNotEmpty),
                Err(Errno::ENOENT) => Ok(Removal::Gone),
                Err(e) => Err(self.refused(e)),
            };
        }
        if kind == SFlag::S_IFREG {
            if st.st_size > 0 {
                return not_ours(format!("is a file holding {} bytes", st.st_size));
            }
            return match unlinkat(&parent, name, UnlinkatFlags::NoRemoveDir) {
                Ok(()) => Ok(Removal::Removed),
                Err(Errno::ENOENT) => Ok(Removal::Gone),
                Err(e) => Err(self.refused(e)),
            };
        }
        if kind == SFlag::S_IFLNK {
            return not_ours("is a symlink".into());
        }
        not_ours("is neither a directory nor a regular file".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup() -> (tempfile::TempDir, Vec<PathBuf>, PathBuf) {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("kubelet");
        std::fs::create_dir_all(root.join("pods")).unwrap();
        std::fs::create_dir_all(t.path().join("outside")).unwrap();
        (t, vec![root.clone()], root)
    }

    #[test]
    fn a_symlink_below_the_root_is_never_followed() {
        let (t, roots, root) = setup();
        std::os::unix::fs::symlink(t.path().join("outside"), root.join("pods/evil")).unwrap();
        let b = Beneath::of(&root.join("pods/evil/mount"), &roots).unwrap();
        assert!(matches!(b.check(), Err(HostError::Refused(_))));
        assert!(matches!(b.create_dir(), Err(HostError::Refused(_))));
        assert!(matches!(b.create_file(), Err(HostError::Refused(_))));
        assert!(!t.path().join("outside/mount").exists());
        // a relative symlink that stays inside is refused too
        std::os::unix::fs::symlink("..", root.join("pods/up")).unwrap();
        let b = Beneath::of(&root.join("pods/up/pods"), &roots).unwrap();
        assert!(matches!(b.check(), Err(HostError::Refused(_))));
    }

    #[test]
    fn creates_and_removes_only_mount_points() {
        let (_t, roots, root) = setup();
        let dir = Beneath::of(&root.join("pods/a/volumes/x/mount"), &roots).unwrap();
        dir.create_dir().unwrap();
        assert!(dir.path().is_dir());
        assert_eq!(dir.remove_mount_point().unwrap(), Removal::Removed);
        assert_eq!(dir.remove_mount_point().unwrap(), Removal::Gone);
        let file = Beneath::of(&root.join("pods/b/dev/x"), &roots).unwrap();
        file.create_file().unwrap();
        assert_eq!(file.remove_mount_point().unwrap(), Removal::Removed);
        let config = root.join("config.yaml");
        std::fs::write(&config, "kind: KubeletConfiguration").unwrap();
        let b = Beneath::of(&config, &roots).unwrap();
        assert!(matches!(
            b.remove_mount_point(),
            Err(HostError::NotAMountPoint(_))
        ));
        assert!(config.exists());
        let full = Beneath::of(&root.join("pods"), &roots).unwrap();
        std::fs::write(root.join("pods/keep"), "x").unwrap();
        assert_eq!(full.remove_mount_point().unwrap(), Removal::KeptNotEmpty);
    }

    #[test]
    fn a_symlinked_root_is_resolved_once() {
        let (t, _roots, root) = setup();
        let link = t.path().join("kubelet-link");
        std::os::unix::fs::symlink(&root, &link).unwrap();
        let b = Beneath::of(&link.join("pods/x"), std::slice::from_ref(&link)).unwrap();
        assert_eq!(
            b.path(),
            std::fs::canonicalize(&root).unwrap().join("pods/x")
        );
        assert!(Beneath::of(&link, std::slice::from_ref(&link)).is_err());
    }
}
