//! In-flight de-duplication: work on one key (a volume id, a name) runs
//! one call at a time, so a sidecar's retry waits for the first attempt
//! instead of racing it, then finds its result through the idempotent
//! path.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

use crate::errors::{DriverError, DriverResult};

#[derive(Debug, Default, Clone)]
pub struct KeyedLocks {
    locks: Arc<Mutex<HashMap<String, Weak<tokio::sync::Mutex<()>>>>>,
}

impl KeyedLocks {
    pub async fn lock(
        &self,
        key: &str,
        deadline: Instant,
    ) -> DriverResult<tokio::sync::OwnedMutexGuard<()>> {
        let m = {
            let mut map = self.locks.lock().unwrap_or_else(|p| p.into_inner());
            map.retain(|_, w| w.strong_count() > 0);
            match map.get(key).and_then(Weak::upgrade) {
                Some(m) => m,
                None => {
                    let m = Arc::new(tokio::sync::Mutex::new(()));
                    map.insert(key.to_string(), Arc::downgrade(&m));
                    m
                }
            }
        };
        let wait = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(wait, m.lock_owned()).await {
            Ok(g) => Ok(g),
            Err(_) => Err(DriverError::Aborted(format!(
                "an operation on {key} is still in progress"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_second_caller_waits_then_gives_up_at_its_deadline() {
        let locks = KeyedLocks::default();
        let held = locks
            .lock("v", Instant::now() + Duration::from_secs(1))
            .await
            .unwrap();
        let err = locks
            .lock("v", Instant::now() + Duration::from_millis(30))
            .await
            .unwrap_err();
        assert!(matches!(err, DriverError::Aborted(_)), "{err}");
        // another key is independent
        let _other = locks
            .lock("w", Instant::now() + Duration::from_millis(30))
            .await
            .unwrap();
        drop(held);
        let _again = locks
            .lock("v", Instant::now() + Duration::from_millis(30))
            .await
            .unwrap();
    }
}
