//! Detaches whose outcome is unknown (the connection dropped, the request
//! timed out, a gateway answered 502 or 504 for Nova): Nova may have done
//! them, or may still do them, for all the driver knows, since a request
//! in an API's queue is served even after its caller left. Until such a
//! detach has shown in Cinder or `--stuck-attachment-secs` has passed, a
//! ControllerPublish of that volume to that server is not answered OK on
//! the strength of an attachment that the late detach could take away
//! (gcp-pd-csi-driver #965: a timed-out detach landed after a newer
//! attach and removed the fresh disk).
//!
//! Kept in memory, and on the volume itself ([`UNANSWERED_DETACH_KEY`]
//! in its metadata): a controller restarted meanwhile (a crash, a
//! rollout, a leader change) reads the volume before it answers a
//! publish, and so still knows. Writing the mark is best effort: a cloud
//! that loses the detach's answer may refuse the write too, and the
//! memory then covers this controller's life.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use openstack_client::cinder::{BlockStorage, Volume};

/// The volume metadata key that carries a detach of unknown outcome
/// across controller restarts: `<server id> <Unix seconds>` when it was
/// sent; [`SETTLED`] once it has shown.
pub const UNANSWERED_DETACH_KEY: &str = "cinder.csi.openstack.org/unanswered-detach";
/// The key's value once the detach has shown (a value, not a deleted key:
/// a key with `/` cannot be named in Cinder's URL of one key).
pub const SETTLED: &str = "settled";

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// How long ago the volume's own mark says a detach from `server` of
/// unknown outcome was sent.
fn marked(v: &Volume, server: &str) -> Option<Duration> {
    let (marked_server, at) = v.metadata.get(UNANSWERED_DETACH_KEY)?.split_once(' ')?;
    let at: u64 = at.parse().ok()?;
    (marked_server == server).then(|| Duration::from_secs(unix_now().saturating_sub(at)))
}

/// At most this many are remembered (the oldest are forgotten first).
const MAX_REMEMBERED: usize = 10_000;

#[derive(Debug, Clone, Default)]
pub struct UnansweredDetaches {
    sent: Arc<Mutex<HashMap<(String, String), Instant>>>,
}

impl UnansweredDetaches {
    fn sent(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), Instant>> {
        self.sent.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A detach of `volume` from `server` got no answer.
    pub fn record(&self, volume: &str, server: &str) {
        let mut sent = self.sent();
        if sent.len() >= MAX_REMEMBERED
            && let Some(oldest) = sent
                .iter()
                .min_by_key(|(_, at)| **at)
                .map(|(k, _)| k.clone())
        {
            sent.remove(&oldest);
        }
        sent.insert((volume.to_string(), server.to_string()), Instant::now());
    }

    /// Its fate is known: it landed, or a later detach was answered.
    pub fn settled(&self, volume: &str, server: &str) {
        self.sent()
            .remove(&(volume.to_string(), server.to_string()));
    }

    /// A detach of `volume` from `server` got no answer: remembered here
    /// and marked on the volume.
    pub async fn record_on_volume(&self, block: &BlockStorage, volume: &str, server: &str) {
        self.record(volume, server);
        let mark = BTreeMap::from([(
            UNANSWERED_DETACH_KEY.to_string(),
            format!("{server} {}", unix_now()),
        )]);
        if let Err(e) = block.update_volume_metadata(volume, &mark).await {
            tracing::warn!(volume_id = volume, server, error = %e, "cannot mark the detach of unknown outcome on the volume: only this controller remembers it");
        }
    }

    /// Its fate is known: forgotten here, and the volume's mark (as read
    /// in `v`) cleared if it names `server`.
    pub async fn settle_on_volume(&self, block: &BlockStorage, v: &Volume, server: &str) {
        self.settled(&v.id, server);
        if marked(v, server).is_some() {
            let cleared =
                BTreeMap::from([(UNANSWERED_DETACH_KEY.to_string(), SETTLED.to_string())]);
            if let Err(e) = block.update_volume_metadata(&v.id, &cleared).await {
                tracing::warn!(volume_id = %v.id, server, error = %e, "cannot clear the volume's mark of a settled detach: it expires with --stuck-attachment-secs");
            }
        }
    }

    /// How long ago a detach of unknown outcome of `v` from `server` was
    /// sent, by this controller's memory or the volume's mark, while that
    /// is less than `bound` (after it, it is forgotten).
    pub fn pending_on(&self, v: &Volume, server: &str, bound: Duration) -> Option<Duration> {
        self.pending(&v.id, server, bound)
            .or_else(|| marked(v, server).filter(|age| *age < bound))
    }

    /// How long ago an unanswered detach of `volume` from `server` was
    /// sent, while that is less than `bound` (after it, it is forgotten).
    pub fn pending(&self, volume: &str, server: &str, bound: Duration) -> Option<Duration> {
        let mut sent = self.sent();
        sent.retain(|_, at| at.elapsed() < bound);
        sent.get(&(volume.to_string(), server.to_string()))
            .map(Instant::elapsed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembered_until_settled_or_past_the_bound() {
        let u = UnansweredDetaches::default();
        let long = Duration::from_secs(60);
        assert_eq!(u.pending("v", "s", long), None);
        u.record("v", "s");
        assert!(u.pending("v", "s", long).is_some());
        assert_eq!(u.pending("v", "other", long), None, "per server");
        assert_eq!(u.pending("v", "s", Duration::ZERO), None, "past the bound");
        assert_eq!(u.pending("v", "s", long), None, "and forgotten");
        u.record("v", "s");
        u.settled("v", "s");
        assert_eq!(u.pending("v", "s", long), None);
    }

    #[test]
    fn the_volumes_mark_counts_for_its_server_until_the_bound() {
        let u = UnansweredDetaches::default();
        let long = Duration::from_secs(60);
        let mut v: Volume = serde_json::from_value(serde_json::json!({
            "id": "v", "status": "in-use", "size": 1,
        }))
        .unwrap();
        assert_eq!(u.pending_on(&v, "s", long), None);
        let ten_ago = unix_now() - 10;
        v.metadata
            .insert(UNANSWERED_DETACH_KEY.into(), format!("s {ten_ago}"));
        let age = u.pending_on(&v, "s", long).unwrap();
        assert!(age >= Duration::from_secs(10) && age < long, "{age:?}");
        assert_eq!(u.pending_on(&v, "other", long), None, "per server");
        assert_eq!(
            u.pending_on(&v, "s", Duration::from_secs(5)),
            None,
            "past the bound"
        );
        for settled in [SETTLED, "", "s", "s soon"] {
            v.metadata
                .insert(UNANSWERED_DETACH_KEY.into(), settled.into());
            assert_eq!(u.pending_on(&v, "s", long), None, "{settled:?}");
        }
    }

    #[test]
    fn bounded() {
        let u = UnansweredDetaches::default();
        for i in 0..MAX_REMEMBERED + 10 {
            u.record(&format!("v{i}"), "s");
        }
        assert_eq!(u.sent().len(), MAX_REMEMBERED);
        assert!(u.pending("v0", "s", Duration::from_secs(60)).is_none());
    }
}
