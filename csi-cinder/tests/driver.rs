//! `cinder-csi-plugin` through its socket against the emulator, whose
//! hypervisor turns attachments into loop devices: controller behaviour
//! beyond the conformance suite, data safety on real filesystems, faults,
//! and bad input. Tests needing root return early (and say so) without it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::Duration;

use csi_sanity::harness::{CinderOnEmulator, HarnessOptions};
use openstack_client::cinder::BlockStorage;
use openstack_client::config::{CloudConf, ConfigEnv};
use openstack_client::{Session, SessionOptions};
use openstack_emulator::{Delays, FaultAction, FaultRule, Quotas};
use proto::csi::v1 as csi;
use proto::csi::v1::controller_client::ControllerClient;
use proto::csi::v1::node_client::NodeClient;
use proto::csi::v1::volume_capability::access_mode::Mode;
use tonic::Code;
use tonic::transport::Channel;

const BIN: &str = env!("CARGO_BIN_EXE_cinder-csi-plugin");
const GIB: i64 = 1 << 30;

fn root() -> bool {
    openstack_emulator::preconditions::root("loop devices, mounts")
}

struct Env {
    h: CinderOnEmulator,
    c: ControllerClient<Channel>,
    n: NodeClient<Channel>,
    cinder: BlockStorage,
}

async fn env_with(extra_args: &[&str]) -> Env {
    let mut o = HarnessOptions::new(BIN);
    o.extra_args = extra_args.iter().map(|s| s.to_string()).collect();
    let h = CinderOnEmulator::start(o).await.unwrap();
    let ch = plugin_runtime::connect_unix(&h.socket).await.unwrap();
    csi_sanity::harness::wait_until_ready(&h.socket)
        .await
        .unwrap();
    let cinder = cinder_of(&h);
    Env {
        c: ControllerClient::new(ch.clone()),
        n: NodeClient::new(ch),
        h,
        cinder,
    }
}

/// Cinder of the emulator, as the plugin's credentials see it.
fn cinder_of(h: &CinderOnEmulator) -> BlockStorage {
    let conf = CloudConf::from_texts(
        &[("c".into(), h.emulator.cloud_conf())],
        ConfigEnv::default(),
    )
    .unwrap();
    BlockStorage::new(Session::new(conf.cloud("").unwrap(), SessionOptions::default()).unwrap())
}

async fn env() -> Env {
    env_with(&[]).await
}

fn mount_cap(fs: &str, mode: Mode) -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_type: Some(csi::volume_capability::AccessType::Mount(
            csi::volume_capability::MountVolume {
                fs_type: fs.into(),
                mount_flags: vec![],
                volume_mount_group: String::new(),
            },
        )),
        access_mode: Some(csi::volume_capability::AccessMode { mode: mode as i32 }),
    }
}

fn block_cap(mode: Mode) -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_type: Some(csi::volume_capability::AccessType::Block(
            csi::volume_capability::BlockVolume {},
        )),
        access_mode: Some(csi::volume_capability::AccessMode { mode: mode as i32 }),
    }
}

fn create_req(name: &str, cap: csi::VolumeCapability, gib: i64) -> csi::CreateVolumeRequest {
    csi::CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: gib * GIB,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![cap],
        ..Default::default()
    }
}

fn timed<T>(msg: T, timeout: Duration) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.set_timeout(timeout);
    r
}

impl Env {
    async fn create(&mut self, name: &str, cap: csi::VolumeCapability, gib: i64) -> csi::Volume {
        self.c
            .create_volume(create_req(name, cap, gib))
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap()
    }

    async fn publish(&mut self, id: &str, cap: csi::VolumeCapability) {
        self.c
            .controller_publish_volume(csi::ControllerPublishVolumeRequest {
                volume_id: id.into(),
                node_id: self.h.node_id.clone(),
                volume_capability: Some(cap),
                ..Default::default()
            })
            .await
            .unwrap();
    }

    async fn unpublish(&mut self, id: &str) {
        self.c
            .controller_unpublish_volume(csi::ControllerUnpublishVolumeRequest {
                volume_id: id.into(),
                node_id: self.h.node_id.clone(),
                secrets: HashMap::new(),
            })
            .await
            .unwrap();
    }

    fn stage_req(
        &self,
        v: &csi::Volume,
        cap: csi::VolumeCapability,
    ) -> csi::NodeStageVolumeRequest {
        let (staging, _) = self.h.paths(&v.volume_id);
        csi::NodeStageVolumeRequest {
            volume_id: v.volume_id.clone(),
            staging_target_path: staging.to_string_lossy().into(),
            volume_capability: Some(cap),
            volume_context: v.volume_context.clone(),
            ..Default::default()
        }
    }

    async fn stage(
        &mut self,
        v: &csi::Volume,
        cap: csi::VolumeCapability,
    ) -> Result<(), tonic::Status> {
        let r = self.stage_req(v, cap);
        self.n.node_stage_volume(r).await.map(drop)
    }

    /// A new volume, attached and staged: the volume and its staging path.
    async fn staged(
        &mut self,
        name: &str,
        cap: csi::VolumeCapability,
        gib: i64,
    ) -> (csi::Volume, std::path::PathBuf) {
        let v = self.create(name, cap.clone(), gib).await;
        self.publish(&v.volume_id, cap.clone()).await;
        self.stage(&v, cap).await.unwrap();
        let (staging, _) = self.h.paths(&v.volume_id);
        (v, staging)
    }

    async fn unstage(&mut self, id: &str) {
        let (staging, _) = self.h.paths(id);
        self.n
            .node_unstage_volume(csi::NodeUnstageVolumeRequest {
                volume_id: id.into(),
                staging_target_path: staging.to_string_lossy().into(),
            })
            .await
            .unwrap();
    }

    fn device(&self, id: &str) -> std::path::PathBuf {
        self.h
            .by_id_dir
            .join(openstack_emulator::hypervisor::by_id_name(id))
            .canonicalize()
            .unwrap()
    }

    /// Volumes named `name` that are not being deleted.
    async fn named(&self, name: &str) -> Vec<openstack_client::cinder::Volume> {
        self.cinder
            .volumes_named(name)
            .await
            .unwrap()
            .into_iter()
            .filter(|v| v.status.as_str() != "deleting")
            .collect()
    }
}

fn run(cmd: &str, args: &[&str]) {
    let out = std::process::Command::new(cmd).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{cmd} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Mounts `device` on a private directory, runs `f` on it, unmounts.
fn with_mounted<T>(device: &Path, fs: &str, f: impl FnOnce(&Path) -> T) -> T {
    let dir = tempfile::tempdir().unwrap();
    let opts = if fs == "xfs" { Some("nouuid") } else { None };
    nix::mount::mount(
        Some(device),
        dir.path(),
        Some(fs),
        nix::mount::MsFlags::empty(),
        opts,
    )
    .unwrap();
    let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(dir.path())));
    nix::mount::umount2(dir.path(), nix::mount::MntFlags::MNT_DETACH).unwrap();
    out.unwrap()
}

