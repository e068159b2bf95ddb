//! The CSI Node service: finds the attached volume's device, formats it
//! only when it holds nothing, mounts, binds, grows and reports usage.
//! Needs no OpenStack credentials: the node's identity comes from instance
//! metadata, read once at start.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use host_ops::{
    Beneath, BlockDevices, DeviceContent, Filesystem, MountOptions, Mounter, OfflineGrowth,
};
use proto::csi::v1 as csi;
use proto::csi::v1::node_service_capability::rpc::Type as NodeRpc;

use csi_common::node_ops::{
    NodeIdentity, PublishArgs, StageArgs, abnormal_response, bind_staged, binds_of_device,
    binds_of_staged, blocking, io_ctx, sanitize_label, single_writer_alone, unmount_and_remove,
    unpublish_args, unstage_args, usage_response, volume_path_arg,
};
use csi_common::request::{is_uuid, require};
use csi_common::{Context, DriverError, DriverResult, KeyedLocks, csi_node_service};

use crate::TOPOLOGY_KEY;
use crate::capabilities::{AccessType, parse_capability};
use crate::controller::RESIZE_REQUIRED_KEY;
use crate::parameters::FS_TYPE_CONTEXT_KEY;

/// Upstream leaves an unset `node-volume-attach-limit` at 0, which tells
/// the scheduler "unlimited", while a KVM guest runs out of PCI slots for
/// virtio disks at about 26 (one of them the root disk).
pub const DEFAULT_ATTACH_LIMIT: i64 = 25;
pub const MAX_ATTACH_LIMIT: i64 = 256;

#[derive(Debug, Clone)]
pub struct NodeOptions {
    pub with_topology: bool,
    pub additional_topology: Vec<(String, String)>,
    pub attach_limit: i64,
    /// Request paths must lie below one of these (the kubelet directory).
    pub path_roots: Vec<PathBuf>,
    /// How long NodeStage looks for a device that is not there yet.
    pub device_wait: Duration,
    pub rescan_on_resize: bool,
}

#[derive(Debug, Clone)]
pub struct NodeService {
    identity: Arc<RwLock<Option<NodeIdentity>>>,
    mounter: Arc<dyn Mounter>,
    devices: Arc<dyn BlockDevices>,
    opts: NodeOptions,
    locks: KeyedLocks,
}

/// The attach limit from `[BlockStorage] node-volume-attach-limit`.
pub fn attach_limit(configured: Option<i64>) -> i64 {
    match configured {
        Some(n) if n > 0 => n.min(MAX_ATTACH_LIMIT),
        _ => DEFAULT_ATTACH_LIMIT,
    }
}

/// What mounting a volume's filesystem needs.
struct StagePlan {
    device: PathBuf,
    staging: Beneath,
    fs_type: String,
    mount_flags: Vec<String>,
    grow: bool,
}

impl NodeService {
    pub fn new(
        identity: Arc<RwLock<Option<NodeIdentity>>>,
        mounter: Arc<dyn Mounter>,
        devices: Arc<dyn BlockDevices>,
        opts: NodeOptions,
    ) -> Self {
        Self {
            identity,
            mounter,
            devices,
            opts,
            locks: KeyedLocks::default(),
        }
    }

    pub fn capabilities() -> Vec<csi::NodeServiceCapability> {
        csi_common::advertise::node(&[
            NodeRpc::StageUnstageVolume,
            NodeRpc::GetVolumeStats,
            NodeRpc::ExpandVolume,
            NodeRpc::VolumeCondition,
            NodeRpc::SingleNodeMultiWriter,
        ])
    }

