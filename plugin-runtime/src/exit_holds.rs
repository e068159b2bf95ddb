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

    /// Waits for every hold, those started while it waits included (a
    /// request answered during the shutdown may start one), at most
    /// `bound`; what is left is cut off.
    pub async fn wait(&self, bound: Duration) {
        let deadline = tokio::time::Instant::now() + bound;
        let mut told = false;
        loop {
            let handles =
                std::mem::take(&mut *self.pending.lock().unwrap_or_else(|p| p.into_inner()));
            if handles.iter().all(JoinHandle::is_finished) {
                return;
            }
            if !told {
                told = true;
                tracing::info!(
                    holds = handles.len(),
                    "waiting for work that must end before the plugin does"
                );
            }
            let all = async {
                for h in handles {
                    let _ = h.await;
                }
            };
            if tokio::time::timeout_at(deadline, all).await.is_err() {
                tracing::warn!(
                    bound_s = bound.as_secs(),
                    "work still running at the end of the grace period: cut off"
                );
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    /// A request answered during the shutdown starts its hold after the
    /// wait began: the wait covers it too.
    #[tokio::test]
    async fn a_hold_started_while_the_shutdown_waits_is_waited_for() {
        let holds = ExitHolds::default();
        let done = Arc::new(AtomicBool::new(false));
        holds.spawn(tokio::time::sleep(Duration::from_millis(100)));
        let (late_holds, late_done) = (holds.clone(), done.clone());
        holds.spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            late_holds.spawn(async move {
                tokio::time::sleep(Duration::from_millis(300)).await;
                late_done.store(true, Ordering::SeqCst);
            });
        });
        holds.wait(Duration::from_secs(5)).await;
        assert!(
            done.load(Ordering::SeqCst),
            "the wait ended before the hold started during it"
        );
    }

    #[tokio::test]
    async fn the_wait_is_bounded() {
        let holds = ExitHolds::default();
        holds.spawn(std::future::pending());
        tokio::time::timeout(
            Duration::from_secs(3),
            holds.wait(Duration::from_millis(200)),
        )
        .await
        .expect("the wait outlived its bound");
    }
}
