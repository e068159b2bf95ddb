//! Manila: NFS and CephFS shares with their rules, unschedulable shares
//! explained, paging, pools and limits, share groups and their snapshots,
//! and the quota on group snapshots.

use std::collections::BTreeMap;
use std::time::Duration;

use openstack_client::Error;
use openstack_client::common::{Poll, poll_until};
use openstack_client::manila::{
    AccessRuleState, CreateShare, CreateShareGroup, GrantAccess, ListPage, ShareGroup,
    ShareGroupSnapshot, ShareGroupSnapshotStatus, ShareGroupStatus, ShareSnapshotStatus,
    ShareStatus, SharedFileSystems,
};

use crate::backend::*;
use crate::common::{deadline, wait_gone, wait_rule, wait_share, wait_share_size};

fn nfs(name: &str, size: u64) -> CreateShare {
    CreateShare {
        protocol: "NFS".into(),
        size_gib: size,
        name: name.into(),
        ..Default::default()
    }
}

#[tokio::test]
async fn manila_nfs_share_lifecycle() {
    let b = Backend::new().await;
    if !b.has("manila", "manila_nfs_share_lifecycle") {
        return;
    }
    let member = SharedFileSystems::new(b.session(User::Member));
    let admin = SharedFileSystems::new(b.session(User::Admin));
    assert_eq!(
        member.microversion().await.unwrap().to_string(),
        "2.65",
        "{}",
        b.name()
    );
    let types = member.list_share_types().await.unwrap();
    assert!(
        types.iter().any(|t| t.name == "default"),
        "{}: {types:?}",
        b.name()
    );

    let name = unique("contract-share");
    let created = member
        .create_share(&nfs(&name, 1))
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", b.name()));
    assert_eq!(created.status, ShareStatus::Creating);
    let share = wait_share(&member, &created.id, ShareStatus::Available).await;
    assert_eq!(share.share_proto, "NFS");
    assert_eq!(share.size, 1);
    assert_eq!(
        member.list_shares_named(&name).await.unwrap().len(),
        1,
        "{}",
        b.name()
    );

    // export locations: the member sees no admin-only path, the admin does
    let seen_by_member = member.list_export_locations(&share.id).await.unwrap();
    assert!(!seen_by_member.is_empty());
    assert!(
        seen_by_member.iter().all(|e| !e.is_admin_only),
        "{}: {seen_by_member:?}",
        b.name()
    );
    assert!(
        seen_by_member
            .iter()
            .any(|e| e.preferred && e.path.starts_with("127.0.0.1:/")),
        "{}: {seen_by_member:?}",
        b.name()
    );
    let seen_by_admin = admin.list_export_locations(&share.id).await.unwrap();
    assert!(
        seen_by_admin.iter().any(|e| e.is_admin_only),
        "{}: {seen_by_admin:?}",
        b.name()
    );
    for e in seen_by_admin.iter().chain(&seen_by_member) {
        assert!(
            e.path.starts_with("127.0.0."),
            "{}: export on a non-loopback address: {}",
            b.name(),
            e.path
        );
    }

    // ip access rule: queued, then active; then denied and gone
    let rule = member
        .grant_access(
            &share.id,
            &GrantAccess {
                access_type: "ip".into(),
                access_to: "127.0.0.1/32".into(),
                access_level: "rw".into(),
            },
        )
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", b.name()));
    assert!(
        matches!(
            rule.state,
            AccessRuleState::QueuedToApply | AccessRuleState::Applying | AccessRuleState::Active
        ),
        "{}: {:?}",
        b.name(),
        rule.state
    );
    let active = wait_rule(&member, &share.id, &rule.id, AccessRuleState::Active).await;
    assert_eq!(active.access_to, "127.0.0.1/32");
    assert_eq!(active.access_level, "rw");
    let listed = member.list_access_rules(&share.id).await.unwrap();
    assert_eq!(listed.len(), 1, "{}", b.name());
    let err = member
        .grant_access(
            &share.id,
            &GrantAccess {
                access_type: "ip".into(),
                access_to: "127.0.0.1/32".into(),
                access_level: "rw".into(),
            },
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::BadRequest(_)),
        "{}: duplicate rule: {err}",
        b.name()
    );
    member.revoke_access(&share.id, &rule.id).await.unwrap();
    wait_gone("rule removal", || {
        member.get_access_rule(&share.id, &rule.id)
    })
    .await;

    // resize
    member.extend_share(&share.id, 2).await.unwrap();
    wait_share_size(&member, &share.id, 2).await;
    member.shrink_share(&share.id, 1).await.unwrap();
    wait_share_size(&member, &share.id, 1).await;
    let err = member.extend_share(&share.id, 1).await.unwrap_err();
    assert!(matches!(err, Error::BadRequest(_)), "{}: {err}", b.name());

    // snapshot, and a share made from it
    let snap = member
        .create_snapshot(&share.id, &unique("contract-ssnap"), None)
        .await
        .unwrap();
    poll_until(
        "share snapshot",
        deadline(),
        Duration::from_millis(50),
        Duration::from_millis(500),
        || async {
            let x = member.get_snapshot(&snap.id).await?;
            Ok(if x.status == ShareSnapshotStatus::Available {
                Poll::Ready(())
            } else {
                Poll::Pending(x.status.to_string())
            })
        },
    )
    .await
    .unwrap();
    assert_eq!(
        member.list_snapshots_named(&snap.name).await.unwrap().len(),
        1
    );
    let from_snap = member
        .create_share(&CreateShare {
            snapshot_id: Some(snap.id.clone()),
            ..nfs(&unique("contract-fromsnap"), 1)
        })
        .await
        .unwrap();
    let from_snap = wait_share(&member, &from_snap.id, ShareStatus::Available).await;
    assert_eq!(from_snap.snapshot_id.as_deref(), Some(snap.id.as_str()));

    member.delete_share(&from_snap.id).await.unwrap();
    wait_gone("share delete", || member.get_share(&from_snap.id)).await;
    member.delete_snapshot(&snap.id).await.unwrap();
    wait_gone("snapshot removal", || member.get_snapshot(&snap.id)).await;
    member.delete_share(&share.id).await.unwrap();
    wait_gone("share delete", || member.get_share(&share.id)).await;
    let err = member.get_share(&share.id).await.unwrap_err();
    assert!(err.is_not_found(), "{}: {err}", b.name());
}

