//! `cinder-csi-plugin`'s node through its socket, on real loop devices
//! and filesystems: what the node reports, staging that never reformats,
//! restores grown to a larger volume, btrfs. Tests needing root return
//! early (and say so) without it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use proto::csi::v1 as csi;
use proto::csi::v1::volume_capability::access_mode::Mode;
use tonic::Code;

mod common;
use common::*;

#[tokio::test]
async fn node_info_comes_from_metadata_with_a_safe_limit() {
    if !root() {
        return;
    }
    let mut e = env_with(&["--additional-topology=topology.kubernetes.io/region=RegionOne"]).await;
    let info =
        e.n.node_get_info(csi::NodeGetInfoRequest {})
            .await
            .unwrap()
            .into_inner();
    assert_eq!(info.node_id, e.h.node_id);
    // the limit less this machine's own disks (its root)
    let own = csi_sanity::harness::cinder::own_disks_of_this_machine() as i64;
    assert_eq!(
        info.max_volumes_per_node,
        csi_cinder::node::DEFAULT_ATTACH_LIMIT - own
    );
    let seg = info.accessible_topology.unwrap().segments;
    assert_eq!(
        seg.get(csi_cinder::TOPOLOGY_KEY).map(String::as_str),
        Some("nova")
    );
    assert_eq!(
        seg.get("topology.kubernetes.io/region").map(String::as_str),
        Some("RegionOne")
    );
}