    /// Waits for the volume's device to appear, rescanning between looks.
    async fn find_device(&self, volume_id: &str, deadline: Instant) -> DriverResult<PathBuf> {
        let until = deadline.min(Instant::now() + self.opts.device_wait);
        let mut delay = Duration::from_millis(50);
        loop {
            let devices = self.devices.clone();
            let id = volume_id.to_string();
            if let Some(d) = blocking(move || Ok(devices.find_volume_device(&id))).await? {
                return Ok(d);
            }
            let now = Instant::now();
            if now >= until {
                return Err(DriverError::NotFound(format!(
                    "no device for volume {volume_id} appeared within {:?}; is it attached to this node?",
                    self.opts
                        .device_wait
                        .min(deadline.saturating_duration_since(now))
                )));
            }
            let devices = self.devices.clone();
            blocking(move || {
                devices.rescan();
                Ok(())
            })
            .await?;
            tokio::time::sleep(delay.min(until - now)).await;
            delay = (delay * 3 / 2).min(Duration::from_secs(1));
        }
    }

    async fn stage(
        &self,
        r: csi::NodeStageVolumeRequest,
        deadline: Instant,
    ) -> DriverResult<csi::NodeStageVolumeResponse> {
        let StageArgs {
            volume_id: id,
            staging,
            capability: cap,
        } = StageArgs::parse(&r, &self.opts.path_roots, parse_capability)?;
        if !is_uuid(&id) {
            return Err(DriverError::NotFound(format!(
                "volume {id} does not exist (volume ids are Cinder UUIDs)"
            )));
        }
        let _guard = self.locks.lock(&id, deadline).await?;
        let device = self.find_device(&id, deadline).await?;
        if cap.access_type == AccessType::Block {
            // a raw block volume is used where it is: publish binds the device
            return Ok(csi::NodeStageVolumeResponse {});
        }
        let plan = StagePlan {
            device,
            staging,
            // the capability's filesystem, else a StorageClass's legacy
            // `fsType` (recorded by CreateVolume)
            fs_type: if cap.fs_type.is_empty() {
                r.volume_context
                    .get(FS_TYPE_CONTEXT_KEY)
                    .cloned()
                    .unwrap_or_default()
            } else {
                cap.fs_type.clone()
            },
            mount_flags: cap.mount_flags.clone(),
            grow: r
                .volume_context
                .get(RESIZE_REQUIRED_KEY)
                .map(String::as_str)
                == Some("true"),
        };
        let mounter = self.mounter.clone();
        let devices = self.devices.clone();
        blocking(move || stage_filesystem(&*mounter, &*devices, &id, plan)).await?;
        Ok(csi::NodeStageVolumeResponse {})
    }

    async fn unstage(
        &self,
        r: csi::NodeUnstageVolumeRequest,
        deadline: Instant,
    ) -> DriverResult<csi::NodeUnstageVolumeResponse> {
        let (id, staging) = unstage_args(&r, &self.opts.path_roots)?;
        let _guard = self.locks.lock(&id, deadline).await?;
        let mounter = self.mounter.clone();
        blocking(move || unmount_and_remove(&*mounter, &staging)).await?;
        Ok(csi::NodeUnstageVolumeResponse {})
    }

    async fn publish(
        &self,
        r: csi::NodePublishVolumeRequest,
        deadline: Instant,
    ) -> DriverResult<csi::NodePublishVolumeResponse> {
        let PublishArgs {
            volume_id: id,
            staging,
            target,
            capability: cap,
            read_only,
        } = PublishArgs::parse(&r, &self.opts.path_roots, parse_capability)?;
        if !is_uuid(&id) {
            return Err(DriverError::NotFound(format!(
                "volume {id} does not exist (volume ids are Cinder UUIDs)"
            )));
        }
        let options = MountOptions::parse(&cap.mount_flags)
            .map_err(|e| DriverError::InvalidArgument(e.to_string()))?;
        // per volume: two publishes of one single-writer volume must see
        // each other
        let _guard = self.locks.lock(&id, deadline).await?;
        let mounter = self.mounter.clone();
        let devices = self.devices.clone();
        let roots = self.opts.path_roots.clone();
        if cap.access_type == AccessType::Block {
            let device = self.find_device(&id, deadline).await?;
            blocking(move || {
                let elsewhere = binds_of_device(&*mounter, &roots, &device, &target)?;
                single_writer_alone(&id, &cap, &target, &elsewhere)?;
                publish_block(&*mounter, &*devices, &device, &target, read_only)
            })
            .await?;
        } else {
            blocking(move || {
                let elsewhere = binds_of_staged(&*mounter, &roots, &staging, &target)?;
                single_writer_alone(&id, &cap, &target, &elsewhere)?;
                bind_staged(&*mounter, &staging, &target, read_only, &options)
            })
            .await?;
        }
        Ok(csi::NodePublishVolumeResponse {})
    }

