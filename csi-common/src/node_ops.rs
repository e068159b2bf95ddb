//! What both node services do to their host beyond their own storage:
//! confine request paths, bind a staged volume to a pod's target path,
//! take mounts down, and label topology.

use std::path::{Path, PathBuf};

use host_ops::{Beneath, MountOptions, Mounter, Removal, fd_path, validate_host_path};
use proto::csi::v1 as csi;

use crate::errors::{Context, DriverError, DriverResult};
use crate::request::{Capability, require};
use proto::csi::v1::volume_capability::access_mode::Mode;

/// Who this node is, from instance metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeIdentity {
    pub instance_id: String,
    pub availability_zone: String,
}

/// Runs host work (mount syscalls, tools, blocking file IO) off the async
/// workers.
pub async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> DriverResult<T> + Send + 'static,
) -> DriverResult<T> {
    tokio::task::spawn_blocking(f).await.map_err(|e| {
        DriverError::Internal(format!("host operation panicked or was cancelled: {e}"))
    })?
}

/// The roots request paths must lie beneath; none configured means the
/// whole host (tests of the plugins' own binaries).
fn roots_or_host(roots: &[PathBuf]) -> Vec<PathBuf> {
    if roots.is_empty() {
        vec![PathBuf::from("/")]
    } else {
        roots.to_vec()
    }
}

/// A request path, checked as text (absolute, no `..`, below a root) and
/// then resolved beneath its root without following a symlink: the part
/// that exists must hold none.
fn beneath(value: &str, roots: &[PathBuf]) -> Result<Beneath, String> {
    let clean = validate_host_path(value, roots).map_err(|e| e.to_string())?;
    let b = Beneath::of(&clean, &roots_or_host(roots)).map_err(|e| e.to_string())?;
    b.check().map_err(|e| e.to_string())?;
    Ok(b)
}

/// A staging or target path from a request: required, absolute, without
/// `..`, below one of `roots` and reached without a symlink; else
/// InvalidArgument (the path names where the caller wants something done,
/// and it may not be done there).
pub fn path_arg(value: &str, what: &str, roots: &[PathBuf]) -> DriverResult<Beneath> {
    require(value, what)?;
    beneath(value, roots).map_err(|e| DriverError::InvalidArgument(format!("{what}: {e}")))
}

/// The `volume_path` of NodeGetVolumeStats and NodeExpandVolume: it names
/// a volume the caller believes is there. A path that cannot be one of
/// ours (relative, outside the roots, with `..`, through a symlink) holds
/// no volume: NotFound, as the CSI spec's tables say, and nothing is
/// looked at outside the roots. Only a missing field is InvalidArgument.
pub fn volume_path_arg(value: &str, roots: &[PathBuf]) -> DriverResult<Beneath> {
    require(value, "volume_path")?;
    beneath(value, roots)
        .map_err(|e| DriverError::NotFound(format!("no volume at volume_path: {e}")))
}

/// A path the plugin recorded earlier (a staging or target path of a
/// volume it staged), resolved again beneath its root: the tree may have
/// changed since.
pub fn recorded_path(path: &Path, roots: &[PathBuf]) -> DriverResult<Beneath> {
    let value = path.to_str().ok_or_else(|| {
        DriverError::Internal(format!("recorded path {} is not UTF-8", path.display()))
    })?;
    beneath(value, roots)
        .map_err(|e| DriverError::FailedPrecondition(format!("recorded path: {e}")))
}

/// A driver's capability check (the shared shape check plus what its
/// storage serves).
pub type ParseCapability = fn(&csi::VolumeCapability) -> DriverResult<Capability>;

fn capability(
    c: Option<&csi::VolumeCapability>,
    parse: ParseCapability,
) -> DriverResult<Capability> {
    c.ok_or_else(|| DriverError::InvalidArgument("volume_capability is required".into()))
        .and_then(parse)
}

