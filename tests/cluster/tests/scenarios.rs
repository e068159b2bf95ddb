//! The suite as users meet it: deploy/suite installed from our images into
//! a real single-node Kubernetes (kubelet, containerd, the CSI sidecars),
//! on the real test cloud, driven only through kubectl and app pods, and
//! checked against what OpenStack and the node say.
//!
//! Needs `tests/cluster/cluster.py up` (run by scripts/test.sh after the
//! real test cloud); run with `--ignored --test-threads=1` (the scenarios
//! restart the node's plugins, kubelet and the controllers).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use cluster_tests::{
    Cluster, PodOptions, SUITE_NAMESPACE, claim, host_mounts_containing, pod, prober,
};
use openstack_client::cinder::VolumeStatus;
use serde_json::{Value, json};

const MINUTE: Duration = Duration::from_secs(60);
const NEEDS: &str =
    "needs the cluster tier: tests/cluster/cluster.py up (after tests/openstack/cloud.py up all)";

fn once() -> PodOptions {
    PodOptions {
        run_once: true,
        ..Default::default()
    }
}

fn handle(pv: &Value) -> String {
    pv["spec"]["csi"]["volumeHandle"]
        .as_str()
        .expect("a CSI volume")
        .to_string()
}

fn name(v: &Value) -> String {
    v["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// The KiB a pod's `df -k /data` reports in all.
async fn df_kib(c: &Cluster, ns: &str, pod: &str) -> u64 {
    let out = c.exec(ns, pod, "df -k /data | tail -1").await.unwrap();
    out.split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("df said {out:?}"))
}

/// Waits until Cinder says `available` (detached) for the volume.
async fn wait_detached(c: &Cluster, id: &str) {
    let cinder = c.cinder().unwrap();
    c.wait_for(&format!("Cinder volume {id} available"), 3 * MINUTE, || {
        let cinder = cinder.clone();
        async move {
            let v = cinder
                .get_volume(id)
                .await
                .map_err(|e| cluster_tests::ClusterError::Other(e.to_string()))?;
            Ok(if v.status == VolumeStatus::Available {
                Ok(())
            } else {
                Err(format!("status {}", v.status))
            })
        }
    })
    .await
    .unwrap();
}

/// Waits until Cinder answers 404 for the volume.
async fn wait_volume_gone(c: &Cluster, id: &str) {
    let cinder = c.cinder().unwrap();
    c.wait_for(&format!("Cinder volume {id} deleted"), 3 * MINUTE, || {
        let cinder = cinder.clone();
        async move {
            Ok(match cinder.get_volume(id).await {
                Err(e) if e.is_not_found() => Ok(()),
                Err(e) => Err(e.to_string()),
                Ok(v) => Err(format!("status {}", v.status)),
            })
        }
    })
    .await
    .unwrap();
}

/// Nothing of the volume is left on the node: no mount, no attachment,
/// no device link.
async fn wait_released(c: &Cluster, pv: &str, volume_id: Option<&str>) {
    c.wait_for(
        &format!("{pv} released by the node"),
        3 * MINUTE,
        || async move {
            let mounts = host_mounts_containing(pv);
            let attachments: Vec<String> = c
                .list("volumeattachments", &[])
                .await?
                .into_iter()
                .filter(|a| a["spec"]["source"]["persistentVolumeName"] == pv)
                .map(|a| name(&a))
                .collect();
            let link = volume_id.map(|id| {
                std::path::Path::new("/dev/disk/by-id")
                    .join(format!("virtio-{}", &id[..20.min(id.len())]))
                    .exists()
            });
            Ok(
                if mounts.is_empty() && attachments.is_empty() && link != Some(true) {
                    Ok(())
                } else {
                    Err(format!(
                        "mounts {mounts:?}, attachments {attachments:?}, by-id link {link:?}"
                    ))
                },
            )
        },
    )
    .await
    .unwrap();
}

/// The node plugin pods of the suite (one per DaemonSet on this node).
/// The node plugins' pods on node A (the single-node scenarios' node).
async fn node_plugin_pods(c: &Cluster) -> Vec<Value> {
    c.list("pods", &["-n", SUITE_NAMESPACE])
        .await
        .unwrap()
        .into_iter()
        .filter(|p| name(p).contains("-nodeplugin-") && p["spec"]["nodeName"] == c.node.as_str())
        .collect()
}

async fn wait_rolled_out(c: &Cluster) {
    for ds in [
        "csi-cinder-nodeplugin",
        "csi-manila-cephfs-nodeplugin",
        "csi-manila-nfs-nodeplugin",
    ] {
        c.kubectl(&[
            "rollout",
            "status",
            &format!("daemonset/{ds}"),
            "-n",
            SUITE_NAMESPACE,
            "--timeout=180s",
        ])
        .await
        .unwrap();
    }
    // and registered again with kubelet
    c.wait_for("drivers registered", 2 * MINUTE, || async move {
        let n = c.get("csinode", &c.node, None).await?.unwrap_or_default();
        let names: Vec<&str> = n["spec"]["drivers"]
            .as_array()
            .map(|d| d.iter().filter_map(|x| x["name"].as_str()).collect())
            .unwrap_or_default();
        Ok(if names.len() == 3 {
            Ok(())
        } else {
            Err(format!("{names:?}"))
        })
    })
    .await
    .unwrap();
}

/// The cluster, and a namespace of its own for a scenario (deleted with
/// what it holds when dropped).
async fn scenario(prefix: &str) -> (Cluster, cluster_tests::TestNamespace, String) {
    let c = Cluster::from_env().unwrap();
    let ns = c.namespace(prefix).await.unwrap();
    let n = ns.name.clone();
    (c, ns, n)
}

/// Applies these manifests in the namespace, at once.
async fn make(c: &Cluster, n: &str, docs: &[String]) {
    c.apply_in(n, &docs.join("---\n")).await.unwrap();
}

/// A cluster-scoped object a scenario made (a StorageClass, a
/// VolumeAttributesClass), deleted when dropped: as TestNamespace's
/// namespace, without waiting, on a failure too.
struct ClusterScoped<'a> {
    c: &'a Cluster,
    kind: &'static str,
    name: String,
}

