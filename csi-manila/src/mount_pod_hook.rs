//! The mount pod's own preStop hook (`manila-csi-plugin mount-pod-pre-stop
//! --staging-path=<path>`), run inside the mount pod: it returns once no
//! pod uses the share any more (no mount but the staging mount itself
//! shows the FUSE connection's device), so that ceph-fuse outlives the
//! last app's writes when the mount pod is evicted (`kubectl drain`
//! evicts it beside the apps). The pod's grace period bounds the wait:
//! a drain never waits forever on a mount pod, even when nothing will
//! unmount the apps' volumes (the node plugin gone). Ended by the node
//! plugin after NodeUnstageVolume, it finds no user and returns at once.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// The first argument that runs the hook instead of the plugin.
pub const SUBCOMMAND: &str = "mount-pod-pre-stop";

/// Whether this process was started as the hook.
pub fn invoked() -> bool {
    std::env::args().nth(1).as_deref() == Some(SUBCOMMAND)
}

#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "mount-pod-pre-stop",
    about = "Waits, in a mount pod being stopped, until no pod uses its share"
)]
pub struct MountPodHookArgs {
    /// The share's staging path, which ceph-fuse serves.
    #[arg(long)]
    pub staging_path: PathBuf,
    /// How often to look again, in milliseconds.
    #[arg(long, default_value_t = 500)]
    pub poll_interval_ms: u64,
}

/// The mounts that use the FUSE connection mounted at `staging`, besides
/// the staging mount itself (the pods' bind mounts of the share); none
/// when the staging path is not mounted.
pub fn users(mountinfo: &str, staging: &Path) -> Vec<PathBuf> {
    let mounts = host_ops::mountinfo::parse(mountinfo);
    let Some(device) = mounts
        .iter()
        .rev()
        .find(|m| m.mount_point == staging)
        .map(|m| m.device)
    else {
        return Vec::new();
    };
    mounts
        .into_iter()
        .filter(|m| m.device == device && m.mount_point != staging)
        .map(|m| m.mount_point)
        .collect()
}

/// The hook's `main`: waits until the share has no user.
pub async fn main() -> std::io::Result<()> {
    use clap::Parser;
    let args = MountPodHookArgs::parse_from(std::env::args().skip(1));
    let poll = Duration::from_millis(args.poll_interval_ms.max(50));
    let mut said = None;
    loop {
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")?;
        let users = users(&mountinfo, &args.staging_path);
        if users.is_empty() {
            return Ok(());
        }
        if said != Some(users.len()) {
            // kubelet keeps a failed hook's output only: stderr is what an
            // operator reads in the pod's events, if anything
            eprintln!(
                "{} pod mount(s) still use {}: ceph-fuse stays until they are gone",
                users.len(),
                args.staging_path.display()
            );
            said = Some(users.len());
        }
        tokio::time::sleep(poll).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAGING: &str = "/var/lib/kubelet/plugins/kubernetes.io/csi/cephfs.manila.csi.openstack.org/abc/globalmount";

    fn line(id: u32, dev: &str, point: &str, fs: &str) -> String {
        format!("{id} 1 {dev} / {point} rw,relatime shared:{id} - {fs} src rw\n")
    }

    #[test]
    fn the_pods_bind_mounts_of_the_share_are_its_users() {
        let pod = "/var/lib/kubelet/pods/u1/volumes/kubernetes.io~csi/pv-1/mount";
        let mut info = line(30, "8:1", "/", "ext4");
        info += &line(40, "0:77", STAGING, "fuse.ceph-fuse");
        info += &line(41, "0:77", pod, "fuse.ceph-fuse");
        // another share's FUSE connection, and the kubelet directory
        info += &line(
            42,
            "0:78",
            "/var/lib/kubelet/pods/u2/volumes/kubernetes.io~csi/pv-2/mount",
            "fuse.ceph-fuse",
        );
        info += &line(43, "8:1", "/var/lib/kubelet", "ext4");
        assert_eq!(users(&info, Path::new(STAGING)), vec![PathBuf::from(pod)]);
        // the pod's mount gone: no user
        let without: String = info
            .lines()
            .filter(|l| !l.contains(pod))
            .map(|l| format!("{l}\n"))
            .collect();
        assert!(users(&without, Path::new(STAGING)).is_empty());
        // the staging path not mounted (unstaged already): no user
        assert!(users(&line(30, "8:1", "/", "ext4"), Path::new(STAGING)).is_empty());
    }
}
