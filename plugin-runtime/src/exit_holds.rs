//! Work a handler starts that must end before the process does: the
//! server's shutdown waits for it, up to the grace period. A node
//! plugin's containers are told to stop together, so work that answers
//! what a neighbouring container does as it stops (its registrar
//! removing a socket) would otherwise die with the plugin.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::task::JoinHandle;

#[derive(Debug, Clone, Default)]
pub struct ExitHolds {
    pending: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl ExitHolds {
    /// Runs `work` now; the process does not exit before it ends (or the
    /// grace period does).
    pub fn spawn(&self, work: impl Future<Output = ()> + Send + 'static) {
        let handle = tokio::spawn(work);
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        pending.retain(|h| !h.is_finished());
        pending.push(handle);
    }

    /// How many are still running.
    pub fn running(&self) -> usize {
        let pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        pending.iter().filter(|h| !h.is_finished()).count()
    }

    /// Waits for every hold, at most `bound`; what is left is cut off.
    pub async fn wait(&self, bound: Duration) {
        let handles = std::mem::take(&mut *self.pending.lock().unwrap_or_else(|p| p.into_inner()));
        if handles.iter().all(JoinHandle::is_finished) {
            return;
        }
        tracing::info!(
            holds = handles.len(),
            "waiting for work that must end before the plugin does"
        );
        let all = async {
            for h in handles {
                let _ = h.await;
            }
        };
        if tokio::time::timeout(bound, all).await.is_err() {
            tracing::warn!(
                bound_s = bound.as_secs(),
                "work still running at the end of the grace period: cut off"
            );
        }
    }
}
