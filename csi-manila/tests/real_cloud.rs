//! `manila-csi-plugin` against the real test cloud: real Keystone, real
//! Manila with its own CephFS native driver, a real Ceph cluster, and
//! real ceph-fuse mounts shared by several publishers. Start the cloud
//! with `python3 tests/openstack/cloud.py up file` (or `all`), then
//! `OPENSTACK_TEST_BACKEND=real cargo test -p csi-manila --test real_cloud
//! -- --ignored`. The tests are ignored otherwise (they need root and
//! the cloud), and run one at a time: one of them freezes Ceph.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use openstack_client::manila::{AccessRuleState, CreateShare, GrantAccess};
use proto::csi::v1 as csi;
use proto::csi::v1::volume_capability::access_mode::Mode;
use tonic::Code;

mod real_common;
use real_common::*;

fn ceph_fuse_processes_under(dir: &Path) -> usize {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| {
            let comm = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default();
            let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
            let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
            comm.trim() == "ceph-fuse"
                && !stat.contains(") Z")
                && String::from_utf8_lossy(&cmd).contains(&*dir.to_string_lossy())
        })
        .count()
}

/// Statvfs in a thread, bounded: a look at a frozen cluster's mount hangs.
fn bounded_total_bytes(path: &Path) -> Option<u64> {
    let p = path.to_path_buf();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(host_ops::volume_usage(&p).map(|u| u.total_bytes).ok());
    });
    rx.recv_timeout(Duration::from_secs(5)).ok().flatten()
}

/// A CephFS share made through the plugin: its cephx user (the share's
/// name, which its one access rule names), its volume, its export
/// location's path and the user's key.
async fn cephfs_share(e: &mut Env, prefix: &str) -> (String, csi::Volume, String, String) {
    let name = unique(prefix);
    let v = e.create(&name, 1, None).await;
    let exports = e.manila.list_export_locations(&v.volume_id).await.unwrap();
    let rule = e
        .manila
        .list_access_rules(&v.volume_id)
        .await
        .unwrap()
        .remove(0);
    assert_eq!(rule.access_to, name);
    let key = rule.access_key.clone().unwrap();
    let export = exports[0].path.clone();
    (name, v, export, key)
}