impl Drop for ClusterScoped<'_> {
    fn drop(&mut self) {
        let _ = std::process::Command::new("kubectl")
            .arg(format!("--kubeconfig={}", self.c.kubeconfig.display()))
            .args([
                "delete",
                self.kind,
                &self.name,
                "--ignore-not-found",
                "--wait=false",
            ])
            .output();
    }
}

/// The StorageClass `from` of deploy/ under the name `name`, with these
/// parameters added or changed.
async fn copy_class<'a>(
    c: &'a Cluster,
    from: &str,
    name: &str,
    parameters: &[(&str, &str)],
) -> ClusterScoped<'a> {
    let mut class = c
        .get("storageclass", from, None)
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("the class {from} of deploy/"));
    let meta = class["metadata"].as_object_mut().unwrap();
    meta.retain(|k, _| k == "name");
    meta.insert("name".into(), json!(name));
    for (k, v) in parameters {
        class["parameters"][*k] = json!(v);
    }
    c.apply(&class.to_string()).await.unwrap();
    ClusterScoped {
        c,
        kind: "storageclass",
        name: name.to_string(),
    }
}

// a release replaced in place (tests/scenarios/handover.rs)
#[path = "scenarios/handover.rs"]
mod handover;

// recovery from an expansion the quota refuses (tests/scenarios/expansion.rs)
#[path = "scenarios/expansion.rs"]
mod expansion;

// a read-only claim that is its CephFS snapshot (tests/scenarios/backed.rs)
#[path = "scenarios/backed.rs"]
mod backed;

// Cinder metadata changed through a VolumeAttributesClass under a writer
// (tests/scenarios/attributes.rs)
#[path = "scenarios/attributes.rs"]
mod attributes;

// a VolumeGroupSnapshot of a Manila share group's claims, its members
// restored (tests/scenarios/groups.rs)
#[path = "scenarios/groups.rs"]
mod groups;

// ------------------------------------------------------------- Cinder

