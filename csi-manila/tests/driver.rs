//! `manila-csi-plugin` through its socket against the emulator's Manila:
//! controller lifecycles for NFS and CephFS, safe access rules, snapshots,
//! restores and clones, Manila's failures and faults leaving nothing
//! behind, bad input, secrets kept out of logs; node calls up to the
//! mount(8) boundary through stand-in helpers in a private mount
//! namespace (see `csi_sanity::harness::manila`). Tests needing root
//! return early (and say so) without it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use csi_sanity::harness::{ManilaOnEmulator, ManilaOptions};
use openstack_client::config::{CloudConf, ConfigEnv};
use openstack_client::manila::{AccessRuleState, CreateShare, SharedFileSystems};
use openstack_client::{Session, SessionOptions};
use openstack_emulator::{Delays, FaultAction, FaultRule};
use proto::csi::v1 as csi;
use proto::csi::v1::controller_client::ControllerClient;
use proto::csi::v1::node_client::NodeClient;
use proto::csi::v1::volume_capability::access_mode::Mode;
use tonic::Code;
use tonic::transport::Channel;

const BIN: &str = env!("CARGO_BIN_EXE_manila-csi-plugin");
const GIB: i64 = 1 << 30;

fn root() -> bool {
    openstack_emulator::preconditions::root("mount namespaces, mounts")
}

struct Env {
    h: ManilaOnEmulator,
    c: ControllerClient<Channel>,
    n: NodeClient<Channel>,
    /// The member's view of Manila (the plugin acts as the member).
    manila: SharedFileSystems,
    secrets: HashMap<String, String>,
}

async fn env_with(protocol: &str, f: impl FnOnce(&mut ManilaOptions)) -> Env {
    let mut o = ManilaOptions::new(BIN, protocol);
    o.stand_ins = nix::unistd::geteuid().is_root();
    f(&mut o);
    let h = ManilaOnEmulator::start(o).await.unwrap();
    let ch = plugin_runtime::connect_unix(&h.socket).await.unwrap();
    csi_sanity::harness::wait_until_ready(&h.socket)
        .await
        .unwrap();
    let conf = CloudConf::from_texts(
        &[("c".into(), h.emulator.cloud_conf())],
        ConfigEnv::default(),
    )
    .unwrap();
    let manila = SharedFileSystems::new(
        Session::new(conf.cloud("member").unwrap(), SessionOptions::default()).unwrap(),
    );
    let secrets = h.member_secrets();
    Env {
        c: ControllerClient::new(ch.clone()),
        n: NodeClient::new(ch),
        h,
        manila,
        secrets,
    }
}

async fn env(protocol: &str) -> Env {
    env_with(protocol, |_| {}).await
}

fn mount_cap(mode: Mode, flags: &[&str]) -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_type: Some(csi::volume_capability::AccessType::Mount(
            csi::volume_capability::MountVolume {
                fs_type: String::new(),
                mount_flags: flags.iter().map(|s| s.to_string()).collect(),
                volume_mount_group: String::new(),
            },
        )),
        access_mode: Some(csi::volume_capability::AccessMode { mode: mode as i32 }),
    }
}

fn rwx() -> csi::VolumeCapability {
    mount_cap(Mode::MultiNodeMultiWriter, &[])
}

fn params(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn timed<T>(msg: T, timeout: Duration) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.set_timeout(timeout);
    r
}

impl Env {
    fn create_req(&self, name: &str, gib: i64, p: &[(&str, &str)]) -> csi::CreateVolumeRequest {
        csi::CreateVolumeRequest {
            name: name.into(),
            capacity_range: Some(csi::CapacityRange {
                required_bytes: gib * GIB,
                limit_bytes: 0,
            }),
            volume_capabilities: vec![rwx()],
            parameters: params(p),
            secrets: self.secrets.clone(),
            ..Default::default()
        }
    }

    async fn create(&mut self, name: &str, gib: i64, p: &[(&str, &str)]) -> csi::Volume {
        let req = self.create_req(name, gib, p);
        self.c
            .create_volume(req)
            .await
            .unwrap_or_else(|s| panic!("CreateVolume {name}: {s}"))
            .into_inner()
            .volume
            .unwrap()
    }

    async fn delete(&mut self, id: &str) -> Result<(), tonic::Status> {
        self.c
            .delete_volume(csi::DeleteVolumeRequest {
                volume_id: id.into(),
                secrets: self.secrets.clone(),
            })
            .await
            .map(|_| ())
    }

    fn stage_req(
        &self,
        v: &csi::Volume,
        cap: csi::VolumeCapability,
    ) -> csi::NodeStageVolumeRequest {
        let (staging, _) = self.h.paths(&v.volume_id, "pod-a");
        csi::NodeStageVolumeRequest {
            volume_id: v.volume_id.clone(),
            staging_target_path: staging.to_string_lossy().into(),
            volume_capability: Some(cap),
            secrets: self.secrets.clone(),
            volume_context: v.volume_context.clone(),
            ..Default::default()
        }
    }

    async fn stage(&mut self, v: &csi::Volume, cap: csi::VolumeCapability) {
        let req = self.stage_req(v, cap);
        self.n
            .node_stage_volume(req)
            .await
            .unwrap_or_else(|s| panic!("NodeStageVolume: {s}"));
    }

    async fn publish(&mut self, v: &csi::Volume, pod: &str, readonly: bool) -> std::path::PathBuf {
        let (staging, target) = self.h.paths(&v.volume_id, pod);
        self.n
            .node_publish_volume(csi::NodePublishVolumeRequest {
                volume_id: v.volume_id.clone(),
                staging_target_path: staging.to_string_lossy().into(),
                target_path: target.to_string_lossy().into(),
                volume_capability: Some(rwx()),
                readonly,
                volume_context: v.volume_context.clone(),
                ..Default::default()
            })
            .await
            .unwrap_or_else(|s| panic!("NodePublishVolume {pod}: {s}"));
        target
    }

    async fn unpublish(&mut self, v: &csi::Volume, pod: &str) {
        let (_, target) = self.h.paths(&v.volume_id, pod);
        for _ in 0..2 {
            self.n
                .node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
                    volume_id: v.volume_id.clone(),
                    target_path: target.to_string_lossy().into(),
                })
                .await
                .unwrap_or_else(|s| panic!("NodeUnpublishVolume {pod}: {s}"));
        }
    }

    async fn unstage(&mut self, v: &csi::Volume) {
        let (staging, _) = self.h.paths(&v.volume_id, "pod-a");
        for _ in 0..2 {
            self.n
                .node_unstage_volume(csi::NodeUnstageVolumeRequest {
                    volume_id: v.volume_id.clone(),
                    staging_target_path: staging.to_string_lossy().into(),
                })
                .await
                .unwrap_or_else(|s| panic!("NodeUnstageVolume: {s}"));
        }
    }

    async fn stats(&mut self, path: &Path) -> csi::NodeGetVolumeStatsResponse {
        self.n
            .node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
                volume_id: "v".into(),
                volume_path: path.to_string_lossy().into(),
                staging_target_path: String::new(),
            })
            .await
            .unwrap()
            .into_inner()
    }

    /// Requests the plugin made to Manila's share endpoints.
    fn share_calls(&self) -> Vec<String> {
        self.h
            .emulator
            .control()
            .calls()
            .into_iter()
            .filter(|c| c.path.contains("/share/"))
            .map(|c| format!("{} {}", c.method, c.path))
            .collect()
    }
}

// ------------------------------------------------------------ lifecycles