// ------------------------------------------------------------- controller

#[tokio::test]
async fn create_volume_validates_before_calling_openstack() {
    if !root() {
        return;
    }
    let mut e = env().await;
    e.h.emulator.control().clear_calls();
    let cases: Vec<(&str, csi::CreateVolumeRequest, Code)> = vec![
        (
            "malformed class parameter",
            {
                let mut r = create_req("p1", mount_cap("ext4", Mode::SingleNodeWriter), 1);
                r.parameters.insert("fsType".into(), "zfs".into());
                r
            },
            Code::InvalidArgument,
        ),
        (
            "RWX filesystem",
            create_req("p2", mount_cap("ext4", Mode::MultiNodeMultiWriter), 1),
            Code::InvalidArgument,
        ),
        (
            "limit below a whole GiB",
            {
                let mut r = create_req("p3", mount_cap("ext4", Mode::SingleNodeWriter), 1);
                r.capacity_range = Some(csi::CapacityRange {
                    required_bytes: 10,
                    limit_bytes: 1 << 20,
                });
                r
            },
            Code::OutOfRange,
        ),
        (
            "negative size",
            {
                let mut r = create_req("p4", mount_cap("ext4", Mode::SingleNodeWriter), 1);
                r.capacity_range = Some(csi::CapacityRange {
                    required_bytes: -5,
                    limit_bytes: 0,
                });
                r
            },
            Code::InvalidArgument,
        ),
        (
            "overflowing size",
            {
                let mut r = create_req("p5", mount_cap("ext4", Mode::SingleNodeWriter), 1);
                r.capacity_range = Some(csi::CapacityRange {
                    required_bytes: i64::MAX,
                    limit_bytes: 0,
                });
                r
            },
            Code::OutOfRange,
        ),
        (
            "unknown filesystem",
            create_req("p6", mount_cap("ntfs", Mode::SingleNodeWriter), 1),
            Code::InvalidArgument,
        ),
        (
            "mount flag that rebinds",
            {
                let mut cap = mount_cap("ext4", Mode::SingleNodeWriter);
                if let Some(csi::volume_capability::AccessType::Mount(m)) = &mut cap.access_type {
                    m.mount_flags = vec!["bind".into()];
                }
                create_req("p7", cap, 1)
            },
            Code::InvalidArgument,
        ),
        (
            "unknown cloud in the secret",
            {
                let mut r = create_req("p8", mount_cap("ext4", Mode::SingleNodeWriter), 1);
                r.secrets.insert("cloud".into(), "elsewhere".into());
                r
            },
            Code::InvalidArgument,
        ),
    ];
    for (what, req, code) in cases {
        let err = e.c.create_volume(req).await.unwrap_err();
        assert_eq!(err.code(), code, "{what}: {}", err.message());
        assert!(!err.message().is_empty(), "{what}: empty message");
    }
    let calls = e.h.emulator.control().calls();
    assert!(
        calls.iter().all(|c| !c.path.contains("/volume")),
        "OpenStack was called: {calls:?}"
    );
    let err =
        e.c.create_volume({
            let mut r = create_req("p9", mount_cap("ext4", Mode::SingleNodeWriter), 1);
            // a legacy fsType the node cannot make
            r.parameters.insert("fsType".into(), "zfs".into());
            r
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message().contains("fsType"),
        "the message names the parameter: {}",
        err.message()
    );
}

#[tokio::test]
async fn create_volume_topology_metadata_and_multiattach() {
    if !root() {
        return;
    }
    let mut e = env().await;
    // preferred zone wins over requisite; the answer is the volume's zone
    let mut r = create_req("topo", mount_cap("ext4", Mode::SingleNodeWriter), 1);
    let zone = |z: &str| csi::Topology {
        segments: HashMap::from([(csi_cinder::TOPOLOGY_KEY.to_string(), z.to_string())]),
    };
    r.accessibility_requirements = Some(csi::TopologyRequirement {
        requisite: vec![zone("nova"), zone("zone-b")],
        preferred: vec![zone("zone-b")],
    });
    r.parameters
        .insert("csi.storage.k8s.io/pvc/name".into(), "data".into());
    r.parameters
        .insert("csi.storage.k8s.io/pvc/namespace".into(), "team-a".into());
    let v =
        e.c.create_volume(r)
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
    assert_eq!(v.accessible_topology, vec![zone("zone-b")]);
    let got = e.cinder.get_volume(&v.volume_id).await.unwrap();
    assert_eq!(got.availability_zone, "zone-b");
    assert_eq!(
        got.status.as_str(),
        "available",
        "CreateVolume answers once the volume is available"
    );
    assert_eq!(
        got.metadata
            .get("csi.storage.k8s.io/pvc/name")
            .map(String::as_str),
        Some("data")
    );
    assert_eq!(
        got.metadata
            .get("cinder.csi.openstack.org/cluster")
            .map(String::as_str),
        Some("sanity")
    );

    // `availability` overrides topology
    let mut r = create_req("avail", mount_cap("ext4", Mode::SingleNodeWriter), 1);
    r.parameters.insert("availability".into(), "nova".into());
    r.accessibility_requirements = Some(csi::TopologyRequirement {
        requisite: vec![],
        preferred: vec![zone("zone-b")],
    });
    let v =
        e.c.create_volume(r)
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
    assert_eq!(v.accessible_topology, vec![zone("nova")]);

    // several nodes: only raw block on a multiattach type
    let mut r = create_req("shared", block_cap(Mode::MultiNodeMultiWriter), 1);
    let err = e.c.create_volume(r.clone()).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{}", err.message());
    r.parameters.insert("type".into(), "multiattach".into());
    let v =
        e.c.create_volume(r)
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
    assert!(e.cinder.get_volume(&v.volume_id).await.unwrap().multiattach);
    // the same name with another type is a different volume
    let mut other = create_req("shared", block_cap(Mode::SingleNodeWriter), 1);
    other.parameters.insert("type".into(), "__DEFAULT__".into());
    assert_eq!(
        e.c.create_volume(other).await.unwrap_err().code(),
        Code::AlreadyExists
    );
}

#[tokio::test]
async fn concurrent_identical_creates_make_one_volume() {
    if !root() {
        return;
    }
    let e = env().await;
    let mut tasks = Vec::new();
    for _ in 0..10 {
        let mut c = e.c.clone();
        tasks.push(tokio::spawn(async move {
            c.create_volume(create_req(
                "burst",
                mount_cap("ext4", Mode::SingleNodeWriter),
                1,
            ))
            .await
            .map(|r| r.into_inner().volume.unwrap().volume_id)
        }));
    }
    let mut ids = Vec::new();
    for t in tasks {
        ids.push(t.await.unwrap().unwrap());
    }
    ids.dedup();
    assert_eq!(ids.len(), 1, "{ids:?}");
    assert_eq!(e.named("burst").await.len(), 1);
}

#[tokio::test]
async fn quota_and_backend_failures_leave_nothing_behind() {
    if !root() {
        return;
    }
    let mut e = env().await;
    e.h.emulator.control().set_quotas(Quotas {
        volumes: 0,
        ..Quotas::default()
    });
    let err =
        e.c.create_volume(create_req(
            "quota",
            mount_cap("ext4", Mode::SingleNodeWriter),
            1,
        ))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{}", err.message());
    assert!(e.named("quota").await.is_empty());
    e.h.emulator.control().set_quotas(Quotas::default());

    e.h.emulator.control().fail_next_volume_creates(1);
    let err =
        e.c.create_volume(create_req(
            "fails",
            mount_cap("ext4", Mode::SingleNodeWriter),
            1,
        ))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Internal, "{}", err.message());
    assert!(err.message().contains("deleted"), "{}", err.message());
    assert!(
        e.named("fails").await.is_empty(),
        "the failed volume is deleted"
    );
    // the provisioner's retry succeeds
    let v = e
        .create("fails", mount_cap("ext4", Mode::SingleNodeWriter), 1)
        .await;
    assert_eq!(e.named("fails").await.len(), 1);
    assert_eq!(e.named("fails").await[0].id, v.volume_id);
}

