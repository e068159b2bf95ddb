//! Injected faults: which requests they match, and what those get instead
//! of (or before) their answer. The state keeps them; the admin API and
//! [`crate::admin::Control`] set them.

use http::Method;
use rand::Rng;
use serde::{Deserialize, Serialize};

/// What a matching request gets instead of (or before) its answer.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum FaultAction {
    /// Answer with this status and a service-shaped error body.
    Status {
        status: u16,
        #[serde(default)]
        message: Option<String>,
        /// The retry hint, in seconds.
        #[serde(default)]
        retry_after: Option<u64>,
        /// How the hint is sent (default: `Retry-After` in seconds).
        #[serde(default)]
        hint: RetryHint,
    },
    /// Serve normally after a delay (per-operation latency): the request
    /// waits before the service sees it.
    Delay { millis: u64 },
    /// Close the connection without answering: the service never sees the
    /// request.
    Drop,
    /// Serve the request, then close the connection without answering:
    /// the work is done and the caller does not know.
    LoseAnswer,
    /// Serve the request, then hold its answer this long: the work is
    /// done while the caller still waits (and may give up, or be killed).
    /// The call is recorded once served, before the hold.
    HoldAnswer { millis: u64 },
    /// A rate limiter: `per_second` requests, bursts of `burst`; the
    /// excess gets 429 with the time until the next slot as its hint
    /// (sent as `hint` says; `RetryHint::None` sends none).
    Throttle {
        per_second: f64,
        burst: u32,
        #[serde(default)]
        hint: RetryHint,
    },
    /// What a throttle answers a request over its rate (made by the
    /// emulator, not set by a test).
    #[serde(skip)]
    Throttled {
        wait: std::time::Duration,
        hint: RetryHint,
    },
    /// A gateway in front of the service (a load balancer, a proxy) gives
    /// up on the request and answers `status` (502, 504) while the
    /// request goes on: the service serves it `serve_after_millis` later,
    /// with nobody waiting for its answer.
    GatewayGaveUp {
        status: u16,
        serve_after_millis: u64,
    },
    /// A token issued before the rule was added is refused with 401, as an
    /// expired one is: its holder must log in again (a Keystone outage is
    /// felt only then). A request without a token (a login) is not
    /// matched, nor one whose token was issued since, which the proxy
    /// knows from the token answers it carried; the emulator, which does
    /// not tell when a token was issued, refuses every token.
    TokensExpired,
    /// Answer with this JSON body instead of the real one: a cloud that
    /// lies, or one someone else controls (hostile export locations,
    /// access rules, ...).
    Json {
        status: u16,
        body: serde_json::Value,
    },
}

impl FaultAction {
    /// What a call that got this fault is marked with in the call log.
    pub fn name(&self) -> String {
        match self {
            Self::Status { status, .. } => format!("status {status}"),
            Self::Delay { millis } => format!("delayed {millis} ms"),
            Self::Drop => "dropped".into(),
            Self::LoseAnswer => "answer lost".into(),
            Self::HoldAnswer { millis } => format!("answer held {millis} ms"),
            Self::Throttle { .. } => "let through by a throttle".into(),
            Self::Throttled { .. } => "throttled".into(),
            Self::GatewayGaveUp { status, .. } => format!("gateway gave up ({status})"),
            Self::Json { status, .. } => format!("answer replaced ({status})"),
            Self::TokensExpired => "token expired (401)".into(),
        }
    }
}

/// How a refusal tells the caller when to come back.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum RetryHint {
    /// `Retry-After: <seconds>` (RFC 9110).
    #[default]
    RetryAfter,
    /// `Retry-After: <HTTP date>` (RFC 9110).
    RetryAfterDate,
    /// `X-Retry-After: <seconds>` (SAP's rate limiter, Swift's name).
    XRetryAfter,
    /// `X-RateLimit-Retry-After: <seconds>` (SAP's rate limiter).
    XRateLimitRetryAfter,
    /// No hint at all.
    None,
}

impl RetryHint {
    /// The header that carries `wait`, if any.
    pub fn header(self, wait: std::time::Duration) -> Option<(&'static str, String)> {
        let secs = wait.as_secs_f64().ceil() as u64;
        match self {
            Self::RetryAfter => Some(("retry-after", secs.to_string())),
            Self::RetryAfterDate => Some((
                "retry-after",
                // an HTTP date has whole seconds: one more, so that it is
                // never earlier than asked
                httpdate::fmt_http_date(
                    std::time::SystemTime::now() + std::time::Duration::from_secs(secs + 1),
                ),
            )),
            Self::XRetryAfter => Some(("x-retry-after", secs.to_string())),
            Self::XRateLimitRetryAfter => Some(("x-ratelimit-retry-after", secs.to_string())),
            Self::None => None,
        }
    }
}

