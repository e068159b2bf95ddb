//! One set of credentials: its HTTP client, its token (refreshed before
//! it expires, one login shared by concurrent callers, once again on a
//! 401), its endpoints, and every request sent with retries, metrics and
//! a span.

use std::sync::Arc;
use std::time::{Duration, Instant};

use backon::BackoffBuilder;
use serde::Deserialize;
use tokio::sync::Mutex;
use tracing::Instrument;
use url::Url;

use crate::config::CloudConfig;
use crate::error::{ApiError, Error, Result, error_message_from_body};
use crate::secret::SecretString;
use crate::service::ServiceType;

use super::endpoints::{join_url, versioned_endpoint};
use super::options::{CatalogEntry, SessionOptions};
use super::pacing::{Pacer, Turn};
use super::requests::{
    ApiRequest, ApiResponse, RequestBody, redirect_refused, request_id, retry_after,
    transport_error,
};
use super::tls::build_tls;
use super::tokens::{Token, auth_body, tokens_url};

#[derive(Debug)]
pub(super) struct Inner {
    pub(super) config: CloudConfig,
    pub(super) http: reqwest::Client,
    pub(super) options: SessionOptions,
    pub(super) token: Mutex<Option<Arc<Token>>>,
    pub(super) auths: std::sync::atomic::AtomicU64,
    /// The pace of the operations a service throttles.
    pub(super) pacer: Pacer,
}

/// One set of credentials and its HTTP client and token.
#[derive(Debug, Clone)]
pub(super) struct Connection {
    pub(super) inner: Arc<Inner>,
}