#[tokio::test]
async fn nfs_share_is_created_mounted_by_two_pods_and_removed() {
    if !root() {
        return;
    }
    let mut e = env("NFS").await;
    let p = [
        ("nfs-shareClient", "10.0.0.0/24,10.1.0.7"),
        ("csi.storage.k8s.io/pvc/name", "data"),
        ("fsType", "ext4"),
    ];
    let v = e.create("pvc-nfs", 1, &p).await;
    assert_eq!(v.capacity_bytes, GIB);
    assert_eq!(v.volume_context.get("shareID"), Some(&v.volume_id));
    let rule_ids: Vec<&str> = v.volume_context["shareAccessIDs"].split(',').collect();
    assert_eq!(rule_ids.len(), 2, "{:?}", v.volume_context);
    // what Manila holds: described as provisioned here, metadata, rules
    let share = e.manila.get_share(&v.volume_id).await.unwrap();
    assert_eq!(
        share.description.as_deref(),
        Some("provisioned-by=manila.csi.openstack.org")
    );
    assert_eq!(share.metadata["manila.csi.openstack.org/cluster"], "sanity");
    assert_eq!(share.metadata["csi.storage.k8s.io/pvc/name"], "data");
    let rules = e.manila.list_access_rules(&v.volume_id).await.unwrap();
    let mut to: Vec<&str> = rules.iter().map(|r| r.access_to.as_str()).collect();
    to.sort();
    assert_eq!(to, vec!["10.0.0.0/24", "10.1.0.7"]);
    assert!(rules.iter().all(|r| r.state == AccessRuleState::Active
        && r.access_type == "ip"
        && r.access_level == "rw"));

    // idempotent; an incompatible repeat is AlreadyExists
    let again = e.create("pvc-nfs", 1, &p).await;
    assert_eq!(again.volume_id, v.volume_id);
    let err =
        e.c.create_volume(e.create_req("pvc-nfs", 5, &p))
            .await
            .unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists, "{}", err.message());

    // one mount per node, bound into two pods; a third reads only
    let cap = mount_cap(Mode::MultiNodeMultiWriter, &["nfsvers=4.1", "hard"]);
    e.stage(&v, cap.clone()).await;
    e.stage(&v, cap).await;
    let (staging, _) = e.h.paths(&v.volume_id, "pod-a");
    let calls = e.h.helper_calls();
    assert_eq!(calls.len(), 1, "staged once: {calls:?}");
    assert_eq!(calls[0].program, "nfs");
    assert_eq!(
        calls[0].source,
        format!("127.0.0.1:/shares/share-{}", v.volume_id),
        "the preferred, non-admin export"
    );
    assert_eq!(calls[0].target, staging.to_string_lossy());
    // as mount(8) hands them to the helper
    assert_eq!(calls[0].options, "rw,nfsvers=4.1,hard");
    let a = e.publish(&v, "pod-a", false).await;
    let b = e.publish(&v, "pod-b", false).await;
    let ro = e.publish(&v, "pod-c", true).await;
    e.publish(&v, "pod-a", false).await;
    std::fs::write(e.h.seen(&a).join("hello"), b"from a").unwrap();
    assert_eq!(
        std::fs::read(e.h.seen(&b).join("hello")).unwrap(),
        b"from a",
        "pod b sees pod a's write"
    );
    assert_eq!(
        std::fs::read(e.h.seen(&ro).join("hello")).unwrap(),
        b"from a"
    );
    let err = std::fs::write(e.h.seen(&ro).join("nope"), b"x").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(nix::libc::EROFS), "{err}");
    let st = e.stats(&a).await;
    assert!(!st.volume_condition.unwrap().abnormal);
    assert!(st.usage.iter().any(|u| u.total > 0));

    for pod in ["pod-a", "pod-b", "pod-c"] {
        e.unpublish(&v, pod).await;
    }
    e.unstage(&v).await;
    assert!(
        e.h.mounts_below_dir().is_empty(),
        "{:?}",
        e.h.mounts_below_dir()
    );
    for p in [&a, &b, &ro, &staging] {
        assert!(!e.h.seen(p).exists(), "{} left behind", p.display());
    }
    assert_eq!(
        std::fs::read_dir(e.h.state_dir.join("volumes"))
            .unwrap()
            .count(),
        0,
        "no stage record left"
    );

    // deletion is complete when it answers: no share, no rule
    e.delete(&v.volume_id).await.unwrap();
    assert!(
        e.manila
            .get_share(&v.volume_id)
            .await
            .unwrap_err()
            .is_not_found()
    );
    e.delete(&v.volume_id).await.unwrap();
}

