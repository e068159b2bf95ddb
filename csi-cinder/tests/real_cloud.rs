//! `cinder-csi-plugin`'s controller against the real test cloud: real
//! Keystone, Cinder (two zones, a backend in each) and Nova (a compute
//! host per zone, no attach across them). Start the cloud with
//! `python3 tests/openstack/cloud.py up block` (or `all`), then
//! `OPENSTACK_TEST_BACKEND=real cargo test -p csi-cinder --test real_cloud
//! -- --ignored`. Ignored otherwise: they need root and the cloud.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use csi_sanity::harness::{CinderOnRealCloud, real_cloud_dir, test_log, unique_name as unique};
use openstack_client::cinder::{BlockStorage, CreateVolume};
use openstack_client::config::{CloudConf, ConfigEnv};
use openstack_client::nova::{Compute, CreateServer};
use openstack_client::{Session, SessionOptions};
use proto::csi::v1 as csi;
use proto::csi::v1::controller_client::ControllerClient;
use proto::csi::v1::volume_capability::access_mode::Mode;
use tonic::Code;
use tonic::transport::Channel;

mod common;
use common::{BIN, create_req, from_snapshot, from_volume, mount_cap, snapshot_req};

/// The test cloud's zones (tests/openstack/cloud.py).
const ZONES: [&str; 2] = ["az1", "az2"];

/// One test at a time: they attach to the cloud's one test server.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The plugin's bound for stuck attachments in these tests.
const STUCK_AFTER: Duration = Duration::from_secs(3);

struct RealEnv {
    h: CinderOnRealCloud,
    c: ControllerClient<Channel>,
    cinder: BlockStorage,
    nova: Compute,
}

/// The plugin as production runs it: a member of the project `demo`,
/// whose the test server is.
async fn real_env(test: &str) -> RealEnv {
    real_env_as(test, "cloud-member.conf").await
}

/// The plugin and the test's own Cinder and Nova with the credentials of
/// `conf` (`cloud-admin.conf`, or `cloud-member.conf`: a member of the
/// project `demo`, as production runs).
async fn real_env_as(test: &str, conf: &str) -> RealEnv {
    let dir = real_cloud_dir();
    let global = std::fs::read_to_string(dir.join(conf)).unwrap();
    let stuck = format!("--stuck-attachment-secs={}", STUCK_AFTER.as_secs());
    let h = CinderOnRealCloud::start_with(
        Path::new(BIN),
        &dir,
        &global,
        &[&stuck],
        Some(test_log(&format!("cinder-csi-real-{test}.log"))),
    )
    .await
    .unwrap();
    csi_sanity::harness::wait_until_ready(&h.socket)
        .await
        .unwrap();
    let ch = plugin_runtime::connect_unix(&h.socket).await.unwrap();
    let text = std::fs::read_to_string(dir.join(conf)).unwrap();
    let conf = CloudConf::from_texts(&[("c".into(), text)], ConfigEnv::default()).unwrap();
    let session = Session::new(conf.cloud("").unwrap(), SessionOptions::default()).unwrap();
    RealEnv {
        h,
        c: ControllerClient::new(ch),
        cinder: BlockStorage::new(session.clone()),
        nova: Compute::new(session),
    }
}

impl RealEnv {
    async fn volume(&mut self, what: &str) -> String {
        let r = create_req(&unique(what), mount_cap("ext4", Mode::SingleNodeWriter), 1);
        self.c
            .create_volume(r)
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap()
            .volume_id
    }

    async fn publish(&mut self, id: &str, node: &str) -> Result<(), tonic::Status> {
        self.c
            .controller_publish_volume(csi::ControllerPublishVolumeRequest {
                volume_id: id.into(),
                node_id: node.into(),
                volume_capability: Some(mount_cap("ext4", Mode::SingleNodeWriter)),
                ..Default::default()
            })
            .await
            .map(drop)
    }

    async fn unpublish(&mut self, id: &str, node: &str) -> Result<(), tonic::Status> {
        self.c
            .controller_unpublish_volume(csi::ControllerUnpublishVolumeRequest {
                volume_id: id.into(),
                node_id: node.into(),
                ..Default::default()
            })
            .await
            .map(drop)
    }

    async fn status(&self, id: &str) -> String {
        self.cinder.get_volume(id).await.unwrap().status.to_string()
    }