#[tokio::test]
#[ignore = "needs the cluster tier: tests/cluster/cluster.py up (after tests/openstack/cloud.py up all)"]
async fn cinder_volumes_keep_data_grow_snapshot_restore_serve_raw_block_and_go() {
    let _ = NEEDS;
    let (c, ns, n) = scenario("cinder").await;

    // pod A writes; after it is gone, pod B reads the file back
    make(
        &c,
        &n,
        &[claim(
            "data",
            "csi-cinder-sc-xfs",
            "1Gi",
            "ReadWriteOnce",
            false,
        )],
    )
    .await;
    make(
        &c,
        &n,
        &[pod(
            "writer",
            "data",
            "echo hello-cinder > /data/hello && sync",
            once(),
        )],
    )
    .await;
    c.wait_succeeded(&n, "writer", 3 * MINUTE).await.unwrap();
    let pv = c.volume_of(&n, "data", MINUTE).await.unwrap();
    let (pv_name, volume_id) = (name(&pv), handle(&pv));
    c.delete("pod", "writer", Some(&n)).await.unwrap();
    c.apply_in(
        &n,
        &pod(
            "reader",
            "data",
            "cat /data/hello; exec sleep 3600",
            PodOptions::default(),
        ),
    )
    .await
    .unwrap();
    c.wait_running(&n, "reader", 3 * MINUTE).await.unwrap();
    c.wait_for("pod B reads pod A's file", MINUTE, || async {
        let l = c.logs(&n, "reader").await?;
        Ok(if l.contains("hello-cinder") {
            Ok(())
        } else {
            Err(l)
        })
    })
    .await
    .unwrap();

    // expansion by editing the claim: df in the pod grows
    let before = df_kib(&c, &n, "reader").await;
    c.kubectl(&[
        "patch",
        "pvc",
        "data",
        "-n",
        &n,
        "-p",
        r#"{"spec":{"resources":{"requests":{"storage":"2Gi"}}}}"#,
    ])
    .await
    .unwrap();
    let after = c
        .wait_for("df grows in the pod", 3 * MINUTE, || async {
            let now = df_kib(&c, &n, "reader").await;
            Ok(if now > before + 512 * 1024 {
                Ok(now)
            } else {
                Err(format!("{now} KiB"))
            })
        })
        .await
        .unwrap();
    println!(
        "cinder expansion: df {} MiB -> {} MiB",
        before / 1024,
        after / 1024
    );

    // a snapshot, restored into a new claim, holds the data
    c.apply_in(
        &n,
        "apiVersion: snapshot.storage.k8s.io/v1\nkind: VolumeSnapshot\nmetadata:\n  name: snap\nspec:\n  volumeSnapshotClassName: csi-cinder-snapclass\n  source:\n    persistentVolumeClaimName: data\n",
    )
    .await
    .unwrap();
    c.wait_snapshot_ready(&n, "snap", 3 * MINUTE).await.unwrap();
    c.apply_in(
        &n,
        "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata:\n  name: restored\nspec:\n  accessModes: [ReadWriteOnce]\n  storageClassName: csi-cinder-sc-xfs\n  dataSource:\n    apiGroup: snapshot.storage.k8s.io\n    kind: VolumeSnapshot\n    name: snap\n  resources:\n    requests:\n      storage: 2Gi\n",
    )
    .await
    .unwrap();
    make(
        &c,
        &n,
        &[pod("restore-reader", "restored", "cat /data/hello", once())],
    )
    .await;
    c.wait_succeeded(&n, "restore-reader", 4 * MINUTE)
        .await
        .unwrap();
    assert!(
        c.logs(&n, "restore-reader")
            .await
            .unwrap()
            .contains("hello-cinder")
    );

    // a raw block claim
    make(
        &c,
        &n,
        &[claim(
            "raw",
            "csi-cinder-sc-delete",
            "1Gi",
            "ReadWriteOnce",
            true,
        )],
    )
    .await;
    make(&c, &n, &[pod(
            "block",
            "raw",
            "printf block-data | dd of=/dev/xvda bs=512 conv=sync,fsync 2>/dev/null && dd if=/dev/xvda bs=10 count=1 2>/dev/null",
            PodOptions { block: true, run_once: true, ..Default::default() },
        )]).await;
    c.wait_succeeded(&n, "block", 3 * MINUTE).await.unwrap();
    assert_eq!(c.logs(&n, "block").await.unwrap().trim(), "block-data");

    // deleting the pod detaches the volume
    c.delete("pod", "reader", Some(&n)).await.unwrap();
    wait_released(&c, &pv_name, Some(&volume_id)).await;
    wait_detached(&c, &volume_id).await;

    // deleting the claims deletes the volumes
    let mut volumes = vec![volume_id];
    for claim_name in ["restored", "raw"] {
        volumes.push(handle(&c.volume_of(&n, claim_name, MINUTE).await.unwrap()));
    }
    ns.close().await.unwrap();
    for id in &volumes {
        wait_volume_gone(&c, id).await;
    }
}

// ------------------------------------------------------------- Manila

/// Mounts the CephFS path with ceph-fuse on the host, as a client holding
/// only the cephx key would: Ok(files) when it mounts, Err(why) otherwise.
async fn mount_with_key(
    monitors: &str,
    root: &str,
    id: &str,
    key: &str,
) -> Result<Vec<String>, String> {
    let dir = tempfile::tempdir().unwrap();
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    std::fs::write(
        dir.path().join("ceph.conf"),
        format!(
            "[global]\nmon_host = {monitors}\n[client]\nlog_file = /dev/null\nadmin_socket =\n"
        ),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("keyring"),
        format!("[client.{id}]\n\tkey = {key}\n"),
    )
    .unwrap();
    let out = tokio::process::Command::new("timeout")
        .arg("30")
        .arg("ceph-fuse")
        .arg("--conf")
        .arg(dir.path().join("ceph.conf"))
        .args(["--id", id, "--keyring"])
        .arg(dir.path().join("keyring"))
        .args(["-r", root])
        .arg(&mnt)
        .output()
        .await
        .unwrap();
    let mounted = !host_mounts_containing(&mnt.to_string_lossy()).is_empty();
    let files = std::fs::read_dir(&mnt)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    if mounted {
        let _ = std::process::Command::new("umount").arg(&mnt).status();
        return Ok(files);
    }
    Err(format!(
        "{} {}",
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    ))
}