    async fn unpublish(
        &self,
        r: csi::NodeUnpublishVolumeRequest,
        deadline: Instant,
    ) -> DriverResult<csi::NodeUnpublishVolumeResponse> {
        let (id, target) = unpublish_args(&r, &self.opts.path_roots)?;
        let _guard = self.locks.lock(&id, deadline).await?;
        let mounter = self.mounter.clone();
        blocking(move || unmount_and_remove(&*mounter, &target)).await?;
        Ok(csi::NodeUnpublishVolumeResponse {})
    }

    async fn stats(
        &self,
        r: csi::NodeGetVolumeStatsRequest,
        _deadline: Instant,
    ) -> DriverResult<csi::NodeGetVolumeStatsResponse> {
        require(&r.volume_id, "volume_id")?;
        let path = volume_path_arg(&r.volume_path, &self.opts.path_roots)?;
        let mounter = self.mounter.clone();
        let devices = self.devices.clone();
        blocking(move || volume_stats(&*mounter, &*devices, &path)).await
    }

    async fn expand(
        &self,
        r: csi::NodeExpandVolumeRequest,
        deadline: Instant,
    ) -> DriverResult<csi::NodeExpandVolumeResponse> {
        let id = require(&r.volume_id, "volume_id")?.to_string();
        let path = volume_path_arg(&r.volume_path, &self.opts.path_roots)?;
        if let Some(c) = &r.volume_capability {
            parse_capability(c)?;
        }
        let required = r
            .capacity_range
            .as_ref()
            .map(|c| c.required_bytes)
            .unwrap_or(0);
        if required < 0 {
            return Err(DriverError::InvalidArgument(
                "required_bytes must not be negative".into(),
            ));
        }
        let _guard = self.locks.lock(&id, deadline).await?;
        let mounter = self.mounter.clone();
        let devices = self.devices.clone();
        let rescan = self.opts.rescan_on_resize;
        let (device, fs) = blocking(move || {
            expansion_target(&*mounter, &*devices, &path).map(|(d, fs)| (d, fs, path))
        })
        .await
        .map(|(d, fs, path)| (d, fs.map(|f| (f, path))))?;
        // the hypervisor may tell the guest about the new size a moment
        // after Cinder reports it: look again until the deadline
        let mut delay = Duration::from_millis(50);
        let size = loop {
            let devices = self.devices.clone();
            let d = device.clone();
            let size = blocking(move || {
                if rescan {
                    devices
                        .rescan_device(&d)
                        .context(format!("rescanning {}", d.display()))?;
                }
                devices
                    .size_bytes(&d)
                    .context(format!("sizing {}", d.display()))
            })
            .await?;
            if size as i64 >= required {
                break size;
            }
            if Instant::now() >= deadline {
                return Err(DriverError::DeadlineExceeded(format!(
                    "device {} of volume {id} is {size} bytes, not yet the requested {required}",
                    device.display()
                )));
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 3 / 2).min(Duration::from_secs(1));
        };
        if let Some((fs, mount_point)) = fs {
            let devices = self.devices.clone();
            let d = device.clone();
            blocking(move || {
                devices
                    .grow_filesystem(&d, &mount_point, fs)
                    .context(format!("growing the {fs} filesystem on {}", d.display()))
            })
            .await?;
            tracing::info!(volume_id = %id, bytes = size, "filesystem grown");
        }
        Ok(csi::NodeExpandVolumeResponse {
            capacity_bytes: size as i64,
        })
    }

