//! Injected faults: which requests they match, and what those get instead
//! of (or before) their answer. The state keeps them; the admin API and
//! [`crate::admin::Control`] set them.

use http::Method;
use rand::Rng;
use serde::{Deserialize, Serialize};

/// What a matching request gets instead of (or before) its answer.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum FaultAction {
    /// Answer with this status and a service-shaped error body.
    Status {
        status: u16,
        #[serde(default)]
        message: Option<String>,
        #[serde(default)]
        retry_after: Option<u64>,
    },
    /// Serve normally after a delay (per-operation latency).
    Delay { millis: u64 },
    /// Close the connection without answering.
    Drop,
    /// Answer with this JSON body instead of the real one: a cloud that
    /// lies, or one someone else controls (hostile export locations,
    /// access rules, ...).
    Json {
        status: u16,
        body: serde_json::Value,
    },
}

/// A fault: requests whose method and path match get `action`, on every
/// `every_nth` matching call and/or with `probability`, at most `remaining`
/// times.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct FaultRule {
    #[serde(default)]
    pub method: Option<String>,
    /// Substring of the request path, e.g. `/volumes` or `/auth/tokens`.
    #[serde(default)]
    pub path_contains: Option<String>,
    pub action: FaultAction,
    #[serde(default)]
    pub every_nth: Option<u32>,
    #[serde(default)]
    pub probability: Option<f64>,
    #[serde(default)]
    pub remaining: Option<u32>,
    #[serde(default, skip_deserializing)]
    pub matched: u64,
}

impl FaultRule {
    pub fn new(method: Option<&str>, path_contains: &str, action: FaultAction) -> Self {
        Self {
            method: method.map(str::to_string),
            path_contains: Some(path_contains.to_string()),
            action,
            every_nth: None,
            probability: None,
            remaining: None,
            matched: 0,
        }
    }

    pub fn times(mut self, n: u32) -> Self {
        self.remaining = Some(n);
        self
    }

    pub fn every_nth(mut self, n: u32) -> Self {
        self.every_nth = Some(n.max(1));
        self
    }

    pub fn probability(mut self, p: f64) -> Self {
        self.probability = Some(p.clamp(0.0, 1.0));
        self
    }

    pub(crate) fn check(&mut self, method: &Method, path: &str) -> Option<FaultAction> {
        if self.remaining == Some(0) {
            return None;
        }
        if self
            .method
            .as_deref()
            .is_some_and(|m| !m.eq_ignore_ascii_case(method.as_str()))
        {
            return None;
        }
        if self
            .path_contains
            .as_deref()
            .is_some_and(|p| !path.contains(p))
        {
            return None;
        }
        self.matched += 1;
        if let Some(n) = self.every_nth
            && !self.matched.is_multiple_of(u64::from(n))
        {
            return None;
        }
        if let Some(p) = self.probability
            && !rand::rng().random_bool(p)
        {
            return None;
        }
        if let Some(r) = &mut self.remaining {
            *r -= 1;
        }
        Some(self.action.clone())
    }
}