#[tokio::test]
async fn attachments_respect_other_servers_and_gone_servers() {
    if !root() {
        return;
    }
    let mut e = env().await;
    let cap = mount_cap("ext4", Mode::SingleNodeWriter);
    let v = e.create("att", cap.clone(), 1).await;
    e.publish(&v.volume_id, cap.clone()).await;
    let other =
        e.h.emulator
            .control()
            .create_server("admin", "node-2", "nova")
            .unwrap();
    let err =
        e.c.controller_publish_volume(csi::ControllerPublishVolumeRequest {
            volume_id: v.volume_id.clone(),
            node_id: other.clone(),
            volume_capability: Some(cap.clone()),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{}", err.message());
    // unpublishing from a node it is not attached to changes nothing
    e.c.controller_unpublish_volume(csi::ControllerUnpublishVolumeRequest {
        volume_id: v.volume_id.clone(),
        node_id: other,
        secrets: HashMap::new(),
    })
    .await
    .unwrap();
    assert_eq!(
        e.cinder
            .get_volume(&v.volume_id)
            .await
            .unwrap()
            .attachments
            .len(),
        1
    );
    // still attached: DeleteVolume refuses, ControllerGetVolume lists the node
    let err =
        e.c.delete_volume(csi::DeleteVolumeRequest {
            volume_id: v.volume_id.clone(),
            secrets: HashMap::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    let got =
        e.c.controller_get_volume(csi::ControllerGetVolumeRequest {
            volume_id: v.volume_id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        got.status.unwrap().published_node_ids,
        vec![e.h.node_id.clone()]
    );

    // a multiattach block volume goes to two servers
    let mut r = create_req("multi", block_cap(Mode::MultiNodeMultiWriter), 1);
    r.parameters.insert("type".into(), "multiattach".into());
    let m =
        e.c.create_volume(r)
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
    let node2 =
        e.h.emulator
            .control()
            .create_server("admin", "node-3", "nova")
            .unwrap();
    for node in [e.h.node_id.clone(), node2.clone()] {
        e.c.controller_publish_volume(csi::ControllerPublishVolumeRequest {
            volume_id: m.volume_id.clone(),
            node_id: node,
            volume_capability: Some(block_cap(Mode::MultiNodeMultiWriter)),
            ..Default::default()
        })
        .await
        .unwrap();
    }
    let servers: Vec<String> = e
        .cinder
        .get_volume(&m.volume_id)
        .await
        .unwrap()
        .attached_servers()
        .map(str::to_string)
        .collect();
    assert_eq!(servers.len(), 2, "{servers:?}");
    // detaching from one server keeps the other attachment
    e.c.controller_unpublish_volume(csi::ControllerUnpublishVolumeRequest {
        volume_id: m.volume_id.clone(),
        node_id: node2,
        secrets: HashMap::new(),
    })
    .await
    .unwrap();
    let servers: Vec<String> = e
        .cinder
        .get_volume(&m.volume_id)
        .await
        .unwrap()
        .attached_servers()
        .map(str::to_string)
        .collect();
    assert_eq!(servers, vec![e.h.node_id.clone()]);
}

#[tokio::test]
async fn modify_volume_retypes_records_claim_keys_and_refuses_unknown_parameters() {
    if !root() {
        return;
    }
    let mut e = env().await;
    let v = e
        .create("retype", mount_cap("ext4", Mode::SingleNodeWriter), 1)
        .await;
    let modify = |params: &[(&str, &str)]| csi::ControllerModifyVolumeRequest {
        volume_id: v.volume_id.clone(),
        secrets: HashMap::new(),
        mutable_parameters: params
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    };
    let err =
        e.c.controller_modify_volume(modify(&[("iops", "3000")]))
            .await
            .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    let err =
        e.c.controller_modify_volume(modify(&[("type", "no-such-type")]))
            .await
            .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{}", err.message());
    e.c.controller_modify_volume(modify(&[("type", "multiattach")]))
        .await
        .unwrap();
    assert_eq!(
        e.cinder
            .get_volume(&v.volume_id)
            .await
            .unwrap()
            .volume_type
            .as_deref(),
        Some("multiattach")
    );
    e.c.controller_modify_volume(modify(&[("type", "multiattach")]))
        .await
        .unwrap();
    // csi-resizer --extra-modify-metadata adds the claim's keys: accepted
    // and recorded, as the provisioner's are at creation
    e.c.controller_modify_volume(modify(&[
        ("type", "multiattach"),
        ("csi.storage.k8s.io/pvc/name", "data"),
        ("csi.storage.k8s.io/pvc/namespace", "apps"),
        ("csi.storage.k8s.io/pv/name", "pvc-1"),
    ]))
    .await
    .unwrap();
    let md = e.cinder.get_volume(&v.volume_id).await.unwrap().metadata;
    assert_eq!(
        md.get("csi.storage.k8s.io/pvc/name").map(String::as_str),
        Some("data")
    );
    assert_eq!(
        md.get("csi.storage.k8s.io/pv/name").map(String::as_str),
        Some("pvc-1")
    );
}

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
    if !root() {
        return;
    }
    let mut e = env().await;
    // xfs: growing ext4 online needs CAP_SYS_RESOURCE, which this
    // machine's root lacks (resize2fs: "Permission denied")
    let xfs = mount_cap("xfs", Mode::SingleNodeWriter);
    let (v, staging) = e.staged("origin", xfs.clone(), 1).await;
    std::fs::write(staging.join("snapshotted"), b"v1").unwrap();
    nix::unistd::sync();
    e.unstage(&v.volume_id).await;
    e.unpublish(&v.volume_id).await;
    let snap =
        e.c.create_snapshot(csi::CreateSnapshotRequest {
            source_volume_id: v.volume_id.clone(),
            name: "snap-1".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap();
    assert!(snap.ready_to_use);
    let mut r = create_req("restored", xfs.clone(), 3);
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
    e.publish(&restored.volume_id, xfs.clone()).await;
    e.stage(&restored, xfs.clone()).await.unwrap();
    let (staging_r, _) = e.h.paths(&restored.volume_id);
    assert_eq!(std::fs::read(staging_r.join("snapshotted")).unwrap(), b"v1");
    let usage = host_ops::volume_usage(&staging_r).unwrap();
    assert!(
        usage.total_bytes > 2 * GIB as u64,
        "filesystem not grown: {usage:?}"
    );
    e.unstage(&restored.volume_id).await;
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
    e.c.controller_expand_volume(csi::ControllerExpandVolumeRequest {
        volume_id: v.volume_id.clone(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: 2 * GIB,
            limit_bytes: 0,
        }),
        volume_capability: Some(btrfs.clone()),
        ..Default::default()
    })
    .await
    .unwrap();
    e.n.node_expand_volume(csi::NodeExpandVolumeRequest {
        volume_id: v.volume_id.clone(),
        volume_path: staging.to_string_lossy().into(),
        staging_target_path: staging.to_string_lossy().into(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: 2 * GIB,
            limit_bytes: 0,
        }),
        volume_capability: Some(btrfs.clone()),
        ..Default::default()
    })
    .await
    .unwrap();
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

fn snapshot_req(source: &str, name: &str, params: &[(&str, &str)]) -> csi::CreateSnapshotRequest {
    csi::CreateSnapshotRequest {
        source_volume_id: source.into(),
        name: name.into(),
        parameters: params
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..Default::default()
    }
}

fn from_snapshot(id: &str) -> Option<csi::VolumeContentSource> {
    Some(csi::VolumeContentSource {
        r#type: Some(csi::volume_content_source::Type::Snapshot(
            csi::volume_content_source::SnapshotSource {
                snapshot_id: id.into(),
            },
        )),
    })
}

#[tokio::test]
async fn backup_snapshots_restore_outlive_their_volume_and_delete_cleanly() {
    if !root() {
        return;
    }
    let mut e = env().await;
    let xfs = mount_cap("xfs", Mode::SingleNodeWriter);
    let (v, staging) = e.staged("backed-up", xfs.clone(), 1).await;
    std::fs::write(staging.join("kept"), b"in the backup").unwrap();
    nix::unistd::sync();

    // an attached volume is backed up only when the class says so, and
    // the refusal says how
    let err =
        e.c.create_snapshot(snapshot_req(&v.volume_id, "bk-1", &[("type", "backup")]))
            .await
            .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{}", err.message());
    assert!(
        err.message().contains("force-create: \"true\""),
        "{}",
        err.message()
    );
    let params = [("type", "backup"), ("force-create", "true")];
    let first =
        e.c.create_snapshot(snapshot_req(&v.volume_id, "bk-1", &params))
            .await
            .unwrap()
            .into_inner()
            .snapshot
            .unwrap();
    assert_eq!(first.source_volume_id, v.volume_id);
    // the snapshotter polls until ready; the id is the backup's
    let mut ready = first.ready_to_use;
    for _ in 0..100 {
        if ready {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        let again =
            e.c.create_snapshot(snapshot_req(&v.volume_id, "bk-1", &params))
                .await
                .unwrap()
                .into_inner()
                .snapshot
                .unwrap();
        assert_eq!(again.snapshot_id, first.snapshot_id, "one backup per name");
        ready = again.ready_to_use;
    }
    assert!(ready, "backup never became ready");
    let id = first.snapshot_id.clone();
    let backup = e.cinder.get_backup(&id).await.unwrap();
    assert_eq!(backup.volume_id, v.volume_id);
    // the snapshot it was made from is not left behind
    let leftover: Vec<_> = e
        .cinder
        .list_snapshots(&openstack_client::cinder::ListSnapshots {
            volume_id: Some(v.volume_id.clone()),
            ..Default::default()
        })
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|s| s.status.as_str() != "deleting")
        .collect();
    assert!(leftover.is_empty(), "{leftover:?}");
    let got =
        e.c.get_snapshot(csi::GetSnapshotRequest {
            snapshot_id: id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap();
    assert!(got.ready_to_use);
    let listed =
        e.c.list_snapshots(csi::ListSnapshotsRequest {
            snapshot_id: id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .entries;
    assert_eq!(listed.len(), 1);

    // a backup outlives its volume
    e.unstage(&v.volume_id).await;
    e.unpublish(&v.volume_id).await;
    e.c.delete_volume(csi::DeleteVolumeRequest {
        volume_id: v.volume_id.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    let mut r = create_req("from-backup", xfs.clone(), 2);
    r.volume_content_source = from_snapshot(&id);
    let restored =
        e.c.create_volume(r.clone())
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
    assert_eq!(restored.content_source, r.volume_content_source);
    assert_eq!(
        restored
            .volume_context
            .get("cinder.csi.openstack.org/resizeRequired")
            .map(String::as_str),
        Some("true")
    );
    // idempotent: the same answer, no second volume
    let again =
        e.c.create_volume(r)
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
    assert_eq!(again.volume_id, restored.volume_id);
    e.publish(&restored.volume_id, xfs.clone()).await;
    e.stage(&restored, xfs.clone()).await.unwrap();
    let (staging_r, _) = e.h.paths(&restored.volume_id);
    assert_eq!(
        std::fs::read(staging_r.join("kept")).unwrap(),
        b"in the backup"
    );
    e.unstage(&restored.volume_id).await;

    // deleting it: gone when the call answers, and again is fine
    for _ in 0..2 {
        e.c.delete_snapshot(csi::DeleteSnapshotRequest {
            snapshot_id: id.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
        assert!(e.cinder.get_backup(&id).await.unwrap_err().is_not_found());
    }
    let err =
        e.c.get_snapshot(csi::GetSnapshotRequest {
            snapshot_id: id.clone(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);

    // a class type this driver does not know is refused, naming it
    let err =
        e.c.create_snapshot(snapshot_req(
            &restored.volume_id,
            "bk-2",
            &[("type", "replica")],
        ))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("type"), "{}", err.message());
}

#[tokio::test]
async fn legacy_fs_type_formats_and_unknown_class_keys_are_ignored() {
    if !root() {
        return;
    }
    let mut e = env().await;
    // an in-tree StorageClass: fsType, and a key upstream ignores
    let mut r = create_req("legacy", mount_cap("", Mode::SingleNodeWriter), 1);
    r.parameters.insert("fsType".into(), "xfs".into());
    r.parameters.insert("someOldKey".into(), "x".into());
    let v =
        e.c.create_volume(r)
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
    let cap = mount_cap("", Mode::SingleNodeWriter);
    e.publish(&v.volume_id, cap.clone()).await;
    e.stage(&v, cap.clone()).await.unwrap();
    let (staging, _) = e.h.paths(&v.volume_id);
    let mounts = host_ops::mounts_at(&staging).unwrap();
    assert_eq!(
        mounts.last().map(|m| m.fs_type.as_str()),
        Some("xfs"),
        "{mounts:?}"
    );
    e.unstage(&v.volume_id).await;
    e.unpublish(&v.volume_id).await;
}

/// Where Nova sets no limit (its default), the controller keeps the
/// server within `[BlockStorage] node-volume-attach-limit`, counting the
/// server's own disks as Nova does; the node reports the same limit less
/// the disks Kubernetes does not manage, live: a volume attached and not
/// staged (by hand) takes one, a staged one does not.
#[tokio::test]
async fn the_attach_limit_holds_without_nova_and_the_node_reports_what_is_left() {
    if !root() {
        return;
    }
    let mut o = HarnessOptions::new(BIN);
    o.extra_cloud_conf = "\n[BlockStorage]\nnode-volume-attach-limit = 4\n".into();
    let h = CinderOnEmulator::start(o).await.unwrap();
    let ch = plugin_runtime::connect_unix(&h.socket).await.unwrap();
    csi_sanity::harness::wait_until_ready(&h.socket)
        .await
        .unwrap();
    let (mut c, mut n) = (ControllerClient::new(ch.clone()), NodeClient::new(ch));
    let own = csi_sanity::harness::cinder::own_disks_of_this_machine() as i64;
    let max = |n: &mut NodeClient<Channel>| {
        let mut n = n.clone();
        async move {
            n.node_get_info(csi::NodeGetInfoRequest {})
                .await
                .unwrap()
                .into_inner()
                .max_volumes_per_node
        }
    };
    assert_eq!(
        max(&mut n).await,
        4 - own,
        "the limit less the server's own disks"
    );
    let cap = mount_cap("ext4", Mode::SingleNodeWriter);
    let fits = (4 - own) as usize;
    let mut ids = Vec::new();
    for i in 0..=fits {
        let v = c
            .create_volume(create_req(&format!("lim-{i}"), cap.clone(), 1))
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
        ids.push(v);
    }
    let publish = |id: &str| csi::ControllerPublishVolumeRequest {
        volume_id: id.into(),
        node_id: h.node_id.clone(),
        volume_capability: Some(cap.clone()),
        ..Default::default()
    };
    // attached and not staged: the node counts it as not Kubernetes'
    c.controller_publish_volume(publish(&ids[0].volume_id))
        .await
        .unwrap();
    assert_eq!(max(&mut n).await, 4 - own - 1, "a volume attached by hand");
    // staged: Kubernetes' own again
    let (staging, _) = h.paths(&ids[0].volume_id);
    n.node_stage_volume(csi::NodeStageVolumeRequest {
        volume_id: ids[0].volume_id.clone(),
        staging_target_path: staging.to_string_lossy().into(),
        volume_capability: Some(cap.clone()),
        volume_context: ids[0].volume_context.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    assert_eq!(max(&mut n).await, 4 - own);
    for v in &ids[1..fits] {
        c.controller_publish_volume(publish(&v.volume_id))
            .await
            .unwrap();
    }
    // one more: refused, and nothing attached
    let last = &ids[fits].volume_id;
    let err = c
        .controller_publish_volume(publish(last))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{}", err.message());
    assert!(
        err.message().contains("node-volume-attach-limit"),
        "{}",
        err.message()
    );
    let v = cinder_of(&h).get_volume(last).await.unwrap();
    assert!(v.attachments.is_empty(), "{v:?}");
    n.node_unstage_volume(csi::NodeUnstageVolumeRequest {
        volume_id: ids[0].volume_id.clone(),
        staging_target_path: staging.to_string_lossy().into(),
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn publishing_past_novas_disk_limit_is_resource_exhausted_and_attaches_nothing() {
    if !root() {
        return;
    }
    let mut e = env().await;
    // Nova counts the root disk: three data volumes fit in four devices
    e.h.emulator.control().set_max_disk_devices(4);
    let cap = block_cap(Mode::SingleNodeWriter);
    let mut ids = Vec::new();
    for i in 0..4 {
        ids.push(
            e.create(&format!("full-{i}"), cap.clone(), 1)
                .await
                .volume_id,
        );
    }
    for id in &ids[..3] {
        e.publish(id, cap.clone()).await;
    }
    let node_id = e.h.node_id.clone();
    let publish = |id: &str| csi::ControllerPublishVolumeRequest {
        volume_id: id.into(),
        node_id: node_id.clone(),
        volume_capability: Some(cap.clone()),
        ..Default::default()
    };
    let req = publish(&ids[3]);
    let err = e.c.controller_publish_volume(req).await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{}", err.message());
    let last = e.cinder.get_volume(&ids[3]).await.unwrap();
    assert_eq!(last.status.as_str(), "available");
    assert!(last.attachments.is_empty(), "{:?}", last.attachments);
    // room again once one is detached
    e.unpublish(&ids[0]).await;
    let req = publish(&ids[3]);
    e.c.controller_publish_volume(req).await.unwrap();
    for id in &ids[1..] {
        e.unpublish(id).await;
    }
}

#[tokio::test]
async fn json_logs_have_unique_keys_and_name_what_each_call_works_on() {
    if !root() {
        return;
    }
    let logs = tempfile::tempdir().unwrap();
    let log = logs.path().join("plugin.log");
    let mut o = HarnessOptions::new(BIN);
    o.extra_args = vec!["--log-format=json".into()];
    o.log_file = Some(log.clone());
    let h = CinderOnEmulator::start(o).await.unwrap();
    csi_sanity::harness::wait_until_ready(&h.socket)
        .await
        .unwrap();
    let ch = plugin_runtime::connect_unix(&h.socket).await.unwrap();
    let mut c = ControllerClient::new(ch.clone());
    let mut n = NodeClient::new(ch);
    let cap = mount_cap("ext4", Mode::SingleNodeWriter);
    let mut r = create_req("pvc-logged", cap.clone(), 1);
    r.parameters
        .insert("csi.storage.k8s.io/pvc/name".into(), "data".into());
    let v = c
        .create_volume(r)
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    let snap = c
        .create_snapshot(snapshot_req(&v.volume_id, "snap-logged", &[]))
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap();
    c.delete_snapshot(csi::DeleteSnapshotRequest {
        snapshot_id: snap.snapshot_id.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    c.controller_publish_volume(csi::ControllerPublishVolumeRequest {
        volume_id: v.volume_id.clone(),
        node_id: h.node_id.clone(),
        volume_capability: Some(cap.clone()),
        ..Default::default()
    })
    .await
    .unwrap();
    let (staging, _) = h.paths(&v.volume_id);
    n.node_stage_volume(csi::NodeStageVolumeRequest {
        volume_id: v.volume_id.clone(),
        staging_target_path: staging.to_string_lossy().into(),
        volume_capability: Some(cap.clone()),
        ..Default::default()
    })
    .await
    .unwrap();
    n.node_unstage_volume(csi::NodeUnstageVolumeRequest {
        volume_id: v.volume_id.clone(),
        staging_target_path: staging.to_string_lossy().into(),
    })
    .await
    .unwrap();
    c.controller_unpublish_volume(csi::ControllerUnpublishVolumeRequest {
        volume_id: v.volume_id.clone(),
        node_id: h.node_id.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    // a failing call logs too
    let _ = c
        .controller_publish_volume(csi::ControllerPublishVolumeRequest {
            volume_id: v.volume_id.clone(),
            node_id: "00000000-0000-4000-8000-00000000dead".into(),
            volume_capability: Some(cap),
            ..Default::default()
        })
        .await
        .unwrap_err();
    c.delete_volume(csi::DeleteVolumeRequest {
        volume_id: v.volume_id.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    drop(h);
    let text = std::fs::read_to_string(&log).unwrap();
    let problems = csi_sanity::logs::check_json_log(&text);
    assert!(problems.is_empty(), "{problems:#?}");
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let in_span = |rpc: &str, field: &str, value: &str| {
        lines
            .iter()
            .any(|l| l["span"]["name"] == rpc && l["span"][field].as_str() == Some(value))
    };
    assert!(
        in_span("CreateVolume", "volume_name", "pvc-logged"),
        "{text}"
    );
    assert!(in_span("DeleteVolume", "volume_id", &v.volume_id), "{text}");
    assert!(
        in_span("ControllerPublishVolume", "volume_id", &v.volume_id),
        "{text}"
    );
    // the refused publish to a node that does not exist: its code and why,
    // in the call's span
    assert!(
        lines
            .iter()
            .any(|l| l["span"]["name"] == "ControllerPublishVolume"
                && l["span"]["volume_id"].as_str() == Some(v.volume_id.as_str())
                && l["message"] == "request refused"
                && l["code"] == "NotFound"
                && l["error"]
                    .as_str()
                    .is_some_and(|e| e.contains("00000000-0000-4000-8000-00000000dead"))),
        "the failing call is not logged: {text}"
    );
}

#[tokio::test]
async fn rotated_credentials_apply_without_a_restart() {
    if !root() {
        return;
    }
    let logs = tempfile::tempdir().unwrap();
    let log = logs.path().join("plugin.log");
    let mut o = HarnessOptions::new(BIN);
    o.log_file = Some(log.clone());
    let h = CinderOnEmulator::start(o).await.unwrap();
    csi_sanity::harness::wait_until_ready(&h.socket)
        .await
        .unwrap();
    let pid = h.plugin_pid().unwrap();
    let mut c = ControllerClient::new(plugin_runtime::connect_unix(&h.socket).await.unwrap());
    let create = |name: &str| create_req(name, mount_cap("ext4", Mode::SingleNodeWriter), 1);
    c.create_volume(create("before")).await.unwrap();

    // the password changes in Keystone (its tokens are revoked): the old
    // credentials stop working
    let ctl = h.emulator.control();
    assert!(ctl.set_password("admin", "rotated-secret"));
    let err = c.create_volume(create("stale")).await.unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated, "{}", err.message());
    // kubelet updates the mounted Secret: the next calls use it
    let conf = std::fs::read_to_string(&h.cloud_conf).unwrap();
    h.update_cloud_conf(&conf.replace("admin-secret", "rotated-secret"))
        .unwrap();
    let mut ok = None;
    for _ in 0..100 {
        match c.create_volume(create("after")).await {
            Ok(r) => {
                ok = Some(r);
                break;
            }
            Err(e) => assert_eq!(e.code(), Code::Unauthenticated, "{}", e.message()),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(ok.is_some(), "the new credentials were never used");

    // a broken update keeps the running credentials
    h.update_cloud_conf("[Global]\nauth-url = \"not a url")
        .unwrap();
    csi_sanity::harness::wait_until_logged(&log, "configuration not reloaded", 1)
        .await
        .unwrap();
    c.create_volume(create("still")).await.unwrap();
    // SIGHUP with the same broken file: nothing new to say
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGHUP,
    )
    .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    c.create_volume(create("still-2")).await.unwrap();
    drop(c);
    drop(h);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        !text.contains('\u{1b}'),
        "colour codes in a log file: {text}"
    );
    assert_eq!(
        text.matches("configuration reloaded").count(),
        1,
        "one reload applied: {text}"
    );
    assert_eq!(
        text.matches("configuration not reloaded").count(),
        1,
        "one failure, said once: {text}"
    );
    assert!(
        text.contains("Keystone accepts the new credentials"),
        "{text}"
    );
    assert!(
        !text.contains("rotated-secret"),
        "a password reached the log"
    );
}

// ----------------------------------------------------------------- faults

/// Retries like the external-provisioner/attacher: until success or a
/// final error, each attempt with its own deadline.
async fn retry<T, F, Fut>(mut call: F) -> (T, Vec<Code>)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
{
    let mut codes = Vec::new();
    for _ in 0..60 {
        match call().await {
            Ok(r) => return (r.into_inner(), codes),
            Err(s) => {
                assert!(
                    matches!(
                        s.code(),
                        Code::Unavailable | Code::DeadlineExceeded | Code::Aborted | Code::Internal
                    ),
                    "not retryable: {s:?}"
                );
                // the plugin answered itself, before the caller gave up
                assert!(
                    !s.message().contains("Timeout expired"),
                    "the caller's deadline passed first: {s:?}"
                );
                codes.push(s.code());
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    panic!("no success after 60 attempts: {codes:?}");
}

#[tokio::test]
async fn faults_give_retryable_codes_and_no_orphans_or_duplicates() {
    if !root() {
        return;
    }
    let mut e = env().await;
    let ctl = e.h.emulator.control();
    let cap = mount_cap("ext4", Mode::SingleNodeWriter);

    // Cinder answers 500 to the first two creates, then drops a connection
    ctl.add_fault(
        FaultRule::new(
            Some("POST"),
            "/volumes",
            FaultAction::Status {
                status: 500,
                message: None,
                retry_after: None,
            },
        )
        .times(2),
    );
    let c = e.c.clone();
    let (v, codes) = retry(|| {
        let mut c = c.clone();
        async move {
            c.create_volume(timed(
                create_req("flaky", mount_cap("ext4", Mode::SingleNodeWriter), 1),
                Duration::from_secs(5),
            ))
            .await
        }
    })
    .await;
    assert!(!codes.is_empty());
    assert_eq!(e.named("flaky").await.len(), 1);
    let flaky = v.volume.unwrap();

    // creation slower than the RPC deadline: the retry adopts the volume
    ctl.set_delays(Delays {
        volume_create_ms: 1500,
        ..Delays::default()
    });
    let (v, codes) = retry(|| {
        let mut c = c.clone();
        async move {
            c.create_volume(timed(
                create_req("slow", mount_cap("ext4", Mode::SingleNodeWriter), 1),
                Duration::from_millis(600),
            ))
            .await
        }
    })
    .await;
    assert!(codes.contains(&Code::DeadlineExceeded), "{codes:?}");
    assert_eq!(e.named("slow").await.len(), 1, "no orphan volume");
    assert_eq!(e.named("slow").await[0].id, v.volume.unwrap().volume_id);

    // Nova's attach stuck in attaching past the deadline; then the API
    // answering slowly: one attachment in the end
    ctl.set_delays(Delays {
        volume_attach_ms: 1500,
        ..Delays::default()
    });
    let id = flaky.volume_id.clone();
    let node = e.h.node_id.clone();
    let (_, codes) = retry(|| {
        let mut c = c.clone();
        let req = csi::ControllerPublishVolumeRequest {
            volume_id: id.clone(),
            node_id: node.clone(),
            volume_capability: Some(cap.clone()),
            ..Default::default()
        };
        async move {
            c.controller_publish_volume(timed(req, Duration::from_millis(600)))
                .await
        }
    })
    .await;
    assert!(codes.contains(&Code::DeadlineExceeded), "{codes:?}");
    let vol = e.cinder.get_volume(&id).await.unwrap();
    assert_eq!(
        vol.attachments.len(),
        1,
        "no duplicate attachment: {:?}",
        vol.attachments
    );
    let attach_posts = ctl
        .calls()
        .iter()
        .filter(|c| c.method == "POST" && c.path.ends_with("/os-volume_attachments"))
        .count();
    assert_eq!(attach_posts, 1, "one attach request despite the retries");

    // tokens expire mid-operation: the plugin re-authenticates
    ctl.set_delays(Delays::default());
    ctl.expire_tokens();
    e.unpublish(&id).await;
    ctl.revoke_tokens();
    let w = e.create("after-revoke", cap.clone(), 1).await;

    // every GET times out once the deadline is short: an answer from the
    // plugin, in time, saying so
    ctl.add_fault(
        FaultRule::new(
            Some("GET"),
            "/volumes/",
            FaultAction::Delay { millis: 3000 },
        )
        .times(1),
    );
    let err =
        e.c.controller_get_volume(timed(
            csi::ControllerGetVolumeRequest {
                volume_id: w.volume_id.clone(),
            },
            Duration::from_secs(1),
        ))
        .await
        .unwrap_err();
    assert!(
        matches!(err.code(), Code::DeadlineExceeded | Code::Unavailable),
        "{err:?}"
    );
    assert!(
        !err.message().contains("Timeout expired"),
        "the plugin must answer before the caller's deadline: {err:?}"
    );

    // a dropped connection on a delete: retried to success, volume gone
    ctl.add_fault(FaultRule::new(Some("DELETE"), "/volumes/", FaultAction::Drop).times(1));
    let wid = w.volume_id.clone();
    retry(|| {
        let mut c = c.clone();
        let req = csi::DeleteVolumeRequest {
            volume_id: wid.clone(),
            secrets: HashMap::new(),
        };
        async move { c.delete_volume(timed(req, Duration::from_secs(5))).await }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(e.named("after-revoke").await.is_empty());
}

// -------------------------------------------------------------- bad input

#[tokio::test]
async fn node_refuses_paths_outside_its_roots_without_touching_them() {
    if !root() {
        return;
    }
    let mut e = env().await;
    let outside = tempfile::tempdir().unwrap();
    let victim = outside.path().join("victim");
    std::fs::create_dir(&victim).unwrap();
    std::fs::write(victim.join("file"), b"x").unwrap();
    let id = "5d4d6bb2-0000-4000-8000-00000000000a";
    let inside = e.h.kubelet_dir.join("x").to_string_lossy().into_owned();
    let bad_paths = [
        victim.to_string_lossy().into_owned(),
        "relative/path".to_string(),
        format!("{inside}/../../../../{}", victim.display()),
        e.h.kubelet_dir.to_string_lossy().into_owned(),
    ];
    for p in &bad_paths {
        let err =
            e.n.node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
                volume_id: id.into(),
                target_path: p.clone(),
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{p}: {}", err.message());
        let err =
            e.n.node_unstage_volume(csi::NodeUnstageVolumeRequest {
                volume_id: id.into(),
                staging_target_path: p.clone(),
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{p}");
        let err =
            e.n.node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
                volume_id: id.into(),
                volume_path: p.clone(),
                staging_target_path: String::new(),
            })
            .await
            .unwrap_err();
        // a volume_path names a volume: one that cannot be ours is not
        // found (CSI spec), and nothing is looked at there
        assert_eq!(err.code(), Code::NotFound, "{p}: {}", err.message());
        let err =
            e.n.node_expand_volume(csi::NodeExpandVolumeRequest {
                volume_id: id.into(),
                volume_path: p.clone(),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::NotFound, "{p}: {}", err.message());
    }
    assert!(
        victim.join("file").exists(),
        "nothing outside the roots was removed"
    );

    // malformed ids: NotFound without a device search or an OpenStack call
    e.h.emulator.control().clear_calls();
    let (staging, target) = e.h.paths("x");
    let err =
        e.n.node_stage_volume(csi::NodeStageVolumeRequest {
            volume_id: "../../etc".into(),
            staging_target_path: staging.to_string_lossy().into(),
            volume_capability: Some(mount_cap("ext4", Mode::SingleNodeWriter)),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    let err =
        e.c.controller_publish_volume(csi::ControllerPublishVolumeRequest {
            volume_id: id.into(),
            node_id: "node-1.example.com".into(),
            volume_capability: Some(mount_cap("ext4", Mode::SingleNodeWriter)),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    let err =
        e.n.node_publish_volume(csi::NodePublishVolumeRequest {
            volume_id: id.into(),
            staging_target_path: staging.to_string_lossy().into(),
            target_path: target.to_string_lossy().into(),
            volume_capability: Some(mount_cap("ext4", Mode::SingleNodeWriter)),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(
        err.code(),
        Code::FailedPrecondition,
        "not staged: {}",
        err.message()
    );
    let err =
        e.c.controller_expand_volume(csi::ControllerExpandVolumeRequest {
            volume_id: id.into(),
            capacity_range: Some(csi::CapacityRange {
                required_bytes: -1,
                limit_bytes: 0,
            }),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        e.h.emulator.control().calls().is_empty(),
        "{:?}",
        e.h.emulator.control().calls()
    );
    let _ = BTreeMap::<String, String>::new();
}

/// Whether anything is mounted at or below `dir`.
fn mounted_below(dir: &Path) -> bool {
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    let at = host_ops::mountinfo::mounts_at(&dir).unwrap();
    !at.is_empty() || !host_ops::mountinfo::mounts_below(&dir).unwrap().is_empty()
}

#[tokio::test]
async fn symlinks_under_the_kubelet_dir_never_lead_a_mount_or_a_removal_outside() {
    if !root() {
        return;
    }
    let mut e = env().await;
    let ext4 = mount_cap("ext4", Mode::SingleNodeWriter);
    let (v, staging) = e.staged("links", ext4.clone(), 1).await;
    let outside = tempfile::tempdir().unwrap();
    std::fs::create_dir(outside.path().join("victim")).unwrap();
    let pods = e.h.kubelet_dir.join("pods");
    std::fs::create_dir_all(&pods).unwrap();
    // a directory on the way replaced by a symlink, and a target that is one
    std::os::unix::fs::symlink(outside.path(), pods.join("evil")).unwrap();
    std::os::unix::fs::symlink(outside.path().join("victim"), pods.join("link-target")).unwrap();
    let publish = |target: String| csi::NodePublishVolumeRequest {
        volume_id: v.volume_id.clone(),
        staging_target_path: staging.to_string_lossy().into(),
        target_path: target,
        volume_capability: Some(ext4.clone()),
        ..Default::default()
    };
    for target in [
        pods.join("evil/volumes/mount"),
        pods.join("evil/victim"),
        pods.join("link-target"),
    ] {
        let err =
            e.n.node_publish_volume(publish(target.to_string_lossy().into()))
                .await
                .unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{}", err.message());
        assert!(err.message().contains("symlink"), "{}", err.message());
    }
    assert!(!mounted_below(outside.path()), "nothing mounted outside");
    assert!(
        !outside.path().join("volumes").exists(),
        "nothing created outside"
    );

    // removal: through a symlink is refused, a file with content is kept
    let config = e.h.kubelet_dir.join("config.yaml");
    std::fs::write(&config, "kind: KubeletConfiguration\n").unwrap();
    let unpublish = |target: &Path| csi::NodeUnpublishVolumeRequest {
        volume_id: v.volume_id.clone(),
        target_path: target.to_string_lossy().into(),
    };
    let err =
        e.n.node_unpublish_volume(unpublish(&pods.join("evil/victim")))
            .await
            .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{}", err.message());
    let err =
        e.n.node_unstage_volume(csi::NodeUnstageVolumeRequest {
            volume_id: v.volume_id.clone(),
            staging_target_path: pods.join("evil/victim").to_string_lossy().into(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{}", err.message());
    assert!(
        outside.path().join("victim").is_dir(),
        "the empty directory outside is kept"
    );
    let err =
        e.n.node_unpublish_volume(unpublish(&config))
            .await
            .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{}", err.message());
    assert!(
        err.message().contains("not a mount point"),
        "{}",
        err.message()
    );
    assert_eq!(
        std::fs::read_to_string(&config).unwrap(),
        "kind: KubeletConfiguration\n"
    );
    let err =
        e.n.node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
            volume_id: v.volume_id.clone(),
            volume_path: pods.join("evil/victim").to_string_lossy().into(),
            staging_target_path: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{}", err.message());

    // a plain target beneath the root still publishes and unpublishes
    let (_, target) = e.h.paths(&v.volume_id);
    e.n.node_publish_volume(publish(target.to_string_lossy().into()))
        .await
        .unwrap();
    assert!(mounted_below(&target));
    e.n.node_unpublish_volume(unpublish(&target)).await.unwrap();
    assert!(!target.exists());
    std::fs::remove_file(pods.join("evil")).unwrap();
    std::fs::remove_file(pods.join("link-target")).unwrap();
    std::fs::remove_file(&config).unwrap();
    e.unstage(&v.volume_id).await;
    e.unpublish(&v.volume_id).await;
}

#[tokio::test]
async fn ids_from_a_storage_class_cannot_walk_the_url() {
    let mut e = env().await;
    // a multi-node capability makes the driver look the type up by name
    for walking in ["..", "."] {
        e.h.emulator.control().clear_calls();
        let mut r = create_req("walk", block_cap(Mode::MultiNodeMultiWriter), 1);
        r.parameters.insert("type".into(), walking.into());
        let err = e.c.create_volume(r).await.unwrap_err();
        assert_eq!(
            err.code(),
            Code::InvalidArgument,
            "{walking}: {}",
            err.message()
        );
        // refused before anything was sent: no GET of the project root,
        // no list of the types where one was asked for
        let calls = e.h.emulator.control().calls();
        assert!(
            !calls.iter().any(|c| c.path.contains("/types")
                || c.path
                    .trim_end_matches('/')
                    .ends_with("a0000000000000000000000000000001")),
            "{walking}: {:?}",
            calls
                .iter()
                .map(|c| format!("{} {}", c.method, c.path))
                .collect::<Vec<_>>()
        );
    }
    assert!(e.named("walk").await.is_empty(), "no volume made");
}

#[tokio::test]
async fn absurd_backup_budgets_are_refused_before_anything_is_made() {
    let mut e = env().await;
    let v = e
        .create("budget", mount_cap("ext4", Mode::SingleNodeWriter), 1)
        .await;
    e.h.emulator.control().clear_calls();
    for budget in ["18446744073709551615", "86401", "0", "-1"] {
        let err =
            e.c.create_snapshot(snapshot_req(
                &v.volume_id,
                "budget-backup",
                &[
                    ("type", "backup"),
                    ("backup-max-duration-seconds-per-gb", budget),
                ],
            ))
            .await
            .unwrap_err();
        assert_eq!(
            err.code(),
            Code::InvalidArgument,
            "{budget}: {}",
            err.message()
        );
    }
    assert!(
        !e.h.emulator
            .control()
            .calls()
            .iter()
            .any(|c| c.method == "POST"),
        "nothing was created"
    );
    // the largest allowed budget is served (and waits within the deadline)
    let snap =
        e.c.create_snapshot(snapshot_req(
            &v.volume_id,
            "budget-backup",
            &[
                ("type", "backup"),
                ("backup-max-duration-seconds-per-gb", "86400"),
            ],
        ))
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap();
    e.c.delete_snapshot(csi::DeleteSnapshotRequest {
        snapshot_id: snap.snapshot_id,
        secrets: HashMap::new(),
    })
    .await
    .unwrap();
}
