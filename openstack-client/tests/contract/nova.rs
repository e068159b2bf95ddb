//! Nova: attach, extend and detach, its disk limit, multi-attach's
//! microversion, and attached volumes appearing as block devices.

use std::time::Duration;

use openstack_client::Error;
use openstack_client::cinder::{BlockStorage, CreateSnapshot, CreateVolume, VolumeStatus};
use openstack_client::common::{Poll, poll_until};
use openstack_client::nova::{Compute, CreateServer};
use openstack_emulator::{Emulator, EmulatorConfig};

use crate::backend::*;
use crate::common::{deadline, wait_gone, wait_snapshot, wait_volume, wait_volume_size};

#[tokio::test]
async fn nova_attach_extend_detach() {
    let b = Backend::new().await;
    if !b.has("nova", "nova_attach_extend_detach") {
        return;
    }
    let _server = TEST_SERVER.lock().await;
    let s = b.session(User::Admin);
    let c = BlockStorage::new(s.clone());
    let nova = Compute::new(s.clone());
    let server = b.server();
    let srv = nova
        .get_server(&server)
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", b.name()));
    assert_eq!(srv.id, server);
    assert_eq!(srv.availability_zone.as_deref(), Some(ZONE), "{}", b.name());

    let v = new_volume(&c, &unique("contract-attach"), 1).await;
    let att = nova
        .attach_volume(&server, &v.id, false)
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", b.name()));
    assert_eq!(att.volume_id, v.id);
    let attached = wait_volume(&c, &v.id, VolumeStatus::InUse).await;
    assert_eq!(
        attached.attached_servers().collect::<Vec<_>>(),
        vec![server.as_str()],
        "{}",
        b.name()
    );
    assert!(attached.attachments[0].attachment_id.is_some());
    let listed = nova.list_volume_attachments(&server).await.unwrap();
    assert!(
        listed.iter().any(|a| a.volume_id == v.id),
        "{}: {listed:?}",
        b.name()
    );

    // attached twice to the same server: refused
    let err = nova.attach_volume(&server, &v.id, false).await.unwrap_err();
    assert!(
        matches!(err, Error::BadRequest(_) | Error::Conflict(_)),
        "{}: {err}",
        b.name()
    );
    // deleting an attached volume: refused
    let err = c.delete_volume(&v.id).await.unwrap_err();
    assert!(matches!(err, Error::BadRequest(_)), "{}: {err}", b.name());
    // snapshot of an attached volume needs force
    let err = c
        .create_snapshot(&CreateSnapshot {
            volume_id: v.id.clone(),
            name: "no-force".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(matches!(err, Error::BadRequest(_)), "{}: {err}", b.name());
    let forced = c
        .create_snapshot(&CreateSnapshot {
            volume_id: v.id.clone(),
            name: unique("forced"),
            force: true,
            ..Default::default()
        })
        .await
        .unwrap();
    wait_snapshot(&c, &forced.id).await;
    c.delete_snapshot(&forced.id).await.unwrap();
    // Cinder deletes asynchronously: the volume can go once it is gone
    wait_gone("snapshot delete", || c.get_snapshot(&forced.id)).await;

    // online extend (3.42)
    c.extend_volume(&v.id, 2, true)
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", b.name()));
    wait_volume_size(&c, &v.id, 2, VolumeStatus::InUse).await;

    nova.detach_volume(&server, &v.id).await.unwrap();
    let detached = wait_volume(&c, &v.id, VolumeStatus::Available).await;
    assert!(detached.attachments.is_empty());
    // Nova forgets the attachment once its compute has finished, after
    // Cinder says available; a detach in between is refused by Cinder (400:
    // the volume is not in-use), as the real services did in a full run
    poll_until(
        "Nova's attachment gone",
        deadline(),
        Duration::from_millis(50),
        Duration::from_millis(500),
        || async {
            let listed = nova.list_volume_attachments(&server).await?;
            Ok(if listed.iter().any(|a| a.volume_id == v.id) {
                Poll::Pending(format!("{} attachment(s) listed", listed.len()))
            } else {
                Poll::Ready(())
            })
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{}: {e}", b.name()));
    // detaching again: the attachment is gone
    let err = nova.detach_volume(&server, &v.id).await.unwrap_err();
    assert!(err.is_not_found(), "{}: {err}", b.name());
    let err = nova
        .get_server("00000000-0000-0000-0000-000000000000")
        .await
        .unwrap_err();
    assert!(err.is_not_found(), "{}: {err}", b.name());
    c.delete_volume(&v.id).await.unwrap();
}

#[tokio::test]
async fn nova_refuses_attach_past_max_disk_devices() {
    let b = Backend::new().await;
    if !b.has("nova", "nova_refuses_attach_past_max_disk_devices") {
        return;
    }
    let _server = TEST_SERVER.lock().await;
    // `[compute] max_disk_devices_to_attach`, the root disk included
    let max: usize = match &b {
        Backend::Emulator(e) => {
            e.control().set_max_disk_devices(4);
            4
        }
        Backend::Real { dir, .. } => std::fs::read_to_string(dir.join("max-disk-devices"))
            .expect("the test cloud records Nova's disk limit")
            .trim()
            .parse()
            .unwrap(),
    };
    let s = b.session(User::Admin);
    let c = BlockStorage::new(s.clone());
    let nova = Compute::new(s);
    let server = b.server();
    let in_use = nova.list_volume_attachments(&server).await.unwrap().len();
    // the root disk: a volume on the real cloud's server (listed), an
    // image on the emulator's (not listed)
    let devices = match &b {
        Backend::Emulator(_) => in_use + 1,
        Backend::Real { .. } => in_use,
    };
    assert!(devices < max, "{}: the server is already full", b.name());
    let mut attached = Vec::new();
    for i in 0..(max - devices) {
        let v = new_volume(&c, &unique(&format!("contract-full-{i}")), 1).await;
        nova.attach_volume(&server, &v.id, false)
            .await
            .unwrap_or_else(|e| panic!("{}: attach {i}: {e}", b.name()));
        wait_volume(&c, &v.id, VolumeStatus::InUse).await;
        attached.push(v.id);
    }
    let one_more = new_volume(&c, &unique("contract-full-extra"), 1).await;
    let err = nova
        .attach_volume(&server, &one_more.id, false)
        .await
        .unwrap_err();
    match &err {
        Error::Forbidden(e) => assert!(
            e.message.contains("maximum allowed number of disk devices"),
            "{}: {}",
            b.name(),
            e.message
        ),
        other => panic!("{}: expected 403, got {other}", b.name()),
    }
    // refused before anything was reserved
    let v = c.get_volume(&one_more.id).await.unwrap();
    assert_eq!(v.status, VolumeStatus::Available, "{}", b.name());
    assert!(v.attachments.is_empty(), "{}", b.name());
    for id in &attached {
        nova.detach_volume(&server, id).await.unwrap();
    }
    for id in attached.iter().chain([&one_more.id]) {
        wait_volume(&c, id, VolumeStatus::Available).await;
        c.delete_volume(id).await.unwrap();
    }
}

#[tokio::test]
async fn nova_multiattach_needs_2_60() {
    let b = Backend::new().await;
    if !b.has("nova", "nova_multiattach_needs_2_60") {
        return;
    }
    let _server = TEST_SERVER.lock().await;
    let s = b.session(User::Admin);
    let c = BlockStorage::new(s.clone());
    let nova = Compute::new(s.clone());
    let server = b.server();
    let v = c
        .create_volume(&CreateVolume {
            name: unique("contract-multi"),
            size_gib: 1,
            volume_type: Some("multiattach".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    let v = wait_volume(&c, &v.id, VolumeStatus::Available).await;
    assert!(
        v.multiattach,
        "{}: the multiattach type makes multiattach volumes",
        b.name()
    );
    let err = nova.attach_volume(&server, &v.id, false).await.unwrap_err();
    assert!(
        matches!(err, Error::BadRequest(_)) && err.to_string().contains("2.60"),
        "{}: {err}",
        b.name()
    );
    nova.attach_volume(&server, &v.id, true).await.unwrap();
    wait_volume(&c, &v.id, VolumeStatus::InUse).await;
    nova.detach_volume(&server, &v.id).await.unwrap();
    wait_volume(&c, &v.id, VolumeStatus::Available).await;
    c.delete_volume(&v.id).await.unwrap();
}

/// The by-id directory where attached volumes appear as block devices:
/// the emulator's hypervisor simulation, or the real cloud's agent.
#[tokio::test]
async fn attached_volumes_become_block_devices() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test drives real loop devices and must run as root"
    );
    let scratch = tempfile::tempdir().unwrap();
    let b = match Backend::new().await {
        Backend::Emulator(e) => {
            e.shutdown().await;
            let emu = Emulator::start(EmulatorConfig {
                hypervisor: Some(openstack_emulator::HypervisorConfig {
                    by_id_dir: scratch.path().join("by-id"),
                    also_link_in: Vec::new(),
                    image_dir: scratch.path().join("images"),
                }),
                ..Backend::emulator_config()
            })
            .await
            .unwrap();
            Backend::Emulator(emu)
        }
        real => real,
    };
    if !b.has("nova", "attached_volumes_become_block_devices") {
        return;
    }
    let _server = TEST_SERVER.lock().await;
    let by_id = match &b {
        Backend::Emulator(_) => scratch.path().join("by-id"),
        Backend::Real { dir, .. } => dir.join("by-id"),
    };
    let s = b.session(User::Member);
    let c = BlockStorage::new(s.clone());
    let nova = Compute::new(s);
    let server = b.device_server();
    let v = new_volume(&c, &unique("contract-dev"), 1).await;
    let link = by_id.join(openstack_emulator::hypervisor::by_id_name(&v.id));
    let name = b.name();
    nova.attach_volume(&server, &v.id, false).await.unwrap();
    wait_volume(&c, &v.id, VolumeStatus::InUse).await;
    wait_device(&link, Some(1 << 30), name).await;
    c.extend_volume(&v.id, 2, true).await.unwrap();
    wait_device(&link, Some(2 << 30), name).await;
    nova.detach_volume(&server, &v.id).await.unwrap();
    wait_volume(&c, &v.id, VolumeStatus::Available).await;
    wait_device(&link, None, name).await;
    c.delete_volume(&v.id).await.unwrap();
}

fn device_bytes(link: &std::path::Path) -> Option<u64> {
    let dev = std::fs::canonicalize(link).ok()?;
    let name = dev.file_name()?.to_string_lossy().to_string();
    let sectors: u64 = std::fs::read_to_string(format!("/sys/block/{name}/size"))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(sectors * 512)
}

/// Waits until the device behind `link` has `want` bytes (None: no device).
async fn wait_device(link: &std::path::Path, want: Option<u64>, backend: &str) {
    poll_until(
        "block device",
        deadline(),
        Duration::from_millis(50),
        Duration::from_millis(500),
        || async {
            let now = device_bytes(link);
            Ok(if now == want {
                Poll::Ready(())
            } else {
                Poll::Pending(format!("{now:?}"))
            })
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{backend}: {e}"));
}

#[tokio::test]
async fn nova_refuses_an_attach_across_zones() {
    let b = Backend::new().await;
    if !b.has("nova", "nova_refuses_an_attach_across_zones") {
        return;
    }
    let _server = TEST_SERVER.lock().await;
    let s = b.session(User::Admin);
    let c = BlockStorage::new(s.clone());
    let nova = Compute::new(s.clone());
    let server = b.server();
    let created = c
        .create_volume(&CreateVolume {
            name: unique("contract-other-zone"),
            size_gib: 1,
            availability_zone: Some(OTHER_ZONE.into()),
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", b.name()));
    let v = wait_volume(&c, &created.id, VolumeStatus::Available).await;
    assert_eq!(v.availability_zone, OTHER_ZONE, "{}", b.name());
    // cross_az_attach = False: refused in the API call, nothing reserved
    let err = nova.attach_volume(&server, &v.id, false).await.unwrap_err();
    assert!(matches!(err, Error::BadRequest(_)), "{}: {err}", b.name());
    assert!(
        err.to_string().contains("availability_zone"),
        "{}: {err}",
        b.name()
    );
    let after = c.get_volume(&v.id).await.unwrap();
    assert_eq!(after.status, VolumeStatus::Available, "{}", b.name());
    assert!(after.attachments.is_empty(), "{}: {after:?}", b.name());
    c.delete_volume(&v.id).await.unwrap();
    wait_gone("volume delete", || c.get_volume(&v.id)).await;
}

/// A project member gets 404 for another project's live server exactly as
/// for a deleted server of its own; only `os-instance-actions` (2.21+),
/// which Nova keeps for a deleted server's project, tells them apart: the
/// member's own deleted server lists its `delete`, the other project's
/// server answers 404 there too. The Cinder controller's repairs rest on
/// this.
#[tokio::test]
async fn nova_tells_a_member_its_deleted_server_apart_from_another_projects() {
    let b = Backend::new().await;
    if !b.has(
        "nova",
        "nova_tells_a_member_its_deleted_server_apart_from_another_projects",
    ) {
        return;
    }
    let member = b.session(User::Member);
    let c = BlockStorage::new(member.clone());
    let nova = Compute::new(member);
    let others = b.server();
    let err = nova.get_server(&others).await.unwrap_err();
    assert!(err.is_not_found(), "{}: {err}", b.name());
    let err = nova.list_instance_actions(&others).await.unwrap_err();
    assert!(err.is_not_found(), "{}: {err}", b.name());

    let created = c
        .create_volume(&CreateVolume {
            name: unique("contract-member-boot"),
            size_gib: 1,
            availability_zone: Some(ZONE.into()),
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", b.name()));
    let boot = wait_volume(&c, &created.id, VolumeStatus::Available).await;
    c.set_bootable(&boot.id, true).await.unwrap();
    let server = nova
        .create_server(&CreateServer {
            name: unique("contract-member-server"),
            flavor_ref: "test".into(),
            boot_volume_id: boot.id.clone(),
            availability_zone: Some(ZONE.into()),
        })
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", b.name()))
        .id;
    poll_until(
        "server active",
        deadline(),
        Duration::from_millis(50),
        Duration::from_millis(500),
        || async {
            Ok::<_, Error>(match nova.get_server(&server).await?.status.as_str() {
                "ACTIVE" => Poll::Ready(()),
                other => Poll::Pending(other.to_string()),
            })
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{}: {e}", b.name()));
    let actions = nova.list_instance_actions(&server).await.unwrap();
    assert!(
        actions.iter().any(|a| a.action == "create"),
        "{}: {actions:?}",
        b.name()
    );
    nova.delete_server(&server).await.unwrap();
    wait_gone("server delete", || nova.get_server(&server)).await;
    let actions = nova
        .list_instance_actions(&server)
        .await
        .unwrap_or_else(|e| panic!("{}: a deleted server's actions: {e}", b.name()));
    assert_eq!(
        actions.first().map(|a| a.action.as_str()),
        Some("delete"),
        "{}: newest first, the delete: {actions:?}",
        b.name()
    );
    wait_volume(&c, &boot.id, VolumeStatus::Available).await;
    c.delete_volume(&boot.id).await.unwrap();
    wait_gone("volume delete", || c.get_volume(&boot.id)).await;
}