/// NodeStageVolume's arguments, checked.
#[derive(Debug, Clone)]
pub struct StageArgs {
    pub volume_id: String,
    pub staging: Beneath,
    pub capability: Capability,
}

impl StageArgs {
    pub fn parse(
        r: &csi::NodeStageVolumeRequest,
        roots: &[PathBuf],
        parse: ParseCapability,
    ) -> DriverResult<Self> {
        Ok(Self {
            volume_id: require(&r.volume_id, "volume_id")?.to_string(),
            staging: path_arg(&r.staging_target_path, "staging_target_path", roots)?,
            capability: capability(r.volume_capability.as_ref(), parse)?,
        })
    }
}

/// NodeUnstageVolume's arguments, checked.
pub fn unstage_args(
    r: &csi::NodeUnstageVolumeRequest,
    roots: &[PathBuf],
) -> DriverResult<(String, Beneath)> {
    Ok((
        require(&r.volume_id, "volume_id")?.to_string(),
        path_arg(&r.staging_target_path, "staging_target_path", roots)?,
    ))
}

/// NodePublishVolume's arguments, checked; inline ephemeral volumes are
/// refused (neither driver serves them).
#[derive(Debug, Clone)]
pub struct PublishArgs {
    pub volume_id: String,
    pub staging: Beneath,
    pub target: Beneath,
    pub capability: Capability,
    /// The request's `readonly`, or a reader-only access mode.
    pub read_only: bool,
}

impl PublishArgs {
    pub fn parse(
        r: &csi::NodePublishVolumeRequest,
        roots: &[PathBuf],
        parse: ParseCapability,
    ) -> DriverResult<Self> {
        // first: kubelet sends an inline volume without a staging path,
        // and its user must read what to use instead, not that a path
        // is missing (the CSIDriver lists Ephemeral, as upstream's does,
        // so that replacing upstream's release in place is not refused)
        if r.volume_context
            .get("csi.storage.k8s.io/ephemeral")
            .map(String::as_str)
            == Some("true")
        {
            return Err(DriverError::InvalidArgument(
                "inline ephemeral CSI volumes are not served by this driver (upstream's refuses them too, \
                 since 1.31): use a generic ephemeral volume, a pod volume `ephemeral: {volumeClaimTemplate: ...}` \
                 naming a StorageClass of this driver, which gets a volume for the pod's life"
                    .into(),
            ));
        }
        let volume_id = require(&r.volume_id, "volume_id")?.to_string();
        let staging = path_arg(&r.staging_target_path, "staging_target_path", roots)?;
        let target = path_arg(&r.target_path, "target_path", roots)?;
        let capability = capability(r.volume_capability.as_ref(), parse)?;
        Ok(Self {
            read_only: r.readonly || capability.read_only_mode(),
            volume_id,
            staging,
            target,
            capability,
        })
    }
}

/// NodeUnpublishVolume's arguments, checked.
pub fn unpublish_args(
    r: &csi::NodeUnpublishVolumeRequest,
    roots: &[PathBuf],
) -> DriverResult<(String, Beneath)> {
    Ok((
        require(&r.volume_id, "volume_id")?.to_string(),
        path_arg(&r.target_path, "target_path", roots)?,
    ))
}

pub fn io_ctx<T>(r: std::io::Result<T>, what: String) -> DriverResult<T> {
    r.map_err(|e| DriverError::Internal(format!("{what}: {e}")))
}

/// SINGLE_NODE_SINGLE_WRITER (ReadWriteOncePod): a volume published so
/// is published at one target path of the node only. `elsewhere` names
/// the other target paths it is published at now; a publish in that mode
/// next to them is FailedPrecondition, and nothing is mounted.
pub fn single_writer_alone(
    id: &str,
    capability: &Capability,
    target: &Path,
    elsewhere: &[PathBuf],
) -> DriverResult<()> {
    if capability.mode != Mode::SingleNodeSingleWriter {
        return Ok(());
    }
    match elsewhere.iter().find(|p| p.as_path() != target) {
        None => Ok(()),
        Some(other) => Err(DriverError::FailedPrecondition(format!(
            "volume {id} is SINGLE_NODE_SINGLE_WRITER and already published at {}: it is not published at {} too",
            other.display(),
            target.display()
        ))),
    }
}

