//! Cinder volume metadata from classes, as an operator meets it: a
//! StorageClass's `metadata.<key>` and a VolumeAttributesClass's reach the
//! Cinder volume at creation (through external-provisioner's mutable
//! parameters); moving the claim to another VolumeAttributesClass while a
//! pod writes to it changes the metadata through csi-resizer's
//! ControllerModifyVolume without a retype (the volume's type, status and
//! attachment stay; the writer loses nothing); a class naming a key the
//! driver owns is infeasible, changes nothing, and the claim recovers when
//! the user moves it back.

use std::collections::BTreeMap;

use super::*;

/// Where the driver records which keys the VolumeAttributesClass set.
const RECORD: &str = "cinder.csi.openstack.org/attributes-class-metadata";

/// A VolumeAttributesClass of the Cinder driver with these parameters.
async fn attributes_class<'a>(
    c: &'a Cluster,
    name: &str,
    parameters: &[(&str, &str)],
) -> ClusterScoped<'a> {
    let parameters: serde_json::Map<String, Value> = parameters
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    c.apply(
        &json!({
            "apiVersion": "storage.k8s.io/v1",
            "kind": "VolumeAttributesClass",
            "metadata": {"name": name},
            "driverName": "cinder.csi.openstack.org",
            "parameters": parameters,
        })
        .to_string(),
    )
    .await
    .unwrap();
    ClusterScoped {
        c,
        kind: "volumeattributesclass",
        name: name.to_string(),
    }
}

