//! Read-only volumes backed by a snapshot (`backingSnapshot: "true"`) on
//! the real test cloud: real Manila with its CephFS driver, real Ceph,
//! real ceph-fuse. What the emulator tier cannot show: that a read-only
//! cephx rule on the snapshot's share mounts it, that CephFS shows the
//! snapshot as the plugin expects, and that the data is the snapshot's.
//! `OPENSTACK_TEST_BACKEND=real cargo test -p csi-manila --test
//! real_cloud_backed -- --ignored` once `tests/openstack/cloud.py up file`
//! (or `all`) is up. `BACKED_FILL_MIB=N` first writes N MiB into the
//! share (default 0), for the figures: how long a backed volume and a
//! restored copy take with data in the snapshot.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use proto::csi::v1 as csi;
use proto::csi::v1::volume_capability::access_mode::Mode;
use tonic::Code;

mod real_common;
use real_common::*;

const BACKING_KEY: &str = "manila.csi.openstack.org/backing-snapshot";

/// The MiB written into the share before its snapshot (`BACKED_FILL_MIB`).
fn fill_mib() -> usize {
    std::env::var("BACKED_FILL_MIB")
        .ok()
        .map(|v| v.parse().expect("BACKED_FILL_MIB: a number of MiB"))
        .unwrap_or(0)
}

/// MiB number `i` of the fill: each one different, none of zeros.
fn fill_block(i: usize) -> Vec<u8> {
    let mut block = vec![0u8; 1 << 20];
    for (j, b) in block.iter_mut().enumerate() {
        *b = (i.wrapping_mul(31) ^ j.wrapping_mul(7)) as u8 | 1;
    }
    block
}