#[tokio::test]
async fn manila_cephfs_share_and_cephx_rule() {
    let b = Backend::new().await;
    if !b.has("manila", "manila_cephfs_share_and_cephx_rule") {
        return;
    }
    let m = SharedFileSystems::new(b.session(User::Member));
    let share = m
        .create_share(&CreateShare {
            protocol: "CEPHFS".into(),
            size_gib: 1,
            name: unique("contract-ceph"),
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", b.name()));
    let share = wait_share(&m, &share.id, ShareStatus::Available).await;
    assert_eq!(
        share.metadata.get("__mount_options").map(String::as_str),
        Some("fs=cephfs"),
        "{}: {:?}",
        b.name(),
        share.metadata
    );
    let exports = m.list_export_locations(&share.id).await.unwrap();
    assert_eq!(exports.len(), 1, "{}: {exports:?}", b.name());
    let path = &exports[0].path;
    assert!(
        path.starts_with("127.0.0.1:6789:/volumes/_nogroup/"),
        "{}: {path}",
        b.name()
    );
    assert!(path.contains(&share.id), "{}: {path}", b.name());

    let rule = m
        .grant_access(
            &share.id,
            &GrantAccess {
                access_type: "cephx".into(),
                access_to: "alice".into(),
                access_level: "rw".into(),
            },
        )
        .await
        .unwrap();
    let active = wait_rule(&m, &share.id, &rule.id, AccessRuleState::Active).await;
    assert!(
        active.access_key.as_deref().is_some_and(|k| k.len() >= 16),
        "{}: {:?}",
        b.name(),
        active.access_key
    );
    assert!(
        active.metadata.is_empty(),
        "{}: {:?}",
        b.name(),
        active.metadata
    );

    // a read-only rule that says what it is for: its metadata kept,
    // read back by id and in the share's list
    let what = std::collections::BTreeMap::from([(
        "csi.manila.openstack.org/backing-snapshot".to_string(),
        "0b5c3a4e-5b7e-4c61-9d0e-2f2b8a7d9c11".to_string(),
    )]);
    let reader = m
        .grant_access_with_metadata(
            &share.id,
            &GrantAccess {
                access_type: "cephx".into(),
                access_to: "bob".into(),
                access_level: "ro".into(),
            },
            &what,
        )
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", b.name()));
    assert_eq!(reader.metadata, what, "{}: at the grant", b.name());
    let reader = wait_rule(&m, &share.id, &reader.id, AccessRuleState::Active).await;
    assert_eq!(
        (reader.access_level.as_str(), &reader.metadata),
        ("ro", &what),
        "{}",
        b.name()
    );
    let listed = m.list_access_rules(&share.id).await.unwrap();
    assert!(
        listed
            .iter()
            .any(|r| r.id == reader.id && r.metadata == what)
            && listed
                .iter()
                .any(|r| r.id == rule.id && r.metadata.is_empty()),
        "{}: {listed:?}",
        b.name()
    );
    m.revoke_access(&share.id, &reader.id).await.unwrap();
    wait_gone("rule removal", || m.get_access_rule(&share.id, &reader.id)).await;
    m.revoke_access(&share.id, &rule.id).await.unwrap();
    wait_gone("rule removal", || m.get_access_rule(&share.id, &rule.id)).await;
    m.delete_share(&share.id).await.unwrap();
    wait_gone("share delete", || m.get_share(&share.id)).await;
}

#[tokio::test]
async fn manila_unschedulable_share_is_explained_by_user_messages() {
    let b = Backend::new().await;
    if !b.has(
        "manila",
        "manila_unschedulable_share_is_explained_by_user_messages",
    ) {
        return;
    }
    let m = SharedFileSystems::new(b.session(User::Member));
    // far larger than the backend's pool
    let share = m
        .create_share(&nfs(&unique("contract-huge"), 100_000))
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", b.name()));
    let failed = wait_share(&m, &share.id, ShareStatus::Error).await;
    assert!(failed.status.is_error());
    let messages = poll_until(
        "user message",
        deadline(),
        Duration::from_millis(50),
        Duration::from_millis(500),
        || async {
            let msgs = m.list_user_messages(&share.id).await?;
            Ok(if msgs.is_empty() {
                Poll::Pending("no message yet".into())
            } else {
                Poll::Ready(msgs)
            })
        },
    )
    .await
    .unwrap();
    assert!(
        messages[0]
            .user_message
            .contains("No storage could be allocated"),
        "{}: {messages:?}",
        b.name()
    );
    // the capacity filter's own detail, which the Manila driver maps to
    // ResourceExhausted
    assert_eq!(
        messages[0].detail_id.as_deref(),
        Some("009"),
        "{}: {messages:?}",
        b.name()
    );
    m.delete_share(&share.id).await.unwrap();
    wait_gone("share delete", || m.get_share(&share.id)).await;
}

/// Offset paging oldest first (what the Manila CSI driver's ListVolumes
/// and ListSnapshots tokens rely on), pools readable by admins only, and
/// the share quota in `limits`.
#[tokio::test]
async fn manila_paging_pools_and_limits() {
    let b = Backend::new().await;
    if !b.has("manila", "manila_paging_pools_and_limits") {
        return;
    }
    let member = SharedFileSystems::new(b.session(User::Member));
    let admin = SharedFileSystems::new(b.session(User::Admin));
    let prefix = unique("contract-page");
    let mut ids = Vec::new();
    for i in 0..3 {
        let s = member
            .create_share(&nfs(&format!("{prefix}-{i}"), 1))
            .await
            .unwrap();
        ids.push(s.id.clone());
        // created_at has second resolution on some backends: keep them apart
        tokio::time::sleep(Duration::from_millis(1100)).await;
    }
    for id in &ids {
        wait_share(&member, id, ShareStatus::Available).await;
    }
    let mut seen = Vec::new();
    let mut offset = 0;
    loop {
        let page = member
            .list_shares(&ListPage {
                limit: Some(2),
                offset,
                ..Default::default()
            })
            .await
            .unwrap();
        assert!(page.len() <= 2, "{}", b.name());
        offset += page.len() as u64;
        let done = page.len() < 2;
        seen.extend(page.into_iter().map(|s| s.id));
        if done {
            break;
        }
    }
    let positions: Vec<usize> = ids
        .iter()
        .map(|id| {
            seen.iter()
                .position(|s| s == id)
                .unwrap_or_else(|| panic!("{}: {id} not paged", b.name()))
        })
        .collect();
    assert!(
        positions.windows(2).all(|w| w[0] < w[1]),
        "{}: oldest first: {positions:?}",
        b.name()
    );
    let snap = member
        .create_snapshot(&ids[0], &unique("contract-psnap"), None)
        .await
        .unwrap();
    wait_snapshot_available(&member, &snap.id).await;
    let of_share = member
        .list_snapshots(&ListPage {
            limit: Some(10),
            share_id: Some(ids[0].clone()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(of_share.len(), 1, "{}", b.name());
    assert!(
        member
            .list_snapshots(&ListPage {
                share_id: Some(ids[1].clone()),
                ..Default::default()
            })
            .await
            .unwrap()
            .is_empty(),
        "{}",
        b.name()
    );
    let err = member.list_pools().await.unwrap_err();
    assert!(matches!(err, Error::Forbidden(_)), "{}: {err}", b.name());
    let pools = admin.list_pools().await.unwrap();
    assert!(
        pools
            .iter()
            .any(|p| p.capabilities.free_gib().is_some_and(|g| g > 0.0)),
        "{}: {pools:?}",
        b.name()
    );
    let limits = member.share_limits().await.unwrap();
    assert!(limits.used_gib >= 3, "{}: {limits:?}", b.name());
    member.delete_snapshot(&snap.id).await.unwrap();
    wait_gone("snapshot removal", || member.get_snapshot(&snap.id)).await;
    for id in &ids {
        member.delete_share(id).await.unwrap();
    }
    for id in &ids {
        wait_gone("share delete", || member.get_share(id)).await;
    }
}

async fn wait_snapshot_available(m: &SharedFileSystems, id: &str) {
    poll_until(
        "share snapshot",
        deadline(),
        Duration::from_millis(50),
        Duration::from_millis(500),
        || async {
            let x = m.get_snapshot(id).await?;
            Ok(if x.status == ShareSnapshotStatus::Available {
                Poll::Ready(())
            } else {
                Poll::Pending(x.status.to_string())
            })
        },
    )
    .await
    .unwrap();
}

/// The orphan report lists a cluster's shares by their metadata tag.
#[tokio::test]
async fn manila_lists_shares_by_metadata() {
    let b = Backend::new().await;
    if !b.has("manila", "manila_lists_shares_by_metadata") {
        return;
    }
    let m = SharedFileSystems::new(b.session(User::Member));
    let tag: std::collections::BTreeMap<String, String> = [(
        "manila.csi.openstack.org/cluster".to_string(),
        unique("contract-cluster"),
    )]
    .into();
    let tagged = m
        .create_share(&CreateShare {
            metadata: tag.clone(),
            ..nfs(&unique("contract-tagged"), 1)
        })
        .await
        .unwrap();
    let untagged = m
        .create_share(&nfs(&unique("contract-untagged"), 1))
        .await
        .unwrap();
    wait_share(&m, &tagged.id, ShareStatus::Available).await;
    wait_share(&m, &untagged.id, ShareStatus::Available).await;
    let found: Vec<String> = m
        .shares_with_metadata(&tag)
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.id)
        .collect();
    assert_eq!(found, std::slice::from_ref(&tagged.id), "{}", b.name());
    // the orphan tool's adoption: a key merged into the share's metadata
    // (the cluster's identity beside its id), the others kept
    let identity: std::collections::BTreeMap<String, String> = [(
        "manila.csi.openstack.org/cluster-uid".to_string(),
        unique("contract-uid"),
    )]
    .into();
    m.update_share_metadata(&tagged.id, &identity)
        .await
        .unwrap();
    let metadata = m.get_share(&tagged.id).await.unwrap().metadata;
    for (k, v) in tag.iter().chain(&identity) {
        assert_eq!(metadata.get(k), Some(v), "{}: {metadata:?}", b.name());
    }
    for id in [&tagged.id, &untagged.id] {
        m.delete_share(id).await.unwrap();
    }
    for id in [tagged.id, untagged.id] {
        wait_gone("share", || m.get_share(&id)).await;
    }
}

async fn wait_group_available(m: &SharedFileSystems, id: &str) -> ShareGroup {
    poll_until(
        "share group",
        deadline(),
        Duration::from_millis(50),
        Duration::from_millis(500),
        || async {
            let g = m.get_share_group(id).await?;
            assert!(
                !g.status.is_error(),
                "share group {id} went to {}",
                g.status
            );
            Ok(if g.status == ShareGroupStatus::Available {
                Poll::Ready(g)
            } else {
                Poll::Pending(g.status.to_string())
            })
        },
    )
    .await
    .unwrap()
}

async fn wait_group_snapshot_available(m: &SharedFileSystems, id: &str) -> ShareGroupSnapshot {
    poll_until(
        "share group snapshot",
        deadline(),
        Duration::from_millis(50),
        Duration::from_millis(500),
        || async {
            let x = m.get_share_group_snapshot(id).await?;
            assert!(
                !x.status.is_error(),
                "group snapshot {id} went to {}",
                x.status
            );
            Ok(if x.status == ShareGroupSnapshotStatus::Available {
                Poll::Ready(x)
            } else {
                Poll::Pending(x.status.to_string())
            })
        },
    )
    .await
    .unwrap()
}

/// Share groups as the Manila driver's group snapshots use them: shares
/// placed at creation, the group snapshotted whole (members are not share
/// snapshots), a new group made from it with one share per member, and
/// the refusals the driver maps: a grouped share deleted without its
/// group, a share with members, a group with shares or snapshots.
#[tokio::test]
async fn manila_share_groups_snapshots_and_restores() {
    let b = Backend::new().await;
    if !b.has("manila", "manila_share_groups_snapshots_and_restores") {
        return;
    }
    let m = SharedFileSystems::new(b.session(User::Member));
    let types = m.list_share_types().await.unwrap();
    let default = types.iter().find(|t| t.name == "default").unwrap();
    let g = m
        .create_share_group(&CreateShareGroup {
            name: unique("contract-group"),
            share_types: vec![default.id.clone()],
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", b.name()));
    assert_eq!(g.status, ShareGroupStatus::Creating, "{}", b.name());
    let g = wait_group_available(&m, &g.id).await;
    assert!(g.share_group_type_id.is_some(), "{}: {g:?}", b.name());
    let mut ids = Vec::new();
    for size in [1, 2] {
        let s = m
            .create_share(&CreateShare {
                share_group_id: Some(g.id.clone()),
                ..nfs(&unique("contract-grouped"), size)
            })
            .await
            .unwrap();
        assert_eq!(
            s.share_group_id.as_deref(),
            Some(g.id.as_str()),
            "{}",
            b.name()
        );
        ids.push(s.id);
    }
    for id in &ids {
        wait_share(&m, id, ShareStatus::Available).await;
    }
    let mut listed: Vec<String> = m
        .shares_in_group(&g.id)
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.id)
        .collect();
    listed.sort();
    let mut want = ids.clone();
    want.sort();
    assert_eq!(listed, want, "{}", b.name());
    // a grouped share is deleted only with its group named
    match m.delete_share(&ids[0]).await {
        Err(Error::BadRequest(e)) => assert!(e.message.contains("share_group_id"), "{e:?}"),
        other => panic!(
            "{}: deleting a grouped share without its group: {other:?}",
            b.name()
        ),
    }

    let name = unique("contract-group-snapshot");
    let gs = m
        .create_share_group_snapshot(&g.id, &name, Some("contract"))
        .await
        .unwrap();
    assert_eq!(
        gs.status,
        ShareGroupSnapshotStatus::Creating,
        "{}",
        b.name()
    );
    let gs = wait_group_snapshot_available(&m, &gs.id).await;
    let mut of: Vec<(String, u64)> = gs
        .members
        .iter()
        .map(|x| (x.share_id.clone(), x.size))
        .collect();
    of.sort();
    let mut sizes: Vec<(String, u64)> = Vec::new();
    for id in &ids {
        sizes.push((id.clone(), m.get_share(id).await.unwrap().size));
    }
    sizes.sort();
    assert_eq!(of, sizes, "{}: {gs:?}", b.name());
    assert_eq!(
        m.share_group_snapshots_named(&name).await.unwrap().len(),
        1,
        "{}",
        b.name()
    );
    // members are not share snapshots
    for x in &gs.members {
        assert!(
            m.get_snapshot(&x.id).await.unwrap_err().is_not_found(),
            "{}",
            b.name()
        );
    }
    // a share with members stays
    match m.delete_share_in(&ids[0], Some(&g.id)).await {
        Err(Error::Forbidden(e)) | Err(Error::Conflict(e)) | Err(Error::BadRequest(e)) => {
            assert!(e.message.contains("dependent"), "{}: {e:?}", b.name())
        }
        other => panic!("{}: deleting a share with members: {other:?}", b.name()),
    }
    // a group with snapshots stays
    assert!(
        matches!(m.delete_share_group(&g.id).await, Err(Error::Conflict(_))),
        "{}",
        b.name()
    );

    // a group made from the group snapshot: one share per member, unnamed,
    // in the snapshotted group's type
    let restored = m
        .create_share_group(&CreateShareGroup {
            name: unique("contract-restore"),
            source_share_group_snapshot_id: Some(gs.id.clone()),
            share_group_type_id: g.share_group_type_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", b.name()));
    assert_eq!(
        restored.source_share_group_snapshot_id.as_deref(),
        Some(gs.id.as_str())
    );
    wait_group_available(&m, &restored.id).await;
    assert_eq!(
        m.share_groups_from(&gs.id)
            .await
            .unwrap()
            .into_iter()
            .map(|x| x.id)
            .collect::<Vec<_>>(),
        vec![restored.id.clone()],
        "{}",
        b.name()
    );
    let copies = m.shares_in_group(&restored.id).await.unwrap();
    assert_eq!(copies.len(), 2, "{}: {copies:?}", b.name());
    let mut from: Vec<String> = copies
        .iter()
        .map(|s| {
            s.source_share_group_snapshot_member_id
                .clone()
                .unwrap_or_default()
        })
        .collect();
    from.sort();
    let mut members: Vec<String> = gs.members.iter().map(|x| x.id.clone()).collect();
    members.sort();
    assert_eq!(from, members, "{}", b.name());
    assert!(
        copies.iter().all(|s| s.name.is_empty()),
        "{}: {copies:?}",
        b.name()
    );
    for s in &copies {
        wait_share(&m, &s.id, ShareStatus::Available).await;
    }
    // a restored share is named (and described) afterwards
    m.rename_share(&copies[0].id, "contract-taken", "contract")
        .await
        .unwrap();
    let taken = m.get_share(&copies[0].id).await.unwrap();
    assert_eq!(taken.name, "contract-taken", "{}", b.name());
    assert_eq!(
        taken.description.as_deref(),
        Some("contract"),
        "{}",
        b.name()
    );

    // everything goes, in the order Manila allows
    for s in &copies {
        m.delete_share_of(s).await.unwrap();
    }
    for s in &copies {
        wait_gone("restored share", || m.get_share(&s.id)).await;
    }
    m.delete_share_group(&restored.id).await.unwrap();
    m.delete_share_group_snapshot(&gs.id).await.unwrap();
    wait_gone("share group snapshot", || {
        m.get_share_group_snapshot(&gs.id)
    })
    .await;
    for id in &ids {
        m.delete_share_in(id, Some(&g.id)).await.unwrap();
    }
    for id in &ids {
        wait_gone("grouped share", || m.get_share(id)).await;
    }
    m.delete_share_group(&g.id).await.unwrap();
    wait_gone("share group", || m.get_share_group(&g.id)).await;
    wait_gone("restore group", || m.get_share_group(&restored.id)).await;
}

/// Manila's `share_group_snapshots` quota, as the Manila driver meets it:
/// an admin sets a project's quota (never below what it uses, a member
/// not at all), and a group snapshot past it is a 413 that says
/// "exceeded" and not "quota", sent with `Retry-After: 0`, which the
/// client must read as over quota, not as a rate limit; nothing is made.
/// It runs in the admin's project, whose quota it puts back, so that no
/// other test's group snapshot meets the lowered one.
#[tokio::test]
async fn manila_share_group_snapshot_quota() {
    let b = Backend::new().await;
    if !b.has("manila", "manila_share_group_snapshot_quota") {
        return;
    }
    const KEY: &str = "share_group_snapshots";
    let member = SharedFileSystems::new(b.session(User::Member));
    let member_project = b.session(User::Member).project_id().await.unwrap().unwrap();
    let own = member.project_quotas(&member_project).await.unwrap();
    assert!(own.contains_key(KEY), "{}: {own:?}", b.name());
    match member
        .set_project_quotas(&member_project, &BTreeMap::from([(KEY.to_string(), 5)]))
        .await
    {
        Err(Error::Forbidden(_)) => {}
        other => panic!("{}: a member setting its quota: {other:?}", b.name()),
    }

    let admin = SharedFileSystems::new(b.session(User::Admin));
    let project = b.session(User::Admin).project_id().await.unwrap().unwrap();
    let types = admin.list_share_types().await.unwrap();
    let default = types.iter().find(|t| t.name == "default").unwrap();
    let g = admin
        .create_share_group(&CreateShareGroup {
            name: unique("contract-quota-group"),
            share_types: vec![default.id.clone()],
            ..Default::default()
        })
        .await
        .unwrap();
    let g = wait_group_available(&admin, &g.id).await;
    let share = admin
        .create_share(&CreateShare {
            share_group_id: Some(g.id.clone()),
            ..nfs(&unique("contract-quota-grouped"), 1)
        })
        .await
        .unwrap();
    wait_share(&admin, &share.id, ShareStatus::Available).await;
    let first = admin
        .create_share_group_snapshot(&g.id, &unique("contract-quota-first"), None)
        .await
        .unwrap();
    let first = wait_group_snapshot_available(&admin, &first.id).await;

    let before = admin.project_quotas(&project).await.unwrap()[KEY];
    // below what the project holds: refused, and the refusal names it
    let below = admin
        .set_project_quotas(&project, &BTreeMap::from([(KEY.to_string(), 0)]))
        .await;
    let used: Option<i64> = match &below {
        Err(Error::BadRequest(e)) => e
            .message
            .rsplit("greater than ")
            .next()
            .and_then(|n| n.trim_end_matches('.').parse().ok()),
        _ => None,
    };
    // exactly what it holds: the next group snapshot is over
    let at_use = match used {
        Some(n) => Some(
            admin
                .set_project_quotas(&project, &BTreeMap::from([(KEY.to_string(), n)]))
                .await,
        ),
        None => None,
    };
    let over_name = unique("contract-quota-over");
    let over = match &at_use {
        Some(Ok(_)) => Some(
            admin
                .create_share_group_snapshot(&g.id, &over_name, None)
                .await,
        ),
        _ => None,
    };
    // the quota back before anything is asserted
    admin
        .set_project_quotas(&project, &BTreeMap::from([(KEY.to_string(), before)]))
        .await
        .unwrap();

    assert!(
        used.is_some_and(|n| n >= 1),
        "{}: a limit below the use: {below:?}",
        b.name()
    );
    let at_use = at_use.unwrap().unwrap();
    assert_eq!(at_use.get(KEY), used.as_ref(), "{}", b.name());
    match over.unwrap() {
        Err(Error::OverQuota(e)) => assert!(
            e.message.contains("share-group-snapshots is exceeded"),
            "{}: {e:?}",
            b.name()
        ),
        other => panic!("{}: a group snapshot past the quota: {other:?}", b.name()),
    }
    assert!(
        admin
            .share_group_snapshots_named(&over_name)
            .await
            .unwrap()
            .is_empty(),
        "{}: a refused group snapshot left behind",
        b.name()
    );
    assert_eq!(admin.project_quotas(&project).await.unwrap()[KEY], before);

    admin.delete_share_group_snapshot(&first.id).await.unwrap();
    wait_gone("share group snapshot", || {
        admin.get_share_group_snapshot(&first.id)
    })
    .await;
    admin.delete_share_in(&share.id, Some(&g.id)).await.unwrap();
    wait_gone("grouped share", || admin.get_share(&share.id)).await;
    admin.delete_share_group(&g.id).await.unwrap();
    wait_gone("share group", || admin.get_share_group(&g.id)).await;
}
