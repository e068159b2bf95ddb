//! What a service client sends and gets back, and how an answer that is
//! not one (a redirect, a transport error) is reported.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method};
use serde::de::DeserializeOwned;
use url::Url;

use crate::error::{ApiError, Error, Result};
use crate::service::ServiceType;

/// What a service client sends.
#[derive(Debug)]
pub(crate) struct ApiRequest {
    pub service: ServiceType,
    pub method: Method,
    /// Relative to the service's versioned endpoint, e.g. `volumes/detail`.
    pub path: String,
    pub query: Vec<(String, String)>,
    pub body: Option<RequestBody>,
    pub headers: Vec<(HeaderName, HeaderValue)>,
    pub operation: &'static str,
    pub deadline: Option<Instant>,
    /// Use this absolute base instead of the versioned endpoint (Manila's
    /// version document lives at the unversioned root).
    pub absolute_base: Option<Url>,
}

#[derive(Debug)]
pub(crate) enum RequestBody {
    Json(serde_json::Value),
}

impl ApiRequest {
    pub fn new(
        service: ServiceType,
        method: Method,
        path: impl Into<String>,
        operation: &'static str,
    ) -> Self {
        Self {
            service,
            method,
            path: path.into(),
            query: Vec::new(),
            body: None,
            headers: Vec::new(),
            operation,
            deadline: None,
            absolute_base: None,
        }
    }

    pub fn json(mut self, body: serde_json::Value) -> Self {
        self.body = Some(RequestBody::Json(body));
        self
    }

    pub fn query(mut self, key: &str, value: impl ToString) -> Self {
        self.query.push((key.to_string(), value.to_string()));
        self
    }

    pub fn header(mut self, name: HeaderName, value: &str) -> Self {
        if let Ok(v) = HeaderValue::from_str(value) {
            self.headers.push((name, v));
        }
        self
    }

    pub fn deadline(mut self, deadline: Option<Instant>) -> Self {
        self.deadline = deadline;
        self
    }

    pub(crate) fn idempotent(&self) -> bool {
        matches!(
            self.method,
            Method::GET | Method::HEAD | Method::PUT | Method::DELETE
        )
    }
}

#[derive(Debug)]
pub(crate) struct ApiResponse {
    pub body: Bytes,
    pub operation: &'static str,
}

impl ApiResponse {
    pub fn json<T: DeserializeOwned>(&self) -> Result<T> {
        serde_json::from_slice(&self.body).map_err(|e| Error::InvalidResponse {
            operation: self.operation,
            message: format!("cannot decode body: {e}"),
        })
    }
}

/// A redirect (301, 302, 303, 307, 308) from an OpenStack API: refused
/// with an error naming where
/// it pointed (quoted and cut short: the server chose it).
pub(super) fn redirect_refused(
    operation: &'static str,
    url: &str,
    status: u16,
    headers: &HeaderMap,
) -> Option<Error> {
    // 300 is not a redirect here: it is how OpenStack answers version
    // discovery (its body lists the versions)
    if !matches!(status, 301 | 302 | 303 | 307 | 308) {
        return None;
    }
    let location: String = headers
        .get(http::header::LOCATION)
        .map(|v| {
            String::from_utf8_lossy(v.as_bytes())
                .chars()
                .take(200)
                .collect()
        })
        .unwrap_or_default();
    Some(Error::InvalidResponse {
        operation,
        message: format!(
            "{url} answered {status} redirecting to {location:?}; redirects are not followed (no token or password goes to another URL): configure the endpoint the redirect names instead"
        ),
    })
}

pub(super) fn request_id(headers: &HeaderMap) -> Option<String> {
    [
        "x-openstack-request-id",
        "x-compute-request-id",
        "openstack-request-id",
    ]
    .iter()
    .find_map(|h| {
        headers
            .get(*h)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    })
}

pub(super) fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let v = headers.get("retry-after")?.to_str().ok()?;
    v.trim().parse::<u64>().ok().map(Duration::from_secs)
}

pub(super) fn transport_error(
    operation: &'static str,
    e: &reqwest::Error,
    elapsed: Duration,
) -> Error {
    if e.is_timeout() {
        return Error::Timeout {
            operation,
            elapsed,
            last: None,
        };
    }
    // the chain carries the useful part ("connection refused")
    let mut message = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        message.push_str(": ");
        message.push_str(&s.to_string());
        source = s.source();
    }
    Error::Unavailable(ApiError {
        operation,
        status: None,
        request_id: None,
        message,
    })
}
