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
    /// Never sent again after an attempt whose outcome is unknown (see
    /// [`Error::outcome_unknown`]): the first copy may still land after
    /// the second was answered and the caller acted on it.
    pub single_flight: bool,
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
            single_flight: false,
        }
    }

    /// Not repeated after an attempt whose outcome is unknown: the caller
    /// learns of it and decides (a detach sent twice may land after a
    /// newer attach).
    pub fn single_flight(mut self) -> Self {
        self.single_flight = true;
        self
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
    /// The service's clock when it answered (its `Date`), if it said.
    pub date: Option<std::time::SystemTime>,
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

/// The longest wait a server's hint can ask for: beyond it the answer is
/// handed back at once (a hint is the server's to write, and a day-long
/// one would hold the call's slot for nothing).
pub const MAX_RETRY_HINT: Duration = Duration::from_secs(300);

/// How long a refusal asks the caller to wait: the standard `Retry-After`
/// (seconds, or an HTTP date), else the rate limiters' `X-Retry-After` or
/// `X-RateLimit-Retry-After` (SAP's OpenStack rate limit middleware sends
/// these, in seconds, and not the standard one). Capped at
/// [`MAX_RETRY_HINT`].
pub(super) fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    ["retry-after", "x-retry-after", "x-ratelimit-retry-after"]
        .iter()
        .find_map(|h| {
            let v = headers.get(*h)?.to_str().ok()?;
            parse_retry_hint(v, std::time::SystemTime::now())
        })
}

/// A retry hint's value: seconds (a fraction too), a Unix time (seconds
/// since 1970, as some limiters write their reset), or an HTTP date. None
/// for anything else, negative or not a number.
pub fn parse_retry_hint(value: &str, now: std::time::SystemTime) -> Option<Duration> {
    let value = value.trim();
    let until = |when: std::time::SystemTime| when.duration_since(now).unwrap_or(Duration::ZERO);
    let wait = if let Ok(secs) = value.parse::<f64>() {
        if !secs.is_finite() || secs < 0.0 {
            return None;
        }
        // no wait is a billion seconds long: that is a point in time
        if secs >= 1e9 {
            until(std::time::UNIX_EPOCH + Duration::from_secs_f64(secs.min(1e11)))
        } else {
            Duration::from_secs_f64(secs.min(MAX_RETRY_HINT.as_secs_f64()))
        }
    } else {
        until(httpdate::parse_http_date(value).ok()?)
    };
    Some(wait.min(MAX_RETRY_HINT))
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

#[cfg(test)]
mod retry_hint_tests {
    use super::*;
    use std::time::UNIX_EPOCH;

    #[test]
    fn seconds_dates_and_unix_times_are_read_and_capped() {
        let now = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let secs = |v: &str| parse_retry_hint(v, now);
        assert_eq!(secs("60"), Some(Duration::from_secs(60)));
        assert_eq!(secs(" 1.5 "), Some(Duration::from_millis(1500)));
        assert_eq!(secs("0"), Some(Duration::ZERO));
        assert_eq!(secs("86400"), Some(MAX_RETRY_HINT), "capped");
        assert_eq!(
            secs("1800000030"),
            Some(Duration::from_secs(30)),
            "a Unix time"
        );
        assert_eq!(secs("1799999990"), Some(Duration::ZERO), "a Unix time past");
        let date = httpdate::fmt_http_date(now + Duration::from_secs(20));
        assert_eq!(secs(&date), Some(Duration::from_secs(20)), "{date}");
        assert_eq!(secs("Sun, 06 Nov 1994 08:49:37 GMT"), Some(Duration::ZERO));
        for bad in ["-1", "NaN", "inf", "soon", "", "1e400"] {
            assert_eq!(secs(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_standard_header_first_then_the_rate_limiters() {
        let mut h = HeaderMap::new();
        assert_eq!(retry_after(&h), None);
        h.insert("x-ratelimit-retry-after", "7".parse().unwrap());
        assert_eq!(retry_after(&h), Some(Duration::from_secs(7)));
        h.insert("x-retry-after", "5".parse().unwrap());
        assert_eq!(retry_after(&h), Some(Duration::from_secs(5)));
        h.insert("retry-after", "3".parse().unwrap());
        assert_eq!(retry_after(&h), Some(Duration::from_secs(3)));
        // an unreadable standard one does not hide the others
        h.insert("retry-after", "whenever".parse().unwrap());
        assert_eq!(retry_after(&h), Some(Duration::from_secs(5)));
    }
}