    async fn node_info(&self) -> DriverResult<csi::NodeGetInfoResponse> {
        let identity = self
            .identity
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .ok_or_else(|| {
                DriverError::Unavailable("instance metadata has not been read yet".into())
            })?;
        let accessible_topology = self.opts.with_topology.then(|| {
            let mut segments = HashMap::from([(
                TOPOLOGY_KEY.to_string(),
                sanitize_label(&identity.availability_zone),
            )]);
            for (k, v) in &self.opts.additional_topology {
                segments.insert(k.clone(), v.clone());
            }
            csi::Topology { segments }
        });
        let (mounter, devices) = (self.mounter.clone(), self.devices.clone());
        let roots = self.opts.path_roots.clone();
        let unmanaged = blocking(move || unmanaged_disks(&*mounter, &*devices, &roots)).await?;
        // what the server can still take for Kubernetes; never 0, which
        // would tell Kubernetes there is no limit
        let max_volumes_per_node = (self.opts.attach_limit - unmanaged as i64).max(1);
        Ok(csi::NodeGetInfoResponse {
            node_id: identity.instance_id,
            max_volumes_per_node,
            accessible_topology,
        })
    }
}

/// The disks of this server that Kubernetes does not manage: its own
/// (root, ephemeral, swap, config drive), and the volumes attached that
/// no staging path or raw block publish below the path roots uses
/// (attached by hand; or, for the moment between attach and stage, one of
/// Kubernetes' own: a count that errs on the safe side).
fn unmanaged_disks(
    mounter: &dyn Mounter,
    devices: &dyn BlockDevices,
    roots: &[PathBuf],
) -> DriverResult<usize> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let disks = devices
        .guest_disks()
        .context("listing the server's disks")?;
    let mut used = std::collections::HashSet::new();
    for root in roots {
        for m in mounter.mounts_below(root).context("reading mounts")? {
            if let Some(n) = m.block_device() {
                used.insert(n);
            }
            if let Ok(md) = std::fs::metadata(&m.mount_point)
                && md.file_type().is_block_device()
            {
                used.insert((
                    nix::sys::stat::major(md.rdev()),
                    nix::sys::stat::minor(md.rdev()),
                ));
            }
        }
    }
    Ok(disks
        .iter()
        .filter(|d| !d.volume || !used.contains(&d.number))
        .count())
}