/// The target paths below `roots` where the filesystem staged at
/// `staging` is bound, other than the staging path and `target`.
pub fn binds_of_staged(
    mounter: &dyn Mounter,
    roots: &[PathBuf],
    staging: &Path,
    target: &Path,
) -> DriverResult<Vec<PathBuf>> {
    let staged = mounter.mounts_at(staging).context("reading mounts")?;
    let Some(staged) = staged.last() else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for root in roots {
        for m in mounter.mounts_below(root).context("reading mounts")? {
            if m.device == staged.device
                && m.root == staged.root
                && m.mount_point != staging
                && m.mount_point != target
            {
                out.push(m.mount_point);
            }
        }
    }
    Ok(out)
}

/// The target paths below `roots` where the block device `device` is
/// bound (raw block publications), other than `target`.
pub fn binds_of_device(
    mounter: &dyn Mounter,
    roots: &[PathBuf],
    device: &Path,
    target: &Path,
) -> DriverResult<Vec<PathBuf>> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let rdev = io_ctx(
        std::fs::metadata(device),
        format!("reading {}", device.display()),
    )?
    .rdev();
    let mut out = Vec::new();
    for root in roots {
        for m in mounter.mounts_below(root).context("reading mounts")? {
            if m.mount_point == target {
                continue;
            }
            let same = std::fs::metadata(&m.mount_point)
                .is_ok_and(|md| md.file_type().is_block_device() && md.rdev() == rdev);
            if same {
                out.push(m.mount_point);
            }
        }
    }
    Ok(out)
}

/// Binds the filesystem staged at `staging` onto `target` (a pod's
/// volume directory), read-only as a real read-only mount when asked.
/// A target already bound to the same filesystem with the same
/// read-only-ness is success; anything else mounted there is refused.
/// The bind's source is the staged mount reached through its resolved
/// descriptor, the target is created and mounted beneath its root.
pub fn bind_staged(
    mounter: &dyn Mounter,
    staging: &Beneath,
    target: &Beneath,
    read_only: bool,
    options: &MountOptions,
) -> DriverResult<()> {
    let staged = mounter.mounts_at(staging).context("reading mounts")?;
    let Some(staged) = staged.last() else {
        return Err(DriverError::FailedPrecondition(format!(
            "volume is not staged at {staging}"
        )));
    };
    if let Some(existing) = mounter.mounts_at(target).context("reading mounts")?.last() {
        if existing.device == staged.device && existing.read_only() == read_only {
            return Ok(());
        }
        return Err(DriverError::AlreadyExists(format!(
            "{target} is already mounted ({}, {}) incompatibly with this request",
            existing.source,
            if existing.read_only() { "ro" } else { "rw" }
        )));
    }
    let source = staging
        .open()
        .context(format!("resolving {staging}"))?
        .ok_or_else(|| DriverError::FailedPrecondition(format!("{staging} is gone")))?;
    target.create_dir().context(format!("creating {target}"))?;
    mounter
        .bind(&fd_path(&source), target, read_only, options)
        .context(format!("binding {staging} to {target}"))
}

/// Unmounts everything stacked at `path`, then removes the directory or
/// file the mount point was (it is ours: kubelet expects it gone). A
/// directory that still holds something after the unmount is kept.
pub fn unmount_and_remove(mounter: &dyn Mounter, path: &Beneath) -> DriverResult<()> {
    for _ in 0..16 {
        if mounter
            .mounts_at(path)
            .context("reading mounts")?
            .is_empty()
        {
            break;
        }
        // resolved again before each unmount: umount(2) takes a path
        path.check().context(format!("resolving {path}"))?;
        mounter
            .unmount(path)
            .context(format!("unmounting {path}"))?;
    }
    if !mounter
        .mounts_at(path)
        .context("reading mounts")?
        .is_empty()
    {
        return Err(DriverError::Internal(format!("{path} is still mounted")));
    }
    remove_mount_point(path)
}

