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