#[tokio::test]
#[ignore = "needs the cluster tier: tests/cluster/cluster.py up (after tests/openstack/cloud.py up all)"]
async fn cephfs_shares_are_shared_by_pods_read_only_where_asked_and_their_key_dies_with_them() {
    let (c, ns, n) = scenario("cephfs").await;
    make(
        &c,
        &n,
        &[claim(
            "shared",
            "csi-manila-cephfs",
            "1Gi",
            "ReadWriteMany",
            false,
        )],
    )
    .await;
    make(
        &c,
        &n,
        &[pod(
            "pod-a",
            "shared",
            "echo from-a > /data/a && exec sleep 3600",
            PodOptions::default(),
        )],
    )
    .await;
    c.wait_running(&n, "pod-a", 3 * MINUTE).await.unwrap();
    c.apply_in(
        &n,
        &pod("pod-b", "shared", "until [ -f /data/a ]; do sleep 0.2; done; cat /data/a; echo from-b > /data/b; exec sleep 3600", PodOptions::default()),
    )
    .await
    .unwrap();
    c.wait_running(&n, "pod-b", 3 * MINUTE).await.unwrap();
    c.wait_for("pod-a reads pod-b's file", MINUTE, || async {
        let out = c.exec(&n, "pod-a", "cat /data/b 2>&1").await?;
        Ok(if out.trim() == "from-b" {
            Ok(())
        } else {
            Err(out)
        })
    })
    .await
    .unwrap();
    assert!(c.logs(&n, "pod-b").await.unwrap().contains("from-a"));

    // a third pod, read-only: reads, cannot write
    c.apply_in(
        &n,
        &pod(
            "pod-ro",
            "shared",
            "cat /data/a; if echo x > /data/c 2>/dev/null; then echo WROTE; else echo REFUSED; fi",
            PodOptions {
                read_only: true,
                run_once: true,
                ..Default::default()
            },
        ),
    )
    .await
    .unwrap();
    c.wait_succeeded(&n, "pod-ro", 3 * MINUTE).await.unwrap();
    let ro = c.logs(&n, "pod-ro").await.unwrap();
    assert!(
        ro.contains("from-a") && ro.contains("REFUSED") && !ro.contains("WROTE"),
        "{ro}"
    );
    assert!(
        c.exec(&n, "pod-a", "ls /data")
            .await
            .unwrap()
            .split_whitespace()
            .all(|f| f != "c")
    );

    // ceph-fuse runs from our image, in a mount pod of its own on this node
    let pv = c.volume_of(&n, "shared", MINUTE).await.unwrap();
    let (pv_name, share_id) = (name(&pv), handle(&pv));
    let mps = c.mount_pods().await.unwrap();
    let ours: Vec<&Value> = mps
        .iter()
        .filter(|p| {
            p["metadata"]["annotations"]["manila.csi.openstack.org/volume-id"] == share_id.as_str()
        })
        .collect();
    assert_eq!(ours.len(), 1, "one mount pod for the share: {mps:?}");
    assert_eq!(ours[0]["status"]["phase"], "Running");
    assert_eq!(ours[0]["spec"]["nodeName"], c.node.as_str());
    let plugin_image = node_plugin_pods(&c)
        .await
        .into_iter()
        .find(|p| name(p).starts_with("csi-manila-cephfs-nodeplugin"))
        .and_then(|p| {
            p["spec"]["containers"]
                .as_array()?
                .iter()
                .find(|c| c["name"] == "manila-csi-plugin")
                .map(|c| c["image"].clone())
        })
        .unwrap();
    assert_eq!(ours[0]["spec"]["containers"][0]["image"], plugin_image);
    // its controller is the mount pod template, not the Node (whose
    // deletion and registration again would take it under the apps)
    let template = c
        .get("podtemplate", "csi-manila-mount-pod", Some(SUITE_NAMESPACE))
        .await
        .unwrap()
        .unwrap();
    let owners = &ours[0]["metadata"]["ownerReferences"];
    assert_eq!(
        owners,
        &json!([{
            "apiVersion": "v1",
            "kind": "PodTemplate",
            "name": "csi-manila-mount-pod",
            "uid": template["metadata"]["uid"],
            "controller": true,
        }]),
        "{owners}"
    );

    // the share's cephx key mounts it while the claim lives...
    let manila = c.manila().unwrap();
    let rule = manila.list_access_rules(&share_id).await.unwrap().remove(0);
    let key = rule.access_key.clone().unwrap();
    let export = manila
        .list_export_locations(&share_id)
        .await
        .unwrap()
        .remove(0)
        .path;
    let (monitors, root) = export
        .rsplit_once(":/")
        .map(|(m, r)| (m.to_string(), format!("/{r}")))
        .unwrap();
    let files = mount_with_key(&monitors, &root, &rule.access_to, &key)
        .await
        .unwrap();
    assert!(
        files.contains(&"a".to_string()) && files.contains(&"b".to_string()),
        "{files:?}"
    );

    // ...and no longer once it is deleted
    for p in ["pod-a", "pod-b", "pod-ro"] {
        c.delete("pod", p, Some(&n)).await.unwrap();
    }
    wait_released(&c, &pv_name, None).await;
    c.wait_for("the mount pod ends with the last pod", MINUTE, || async {
        let left: Vec<String> = c
            .mount_pods()
            .await?
            .iter()
            .filter(|p| {
                p["metadata"]["annotations"]["manila.csi.openstack.org/volume-id"]
                    == share_id.as_str()
            })
            .map(name)
            .collect();
        Ok(if left.is_empty() {
            Ok(())
        } else {
            Err(format!("{left:?}"))
        })
    })
    .await
    .unwrap();
    ns.close().await.unwrap();
    c.wait_for("the share deleted", 3 * MINUTE, || async {
        Ok(match manila.get_share(&share_id).await {
            Err(e) if e.is_not_found() => Ok(()),
            other => Err(format!("{:?}", other.map(|s| s.status))),
        })
    })
    .await
    .unwrap();
    let refused = mount_with_key(&monitors, &root, &rule.access_to, &key).await;
    assert!(
        refused.is_err(),
        "the deleted share's key still mounts: {refused:?}"
    );
}

