//! A VolumeGroupSnapshot of Manila shares, as users meet it: two claims of
//! a class whose `groupID` names a share group, snapshotted together by
//! the snapshot controller and our plugin's GroupController (one Manila
//! share group snapshot), each member a VolumeSnapshot that a claim
//! restores; a group snapshot asking for part of a share group refused
//! with the reason and nothing left in Manila; and everything gone from
//! Manila once Kubernetes deletes it.
//!
//! On the NFS driver and the test cloud's `default` share type (Manila's
//! dummy backend): Manila's CephFS driver cannot snapshot a share in a
//! share group (README, "Manila: group snapshots"), and this machine has
//! no NFS client, so no pod reads the shares; what is checked is the
//! Kubernetes wiring (the snapshotters' gate, their RBAC, the classes of
//! deploy/manila/group-snapshots) and what Manila holds at each step.

use super::*;
use openstack_client::manila::{CreateShareGroup, ShareGroupStatus, SharedFileSystems};
use std::collections::BTreeMap;

const GROUP_SNAPSHOT_CLASS: &str = "csi-manila-nfs-groupsnapclass";

/// A share group of the `default` share type, available.
async fn share_group(c: &Cluster, m: &SharedFileSystems, name: &str) -> String {
    let types = m.list_share_types().await.unwrap();
    let t = types
        .iter()
        .find(|t| t.name == "default")
        .expect("the test cloud's share type default");
    let g = m
        .create_share_group(&CreateShareGroup {
            name: name.to_string(),
            share_types: vec![t.id.clone()],
            ..Default::default()
        })
        .await
        .unwrap();
    c.wait_for("the share group available", MINUTE, || async {
        let s = m.get_share_group(&g.id).await.unwrap().status;
        Ok(if s == ShareGroupStatus::Available {
            Ok(())
        } else {
            Err(s.as_str().to_string())
        })
    })
    .await
    .unwrap();
    g.id
}

fn grouped_claim(name: &str, class: &str, part: &str) -> String {
    format!(
        "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata:\n  name: {name}\n  labels:\n    app: grouped\n    part: {part}\nspec:\n  accessModes: [ReadWriteMany]\n  storageClassName: {class}\n  resources:\n    requests:\n      storage: 1Gi\n"
    )
}

fn group_snapshot(name: &str, selector: &str) -> String {
    format!(
        "apiVersion: groupsnapshot.storage.k8s.io/v1\nkind: VolumeGroupSnapshot\nmetadata:\n  name: {name}\nspec:\n  volumeGroupSnapshotClassName: {GROUP_SNAPSHOT_CLASS}\n  source:\n    selector:\n      matchLabels:\n{selector}"
    )
}

/// Waits until the group snapshot is ready; its content.
async fn wait_group_ready(c: &Cluster, n: &str, name: &str) -> Value {
    let content = c
        .wait_for(
            &format!("group snapshot {n}/{name} ready"),
            3 * MINUTE,
            || async {
                let g = c
                    .get("volumegroupsnapshot", name, Some(n))
                    .await?
                    .unwrap_or_default();
                Ok(
                    match g["status"]["boundVolumeGroupSnapshotContentName"].as_str() {
                        Some(content) if g["status"]["readyToUse"] == true => {
                            Ok(content.to_string())
                        }
                        _ => Err(g["status"].to_string()),
                    },
                )
            },
        )
        .await
        .unwrap();
    c.get("volumegroupsnapshotcontent", &content, None)
        .await
        .unwrap()
        .unwrap()
}

/// The uid of a group snapshot, which names its request to the driver
/// (`groupsnapshot-<uid>`).
async fn uid_of(c: &Cluster, n: &str, name: &str) -> String {
    let g = c
        .get("volumegroupsnapshot", name, Some(n))
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("group snapshot {n}/{name}"));
    g["metadata"]["uid"].as_str().unwrap().to_string()
}

