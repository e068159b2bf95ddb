//! The node's record of each staged share, one root-only directory per
//! staging path (the keyrings live beside it), so that unstage, repair of
//! a dead FUSE mount, and shutdown need nothing from OpenStack. Both the
//! mounts and the daemons that serve them read it; neither owns it.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use csi_common::node_ops::io_ctx;
use csi_common::{DriverError, DriverResult};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};

use crate::processes::alive;

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
    /// A volume backed by a snapshot: the snapshot (its directory below
    /// the staged share) is what every target binds, read-only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backing_snapshot: Option<String>,
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

pub(crate) fn write_private(path: &Path, text: &str) -> DriverResult<()> {
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
