//! The one error type every OpenStack call returns.

use std::fmt;
use std::time::Duration;

use crate::config::ConfigError;

/// What the server said about a failed request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// The operation that failed, e.g. `volume_create`.
    pub operation: &'static str,
    /// HTTP status, absent for connection-level failures.
    pub status: Option<u16>,
    /// `x-openstack-request-id` (or `x-compute-request-id`) of the response.
    pub request_id: Option<String>,
    /// The server's own message, or the transport error.
    pub message: String,
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.operation)?;
        if let Some(s) = self.status {
            write!(f, ": HTTP {s}")?;
        }
        write!(f, ": {}", self.message)?;
        if let Some(id) = &self.request_id {
            write!(f, " (request id {id})")?;
        }
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("not found: {0}")]
    NotFound(ApiError),
    #[error("conflict: {0}")]
    Conflict(ApiError),
    #[error("bad request: {0}")]
    BadRequest(ApiError),
    #[error("unauthorized (check the credentials): {0}")]
    Unauthorized(ApiError),
    #[error("forbidden: {0}")]
    Forbidden(ApiError),
    #[error("over quota: {0}")]
    OverQuota(ApiError),
    #[error("rate limited{}: {error}", retry_after.map(|d| format!(" (retry after {}s)", d.as_secs())).unwrap_or_default())]
    RateLimited {
        error: ApiError,
        retry_after: Option<Duration>,
    },
    #[error("service unavailable: {0}")]
    Unavailable(ApiError),
    /// Nova's 409 for a server in the middle of another operation
    /// (`task_state`): refused before any work, worth asking again.
    #[error("busy: {0}")]
    Busy(ApiError),
    #[error("{operation}: timed out after {elapsed:?}{}", last.as_ref().map(|e| format!(" (last error: {e})")).unwrap_or_default())]
    Timeout {
        operation: &'static str,
        elapsed: Duration,
        last: Option<Box<Error>>,
    },
    #[error("configuration: {0}")]
    Config(#[from] ConfigError),
    #[error("TLS setup: {0}")]
    Tls(String),
    #[error("no {service} endpoint in the service catalog (interface {interface}{})", region.as_ref().map(|r| format!(", region {r}")).unwrap_or_default())]
    EndpointNotFound {
        service: &'static str,
        interface: String,
        region: Option<String>,
    },
    /// A request path whose id would walk the URL (empty, `.`, `..`):
    /// refused before anything is sent.
    #[error(
        "{operation}: {id:?} cannot name an OpenStack resource (an id is not empty, `.` or `..`)"
    )]
    InvalidId { operation: &'static str, id: String },
    #[error("{operation}: unexpected response: {message}")]
    InvalidResponse {
        operation: &'static str,
        message: String,
    },
    #[error("{operation}: {message}")]
    Unsupported {
        operation: &'static str,
        message: String,
    },
    #[error("{operation}: still {state}")]
    StillPending {
        operation: &'static str,
        state: String,
    },
    #[error("{operation}: resource {id} went to status {status}{}", detail.as_ref().map(|d| format!(": {d}")).unwrap_or_default())]
    ResourceFailed {
        operation: &'static str,
        id: String,
        status: String,
        detail: Option<String>,
    },
}

impl Error {
    pub fn is_not_found(&self) -> bool {
        matches!(self, Error::NotFound(_))
    }

