//! What a volume backed by a snapshot publishes: the snapshot's own
//! directory below its staged share. CephFS shows a snapshot of a
//! share's subvolume inside the share as `.snap/_<snapshot id>_<inode of
//! the directory it was taken of>` (Manila's CephFS driver names the
//! Ceph snapshot by Manila's snapshot id), read-only whatever the mount;
//! seen on the real test cloud's Ceph with a read-only cephx rule. A
//! ceph-fuse mount cannot take such a directory as its root (ENOENT), so
//! the share is staged whole and the snapshot bound from it.
//!
//! Everything below the staging path is the share's content, written by
//! whoever holds a writable rule: the directory is looked up and opened
//! beneath the staging path without following a symlink.

use std::path::PathBuf;

use csi_common::{Context, DriverError, DriverResult};
use host_ops::{Beneath, MountOptions, Mounter, fd_path};

/// Whether a `.snap` entry is the snapshot's: `_<id>_<digits>`, or the
/// id alone (a snapshot taken of the staged directory itself).
pub fn names_snapshot(entry: &str, snapshot_id: &str) -> bool {
    if entry == snapshot_id {
        return true;
    }
    entry
        .strip_prefix('_')
        .and_then(|rest| rest.strip_prefix(snapshot_id))
        .and_then(|rest| rest.strip_prefix('_'))
        .is_some_and(|ino| !ino.is_empty() && ino.bytes().all(|b| b.is_ascii_digit()))
}

/// The snapshot's directory below a staged share; FailedPrecondition
/// when the share shows none (or two) of that id.
pub fn find(staging: &Beneath, roots: &[PathBuf], snapshot_id: &str) -> DriverResult<Beneath> {
    let snap = Beneath::of(&staging.path().join(".snap"), roots)
        .map_err(|e| DriverError::FailedPrecondition(format!("{staging}/.snap: {e}")))?;
    let fd = snap
        .open()
        .context(format!("resolving {snap}"))?
        .ok_or_else(|| {
            DriverError::FailedPrecondition(format!(
                "{staging} shows no .snap directory: is it a CephFS share?"
            ))
        })?;
    let entries = std::fs::read_dir(fd_path(&fd))
        .map_err(|e| DriverError::Internal(format!("listing {snap}: {e}")))?;
    let mut found = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| DriverError::Internal(format!("listing {snap}: {e}")))?;
        if let Some(name) = entry.file_name().to_str()
            && names_snapshot(name, snapshot_id)
        {
            found.push(name.to_string());
        }
    }
    match found.as_slice() {
        [name] => Beneath::of(&snap.path().join(name), roots)
            .map_err(|e| DriverError::FailedPrecondition(format!("{snap}/{name}: {e}"))),
        [] => Err(DriverError::FailedPrecondition(format!(
            "snapshot {snapshot_id} is not in {snap}: deleted, or not a snapshot of this share"
        ))),
        more => Err(DriverError::FailedPrecondition(format!(
            "{snap} shows snapshot {snapshot_id} {} times ({})",
            more.len(),
            more.join(", ")
        ))),
    }
}

/// Binds the snapshot's directory at `target`, read-only; a target that
/// already is that bind is success.
pub fn bind(
    mounter: &dyn Mounter,
    staging: &Beneath,
    source: &Beneath,
    target: &Beneath,
) -> DriverResult<()> {
    let staged = mounter.mounts_at(staging).context("reading mounts")?;
    let Some(staged) = staged.last() else {
        return Err(DriverError::FailedPrecondition(format!(
            "volume is not staged at {staging}"
        )));
    };
    let name = source.path().file_name().map(PathBuf::from);
    if let Some(existing) = mounter.mounts_at(target).context("reading mounts")?.last() {
        let same_dir = name.as_ref().is_some_and(|n| existing.root.ends_with(n));
        if existing.device == staged.device && same_dir && existing.read_only() {
            return Ok(());
        }
        return Err(DriverError::AlreadyExists(format!(
            "{target} is already mounted ({} at {}) otherwise than {source}, read-only",
            existing.source,
            existing.root.display()
        )));
    }
    let fd = source
        .open()
        .context(format!("resolving {source}"))?
        .ok_or_else(|| DriverError::FailedPrecondition(format!("{source} is gone")))?;
    target.create_dir().context(format!("creating {target}"))?;
    mounter
        .bind(&fd_path(&fd), target, true, &MountOptions::default())
        .context(format!("binding {source} to {target}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: &str = "5cf75044-d187-4dad-b8a9-b4bb56886124";

    #[test]
    fn only_the_snapshots_own_entry_is_taken() {
        // as the real test cloud's Ceph shows it
        assert!(names_snapshot(&format!("_{S}_1099511628399"), S));
        assert!(names_snapshot(S, S));
        for other in [
            format!("_{S}_"),
            format!("_{S}_12x"),
            format!("_{S}x_1"),
            format!("{S}_1"),
            "_5cf75044-d187-4dad-b8a9-b4bb56886125_1".to_string(),
            format!("_{S}_1/.."),
        ] {
            assert!(!names_snapshot(&other, S), "{other}");
        }
    }
}
