//! Files a request's Secret may name (`os-cloudsFile`, `os-certAuthorityPath`,
//! `os-clientCertPath`, `os-clientKeyPath`): read only beneath directories
//! the operator allows, never through a symlink that leaves them.
//!
//! Whoever writes a StorageClass's Secret (often an app team) must not be
//! able to make the plugin read its own cloud.conf, the kubelet's keys or
//! anything else on its disk, nor learn whether such a file exists. So a
//! named file is opened with `openat2(RESOLVE_BENEATH)` from a descriptor
//! of each allowed directory in turn: an absolute symlink or a `..` that
//! leaves the directory fails the lookup. Relative symlinks inside it are
//! followed, because a Kubernetes Secret or ConfigMap volume is made of
//! them (`ca.crt -> ..data/ca.crt`). Every refusal is the same sentence.

use std::io::Read;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{OFlag, OpenHow, ResolveFlag, open, openat2};
use nix::sys::stat::Mode;

/// Directories a Secret's files may be read from unless the operator adds
/// more (`--secret-file-dir`): clouds.yaml's system place, the CA
/// directory upstream's chart mounts, and the plugin user's own
/// `~/.config/openstack`. Not /etc, not the plugin's cloud.conf
/// (`/etc/config`), not the kubelet directory.
pub fn default_dirs() -> Vec<PathBuf> {
    let mut d = vec![
        PathBuf::from("/etc/openstack"),
        PathBuf::from("/etc/cacert"),
    ];
    if let Some(home) = std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        d.push(PathBuf::from(home).join(".config/openstack"));
    }
    d
}

/// A Secret's file is at most this large (a clouds.yaml or a PEM bundle).
pub const MAX_SECRET_FILE_BYTES: u64 = 1 << 20;

fn open_beneath(dir: &Path, rel: &Path) -> Option<OwnedFd> {
    let root = open(
        dir,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .ok()?;
    let how = OpenHow::new()
        .flags(OFlag::O_RDONLY | OFlag::O_CLOEXEC | OFlag::O_NOCTTY | OFlag::O_NONBLOCK)
        .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_MAGICLINKS);
    loop {
        match openat2(&root, rel, how) {
            Err(Errno::EAGAIN) | Err(Errno::EINTR) => continue,
            r => return r.ok(),
        }
    }
}

/// The text of `path` if it is a regular UTF-8 file of at most
/// [`MAX_SECRET_FILE_BYTES`] beneath one of `dirs`; `None` for every
/// other case alike (missing, unreadable, outside, a symlink out, a
/// device, too large), so that the caller's answer cannot tell them apart.
pub fn read(path: &Path, dirs: &[PathBuf]) -> Option<String> {
    if !path.is_absolute() {
        return None;
    }
    for dir in dirs {
        let Ok(rel) = path.strip_prefix(dir) else {
            continue;
        };
        if rel.as_os_str().is_empty() {
            continue;
        }
        let Some(fd) = open_beneath(dir, rel) else {
            continue;
        };
        let mut file = std::fs::File::from(fd);
        let meta = file.metadata().ok()?;
        if !meta.is_file() || meta.len() > MAX_SECRET_FILE_BYTES {
            return None;
        }
        let mut text = String::new();
        file.by_ref()
            .take(MAX_SECRET_FILE_BYTES)
            .read_to_string(&mut text)
            .ok()?;
        return Some(text);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_regular_files_beneath_an_allowed_dir() {
        let t = tempfile::tempdir().unwrap();
        let allowed = t.path().join("allowed");
        let secret = t.path().join("cloud.conf");
        std::fs::create_dir_all(allowed.join("..2026_11_25/")).unwrap();
        std::fs::write(&secret, "[Global]\npassword=admin").unwrap();
        std::fs::write(allowed.join("..2026_11_25/ca.crt"), "PEM").unwrap();
        // a Secret volume's layout: relative links inside the directory
        std::os::unix::fs::symlink("..2026_11_25", allowed.join("..data")).unwrap();
        std::os::unix::fs::symlink("..data/ca.crt", allowed.join("ca.crt")).unwrap();
        std::os::unix::fs::symlink(&secret, allowed.join("absolute")).unwrap();
        std::os::unix::fs::symlink("../cloud.conf", allowed.join("relative-out")).unwrap();
        let dirs = vec![allowed.clone()];
        assert_eq!(read(&allowed.join("ca.crt"), &dirs).as_deref(), Some("PEM"));
        for p in [
            secret.clone(),
            allowed.join("absolute"),
            allowed.join("relative-out"),
            allowed.join("../cloud.conf"),
            allowed.join("missing"),
            allowed.clone(),
            PathBuf::from("relative/ca.crt"),
        ] {
            assert_eq!(read(&p, &dirs), None, "{}", p.display());
        }
        assert_eq!(read(Path::new("/dev/zero"), &[PathBuf::from("/dev")]), None);
    }
}