#[tokio::test]
async fn an_inline_ephemeral_volume_is_refused_naming_generic_ephemeral_volumes() {
    if !root() {
        return;
    }
    let mut e = env().await;
    let (_, target) = e.h.paths("csi-0123456789abcdef");
    // as kubelet sends it: no staging path, the pod's attributes
    let err =
        e.n.node_publish_volume(csi::NodePublishVolumeRequest {
            volume_id: "csi-0123456789abcdef".into(),
            target_path: target.display().to_string(),
            volume_capability: Some(mount_cap("ext4", Mode::SingleNodeWriter)),
            volume_context: [
                (
                    "csi.storage.k8s.io/ephemeral".to_string(),
                    "true".to_string(),
                ),
                ("csi.storage.k8s.io/pod.name".to_string(), "app".to_string()),
                ("capacity".to_string(), "1Gi".to_string()),
            ]
            .into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{}", err.message());
    assert!(
        err.message().contains("generic ephemeral volume"),
        "{}",
        err.message()
    );
    assert!(!target.exists(), "nothing made at the target");
}

// ------------------------------------------------------------ data safety

#[tokio::test]
async fn staging_never_reformats_and_keeps_data() {
    if !root() {
        return;
    }
    let mut e = env().await;
    let ext4 = mount_cap("ext4", Mode::SingleNodeWriter);
    let (v, staging) = e.staged("safe", ext4.clone(), 1).await;
    std::fs::write(staging.join("precious"), b"keep me").unwrap();
    e.unstage(&v.volume_id).await;
    // restaging finds the filesystem and mounts it as it is
    e.stage(&v, ext4.clone()).await.unwrap();
    assert_eq!(std::fs::read(staging.join("precious")).unwrap(), b"keep me");
    // asking for another filesystem family is refused, not a reformat
    e.unstage(&v.volume_id).await;
    let err = e
        .stage(&v, mount_cap("xfs", Mode::SingleNodeWriter))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{}", err.message());
    let dev = e.device(&v.volume_id);
    with_mounted(&dev, "ext4", |d| {
        assert_eq!(std::fs::read(d.join("precious")).unwrap(), b"keep me")
    });

    // a device someone formatted by hand keeps its data
    let w = e.create("byhand", ext4.clone(), 1).await;
    e.publish(&w.volume_id, ext4.clone()).await;
    let dev = e.device(&w.volume_id);
    run("mkfs.xfs", &["-q", &dev.to_string_lossy()]);
    with_mounted(&dev, "xfs", |d| {
        std::fs::write(d.join("xfs-data"), b"mine").unwrap()
    });
    let err = e.stage(&w, ext4.clone()).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    // with no fs type asked for, the existing one is used
    e.stage(&w, mount_cap("", Mode::SingleNodeWriter))
        .await
        .unwrap();
    let (staging_w, _) = e.h.paths(&w.volume_id);
    assert_eq!(std::fs::read(staging_w.join("xfs-data")).unwrap(), b"mine");
    e.unstage(&w.volume_id).await;

    // a partition table is not formatted over
    let p = e.create("parted", ext4.clone(), 1).await;
    e.publish(&p.volume_id, ext4.clone()).await;
    let dev = e.device(&p.volume_id);
    write_dos_partition_table(&dev);
    let err = e.stage(&p, ext4.clone()).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{}", err.message());
    assert!(
        err.message().contains("partition table"),
        "{}",
        err.message()
    );
    let mut sector = vec![0u8; 512];
    std::io::Read::read_exact(&mut std::fs::File::open(&dev).unwrap(), &mut sector).unwrap();
    assert_eq!(
        &sector[510..],
        &[0x55, 0xAA],
        "the partition table is intact"
    );

    // something else mounted at the staging path is an error, not stacked
    let q = e.create("occupied", ext4.clone(), 1).await;
    e.publish(&q.volume_id, ext4.clone()).await;
    let (staging_q, _) = e.h.paths(&q.volume_id);
    std::fs::create_dir_all(&staging_q).unwrap();
    nix::mount::mount(
        Some("tmpfs"),
        &staging_q,
        Some("tmpfs"),
        nix::mount::MsFlags::empty(),
        None::<&str>,
    )
    .unwrap();
    let err = e.stage(&q, ext4.clone()).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{}", err.message());
    nix::mount::umount2(&staging_q, nix::mount::MntFlags::empty()).unwrap();
}

/// One DOS partition table with one Linux partition, written directly.
fn write_dos_partition_table(dev: &Path) {
    use std::io::Write;
    let mut mbr = vec![0u8; 512];
    // partition 1: type 0x83, LBA 2048, 1 MiB long
    let e = &mut mbr[446..462];
    e[4] = 0x83;
    e[8..12].copy_from_slice(&2048u32.to_le_bytes());
    e[12..16].copy_from_slice(&2048u32.to_le_bytes());
    mbr[510] = 0x55;
    mbr[511] = 0xAA;
    let mut f = std::fs::OpenOptions::new().write(true).open(dev).unwrap();
    f.write_all(&mbr).unwrap();
    f.sync_all().unwrap();
}

#[tokio::test]
async fn restore_to_a_larger_volume_grows_the_filesystem_and_keeps_data() {
    restore_larger("xfs").await;
}

/// ext4 is grown before it is mounted: online it needs CAP_SYS_RESOURCE,
/// which this machine's root lacks (resize2fs: "Permission denied"), as
/// many nodes do.
#[tokio::test]
async fn restore_to_a_larger_ext4_volume_grows_it_without_cap_sys_resource() {
    restore_larger("ext4").await;
}

async fn restore_larger(fs: &str) {
    if !root() {
        return;
    }
    let mut e = env().await;
    let cap = mount_cap(fs, Mode::SingleNodeWriter);
    let (v, staging) = e.staged(&format!("origin-{fs}"), cap.clone(), 1).await;
    std::fs::write(staging.join("snapshotted"), b"v1").unwrap();
    nix::unistd::sync();
    e.unstage(&v.volume_id).await;
    e.unpublish(&v.volume_id).await;
    let snap =
        e.c.create_snapshot(csi::CreateSnapshotRequest {
            source_volume_id: v.volume_id.clone(),
            name: format!("snap-{fs}"),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap();
    assert!(snap.ready_to_use);
    let mut r = create_req(&format!("restored-{fs}"), cap.clone(), 3);
    r.volume_content_source = Some(csi::VolumeContentSource {
        r#type: Some(csi::volume_content_source::Type::Snapshot(
            csi::volume_content_source::SnapshotSource {
                snapshot_id: snap.snapshot_id.clone(),
            },
        )),
    });
    let restored =
        e.c.create_volume(r)
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
    assert_eq!(restored.capacity_bytes, 3 * GIB);
    assert_eq!(
        restored
            .volume_context
            .get("cinder.csi.openstack.org/resizeRequired")
            .map(String::as_str),
        Some("true")
    );
    e.publish(&restored.volume_id, cap.clone()).await;
    e.stage(&restored, cap.clone()).await.unwrap();
    let (staging_r, _) = e.h.paths(&restored.volume_id);
    assert_eq!(std::fs::read(staging_r.join("snapshotted")).unwrap(), b"v1");
    let usage = host_ops::volume_usage(&staging_r).unwrap();
    assert!(
        usage.total_bytes > 2 * GIB as u64,
        "{fs} filesystem not grown: {usage:?}"
    );
    e.unstage(&restored.volume_id).await;
    if fs == "ext4" {
        // staged again (every pod move does it, and the volume's context
        // asks for the resize for its whole life): it fills its volume,
        // so it is neither checked (e2fsck -f would reset the count of
        // mounts since the last check) nor grown again
        let device = std::fs::canonicalize(e.h.by_id_dir.join(
            openstack_emulator::hypervisor::by_id_name(&restored.volume_id),
        ))
        .unwrap();
        let before = ext_mount_count(&device);
        e.stage(&restored, cap.clone()).await.unwrap();
        assert_eq!(
            ext_mount_count(&device),
            before + 1,
            "a second stage checked the filesystem again"
        );
        e.unstage(&restored.volume_id).await;
    }
}

/// The ext filesystem's count of mounts since it was last checked.
fn ext_mount_count(device: &std::path::Path) -> u64 {
    let out = std::process::Command::new("dumpe2fs")
        .arg("-h")
        .arg(device)
        .env("LC_ALL", "C")
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("Mount count:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no mount count: {}", String::from_utf8_lossy(&out.stderr)))
}

#[tokio::test]
async fn btrfs_volumes_are_formatted_grown_online_and_never_reformatted() {
    if !root() {
        return;
    }
    let mut e = env().await;
    let btrfs = mount_cap("btrfs", Mode::SingleNodeWriter);
    let (v, staging) = e.staged("btrfs", btrfs.clone(), 1).await;
    // staged already: the same answer (btrfs names an anonymous device
    // in mountinfo, not the volume's)
    e.stage(&v, btrfs.clone()).await.unwrap();
    let mounted = host_ops::Mounter::mounts_at(&host_ops::LinuxMounter, &staging).unwrap();
    assert_eq!(mounted.last().unwrap().fs_type, "btrfs", "{mounted:?}");
    std::fs::write(staging.join("kept"), b"btrfs data").unwrap();
    let before = host_ops::volume_usage(&staging).unwrap().total_bytes;

    // online expansion: Cinder grows the volume, the node the filesystem
    grown_to_2_gib(&mut e, &v, &staging, &staging, &btrfs).await;
    let after = host_ops::volume_usage(&staging).unwrap().total_bytes;
    assert!(
        after > before + (GIB as u64) / 2,
        "btrfs not grown: {before} -> {after}"
    );

    // staged again as another filesystem: refused, the data stays
    e.unstage(&v.volume_id).await;
    let err = e
        .stage(&v, mount_cap("xfs", Mode::SingleNodeWriter))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{}", err.message());
    e.stage(&v, btrfs.clone()).await.unwrap();
    assert_eq!(std::fs::read(staging.join("kept")).unwrap(), b"btrfs data");
    e.unstage(&v.volume_id).await;
    e.unpublish(&v.volume_id).await;
}

/// Stages and publishes `v` as upstream's node plugin does
/// (cloud-provider-openstack's Go plugin, through Kubernetes'
/// mount-utils): on a blank device `mkfs.ext4 -F -m0` or `mkfs.xfs -f`,
/// `mount -t FS -o defaults DEVICE STAGING`; then the staging path bound
/// at the target (`mount -o bind`, then a remount with the options). The
/// staging and target paths.
fn staged_by_upstream(
    e: &Env,
    v: &csi::Volume,
    fs: &str,
) -> (std::path::PathBuf, std::path::PathBuf) {
    let dev = e.device(&v.volume_id);
    let dev = dev.to_string_lossy();
    let (staging, target) = e.h.paths(&v.volume_id);
    std::fs::create_dir_all(&staging).unwrap();
    std::fs::create_dir_all(&target).unwrap();
    match fs {
        "xfs" => run("mkfs.xfs", &["-q", "-f", &dev]),
        _ => run(&format!("mkfs.{fs}"), &["-q", "-F", "-m0", &dev]),
    }
    let (s, t) = (staging.to_string_lossy(), target.to_string_lossy());
    run("mount", &["-t", fs, "-o", "defaults", &dev, &s]);
    run("mount", &["-o", "bind", &s, &t]);
    run("mount", &["-o", "bind,remount,rw", &t]);
    (staging, target)
}

/// Volumes upstream's node plugin staged and published, served by ours
/// after a release was replaced in place: ours reports their usage,
/// grows them online (xfs here: ext4 online needs CAP_SYS_RESOURCE,
/// which this machine lacks), unpublishes and unstages them, and stages
/// them again its own way, without a format, the data there.
#[tokio::test]
async fn volumes_upstreams_plugin_staged_are_served_released_and_restaged() {
    if !root() {
        return;
    }
    let mut e = env().await;
    let lm = host_ops::LinuxMounter;
    for fs in ["ext4", "xfs"] {
        let cap = mount_cap(fs, Mode::SingleNodeWriter);
        let v = e
            .create(&format!("upstream-staged-{fs}"), cap.clone(), 1)
            .await;
        e.publish(&v.volume_id, cap.clone()).await;
        let (staging, target) = staged_by_upstream(&e, &v, fs);
        std::fs::write(target.join("written-under-upstream"), fs).unwrap();

        let stats =
            e.n.node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
                volume_id: v.volume_id.clone(),
                volume_path: target.to_string_lossy().into(),
                staging_target_path: staging.to_string_lossy().into(),
            })
            .await
            .unwrap()
            .into_inner();
        let bytes = stats
            .usage
            .iter()
            .find(|u| u.unit == csi::volume_usage::Unit::Bytes as i32)
            .unwrap();
        assert!(bytes.total > GIB / 2, "{fs}: {stats:?}");
        assert!(
            stats.volume_condition.as_ref().is_none_or(|c| !c.abnormal),
            "{fs}: {stats:?}"
        );

        if fs == "xfs" {
            let before = host_ops::volume_usage(&target).unwrap().total_bytes;
            grown_to_2_gib(&mut e, &v, &target, &staging, &cap).await;
            let after = host_ops::volume_usage(&target).unwrap().total_bytes;
            assert!(
                after > before + (GIB as u64) / 2,
                "upstream's xfs not grown: {before} -> {after}"
            );
        }

        e.n.node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
            volume_id: v.volume_id.clone(),
            target_path: target.to_string_lossy().into(),
        })
        .await
        .unwrap();
        assert!(
            host_ops::Mounter::mounts_at(&lm, &target)
                .unwrap()
                .is_empty(),
            "{fs}: the target still mounted"
        );
        e.unstage(&v.volume_id).await;
        assert!(
            host_ops::Mounter::mounts_at(&lm, &staging)
                .unwrap()
                .is_empty(),
            "{fs}: the staging path still mounted"
        );

        // staged again by ours: upstream's filesystem as it is, its data
        e.stage(&v, cap.clone()).await.unwrap();
        assert_eq!(
            std::fs::read_to_string(staging.join("written-under-upstream")).unwrap(),
            fs
        );
        e.unstage(&v.volume_id).await;
        e.unpublish(&v.volume_id).await;
    }
}

/// Cinder grows `v` to 2 GiB, then the node its filesystem, mounted at
/// `volume_path` (staged at `staging`).
async fn grown_to_2_gib(
    e: &mut Env,
    v: &csi::Volume,
    volume_path: &Path,
    staging: &Path,
    cap: &csi::VolumeCapability,
) {
    let capacity_range = Some(csi::CapacityRange {
        required_bytes: 2 * GIB,
        limit_bytes: 0,
    });
    e.c.controller_expand_volume(csi::ControllerExpandVolumeRequest {
        volume_id: v.volume_id.clone(),
        capacity_range,
        volume_capability: Some(cap.clone()),
        ..Default::default()
    })
    .await
    .unwrap();
    e.n.node_expand_volume(csi::NodeExpandVolumeRequest {
        volume_id: v.volume_id.clone(),
        volume_path: volume_path.to_string_lossy().into(),
        staging_target_path: staging.to_string_lossy().into(),
        capacity_range,
        volume_capability: Some(cap.clone()),
        ..Default::default()
    })
    .await
    .unwrap();
}
