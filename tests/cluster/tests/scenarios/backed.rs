//! A read-only claim from a CephFS VolumeSnapshot that reads the snapshot
//! itself (`backingSnapshot: "true"`), as users meet it: a writer's file
//! before the snapshot is what a pod of the new claim reads, not what the
//! writer wrote after it; no share is made; the pod cannot write, even
//! through a read-write mount; and Kubernetes cannot delete the snapshot
//! from under the claim: its deletion waits (the driver refuses it, the
//! snapshot controller retries) until the claim is gone.

use super::*;

#[tokio::test]
#[ignore = "needs the cluster tier: tests/cluster/cluster.py up (after tests/openstack/cloud.py up all)"]
async fn a_read_only_claim_backed_by_a_cephfs_snapshot_reads_the_snapshot_and_keeps_it() {
    let (c, ns, n) = scenario("backed").await;
    make(
        &c,
        &n,
        &[
            claim("data", "csi-manila-cephfs", "1Gi", "ReadWriteMany", false),
            pod(
                "writer",
                "data",
                "echo before > /data/f && sync && exec sleep 3600",
                PodOptions::default(),
            ),
        ],
    )
    .await;
    c.wait_running(&n, "writer", 3 * MINUTE).await.unwrap();
    c.wait_for("the writer's file", MINUTE, || async {
        let out = c.exec(&n, "writer", "cat /data/f 2>&1").await?;
        Ok(if out.trim() == "before" {
            Ok(())
        } else {
            Err(out)
        })
    })
    .await
    .unwrap();
    c.apply_in(
        &n,
        "apiVersion: snapshot.storage.k8s.io/v1\nkind: VolumeSnapshot\nmetadata:\n  name: snap\nspec:\n  volumeSnapshotClassName: csi-manila-cephfs-snapclass\n  source:\n    persistentVolumeClaimName: data\n",
    )
    .await
    .unwrap();
    c.wait_snapshot_ready(&n, "snap", 3 * MINUTE).await.unwrap();
    c.exec(&n, "writer", "echo after > /data/f && sync")
        .await
        .unwrap();
    let manila = c.manila().unwrap();
    let shares_before = manila.list_shares(&Default::default()).await.unwrap().len();

    let class = copy_class(
        &c,
        "csi-manila-cephfs",
        &format!("{n}-backed"),
        &[("backingSnapshot", "true")],
    )
    .await;
    let t = Instant::now();
    c.apply_in(
        &n,
        &format!(
            "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata:\n  name: ro\nspec:\n  accessModes: [ReadOnlyMany]\n  storageClassName: {}\n  dataSource:\n    apiGroup: snapshot.storage.k8s.io\n    kind: VolumeSnapshot\n    name: snap\n  resources:\n    requests:\n      storage: 1Gi\n",
            class.name
        ),
    )
    .await
    .unwrap();
    let pv = c.volume_of(&n, "ro", 3 * MINUTE).await.unwrap();
    println!(
        "a ReadOnlyMany claim backed by its snapshot bound in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let volume_handle = handle(&pv);
    assert!(
        volume_handle.starts_with("snapshot-backed:"),
        "{volume_handle}"
    );
    assert_eq!(
        manila.list_shares(&Default::default()).await.unwrap().len(),
        shares_before,
        "no share made for it"
    );
    // a pod that asks to write (its mount is not readOnly) reads the
    // snapshot and is refused
    make(
        &c,
        &n,
        &[pod(
            "reader",
            "ro",
            "cat /data/f; if echo x > /data/g 2>/dev/null; then echo WROTE; else echo REFUSED; fi",
            once(),
        )],
    )
    .await;
    c.wait_succeeded(&n, "reader", 3 * MINUTE).await.unwrap();
    let out = c.logs(&n, "reader").await.unwrap();
    assert!(
        out.contains("before")
            && !out.contains("after")
            && out.contains("REFUSED")
            && !out.contains("WROTE"),
        "{out}"
    );

    // the snapshot's deletion waits for the claim that reads it
    let content = c
        .get("volumesnapshot", "snap", Some(&n))
        .await
        .unwrap()
        .unwrap()["status"]["boundVolumeSnapshotContentName"]
        .as_str()
        .unwrap()
        .to_string();
    let snapshot_id = c
        .get("volumesnapshotcontent", &content, None)
        .await
        .unwrap()
        .unwrap()["status"]["snapshotHandle"]
        .as_str()
        .unwrap()
        .to_string();
    c.kubectl(&["delete", "volumesnapshot", "snap", "-n", &n, "--wait=false"])
        .await
        .unwrap();
    // csi-snapshotter records a refused DeleteSnapshot only as an event
    // ("Failed to delete snapshot", without the driver's words) and in its
    // log, which carries the driver's error: both must show it
    let since = format!("--since={}s", t.elapsed().as_secs() + 60);
    c.wait_for(
        "the driver's refusal of the snapshot's deletion",
        2 * MINUTE,
        || async {
            let events = c
                .kubectl(&[
                    "get",
                    "events",
                    "-A",
                    "--field-selector",
                    &format!("involvedObject.name={content},reason=SnapshotDeleteError"),
                    "-o",
                    "name",
                ])
                .await?;
            let log = c
                .kubectl(&[
                    "-n",
                    cluster_tests::SUITE_NAMESPACE,
                    "logs",
                    "-l",
                    "app=csi-manila-cephfs-controllerplugin",
                    "-c",
                    "csi-snapshotter",
                    &since,
                    "--tail=-1",
                ])
                .await?;
            let refusal = log.lines().find(|l| {
                l.contains(&content) && l.contains("FailedPrecondition") && l.contains("backs")
            });
            Ok(match refusal {
                Some(_) if !events.trim().is_empty() => Ok(()),
                _ => Err(format!(
                    "events: {events:?}; csi-snapshotter's lines on it: {:?}",
                    log.lines()
                        .filter(|l| l.contains(&content))
                        .collect::<Vec<_>>()
                )),
            })
        },
    )
    .await
    .unwrap();
    assert!(
        c.get("volumesnapshotcontent", &content, None)
            .await
            .unwrap()
            .is_some(),
        "the snapshot's content waits for the claim"
    );
    manila
        .get_snapshot(&snapshot_id)
        .await
        .expect("the snapshot stays while the claim reads it");

    // the claim gone, its rule goes, and then the snapshot
    c.delete("pod", "reader", Some(&n)).await.unwrap();
    c.delete("pvc", "ro", Some(&n)).await.unwrap();
    wait_released(&c, &name(&pv), None).await;
    c.wait_for("the snapshot's content deleted", 3 * MINUTE, || async {
        Ok(
            match c.get("volumesnapshotcontent", &content, None).await? {
                None => Ok(()),
                Some(v) => Err(v["status"].to_string()),
            },
        )
    })
    .await
    .unwrap();
    assert!(
        manila
            .get_snapshot(&snapshot_id)
            .await
            .unwrap_err()
            .is_not_found(),
        "Manila's snapshot deleted"
    );
    assert_eq!(
        c.exec(&n, "writer", "cat /data/f").await.unwrap().trim(),
        "after",
        "the source share untouched"
    );
    drop(class);
    drop(ns);
}