/// The error Kubernetes shows for a group snapshot: the group snapshot's
/// own, else its content's (where the snapshotter writes the driver's).
async fn group_error(c: &Cluster, n: &str, name: &str) -> Option<String> {
    let g = c.get("volumegroupsnapshot", name, Some(n)).await.ok()??;
    if let Some(m) = g["status"]["error"]["message"].as_str() {
        return Some(m.to_string());
    }
    let content = g["status"]["boundVolumeGroupSnapshotContentName"]
        .as_str()
        .map(str::to_string)
        .or_else(|| {
            // not bound yet: the content the controller made for it
            Some(format!(
                "groupsnapcontent-{}",
                g["metadata"]["uid"].as_str()?
            ))
        })?;
    let content = c
        .get("volumegroupsnapshotcontent", &content, None)
        .await
        .ok()??;
    content["status"]["error"]["message"]
        .as_str()
        .map(str::to_string)
}

#[tokio::test]
#[ignore = "needs the cluster tier: tests/cluster/cluster.py up (after tests/openstack/cloud.py up all)"]
async fn a_group_snapshot_of_a_share_groups_claims_restores_each_member_and_leaves_nothing() {
    let (c, ns, n) = scenario("groups").await;
    let m = c.manila().unwrap();
    let group = share_group(&c, &m, &n).await;
    let class = copy_class(
        &c,
        "csi-manila-nfs",
        &format!("{n}-grouped"),
        &[("groupID", group.as_str())],
    )
    .await;
    make(
        &c,
        &n,
        &[
            grouped_claim("data", &class.name, "data"),
            grouped_claim("wal", &class.name, "wal"),
        ],
    )
    .await;
    let mut share_of = BTreeMap::new();
    for claim in ["data", "wal"] {
        let pv = c.volume_of(&n, claim, 3 * MINUTE).await.unwrap();
        share_of.insert(claim, handle(&pv));
    }
    // the class's groupID put both shares in the share group
    let mut in_group: Vec<String> = m
        .shares_in_group(&group)
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.id)
        .collect();
    in_group.sort();
    let mut ours: Vec<String> = share_of.values().cloned().collect();
    ours.sort();
    assert_eq!(in_group, ours, "the share group holds the claims' shares");

    // part of a share group: refused with the reason, nothing made
    c.apply_in(&n, &group_snapshot("part", "        part: data\n"))
        .await
        .unwrap();
    let refusal = c
        .wait_for("the partial group snapshot refused", 2 * MINUTE, || async {
            Ok(match group_error(&c, &n, "part").await {
                Some(m) if m.contains("share group") => Ok(m),
                other => Err(format!("{other:?}")),
            })
        })
        .await
        .unwrap();
    println!("a group snapshot of part of a share group: {refusal}");
    let part_uid = uid_of(&c, &n, "part").await;
    assert!(
        m.share_group_snapshots_named(&format!("groupsnapshot-{part_uid}"))
            .await
            .unwrap()
            .is_empty(),
        "a refused group snapshot left one in Manila"
    );
    c.delete("volumegroupsnapshot", "part", Some(&n))
        .await
        .unwrap();

    // the whole group, snapshotted at once
    let t = Instant::now();
    c.apply_in(&n, &group_snapshot("both", "        app: grouped\n"))
        .await
        .unwrap();
    let content = wait_group_ready(&c, &n, "both").await;
    println!(
        "a group snapshot of 2 shares ready in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let gs_id = content["status"]["volumeGroupSnapshotHandle"]
        .as_str()
        .unwrap()
        .to_string();
    let gs = m.get_share_group_snapshot(&gs_id).await.unwrap();
    assert_eq!(gs.share_group_id, group);
    let uid = uid_of(&c, &n, "both").await;
    assert_eq!(
        gs.name,
        format!("groupsnapshot-{uid}"),
        "named by the request"
    );
    let mut members: Vec<String> = gs.members.iter().map(|x| x.share_id.clone()).collect();
    members.sort();
    assert_eq!(members, ours, "one member per share");
    // each member a snapshot handle `<group snapshot>/<member>` of its volume
    let pairs = content["status"]["volumeSnapshotInfoList"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(pairs.len(), 2, "{}", content["status"]);
    let mut snapshot_of_share = BTreeMap::new();
    for p in &pairs {
        let volume = p["volumeHandle"].as_str().unwrap().to_string();
        let snapshot = p["snapshotHandle"].as_str().unwrap().to_string();
        let member = gs.members.iter().find(|x| x.share_id == volume).unwrap();
        assert_eq!(snapshot, format!("{gs_id}/{}", member.id));
        snapshot_of_share.insert(volume, snapshot);
    }
    // the member VolumeSnapshots the controller made, one per pair (the
    // group snapshot may be ready before the last member's status names
    // it: seen on Kubernetes 1.35)
    let snapshots = c
        .wait_for("the group's two member snapshots", MINUTE, || async {
            let members = c
                .list("volumesnapshot", &["-n", &n])
                .await?
                .into_iter()
                .filter(|s| {
                    s["status"]["volumeGroupSnapshotName"] == "both"
                        && s["status"]["boundVolumeSnapshotContentName"].is_string()
                })
                .collect::<Vec<_>>();
            Ok(if members.len() == 2 {
                Ok(members)
            } else {
                Err(format!("{} member snapshots", members.len()))
            })
        })
        .await
        .unwrap();
    let mut member_snapshot_of_claim = BTreeMap::new();
    for s in &snapshots {
        let name = s["metadata"]["name"].as_str().unwrap().to_string();
        c.wait_snapshot_ready(&n, &name, MINUTE).await.unwrap();
        let bound = s["status"]["boundVolumeSnapshotContentName"]
            .as_str()
            .unwrap()
            .to_string();
        let vsc = c
            .get("volumesnapshotcontent", &bound, None)
            .await
            .unwrap()
            .unwrap();
        let handle = vsc["status"]["snapshotHandle"].as_str().unwrap();
        let (share, _) = snapshot_of_share
            .iter()
            .find(|(_, h)| h.as_str() == handle)
            .unwrap_or_else(|| panic!("{handle} is no member of the group snapshot"));
        let claim = share_of.iter().find(|(_, s)| *s == share).unwrap().0;
        member_snapshot_of_claim.insert(*claim, name);
    }

    // a member restores as a normal snapshot: a share of the restore group
    let t = Instant::now();
    c.apply_in(
        &n,
        &format!(
            "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata:\n  name: data-restored\nspec:\n  accessModes: [ReadWriteMany]\n  storageClassName: csi-manila-nfs\n  dataSource:\n    apiGroup: snapshot.storage.k8s.io\n    kind: VolumeSnapshot\n    name: {}\n  resources:\n    requests:\n      storage: 1Gi\n",
            member_snapshot_of_claim["data"]
        ),
    )
    .await
    .unwrap();
    let restored_pv = c.volume_of(&n, "data-restored", 3 * MINUTE).await.unwrap();
    println!(
        "a claim from a member snapshot bound in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let restored = m.get_share(&handle(&restored_pv)).await.unwrap();
    let data_member = gs
        .members
        .iter()
        .find(|x| x.share_id == share_of["data"])
        .unwrap();
    assert_eq!(
        restored.source_share_group_snapshot_member_id.as_deref(),
        Some(data_member.id.as_str()),
        "restored from the data claim's member"
    );
    let restore_group = restored
        .share_group_id
        .clone()
        .expect("the restored share is in the restore group");
    assert_eq!(
        m.get_share_group(&restore_group).await.unwrap().name,
        format!("csi-restore-{gs_id}")
    );

    // deleted by Kubernetes: nothing of it left in Manila
    let restored_id = restored.id.clone();
    c.delete("pvc", "data-restored", Some(&n)).await.unwrap();
    c.delete("volumegroupsnapshot", "both", Some(&n))
        .await
        .unwrap();
    for claim in ["data", "wal"] {
        c.delete("pvc", claim, Some(&n)).await.unwrap();
    }
    c.wait_for(
        "Manila emptied of what the test made",
        3 * MINUTE,
        || async {
            let mut left = Vec::new();
            for id in share_of.values().chain([&restored_id]) {
                if let Ok(s) = m.get_share(id).await {
                    left.push(format!("share {id} ({})", s.status.as_str()));
                }
            }
            if m.get_share_group_snapshot(&gs_id).await.is_ok() {
                left.push(format!("group snapshot {gs_id}"));
            }
            if m.get_share_group(&restore_group).await.is_ok() {
                left.push(format!("restore group {restore_group}"));
            }
            Ok(if left.is_empty() {
                Ok(())
            } else {
                Err(left.join(", "))
            })
        },
    )
    .await
    .unwrap();
    // the operator's share group, now empty, is theirs to delete
    m.delete_share_group(&group).await.unwrap();
    drop(class);
    drop(ns);
}
