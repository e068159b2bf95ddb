//! Waiting for OpenStack resources to settle, never past the caller's
//! deadline: polled from [`POLL_FIRST`] growing by half to [`POLL_MAX`].
//! A wait that runs out answers DeadlineExceeded saying what is still
//! pending; the CO retries and the idempotent call resumes the wait.

use std::future::Future;
use std::time::{Duration, Instant};

use openstack_client::common::{Poll, poll_until};

use crate::errors::{Context, DriverError, DriverResult};

/// First poll of a pending resource, and the cap of the growing interval.
/// The cap is what a wait of a few seconds (a create, an attach) is late
/// by at worst: with 2 s, a create Cinder finished at 4.4 s was seen at
/// 6.3 s. In the scale bench, 1 s took our CreateVolume from 1.25 s to
/// 0.74 s above Cinder's own create (30 at once) and from 4.0 s to 2.3 s
/// (100 at once), for 0.6 more calls per claim.
pub const POLL_FIRST: Duration = Duration::from_millis(25);
pub const POLL_MAX: Duration = Duration::from_secs(1);
/// Before the first look at a resource that was just asked to change.
pub const SETTLE: Duration = Duration::from_millis(5);

/// Polls `check` until it is ready or `deadline` passes. `pending` says
/// what was still being waited for (it gets the last state seen).
pub async fn wait_until<T, F, Fut>(
    operation: &'static str,
    deadline: Instant,
    pending: impl FnOnce(&str) -> String,
    check: F,
) -> DriverResult<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = openstack_client::Result<Poll<T>>>,
{
    // what was just asked to change has not settled yet: the first look
    // comes a moment later (an immediate one only costs a round trip)
    tokio::time::sleep(SETTLE.min(deadline.saturating_duration_since(Instant::now()))).await;
    match poll_until(operation, deadline, POLL_FIRST, POLL_MAX, check).await {
        Ok(v) => Ok(v),
        Err(openstack_client::Error::Timeout { last, .. }) => {
            let state = match last.as_deref() {
                Some(openstack_client::Error::StillPending { state, .. }) => state.clone(),
                Some(other) => other.to_string(),
                None => "unknown".into(),
            };
            Err(DriverError::DeadlineExceeded(format!(
                "{}; a retry resumes waiting",
                pending(&state)
            )))
        }
        Err(e) => Err(e).context(format!("waiting ({operation})")),
    }
}

/// Polls `get` until it answers 404: the resource is gone.
pub async fn wait_gone<T, F, Fut>(
    operation: &'static str,
    deadline: Instant,
    what: &str,
    mut get: F,
    state: impl Fn(&T) -> String,
) -> DriverResult<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = openstack_client::Result<T>>,
{
    wait_until(
        operation,
        deadline,
        |s| format!("{what} is still {s}"),
        || {
            let f = get();
            let state = &state;
            async move { Poll::gone(f.await, state) }
        },
    )
    .await
}

/// Asks for a deletion, unless one is `under_way`, and waits until the
/// resource is gone: done means gone, so that a list, a get or the
/// deletion of what it depends on no longer sees it.
#[allow(clippy::too_many_arguments)]
pub async fn delete_and_wait_gone<T, D, F, Fut>(
    operation: &'static str,
    deadline: Instant,
    service: &str,
    what: &str,
    under_way: bool,
    delete: D,
    get: F,
    state: impl Fn(&T) -> String,
) -> DriverResult<()>
where
    D: Future<Output = openstack_client::Result<()>>,
    F: FnMut() -> Fut,
    Fut: Future<Output = openstack_client::Result<T>>,
{
    if !under_way
        && crate::errors::deletion(delete.await, service, what)? == crate::errors::Deletion::Gone
    {
        return Ok(());
    }
    wait_gone(operation, deadline, what, get, state).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_wait_that_runs_out_says_what_is_pending() {
        let e = wait_until(
            "thing",
            Instant::now() + Duration::from_millis(60),
            |s| format!("thing is still {s}"),
            || async { Ok(Poll::<()>::Pending("creating".into())) },
        )
        .await
        .unwrap_err();
        assert!(
            matches!(&e, DriverError::DeadlineExceeded(m) if m.contains("still creating")),
            "{e}"
        );
        let mut n = 0;
        wait_gone(
            "thing",
            Instant::now() + Duration::from_secs(5),
            "thing",
            || {
                n += 1;
                let done = n > 2;
                async move {
                    if done {
                        Err(openstack_client::Error::NotFound(
                            openstack_client::ApiError {
                                operation: "get",
                                status: Some(404),
                                request_id: None,
                                message: "gone".into(),
                            },
                        ))
                    } else {
                        Ok("deleting")
                    }
                }
            },
            |s| s.to_string(),
        )
        .await
        .unwrap();
    }
}