impl Connection {
    pub(super) fn new(config: CloudConfig, options: SessionOptions) -> Result<Self> {
        let tls = build_tls(&config.tls)?;
        let http = reqwest::Client::builder()
            .use_preconfigured_tls(tls)
            .connect_timeout(options.connect_timeout)
            .user_agent(options.user_agent.clone())
            .pool_idle_timeout(Duration::from_secs(30))
            // a redirect is an answer, never followed: reqwest's default
            // would send X-Auth-Token (and a login's password) on to
            // whatever host the Location names
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| Error::Tls(format!("cannot build the HTTP client: {e}")))?;
        Ok(Self {
            inner: Arc::new(Inner {
                config,
                http,
                options,
                token: Mutex::new(None),
                auths: std::sync::atomic::AtomicU64::new(0),
                pacer: Pacer::default(),
            }),
        })
    }

    pub(super) fn authentications(&self) -> u64 {
        self.inner.auths.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub(super) fn endpoint_from(&self, token: &Token, service: ServiceType) -> Result<Url> {
        let cfg = &self.inner.config;
        let raw = if let Some(u) = cfg.endpoint_overrides.get(&service) {
            u.clone()
        } else {
            let want_iface = cfg.interface.as_str();
            let region = cfg.region.as_deref();
            let found = service.catalog_aliases().iter().find_map(|alias| {
                token
                    .catalog
                    .iter()
                    .filter(|e| e.service_type == *alias)
                    .find_map(|e| {
                        e.endpoints.iter().find(|ep| {
                            ep.interface == want_iface
                                && region.is_none_or(|r| {
                                    ep.region.as_deref() == Some(r)
                                        || ep.region_id.as_deref() == Some(r)
                                })
                        })
                    })
            });
            let ep = found.ok_or_else(|| Error::EndpointNotFound {
                service: service.as_str(),
                interface: want_iface.to_string(),
                region: cfg.region.clone(),
            })?;
            Url::parse(&ep.url).map_err(|e| Error::InvalidResponse {
                operation: "catalog",
                message: format!("{} endpoint {:?} is not a URL: {e}", service, ep.url),
            })?
        };
        Ok(versioned_endpoint(
            service,
            raw,
            token.project_id.as_deref(),
        ))
    }

    pub(super) async fn token(&self, deadline: Option<Instant>) -> Result<Arc<Token>> {
        let started = Instant::now();
        let wait_until = deadline.unwrap_or_else(|| started + self.inner.options.default_timeout);
        // a login under way holds the slot: wait for it only as long as
        // this call may wait
        let mut slot = tokio::time::timeout_at(wait_until.into(), self.inner.token.lock())
            .await
            .map_err(|_| Error::Timeout {
                operation: "token_issue",
                elapsed: started.elapsed(),
                last: None,
            })?;
        if let Some(t) = slot.as_ref()
            && t.fresh(self.inner.options.token_refresh_margin, Instant::now())
        {
            return Ok(t.clone());
        }
        let fresh = Arc::new(self.issue_token(deadline).await?);
        *slot = Some(fresh.clone());
        Ok(fresh)
    }

    /// Forgets `stale` unless another caller already replaced it, so that
    /// callers hit by the same 401 trigger one re-authentication.
    pub(super) async fn invalidate(&self, stale: &Arc<Token>) {
        let mut slot = self.inner.token.lock().await;
        if slot.as_ref().is_some_and(|t| Arc::ptr_eq(t, stale)) {
            *slot = None;
        }
    }

    pub(super) async fn issue_token(&self, deadline: Option<Instant>) -> Result<Token> {
        let cfg = &self.inner.config;
        let url = tokens_url(&cfg.auth_url);
        let body = auth_body(cfg);
        let operation = "token_issue";
        // bounded: the login holds every other caller of this session
        let now = Instant::now();
        let deadline = deadline
            .unwrap_or_else(|| now + self.inner.options.default_timeout)
            .min(now + self.inner.options.login_timeout);
        let span = tracing::debug_span!("keystone_auth", auth = cfg.auth.kind(), cloud = %cfg.name);
        let resp = async {
            let started = Instant::now();
            let remaining = deadline.saturating_duration_since(started);
            let result = self
                .inner
                .http
                .post(url.clone())
                .json(&body)
                .timeout(remaining)
                .send()
                .await;
            match result {
                Err(e) => {
                    self.observe(ServiceType::Identity, operation, None, started.elapsed());
                    Err(transport_error(operation, &e, started.elapsed()))
                }
                Ok(r) => {
                    let status = r.status().as_u16();
                    let headers = r.headers().clone();
                    let body = r
                        .bytes()
                        .await
                        .map_err(|e| transport_error(operation, &e, started.elapsed()))?;
                    self.observe(
                        ServiceType::Identity,
                        operation,
                        Some(status),
                        started.elapsed(),
                    );
                    Ok((status, headers, body))
                }
            }
        }
        .instrument(span)
        .await?;
        let (status, headers, body) = resp;
        if let Some(e) = redirect_refused(operation, url.as_str(), status, &headers) {
            return Err(e);
        }
        if status >= 400 {
            let err = ApiError {
                operation,
                status: Some(status),
                request_id: request_id(&headers),
                message: format!(
                    "Keystone at {url} refused {} authentication: {}",
                    cfg.auth.kind(),
                    error_message_from_body(&body)
                ),
            };
            // Keystone answers 404 for an application credential that does
            // not exist (deleted by a rotation): for the caller, credentials
            // refused like any other
            let status_class = if status == 404 { 401 } else { status };
            return Err(Error::from_status(status_class, err, retry_after(&headers)));
        }
        self.inner
            .auths
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let value = headers
            .get("x-subject-token")
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| Error::InvalidResponse {
                operation,
                message: "no X-Subject-Token header".into(),
            })?;
        #[derive(Deserialize)]
        struct IdOnly {
            id: String,
        }
        #[derive(Deserialize)]
        struct TokenBody {
            expires_at: String,
            #[serde(default)]
            project: Option<IdOnly>,
            #[serde(default)]
            user: Option<IdOnly>,
            #[serde(default)]
            catalog: Vec<CatalogEntry>,
        }
        #[derive(Deserialize)]
        struct Envelope {
            token: TokenBody,
        }
        let env: Envelope = serde_json::from_slice(&body).map_err(|e| Error::InvalidResponse {
            operation,
            message: format!("cannot decode token: {e}"),
        })?;
        let expires_at = time::OffsetDateTime::parse(
            &env.token.expires_at,
            &time::format_description::well_known::Rfc3339,
        )
        .map_err(|e| Error::InvalidResponse {
            operation,
            message: format!("bad expires_at {:?}: {e}", env.token.expires_at),
        })?;
        let now = Instant::now();
        let lifetime = (expires_at - time::OffsetDateTime::now_utc()).max(time::Duration::ZERO);
        let lifetime = Duration::from_secs_f64(lifetime.as_seconds_f64());
        tracing::debug!(lifetime_s = lifetime.as_secs(), "obtained a Keystone token");
        Ok(Token {
            value: SecretString::new(value),
            issued: now,
            expires: now + lifetime,
            project_id: env.token.project.map(|p| p.id),
            user_id: env.token.user.map(|u| u.id),
            catalog: env.token.catalog,
        })
    }

    pub(super) fn observe(
        &self,
        service: ServiceType,
        op: &'static str,
        status: Option<u16>,
        elapsed: Duration,
    ) {
        if let Some(m) = &self.inner.options.metrics {
            m.observe(service.as_str(), op, status, elapsed);
        }
    }

    /// Waits for the request's turn while its service throttles the
    /// operation (see [`Pacer`]), or answers at once when that turn is
    /// past the deadline: nothing is sent then.
    async fn wait_for_pace(&self, req: &ApiRequest, deadline: Instant) -> Result<()> {
        let key = (req.service, req.operation);
        let started = Instant::now();
        loop {
            let now = Instant::now();
            let at = match self.inner.pacer.turn(key, now) {
                Turn::Now => break,
                Turn::At(at) => at,
            };
            if at >= deadline {
                return Err(Error::RateLimited {
                    error: ApiError {
                        operation: req.operation,
                        status: None,
                        request_id: None,
                        message: format!(
                            "not sent: {} throttles it and its next turn is in {} s, past this call's deadline",
                            req.service,
                            (at - now).as_secs_f64().ceil()
                        ),
                    },
                    retry_after: Some(at - now),
                });
            }
            tokio::time::sleep_until(at.into()).await;
        }
        let waited = started.elapsed();
        if waited > Duration::from_millis(1)
            && let Some(m) = &self.inner.options.metrics
        {
            m.throttled(req.service.as_str(), req.operation, waited);
        }
        Ok(())
    }

    /// Sends `req`: token attached, a 401 re-authenticates once, idempotent
    /// requests retry transient failures with jittered exponential backoff
    /// until the deadline; a POST is never retried after it may have
    /// reached the service, unless the service refused it before doing
    /// anything (a 429, Nova's busy 409). A refusal's retry hint is
    /// honoured by every caller of the session alike.
    pub(super) async fn send(&self, req: ApiRequest) -> Result<ApiResponse> {
        let started = Instant::now();
        let deadline = req
            .deadline
            .unwrap_or(started + self.inner.options.default_timeout);
        let span = tracing::debug_span!(
            "openstack_request",
            service = req.service.as_str(),
            operation = req.operation,
            method = %req.method,
            status = tracing::field::Empty,
            request_id = tracing::field::Empty,
        );
        self.send_inner(req, started, deadline)
            .instrument(span)
            .await
    }

    pub(super) async fn send_inner(
        &self,
        req: ApiRequest,
        started: Instant,
        deadline: Instant,
    ) -> Result<ApiResponse> {
        let policy = &self.inner.options.retry;
        let mut backoff = backon::ExponentialBuilder::default()
            .with_min_delay(policy.min_delay)
            .with_max_delay(policy.max_delay)
            .with_factor(2.0)
            .with_jitter()
            .with_max_times(policy.max_attempts.saturating_sub(1))
            .build();
        let mut reauthenticated = false;
        loop {
            self.wait_for_pace(&req, deadline).await?;
            let token = self.token(Some(deadline)).await?;
            let base = match &req.absolute_base {
                Some(b) => b.clone(),
                None => self.endpoint_from(&token, req.service)?,
            };
            let url = join_url(req.operation, &base, &req.path, &req.query)?;
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Err(Error::Timeout {
                    operation: req.operation,
                    elapsed: started.elapsed(),
                    last: None,
                });
            }
            let mut builder = self
                .inner
                .http
                .request(req.method.clone(), url.clone())
                .timeout(remaining)
                .header("x-auth-token", token.value.expose());
            if !req.headers.iter().any(|(k, _)| k == http::header::ACCEPT) {
                builder = builder.header(http::header::ACCEPT, "application/json");
            }
            for (k, v) in &req.headers {
                builder = builder.header(k, v);
            }
            if let Some(RequestBody::Json(b)) = &req.body {
                builder = builder.json(b);
            }
            let attempt_start = Instant::now();
            let outcome = match builder.send().await {
                Ok(r) => {
                    let status = r.status().as_u16();
                    let headers = r.headers().clone();
                    match r.bytes().await {
                        Ok(body) => Ok((status, headers, body)),
                        Err(e) => Err(e),
                    }
                }
                Err(e) => Err(e),
            };
            let elapsed = attempt_start.elapsed();
            let err = match outcome {
                Ok((status, headers, body)) => {
                    self.observe(req.service, req.operation, Some(status), elapsed);
                    let rid = request_id(&headers);
                    if let Some(e) = redirect_refused(req.operation, url.as_str(), status, &headers)
                    {
                        return Err(e);
                    }
                    if status < 400 {
                        self.inner.pacer.served((req.service, req.operation));
                        // recorded once, for the answer that counts (a
                        // field recorded again would repeat in JSON logs)
                        let span = tracing::Span::current();
                        span.record("status", status);
                        if let Some(r) = &rid {
                            span.record("request_id", r.as_str());
                        }
                        let date = headers
                            .get(http::header::DATE)
                            .and_then(|v| v.to_str().ok())
                            .and_then(|v| httpdate::parse_http_date(v).ok());
                        return Ok(ApiResponse {
                            body,
                            date,
                            operation: req.operation,
                        });
                    }
                    if status == 401 && !reauthenticated {
                        tracing::info!(
                            operation = req.operation,
                            "token rejected (401), re-authenticating once"
                        );
                        self.invalidate(&token).await;
                        reauthenticated = true;
                        continue;
                    }
                    let api = ApiError {
                        operation: req.operation,
                        status: Some(status),
                        request_id: rid,
                        message: error_message_from_body(&body),
                    };
                    Error::from_status(status, api, retry_after(&headers))
                }
                Err(e) => {
                    self.observe(req.service, req.operation, None, elapsed);
                    transport_error(req.operation, &e, started.elapsed())
                }
            };
            // A POST that failed at the transport level, or got a 5xx, may
            // have been applied: never repeat it. A 429 or a busy 409 was
            // refused before any work.
            if !err.is_transient()
                || !(req.idempotent() || err.refused_before_work())
                || (req.single_flight && err.outcome_unknown())
            {
                return Err(err);
            }
            let hinted = match &err {
                Error::RateLimited {
                    retry_after: Some(d),
                    ..
                } => Some(*d),
                _ => None,
            };
            let Some(delay) = backoff.next().map(|d| hinted.map_or(d, |h| h.max(d))) else {
                return Err(err);
            };
            if matches!(err, Error::RateLimited { .. }) {
                // every caller of this operation is paced from now on
                self.inner
                    .pacer
                    .refused((req.service, req.operation), delay, attempt_start);
            }
            if Instant::now() + delay >= deadline {
                // the service's own answer, when it asked to wait: the
                // caller retries later (Unavailable), not "timed out"
                if err.refused_before_work() {
                    return Err(err);
                }
                return Err(Error::Timeout {
                    operation: req.operation,
                    elapsed: started.elapsed(),
                    last: Some(Box::new(err)),
                });
            }
            tracing::debug!(operation = req.operation, delay_ms = delay.as_millis() as u64, error = %err, "retrying");
            if matches!(err, Error::RateLimited { .. }) {
                // its turn comes from the pacer, with everyone else's
                continue;
            }
            tokio::time::sleep(delay).await;
        }
    }
}