fn stage_filesystem(
    mounter: &dyn Mounter,
    devices: &dyn BlockDevices,
    id: &str,
    plan: StagePlan,
) -> DriverResult<()> {
    let StagePlan {
        device,
        staging,
        fs_type,
        mount_flags,
        grow,
    } = plan;
    let mounts = mounter.mounts_at(&staging).context("reading mounts")?;
    if let Some(top) = mounts.last() {
        let number = devices
            .device_number(&device)
            .context(format!("device {}", device.display()))?;
        if top.block_device() == Some(number) {
            tracing::info!(volume_id = id, "already staged");
            return Ok(());
        }
        return Err(DriverError::FailedPrecondition(format!(
            "{} already has {} ({}) mounted, not volume {id}'s device {}",
            staging.display(),
            top.source,
            top.fs_type,
            device.display()
        )));
    }
    staging
        .create_dir()
        .context(format!("creating {staging}"))?;
    let content = devices
        .probe(&device)
        .context(format!("probing {}", device.display()))?;
    let fs = match content {
        DeviceContent::Empty => {
            let fs = if fs_type.is_empty() {
                Filesystem::Ext4
            } else {
                Filesystem::parse(&fs_type).context("fs_type")?
            };
            tracing::info!(volume_id = id, device = %device.display(), %fs, "device holds nothing: formatting");
            devices
                .format(&device, fs)
                .context(format!("formatting {} as {fs}", device.display()))?;
            fs
        }
        DeviceContent::Filesystem(found) => {
            let existing = Filesystem::parse(&found).map_err(|_| {
                DriverError::FailedPrecondition(format!(
                    "device {} of volume {id} holds {found:?}, which this driver does not mount; it is left untouched",
                    device.display()
                ))
            })?;
            if !fs_type.is_empty() {
                let wanted = Filesystem::parse(&fs_type).context("fs_type")?;
                let family = |f: Filesystem| match f {
                    Filesystem::Xfs => "xfs",
                    Filesystem::Btrfs => "btrfs",
                    _ => "ext",
                };
                if family(wanted) != family(existing) {
                    return Err(DriverError::FailedPrecondition(format!(
                        "volume {id} already holds an {existing} filesystem but {wanted} was requested; refusing to reformat it"
                    )));
                }
            }
            existing
        }
        DeviceContent::PartitionTable(t) => {
            return Err(DriverError::FailedPrecondition(format!(
                "device {} of volume {id} holds a {t} partition table; it is neither formatted nor mounted",
                device.display()
            )));
        }
    };
    // ext grows before it is mounted: online it needs CAP_SYS_RESOURCE,
    // which many nodes drop (xfs and btrfs grow only mounted, below)
    let mut grow_mounted = grow;
    if grow {
        let growth = devices.grow_unmounted(&device, fs).context(format!(
            "growing the {fs} filesystem of volume {id} to its new size"
        ))?;
        grow_mounted = growth == OfflineGrowth::OnlyMounted;
        match growth {
            OfflineGrowth::Grown => tracing::info!(
                volume_id = id,
                "filesystem grown to the volume's size before mounting"
            ),
            OfflineGrowth::AlreadyFull => tracing::info!(
                volume_id = id,
                "filesystem fills the volume already: not checked, not grown"
            ),
            OfflineGrowth::OnlyMounted => {}
        }
    }
    let mut flags = mount_flags;
    if fs == Filesystem::Xfs {
        // clones and restores carry their source's UUID: let them mount
        // beside it
        flags.push("nouuid".into());
    }
    let options = MountOptions::parse(&flags).context("mount flags")?;
    mounter
        .mount_filesystem(&device, &staging, fs.as_str(), &options)
        .context(format!(
            "mounting {} ({fs}) at {}",
            device.display(),
            staging.display()
        ))?;
    if grow_mounted {
        if let Err(e) = devices.grow_filesystem(&device, &staging, fs) {
            let _ = mounter.unmount(&staging);
            return Err(e).context(format!(
                "growing the {fs} filesystem of volume {id} to its new size"
            ));
        }
        tracing::info!(volume_id = id, "filesystem grown to the volume's size");
    }
    tracing::info!(volume_id = id, device = %device.display(), staging = %staging.display(), %fs, "staged");
    Ok(())
}

fn publish_block(
    mounter: &dyn Mounter,
    devices: &dyn BlockDevices,
    device: &Path,
    target: &Beneath,
    read_only: bool,
) -> DriverResult<()> {
    if !mounter
        .mounts_at(target)
        .context("reading mounts")?
        .is_empty()
    {
        let want = devices
            .device_number(device)
            .context(format!("device {}", device.display()))?;
        let have = devices.device_number(target).ok();
        if have == Some(want) {
            return Ok(());
        }
        return Err(DriverError::AlreadyExists(format!(
            "{} already has another device bound to it",
            target.display()
        )));
    }
    // an empty file the device is bound onto, made beneath the root
    target.create_file().context(format!("creating {target}"))?;
    mounter
        .bind(device, target, read_only, &MountOptions::default())
        .context(format!(
            "binding {} to {}",
            device.display(),
            target.display()
        ))
}

