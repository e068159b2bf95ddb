//! Detaches that got no answer (the connection dropped, the request timed
//! out): Nova may have done them, or may still do them, for all the
//! driver knows, since a request in an API's queue is served even after
//! its caller left. Until such a detach has shown in Cinder or
//! `--stuck-attachment-secs` has passed, a ControllerPublish of that
//! volume to that server is not answered OK on the strength of an
//! attachment that the late detach could take away (gcp-pd-csi-driver
//! #965: a timed-out detach landed after a newer attach and removed the
//! fresh disk). Kept in memory: a new controller starts after the old
//! one's lease ran out, long after such a request could still land.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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
    fn bounded() {
        let u = UnansweredDetaches::default();
        for i in 0..MAX_REMEMBERED + 10 {
            u.record(&format!("v{i}"), "s");
        }
        assert_eq!(u.sent().len(), MAX_REMEMBERED);
        assert!(u.pending("v0", "s", Duration::from_secs(60)).is_none());
    }
}
