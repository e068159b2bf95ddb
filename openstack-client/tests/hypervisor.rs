//! The emulator's hypervisor simulation, driven through the client: a Nova
//! attach produces a real loop device under the by-id directory; extend
//! grows it; detach removes it; data survives re-attach; nothing is left
//! behind. Needs root.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use openstack_client::cinder::{BlockStorage, CreateVolume, VolumeStatus};
use openstack_client::common::{Poll, poll_until};
use openstack_client::config::{CloudConf, ConfigEnv};
use openstack_client::nova::Compute;
use openstack_client::{Session, SessionOptions};
use openstack_emulator::hypervisor::{Hypervisor, by_id_name};
use openstack_emulator::{Emulator, EmulatorConfig, HypervisorConfig};

fn require_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test drives real loop devices and must run as root"
    );
}

fn loop_devices_backed_by(dir: &Path) -> Vec<String> {
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    let mut out = Vec::new();
    for e in std::fs::read_dir("/sys/block").unwrap().flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        if let Ok(b) = std::fs::read_to_string(e.path().join("loop/backing_file"))
            && Path::new(b.trim().trim_end_matches(" (deleted)")).starts_with(&dir)
        {
            out.push(name);
        }
    }
    out
}

fn device_bytes(link: &Path) -> u64 {
    let dev = std::fs::canonicalize(link).unwrap();
    let name = dev.file_name().unwrap().to_string_lossy().to_string();
    let sectors: u64 = std::fs::read_to_string(format!("/sys/block/{name}/size"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    sectors * 512
}

async fn wait(c: &BlockStorage, id: &str, want: VolumeStatus) {
    poll_until(
        "wait",
        Instant::now() + Duration::from_secs(20),
        Duration::from_millis(10),
        Duration::from_millis(100),
        || async {
            let v = c.get_volume(id).await?;
            Ok(if v.status == want {
                Poll::Ready(())
            } else {
                Poll::Pending(v.status.to_string())
            })
        },
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn attach_extend_detach_on_real_loop_devices() {
    require_root();
    let by_id = tempfile::tempdir().unwrap();
    let images = tempfile::tempdir().unwrap();
    let emu = Emulator::start(EmulatorConfig {
        hypervisor: Some(HypervisorConfig {
            by_id_dir: by_id.path().into(),
            also_link_in: Vec::new(),
            image_dir: images.path().into(),
        }),
        ..Default::default()
    })
    .await
    .unwrap();
    let conf = CloudConf::from_texts(
        &[(PathBuf::from("c"), emu.cloud_conf())],
        ConfigEnv::default(),
    )
    .unwrap();
    let s = Session::new(conf.cloud("").unwrap(), SessionOptions::default()).unwrap();
    let cinder = BlockStorage::new(s.clone());
    let nova = Compute::new(s.clone());
    let server = emu
        .control()
        .create_server("admin", "node", "nova")
        .unwrap();

    let v = cinder
        .create_volume(&CreateVolume {
            name: "hv".into(),
            size_gib: 1,
            ..Default::default()
        })
        .await
        .unwrap();
    wait(&cinder, &v.id, VolumeStatus::Available).await;
    nova.attach_volume(&server, &v.id, false).await.unwrap();
    wait(&cinder, &v.id, VolumeStatus::InUse).await;
    let link = by_id.path().join(by_id_name(&v.id));
    assert!(link.exists(), "{} missing", link.display());
    assert_eq!(device_bytes(&link), 1 << 30);

    // a filesystem written while attached survives detach and re-attach
    let dev = std::fs::canonicalize(&link).unwrap();
    let out = Command::new("mkfs.ext4")
        .args(["-q", "-F"])
        .arg(&dev)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    cinder.extend_volume(&v.id, 2, true).await.unwrap();
    wait(&cinder, &v.id, VolumeStatus::InUse).await;
    assert_eq!(device_bytes(&link), 2 << 30);

    nova.detach_volume(&server, &v.id).await.unwrap();
    wait(&cinder, &v.id, VolumeStatus::Available).await;
    assert!(!link.exists());
    assert!(loop_devices_backed_by(images.path()).is_empty());

    nova.attach_volume(&server, &v.id, false).await.unwrap();
    wait(&cinder, &v.id, VolumeStatus::InUse).await;
    let dev = std::fs::canonicalize(&link).unwrap();
    let fstype = Command::new("blkid")
        .args(["-o", "value", "-s", "TYPE"])
        .arg(&dev)
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&fstype.stdout).trim(), "ext4");

    emu.shutdown().await;
    assert!(
        loop_devices_backed_by(images.path()).is_empty(),
        "shutdown detaches everything"
    );
    assert!(
        std::fs::read_dir(by_id.path()).unwrap().next().is_none(),
        "no links left"
    );
    assert!(
        std::fs::read_dir(images.path()).unwrap().next().is_none(),
        "no images left"
    );
}

#[test]
fn a_restart_cleans_up_what_a_crashed_run_left() {
    require_root();
    let by_id = tempfile::tempdir().unwrap();
    let images = tempfile::tempdir().unwrap();
    let crashed = Hypervisor::new(by_id.path().into(), images.path().into()).unwrap();
    crashed
        .attach("11111111-2222-3333-4444-555555555555", 1)
        .unwrap();
    assert_eq!(loop_devices_backed_by(images.path()).len(), 1);
    std::mem::forget(crashed);

    // another hypervisor linking in the same folder (the cluster tier's
    // agent beside a bench's emulator): its device and link are not ours
    let their_images = tempfile::tempdir().unwrap();
    let theirs = Hypervisor::new(by_id.path().into(), their_images.path().into()).unwrap();
    let their_volume = "99999999-8888-7777-6666-555555555555";
    let their_link = theirs.attach(their_volume, 1).unwrap();

    let restarted = Hypervisor::new(by_id.path().into(), images.path().into()).unwrap();
    restarted.cleanup_all();
    assert!(loop_devices_backed_by(images.path()).is_empty());
    let left: Vec<String> = std::fs::read_dir(by_id.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    assert_eq!(
        left,
        vec![by_id_name(their_volume)],
        "only the other's link is left"
    );
    assert!(their_link.exists(), "the other's device is still linked");
    assert_eq!(loop_devices_backed_by(their_images.path()).len(), 1);
    theirs.cleanup_all();
    assert!(loop_devices_backed_by(their_images.path()).is_empty());
    assert!(std::fs::read_dir(by_id.path()).unwrap().next().is_none());
}