/// The volume's metadata less the keys the driver and the sidecars own
/// (the cluster's, the claim's).
fn class_keys(metadata: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    metadata
        .iter()
        .filter(|(k, _)| !k.starts_with("cinder.csi.openstack.org/cluster"))
        .filter(|(k, _)| !k.starts_with("csi.storage.k8s.io/"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

fn pairs(p: &[(&str, &str)]) -> BTreeMap<String, String> {
    p.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Moves the claim to the VolumeAttributesClass `class`.
async fn move_claim(c: &Cluster, ns: &str, class: &str) {
    let patch = json!({"spec": {"volumeAttributesClassName": class}}).to_string();
    c.kubectl(&[
        "patch",
        "pvc",
        "data",
        "-n",
        ns,
        "--type=merge",
        "-p",
        &patch,
    ])
    .await
    .unwrap();
}

/// Waits until the claim's status says `current` is its class and no
/// modification is pending, in progress or infeasible.
async fn wait_class(c: &Cluster, ns: &str, current: &str) {
    c.wait_for(
        &format!("claim {ns}/data in class {current}"),
        3 * MINUTE,
        || async move {
            let pvc = c.get("pvc", "data", Some(ns)).await?.unwrap_or_default();
            let status = &pvc["status"];
            Ok(
                if status["currentVolumeAttributesClassName"] == current
                    && status["modifyVolumeStatus"].is_null()
                {
                    Ok(())
                } else {
                    Err(status.to_string())
                },
            )
        },
    )
    .await
    .unwrap();
}

/// The writer's count of records so far.
async fn records(c: &Cluster, ns: &str) -> usize {
    c.exec(ns, "writer", "wc -l < /data/log")
        .await
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

#[tokio::test]
#[ignore = "needs the cluster tier: tests/cluster/cluster.py up (after tests/openstack/cloud.py up all)"]
async fn a_volume_attributes_class_changes_a_written_volumes_cinder_metadata_without_a_retype() {
    let (c, ns, n) = scenario("attributes").await;
    let class = copy_class(
        &c,
        "csi-cinder-sc-delete",
        &format!("{n}-billed"),
        &[("metadata.owner", "ops")],
    )
    .await;
    let team_a = attributes_class(
        &c,
        &format!("{n}-team-a"),
        &[("metadata.billing", "team-a"), ("metadata.backup", "daily")],
    )
    .await;
    let team_b = attributes_class(
        &c,
        &format!("{n}-team-b"),
        &[("metadata.billing", "team-b")],
    )
    .await;
    // a key the driver owns (which cluster the volume belongs to)
    let forbidden = attributes_class(
        &c,
        &format!("{n}-forbidden"),
        &[("metadata.cinder.csi.openstack.org/cluster", "other")],
    )
    .await;
    make(
        &c,
        &n,
        &[
            format!(
                "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata:\n  name: data\nspec:\n  accessModes: [ReadWriteOnce]\n  storageClassName: {}\n  volumeAttributesClassName: {}\n  resources:\n    requests:\n      storage: 1Gi\n",
                class.name, team_a.name
            ),
            // one numbered, synced record at a time: a lost or repeated
            // write shows as a line out of place
            pod(
                "writer",
                "data",
                "i=$(wc -l < /data/log 2>/dev/null || echo 0); while true; do i=$((i+1)); echo $i >> /data/log; sync; sleep 0.1; done",
                PodOptions::default(),
            ),
        ],
    )
    .await;
    c.wait_running(&n, "writer", 3 * MINUTE).await.unwrap();
    wait_class(&c, &n, &team_a.name).await;
    let pv = c.volume_of(&n, "data", MINUTE).await.unwrap();
    let id = handle(&pv);
    let cinder = c.cinder().unwrap();
    let before = cinder.get_volume(&id).await.unwrap();
    assert_eq!(
        class_keys(&before.metadata),
        pairs(&[
            ("backup", "daily"),
            ("billing", "team-a"),
            ("owner", "ops"),
            (RECORD, "backup,billing"),
        ]),
        "the StorageClass's keys and the VolumeAttributesClass's at creation"
    );
    assert_eq!(
        before
            .metadata
            .get("csi.storage.k8s.io/pvc/name")
            .map(String::as_str),
        Some("data")
    );
    assert_eq!(before.status, VolumeStatus::InUse);

    // into another class, under the writer
    let written = records(&c, &n).await;
    move_claim(&c, &n, &team_b.name).await;
    wait_class(&c, &n, &team_b.name).await;
    let after = cinder.get_volume(&id).await.unwrap();
    assert_eq!(
        class_keys(&after.metadata),
        pairs(&[("billing", "team-b"), ("owner", "ops"), (RECORD, "billing")]),
        "backup (the former class's alone) removed, owner (the StorageClass's) kept"
    );
    assert_eq!(after.volume_type, before.volume_type, "retyped");
    assert_eq!(after.status, VolumeStatus::InUse);
    assert_eq!(
        after
            .attachments
            .iter()
            .map(|a| &a.server_id)
            .collect::<Vec<_>>(),
        before
            .attachments
            .iter()
            .map(|a| &a.server_id)
            .collect::<Vec<_>>(),
        "the attachment changed"
    );
    c.wait_for("the writer writing on", MINUTE, || async {
        let now: usize = c
            .exec(&n, "writer", "wc -l < /data/log")
            .await?
            .trim()
            .parse()
            .unwrap_or(0);
        Ok(if now > written + 20 {
            Ok(())
        } else {
            Err(format!("{now} records, {written} before the change"))
        })
    })
    .await
    .unwrap();

    // a class the driver refuses: infeasible, nothing changed
    move_claim(&c, &n, &forbidden.name).await;
    c.wait_for(
        "the claim's modification infeasible",
        2 * MINUTE,
        || async {
            let pvc = c.get("pvc", "data", Some(&n)).await?.unwrap_or_default();
            let status = &pvc["status"]["modifyVolumeStatus"];
            Ok(
                if status["status"] == "Infeasible"
                    && status["targetVolumeAttributesClassName"] == forbidden.name.as_str()
                {
                    Ok(())
                } else {
                    Err(pvc["status"].to_string())
                },
            )
        },
    )
    .await
    .unwrap();
    let refused = cinder.get_volume(&id).await.unwrap();
    assert_eq!(
        refused.metadata, after.metadata,
        "an infeasible class changed the volume"
    );
    // and the user goes back
    move_claim(&c, &n, &team_b.name).await;
    wait_class(&c, &n, &team_b.name).await;

    // every record in place, then the volume goes with its claim
    let log_check = c
        .exec(
            &n,
            "writer",
            "awk 'NR != $1 { print \"record \" NR \" reads \" $1; exit 1 } END { print NR }' /data/log",
        )
        .await
        .unwrap();
    let total: usize = log_check
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("{log_check}"));
    assert!(
        total > written,
        "{total} records, {written} before the change"
    );
    println!(
        "the writer's records: {written} before the class change, {total} in all, none lost or out of place"
    );
    c.delete("pod", "writer", Some(&n)).await.unwrap();
    c.delete("pvc", "data", Some(&n)).await.unwrap();
    wait_released(&c, &name(&pv), Some(&id)).await;
    drop((class, team_a, team_b, forbidden));
    drop(ns);
}
