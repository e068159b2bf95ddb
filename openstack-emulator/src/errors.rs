//! Error bodies shaped like each service's own.

use std::time::Duration;

use axum::Json;
use axum::body::Body;
use axum::response::{IntoResponse, Response};
use http::StatusCode;
use serde_json::json;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    /// Cinder, Nova, Manila: `{"itemNotFound": {"code": 404, "message": ...}}`
    Compute,
    /// Keystone and keystonemiddleware: `{"error": {"code", "title", "message"}}`
    Keystone,
    /// Barbican: `{"code", "title", "description"}`
    Barbican,
}

#[derive(Debug, Clone)]
pub struct ApiErr {
    pub status: StatusCode,
    pub style: Style,
    pub message: String,
    pub retry_after: Option<Duration>,
    /// How `retry_after` is sent.
    pub hint: crate::faults::RetryHint,
}

pub type ApiResult<T> = Result<T, ApiErr>;

impl ApiErr {
    pub fn new(status: u16, style: Style, message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            style,
            message: message.into(),
            retry_after: None,
            hint: crate::faults::RetryHint::default(),
        }
    }
    /// A quota refusal as Cinder and Manila send it: their `QuotaError`
    /// is a 413 with `Retry-After: 0` (a rate limiter's 413 asks for a
    /// wait), whatever its message says.
    pub fn quota(style: Style, m: impl Into<String>) -> Self {
        Self {
            retry_after: Some(Duration::ZERO),
            hint: crate::faults::RetryHint::RetryAfter,
            ..Self::new(413, style, m)
        }
    }
    pub fn bad(style: Style, m: impl Into<String>) -> Self {
        Self::new(400, style, m)
    }
    pub fn not_found(style: Style, m: impl Into<String>) -> Self {
        Self::new(404, style, m)
    }
    pub fn conflict(style: Style, m: impl Into<String>) -> Self {
        Self::new(409, style, m)
    }
    pub fn forbidden(style: Style, m: impl Into<String>) -> Self {
        Self::new(403, style, m)
    }
    pub fn unauthorized() -> Self {
        Self::new(
            401,
            Style::Keystone,
            "The request you have made requires authentication.",
        )
    }
}

fn compute_key(status: u16) -> &'static str {
    match status {
        400 => "badRequest",
        401 => "unauthorized",
        403 => "forbidden",
        404 => "itemNotFound",
        406 => "notAcceptable",
        409 => "conflictingRequest",
        413 => "overLimit",
        429 => "overLimit",
        503 => "serviceUnavailable",
        _ => "computeFault",
    }
}

impl IntoResponse for ApiErr {
    fn into_response(self) -> Response {
        let code = self.status.as_u16();
        let title = self.status.canonical_reason().unwrap_or("Error");
        let body = match self.style {
            Style::Compute => {
                let mut inner = json!({ "code": code, "message": self.message });
                if code == 413 || code == 429 {
                    inner["retryAfter"] = json!(
                        self.retry_after
                            .map(|d| d.as_secs())
                            .unwrap_or(0)
                            .to_string()
                    );
                }
                json!({ compute_key(code): inner })
            }
            Style::Keystone => {
                json!({ "error": { "code": code, "title": title, "message": self.message } })
            }
            Style::Barbican => json!({ "code": code, "title": title, "description": self.message }),
        };
        let mut resp = (self.status, Json(body)).into_response();
        if let Some((name, value)) = self.retry_after.and_then(|d| self.hint.header(d))
            && let Ok(v) = value.parse()
        {
            resp.headers_mut().insert(name, v);
        }
        if self.status == StatusCode::UNAUTHORIZED {
            resp.headers_mut().insert(
                "www-authenticate",
                http::HeaderValue::from_static("Keystone uri=\"/identity\""),
            );
        }
        resp
    }
}

pub fn style_for_path(path: &str) -> Style {
    if path.starts_with("/identity") {
        Style::Keystone
    } else if path.starts_with("/key-manager") {
        Style::Barbican
    } else {
        Style::Compute
    }
}

/// The answer of an injected `status` fault.
pub fn injected(
    status: u16,
    path: &str,
    message: Option<&str>,
    retry_after: Option<Duration>,
    hint: crate::faults::RetryHint,
) -> Response<Body> {
    let mut e = ApiErr::new(
        status,
        style_for_path(path),
        message.unwrap_or("injected fault"),
    );
    e.retry_after = retry_after;
    e.hint = hint;
    e.into_response()
}

/// What a service answers a token that expired (keystonemiddleware's 401).
pub fn token_expired() -> Response<Body> {
    ApiErr::unauthorized().into_response()
}

pub async fn not_found_fallback(uri: http::Uri) -> ApiErr {
    ApiErr::not_found(
        style_for_path(uri.path()),
        "The resource could not be found.",
    )
}