#[tokio::test]
#[ignore = "needs root and the real test cloud (tests/openstack/cloud.py up file)"]
async fn cephfs_share_lives_through_csi_on_real_manila_and_ceph() {
    let _serial = SERIAL.lock().await;
    let mut e = env("CEPHFS", &[("type", "cephfs")]).await;
    let (name, v, export, key) = cephfs_share(&mut e, "rwx").await;
    let id = v.volume_id.clone();
    let subvolume_path = export.split_once(":/").unwrap().1.to_string();

    // one ceph-fuse mount, two writers, one reader
    let staging = e.stage(&id, &v.volume_context).await;
    let m = host_ops::mounts_at(&staging).unwrap();
    assert_eq!(m.last().unwrap().fs_type, "fuse.ceph-fuse", "{m:?}");
    assert_eq!(ceph_fuse_processes_under(&e.h.state_dir), 1);
    let a = e.publish(&id, "pod-a", false).await;
    let b = e.publish(&id, "pod-b", false).await;
    let ro = e.publish(&id, "pod-c", true).await;
    std::fs::write(a.join("hello"), b"written in pod a").unwrap();
    assert_eq!(std::fs::read(b.join("hello")).unwrap(), b"written in pod a");
    std::fs::write(b.join("back"), b"and in b").unwrap();
    assert_eq!(std::fs::read(a.join("back")).unwrap(), b"and in b");
    let err = std::fs::write(ro.join("nope"), b"x").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(nix::libc::EROFS), "{err}");
    assert_eq!(
        bounded_total_bytes(&a),
        Some(GIB as u64),
        "df shows the quota"
    );
    let st = e.stats(&a).await;
    assert!(!st.volume_condition.unwrap().abnormal);

    // growth shows in df at once
    let grown = e.expand(&id, 2).await;
    assert_eq!(grown.capacity_bytes, 2 * GIB);
    let until = Instant::now() + Duration::from_secs(10);
    while bounded_total_bytes(&a) != Some(2 * GIB as u64) && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(bounded_total_bytes(&a), Some(2 * GIB as u64));

    // a snapshot, a share from it, and a clone: both hold the file
    let snap = e.snapshot(&id, &unique("snap")).await;
    let mut tries = 0;
    while !e
        .c
        .list_snapshots(timed(csi::ListSnapshotsRequest {
            snapshot_id: snap.snapshot_id.clone(),
            secrets: e.h.secrets.clone(),
            ..Default::default()
        }))
        .await
        .unwrap()
        .into_inner()
        .entries
        .first()
        .and_then(|x| x.snapshot.as_ref())
        .is_some_and(|s| s.ready_to_use)
    {
        tries += 1;
        assert!(tries < 100, "snapshot never ready");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // larger than their 2 GiB source: the share's quota must be what was
    // asked (Manila's CephFS driver clones at the source's size and would
    // leave it there)
    let restored = e
        .create(&unique("restored"), 3, of_snapshot(&snap.snapshot_id))
        .await;
    let clone = e.create(&unique("clone"), 3, of_volume(&id)).await;
    for copy in [&restored, &clone] {
        assert_eq!(copy.capacity_bytes, 3 * GIB);
        assert_eq!(e.manila.get_share(&copy.volume_id).await.unwrap().size, 3);
    }
    // restored for readers only (ReadOnlyMany): its cephx key reads and
    // Ceph refuses its writes, even through a read-write publish
    let for_readers = e
        .create_as(
            &unique("readers"),
            2,
            of_snapshot(&snap.snapshot_id),
            Mode::MultiNodeReaderOnly,
        )
        .await;
    e.stage(&for_readers.volume_id, &for_readers.volume_context)
        .await;
    let t = e.publish(&for_readers.volume_id, "pod-a", false).await;
    assert_eq!(std::fs::read(t.join("hello")).unwrap(), b"written in pod a");
    let err = std::fs::write(t.join("scribble"), b"x").unwrap_err();
    assert!(
        matches!(
            err.raw_os_error(),
            Some(nix::libc::EACCES | nix::libc::EPERM | nix::libc::EROFS)
        ),
        "{err}"
    );
    e.unpublish(&for_readers.volume_id, "pod-a").await.unwrap();
    e.unstage(&for_readers.volume_id).await.unwrap();

    for copy in [&restored, &clone] {
        e.stage(&copy.volume_id, &copy.volume_context).await;
        let t = e.publish(&copy.volume_id, "pod-a", false).await;
        assert_eq!(
            std::fs::read(t.join("hello")).unwrap(),
            b"written in pod a",
            "{} holds the source's file",
            copy.volume_id
        );
        assert_eq!(
            bounded_total_bytes(&t),
            Some(3 * GIB as u64),
            "{}: df in the pod shows the size asked for, not the source's",
            copy.volume_id
        );
        e.unpublish(&copy.volume_id, "pod-a").await.unwrap();
        e.unstage(&copy.volume_id).await.unwrap();
    }

    // take it all down: nothing mounted, no ceph-fuse left
    for pod in ["pod-a", "pod-b", "pod-c"] {
        e.unpublish(&id, pod).await.unwrap();
        e.unpublish(&id, pod).await.unwrap();
    }
    e.unstage(&id).await.unwrap();
    e.unstage(&id).await.unwrap();
    assert!(!e.mounted(&staging));
    assert!(csi_sanity::harness::mounts_below(e.h.dir.path()).is_empty());
    let until = Instant::now() + Duration::from_secs(5);
    while ceph_fuse_processes_under(&e.h.state_dir) > 0 && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(ceph_fuse_processes_under(&e.h.state_dir), 0);

    for v in [&restored, &clone, &for_readers] {
        e.delete(&v.volume_id).await;
    }
    e.delete_snapshot(&snap.snapshot_id).await;
    e.delete(&id).await;

    // the subvolume is gone, the cephx user deauthorized: its key no
    // longer mounts
    let ls =
        String::from_utf8_lossy(&ceph(&["fs", "subvolume", "ls", "cephfs"]).stdout).into_owned();
    let subvolume = subvolume_path.split('/').nth(3).unwrap().to_string();
    assert!(!ls.contains(&subvolume), "{subvolume} still in {ls}");
    assert!(
        !ceph(&["auth", "get", &format!("client.{name}")])
            .status
            .success(),
        "client.{name} still exists"
    );
    let probe = tempfile::tempdir().unwrap();
    std::fs::write(
        probe.path().join("ceph.conf"),
        "[global]\nmon_host = 127.0.0.1:6789\n",
    )
    .unwrap();
    let keyring = probe.path().join("keyring");
    std::fs::write(&keyring, format!("[client.{name}]\n\tkey = {key}\n")).unwrap();
    std::fs::create_dir(probe.path().join("mnt")).unwrap();
    let out = std::process::Command::new("timeout")
        .args(["20", "ceph-fuse", "--conf"])
        .arg(probe.path().join("ceph.conf"))
        .args(["--id", &name, "--keyring"])
        .arg(&keyring)
        .args(["-r", &format!("/{subvolume_path}"), "--client_fs=cephfs"])
        .arg(probe.path().join("mnt"))
        .output()
        .unwrap();
    let mounted = e.mounted(&probe.path().join("mnt"));
    if mounted {
        let _ = nix::mount::umount2(&probe.path().join("mnt"), nix::mount::MntFlags::MNT_DETACH);
    }
    assert!(
        !out.status.success() && !mounted,
        "the revoked key still mounts"
    );
}

