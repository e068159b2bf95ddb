//! `manila-csi-plugin`'s node through its socket: NFS and CephFS shares
//! staged and published to pods (kernel and FUSE CephFS with their keys
//! in private files only), and what a stage asks Manila. Node calls go up
//! to the mount(8) boundary through stand-in helpers in a private mount
//! namespace. Tests needing root return early (and say so) without it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Duration;

use openstack_client::manila::AccessRuleState;
use proto::csi::v1 as csi;
use proto::csi::v1::volume_capability::access_mode::Mode;
use tonic::Code;

mod common;
use common::*;

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

// ------------------------------------------- staged by another plugin

/// `mount ARGS... target` in the plugin's mount namespace (where kubelet's
/// directory of the test lives).
fn mount_in_plugin_namespace(e: &Env, args: &[&str], target: &Path) {
    let pid = e.h.plugin_pid().unwrap().to_string();
    let st = std::process::Command::new("nsenter")
        .args(["-t", &pid, "-m", "mount"])
        .args(args)
        .arg(target)
        .status()
        .unwrap();
    assert!(st.success(), "mount {args:?} {}", target.display());
}

#[tokio::test]
async fn an_nfs_share_published_by_csi_driver_nfs_is_released_and_staged_our_way_for_a_new_pod() {
    if !root() {
        return;
    }
    let mut e = env("NFS").await;
    let v = e
        .create("pvc-partner", 1, &[("nfs-shareClient", "10.0.0.0/24")])
        .await;
    let (staging, old) = e.h.paths(&v.volume_id, "pod-old");
    // upstream's plugin forwarded to csi-driver-nfs, which stages nothing
    // (no STAGE_UNSTAGE_VOLUME): kubelet made the staging folder and
    // nothing is mounted there; each pod's target is csi-driver-nfs's own
    // `mount -t nfs` of the export (csi-driver-nfs `pkg/nfs/nodeserver.go`).
    // With no NFS client here, a tmpfs at the target stands for it
    std::fs::create_dir_all(e.h.seen(&staging)).unwrap();
    std::fs::create_dir_all(e.h.seen(&old)).unwrap();
    mount_in_plugin_namespace(&e, &["-t", "tmpfs", "csi-driver-nfs-mount"], &old);
    std::fs::write(e.h.seen(&old).join("before"), b"theirs").unwrap();

    let st = e.stats(&old).await;
    assert!(!st.volume_condition.as_ref().unwrap().abnormal, "{st:?}");
    assert!(st.usage.iter().any(|u| u.total > 0));

    // a new pod: the volume is staged for kubelet, which asks ours only
    // to publish; ours stages it its own way first (with the publish
    // secrets upstream's classes name)
    let (_, new) = e.h.paths(&v.volume_id, "pod-new");
    // kubelet's publish of a pod's target, with the node-publish secrets
    let secrets = e.stage_req(&v, rwx()).secrets;
    let publish_to = |target: &Path| csi::NodePublishVolumeRequest {
        volume_id: v.volume_id.clone(),
        staging_target_path: staging.to_string_lossy().into(),
        target_path: target.to_string_lossy().into(),
        volume_capability: Some(rwx()),
        volume_context: v.volume_context.clone(),
        secrets: secrets.clone(),
        ..Default::default()
    };
    e.n.node_publish_volume(publish_to(&new))
        .await
        .unwrap_or_else(|s| panic!("NodePublishVolume of a volume staged by csi-driver-nfs: {s}"));
    let calls = e.h.helper_calls();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(
        (calls[0].program.as_str(), calls[0].target.as_str()),
        ("nfs", &*staging.to_string_lossy()),
        "staged at kubelet's staging path"
    );
    assert_eq!(
        calls[0].source,
        format!("127.0.0.1:/shares/share-{}", v.volume_id)
    );
    assert!(!e.h.mounts_at(&new).is_empty(), "the new pod's target");
    std::fs::write(e.h.seen(&new).join("ours"), b"through our staging").unwrap();

    // the old pod goes: ours unpublishes csi-driver-nfs's mount
    e.unpublish(&v, "pod-old").await;
    assert!(e.h.mounts_at(&old).is_empty());
    assert!(!e.h.seen(&old).exists());
    e.unpublish(&v, "pod-new").await;
    e.unstage(&v).await;
    assert!(
        e.h.mounts_below_dir().is_empty(),
        "{:?}",
        e.h.mounts_below_dir()
    );

    // a folder kubelet never made is no staging: publish stays refused
    let (_, other) = e.h.paths(&v.volume_id, "pod-other");
    let err =
        e.n.node_publish_volume(publish_to(&other))
            .await
            .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err}");
    assert_eq!(e.h.helper_calls().len(), 1, "nothing staged for it");
    e.delete(&v.volume_id).await.unwrap();
}
