//! Pieces the service clients share: microversion headers, pagination,
//! and polling a resource until it settles.

use std::future::Future;
use std::time::{Duration, Instant};

use http::HeaderName;

use crate::error::{Error, Result};

pub(crate) static OPENSTACK_API_VERSION: HeaderName =
    HeaderName::from_static("openstack-api-version");
pub(crate) static NOVA_API_VERSION: HeaderName =
    HeaderName::from_static("x-openstack-nova-api-version");
pub(crate) static MANILA_API_VERSION: HeaderName =
    HeaderName::from_static("x-openstack-manila-api-version");

/// A page of a marker-paginated listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page<T> {
    pub items: Vec<T>,
    /// Pass as `marker` to get the next page; `None` on the last page.
    pub next_marker: Option<String>,
}

/// Every item of a marker-paginated listing: `page` asked for each page,
/// from the first (`None`) to the last (no next marker).
pub(crate) async fn all_pages<T, F, Fut>(mut page: F) -> crate::error::Result<Vec<T>>
where
    F: FnMut(Option<String>) -> Fut,
    Fut: std::future::Future<Output = crate::error::Result<Page<T>>>,
{
    let mut out = Vec::new();
    let mut marker = None;
    loop {
        let p = page(marker).await?;
        out.extend(p.items);
        match p.next_marker {
            Some(m) => marker = Some(m),
            None => return Ok(out),
        }
    }
}

/// The `marker` query parameter of a `rel=next` link, as Cinder, Nova and
/// Manila return them.
pub(crate) fn next_marker(links: &[Link]) -> Option<String> {
    let next = links.iter().find(|l| l.rel == "next")?;
    let url = url::Url::parse(&next.href).ok()?;
    url.query_pairs()
        .find(|(k, _)| k == "marker")
        .map(|(_, v)| v.into_owned())
}

#[derive(Debug, Clone, serde::Deserialize)]
pub(crate) struct Link {
    pub href: String,
    pub rel: String,
}

/// What one look at a resource found.
#[derive(Debug)]
pub enum Poll<T> {
    Ready(T),
    Pending(String),
}

impl Poll<()> {
    /// One look at a resource being deleted: ready once the service
    /// answers "not found"; while it is still there, pending in the state
    /// `state` reads from it.
    pub fn gone<R>(look: Result<R>, state: impl FnOnce(&R) -> String) -> Result<Poll<()>> {
        match look {
            Ok(r) => Ok(Poll::Pending(state(&r))),
            Err(e) if e.is_not_found() => Ok(Poll::Ready(())),
            Err(e) => Err(e),
        }
    }
}

/// Calls `check` until it is ready, fails, or `deadline` passes: first
/// every `initial`, growing by half each time up to `max`.
pub async fn poll_until<T, F, Fut>(
    operation: &'static str,
    deadline: Instant,
    initial: Duration,
    max: Duration,
    mut check: F,
) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Poll<T>>>,
{
    let started = Instant::now();
    let mut delay = initial;
    loop {
        let last_state = match check().await? {
            Poll::Ready(v) => return Ok(v),
            Poll::Pending(state) => state,
        };
        let now = Instant::now();
        if now >= deadline {
            return Err(Error::Timeout {
                operation,
                elapsed: started.elapsed(),
                last: Some(Box::new(Error::StillPending {
                    operation,
                    state: last_state,
                })),
            });
        }
        tokio::time::sleep(delay.min(deadline - now)).await;
        delay = (delay + delay / 2).min(max);
    }
}

/// A `metadata` list filter as Cinder and Manila read it: a dict
/// literal, which JSON's object syntax is.
pub(crate) fn metadata_filter(pairs: &std::collections::BTreeMap<String, String>) -> String {
    serde_json::to_string(pairs).unwrap_or_default()
}

/// Whether `metadata` has every pair of `wanted`.
pub(crate) fn has_all(
    metadata: &std::collections::BTreeMap<String, String>,
    wanted: &std::collections::BTreeMap<String, String>,
) -> bool {
    wanted.iter().all(|(k, v)| metadata.get(k) == Some(v))
}
