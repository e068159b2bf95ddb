//! Cinder: a volume's lifecycle, listings and errors, marker pagination,
//! snapshots, backups and groups with their restores.

use openstack_client::Error;
use openstack_client::cinder::{
    BlockStorage, CreateBackup, CreateGroup, CreateSnapshot, CreateVolume, ListSnapshots,
    ListVolumes, VolumeStatus,
};

use crate::backend::*;
use crate::common::{
    wait_backup, wait_gone, wait_group, wait_group_snapshot, wait_snapshot, wait_volume,
    wait_volume_size,
};

#[tokio::test]
async fn cinder_volume_lifecycle_listing_and_errors() {
    let b = Backend::new().await;
    if !b.has("cinder", "cinder_volume_lifecycle_listing_and_errors") {
        return;
    }
    let c = BlockStorage::new(b.session(User::Admin));
    let name = unique("contract-vol");
    let metadata: std::collections::BTreeMap<String, String> = [(
        "cinder.csi.openstack.org/cluster".to_string(),
        "contract".to_string(),
    )]
    .into();
    let created = c
        .create_volume(&CreateVolume {
            name: name.clone(),
            size_gib: 1,
            metadata: metadata.clone(),
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", b.name()));
    assert_eq!(created.status, VolumeStatus::Creating, "{}", b.name());
    let v = wait_volume(&c, &created.id, VolumeStatus::Available).await;
    assert_eq!(v.name, name);
    assert_eq!(v.size, 1);
    assert_eq!(v.availability_zone, ZONE);
    assert!(!v.multiattach);
    assert!(v.attachments.is_empty());
    assert_eq!(
        v.metadata
            .get("cinder.csi.openstack.org/cluster")
            .map(String::as_str),
        Some("contract")
    );
    let named = c.volumes_named(&name).await.unwrap();
    assert_eq!(
        named.iter().map(|v| v.id.as_str()).collect::<Vec<_>>(),
        vec![v.id.as_str()],
        "{}",
        b.name()
    );

    // metadata merges
    c.update_volume_metadata(&v.id, &[("extra".to_string(), "1".to_string())].into())
        .await
        .unwrap();
    let md = c.get_volume_metadata(&v.id).await.unwrap();
    assert_eq!(md.len(), 2, "{}: {md:?}", b.name());

    // offline extend
    c.extend_volume(&v.id, 2, false).await.unwrap();
    wait_volume_size(&c, &v.id, 2, VolumeStatus::Available).await;
    let err = c.extend_volume(&v.id, 1, false).await.unwrap_err();
    assert!(
        matches!(err, Error::BadRequest(_)),
        "{}: shrinking: {err}",
        b.name()
    );

    // types and limits
    let types = c.list_volume_types().await.unwrap();
    assert!(
        types
            .iter()
            .any(|t| t.name == "multiattach" && t.multiattach()),
        "{}: {types:?}",
        b.name()
    );
    assert!(
        types.iter().any(|t| t.name == "__DEFAULT__"),
        "{}: {types:?}",
        b.name()
    );
    assert_eq!(
        c.get_volume_type("multiattach").await.unwrap().name,
        "multiattach"
    );
    let limits = c.absolute_limits().await.unwrap();
    assert!(limits.total_volumes_used >= 1, "{}: {limits:?}", b.name());

    // errors
    let err = c
        .get_volume("00000000-0000-0000-0000-000000000000")
        .await
        .unwrap_err();
    assert!(err.is_not_found(), "{}: {err}", b.name());
    assert!(
        err.to_string().contains("could not be found"),
        "{}: {err}",
        b.name()
    );
    let err = c
        .create_volume(&CreateVolume {
            name: "bad".into(),
            size_gib: 1,
            volume_type: Some("no-such-type".into()),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(
        err.is_not_found() || matches!(err, Error::BadRequest(_)),
        "{}: {err}",
        b.name()
    );
    let err = c
        .create_volume(&CreateVolume {
            name: "bad".into(),
            size_gib: 1,
            availability_zone: Some("mars".into()),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(matches!(err, Error::BadRequest(_)), "{}: {err}", b.name());

    c.delete_volume(&v.id).await.unwrap();
    wait_gone("volume delete", || c.get_volume(&v.id)).await;
    let err = c.delete_volume(&v.id).await.unwrap_err();
    assert!(err.is_not_found(), "{}: {err}", b.name());
}

#[tokio::test]
async fn cinder_marker_pagination() {
    let b = Backend::new().await;
    if !b.has("cinder", "cinder_marker_pagination") {
        return;
    }
    let c = BlockStorage::new(b.session(User::Member));
    let mut ids = Vec::new();
    for i in 0..3 {
        ids.push(
            new_volume(&c, &unique(&format!("contract-page{i}")), 1)
                .await
                .id,
        );
    }
    let mut seen = Vec::new();
    let mut marker = None;
    for _ in 0..100 {
        let page = c
            .list_volumes(&ListVolumes {
                limit: Some(2),
                marker: marker.clone(),
                ..Default::default()
            })
            .await
            .unwrap();
        assert!(page.items.len() <= 2);
        seen.extend(page.items.into_iter().map(|v| v.id));
        match page.next_marker {
            Some(m) => marker = Some(m),
            None => break,
        }
    }
    for id in &ids {
        assert!(
            seen.contains(id),
            "{}: {id} missing from the paged listing",
            b.name()
        );
    }
    let err = c
        .list_volumes(&ListVolumes {
            marker: Some("00000000-0000-0000-0000-00000000dead".into()),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::BadRequest(_) | Error::NotFound(_)),
        "{}: unknown marker: {err}",
        b.name()
    );
    for id in ids {
        c.delete_volume(&id).await.unwrap();
    }
}

#[tokio::test]
async fn cinder_snapshots_and_restore() {
    let b = Backend::new().await;
    if !b.has("cinder", "cinder_snapshots_and_restore") {
        return;
    }
    let c = BlockStorage::new(b.session(User::Admin));
    let v = new_volume(&c, &unique("contract-snapsrc"), 1).await;
    let name = unique("contract-snap");
    let snap = c
        .create_snapshot(&CreateSnapshot {
            volume_id: v.id.clone(),
            name: name.clone(),
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", b.name()));
    assert_eq!(snap.volume_id, v.id);
    wait_snapshot(&c, &snap.id).await;
    let by_name = c
        .list_snapshots(&ListSnapshots {
            name: Some(name.clone()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(by_name.items.len(), 1, "{}", b.name());
    let by_volume = c
        .list_snapshots(&ListSnapshots {
            volume_id: Some(v.id.clone()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(by_volume.items.len(), 1, "{}", b.name());
    assert_eq!(by_volume.items[0].size, 1);

    // a volume with a snapshot cannot be deleted
    let err = c.delete_volume(&v.id).await.unwrap_err();
    assert!(matches!(err, Error::BadRequest(_)), "{}: {err}", b.name());

    // restore, larger than the snapshot
    let restored = c
        .create_volume(&CreateVolume {
            name: unique("contract-restored"),
            size_gib: 2,
            snapshot_id: Some(snap.id.clone()),
            ..Default::default()
        })
        .await
        .unwrap();
    let restored = wait_volume(&c, &restored.id, VolumeStatus::Available).await;
    assert_eq!(restored.snapshot_id.as_deref(), Some(snap.id.as_str()));
    assert_eq!(restored.size, 2);
    // smaller than the snapshot: refused
    let err = c
        .create_volume(&CreateVolume {
            name: "small".into(),
            size_gib: 0,
            snapshot_id: Some(snap.id.clone()),
            ..Default::default()
        })
        .await;
    if let Err(e) = &err {
        assert!(matches!(e, Error::BadRequest(_)), "{}: {e}", b.name());
    }
    // clone
    let clone = c
        .create_volume(&CreateVolume {
            name: unique("contract-clone"),
            size_gib: 1,
            source_volume_id: Some(v.id.clone()),
            ..Default::default()
        })
        .await
        .unwrap();
    let clone = wait_volume(&c, &clone.id, VolumeStatus::Available).await;
    assert_eq!(clone.source_volid.as_deref(), Some(v.id.as_str()));

    for id in [&restored.id, &clone.id] {
        c.delete_volume(id).await.unwrap();
        wait_gone("volume delete", || c.get_volume(id)).await;
    }
    c.delete_snapshot(&snap.id).await.unwrap();
    wait_gone("snapshot delete", || c.get_snapshot(&snap.id)).await;
    c.delete_volume(&v.id).await.unwrap();
}

#[tokio::test]
async fn cinder_restores_snapshots_and_clones_only_in_their_zone() {
    let b = Backend::new().await;
    if !b.has(
        "cinder",
        "cinder_restores_snapshots_and_clones_only_in_their_zone",
    ) {
        return;
    }
    let c = BlockStorage::new(b.session(User::Member));
    let v = new_volume(&c, &unique("contract-zoned"), 1).await;
    assert_eq!(v.availability_zone, ZONE, "{}", b.name());
    let snap = c
        .create_snapshot(&CreateSnapshot {
            volume_id: v.id.clone(),
            name: unique("contract-zoned-snap"),
            ..Default::default()
        })
        .await
        .unwrap();
    wait_snapshot(&c, &snap.id).await;
    // `cloned_volume_same_az` (Cinder's default): refused before anything
    // is created
    for (what, spec) in [
        (
            "snapshot",
            CreateVolume {
                snapshot_id: Some(snap.id.clone()),
                ..Default::default()
            },
        ),
        (
            "source volume",
            CreateVolume {
                source_volume_id: Some(v.id.clone()),
                ..Default::default()
            },
        ),
    ] {
        let name = unique("contract-cross-zone");
        let err = c
            .create_volume(&CreateVolume {
                name: name.clone(),
                size_gib: 1,
                availability_zone: Some(OTHER_ZONE.into()),
                ..spec
            })
            .await
            .unwrap_err();
        assert!(matches!(err, Error::BadRequest(_)), "{}: {err}", b.name());
        assert!(
            err.to_string()
                .contains(&format!("same availability zone as the {what}")),
            "{}: {err}",
            b.name()
        );
        assert!(
            c.volumes_named(&name).await.unwrap().is_empty(),
            "{}",
            b.name()
        );
    }
    // without a zone, the restore lands in the snapshot's
    let restored = c
        .create_volume(&CreateVolume {
            name: unique("contract-zoned-restored"),
            size_gib: 1,
            snapshot_id: Some(snap.id.clone()),
            ..Default::default()
        })
        .await
        .unwrap();
    let restored = wait_volume(&c, &restored.id, VolumeStatus::Available).await;
    assert_eq!(restored.availability_zone, ZONE, "{}", b.name());
    c.delete_volume(&restored.id).await.unwrap();
    wait_gone("volume delete", || c.get_volume(&restored.id)).await;
    c.delete_snapshot(&snap.id).await.unwrap();
    wait_gone("snapshot delete", || c.get_snapshot(&snap.id)).await;
    c.delete_volume(&v.id).await.unwrap();
}

#[tokio::test]
async fn cinder_backups_and_restore() {
    let b = Backend::new().await;
    if !b.has("cinder-backup", "cinder_backups_and_restore") {
        return;
    }
    let c = BlockStorage::new(b.session(User::Admin));
    let v = new_volume(&c, &unique("contract-bksrc"), 1).await;
    // of the volume itself
    let name = unique("contract-backup");
    let whole = c
        .create_backup(&CreateBackup {
            volume_id: v.id.clone(),
            name: name.clone(),
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", b.name()));
    assert_eq!(whole.name, name);
    assert_eq!(whole.volume_id, v.id);
    let whole = wait_backup(&c, &whole.id).await;
    assert_eq!(whole.size, 1);
    let named = c.backups_named(&name, Some(&v.id)).await.unwrap();
    assert_eq!(named.len(), 1, "{}", b.name());
    assert!(
        c.backups_named(&name, Some(&whole.id))
            .await
            .unwrap()
            .is_empty()
    );
    // of a snapshot of it
    let snap = c
        .create_snapshot(&CreateSnapshot {
            volume_id: v.id.clone(),
            name: unique("contract-bksnap"),
            ..Default::default()
        })
        .await
        .unwrap();
    wait_snapshot(&c, &snap.id).await;
    let of_snap = c
        .create_backup(&CreateBackup {
            volume_id: v.id.clone(),
            name: unique("contract-backup-snap"),
            snapshot_id: Some(snap.id.clone()),
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", b.name()));
    let of_snap = wait_backup(&c, &of_snap.id).await;
    assert_eq!(of_snap.snapshot_id.as_deref(), Some(snap.id.as_str()));
    wait_snapshot(&c, &snap.id).await;
    c.delete_snapshot(&snap.id).await.unwrap();
    wait_gone("snapshot delete", || c.get_snapshot(&snap.id)).await;
    // a backup outlives its volume
    c.delete_volume(&v.id).await.unwrap();
    wait_gone("volume delete", || c.get_volume(&v.id)).await;
    let restored = c
        .create_volume(&CreateVolume {
            name: unique("contract-from-backup"),
            size_gib: 2,
            backup_id: Some(of_snap.id.clone()),
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", b.name()));
    let restored = wait_volume(&c, &restored.id, VolumeStatus::Available).await;
    assert_eq!(restored.size, 2);
    wait_backup(&c, &of_snap.id).await;
    // smaller than the backup: refused
    let err = c
        .create_volume(&CreateVolume {
            name: "small".into(),
            size_gib: 0,
            backup_id: Some(of_snap.id.clone()),
            ..Default::default()
        })
        .await;
    if let Err(e) = &err {
        assert!(matches!(e, Error::BadRequest(_)), "{}: {e}", b.name());
    }
    for id in [&whole.id, &of_snap.id] {
        c.delete_backup(id).await.unwrap();
        wait_gone("backup delete", || c.get_backup(id)).await;
    }
    let err = c.get_backup(&whole.id).await.unwrap_err();
    assert!(err.is_not_found(), "{}: {err}", b.name());
    c.delete_volume(&restored.id).await.unwrap();
}

#[tokio::test]
async fn cinder_groups_and_group_snapshots() {
    let b = Backend::new().await;
    if !b.has("cinder", "cinder_groups_and_group_snapshots") {
        return;
    }
    let c = BlockStorage::new(b.session(User::Admin));
    let types = c
        .list_group_types()
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", b.name()));
    assert!(
        types.iter().any(|t| t.name == "default"),
        "{}: {types:?}",
        b.name()
    );
    let v1 = new_volume(&c, &unique("contract-grp-a"), 1).await;
    let v2 = new_volume(&c, &unique("contract-grp-b"), 1).await;
    let name = unique("contract-group");
    let group = c
        .create_group(&CreateGroup {
            name: name.clone(),
            group_type: "default".into(),
            volume_types: vec![v1.volume_type.clone().unwrap()],
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", b.name()));
    let group = wait_group(&c, &group.id).await;
    assert!(group.volumes.is_empty());
    assert_eq!(c.groups_named(&name).await.unwrap().len(), 1);
    c.update_group_volumes(&group.id, &[v1.id.clone(), v2.id.clone()], &[])
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", b.name()));
    let mut members = wait_group(&c, &group.id).await.volumes;
    members.sort();
    let mut want = vec![v1.id.clone(), v2.id.clone()];
    want.sort();
    assert_eq!(members, want, "{}", b.name());
    // a grouped volume cannot be deleted
    let err = c.delete_volume(&v1.id).await.unwrap_err();
    assert!(matches!(err, Error::BadRequest(_)), "{}: {err}", b.name());

    let gs = c
        .create_group_snapshot(&group.id, &unique("contract-gsnap"), Some("contract"))
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", b.name()));
    let gs = wait_group_snapshot(&c, &gs.id).await;
    assert_eq!(gs.group_id, group.id);
    assert!(c.group_snapshots_named(&gs.name).await.unwrap().len() == 1);
    let snaps = c.group_snapshot_members(&gs).await.unwrap();
    let mut of: Vec<String> = snaps.iter().map(|s| s.volume_id.clone()).collect();
    of.sort();
    assert_eq!(of, want, "{}: {snaps:?}", b.name());
    for s in &snaps {
        wait_snapshot(&c, &s.id).await;
        assert_eq!(
            c.get_snapshot(&s.id)
                .await
                .unwrap()
                .group_snapshot_id
                .as_deref(),
            Some(gs.id.as_str())
        );
    }
    // members go with their group snapshot, not alone
    let err = c.delete_snapshot(&snaps[0].id).await.unwrap_err();
    assert!(matches!(err, Error::BadRequest(_)), "{}: {err}", b.name());
    // each member restores on its own
    let restored = c
        .create_volume(&CreateVolume {
            name: unique("contract-from-member"),
            size_gib: 1,
            snapshot_id: Some(snaps[0].id.clone()),
            ..Default::default()
        })
        .await
        .unwrap();
    wait_volume(&c, &restored.id, VolumeStatus::Available).await;
    // the volumes leave the group; the group cannot go while it has a
    // snapshot
    c.update_group_volumes(&group.id, &[], &want).await.unwrap();
    assert!(wait_group(&c, &group.id).await.volumes.is_empty());
    let err = c.delete_group(&group.id).await.unwrap_err();
    assert!(matches!(err, Error::BadRequest(_)), "{}: {err}", b.name());
    c.delete_group_snapshot(&gs.id).await.unwrap();
    wait_gone("group snapshot delete", || c.get_group_snapshot(&gs.id)).await;
    for s in &snaps {
        wait_gone("member delete", || c.get_snapshot(&s.id)).await;
    }
    c.delete_group(&group.id).await.unwrap();
    wait_gone("group delete", || c.get_group(&group.id)).await;
    for id in [&restored.id, &v1.id, &v2.id] {
        c.delete_volume(id).await.unwrap();
    }
}

/// The orphan report lists a cluster's volumes and snapshots by their
/// metadata tag: the service filters (a page of one holds the tagged
/// volume, not a newer untagged one), and so the client's check only
/// confirms.
#[tokio::test]
async fn cinder_lists_volumes_and_snapshots_by_metadata() {
    let b = Backend::new().await;
    if !b.has("cinder", "cinder_lists_volumes_and_snapshots_by_metadata") {
        return;
    }
    let c = BlockStorage::new(b.session(User::Member));
    let cluster = unique("contract-cluster");
    let tag: std::collections::BTreeMap<String, String> =
        [("cinder.csi.openstack.org/cluster".to_string(), cluster)].into();
    let tagged = c
        .create_volume(&CreateVolume {
            name: unique("contract-tagged"),
            size_gib: 1,
            metadata: tag.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    wait_volume(&c, &tagged.id, VolumeStatus::Available).await;
    // newer, so first in Cinder's default order
    let untagged = new_volume(&c, &unique("contract-untagged"), 1).await;
    let page = c
        .list_volumes(&ListVolumes {
            limit: Some(1),
            metadata: tag.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        page.items.iter().map(|v| v.id.as_str()).collect::<Vec<_>>(),
        [tagged.id.as_str()],
        "{}: the service filters by metadata",
        b.name()
    );
    let all: Vec<String> = c
        .volumes_with_metadata(&tag)
        .await
        .unwrap()
        .into_iter()
        .map(|v| v.id)
        .collect();
    assert_eq!(all, std::slice::from_ref(&tagged.id), "{}", b.name());
    let snap = c
        .create_snapshot(&CreateSnapshot {
            volume_id: tagged.id.clone(),
            name: unique("contract-tagged-snap"),
            metadata: tag.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    wait_snapshot(&c, &snap.id).await;
    let snaps: Vec<String> = c
        .snapshots_with_metadata(&tag)
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.id)
        .collect();
    assert_eq!(snaps, std::slice::from_ref(&snap.id), "{}", b.name());
    c.delete_snapshot(&snap.id).await.unwrap();
    wait_gone("snapshot", || c.get_snapshot(&snap.id)).await;
    for id in [tagged.id, untagged.id] {
        c.delete_volume(&id).await.unwrap();
    }
}

/// Scheduler hints (`--pvc-annotations`' placement): one backend per zone
/// in both clouds, and Cinder's affinity filters enabled in the real one
/// (its default filters ignore the hints: a cloud's operator enables them). `same_host` lands with a volume it names (any of them)
/// or nowhere (error); `different_host` lands only where none of them is;
/// what is not a volume id is refused at once.
#[tokio::test]
async fn cinder_scheduler_hints_place_or_fail() {
    let b = Backend::new().await;
    if !b.has("cinder", "cinder_scheduler_hints_place_or_fail") {
        return;
    }
    let c = BlockStorage::new(b.session(User::Member));
    let anchor = new_volume(&c, &unique("contract-anchor"), 1).await;
    assert_eq!(anchor.availability_zone, ZONE, "{}", b.name());
    let hinted = |key: &str, ids: Vec<String>, zone: Option<&str>| CreateVolume {
        name: unique("contract-hinted"),
        size_gib: 1,
        availability_zone: zone.map(str::to_string),
        scheduler_hints: [(key.to_string(), ids)].into(),
        ..Default::default()
    };
    let missing = "00000000-0000-4000-8000-000000000001".to_string();
    let mut made = vec![anchor.id.clone()];
    let mut create = async |spec: CreateVolume, want: VolumeStatus| {
        let v = c
            .create_volume(&spec)
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", b.name()));
        made.push(v.id.clone());
        wait_volume(&c, &v.id, want).await
    };
    let with = create(
        hinted("same_host", vec![missing.clone(), anchor.id.clone()], None),
        VolumeStatus::Available,
    )
    .await;
    assert_eq!(with.availability_zone, ZONE, "{}", b.name());
    create(
        hinted("same_host", vec![missing], None),
        VolumeStatus::Error,
    )
    .await;
    create(
        hinted("different_host", vec![anchor.id.clone()], None),
        VolumeStatus::Error,
    )
    .await;
    let apart = create(
        hinted("different_host", vec![anchor.id.clone()], Some(OTHER_ZONE)),
        VolumeStatus::Available,
    )
    .await;
    assert_eq!(apart.availability_zone, OTHER_ZONE, "{}", b.name());
    let refused = c
        .create_volume(&hinted("same_host", vec!["not-a-volume-id".into()], None))
        .await;
    assert!(
        matches!(refused, Err(Error::BadRequest(_))),
        "{}: {refused:?}",
        b.name()
    );
    for id in made {
        c.delete_volume(&id).await.unwrap();
        wait_gone("volume delete", || c.get_volume(&id)).await;
    }
}

/// Volume metadata as the classes' `metadata.<key>` use it: merged by an
/// update, one key removed by its URL (404 for one the volume lacks, the
/// volume's 404 when the volume is gone), and Cinder's schema refusing a
/// key outside `A-Za-z0-9-_:. /` or a value over 255 characters, in a
/// create and in an update.
#[tokio::test]
async fn cinder_volume_metadata_updates_and_removals() {
    let b = Backend::new().await;
    if !b.has("cinder", "cinder_volume_metadata_updates_and_removals") {
        return;
    }
    let c = BlockStorage::new(b.session(User::Member));
    let m = |pairs: &[(&str, &str)]| -> std::collections::BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let v = c
        .create_volume(&CreateVolume {
            name: unique("contract-metadata"),
            size_gib: 1,
            metadata: m(&[("owner", "ops"), ("billing", "team-a")]),
            ..Default::default()
        })
        .await
        .unwrap();
    wait_volume(&c, &v.id, VolumeStatus::Available).await;
    let after = c
        .update_volume_metadata(&v.id, &m(&[("billing", "team-b"), ("tier", "gold")]))
        .await
        .unwrap();
    assert_eq!(
        after,
        m(&[("billing", "team-b"), ("owner", "ops"), ("tier", "gold")]),
        "{}: an update merges",
        b.name()
    );
    c.delete_volume_metadata_key(&v.id, "billing")
        .await
        .unwrap();
    // a key the volume lacks: removed already, no error
    c.delete_volume_metadata_key(&v.id, "billing")
        .await
        .unwrap();
    assert_eq!(
        c.get_volume_metadata(&v.id).await.unwrap(),
        m(&[("owner", "ops"), ("tier", "gold")]),
        "{}",
        b.name()
    );
    let long = "v".repeat(256);
    for (what, bad) in [
        ("a key with @", m(&[("bill@ing", "x")])),
        ("a value of 256", m(&[("billing", long.as_str())])),
    ] {
        let err = c.update_volume_metadata(&v.id, &bad).await.unwrap_err();
        assert!(
            matches!(err, Error::BadRequest(_)),
            "{}: {what}: {err}",
            b.name()
        );
        let err = c
            .create_volume(&CreateVolume {
                name: unique("contract-metadata-refused"),
                size_gib: 1,
                metadata: bad.clone(),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert!(
            matches!(err, Error::BadRequest(_)),
            "{}: {what} in a create: {err}",
            b.name()
        );
    }
    c.delete_volume(&v.id).await.unwrap();
    wait_gone("volume", || c.get_volume(&v.id)).await;
    let err = c
        .delete_volume_metadata_key(&v.id, "owner")
        .await
        .unwrap_err();
    assert!(
        err.is_not_found(),
        "{}: a gone volume's key: {err}",
        b.name()
    );
}