#[tokio::test]
async fn cephfs_kernel_and_fuse_mounts_carry_the_key_only_in_private_files() {
    if !root() {
        return;
    }
    let mut e = env("CEPHFS").await;
    // kernel client
    let k = e
        .create(
            "pvc-kernel",
            1,
            &[
                ("type", "cephfs"),
                ("cephfs-mounter", "kernel"),
                ("cephfs-clientID", "k8s-node"),
                ("cephfs-kernelMountOptions", "noatime"),
            ],
        )
        .await;
    assert_eq!(k.volume_context["cephfs-mounter"], "kernel");
    let rules = e.manila.list_access_rules(&k.volume_id).await.unwrap();
    assert_eq!(rules.len(), 1);
    assert_eq!(
        (rules[0].access_type.as_str(), rules[0].access_to.as_str()),
        ("cephx", "k8s-node")
    );
    let key = rules[0].access_key.clone().unwrap();
    assert!(
        !k.volume_context.values().any(|v| v.contains(&key)),
        "the key never travels in the volume context"
    );
    e.stage(&k, rwx()).await;
    let (staging, _) = e.h.paths(&k.volume_id, "pod-a");
    let call = e.h.helper_calls().pop().unwrap();
    assert_eq!(call.program, "ceph");
    assert!(
        call.source.starts_with("127.0.0.1:6789:/volumes/_nogroup/")
            && call.source.contains(&k.volume_id),
        "{call:?}"
    );
    assert_eq!(call.target, staging.to_string_lossy());
    let opts: Vec<&str> = call.options.split(',').collect();
    let secretfile = opts
        .iter()
        .find_map(|o| o.strip_prefix("secretfile="))
        .unwrap();
    assert!(
        secretfile.starts_with(&*e.h.state_dir.to_string_lossy()),
        "{secretfile}"
    );
    // as mount(8) hands them to the helper: VFS flags first
    let want_secret = format!("secretfile={secretfile}");
    assert_eq!(
        opts,
        [
            "rw",
            "noatime",
            "name=k8s-node",
            want_secret.as_str(),
            "fs=cephfs"
        ]
    );
    assert_eq!(std::fs::read_to_string(secretfile).unwrap(), key);
    e.unstage(&k).await;
    assert!(
        !Path::new(secretfile).exists(),
        "the key goes with the stage"
    );

    // ceph-fuse (upstream's default mounter), client id = the share name
    let f = e.create("pvc-fuse", 2, &[("type", "cephfs")]).await;
    let rule = &e.manila.list_access_rules(&f.volume_id).await.unwrap()[0];
    assert_eq!(rule.access_to, "pvc-fuse");
    e.stage(&f, rwx()).await;
    let call = e.h.helper_calls().pop().unwrap();
    assert_eq!(call.program, "ceph-fuse");
    assert_eq!(call.options, "id=pvc-fuse,fs=cephfs,opts=");
    let a = e.publish(&f, "pod-a", false).await;
    let b = e.publish(&f, "pod-b", false).await;
    std::fs::write(e.h.seen(&a).join("x"), b"shared").unwrap();
    assert_eq!(std::fs::read(e.h.seen(&b).join("x")).unwrap(), b"shared");
    assert!(!e.stats(&a).await.volume_condition.unwrap().abnormal);

    // the daemon dies under the mount: reported abnormal, the next publish
    // mounts the share again from the record (no Manila call needed)
    let dir =
        e.h.state_dir
            .join("volumes")
            .read_dir()
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .path();
    let pid: i32 = std::fs::read_to_string(dir.join("ceph-fuse.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    // until the node sees the daemon gone (it is reaped, not waited for)
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let cond = loop {
        let cond = e.stats(&a).await.volume_condition.unwrap();
        if cond.abnormal || std::time::Instant::now() > deadline {
            break cond;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(cond.abnormal, "{cond:?}");
    assert!(cond.message.contains("ceph-fuse"), "{}", cond.message);
    e.h.emulator.control().clear_calls();
    let c = e.publish(&f, "pod-c", false).await;
    assert!(
        e.share_calls().is_empty(),
        "repaired from the record: {:?}",
        e.share_calls()
    );
    assert_eq!(
        e.h.helper_calls()
            .iter()
            .filter(|c| c.program == "ceph-fuse")
            .count(),
        2
    );
    assert!(!e.stats(&c).await.volume_condition.unwrap().abnormal);

    // a graceful shutdown leaves every daemon and mount: a plugin that
    // stops (an upgrade, a liveness restart) breaks no share in use
    let r = e.publish(&f, "pod-r", true).await;
    let pid: i32 = std::fs::read_to_string(dir.join("ceph-fuse.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let status = e.h.terminate_plugin().unwrap();
    assert!(status.success(), "{status}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let alive = |pid: i32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| !s.contains(") Z"))
            .unwrap_or(false)
    };
    assert!(alive(pid), "the plugin's shutdown ended a ceph-fuse daemon");
    // here the plugin's mounts live in its private namespace, which goes
    // with that daemon: as a container's mounts go with it
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();

    // the next plugin finds the record of the staged share, mounts it
    // again and binds it into its pods' directories before any call,
    // read-only where it was published read-only
    let fuse_calls = |e: &Env| {
        e.h.helper_calls()
            .iter()
            .filter(|c| c.program == "ceph-fuse")
            .count()
    };
    e.h.emulator.control().clear_calls();
    e.h.restart_plugin().await.unwrap();
    let until = std::time::Instant::now() + Duration::from_secs(20);
    while (e.h.mounts_at(&r).is_empty() || fuse_calls(&e) < 3) && std::time::Instant::now() < until
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(fuse_calls(&e), 3, "mounted again once");
    assert!(
        e.share_calls().is_empty(),
        "repaired from the record alone: {:?}",
        e.share_calls()
    );
    for t in [&a, &b, &c] {
        assert!(
            !e.stats(t).await.volume_condition.unwrap().abnormal,
            "{}",
            t.display()
        );
    }
    assert_eq!(std::fs::read(e.h.seen(&a).join("x")).unwrap(), b"shared");
    let ro = e.h.mounts_at(&r);
    assert!(ro.last().is_some_and(|m| m.read_only()), "{ro:?}");
    assert!(!e.h.mounts_at(&c).last().unwrap().read_only());
    for pod in ["pod-a", "pod-b", "pod-c", "pod-r"] {
        e.unpublish(&f, pod).await;
    }
    e.unstage(&f).await;
    assert!(
        e.h.mounts_below_dir().is_empty(),
        "{:?}",
        e.h.mounts_below_dir()
    );
}

// ------------------------------------------------------------ controller

#[tokio::test]
async fn nfs_access_is_never_opened_without_being_asked() {
    let rc_dir = tempfile::tempdir().unwrap();
    let rc = rc_dir.path().join("runtime.json");
    std::fs::write(&rc, "{}").unwrap();
    let rc_flag = format!("--runtime-config-file={}", rc.display());
    let mut e = env_with("NFS", |o| {
        o.stand_ins = false;
        o.extra_args.push(rc_flag);
    })
    .await;
    e.h.emulator.control().clear_calls();
    let err =
        e.c.create_volume(e.create_req("pvc-open", 1, &[]))
            .await
            .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message().contains("nfs-shareClient"),
        "{}",
        err.message()
    );
    assert!(
        !e.share_calls().iter().any(|c| c.starts_with("POST")),
        "nothing created: {:?}",
        e.share_calls()
    );
    // the runtime configuration's default applies at once
    std::fs::write(&rc, r#"{"nfs":{"defaultShareClient":"192.168.10.0/24"}}"#).unwrap();
    let v = e.create("pvc-default", 1, &[]).await;
    let rules = e.manila.list_access_rules(&v.volume_id).await.unwrap();
    assert_eq!(rules.len(), 1);
    assert_eq!(rules[0].access_to, "192.168.10.0/24");
    // the world only when written
    let w = e
        .create("pvc-world", 1, &[("nfs-shareClient", "0.0.0.0/0")])
        .await;
    assert_eq!(
        e.manila.list_access_rules(&w.volume_id).await.unwrap()[0].access_to,
        "0.0.0.0/0"
    );
}

#[tokio::test]
async fn a_share_only_ever_read_gets_read_only_rules() {
    for protocol in ["NFS", "CEPHFS"] {
        let mut e = env_with(protocol, |o| o.stand_ins = false).await;
        let clients = [("nfs-shareClient", "10.0.0.0/24")];
        for (i, (modes, want)) in [
            (vec![Mode::MultiNodeReaderOnly], "ro"),
            (
                vec![Mode::SingleNodeReaderOnly, Mode::MultiNodeReaderOnly],
                "ro",
            ),
            (
                vec![Mode::MultiNodeReaderOnly, Mode::MultiNodeMultiWriter],
                "rw",
            ),
            (vec![Mode::SingleNodeWriter], "rw"),
        ]
        .into_iter()
        .enumerate()
        {
            let mut req = e.create_req(&format!("pvc-{i}"), 1, &clients);
            req.volume_capabilities = modes.iter().map(|m| mount_cap(*m, &[])).collect();
            let v =
                e.c.create_volume(req.clone())
                    .await
                    .unwrap()
                    .into_inner()
                    .volume
                    .unwrap();
            let rules = e.manila.list_access_rules(&v.volume_id).await.unwrap();
            assert_eq!(rules.len(), 1, "{protocol} {modes:?}: {rules:?}");
            assert_eq!(rules[0].access_level, want, "{protocol} {modes:?}");
            // a retry finds the rule it granted and grants no other
            e.c.create_volume(req).await.unwrap();
            assert_eq!(
                e.manila
                    .list_access_rules(&v.volume_id)
                    .await
                    .unwrap()
                    .len(),
                1
            );
            e.delete(&v.volume_id).await.unwrap();
        }
    }
}

#[tokio::test]
async fn snapshots_restores_and_clones() {
    let mut e = env_with("NFS", |o| {
        o.stand_ins = false;
        o.extra_args
            .push("--default-nfs-share-client=10.0.0.0/8".into());
    })
    .await;
    let src = e.create("pvc-src", 1, &[]).await;
    let snap_req =
        |name: &str, source: &str, s: &HashMap<String, String>| csi::CreateSnapshotRequest {
            source_volume_id: source.into(),
            name: name.into(),
            secrets: s.clone(),
            parameters: params(&[("csi.storage.k8s.io/volumesnapshot/name", "snap")]),
        };
    let s1 =
        e.c.create_snapshot(snap_req("snap-1", &src.volume_id, &e.secrets))
            .await
            .unwrap()
            .into_inner()
            .snapshot
            .unwrap();
    assert!(s1.ready_to_use);
    assert_eq!(s1.source_volume_id, src.volume_id);
    assert_eq!(s1.size_bytes, GIB);
    assert!(s1.creation_time.is_some());
    let again =
        e.c.create_snapshot(snap_req("snap-1", &src.volume_id, &e.secrets))
            .await
            .unwrap()
            .into_inner()
            .snapshot
            .unwrap();
    assert_eq!(again.snapshot_id, s1.snapshot_id);
    let other = e.create("pvc-other", 1, &[]).await;
    let err =
        e.c.create_snapshot(snap_req("snap-1", &other.volume_id, &e.secrets))
            .await
            .unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists);

    // lists: by id, by source, paginated
    let list = |e: &Env, id: &str, src: &str, max: i32, token: &str| {
        let mut c = e.c.clone();
        let req = csi::ListSnapshotsRequest {
            max_entries: max,
            starting_token: token.into(),
            source_volume_id: src.into(),
            snapshot_id: id.into(),
            secrets: e.secrets.clone(),
        };
        async move { c.list_snapshots(req).await.map(|r| r.into_inner()) }
    };
    let by_id = list(&e, &s1.snapshot_id, "", 0, "").await.unwrap();
    assert_eq!(by_id.entries.len(), 1);
    assert!(
        list(&e, "00000000-0000-4000-8000-000000000000", "", 0, "")
            .await
            .unwrap()
            .entries
            .is_empty()
    );
    assert!(
        list(&e, "", &other.volume_id, 0, "")
            .await
            .unwrap()
            .entries
            .is_empty()
    );
    let s2 =
        e.c.create_snapshot(snap_req("snap-2", &other.volume_id, &e.secrets))
            .await
            .unwrap()
            .into_inner()
            .snapshot
            .unwrap();
    let mut seen = Vec::new();
    let mut token = String::new();
    loop {
        let page = list(&e, "", "", 1, &token).await.unwrap();
        assert!(page.entries.len() <= 1);
        seen.extend(
            page.entries
                .into_iter()
                .map(|x| x.snapshot.unwrap().snapshot_id),
        );
        if page.next_token.is_empty() {
            break;
        }
        token = page.next_token;
    }
    assert!(
        seen.contains(&s1.snapshot_id) && seen.contains(&s2.snapshot_id),
        "{seen:?}"
    );
    assert_eq!(
        list(&e, "", "", 0, "bogus").await.unwrap_err().code(),
        Code::Aborted
    );

    // restore into a larger share
    let mut req = e.create_req("pvc-restored", 3, &[]);
    req.volume_content_source = Some(csi::VolumeContentSource {
        r#type: Some(csi::volume_content_source::Type::Snapshot(
            csi::volume_content_source::SnapshotSource {
                snapshot_id: s1.snapshot_id.clone(),
            },
        )),
    });
    let restored =
        e.c.create_volume(req.clone())
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
    assert_eq!(restored.capacity_bytes, 3 * GIB);
    assert_eq!(restored.content_source, req.volume_content_source);
    let share = e.manila.get_share(&restored.volume_id).await.unwrap();
    assert_eq!(share.snapshot_id.as_deref(), Some(s1.snapshot_id.as_str()));
    assert_eq!(
        e.c.create_volume(req)
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap()
            .volume_id,
        restored.volume_id
    );

    // a clone: through a temporary snapshot that is gone afterwards
    let mut req = e.create_req("pvc-clone", 1, &[]);
    req.volume_content_source = Some(csi::VolumeContentSource {
        r#type: Some(csi::volume_content_source::Type::Volume(
            csi::volume_content_source::VolumeSource {
                volume_id: src.volume_id.clone(),
            },
        )),
    });
    let clone =
        e.c.create_volume(req.clone())
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
    assert_eq!(clone.content_source, req.volume_content_source);
    // Manila deletes the temporary snapshot on its own time
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !e
        .manila
        .list_snapshots_named("pvc-clone-clone-source")
        .await
        .unwrap()
        .is_empty()
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the temporary snapshot is never removed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let again =
        e.c.create_volume(req)
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
    assert_eq!(again.volume_id, clone.volume_id);

    // a share with snapshots cannot go; without them, at once
    let err = e.delete(&src.volume_id).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{}", err.message());
    e.c.delete_snapshot(csi::DeleteSnapshotRequest {
        snapshot_id: s1.snapshot_id.clone(),
        secrets: e.secrets.clone(),
    })
    .await
    .unwrap();
    assert!(
        list(&e, &s1.snapshot_id, "", 0, "")
            .await
            .unwrap()
            .entries
            .is_empty()
    );
    e.delete(&src.volume_id).await.unwrap();

    // a type without snapshots says so
    let plain = e.create("pvc-nosnap", 1, &[("type", "no-snapshots")]).await;
    let err =
        e.c.create_snapshot(snap_req("snap-3", &plain.volume_id, &e.secrets))
            .await
            .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert!(
        err.message().contains("snapshot_support"),
        "{}",
        err.message()
    );
    let mut req = e.create_req("pvc-noclone", 1, &[]);
    req.volume_content_source = Some(csi::VolumeContentSource {
        r#type: Some(csi::volume_content_source::Type::Volume(
            csi::volume_content_source::VolumeSource {
                volume_id: plain.volume_id.clone(),
            },
        )),
    });
    let err = e.c.create_volume(req).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{}", err.message());
}

