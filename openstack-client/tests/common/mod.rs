//! Waiting helpers shared by the integration tests: poll a resource until
//! it reaches a state or is gone, within a minute.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::future::Future;
use std::time::{Duration, Instant};

use openstack_client::Error;
use openstack_client::cinder::{
    Backup, BackupStatus, BlockStorage, Group, GroupSnapshot, GroupSnapshotStatus, GroupStatus,
    SnapshotStatus, Volume, VolumeStatus,
};
use openstack_client::common::{Poll, poll_until};
use openstack_client::manila::{
    AccessRule, AccessRuleState, Share, ShareStatus, SharedFileSystems,
};

pub fn deadline() -> Instant {
    Instant::now() + Duration::from_secs(60)
}

async fn until<T, F, Fut>(what: &'static str, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Poll<T>, Error>>,
{
    poll_until(
        what,
        deadline(),
        Duration::from_millis(20),
        Duration::from_millis(500),
        check,
    )
    .await
    .unwrap_or_else(|e| panic!("{what}: {e}"))
}

pub async fn wait_volume(c: &BlockStorage, id: &str, want: VolumeStatus) -> Volume {
    until("volume", || async {
        let v = c.get_volume(id).await?;
        assert!(
            !v.status.is_error() || want.is_error(),
            "volume {id} went to {}",
            v.status
        );
        Ok(if v.status == want {
            Poll::Ready(v)
        } else {
            Poll::Pending(v.status.to_string())
        })
    })
    .await
}

/// Waits until the volume has `size` GiB and is `status` again (extend).
pub async fn wait_volume_size(c: &BlockStorage, id: &str, size: u64, status: VolumeStatus) {
    until("volume resize", || async {
        let v = c.get_volume(id).await?;
        Ok(if v.size == size && v.status == status {
            Poll::Ready(())
        } else {
            Poll::Pending(v.status.to_string())
        })
    })
    .await
}

/// Waits until the share has `size` GiB and is available again.
pub async fn wait_share_size(m: &SharedFileSystems, id: &str, size: u64) {
    until("share resize", || async {
        let s = m.get_share(id).await?;
        Ok(if s.size == size && s.status == ShareStatus::Available {
            Poll::Ready(())
        } else {
            Poll::Pending(s.status.to_string())
        })
    })
    .await
}

pub async fn wait_snapshot(c: &BlockStorage, id: &str) {
    until("snapshot", || async {
        let s = c.get_snapshot(id).await?;
        Ok(if s.status == SnapshotStatus::Available {
            Poll::Ready(())
        } else {
            Poll::Pending(s.status.to_string())
        })
    })
    .await
}

pub async fn wait_backup(c: &BlockStorage, id: &str) -> Backup {
    until("backup", || async {
        let b = c.get_backup(id).await?;
        assert!(!b.status.is_error(), "backup {id} went to {}", b.status);
        Ok(if b.status == BackupStatus::Available {
            Poll::Ready(b)
        } else {
            Poll::Pending(b.status.to_string())
        })
    })
    .await
}

pub async fn wait_group(c: &BlockStorage, id: &str) -> Group {
    until("group", || async {
        let g = c.get_group(id).await?;
        assert!(!g.status.is_error(), "group {id} went to {}", g.status);
        Ok(if g.status == GroupStatus::Available {
            Poll::Ready(g)
        } else {
            Poll::Pending(g.status.to_string())
        })
    })
    .await
}

pub async fn wait_group_snapshot(c: &BlockStorage, id: &str) -> GroupSnapshot {
    until("group snapshot", || async {
        let g = c.get_group_snapshot(id).await?;
        assert!(
            !g.status.is_error(),
            "group snapshot {id} went to {}",
            g.status
        );
        Ok(if g.status == GroupSnapshotStatus::Available {
            Poll::Ready(g)
        } else {
            Poll::Pending(g.status.to_string())
        })
    })
    .await
}

pub async fn wait_share(m: &SharedFileSystems, id: &str, want: ShareStatus) -> Share {
    until("share", || async {
        let s = m.get_share(id).await?;
        assert!(
            !s.status.is_error() || want.is_error(),
            "share {id} went to {}",
            s.status
        );
        Ok(if s.status == want {
            Poll::Ready(s)
        } else {
            Poll::Pending(s.status.to_string())
        })
    })
    .await
}

pub async fn wait_rule(
    m: &SharedFileSystems,
    share: &str,
    rule: &str,
    want: AccessRuleState,
) -> AccessRule {
    until("access rule", || async {
        let r = m.get_access_rule(share, rule).await?;
        Ok(if r.state == want {
            Poll::Ready(r)
        } else {
            Poll::Pending(r.state.to_string())
        })
    })
    .await
}

/// Waits until `get` answers "not found".
pub async fn wait_gone<T, F, Fut>(what: &'static str, get: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<T, Error>>,
{
    until(what, || async {
        Poll::gone(get().await, |_| "still there".into())
    })
    .await
}