    async fn nova_lists(&self, server: &str, id: &str) -> bool {
        self.nova
            .list_volume_attachments(server)
            .await
            .unwrap()
            .iter()
            .any(|a| a.volume_id == id)
    }

    async fn delete(&mut self, id: &str) {
        self.c
            .delete_volume(csi::DeleteVolumeRequest {
                volume_id: id.into(),
                ..Default::default()
            })
            .await
            .unwrap();
    }

    /// A server of these credentials' project in the first zone, booted
    /// from a volume of its own: (server, boot volume).
    async fn boot(&self, what: &str) -> (String, String) {
        let boot = self
            .cinder
            .create_volume(&CreateVolume {
                name: unique(&format!("{what}-boot")),
                size_gib: 1,
                availability_zone: Some(ZONES[0].into()),
                ..Default::default()
            })
            .await
            .unwrap();
        eventually("boot volume available", 60, || async {
            self.status(&boot.id).await == "available"
        })
        .await;
        self.cinder.set_bootable(&boot.id, true).await.unwrap();
        let server = self
            .nova
            .create_server(&CreateServer {
                name: unique(what),
                flavor_ref: "test".into(),
                boot_volume_id: boot.id.clone(),
                availability_zone: Some(ZONES[0].into()),
            })
            .await
            .unwrap()
            .id;
        self.server_becomes(&server, "ACTIVE").await;
        (server, boot.id)
    }

    /// Deletes a server and waits until Nova no longer has it.
    async fn delete_server(&self, server: &str) {
        self.nova.delete_server(server).await.unwrap();
        eventually(&format!("server {server} deleted"), 120, || async {
            self.nova.get_server(server).await.is_err()
        })
        .await;
    }

    /// The boot volume of a deleted server, once Nova has released it.
    async fn delete_boot_volume(&self, boot: &str) {
        eventually("boot volume released", 60, || async {
            self.status(boot).await == "available"
        })
        .await;
        self.cinder.delete_volume(boot).await.unwrap();
    }

    /// Waits (bounded) until the server's status is `want`.
    async fn server_becomes(&self, server: &str, want: &str) {
        eventually(&format!("server {server} {want}"), 120, || async {
            self.nova.get_server(server).await.unwrap().status == want
        })
        .await;
    }
}