// --------------------------------------------------- restarts and kills

const PROBERS: [&str; 2] = ["probe-cinder", "probe-cephfs"];

/// How many writes each prober has made so far.
async fn probe_writes(c: &Cluster, ns: &str) -> Vec<usize> {
    let mut writes = Vec::new();
    for p in PROBERS {
        writes.push(c.probe_report(ns, p).await.1);
    }
    writes
}

/// Until each prober has made at least `more` writes beyond `since`: a
/// scenario waits on the writes it needs, not on a guess of their pace.
async fn wait_more_writes(c: &Cluster, ns: &str, since: &[usize], more: usize) {
    let deadline = Instant::now() + 2 * MINUTE;
    loop {
        let now = probe_writes(c, ns).await;
        if now.iter().zip(since).all(|(n, s)| *n >= s + more) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the probers wrote {now:?} (from {since:?}), not {more} more each"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// A Cinder claim `blk` and a CephFS claim `fs`, each with a prober pod
/// (`probe-cinder`, `probe-cephfs`) running.
async fn start_probers(c: &Cluster, n: &str) {
    let claims = [
        claim("blk", "csi-cinder-sc-xfs", "1Gi", "ReadWriteOnce", false),
        claim("fs", "csi-manila-cephfs", "1Gi", "ReadWriteMany", false),
        prober("probe-cinder", "blk"),
        prober("probe-cephfs", "fs"),
    ];
    c.apply_in(n, &claims.join("---\n")).await.unwrap();
    for p in ["probe-cinder", "probe-cephfs"] {
        c.wait_running(n, p, 3 * MINUTE).await.unwrap();
    }
}

#[tokio::test]
#[ignore = "needs the cluster tier: tests/cluster/cluster.py up (after tests/openstack/cloud.py up all)"]
async fn a_node_plugin_restart_never_breaks_a_mounted_volume() {
    let (c, ns, n) = scenario("restart").await;
    start_probers(&c, &n).await;
    wait_more_writes(&c, &n, &[0, 0], 20).await;

    // as in an upgrade: the node plugins' pods deleted and replaced
    let old: Vec<String> = node_plugin_pods(&c).await.iter().map(name).collect();
    let restarted = Instant::now();
    let mut args = vec!["delete", "pods", "-n", SUITE_NAMESPACE, "--timeout=120s"];
    args.extend(old.iter().map(String::as_str));
    c.kubectl(&args).await.unwrap();
    wait_rolled_out(&c).await;
    let took = restarted.elapsed();
    // the probes go on through and after the restart
    let rolled_out = probe_writes(&c, &n).await;
    wait_more_writes(&c, &n, &rolled_out, 30).await;
    let mut worst = Duration::ZERO;
    for p in ["probe-cinder", "probe-cephfs"] {
        let (gap, writes, fails) = c.probe_report(&n, p).await;
        println!(
            "{p}: {writes} writes, {fails} failed, longest gap {gap:?} (node plugins replaced in {took:?})"
        );
        assert_eq!(
            fails, 0,
            "{p}: writes failed while the node plugin restarted"
        );
        assert!(writes > 50, "{p}: {writes} writes");
        worst = worst.max(gap);
    }
    assert!(worst < Duration::from_secs(3), "a mount stalled {worst:?}");
    assert!(
        node_plugin_pods(&c)
            .await
            .iter()
            .all(|p| !old.contains(&name(p)))
    );

    // the new plugins take the volumes down: pods deleted, nothing left
    let pvs: Vec<(String, String)> = {
        let mut v = Vec::new();
        for cl in ["blk", "fs"] {
            let pv = c.volume_of(&n, cl, MINUTE).await.unwrap();
            v.push((name(&pv), handle(&pv)));
        }
        v
    };
    for p in ["probe-cinder", "probe-cephfs"] {
        c.delete("pod", p, Some(&n)).await.unwrap();
    }
    wait_released(&c, &pvs[0].0, Some(&pvs[0].1)).await;
    wait_released(&c, &pvs[1].0, None).await;
    wait_detached(&c, &pvs[0].1).await;
    // a mount pod still terminating (its preStop waits for the share's
    // users) is not left behind yet
    let left = c.wait_mount_pods_gone(&pvs[1].1, 2 * MINUTE).await.unwrap();
    assert!(left.is_empty(), "mount pods left behind: {left:?}");
    ns.close().await.unwrap();
}

#[tokio::test]
#[ignore = "needs the cluster tier: tests/cluster/cluster.py up (after tests/openstack/cloud.py up all)"]
async fn an_evicted_mount_pod_keeps_its_share_until_the_pods_using_it_are_gone() {
    // a drain evicts a share's mount pod beside the apps that use it:
    // ceph-fuse must serve their last writes, and then end by itself
    let (c, ns, n) = scenario("evict").await;
    c.apply_in(
        &n,
        &[
            claim("fs", "csi-manila-cephfs", "1Gi", "ReadWriteMany", false),
            prober("probe-cephfs", "fs"),
        ]
        .join("---\n"),
    )
    .await
    .unwrap();
    c.wait_running(&n, "probe-cephfs", 3 * MINUTE)
        .await
        .unwrap();
    let pv = c.volume_of(&n, "fs", MINUTE).await.unwrap();
    let (pv_name, share_id) = (name(&pv), handle(&pv));
    let mount_pod = || async {
        c.mount_pods().await.unwrap().into_iter().find(|p| {
            p["metadata"]["annotations"]["manila.csi.openstack.org/volume-id"] == share_id.as_str()
        })
    };
    let mp = name(&mount_pod().await.expect("the share's mount pod"));
    let writes = || async { c.probe_report(&n, "probe-cephfs").await.1 };
    let before = writes().await;

    // deleted as an eviction deletes (its grace period)
    c.kubectl(&["delete", "pod", "-n", SUITE_NAMESPACE, &mp, "--wait=false"])
        .await
        .unwrap();
    let evicted = Instant::now();
    c.wait_for(
        "30 more writes through the evicted mount pod",
        MINUTE,
        || async {
            let now = writes().await;
            Ok(if now >= before + 30 {
                Ok(())
            } else {
                Err(format!("{now} writes"))
            })
        },
    )
    .await
    .unwrap();
    let (_, _, fails) = c.probe_report(&n, "probe-cephfs").await;
    assert_eq!(
        fails, 0,
        "writes failed while the mount pod was being evicted"
    );
    let still = mount_pod()
        .await
        .expect("the evicted mount pod ended under its app");
    assert!(
        still["metadata"]["deletionTimestamp"].is_string(),
        "the mount pod is being deleted: {still}"
    );

    // the app gone, the mount pod ends of itself, long before its grace
    // period
    c.delete("pod", "probe-cephfs", Some(&n)).await.unwrap();
    c.wait_for(
        "the evicted mount pod gone once its app is",
        MINUTE,
        || async {
            Ok(match mount_pod().await {
                None => Ok(()),
                Some(p) => Err(format!("{} still there", name(&p))),
            })
        },
    )
    .await
    .unwrap();
    println!(
        "evicted mount pod served its app, and ended {:?} after its eviction once the app was gone",
        evicted.elapsed()
    );
    wait_released(&c, &pv_name, None).await;
    ns.close().await.unwrap();
}

#[tokio::test]
#[ignore = "needs the cluster tier: tests/cluster/cluster.py up (after tests/openstack/cloud.py up all)"]
async fn after_a_kubelet_restart_deleting_the_pods_releases_every_volume() {
    let (c, ns, n) = scenario("kubelet").await;
    start_probers(&c, &n).await;
    let blk = c.volume_of(&n, "blk", MINUTE).await.unwrap();
    let fs = c.volume_of(&n, "fs", MINUTE).await.unwrap();

    c.cluster_py(&["restart-kubelet"]).await.unwrap();
    // the pods kept running, their volumes answering (once the new
    // kubelet serves exec again)
    c.wait_for("kubelet serving the pods again", MINUTE, || async {
        Ok(c.exec(&n, "probe-cinder", "true")
            .await
            .map_err(|e| e.to_string()))
    })
    .await
    .unwrap();
    for p in ["probe-cinder", "probe-cephfs"] {
        let (_, writes, fails) = c.probe_report(&n, p).await;
        assert_eq!(fails, 0, "{p}");
        assert!(writes > 10, "{p}");
    }
    for p in ["probe-cinder", "probe-cephfs"] {
        c.delete("pod", p, Some(&n)).await.unwrap();
    }
    wait_released(&c, &name(&blk), Some(&handle(&blk))).await;
    wait_released(&c, &name(&fs), None).await;
    wait_detached(&c, &handle(&blk)).await;
    let left = c
        .wait_mount_pods_gone(&handle(&fs), 2 * MINUTE)
        .await
        .unwrap();
    assert!(left.is_empty(), "mount pods left behind: {left:?}");
    ns.close().await.unwrap();
}

#[tokio::test]
#[ignore = "needs the cluster tier: tests/cluster/cluster.py up (after tests/openstack/cloud.py up all)"]
async fn a_controller_killed_while_provisioning_leaves_exactly_one_volume_per_claim() {
    let (c, ns, n) = scenario("burst").await;
    let class = format!("burst-{n}");
    c.apply(&format!(
        "apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata:\n  name: {class}\nprovisioner: cinder.csi.openstack.org\nreclaimPolicy: Delete\nvolumeBindingMode: Immediate\n"
    ))
    .await
    .unwrap();
    let claims: String = (0..10)
        .map(|i| claim(&format!("c{i}"), &class, "1Gi", "ReadWriteOnce", false))
        .collect::<Vec<_>>()
        .join("---\n");
    c.apply_in(&n, &claims).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    c.kubectl(&[
        "delete",
        "pod",
        "-n",
        SUITE_NAMESPACE,
        "-l",
        "app=csi-cinder-controllerplugin",
        "--grace-period=0",
        "--force",
    ])
    .await
    .unwrap();
    let mut pvs = Vec::new();
    for i in 0..10 {
        pvs.push(c.volume_of(&n, &format!("c{i}"), 6 * MINUTE).await.unwrap());
    }
    let cinder = c.cinder().unwrap();
    let mut all = Vec::new();
    let mut marker = None;
    loop {
        let page = cinder
            .list_volumes(&openstack_client::cinder::ListVolumes {
                name: None,
                limit: Some(500),
                marker: marker.clone(),
                ..Default::default()
            })
            .await
            .unwrap();
        all.extend(page.items);
        marker = page.next_marker;
        if marker.is_none() {
            break;
        }
    }
    for pv in &pvs {
        let named: Vec<&str> = all
            .iter()
            .filter(|v| v.name == name(pv))
            .map(|v| v.id.as_str())
            .collect();
        assert_eq!(
            named,
            vec![handle(pv).as_str()],
            "exactly one volume for {}",
            name(pv)
        );
    }
    ns.close().await.unwrap();
    for pv in &pvs {
        wait_volume_gone(&c, &handle(pv)).await;
    }
    c.kubectl(&["delete", "storageclass", &class])
        .await
        .unwrap();
    // no volume of these claims outlived them
    let left = cinder
        .list_volumes(&openstack_client::cinder::ListVolumes {
            name: None,
            limit: Some(500),
            marker: None,
            ..Default::default()
        })
        .await
        .unwrap();
    let orphans: Vec<&str> = left
        .items
        .iter()
        .filter(|v| pvs.iter().any(|pv| name(pv) == v.name))
        .map(|v| v.id.as_str())
        .collect();
    assert!(orphans.is_empty(), "orphaned volumes: {orphans:?}");
}

/// The count of Cinder volumes the node still takes, from its CSINode.
async fn cinder_allocatable(c: &Cluster) -> i64 {
    let n = c.get("csinode", &c.node, None).await.unwrap().unwrap();
    n["spec"]["drivers"]
        .as_array()
        .and_then(|d| d.iter().find(|d| d["name"] == "cinder.csi.openstack.org"))
        .and_then(|d| d["allocatable"]["count"].as_i64())
        .unwrap_or_else(|| panic!("no allocatable count for Cinder: {n}"))
}

#[tokio::test]
#[ignore = "needs the cluster tier: tests/cluster/cluster.py up (after tests/openstack/cloud.py up all)"]
async fn a_volume_attached_by_hand_lowers_what_the_node_takes() {
    let c = Cluster::from_env().unwrap();
    let before = cinder_allocatable(&c).await;
    let (cinder, nova, server) = (
        c.cinder().unwrap(),
        c.nova().unwrap(),
        c.server_id().unwrap(),
    );
    let v = cinder
        .create_volume(&openstack_client::cinder::CreateVolume {
            name: "attached-by-hand".into(),
            size_gib: 1,
            ..Default::default()
        })
        .await
        .unwrap();
    let id = v.id.clone();
    let result = async {
        c.wait_for("the volume available", 2 * MINUTE, || async {
            let v = cinder
                .get_volume(&id)
                .await
                .map_err(|e| cluster_tests::ClusterError::Other(e.to_string()))?;
            Ok(if v.status == VolumeStatus::Available {
                Ok(())
            } else {
                Err(v.status.to_string())
            })
        })
        .await?;
        nova.attach_volume(&server, &id, false)
            .await
            .map_err(|e| cluster_tests::ClusterError::Other(e.to_string()))?;
        // kubelet asks NodeGetInfo again every nodeAllocatableUpdatePeriodSeconds
        let lowered = c
            .wait_for("the node's allocatable count drops", 3 * MINUTE, || async {
                let now = cinder_allocatable(&c).await;
                Ok(if now == before - 1 {
                    Ok(now)
                } else {
                    Err(format!("{now} (was {before})"))
                })
            })
            .await?;
        println!("cinder allocatable: {before} -> {lowered} with a volume attached by hand");
        nova.detach_volume(&server, &id)
            .await
            .map_err(|e| cluster_tests::ClusterError::Other(e.to_string()))?;
        c.wait_for("the count back once it is detached", 3 * MINUTE, || async {
            let now = cinder_allocatable(&c).await;
            Ok(if now == before {
                Ok(())
            } else {
                Err(format!("{now}"))
            })
        })
        .await
    }
    .await;
    // the volume goes whatever happened
    let _ = nova.detach_volume(&server, &id).await;
    wait_detached(&c, &id).await;
    cinder.delete_volume(&id).await.unwrap();
    wait_volume_gone(&c, &id).await;
    result.unwrap();
}

// ------------------------------------------------------- deploy as shipped

#[tokio::test]
#[ignore = "needs the cluster tier: tests/cluster/cluster.py up (after tests/openstack/cloud.py up all)"]
async fn a_changed_cloud_conf_reaches_the_controllers_without_rolling_a_pod() {
    let c = Cluster::from_env().unwrap();
    let before: Vec<(String, String)> = c
        .list("pods", &["-n", SUITE_NAMESPACE])
        .await
        .unwrap()
        .iter()
        .filter(|p| name(p).contains("plugin"))
        .map(|p| {
            (
                name(p),
                p["metadata"]["uid"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    let reloads = || async {
        let out = tokio::process::Command::new("curl")
            .args(["-sS", "--max-time", "5", "http://127.0.0.1:9828/metrics"])
            .output()
            .await
            .unwrap();
        cluster_tests::metric_value(
            &String::from_utf8_lossy(&out.stdout),
            "config_reloads_total{result=\"applied\"}",
        )
    };
    let applied = reloads().await;
    // the operator edits the Cinder controller's cloud.conf beside the
    // overlay and applies it, as deploy/suite says
    let overlay = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("overlay");
    let conf = overlay.join("generated/cinder-cloud.conf");
    let original = std::fs::read_to_string(&conf).unwrap();
    // the same user, named otherwise: new credentials Keystone accepts
    let edited = original.replace(
        "user-domain-name = \"Default\"",
        "user-domain-id = \"default\"",
    );
    assert_ne!(edited, original, "{original}");
    std::fs::write(&conf, edited).unwrap();
    let applied_out = c
        .kubectl(&["apply", "-k", &overlay.to_string_lossy()])
        .await;
    std::fs::write(&conf, &original).unwrap();
    let out = applied_out.unwrap();
    assert!(out.contains("secret/cloud-config configured"), "{out}");
    assert!(
        !out.lines().any(
            |l| (l.starts_with("daemonset") || l.starts_with("deployment"))
                && l.ends_with("configured")
        ),
        "{out}"
    );
    c.wait_for(
        "the controller reloads its configuration",
        3 * MINUTE,
        || async {
            let now = reloads().await;
            Ok(if now > applied {
                Ok(())
            } else {
                Err(format!("{now} reloads applied"))
            })
        },
    )
    .await
    .unwrap();
    let after: Vec<(String, String)> = c
        .list("pods", &["-n", SUITE_NAMESPACE])
        .await
        .unwrap()
        .iter()
        .filter(|p| name(p).contains("plugin"))
        .map(|p| {
            (
                name(p),
                p["metadata"]["uid"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    assert_eq!(before, after, "a pod was replaced");
    c.kubectl(&["apply", "-k", &overlay.to_string_lossy()])
        .await
        .unwrap();
}

#[tokio::test]
#[ignore = "needs the cluster tier: tests/cluster/cluster.py up (after tests/openstack/cloud.py up all)"]
async fn the_node_plugins_run_with_what_they_need() {
    let c = Cluster::from_env().unwrap();
    let pods = node_plugin_pods(&c).await;
    let cinder = pods
        .iter()
        .find(|p| name(p).starts_with("csi-cinder-nodeplugin"))
        .unwrap();
    // a read-only root, and a temporary directory for the config drive
    let tmp = c
        .kubectl(&[
            "exec",
            "-n",
            SUITE_NAMESPACE,
            &name(cinder),
            "-c",
            "cinder-csi-plugin",
            "--",
            "sh",
            "-c",
            "d=$(mktemp -d) && rmdir $d && echo ok; touch /usr/x 2>&1 || true",
        ])
        .await
        .unwrap();
    assert!(tmp.starts_with("ok") && tmp.contains("Read-only"), "{tmp}");
    let tools = c
        .kubectl(&[
            "exec",
            "-n",
            SUITE_NAMESPACE,
            &name(cinder),
            "-c",
            "cinder-csi-plugin",
            "--",
            "sh",
            "-c",
            "for t in udevadm mkfs.btrfs mkfs.xfs; do command -v $t; done",
        ])
        .await
        .unwrap();
    assert_eq!(tools.lines().count(), 3, "{tools}");
}
