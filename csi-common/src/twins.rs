//! What both drivers' controllers need to settle on one of several
//! volumes (or shares) of one name that two replicas made at once: the
//! same ranking in every replica, and a look taken only once the
//! service's clock has passed the second a whole-second `created_at`
//! names.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::request::timestamp;

/// The key every replica ranks twins by: oldest `created_at` first, then
/// the id (the lowest key is kept).
pub fn rank(created_at: Option<&str>, id: &str) -> (Option<(i64, i32)>, String) {
    (
        timestamp(created_at).map(|t| (t.seconds, t.nanos)),
        id.to_string(),
    )
}

/// Waits (at most a second) until the service's clock, as it read at
/// `read_at`, has passed the second of a `created_at` kept in whole
/// seconds (its database's precision): a twin made within that second
/// would rank by id, so the twins are looked for only afterwards, when
/// any twin made later ranks after ours.
pub async fn wait_past_created_second(created_at: Option<&str>, read_at: Option<SystemTime>) {
    if let (Some(created), Some(read_at)) = (timestamp(created_at), read_at)
        && created.nanos == 0
        && let Ok(secs) = u64::try_from(created.seconds + 1)
        && let Ok(wait) = (UNIX_EPOCH + Duration::from_secs(secs)).duration_since(read_at)
    {
        tokio::time::sleep(wait.min(Duration::from_secs(1)) + Duration::from_millis(50)).await;
    }
}

/// What a driver says of one of several resources named alike.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TwinView {
    pub id: String,
    pub created_at: Option<String>,
    /// Whether this driver made it (only such twins are ever settled).
    pub made_here: bool,
    /// Whether the service deletes it as it is now (not while being made).
    pub deletable: bool,
}

/// The one every replica keeps of several of one name.
pub fn keeper<T>(twins: &[T], view: impl Fn(&T) -> TwinView) -> Option<&T> {
    twins.iter().min_by_key(|t| {
        let v = view(t);
        rank(v.created_at.as_deref(), &v.id)
    })
}

/// Of what a lookup by name found: the one to keep, alone, once the
/// others (twins this driver made) are deleted where the service lets
/// them be (a twin still being made is its maker's to delete, or the next
/// call's). Anything else (one resource, or any not made here) is
/// answered as found.
pub async fn settle<T, F, Fut>(
    what: &str,
    name: &str,
    found: Vec<T>,
    view: impl Fn(&T) -> TwinView,
    delete: F,
) -> crate::DriverResult<Vec<T>>
where
    T: Clone,
    F: Fn(String) -> Fut,
    Fut: std::future::Future<Output = openstack_client::Result<()>>,
{
    if found.len() < 2 || !found.iter().all(|t| view(t).made_here) {
        return Ok(found);
    }
    let Some(keep) = keeper(&found, &view).cloned() else {
        return Ok(found);
    };
    let kept = view(&keep).id;
    for twin in found
        .iter()
        .map(&view)
        .filter(|t| t.id != kept && t.deletable)
    {
        crate::Context::context(
            crate::errors::not_found_ok(delete(twin.id.clone()).await),
            format!("deleting {what} {}, a twin of {kept}", twin.id),
        )?;
        tracing::warn!(twin = %twin.id, kept = %kept, name, "a second {what} of this name, made by another replica at the same time, deleted");
    }
    Ok(vec![keep])
}