/// Waits until `done` answers true, polling twice a second; fails the
/// test, naming `what`, after `secs`.
async fn eventually<F, Fut>(what: &str, secs: u64, mut done: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let until = Instant::now() + Duration::from_secs(secs);
    while !done().await {
        assert!(Instant::now() < until, "{what}: not within {secs} s");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn zone(z: &str) -> csi::Topology {
    csi::Topology {
        segments: HashMap::from([(csi_cinder::TOPOLOGY_KEY.to_string(), z.to_string())]),
    }
}

#[tokio::test]
#[ignore = "needs the real test cloud (tests/openstack/cloud.py up block)"]
async fn a_restore_lands_in_its_snapshots_zone_on_real_cinder_or_is_refused() {
    let _serial = SERIAL.lock().await;
    let mut e = real_env("zones").await;
    let [az1, az2] = ZONES;
    let cap = || mount_cap("ext4", Mode::SingleNodeWriter);
    let mut r = create_req(&unique("zoned-src"), cap(), 1);
    r.accessibility_requirements = Some(csi::TopologyRequirement {
        requisite: vec![zone(az1)],
        preferred: vec![zone(az1)],
    });
    let src =
        e.c.create_volume(r)
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
    assert_eq!(src.accessible_topology, vec![zone(az1)]);
    let snap =
        e.c.create_snapshot(snapshot_req(&src.volume_id, &unique("zoned-snap"), &[]))
            .await
            .unwrap()
            .into_inner()
            .snapshot
            .unwrap();
    let mut made = Vec::new();
    for (what, source) in [
        ("snapshot", from_snapshot(&snap.snapshot_id)),
        ("source volume", from_volume(&src.volume_id)),
    ] {
        // a pod scheduled to a node of az2 (preferred), the class allowing
        // both zones: made in the source's zone, and the answer says so
        let mut r = create_req(&unique("zoned-ok"), cap(), 1);
        r.volume_content_source = source.clone();
        r.accessibility_requirements = Some(csi::TopologyRequirement {
            requisite: vec![zone(az1), zone(az2)],
            preferred: vec![zone(az2), zone(az1)],
        });
        let v =
            e.c.create_volume(r)
                .await
                .unwrap()
                .into_inner()
                .volume
                .unwrap();
        assert_eq!(v.accessible_topology, vec![zone(az1)], "{what}");
        assert_eq!(
            e.cinder
                .get_volume(&v.volume_id)
                .await
                .unwrap()
                .availability_zone,
            az1,
            "{what}"
        );
        made.push(v.volume_id);
        // only az2 allowed: refused before Cinder is asked
        let name = unique("zoned-no");
        let mut r = create_req(&name, cap(), 1);
        r.volume_content_source = source;
        r.accessibility_requirements = Some(csi::TopologyRequirement {
            requisite: vec![zone(az2)],
            preferred: vec![zone(az2)],
        });
        let err = e.c.create_volume(r).await.unwrap_err();
        assert_eq!(
            err.code(),
            Code::ResourceExhausted,
            "{what}: {}",
            err.message()
        );
        assert!(e.cinder.volumes_named(&name).await.unwrap().is_empty());
    }
    for id in made {
        e.c.delete_volume(csi::DeleteVolumeRequest {
            volume_id: id,
            ..Default::default()
        })
        .await
        .unwrap();
    }
    e.c.delete_snapshot(csi::DeleteSnapshotRequest {
        snapshot_id: snap.snapshot_id,
        ..Default::default()
    })
    .await
    .unwrap();
    e.c.delete_volume(csi::DeleteVolumeRequest {
        volume_id: src.volume_id,
        ..Default::default()
    })
    .await
    .unwrap();
}

// -------------------------------------------- what is stuck, repaired

#[tokio::test]
#[ignore = "needs the real test cloud (tests/openstack/cloud.py up block)"]
async fn a_reservation_nova_never_made_is_released_and_the_volume_attached() {
    let _serial = SERIAL.lock().await;
    let mut e = real_env("stale-reservation").await;
    let node = e.h.node_id.clone();
    let id = e.volume("reserved").await;
    // reserved for the node in Cinder (as Nova's API does first), by a
    // Nova that never went on
    e.cinder.create_attachment(&id, &node, None).await.unwrap();
    assert_eq!(e.status(&id).await, "reserved");
    tokio::time::sleep(STUCK_AFTER + Duration::from_secs(1)).await;
    e.publish(&id, &node).await.unwrap();
    assert_eq!(e.status(&id).await, "in-use");
    assert!(e.nova_lists(&node, &id).await, "attached through Nova");
    e.unpublish(&id, &node).await.unwrap();
    assert_eq!(e.status(&id).await, "available");
    e.delete(&id).await;
}

#[tokio::test]
#[ignore = "needs the real test cloud (tests/openstack/cloud.py up block)"]
async fn a_detach_nova_never_finished_is_asked_again() {
    let _serial = SERIAL.lock().await;
    let mut e = real_env("stuck-detach").await;
    let node = e.h.node_id.clone();
    let id = e.volume("detaching").await;
    e.publish(&id, &node).await.unwrap();
    // what Nova's API does before its host detaches, and then nothing
    e.cinder.begin_detaching(&id).await.unwrap();
    assert_eq!(e.status(&id).await, "detaching");
    tokio::time::sleep(STUCK_AFTER + Duration::from_secs(1)).await;
    e.unpublish(&id, &node).await.unwrap();
    assert_eq!(e.status(&id).await, "available");
    assert!(!e.nova_lists(&node, &id).await);
    e.delete(&id).await;
}

/// Cinder's attachments of `volumes` to `server`, made as a compute host
/// makes them, behind Nova's back: Nova does not delete them with the
/// server (as when Cinder was unreachable while the server was deleted).
async fn attach_behind_novas_back(e: &RealEnv, server: &str, volumes: &[&String]) {
    for id in volumes {
        let att = e
            .cinder
            .create_attachment(
                id,
                server,
                Some(serde_json::json!({"host": "gone", "initiator": "iqn.gone"})),
            )
            .await
            .unwrap();
        e.cinder.complete_attachment(&att.id).await.unwrap();
        assert_eq!(e.status(id).await, "in-use");
    }
}

#[tokio::test]
#[ignore = "needs the real test cloud (tests/openstack/cloud.py up block)"]
async fn volumes_held_by_a_server_that_is_gone_are_released() {
    let _serial = SERIAL.lock().await;
    let mut e = real_env("gone-server").await;
    let node = e.h.node_id.clone();
    // attached, says Cinder, to a server Nova then deleted
    let (gone, boot) = e.boot("gone").await;
    let (a, b) = (e.volume("gone-a").await, e.volume("gone-b").await);
    attach_behind_novas_back(&e, &gone, &[&a, &b]).await;
    e.delete_server(&gone).await;
    assert_eq!(e.status(&a).await, "in-use");
    // ControllerUnpublish from the gone server: released
    e.unpublish(&a, &gone).await.unwrap();
    assert_eq!(e.status(&a).await, "available");
    // ControllerPublish elsewhere: released, then attached there
    e.publish(&b, &node).await.unwrap();
    let v = e.cinder.get_volume(&b).await.unwrap();
    assert_eq!(
        v.attached_servers().collect::<Vec<_>>(),
        vec![node.as_str()]
    );
    assert!(e.nova_lists(&node, &b).await);
    e.unpublish(&b, &node).await.unwrap();
    for id in [&a, &b] {
        e.delete(id).await;
    }
    e.delete_boot_volume(&boot).await;
}

/// The plugin as a project member, as production runs it (as in every
/// test here). Real Nova answers it 404 for the admin project's live
/// server exactly as for a
/// deleted one: a volume an operator attached to such a server is never
/// released from it (one writer), while a server of the member's own
/// project that was deleted is told apart by Nova's record of its
/// actions, and its attachment released.
#[tokio::test]
#[ignore = "needs the real test cloud (tests/openstack/cloud.py up block)"]
async fn as_a_member_a_server_of_another_project_keeps_its_volume_and_a_deleted_one_releases_it() {
    let _serial = SERIAL.lock().await;
    let mut e = real_env("member-servers").await;
    let admin = real_env_admin_nova();
    // a server of the admin project (an operator's rescue VM)
    let operator = real_env_as("member-servers-operator", "cloud-admin.conf").await;
    let (operators_server, operators_boot) = operator.boot("operators-server").await;
    let (node, node_boot) = e.boot("member-node").await;

    // an operator attaches the member's volume to a server of the admin
    // project (a rescue VM)
    let held = e.volume("held-by-operator").await;
    admin
        .attach_volume(&operators_server, &held, false)
        .await
        .unwrap();
    eventually("attached to the operator's server", 60, || async {
        e.status(&held).await == "in-use"
    })
    .await;
    let err = e.publish(&held, &node).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{}", err.message());
    assert!(
        err.message().contains(&operators_server),
        "{}",
        err.message()
    );
    let lists = |server: String| {
        let admin = admin.clone();
        let held = held.clone();
        async move {
            admin
                .list_volume_attachments(&server)
                .await
                .unwrap()
                .iter()
                .any(|a| a.volume_id == held)
        }
    };
    assert!(
        lists(operators_server.clone()).await,
        "still on the operator's server"
    );
    assert!(
        !lists(node.clone()).await,
        "never on the member's node: one writer"
    );

    // a server of the member's own project, deleted while Cinder kept an
    // attachment of it: Nova shows the member its delete, and the volume
    // is released and attached to the node
    let (old, old_boot) = e.boot("member-old").await;
    let released = e.volume("held-by-deleted").await;
    attach_behind_novas_back(&e, &old, &[&released]).await;
    e.delete_server(&old).await;
    e.publish(&released, &node).await.unwrap();
    let v = e.cinder.get_volume(&released).await.unwrap();
    assert_eq!(
        v.attached_servers().collect::<Vec<_>>(),
        vec![node.as_str()]
    );

    e.unpublish(&released, &node).await.unwrap();
    admin.detach_volume(&operators_server, &held).await.unwrap();
    eventually("detached from the operator's server", 60, || async {
        e.status(&held).await == "available"
    })
    .await;
    for id in [&held, &released] {
        e.delete(id).await;
    }
    e.delete_server(&node).await;
    for boot in [&node_boot, &old_boot] {
        e.delete_boot_volume(boot).await;
    }
    operator.delete_server(&operators_server).await;
    operator.delete_boot_volume(&operators_boot).await;
}

/// Nova as the test cloud's admin (an operator) sees it.
fn real_env_admin_nova() -> Compute {
    let text = std::fs::read_to_string(real_cloud_dir().join("cloud-admin.conf")).unwrap();
    let conf = CloudConf::from_texts(&[("c".into(), text)], ConfigEnv::default()).unwrap();
    Compute::new(Session::new(conf.cloud("").unwrap(), SessionOptions::default()).unwrap())
}

#[tokio::test]
#[ignore = "needs the real test cloud (tests/openstack/cloud.py up block)"]
async fn an_attachment_nova_never_made_is_attached_anew() {
    let _serial = SERIAL.lock().await;
    let mut e = real_env("without-nova").await;
    let node = e.h.node_id.clone();
    let id = e.volume("phantom").await;
    let att = e
        .cinder
        .create_attachment(
            &id,
            &node,
            Some(serde_json::json!({"host": "x", "initiator": "iqn.x"})),
        )
        .await
        .unwrap();
    e.cinder.complete_attachment(&att.id).await.unwrap();
    assert_eq!(e.status(&id).await, "in-use");
    assert!(!e.nova_lists(&node, &id).await);
    e.publish(&id, &node).await.unwrap();
    assert!(e.nova_lists(&node, &id).await, "attached through Nova now");
    e.unpublish(&id, &node).await.unwrap();
    assert_eq!(e.status(&id).await, "available");
    e.delete(&id).await;
}

#[tokio::test]
#[ignore = "needs the real test cloud (tests/openstack/cloud.py up block)"]
async fn a_volume_is_detached_from_a_server_that_is_shut_off() {
    let _serial = SERIAL.lock().await;
    let mut e = real_env("shutoff").await;
    // a server of its own, booted from a volume, then shut off
    let (server, boot) = e.boot("shutoff").await;
    let id = e.volume("on-shutoff").await;
    e.publish(&id, &server).await.unwrap();
    e.nova.stop_server(&server).await.unwrap();
    e.server_becomes(&server, "SHUTOFF").await;
    e.unpublish(&id, &server).await.unwrap();
    assert_eq!(e.status(&id).await, "available");
    assert!(!e.nova_lists(&server, &id).await);
    e.delete(&id).await;
    e.delete_server(&server).await;
    e.delete_boot_volume(&boot).await;
}

/// The orphan report against real Cinder and a stand-in apiserver: what
/// the controller made carries the identity the apiserver answered with
/// (real Cinder keeps the metadata key, and its snapshot inherits it),
/// another cluster's volume under the same cluster id is never a
/// candidate, and a volume a PV names is in use.
#[tokio::test]
#[ignore = "needs the real test cloud (tests/openstack/cloud.py up block)"]
async fn the_orphan_report_tells_real_cinders_volumes_apart() {
    use csi_sanity::harness::kube::{CLUSTER_UID, StandInApiserver};
    let _serial = SERIAL.lock().await;
    let api = StandInApiserver::start().await.unwrap();
    let dir = real_cloud_dir();
    let global = std::fs::read_to_string(dir.join("cloud-member.conf")).unwrap();
    let flags = api.flags();
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let h = CinderOnRealCloud::start_with(
        Path::new(BIN),
        &dir,
        &global,
        &flags,
        Some(test_log("cinder-csi-real-orphans.log")),
    )
    .await
    .unwrap();
    csi_sanity::harness::wait_until_ready(&h.socket)
        .await
        .unwrap();
    let ch = plugin_runtime::connect_unix(&h.socket).await.unwrap();
    let conf = CloudConf::from_texts(&[("c".into(), global)], ConfigEnv::default()).unwrap();
    let session = Session::new(conf.cloud("").unwrap(), SessionOptions::default()).unwrap();
    let mut e = RealEnv {
        h,
        c: ControllerClient::new(ch),
        cinder: BlockStorage::new(session.clone()),
        nova: Compute::new(session),
    };
    let named = e.volume("orphan-named").await;
    let gone = e.volume("orphan-gone").await;
    let snapshot =
        e.c.create_snapshot(snapshot_req(&gone, &unique("orphan-snap"), &[]))
            .await
            .unwrap()
            .into_inner()
            .snapshot
            .unwrap()
            .snapshot_id;
    let theirs = e
        .cinder
        .create_volume(&CreateVolume {
            name: unique("pvc-of-another-cluster"),
            size_gib: 1,
            metadata: [
                (
                    "cinder.csi.openstack.org/cluster".to_string(),
                    "sanity-real".to_string(),
                ),
                (
                    "cinder.csi.openstack.org/cluster-uid".to_string(),
                    "uid-of-another".to_string(),
                ),
            ]
            .into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .id;
    let identity = e.cinder.get_volume(&gone).await.unwrap().metadata;
    assert_eq!(
        identity
            .get("cinder.csi.openstack.org/cluster-uid")
            .map(String::as_str),
        Some(CLUSTER_UID),
        "{identity:?}"
    );
    api.objects().pvs = vec![("cinder.csi.openstack.org".into(), named.clone())];
    let report = api
        .orphan_report(
            Path::new(BIN),
            &dir.join("cloud-member.conf"),
            &[
                "--cluster=sanity-real",
                "--drivername=cinder.csi.openstack.org",
                "--older-than=0s",
            ],
        )
        .await
        .unwrap();
    let ids = |key: &str| report.ids(key);
    let (orphans, unproven) = (ids("orphans"), ids("unproven"));
    for id in [&gone, &snapshot] {
        assert!(orphans.contains(id), "{id} is an orphan: {report:#}");
    }
    assert!(unproven.contains(&theirs), "another cluster's: {report:#}");
    assert!(
        !orphans.contains(&named) && !unproven.contains(&named),
        "the named volume is in use: {report:#}"
    );
    e.c.delete_snapshot(csi::DeleteSnapshotRequest {
        snapshot_id: snapshot,
        ..Default::default()
    })
    .await
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    for id in [named, gone] {
        // a volume goes once its snapshot has
        while let Err(status) =
            e.c.delete_volume(csi::DeleteVolumeRequest {
                volume_id: id.clone(),
                ..Default::default()
            })
            .await
        {
            assert!(Instant::now() < deadline, "{id}: {status}");
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
    while e.cinder.delete_volume(&theirs).await.is_err() && Instant::now() < deadline {
        // still creating: Cinder deletes it once it is available
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Metadata from classes on real Cinder, as a member: a StorageClass's
/// and a VolumeAttributesClass's `metadata.<key>` at creation, then a
/// class change by ControllerModifyVolume: the key the former class alone
/// set is removed by its URL, the type never changes.
#[tokio::test]
#[ignore = "needs the real test cloud (tests/openstack/cloud.py up block)"]
async fn classes_change_a_volumes_metadata_on_real_cinder_without_a_retype() {
    let _serial = SERIAL.lock().await;
    let mut e = real_env("class-metadata").await;
    let mut r = create_req(
        &unique("class-metadata"),
        mount_cap("ext4", Mode::SingleNodeWriter),
        1,
    );
    r.parameters = HashMap::from([("metadata.owner".to_string(), "ops".to_string())]);
    r.mutable_parameters = HashMap::from([
        ("metadata.billing".to_string(), "team-a".to_string()),
        ("metadata.backup".to_string(), "daily".to_string()),
    ]);
    let id =
        e.c.create_volume(r)
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap()
            .volume_id;
    let before = e.cinder.get_volume(&id).await.unwrap();
    let md = &before.metadata;
    assert_eq!(md.get("owner").map(String::as_str), Some("ops"));
    assert_eq!(md.get("billing").map(String::as_str), Some("team-a"));
    assert_eq!(md.get("backup").map(String::as_str), Some("daily"));
    e.c.controller_modify_volume(csi::ControllerModifyVolumeRequest {
        volume_id: id.clone(),
        mutable_parameters: HashMap::from([("metadata.billing".to_string(), "team-b".to_string())]),
        ..Default::default()
    })
    .await
    .unwrap();
    let after = e.cinder.get_volume(&id).await.unwrap();
    assert_eq!(
        after.metadata.get("billing").map(String::as_str),
        Some("team-b")
    );
    assert_eq!(
        after.metadata.get("backup"),
        None,
        "the former class's key stayed"
    );
    assert_eq!(after.metadata.get("owner").map(String::as_str), Some("ops"));
    assert_eq!(after.volume_type, before.volume_type, "retyped");
    assert_eq!(after.status.to_string(), "available");
    e.delete(&id).await;
}