/// Removes an unmounted mount point: an empty directory, or an empty file
/// (a raw block target). Gone already is fine; a file with content, a
/// symlink or a device node is never removed (FailedPrecondition says
/// why).
pub fn remove_mount_point(path: &Beneath) -> DriverResult<()> {
    match path
        .remove_mount_point()
        .context(format!("removing {path}"))?
    {
        Removal::Removed | Removal::Gone => Ok(()),
        Removal::KeptNotEmpty => {
            // something the volume did not put there: keep it
            tracing::warn!(path = %path, "mount point not empty after unmount; left in place");
            Ok(())
        }
    }
}

/// NodeGetVolumeStats' answer for a file system that answers: bytes and
/// inodes, and a normal condition saying `how`.
pub fn usage_response(u: &host_ops::VolumeUsage, how: &str) -> csi::NodeGetVolumeStatsResponse {
    use csi::volume_usage::Unit;
    csi::NodeGetVolumeStatsResponse {
        usage: vec![
            csi::VolumeUsage {
                available: u.available_bytes as i64,
                total: u.total_bytes as i64,
                used: u.used_bytes as i64,
                unit: Unit::Bytes as i32,
            },
            csi::VolumeUsage {
                available: u.free_inodes as i64,
                total: u.total_inodes as i64,
                used: u.used_inodes as i64,
                unit: Unit::Inodes as i32,
            },
        ],
        volume_condition: Some(csi::VolumeCondition {
            abnormal: false,
            message: how.to_string(),
        }),
    }
}

/// NodeGetVolumeStats' answer for a volume that does not answer.
pub fn abnormal_response(message: String) -> csi::NodeGetVolumeStatsResponse {
    csi::NodeGetVolumeStatsResponse {
        usage: vec![],
        volume_condition: Some(csi::VolumeCondition {
            abnormal: true,
            message,
        }),
    }
}

/// A topology value as Kubernetes label values allow (upstream's
/// `SanitizeLabel`): other characters become `-`, the ends are
/// alphanumeric, at most 63 characters.
pub fn sanitize_label(s: &str) -> String {
    let replaced: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '-'
            }
        })
        .collect();
    let mut out: String = replaced
        .trim_matches(|c: char| !c.is_ascii_alphanumeric())
        .chars()
        .take(63)
        .collect();
    while out.ends_with(|c: char| !c.is_ascii_alphanumeric()) {
        out.pop();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_sanitised_like_upstream() {
        assert_eq!(sanitize_label("nova"), "nova");
        assert_eq!(sanitize_label("az 1/a"), "az-1-a");
        assert_eq!(sanitize_label("--x--"), "x");
        assert_eq!(sanitize_label(&"a".repeat(80)).len(), 63);
        assert_eq!(
            sanitize_label(&format!("{}-b", "a".repeat(62))),
            "a".repeat(62)
        );
    }

    #[test]
    fn volume_paths_outside_the_roots_hold_no_volume() {
        let roots = vec![PathBuf::from("/var/lib/kubelet")];
        for p in ["some/path", "/etc", "/var/lib/kubelet/../x"] {
            assert!(
                matches!(volume_path_arg(p, &roots), Err(DriverError::NotFound(_))),
                "{p}"
            );
        }
        assert!(matches!(
            volume_path_arg("", &roots),
            Err(DriverError::InvalidArgument(_))
        ));
        assert!(matches!(
            path_arg("some/path", "target_path", &roots),
            Err(DriverError::InvalidArgument(_))
        ));
    }
}
