//! Reading instance metadata from a real config drive: a filesystem
//! labelled `config-2` on a loop device, mounted read-only in a private
//! temporary directory and unmounted again. Needs root.
//!
//! Real config drives are iso9660 or vfat; the kernels of these test
//! machines support neither, so the drive here is ext4, listed after the
//! two standard types: the reader tries iso9660 and vfat first (both fail)
//! and falls back to ext4, which exercises the same search, mount, read and
//! unmount path.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use openstack_client::config::{MetadataOptions, MetadataSource};
use openstack_client::metadata::MetadataReader;

struct LoopDevice(PathBuf);

impl Drop for LoopDevice {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.0).status();
    }
}

fn run(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{cmd}: {e} (is it installed?)"));
    assert!(
        out.status.success(),
        "{cmd} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn config_drive_mounts() -> usize {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter(|l| l.contains("config-drive-"))
        .count()
}

fn make_config_drive(dir: &Path, meta: &str) -> LoopDevice {
    let img = dir.join("config.img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(16 << 20)
        .unwrap();
    run(
        "mkfs.ext4",
        &["-q", "-L", "config-2", img.to_str().unwrap()],
    );
    let dev = LoopDevice(PathBuf::from(run(
        "losetup",
        &["--find", "--show", img.to_str().unwrap()],
    )));
    let mnt = dir.join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    run("mount", &[dev.0.to_str().unwrap(), mnt.to_str().unwrap()]);
    std::fs::create_dir_all(mnt.join("openstack/latest")).unwrap();
    std::fs::write(mnt.join("openstack/latest/meta_data.json"), meta).unwrap();
    run("umount", &[mnt.to_str().unwrap()]);
    dev
}

#[tokio::test]
async fn reads_a_config_drive_after_iso9660_and_vfat_fail_here_and_unmounts_it() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "needs root for loop devices and mounts"
    );
    let dir = tempfile::tempdir().unwrap();
    let dev = make_config_drive(
        dir.path(),
        r#"{"uuid": "83679162-1378-4288-a2d4-70e13ec132aa", "name": "worker-3", "availability_zone": "az-2",
            "devices": [{"type": "disk", "bus": "scsi", "address": "0:0:0:1", "serial": "vol-1"}]}"#,
    );
    let by_label = dir.path().join("by-label");
    std::fs::create_dir(&by_label).unwrap();
    std::os::unix::fs::symlink(&dev.0, by_label.join("config-2")).unwrap();

    let before = config_drive_mounts();
    let mut reader = MetadataReader::new(MetadataOptions {
        search_order: vec![MetadataSource::ConfigDrive],
        request_timeout: None,
    });
    reader.by_label_dir = by_label.clone();
    reader.config_drive_fstypes = vec!["iso9660".into(), "vfat".into(), "ext4".into()];
    // the metadata service must not be consulted: point it nowhere
    reader.service_url = url::Url::parse("http://127.0.0.1:9/").unwrap();
    let md = reader.read().await.unwrap();
    assert_eq!(md.uuid, "83679162-1378-4288-a2d4-70e13ec132aa");
    assert_eq!(md.availability_zone, "az-2");
    assert_eq!(md.devices[0].serial.as_deref(), Some("vol-1"));
    assert_eq!(
        config_drive_mounts(),
        before,
        "the config drive is unmounted again"
    );

    // a drive without meta_data.json is an error naming the file
    let empty_dir = tempfile::tempdir().unwrap();
    let img = empty_dir.path().join("e.img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(16 << 20)
        .unwrap();
    run(
        "mkfs.ext4",
        &["-q", "-L", "config-2", img.to_str().unwrap()],
    );
    let empty = LoopDevice(PathBuf::from(run(
        "losetup",
        &["--find", "--show", img.to_str().unwrap()],
    )));
    std::fs::remove_file(by_label.join("config-2")).unwrap();
    std::os::unix::fs::symlink(&empty.0, by_label.join("config-2")).unwrap();
    let err = reader.read().await.unwrap_err();
    assert!(err.to_string().contains("meta_data.json"), "{err}");
    assert_eq!(config_drive_mounts(), before);

    // the default types alone cannot mount it: the error lists each try
    reader.config_drive_fstypes = vec!["iso9660".into(), "vfat".into()];
    let err = reader.read().await.unwrap_err();
    assert!(
        err.to_string().contains("iso9660:") && err.to_string().contains("vfat:"),
        "{err}"
    );
    assert_eq!(config_drive_mounts(), before);
}