    /// Whether repeating the same idempotent request may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Error::Unavailable(_) | Error::RateLimited { .. } | Error::Busy(_)
        )
    }

    /// Whether the service refused the request before doing anything, so
    /// that even a POST may be sent again: a rate limiter's 429, Nova's
    /// busy 409. (A 5xx or a lost answer may follow work done.)
    pub fn refused_before_work(&self) -> bool {
        matches!(self, Error::RateLimited { .. } | Error::Busy(_))
    }

    /// Whether the request may have been done, or may still be, for all
    /// the caller knows: no answer came back (a dropped connection, a
    /// timeout), or a gateway in front of the service answered for it
    /// (502 Bad Gateway, 504 Gateway Timeout: a load balancer or proxy
    /// gave up waiting while the service went on with the request).
    pub fn outcome_unknown(&self) -> bool {
        match self {
            Error::Unavailable(e) => e.status.is_none_or(|s| s == 502 || s == 504),
            Error::Timeout { last, .. } => last.as_ref().is_none_or(|e| e.outcome_unknown()),
            _ => false,
        }
    }

    pub fn api_error(&self) -> Option<&ApiError> {
        match self {
            Error::NotFound(e)
            | Error::Conflict(e)
            | Error::BadRequest(e)
            | Error::Unauthorized(e)
            | Error::Forbidden(e)
            | Error::OverQuota(e)
            | Error::Unavailable(e)
            | Error::Busy(e)
            | Error::RateLimited { error: e, .. } => Some(e),
            _ => None,
        }
    }

    pub fn request_id(&self) -> Option<&str> {
        self.api_error().and_then(|e| e.request_id.as_deref())
    }

    /// Classifies an HTTP error response.
    pub(crate) fn from_status(status: u16, error: ApiError, retry_after: Option<Duration>) -> Self {
        match status {
            400 | 422 => Error::BadRequest(error),
            401 => Error::Unauthorized(error),
            403 => Error::Forbidden(error),
            404 => Error::NotFound(error),
            // "Cannot 'attach_volume' instance X while it is in task_state
            // ...": another operation of the server is under way (a
            // vm_state refusal, shelved or in error, stays a conflict)
            409 if error.message.contains("while it is in task_state") => Error::Busy(error),
            409 => Error::Conflict(error),
            413 => {
                // Cinder and Nova answer 413 for quota; a 413 asking for
                // a wait is the old rate-limit answer. Cinder's and
                // Manila's quota errors carry `Retry-After: 0`, and some
                // of their messages do not say quota ("Maximum number of
                // shares allowed (5) exceeded.")
                let message = error.message.to_ascii_lowercase();
                let waits = retry_after.is_some_and(|d| !d.is_zero());
                if waits && !message.contains("quota") && !message.contains("exceeded") {
                    Error::RateLimited { error, retry_after }
                } else {
                    Error::OverQuota(error)
                }
            }
            429 => Error::RateLimited { error, retry_after },
            500..=599 => Error::Unavailable(error),
            _ => Error::InvalidResponse {
                operation: error.operation,
                message: format!("HTTP {status}: {}", error.message),
            },
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Pulls the human-readable message out of the error bodies OpenStack
/// services send: `{"itemNotFound": {"message": ...}}` (Cinder, Nova,
/// Manila), `{"error": {"message": ...}}` (Keystone), `{"description": ...}`
/// (Barbican), or plain text.
pub fn error_message_from_body(body: &[u8]) -> String {
    const MAX: usize = 512;
    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(body) {
        if let Some(m) = message_in(&v) {
            return truncate(m, MAX);
        }
        if let Some(obj) = v.as_object() {
            for inner in obj.values() {
                if let Some(m) = message_in(inner) {
                    return truncate(m, MAX);
                }
            }
        }
    }
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    if text.is_empty() {
        "(empty body)".to_string()
    } else {
        truncate(text, MAX)
    }
}

fn message_in(v: &serde_json::Value) -> Option<&str> {
    let obj = v.as_object()?;
    ["message", "description", "faultstring", "title"]
        .iter()
        .find_map(|k| {
            obj.get(*k)
                .and_then(|m| m.as_str())
                .filter(|m| !m.is_empty())
        })
}

fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_from_each_service_shape() {
        assert_eq!(
            error_message_from_body(
                br#"{"itemNotFound": {"code": 404, "message": "Volume x could not be found."}}"#
            ),
            "Volume x could not be found."
        );
        assert_eq!(
            error_message_from_body(br#"{"error": {"code": 401, "title": "Unauthorized", "message": "The request you have made requires authentication."}}"#),
            "The request you have made requires authentication."
        );
        assert_eq!(
            error_message_from_body(
                br#"{"code": 404, "title": "Not Found", "description": "Secret not found."}"#
            ),
            "Secret not found."
        );
        assert_eq!(
            error_message_from_body(b"  gateway down \n"),
            "gateway down"
        );
        assert_eq!(error_message_from_body(b""), "(empty body)");
    }

    #[test]
    fn status_classification() {
        let e = || ApiError {
            operation: "op",
            status: Some(0),
            request_id: None,
            message: "m".into(),
        };
        assert!(matches!(
            Error::from_status(404, e(), None),
            Error::NotFound(_)
        ));
        assert!(matches!(
            Error::from_status(413, e(), None),
            Error::OverQuota(_)
        ));
        // Manila's and Cinder's QuotaError: Retry-After 0, and a message
        // that may not say quota
        let says = |message: &str| ApiError {
            message: message.into(),
            ..e()
        };
        for (message, wait) in [
            ("Maximum number of shares allowed (5) exceeded.", 0),
            (
                // as Manila's fault wrapper sends a QuotaError (safe): its
                // class first
                "ShareGroupSnapshotsLimitExceeded: Maximum number of allowed share-group-snapshots is exceeded.",
                0,
            ),
            ("Maximum number of allowed share-groups is exceeded.", 3),
            ("anything", 0),
        ] {
            assert!(
                matches!(
                    Error::from_status(413, says(message), Some(Duration::from_secs(wait))),
                    Error::OverQuota(_)
                ),
                "{message} (Retry-After {wait})"
            );
        }
        assert!(matches!(
            Error::from_status(
                413,
                says("This request was rate-limited."),
                Some(Duration::from_secs(2))
            ),
            Error::RateLimited { .. }
        ));
        assert!(matches!(
            Error::from_status(429, e(), Some(Duration::from_secs(1))),
            Error::RateLimited { .. }
        ));
        assert!(matches!(
            Error::from_status(503, e(), None),
            Error::Unavailable(_)
        ));
        assert!(matches!(
            Error::from_status(409, e(), None),
            Error::Conflict(_)
        ));
        let nova = |message: &str| ApiError {
            message: message.into(),
            ..e()
        };
        let busy = Error::from_status(
            409,
            nova("Cannot 'attach_volume' instance 5f0c while it is in task_state rebooting"),
            None,
        );
        assert!(
            matches!(busy, Error::Busy(_)) && busy.is_transient() && busy.refused_before_work()
        );
        let shelved = Error::from_status(
            409,
            nova("Cannot 'attach_volume' instance 5f0c while it is in vm_state shelved_offloaded"),
            None,
        );
        assert!(matches!(shelved, Error::Conflict(_)) && !shelved.is_transient());
        assert!(!Error::from_status(503, e(), None).refused_before_work());
        // a gateway's answer is no answer of the service's
        for gateway in [502, 504] {
            let status = ApiError {
                status: Some(gateway),
                ..e()
            };
            assert!(
                Error::from_status(gateway, status, None).outcome_unknown(),
                "{gateway}"
            );
        }
        let refused = ApiError {
            status: Some(503),
            ..e()
        };
        assert!(!Error::from_status(503, refused, None).outcome_unknown());
    }
}