/// What a request's token is known to be, for
/// [`FaultAction::TokensExpired`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestToken {
    /// The request carries none (a login).
    Absent,
    /// Issued then, through the proxy.
    IssuedAt(std::time::Instant),
    /// Carried, of an unknown issue time.
    Unknown,
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
    /// A substring the path must not have (e.g. `/identity`: every call
    /// of the services but the logins).
    #[serde(default)]
    pub path_excludes: Option<String>,
    pub action: FaultAction,
    #[serde(default)]
    pub every_nth: Option<u32>,
    #[serde(default)]
    pub probability: Option<f64>,
    #[serde(default)]
    pub remaining: Option<u32>,
    #[serde(default, skip_deserializing)]
    pub matched: u64,
    /// How many requests got the action (a throttle's: how many it
    /// refused): the proof that the fault happened. Read back by the
    /// admin API's clients; set to 0 when a rule is added.
    #[serde(default)]
    pub served: u64,
    /// The name of the fault the rule belongs to, for reading its
    /// `served` back (a campaign's fault class).
    #[serde(default)]
    pub label: Option<String>,
    /// A throttle's slots: how many are free, and when they were counted.
    #[serde(skip)]
    bucket: Option<(f64, std::time::Instant)>,
    /// When the rule was added (tokens issued since are not expired).
    #[serde(skip)]
    added: Option<std::time::Instant>,
}

impl FaultRule {
    pub fn new(method: Option<&str>, path_contains: &str, action: FaultAction) -> Self {
        Self {
            method: method.map(str::to_string),
            path_contains: Some(path_contains.to_string()),
            path_excludes: None,
            action,
            every_nth: None,
            probability: None,
            remaining: None,
            matched: 0,
            served: 0,
            label: None,
            bucket: None,
            added: Some(std::time::Instant::now()),
        }
    }

    /// The rule as added: nothing matched or served yet, whatever the
    /// request said.
    pub fn fresh(mut self) -> Self {
        self.matched = 0;
        self.served = 0;
        self.added = Some(std::time::Instant::now());
        self
    }

    /// The rule belongs to the fault `label` names.
    pub fn labelled(mut self, label: &str) -> Self {
        self.label = Some(label.to_string());
        self
    }

    /// Requests whose path has `path` are not matched.
    pub fn except(mut self, path: &str) -> Self {
        self.path_excludes = Some(path.to_string());
        self
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

    pub(crate) fn check(
        &mut self,
        method: &Method,
        path: &str,
        token: RequestToken,
    ) -> Option<FaultAction> {
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
            || self
                .path_excludes
                .as_deref()
                .is_some_and(|p| path.contains(p))
        {
            return None;
        }
        if self.action == FaultAction::TokensExpired {
            let fresh = match token {
                RequestToken::Absent => true,
                RequestToken::IssuedAt(at) => self.added.is_some_and(|added| at >= added),
                RequestToken::Unknown => false,
            };
            if fresh {
                return None;
            }
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
        if let FaultAction::Throttle {
            per_second,
            burst,
            hint,
        } = self.action
        {
            let refused = self.take_slot(per_second, burst, hint);
            self.served += u64::from(refused.is_some());
            return refused;
        }
        if let Some(r) = &mut self.remaining {
            *r -= 1;
        }
        self.served += 1;
        Some(self.action.clone())
    }

    /// A throttle's verdict: None (served) while a slot is free, else a 429
    /// whose hint is the time until the next one.
    fn take_slot(&mut self, per_second: f64, burst: u32, hint: RetryHint) -> Option<FaultAction> {
        let now = std::time::Instant::now();
        let per_second = per_second.max(0.001);
        let burst = f64::from(burst.max(1));
        let (free, since) = self.bucket.unwrap_or((burst, now));
        let free = (free + now.duration_since(since).as_secs_f64() * per_second).min(burst);
        if free >= 1.0 {
            self.bucket = Some((free - 1.0, now));
            return None;
        }
        self.bucket = Some((free, now));
        let wait = std::time::Duration::from_secs_f64((1.0 - free) / per_second);
        Some(FaultAction::Throttled { wait, hint })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The proxy serves a request the first rule that takes it: a
    /// throttle takes only the calls over its rate, and lets the others
    /// on to the rules after it (the campaign puts a Keystone outage's
    /// expired tokens there).
    #[test]
    fn a_throttle_takes_only_the_calls_over_its_rate() {
        let mut rules = [
            FaultRule::new(
                None,
                "/volume/",
                FaultAction::Throttle {
                    per_second: 0.2,
                    burst: 1,
                    hint: RetryHint::RetryAfter,
                },
            ),
            FaultRule::new(None, "/volume/", FaultAction::TokensExpired),
        ];
        let mut ask = || {
            rules.iter_mut().find_map(|r| {
                r.check(
                    &http::Method::GET,
                    "/volume/v3/p/volumes",
                    RequestToken::Unknown,
                )
            })
        };
        assert_eq!(
            ask(),
            Some(FaultAction::TokensExpired),
            "the first call goes on to the outage"
        );
        assert!(
            matches!(ask(), Some(FaultAction::Throttled { .. })),
            "the second, within 5 s, is throttled"
        );
        assert_eq!((rules[0].served, rules[1].served), (1, 1));
    }
}