fn is_block_device(path: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::metadata(path)
        .map(|m| m.file_type().is_block_device())
        .unwrap_or(false)
}

fn volume_stats(
    mounter: &dyn Mounter,
    devices: &dyn BlockDevices,
    path: &Path,
) -> DriverResult<csi::NodeGetVolumeStatsResponse> {
    if !path.exists() {
        return Err(DriverError::NotFound(format!(
            "{} does not exist",
            path.display()
        )));
    }
    if mounter
        .mounts_at(path)
        .context("reading mounts")?
        .is_empty()
    {
        return Err(DriverError::NotFound(format!(
            "no volume is mounted at {}",
            path.display()
        )));
    }
    use csi::volume_usage::Unit;
    if is_block_device(path) {
        return Ok(match devices.size_bytes(path) {
            Ok(size) => csi::NodeGetVolumeStatsResponse {
                usage: vec![csi::VolumeUsage {
                    available: 0,
                    total: size as i64,
                    used: 0,
                    unit: Unit::Bytes as i32,
                }],
                volume_condition: Some(csi::VolumeCondition {
                    abnormal: false,
                    message: "block device readable".into(),
                }),
            },
            Err(e) => abnormal_response(format!("block device unreadable: {e}")),
        });
    }
    Ok(match host_ops::volume_usage(path) {
        Ok(u) => usage_response(&u, "filesystem mounted and answering"),
        Err(e) => abnormal_response(format!("filesystem does not answer: {e}")),
    })
}

/// The device behind a published or staged path, and its filesystem when
/// it is mounted as one (`None` for a raw block volume).
fn expansion_target(
    mounter: &dyn Mounter,
    _devices: &dyn BlockDevices,
    path: &Path,
) -> DriverResult<(PathBuf, Option<Filesystem>)> {
    if !path.exists() {
        return Err(DriverError::NotFound(format!(
            "{} does not exist",
            path.display()
        )));
    }
    let mounts = mounter.mounts_at(path).context("reading mounts")?;
    let Some(top) = mounts.last() else {
        return Err(DriverError::NotFound(format!(
            "no volume is mounted at {}",
            path.display()
        )));
    };
    if is_block_device(path) {
        let device = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
        use std::os::unix::fs::MetadataExt;
        let rdev = io_ctx(
            std::fs::metadata(path),
            format!("reading {}", path.display()),
        )?
        .rdev();
        let number = (nix::sys::stat::major(rdev), nix::sys::stat::minor(rdev));
        return Ok((host_ops::device_path_of(number).unwrap_or(device), None));
    }
    let device = top
        .block_device()
        .and_then(host_ops::device_path_of)
        .ok_or_else(|| {
            DriverError::Internal(format!(
                "no device node for {}:{} mounted at {}",
                top.device.0,
                top.device.1,
                path.display()
            ))
        })?;
    let fs = Filesystem::parse(&top.fs_type).map_err(|_| {
        DriverError::FailedPrecondition(format!(
            "{} holds {}, which this driver does not grow",
            path.display(),
            top.fs_type
        ))
    })?;
    Ok((device, Some(fs)))
}

csi_node_service!(NodeService {
    rpc node_expand_volume(NodeExpandVolumeRequest) -> NodeExpandVolumeResponse
        = "NodeExpandVolume", volume_id = |r| r.volume_id.clone() => expand;
});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attach_limit_has_a_safe_default() {
        assert_eq!(attach_limit(None), DEFAULT_ATTACH_LIMIT);
        assert_eq!(attach_limit(Some(0)), DEFAULT_ATTACH_LIMIT);
        assert_eq!(attach_limit(Some(-3)), DEFAULT_ATTACH_LIMIT);
        assert_eq!(attach_limit(Some(10)), 10);
        assert_eq!(attach_limit(Some(1000)), MAX_ATTACH_LIMIT);
    }
}