#[tokio::test]
async fn lists_gets_expansion_capacity_and_validation() {
    let mut e = env_with("CEPHFS", |o| o.stand_ins = false).await;
    let caps =
        e.c.controller_get_capabilities(csi::ControllerGetCapabilitiesRequest {})
            .await
            .unwrap()
            .into_inner()
            .capabilities;
    assert!(
        caps.len() >= 10,
        "with --cloud-config every capability: {caps:?}"
    );
    let mut ids = Vec::new();
    for i in 0..3 {
        ids.push(
            e.create(&format!("pvc-list-{i}"), 1, &[("type", "cephfs")])
                .await
                .volume_id,
        );
    }
    let mut seen = Vec::new();
    let mut token = String::new();
    loop {
        let page =
            e.c.list_volumes(csi::ListVolumesRequest {
                max_entries: 2,
                starting_token: token.clone(),
            })
            .await
            .unwrap()
            .into_inner();
        assert!(page.entries.len() <= 2);
        for en in page.entries {
            assert!(!en.status.unwrap().volume_condition.unwrap().abnormal);
            seen.push(en.volume.unwrap().volume_id);
        }
        if page.next_token.is_empty() {
            break;
        }
        token = page.next_token;
    }
    for id in &ids {
        assert!(seen.contains(id), "{id} missing from {seen:?}");
    }
    let got =
        e.c.controller_get_volume(csi::ControllerGetVolumeRequest {
            volume_id: ids[0].clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.volume.unwrap().volume_id, ids[0]);
    let err =
        e.c.controller_get_volume(csi::ControllerGetVolumeRequest {
            volume_id: "00000000-0000-4000-8000-000000000000".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);

    let grown =
        e.c.controller_expand_volume(csi::ControllerExpandVolumeRequest {
            volume_id: ids[0].clone(),
            capacity_range: Some(csi::CapacityRange {
                required_bytes: 3 * GIB - 5,
                limit_bytes: 0,
            }),
            secrets: e.secrets.clone(),
            volume_capability: Some(rwx()),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(grown.capacity_bytes, 3 * GIB);
    assert!(!grown.node_expansion_required);
    assert_eq!(e.manila.get_share(&ids[0]).await.unwrap().size, 3);

    // a member cannot read Manila's pools: the quota left is the capacity
    let err =
        e.c.get_capacity(csi::GetCapacityRequest::default())
            .await
            .unwrap_err();
    assert_eq!(
        err.code(),
        Code::FailedPrecondition,
        "unknown: {}",
        err.message()
    );
    e.h.emulator
        .control()
        .set_quotas(openstack_emulator::Quotas {
            share_gigabytes: 100,
            ..Default::default()
        });
    let cap =
        e.c.get_capacity(csi::GetCapacityRequest::default())
            .await
            .unwrap()
            .into_inner();
    assert_eq!(cap.available_capacity, (100 - 5) * GIB, "{cap:?}");

    let validate = |caps: Vec<csi::VolumeCapability>| csi::ValidateVolumeCapabilitiesRequest {
        volume_id: ids[1].clone(),
        volume_capabilities: caps,
        secrets: e.secrets.clone(),
        ..Default::default()
    };
    let ok =
        e.c.validate_volume_capabilities(validate(vec![rwx()]))
            .await
            .unwrap()
            .into_inner();
    assert!(ok.confirmed.is_some());
    let block = csi::VolumeCapability {
        access_type: Some(csi::volume_capability::AccessType::Block(
            csi::volume_capability::BlockVolume {},
        )),
        access_mode: Some(csi::volume_capability::AccessMode {
            mode: Mode::MultiNodeMultiWriter as i32,
        }),
    };
    let no =
        e.c.validate_volume_capabilities(validate(vec![block]))
            .await
            .unwrap()
            .into_inner();
    assert!(
        no.confirmed.is_none() && no.message.contains("block"),
        "{no:?}"
    );

    // a share this driver did not provision is never deleted
    let foreign = e
        .manila
        .create_share(&CreateShare {
            protocol: "CEPHFS".into(),
            size_gib: 1,
            name: "hand-made".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while e.manila.get_share(&foreign.id).await.unwrap().status
        != openstack_client::manila::ShareStatus::Available
    {
        assert!(std::time::Instant::now() < deadline, "never available");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let err = e.delete(&foreign.id).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert!(e.manila.get_share(&foreign.id).await.is_ok());
}

#[tokio::test]
async fn without_own_credentials_calls_without_secrets_are_not_advertised() {
    let mut e = env_with("NFS", |o| {
        o.stand_ins = false;
        o.cloud_conf = false;
    })
    .await;
    let caps: Vec<i32> =
        e.c.controller_get_capabilities(csi::ControllerGetCapabilitiesRequest {})
            .await
            .unwrap()
            .into_inner()
            .capabilities
            .into_iter()
            .filter_map(|c| {
                c.r#type
                    .map(|csi::controller_service_capability::Type::Rpc(r)| r.r#type)
            })
            .collect();
    use csi::controller_service_capability::rpc::Type as Rpc;
    assert!(!caps.contains(&(Rpc::ListVolumes as i32)));
    assert!(!caps.contains(&(Rpc::GetVolume as i32)));
    assert!(caps.contains(&(Rpc::CreateDeleteVolume as i32)));
    // secrets carry the credentials
    let v = e
        .create("pvc-secrets", 1, &[("nfs-shareClient", "10.0.0.1")])
        .await;
    // one Keystone session for one credential set
    for i in 0..5 {
        e.create(
            &format!("pvc-more-{i}"),
            1,
            &[("nfs-shareClient", "10.0.0.1")],
        )
        .await;
    }
    let tokens =
        e.h.emulator
            .control()
            .calls()
            .iter()
            .filter(|c| c.method == "POST" && c.path.ends_with("/auth/tokens"))
            .count();
    assert_eq!(tokens, 1, "one token for six creates");
    // a changed secret is used, not a cached session
    let mut wrong = e.secrets.clone();
    wrong.insert("os-password".into(), "not-the-password".into());
    let err =
        e.c.delete_volume(csi::DeleteVolumeRequest {
            volume_id: v.volume_id.clone(),
            secrets: wrong,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated, "{}", err.message());
    e.delete(&v.volume_id).await.unwrap();
}

#[tokio::test]
async fn manila_failures_are_explained_and_leave_nothing() {
    let mut e = env_with("NFS", |o| {
        o.stand_ins = false;
        o.extra_args
            .push("--default-nfs-share-client=10.0.0.0/8".into());
    })
    .await;
    // the scheduler finds no backend: the user message decides the code
    let err =
        e.c.create_volume(e.create_req("pvc-huge", 5000, &[]))
            .await
            .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{}", err.message());
    assert!(err.message().contains("Capacity"), "{}", err.message());
    // a scheduler refusal that may be a backend's missed report is tried
    // once more; twice is an answer
    e.h.emulator.control().fail_next_share_creates(1);
    let v = e.create("pvc-once", 1, &[]).await;
    let named = e.manila.list_shares_named("pvc-once").await.unwrap();
    assert_eq!(named.len(), 1, "{named:?}");
    assert_eq!(named[0].id, v.volume_id);
    e.h.emulator.control().fail_next_share_creates(2);
    let err =
        e.c.create_volume(e.create_req("pvc-fails", 1, &[]))
            .await
            .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{}", err.message());
    // the failed shares are deleted (Manila takes its time to)
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    for name in ["pvc-huge", "pvc-fails"] {
        while !e.manila.list_shares_named(name).await.unwrap().is_empty() {
            assert!(
                std::time::Instant::now() < deadline,
                "the failed share {name} was never deleted"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    // a 500 on create: nothing made; the retry makes one
    let ctl = e.h.emulator.control();
    ctl.add_fault(
        FaultRule::new(
            Some("POST"),
            "/shares",
            FaultAction::Status {
                status: 500,
                message: None,
                retry_after: None,
            },
        )
        .times(1),
    );
    let err =
        e.c.create_volume(e.create_req("pvc-500", 1, &[]))
            .await
            .unwrap_err();
    assert!(
        matches!(err.code(), Code::Internal | Code::Unavailable),
        "{err}"
    );
    e.create("pvc-500", 1, &[]).await;
    assert_eq!(
        e.manila.list_shares_named("pvc-500").await.unwrap().len(),
        1
    );

    // slower than the caller's deadline: DeadlineExceeded, the retry
    // resumes the wait and finds the same share
    ctl.set_delays(Delays {
        share_create_ms: 1500,
        ..Delays::default()
    });
    let err =
        e.c.create_volume(timed(
            e.create_req("pvc-slow", 1, &[]),
            Duration::from_millis(600),
        ))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::DeadlineExceeded, "{}", err.message());
    ctl.set_delays(Delays::default());
    let v = e.create("pvc-slow", 1, &[]).await;
    let named = e.manila.list_shares_named("pvc-slow").await.unwrap();
    assert_eq!(named.len(), 1);
    assert_eq!(named[0].id, v.volume_id);

    // a dropped connection on the create and on the grant: the retry
    // finds what was made, never a second one
    ctl.add_fault(FaultRule::new(Some("POST"), "/shares", FaultAction::Drop).times(1));
    let _ =
        e.c.create_volume(e.create_req("pvc-drop", 1, &[]))
            .await
            .unwrap_err();
    ctl.add_fault(FaultRule::new(Some("POST"), "/action", FaultAction::Drop).times(1));
    let _ = e.c.create_volume(e.create_req("pvc-drop", 1, &[])).await;
    let v = e.create("pvc-drop", 1, &[]).await;
    assert_eq!(
        e.manila.list_shares_named("pvc-drop").await.unwrap().len(),
        1
    );
    assert_eq!(
        e.manila
            .list_access_rules(&v.volume_id)
            .await
            .unwrap()
            .len(),
        1
    );
}

// ------------------------------------------------------------- bad input

#[tokio::test]
async fn bad_input_is_refused_before_any_manila_call() {
    let mut e = env_with("NFS", |o| o.stand_ins = false).await;
    csi_sanity::harness::wait_until_ready(&e.h.socket)
        .await
        .unwrap();
    e.h.emulator.control().clear_calls();
    let good = e.create_req("pvc-x", 1, &[("nfs-shareClient", "10.0.0.1")]);
    let block = csi::VolumeCapability {
        access_type: Some(csi::volume_capability::AccessType::Block(
            csi::volume_capability::BlockVolume {},
        )),
        access_mode: Some(csi::volume_capability::AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
    };
    let mut cases: Vec<(&str, csi::CreateVolumeRequest)> = Vec::new();
    let mut r = good.clone();
    r.name.clear();
    cases.push(("no name", r));
    let mut r = good.clone();
    r.volume_capabilities.clear();
    cases.push(("no capabilities", r));
    let mut r = good.clone();
    r.volume_capabilities = vec![block];
    cases.push(("block", r));
    for (k, v) in [
        ("nfs-shareClient", "anyone"),
        ("cephfs-mounter", "nfs"),
        ("type", ""),
        ("appendShareMetadata", "{"),
        ("autoTopology", "maybe"),
    ] {
        let mut r = good.clone();
        r.parameters.insert(k.into(), v.into());
        cases.push((k, r));
    }
    let mut r = good.clone();
    r.secrets.remove("os-authURL");
    cases.push(("secret without os-authURL", r));
    let mut r = good.clone();
    r.capacity_range = Some(csi::CapacityRange {
        required_bytes: -1,
        limit_bytes: 0,
    });
    cases.push(("negative size", r));
    for (what, req) in cases {
        let err = e.c.create_volume(req).await.unwrap_err();
        assert_eq!(
            err.code(),
            Code::InvalidArgument,
            "{what}: {}",
            err.message()
        );
    }
    let malformed = "../../etc";
    assert!(e.delete(malformed).await.is_ok(), "no share has that id");
    let err =
        e.c.create_snapshot(csi::CreateSnapshotRequest {
            source_volume_id: malformed.into(),
            name: "s".into(),
            secrets: e.secrets.clone(),
            parameters: HashMap::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);

    // node: paths outside the root, traversal, malformed ids
    let outside = tempfile::tempdir().unwrap();
    let (staging, target) = e.h.paths("v", "pod");
    let cap = Some(rwx());
    for (what, staging_path, target_path) in [
        (
            "staging outside",
            outside.path().to_string_lossy().into_owned(),
            target.to_string_lossy().into_owned(),
        ),
        (
            "staging with ..",
            format!("{}/../../..{}", staging.display(), outside.path().display()),
            target.to_string_lossy().into_owned(),
        ),
        (
            "relative target",
            staging.to_string_lossy().into_owned(),
            "pods/x".into(),
        ),
    ] {
        let err =
            e.n.node_publish_volume(csi::NodePublishVolumeRequest {
                volume_id: "v".into(),
                staging_target_path: staging_path.clone(),
                target_path,
                volume_capability: cap.clone(),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{what}");
        let err =
            e.n.node_stage_volume(csi::NodeStageVolumeRequest {
                volume_id: "v".into(),
                staging_target_path: staging_path,
                volume_capability: cap.clone(),
                secrets: e.secrets.clone(),
                ..Default::default()
            })
            .await
            .unwrap_err();
        if what != "relative target" {
            assert_eq!(err.code(), Code::InvalidArgument, "{what}");
        }
    }
    let err =
        e.n.node_stage_volume(csi::NodeStageVolumeRequest {
            volume_id: malformed.into(),
            staging_target_path: staging.to_string_lossy().into(),
            volume_capability: cap.clone(),
            secrets: e.secrets.clone(),
            volume_context: params(&[("shareID", malformed), ("shareAccessIDs", "a")]),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{}", err.message());
    let err =
        e.n.node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
            volume_id: "v".into(),
            volume_path: "some/path".into(),
            staging_target_path: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    assert!(
        e.share_calls().is_empty(),
        "no Manila call for bad input: {:?}",
        e.share_calls()
    );
    assert!(outside.path().exists());
}

#[tokio::test]
async fn secrets_and_keys_never_reach_the_log() {
    if !root() {
        return;
    }
    let log_dir = tempfile::tempdir().unwrap();
    let log = log_dir.path().join("plugin.log");
    let log_path = log.clone();
    let mut e = env_with("CEPHFS", move |o| {
        o.log_file = Some(log_path);
        o.log_level = "debug".into();
    })
    .await;
    let v = e.create("pvc-secret", 1, &[("type", "cephfs")]).await;
    e.stage(&v, rwx()).await;
    let t = e.publish(&v, "pod-a", false).await;
    e.stats(&t).await;
    e.unpublish(&v, "pod-a").await;
    e.unstage(&v).await;
    let key = e.manila.list_access_rules(&v.volume_id).await.unwrap()[0]
        .access_key
        .clone()
        .unwrap();
    e.delete(&v.volume_id).await.unwrap();
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("NodeStageVolume"),
        "the debug log was written"
    );
    assert!(
        !text.contains("demo-secret"),
        "the password leaked into the log"
    );
    assert!(!text.contains(&key), "the cephx key leaked into the log");
    for c in e.h.helper_calls() {
        assert!(
            !format!("{c:?}").contains(&key),
            "key on a command line: {c:?}"
        );
    }
}

#[tokio::test]
async fn topology_follows_the_node_and_auto_topology() {
    let mut e = env_with("NFS", |o| {
        o.stand_ins = false;
        o.extra_args
            .push("--default-nfs-share-client=10.0.0.0/8".into());
    })
    .await;
    let info =
        e.n.node_get_info(csi::NodeGetInfoRequest {})
            .await
            .unwrap()
            .into_inner();
    assert_eq!(info.node_id, e.h.node_id);
    assert_eq!(
        info.accessible_topology.unwrap().segments["topology.manila.csi.openstack.org/zone"],
        "nova"
    );
    let zone_b = csi::Topology {
        segments: HashMap::from([(
            "topology.manila.csi.openstack.org/zone".to_string(),
            "zone-b".to_string(),
        )]),
    };
    let mut req = e.create_req("pvc-auto", 1, &[("autoTopology", "true")]);
    req.accessibility_requirements = Some(csi::TopologyRequirement {
        requisite: vec![zone_b.clone()],
        preferred: vec![zone_b.clone()],
    });
    let v =
        e.c.create_volume(req)
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
    assert_eq!(v.accessible_topology, vec![zone_b]);
    assert_eq!(
        e.manila
            .get_share(&v.volume_id)
            .await
            .unwrap()
            .availability_zone
            .as_deref(),
        Some("zone-b")
    );
}

#[tokio::test]
async fn rotated_credentials_apply_without_a_restart() {
    if !root() {
        return;
    }
    let mut e = env("NFS").await;
    let list = || csi::ListVolumesRequest::default();
    // calls without secrets use the plugin's own credentials
    e.c.list_volumes(list()).await.unwrap();
    let ctl = e.h.emulator.control();
    assert!(ctl.set_password("demo", "rotated-secret"));
    let err = e.c.list_volumes(list()).await.unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated, "{}", err.message());
    // the file edited in place (no symlink): picked up without a restart
    let text = std::fs::read_to_string(&e.h.cloud_conf).unwrap();
    std::fs::write(
        &e.h.cloud_conf,
        text.replace("demo-secret", "rotated-secret"),
    )
    .unwrap();
    let mut done = false;
    for _ in 0..100 {
        match e.c.list_volumes(list()).await {
            Ok(_) => {
                done = true;
                break;
            }
            Err(s) => assert_eq!(s.code(), Code::Unauthenticated, "{}", s.message()),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(done, "the new password was never used");
}

/// Connections a listener accepted: a stand-in for a server a Secret's
/// author controls.
async fn listener_counting() -> (String, Arc<std::sync::atomic::AtomicUsize>) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let n = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = n.clone();
    tokio::spawn(async move {
        while let Ok((_s, _)) = l.accept().await {
            seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    });
    (format!("http://{addr}/v3"), n)
}

#[tokio::test]
async fn a_secret_cannot_turn_the_plugins_own_files_against_it() {
    let allowed = tempfile::tempdir().unwrap();
    let private = tempfile::tempdir().unwrap();
    let allowed_dir = allowed.path().to_path_buf();
    let mut e = env_with("NFS", |o| {
        o.extra_args
            .push(format!("--secret-file-dir={}", allowed_dir.display()));
    })
    .await;
    let s = e.secrets.clone();
    // the plugin's own clouds.yaml, as OpenShift's operator mounts it
    let clouds = allowed.path().join("clouds.yaml");
    std::fs::write(
        &clouds,
        format!(
            "clouds:\n  admin:\n    region_name: RegionOne\n    auth:\n      auth_url: {}\n      username: {}\n      password: {}\n      project_name: {}\n      user_domain_name: Default\n      project_domain_name: Default\n",
            s["os-authURL"], s["os-userName"], s["os-password"], s["os-projectName"]
        ),
    )
    .unwrap();
    // a file the plugin holds that a Secret must not reach
    let conf = private.path().join("cloud.conf");
    std::fs::write(&conf, "[Global]\npassword = operator-password\n").unwrap();
    let (attacker, connections) = listener_counting().await;
    let secret = |pairs: &[(&str, String)]| -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect()
    };
    let create = |name: &str, secrets: HashMap<String, String>| csi::CreateVolumeRequest {
        name: name.into(),
        volume_capabilities: vec![rwx()],
        parameters: params(&[("nfs-shareClient", "10.0.0.1")]),
        secrets,
        ..Default::default()
    };
    let use_clouds = |file: &Path, cloud: &str| {
        vec![
            ("os-useClouds", "true".to_string()),
            ("os-cloudsFile", file.display().to_string()),
            ("os-cloud", cloud.to_string()),
        ]
    };

    // credentials loaded from the plugin's file, sent elsewhere: refused
    for extra in [
        ("os-authURL", attacker.clone()),
        ("os-TLSInsecure", "true".to_string()),
        ("os-endpointType", "internal".to_string()),
        (
            "os-certAuthority",
            "-----BEGIN CERTIFICATE-----".to_string(),
        ),
    ] {
        let mut pairs = use_clouds(&clouds, "admin");
        pairs.push(extra.clone());
        let err =
            e.c.create_volume(create("pvc-steal", secret(&pairs)))
                .await
                .unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{}", err.message());
        assert!(err.message().contains(extra.0), "{}", err.message());
    }
    assert_eq!(connections.load(std::sync::atomic::Ordering::SeqCst), 0);

    // files outside the allowed directories: one answer whether they exist
    // or not, never their content
    let answer = |path: &Path| -> Vec<(&'static str, HashMap<String, String>)> {
        let mut plain: Vec<(&str, String)> =
            s.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
        let mut ca = plain.clone();
        ca.push(("os-certAuthorityPath", path.display().to_string()));
        plain.push(("os-clientCertPath", path.display().to_string()));
        plain.push(("os-clientKeyPath", path.display().to_string()));
        vec![
            ("os-cloudsFile", secret(&use_clouds(path, "admin"))),
            ("os-certAuthorityPath", secret(&ca)),
            ("os-clientCertPath", secret(&plain)),
        ]
    };
    let missing = private.path().join("missing");
    let link = allowed.path().join("link");
    std::os::unix::fs::symlink(&conf, &link).unwrap();
    for ((key, present), (_, absent)) in answer(&conf).into_iter().zip(answer(&missing)) {
        let a =
            e.c.create_volume(create("pvc-read", present))
                .await
                .unwrap_err();
        let b =
            e.c.create_volume(create("pvc-read", absent))
                .await
                .unwrap_err();
        assert_eq!(a.code(), Code::InvalidArgument, "{}", a.message());
        assert_eq!(b.code(), Code::InvalidArgument, "{}", b.message());
        assert!(a.message().contains(key), "{}", a.message());
        assert!(
            !a.message().contains("operator-password") && !a.message().contains("Global"),
            "{}",
            a.message()
        );
        assert_eq!(
            a.message().replace(&conf.display().to_string(), "P"),
            b.message().replace(&missing.display().to_string(), "P"),
            "an existing file and a missing one get the same answer"
        );
    }
    // a symlink in an allowed directory that leads out is refused alike
    let err =
        e.c.create_volume(create("pvc-link", secret(&use_clouds(&link, "admin"))))
            .await
            .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{}", err.message());
    assert!(
        !err.message().contains("operator-password"),
        "{}",
        err.message()
    );
    // a cloud the file does not define: the answer does not list the others
    let err =
        e.c.create_volume(create("pvc-cloud", secret(&use_clouds(&clouds, "nope"))))
            .await
            .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{}", err.message());
    assert!(!err.message().contains("admin"), "{}", err.message());

    // upstream's uses keep working: the plugin's clouds.yaml as it is
    let v =
        e.c.create_volume(create("pvc-clouds", secret(&use_clouds(&clouds, "admin"))))
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
    e.delete(&v.volume_id).await.unwrap();
    assert_eq!(connections.load(std::sync::atomic::Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_volume_context_cannot_borrow_another_shares_access_rule() {
    if !root() {
        return;
    }
    let mut e = env("CEPHFS").await;
    let a = e.create("pvc-a", 1, &[("type", "cephfs")]).await;
    let b = e.create("pvc-b", 1, &[("type", "cephfs")]).await;
    let b_rule = b.volume_context["shareAccessIDs"].clone();
    let calls_before = e.h.helper_calls().len();
    // share a's handle with share b's rule (and its cephx key)
    let mut req = e.stage_req(&a, rwx());
    req.volume_context
        .insert("shareAccessIDs".into(), b_rule.clone());
    let err = e.n.node_stage_volume(req).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{}", err.message());
    assert_eq!(
        e.h.helper_calls().len(),
        calls_before,
        "nothing was mounted with another share's key"
    );
    // its own rule still stages
    e.stage(&a, rwx()).await;
    e.unstage(&a).await;
    e.delete(&a.volume_id).await.unwrap();
    e.delete(&b.volume_id).await.unwrap();
}

#[tokio::test]
async fn what_a_hostile_cloud_answers_never_reaches_mount_or_a_ceph_file() {
    if !root() {
        return;
    }
    // NFS: an export location that would be read as mount options
    let mut e = env("NFS").await;
    let created = e
        .create("pvc-hostile-nfs", 1, &[("nfs-shareClient", "10.0.0.1")])
        .await;
    // a context without export locations (a static PV): Manila is asked
    let mut v = created.clone();
    v.volume_context.remove("exportLocations");
    let lie = |path_contains: &str, body: serde_json::Value| {
        FaultRule::new(
            Some("GET"),
            path_contains,
            FaultAction::Json { status: 200, body },
        )
    };
    for export in [
        "-oexec,suid:/x",
        "127.0.0.1:/shares/a b",
        "127.0.0.1:/shares/a\nb",
    ] {
        e.h.emulator.control().clear_faults();
        e.h.emulator.control().add_fault(lie(
            "/export_locations",
            serde_json::json!({"export_locations": [
                {"id": "x", "path": export, "preferred": true, "is_admin_only": false}
            ]}),
        ));
        let before = e.h.helper_calls().len();
        let err =
            e.n.node_stage_volume(e.stage_req(&v, rwx()))
                .await
                .unwrap_err();
        assert_eq!(
            err.code(),
            Code::FailedPrecondition,
            "{export:?}: {}",
            err.message()
        );
        assert_eq!(e.h.helper_calls().len(), before, "{export:?}: mount(8) ran");
    }
    e.h.emulator.control().clear_faults();
    // the same answers written into the volume context are never
    // mounted: the stage looks the share up and mounts what Manila says
    for export in ["-oexec,suid:/x", "127.0.0.1:/shares/a b"] {
        let mut ctx = created.clone();
        ctx.volume_context.insert(
            "exportLocations".into(),
            serde_json::json!([[export, true]]).to_string(),
        );
        e.stage(&ctx, rwx()).await;
        let call = e.h.helper_calls().pop().unwrap();
        assert!(
            call.source.starts_with("127.0.0.1:/shares/share-"),
            "{call:?}"
        );
        e.unstage(&ctx).await;
    }

    // CephFS: monitors and a cephx user or key that would write into the
    // ceph.conf or the keyring, or add mount options
    let mut e = env("CEPHFS").await;
    let mut v = e.create("pvc-hostile-ceph", 1, &[("type", "cephfs")]).await;
    v.volume_context.remove("exportLocations");
    let rule_id = v.volume_context["shareAccessIDs"].clone();
    let rule = |to: &str, key: &str| {
        serde_json::json!({"access": {
            "id": rule_id, "share_id": v.volume_id, "access_type": "cephx",
            "access_to": to, "access_level": "rw", "state": "active", "access_key": key
        }})
    };
    let good_key = "AQBv4n1mAAAAABAA7n7b5aXfJ0mD0pZJ1S6L9w==";
    let cases = vec![
        lie(
            "/share-access-rules/",
            rule("a,secretfile=/etc/shadow", good_key),
        ),
        lie("/share-access-rules/", rule("a\n[client.admin]", good_key)),
        lie(
            "/share-access-rules/",
            rule("user", "AQ==\n\tcaps mon = allow *"),
        ),
        lie(
            "/export_locations",
            serde_json::json!({"export_locations": [{"id": "x",
                "path": "127.0.0.1:6789\nkeyring = /etc/shadow:/volumes/x",
                "preferred": true, "is_admin_only": false}]}),
        ),
    ];
    for fault in cases {
        e.h.emulator.control().clear_faults();
        e.h.emulator.control().add_fault(fault.clone());
        let before = e.h.helper_calls().len();
        let err =
            e.n.node_stage_volume(e.stage_req(&v, rwx()))
                .await
                .unwrap_err();
        assert_eq!(
            err.code(),
            Code::FailedPrecondition,
            "{fault:?}: {}",
            err.message()
        );
        assert!(
            !err.message().contains("caps mon"),
            "the key is never quoted"
        );
        assert_eq!(e.h.helper_calls().len(), before, "{fault:?}: a mount ran");
        assert!(
            !std::fs::read_dir(e.h.state_dir.join("volumes"))
                .map(|d| d.flatten().any(|f| f.path().join("keyring").exists()))
                .unwrap_or(false),
            "no keyring written"
        );
    }
    e.h.emulator.control().clear_faults();
    // the real answers still stage
    e.stage(&v, rwx()).await;
    e.unstage(&v).await;
}

/// Manila calls recorded since the last clear, as "METHOD path-tail".
fn manila_calls(e: &Env) -> Vec<String> {
    e.h.emulator
        .control()
        .calls()
        .iter()
        .filter(|c| c.path.starts_with("/share/"))
        .map(|c| {
            let tail: Vec<&str> = c.path.rsplit('/').take(2).collect();
            format!(
                "{} {}",
                c.method,
                tail.into_iter().rev().collect::<Vec<_>>().join("/")
            )
        })
        .collect()
}

#[tokio::test]
async fn node_stage_asks_manila_only_for_the_access_rule() {
    if !root() {
        return;
    }
    for (protocol, params) in [
        ("NFS", vec![("nfs-shareClient", "10.0.0.1")]),
        ("CEPHFS", vec![("type", "cephfs")]),
    ] {
        let mut e = env(protocol).await;
        let v = e.create("pvc-fast", 1, &params).await;
        let exports = v.volume_context.get("exportLocations").cloned();
        assert!(exports.is_some(), "{protocol}: {:?}", v.volume_context);
        e.h.emulator.control().clear_calls();
        e.stage(&v, rwx()).await;
        let calls = manila_calls(&e);
        assert_eq!(calls.len(), 1, "{protocol}: {calls:?}");
        assert!(calls[0].starts_with("GET share-access-rules/"), "{calls:?}");
        e.unstage(&v).await;

        // a volume from before the change (or a static PV): the share,
        // its rule and its export locations are looked up
        let mut old = v.clone();
        old.volume_context.remove("exportLocations");
        old.volume_context.remove("cephfs-fsName");
        e.h.emulator.control().clear_calls();
        e.stage(&old, rwx()).await;
        let calls = manila_calls(&e);
        assert!(
            calls.iter().any(|c| c.ends_with("/export_locations")),
            "{protocol}: {calls:?}"
        );
        let looked_up = e.h.helper_calls().pop().unwrap().source;
        e.unstage(&old).await;

        // a stale context (the export moved away): the mount fails, the
        // share is looked up and what Manila says is mounted
        let mut stale = v.clone();
        let moved = if protocol == "NFS" {
            r#"[["127.0.0.9:/shares/moved",true]]"#
        } else {
            r#"[["127.0.0.9:6789:/volumes/_nogroup/moved",true]]"#
        };
        stale
            .volume_context
            .insert("exportLocations".into(), moved.into());
        e.h.emulator.control().clear_calls();
        if protocol == "NFS" {
            e.stage(&stale, rwx()).await;
            assert_eq!(e.h.helper_calls().pop().unwrap().source, looked_up);
            assert!(
                manila_calls(&e)
                    .iter()
                    .any(|c| c.ends_with("/export_locations"))
            );
            e.unstage(&stale).await;
        }
        // a context naming a rule that is gone: the same lookup, and the
        // answer says the rule is not there
        let mut gone = v.clone();
        gone.volume_context.insert(
            "shareAccessIDs".into(),
            "00000000-0000-4000-8000-000000000000".into(),
        );
        let err =
            e.n.node_stage_volume(e.stage_req(&gone, rwx()))
                .await
                .unwrap_err();
        assert_eq!(err.code(), Code::FailedPrecondition, "{}", err.message());
        e.delete(&v.volume_id).await.unwrap();
    }
}