#[tokio::test]
#[ignore = "needs root and the real test cloud (tests/openstack/cloud.py up file)"]
async fn static_pv_of_a_hand_made_share_is_staged_and_never_deleted() {
    let _serial = SERIAL.lock().await;
    let mut e = env("CEPHFS", &[("type", "cephfs")]).await;
    let share = e
        .manila
        .create_share(&CreateShare {
            protocol: "CEPHFS".into(),
            size_gib: 1,
            name: unique("static"),
            share_type: Some("cephfs".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    let until = Instant::now() + Duration::from_secs(60);
    while e.manila.get_share(&share.id).await.unwrap().status.as_str() != "available" {
        assert!(Instant::now() < until, "share never available");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let rule = e
        .manila
        .grant_access(
            &share.id,
            &GrantAccess {
                access_type: "cephx".into(),
                access_to: unique("static-user"),
                access_level: "rw".into(),
            },
        )
        .await
        .unwrap();
    while e
        .manila
        .get_access_rule(&share.id, &rule.id)
        .await
        .unwrap()
        .state
        != AccessRuleState::Active
    {
        assert!(Instant::now() < until, "rule never active");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // a static PV: its own handle, the share and its rule in attributes
    // (the older shareAccessID key, as upstream's docs write it)
    let context = HashMap::from([
        ("shareID".to_string(), share.id.clone()),
        ("shareAccessID".to_string(), rule.id.clone()),
    ]);
    let staging = e.stage("static-pv-1", &context).await;
    let t = e.publish("static-pv-1", "pod-a", false).await;
    std::fs::write(t.join("f"), b"static").unwrap();
    assert_eq!(std::fs::read(staging.join("f")).unwrap(), b"static");
    e.unpublish("static-pv-1", "pod-a").await.unwrap();
    e.unstage("static-pv-1").await.unwrap();
    assert!(!e.mounted(&staging));
    // not provisioned by the driver: DeleteVolume refuses, the share stays
    let err =
        e.c.delete_volume(timed(csi::DeleteVolumeRequest {
            volume_id: share.id.clone(),
            secrets: e.h.secrets.clone(),
        }))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert!(e.manila.get_share(&share.id).await.is_ok());
    e.manila.revoke_access(&share.id, &rule.id).await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    e.manila.delete_share(&share.id).await.unwrap();
}

/// Freezes the test cloud's Ceph daemons (SIGSTOP), as an unreachable
/// cluster; thaws them on drop, also when the test fails.
struct FrozenCeph(Vec<i32>);

impl FrozenCeph {
    fn freeze() -> Self {
        let pids: Vec<i32> = ["ceph-mon", "ceph-mgr", "ceph-osd", "ceph-mds"]
            .iter()
            .filter_map(|n| {
                std::fs::read_to_string(cloud_dir().join(format!("pids/{n}.pid")))
                    .ok()?
                    .trim()
                    .parse()
                    .ok()
            })
            .collect();
        assert_eq!(pids.len(), 4, "the test cloud runs no Ceph");
        for p in &pids {
            nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(*p),
                nix::sys::signal::Signal::SIGSTOP,
            )
            .unwrap();
        }
        Self(pids)
    }
}

impl Drop for FrozenCeph {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(*p),
                nix::sys::signal::Signal::SIGCONT,
            );
        }
    }
}

#[tokio::test]
#[ignore = "needs root and the real test cloud (tests/openstack/cloud.py up file)"]
async fn dead_daemons_and_a_frozen_cluster_are_survived() {
    let _serial = SERIAL.lock().await;
    let mut e = env("CEPHFS", &[("type", "cephfs")]).await;
    let v = e.create(&unique("faults"), 1, None).await;
    let id = v.volume_id.clone();
    e.stage(&id, &v.volume_context).await;
    let a = e.publish(&id, "pod-a", false).await;
    // written through to the OSDs: a killed ceph-fuse loses what only its
    // cache held, as any client killed before fsync would
    {
        use std::io::Write;
        let mut f = std::fs::File::create(a.join("kept")).unwrap();
        f.write_all(b"data").unwrap();
        f.sync_all().unwrap();
    }

    // the ceph-fuse daemon killed under a published volume
    let pid_file = std::fs::read_dir(e.h.state_dir.join("volumes"))
        .unwrap()
        .filter_map(Result::ok)
        .map(|d| d.path().join("ceph-fuse.pid"))
        .find(|p| p.exists())
        .unwrap();
    let pid: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let cond = e.stats(&a).await.volume_condition.unwrap();
    assert!(cond.abnormal, "a dead daemon is abnormal: {cond:?}");
    // NodeStage again repairs it; a new publish sees the data
    e.stage(&id, &v.volume_context).await;
    e.unpublish(&id, "pod-a").await.unwrap();
    let a = e.publish(&id, "pod-a", false).await;
    assert_eq!(std::fs::read(a.join("kept")).unwrap(), b"data");
    assert!(!e.stats(&a).await.volume_condition.unwrap().abnormal);

    // the cluster stops answering under the mount: the calls still end
    // within their deadline and leave nothing mounted
    let frozen = FrozenCeph::freeze();
    let cond = e.stats(&a).await.volume_condition.unwrap();
    assert!(cond.abnormal, "{cond:?}");
    let t0 = Instant::now();
    e.unpublish(&id, "pod-a").await.unwrap();
    e.unstage(&id).await.unwrap();
    assert!(
        t0.elapsed() < Duration::from_secs(30),
        "took {:?}",
        t0.elapsed()
    );
    assert!(csi_sanity::harness::mounts_below(e.h.dir.path()).is_empty());
    assert_eq!(ceph_fuse_processes_under(&e.h.state_dir), 0);
    drop(frozen);
    e.delete(&id).await;
}

/// The orphan report against real Manila and a stand-in apiserver: what
/// the controller made carries the identity the apiserver answered with
/// (real Manila keeps the metadata key), a snapshot the driver made is
/// told from a backup job's of the same share by the description real
/// Manila returns, another cluster's share under the same cluster id is
/// never a candidate, and a share a PV names is in use.
#[tokio::test]
#[ignore = "needs root and the real test cloud (tests/openstack/cloud.py up file)"]
async fn the_orphan_report_tells_real_manilas_shares_and_snapshots_apart() {
    use csi_sanity::harness::kube::{CLUSTER_UID, StandInApiserver};
    let _serial = SERIAL.lock().await;
    let api = StandInApiserver::start().await.unwrap();
    let mut e = env_with_args("CEPHFS", &[("type", "cephfs")], &api.flags()).await;
    let named = e.create(&unique("orphan-named"), 1, None).await.volume_id;
    let gone = e.create(&unique("orphan-gone"), 1, None).await.volume_id;
    let ours = e.snapshot(&named, &unique("orphan-snap")).await.snapshot_id;
    let backup = e
        .manila
        .create_snapshot(
            &named,
            &unique("nightly-backup"),
            Some("made by the backup job"),
        )
        .await
        .unwrap()
        .id;
    let theirs = e
        .manila
        .create_share(&CreateShare {
            protocol: "CEPHFS".into(),
            size_gib: 1,
            name: unique("pvc-of-another-cluster"),
            share_type: Some("cephfs".into()),
            metadata: [
                (
                    "manila.csi.openstack.org/cluster".to_string(),
                    "sanity-real".to_string(),
                ),
                (
                    "manila.csi.openstack.org/cluster-uid".to_string(),
                    "uid-of-another".to_string(),
                ),
            ]
            .into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .id;
    let identity = e.manila.get_share(&gone).await.unwrap().metadata;
    assert_eq!(
        identity
            .get("manila.csi.openstack.org/cluster-uid")
            .map(String::as_str),
        Some(CLUSTER_UID),
        "{identity:?}"
    );
    api.objects().pvs = vec![("cephfs.manila.csi.openstack.org".into(), named.clone())];
    let report = api
        .orphan_report(
            Path::new(BIN),
            &cloud_dir().join("cloud-member.conf"),
            &[
                "--cluster-id=sanity-real",
                "--drivername=cephfs.manila.csi.openstack.org",
                "--share-protocol-selector=CEPHFS",
                "--older-than=0s",
            ],
        )
        .await
        .unwrap();
    let ids = |key: &str| report.ids(key);
    let (orphans, unproven) = (ids("orphans"), ids("unproven"));
    for id in [&gone, &ours] {
        assert!(orphans.contains(id), "{id} is an orphan: {report:#}");
    }
    for id in [&backup, &theirs] {
        assert!(unproven.contains(id), "{id} is not proven ours: {report:#}");
    }
    assert!(
        !orphans.contains(&named) && !unproven.contains(&named),
        "the named share is in use: {report:#}"
    );
    // the backup's snapshot settles before it can go; the share goes only
    // once its snapshots have
    let settle = Instant::now() + Duration::from_secs(120);
    while e
        .manila
        .get_snapshot(&backup)
        .await
        .is_ok_and(|s| s.status.as_str() == "creating")
        && Instant::now() < settle
    {
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    e.manila.delete_snapshot(&backup).await.unwrap();
    e.delete_snapshot(&ours).await;
    while e.manila.get_snapshot(&backup).await.is_ok() && Instant::now() < settle {
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    for id in [&named, &gone] {
        e.delete(id).await;
    }
    e.manila.delete_share(&theirs).await.unwrap();
}

/// ceph-csi's CephFS node plugin, as upstream's Manila plugin forwards to
/// it (ceph-csi `internal/cephfs/mounter/fuse.go`, `nodeserver.go`): its
/// own ceph-fuse mounted straight at kubelet's staging path with the
/// share's cephx user and a key file, `-r` the share's path, `-o
/// nonempty`, the file system named; each pod's target a bind of the
/// staging path (remounted read-only for a read-only publish). Its
/// daemon's command line carries `marker` (the key file's folder).
fn ceph_csi_stage(staging: &Path, export: &str, user: &str, key: &str, marker: &Path) {
    let (mons, root) = export.split_once(":/").unwrap();
    std::fs::create_dir_all(staging).unwrap();
    std::fs::create_dir_all(marker).unwrap();
    let conf = marker.join("ceph.conf");
    std::fs::write(
        &conf,
        "[global]\nauth_cluster_required = cephx\nauth_service_required = cephx\nauth_client_required = cephx\nfuse_big_writes = true\n",
    )
    .unwrap();
    let keyfile = marker.join("keyfile");
    std::fs::write(&keyfile, key).unwrap();
    let out = std::process::Command::new("timeout")
        .arg("30")
        .arg("ceph-fuse")
        .arg(staging)
        .args(["-m", mons, "-c"])
        .arg(&conf)
        .args(["-n", &format!("client.{user}")])
        .arg(format!("--keyfile={}", keyfile.display()))
        .args(["-r", &format!("/{root}"), "-o", "nonempty"])
        .arg("--client_mds_namespace=cephfs")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ceph-fuse as ceph-csi runs it: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn ceph_csi_publish(staging: &Path, target: &Path, read_only: bool) {
    std::fs::create_dir_all(target).unwrap();
    let run = |args: &[&str]| {
        let st = std::process::Command::new("mount")
            .args(args)
            .arg(staging)
            .arg(target)
            .status()
            .unwrap();
        assert!(st.success(), "mount {args:?}");
    };
    run(&["-o", "bind"]);
    run(&[
        "-o",
        if read_only {
            "bind,remount,ro,_netdev"
        } else {
            "bind,remount,_netdev"
        },
    ]);
}

/// Whatever the test mounted by hand, taken down (also when it fails).
struct HandMounts(Vec<std::path::PathBuf>);

impl Drop for HandMounts {
    fn drop(&mut self) {
        for p in self.0.iter().rev() {
            let _ = nix::mount::umount2(p, nix::mount::MntFlags::MNT_DETACH);
        }
    }
}

#[tokio::test]
#[ignore = "needs root and the real test cloud (tests/openstack/cloud.py up file)"]
async fn a_share_staged_by_ceph_csi_is_served_taken_over_released_and_staged_again() {
    let _serial = SERIAL.lock().await;
    let mut e = env("CEPHFS", &[("type", "cephfs")]).await;
    let (name, v, export, key) = cephfs_share(&mut e, "cephcsi").await;
    let id = v.volume_id.clone();
    let (staging, old_target) = e.h.paths(&id, "pod-old");
    let (_, old_reader) = e.h.paths(&id, "pod-old-reader");
    let theirs = tempfile::tempdir().unwrap();
    let marker = theirs.path().join("ceph-csi-keys");
    let mut hand = HandMounts(vec![
        staging.clone(),
        old_target.clone(),
        old_reader.clone(),
    ]);

    // what upstream's plugin and ceph-csi left on the node: a staging and
    // two pods' binds, one read-only
    ceph_csi_stage(&staging, &export, &name, &key, &marker);
    assert_eq!(
        host_ops::mounts_at(&staging)
            .unwrap()
            .last()
            .unwrap()
            .fs_type,
        "fuse.ceph-fuse"
    );
    ceph_csi_publish(&staging, &old_target, false);
    ceph_csi_publish(&staging, &old_reader, true);
    std::fs::write(old_target.join("before"), b"written through ceph-csi").unwrap();
    assert_eq!(ceph_fuse_processes_under(&marker), 1);

    // ours answers for their mounts: usage and health
    let st = e.stats(&old_target).await;
    assert!(!st.volume_condition.unwrap().abnormal);
    let total = st.usage.iter().find(|u| u.unit == 1).map(|u| u.total);
    assert_eq!(total, Some(GIB), "{:?}", st.usage);

    // a new pod on the node: kubelet, for which the volume is staged,
    // asks ours only to publish (with the node-publish secrets upstream's
    // classes name); ours stages it its own way first
    let (_, new_target) = e.h.paths(&id, "pod-new");
    e.n.node_publish_volume(timed(csi::NodePublishVolumeRequest {
        volume_id: id.clone(),
        staging_target_path: staging.to_string_lossy().into(),
        target_path: new_target.to_string_lossy().into(),
        volume_capability: Some(cap(Mode::MultiNodeMultiWriter)),
        volume_context: v.volume_context.clone(),
        secrets: e.h.secrets.clone(),
        ..Default::default()
    }))
    .await
    .unwrap_or_else(|s| panic!("NodePublishVolume of a share ceph-csi staged: {s}"));
    assert_eq!(
        ceph_fuse_processes_under(&e.h.state_dir),
        1,
        "the staging is ours now"
    );
    assert_eq!(
        std::fs::read(new_target.join("before")).unwrap(),
        b"written through ceph-csi"
    );
    std::fs::write(new_target.join("after"), b"written through ours").unwrap();
    // the old pods still work, through ceph-csi's daemon (their binds hold it)
    let until = Instant::now() + Duration::from_secs(10);
    while std::fs::read(old_target.join("after")).ok().as_deref() != Some(b"written through ours")
        && Instant::now() < until
    {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        std::fs::read(old_target.join("after")).unwrap(),
        b"written through ours"
    );
    let err = std::fs::write(old_reader.join("nope"), b"x").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(nix::libc::EROFS), "{err}");
    assert_eq!(ceph_fuse_processes_under(&marker), 1);

    // the old pods go: ours unpublishes their binds; ceph-csi's daemon
    // ends with its last mount
    for pod in ["pod-old", "pod-old-reader"] {
        e.unpublish(&id, pod).await.unwrap();
        e.unpublish(&id, pod).await.unwrap();
    }
    assert!(!e.mounted(&old_target) && !e.mounted(&old_reader));
    let until = Instant::now() + Duration::from_secs(10);
    while ceph_fuse_processes_under(&marker) > 0 && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        ceph_fuse_processes_under(&marker),
        0,
        "ceph-csi's daemon outlived its mounts"
    );
    e.unpublish(&id, "pod-new").await.unwrap();
    e.unstage(&id).await.unwrap();
    assert!(!e.mounted(&staging));

    // staged by ceph-csi again, then a NodeStage to ours (a kubelet
    // restarted): ours takes it over
    ceph_csi_stage(&staging, &export, &name, &key, &marker);
    e.stage(&id, &v.volume_context).await;
    let t = e.publish(&id, "pod-new", false).await;
    assert_eq!(
        std::fs::read(t.join("after")).unwrap(),
        b"written through ours"
    );
    let until = Instant::now() + Duration::from_secs(10);
    while ceph_fuse_processes_under(&marker) > 0 && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(ceph_fuse_processes_under(&marker), 0);
    assert_eq!(ceph_fuse_processes_under(&e.h.state_dir), 1);
    e.unpublish(&id, "pod-new").await.unwrap();
    e.unstage(&id).await.unwrap();

    // what is not a share's mount at the staging path is not taken down
    std::fs::create_dir_all(&staging).unwrap();
    let st = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "not-a-share"])
        .arg(&staging)
        .status()
        .unwrap();
    assert!(st.success());
    let err =
        e.n.node_stage_volume(timed(csi::NodeStageVolumeRequest {
            volume_id: id.clone(),
            staging_target_path: staging.to_string_lossy().into(),
            volume_capability: Some(cap(Mode::MultiNodeMultiWriter)),
            secrets: e.h.secrets.clone(),
            volume_context: v.volume_context.clone(),
            ..Default::default()
        }))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err}");
    assert!(err.message().contains("tmpfs"), "{err}");
    assert_eq!(
        host_ops::mounts_at(&staging)
            .unwrap()
            .last()
            .unwrap()
            .fs_type,
        "tmpfs",
        "the foreign tmpfs was taken down"
    );
    nix::mount::umount2(&staging, nix::mount::MntFlags::MNT_DETACH).unwrap();
    hand.0.clear();
    assert!(csi_sanity::harness::mounts_below(e.h.dir.path()).is_empty());
    e.delete(&id).await;
}