async fn wait_ready(e: &mut Env, snapshot_id: &str) {
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let ready =
            e.c.list_snapshots(timed(csi::ListSnapshotsRequest {
                snapshot_id: snapshot_id.into(),
                secrets: e.h.secrets.clone(),
                ..Default::default()
            }))
            .await
            .unwrap()
            .into_inner()
            .entries
            .first()
            .and_then(|x| x.snapshot.as_ref())
            .is_some_and(|s| s.ready_to_use);
        if ready {
            return;
        }
        assert!(Instant::now() < until, "snapshot {snapshot_id} never ready");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

#[tokio::test]
#[ignore = "needs root and the real test cloud (tests/openstack/cloud.py up file)"]
async fn a_volume_backed_by_a_snapshot_reads_it_through_a_read_only_rule_on_real_ceph() {
    let mut e = env("CEPHFS", &[("type", "cephfs")]).await;
    let fill = fill_mib();
    // room for the fill beside the rest (a share's quota is its size)
    let gib = 1 + fill.div_ceil(1024) as i64;
    let src = e.create(&unique("backed-src"), gib, None).await;
    let id = src.volume_id.clone();
    e.stage(&id, &src.volume_context).await;
    let live = e.publish(&id, "pod-a", false).await;
    std::fs::create_dir_all(live.join("dir")).unwrap();
    std::fs::write(live.join("dir/data"), b"before the snapshot").unwrap();
    if fill > 0 {
        use std::io::Write;
        let t = Instant::now();
        let mut f = std::fs::File::create(live.join("dir/fill")).unwrap();
        for i in 0..fill {
            f.write_all(&fill_block(i)).unwrap();
        }
        f.sync_all().unwrap();
        println!(
            "{fill} MiB written into the share in {:.1} s",
            t.elapsed().as_secs_f64()
        );
    }
    let snap = e.snapshot(&id, &unique("backed-snap")).await;
    wait_ready(&mut e, &snap.snapshot_id).await;
    std::fs::write(live.join("dir/data"), b"after the snapshot").unwrap();
    let shares_before = e
        .manila
        .list_shares(&Default::default())
        .await
        .unwrap()
        .len();

    // the volume: a read-only rule, no share
    e.parameters.insert("backingSnapshot".into(), "true".into());
    let name = unique("backed-ro");
    let t = Instant::now();
    let ro = e
        .create_as(
            &name,
            gib,
            of_snapshot(&snap.snapshot_id),
            Mode::MultiNodeReaderOnly,
        )
        .await;
    let backed_in = t.elapsed();
    assert!(
        ro.volume_id.starts_with("snapshot-backed:"),
        "{}",
        ro.volume_id
    );
    assert_eq!(
        e.manila
            .list_shares(&Default::default())
            .await
            .unwrap()
            .len(),
        shares_before,
        "no share made"
    );
    let rule = e
        .manila
        .list_access_rules(&id)
        .await
        .unwrap()
        .into_iter()
        .find(|r| r.access_to == name)
        .expect("the volume's rule");
    assert_eq!(rule.access_level, "ro");
    assert_eq!(rule.metadata.get(BACKING_KEY), Some(&snap.snapshot_id));

    // the node: real ceph-fuse with the read-only key, the snapshot's data
    let staging = e.stage(&ro.volume_id, &ro.volume_context).await;
    let m = host_ops::mounts_at(&staging).unwrap();
    assert_eq!(m.last().unwrap().fs_type, "fuse.ceph-fuse", "{m:?}");
    let target = e.publish(&ro.volume_id, "pod-b", false).await;
    assert_eq!(
        std::fs::read(target.join("dir/data")).unwrap(),
        b"before the snapshot"
    );
    let err = std::fs::write(target.join("dir/data"), b"x").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(nix::libc::EROFS), "{err}");
    if fill > 0 {
        // the snapshot's data, whole: its first and last MiB as written
        use std::io::{Read, Seek, SeekFrom};
        let mut f = std::fs::File::open(target.join("dir/fill")).unwrap();
        assert_eq!(f.metadata().unwrap().len(), (fill as u64) << 20);
        let mut block = vec![0u8; 1 << 20];
        f.read_exact(&mut block).unwrap();
        assert!(block == fill_block(0), "the fill's first MiB differs");
        f.seek(SeekFrom::Start(((fill - 1) as u64) << 20)).unwrap();
        f.read_exact(&mut block).unwrap();
        assert!(block == fill_block(fill - 1), "the fill's last MiB differs");
    }
    // and the share itself, through the staged mount, refuses the key's
    // writes: the rule is read-only in Ceph, not only the bind
    let err = std::fs::write(staging.join("scribble"), b"x").unwrap_err();
    assert!(
        matches!(
            err.raw_os_error(),
            Some(nix::libc::EACCES | nix::libc::EPERM | nix::libc::EROFS)
        ),
        "{err}"
    );
    assert_eq!(
        std::fs::read(live.join("dir/data")).unwrap(),
        b"after the snapshot"
    );

    // kept while read
    let err =
        e.c.delete_snapshot(timed(csi::DeleteSnapshotRequest {
            snapshot_id: snap.snapshot_id.clone(),
            secrets: e.h.secrets.clone(),
        }))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{}", err.message());

    // a writable restore of the same snapshot, for the figures
    e.parameters.remove("backingSnapshot");
    let t = Instant::now();
    let copy = e
        .create(&unique("backed-copy"), gib, of_snapshot(&snap.snapshot_id))
        .await;
    let copied_in = t.elapsed();
    println!(
        "a ReadOnlyMany volume from a snapshot holding {fill} MiB: backed by it {:.2} s (no share); a restored copy {:.2} s (a share of {gib} GiB)",
        backed_in.as_secs_f64(),
        copied_in.as_secs_f64()
    );
    e.delete(&copy.volume_id).await;

    // gone: its rule, then the snapshot may go; the share keeps its own
    e.unpublish(&ro.volume_id, "pod-b").await.unwrap();
    e.unstage(&ro.volume_id).await.unwrap();
    e.delete(&ro.volume_id).await;
    e.delete(&ro.volume_id).await;
    let left: Vec<String> = e
        .manila
        .list_access_rules(&id)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.access_to)
        .collect();
    assert!(!left.contains(&name), "{left:?}");
    assert_eq!(left.len(), 1, "the share's own rule stays: {left:?}");
    assert_eq!(
        std::fs::read(live.join("dir/data")).unwrap(),
        b"after the snapshot"
    );
    e.delete_snapshot(&snap.snapshot_id).await;
    e.unpublish(&id, "pod-a").await.unwrap();
    e.unstage(&id).await.unwrap();
    e.delete(&id).await;
    assert!(e.h.mounts_below_dir().is_empty(), "mounts left behind");
}
