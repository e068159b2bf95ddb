//! A Keystone v3 session: authenticates, caches the scoped token and its
//! catalog, refreshes the token before it expires, re-authenticates once on
//! a 401 (concurrent callers share that one re-authentication), finds
//! endpoints by service type and alias, and sends every request with
//! retries, metrics and a tracing span.

use std::sync::Arc;
use std::time::{Duration, Instant};

use backon::BackoffBuilder;
use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::json;
use tokio::sync::Mutex;
use tracing::Instrument;
use url::Url;

use crate::config::{AuthMethod, CloudConfig, DomainRef, ProjectRef, Scope, TlsOptions, UserRef};
use crate::error::{ApiError, Error, Result, error_message_from_body};
use crate::metrics::ApiMetrics;
use crate::secret::SecretString;
use crate::service::ServiceType;

/// Retry policy for idempotent requests.
#[derive(Debug, Clone)]
pub struct RetryPolicy {
    pub min_delay: Duration,
    pub max_delay: Duration,
    /// Attempts in all, the first included.
    pub max_attempts: usize,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            min_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(5),
            max_attempts: 6,
        }
    }
}

#[derive(Debug, Clone)]
pub struct SessionOptions {
    /// Deadline of a call whose caller set none.
    pub default_timeout: Duration,
    pub connect_timeout: Duration,
    pub retry: RetryPolicy,
    /// A token is renewed this long before it expires (at most half its
    /// lifetime).
    pub token_refresh_margin: Duration,
    /// The longest one Keystone login may take, whatever the deadline of
    /// the call that started it: every other call of the session waits for
    /// that login.
    pub login_timeout: Duration,
    pub metrics: Option<ApiMetrics>,
    pub user_agent: String,
}

impl Default for SessionOptions {
    fn default() -> Self {
        Self {
            default_timeout: Duration::from_secs(60),
            connect_timeout: Duration::from_secs(10),
            retry: RetryPolicy::default(),
            token_refresh_margin: Duration::from_secs(120),
            login_timeout: Duration::from_secs(30),
            metrics: None,
            user_agent: concat!("openstack-csi-suite/", env!("CARGO_PKG_VERSION")).to_string(),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
pub struct CatalogEndpoint {
    pub interface: String,
    #[serde(default)]
    pub region: Option<String>,
    #[serde(default)]
    pub region_id: Option<String>,
    pub url: String,
}

#[derive(Debug, Clone, Deserialize)]
pub struct CatalogEntry {
    #[serde(rename = "type")]
    pub service_type: String,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub endpoints: Vec<CatalogEndpoint>,
}

#[derive(Debug)]
struct Token {
    value: SecretString,
    issued: Instant,
    expires: Instant,
    project_id: Option<String>,
    user_id: Option<String>,
    catalog: Vec<CatalogEntry>,
}

impl Token {
    fn fresh(&self, margin: Duration, now: Instant) -> bool {
        let lifetime = self.expires.saturating_duration_since(self.issued);
        let margin = margin.min(lifetime / 2);
        now + margin < self.expires
    }
}

#[derive(Debug)]
struct Inner {
    config: CloudConfig,
    http: reqwest::Client,
    options: SessionOptions,
    token: Mutex<Option<Arc<Token>>>,
    auths: std::sync::atomic::AtomicU64,
}

/// One set of credentials and its HTTP client and token.
#[derive(Debug, Clone)]
struct Connection {
    inner: Arc<Inner>,
}

/// Cheap to clone; clones share the connection (HTTP client, token) and
/// see [`Session::reconfigure`] together: a request runs on the connection
/// current when it starts, so in-flight calls finish on the old
/// credentials while new calls use the new ones.
#[derive(Debug, Clone)]
pub struct Session {
    current: Arc<std::sync::RwLock<Connection>>,
}

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

    fn idempotent(&self) -> bool {
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
fn redirect_refused(
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

fn request_id(headers: &HeaderMap) -> Option<String> {
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

fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let v = headers.get("retry-after")?.to_str().ok()?;
    v.trim().parse::<u64>().ok().map(Duration::from_secs)
}

impl Session {
    /// Builds the HTTP client (TLS from the config). No request is sent
    /// until the first call; [`Session::authenticate`] checks credentials
    /// eagerly.
    pub fn new(config: CloudConfig, options: SessionOptions) -> Result<Self> {
        Ok(Self {
            current: Arc::new(std::sync::RwLock::new(Connection::new(config, options)?)),
        })
    }

    fn connection(&self) -> Connection {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Replaces the credentials (and endpoints, TLS) of this session and
    /// every clone of it; the options (metrics, retries) stay. Calls under
    /// way finish on the old connection. A config that cannot make a
    /// client (TLS) is refused and the session keeps the old one. Returns
    /// whether anything changed.
    pub fn reconfigure(&self, config: CloudConfig) -> Result<bool> {
        let old = self.connection();
        if old.inner.config == config {
            return Ok(false);
        }
        let new = Connection::new(config, old.inner.options.clone())?;
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = new;
        Ok(true)
    }

    /// Whether `other` is this session or a clone of it.
    pub fn same(&self, other: &Session) -> bool {
        Arc::ptr_eq(&self.current, &other.current)
    }

    pub fn config(&self) -> CloudConfig {
        self.connection().inner.config.clone()
    }

    pub fn options(&self) -> SessionOptions {
        self.connection().inner.options.clone()
    }

    /// How many times the current connection has authenticated (tests and
    /// metrics).
    pub fn authentications(&self) -> u64 {
        self.connection().authentications()
    }

    /// Obtains a token now, so that bad credentials or an unreachable
    /// Keystone surface at start-up.
    pub async fn authenticate(&self) -> Result<()> {
        self.connection().token(None).await.map(|_| ())
    }

    pub async fn project_id(&self) -> Result<Option<String>> {
        Ok(self.connection().token(None).await?.project_id.clone())
    }

    pub async fn user_id(&self) -> Result<Option<String>> {
        Ok(self.connection().token(None).await?.user_id.clone())
    }

    /// The versioned endpoint of a service, from the override or the
    /// catalog.
    pub async fn endpoint(&self, service: ServiceType) -> Result<Url> {
        let c = self.connection();
        let token = c.token(None).await?;
        c.endpoint_from(&token, service)
    }

    /// Sends `req` on the current connection.
    pub(crate) async fn send(&self, req: ApiRequest) -> Result<ApiResponse> {
        self.connection().send(req).await
    }
}

impl Connection {
    fn new(config: CloudConfig, options: SessionOptions) -> Result<Self> {
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
            }),
        })
    }

    fn authentications(&self) -> u64 {
        self.inner.auths.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn endpoint_from(&self, token: &Token, service: ServiceType) -> Result<Url> {
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

    async fn token(&self, deadline: Option<Instant>) -> Result<Arc<Token>> {
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
    async fn invalidate(&self, stale: &Arc<Token>) {
        let mut slot = self.inner.token.lock().await;
        if slot.as_ref().is_some_and(|t| Arc::ptr_eq(t, stale)) {
            *slot = None;
        }
    }

    async fn issue_token(&self, deadline: Option<Instant>) -> Result<Token> {
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

    fn observe(
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

    /// Sends `req`: token attached, a 401 re-authenticates once, idempotent
    /// requests retry transient failures with jittered exponential backoff
    /// until the deadline; a POST is never retried after it may have
    /// reached the service.
    async fn send(&self, req: ApiRequest) -> Result<ApiResponse> {
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

    async fn send_inner(
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
                        // recorded once, for the answer that counts (a
                        // field recorded again would repeat in JSON logs)
                        let span = tracing::Span::current();
                        span.record("status", status);
                        if let Some(r) = &rid {
                            span.record("request_id", r.as_str());
                        }
                        return Ok(ApiResponse {
                            body,
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
            // A POST that failed at the transport level may have been
            // applied: never repeat it. A 429 was refused before any work,
            // and a 5xx answer to a POST is left to the caller too.
            if !req.idempotent() || !err.is_transient() {
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
            if Instant::now() + delay >= deadline {
                return Err(Error::Timeout {
                    operation: req.operation,
                    elapsed: started.elapsed(),
                    last: Some(Box::new(err)),
                });
            }
            tracing::debug!(operation = req.operation, delay_ms = delay.as_millis() as u64, error = %err, "retrying");
            tokio::time::sleep(delay).await;
        }
    }
}

fn transport_error(operation: &'static str, e: &reqwest::Error, elapsed: Duration) -> Error {
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

fn tokens_url(auth_url: &Url) -> Url {
    let mut u = auth_url.clone();
    let path = u.path().trim_end_matches('/').to_string();
    let base = if path.ends_with("/v3") {
        path
    } else {
        format!("{path}/v3")
    };
    u.set_path(&format!("{base}/auth/tokens"));
    u
}

fn domain_json(d: &DomainRef) -> serde_json::Value {
    match d {
        DomainRef::Id(id) => json!({ "id": id }),
        DomainRef::Name(n) => json!({ "name": n }),
    }
}

fn user_json(u: &UserRef) -> serde_json::Value {
    match u {
        UserRef::Id(id) => json!({ "id": id }),
        UserRef::Name { name, domain } => json!({ "name": name, "domain": domain_json(domain) }),
    }
}

fn auth_body(cfg: &CloudConfig) -> serde_json::Value {
    let identity = match &cfg.auth {
        AuthMethod::Password { user, password } => {
            let mut u = user_json(user);
            u["password"] = json!(password.expose());
            json!({ "methods": ["password"], "password": { "user": u } })
        }
        AuthMethod::ApplicationCredentialId { id, secret } => {
            json!({ "methods": ["application_credential"], "application_credential": { "id": id, "secret": secret.expose() } })
        }
        AuthMethod::ApplicationCredentialName { name, user, secret } => json!({
            "methods": ["application_credential"],
            "application_credential": { "name": name, "secret": secret.expose(), "user": user_json(user) }
        }),
        AuthMethod::Token { token } => {
            json!({ "methods": ["token"], "token": { "id": token.expose() } })
        }
    };
    let mut auth = json!({ "identity": identity });
    match &cfg.scope {
        Some(Scope::Project(ProjectRef::Id(id))) => {
            auth["scope"] = json!({ "project": { "id": id } })
        }
        Some(Scope::Project(ProjectRef::Name { name, domain })) => {
            auth["scope"] = json!({ "project": { "name": name, "domain": domain_json(domain) } })
        }
        Some(Scope::Trust(id)) => auth["scope"] = json!({ "OS-TRUST:trust": { "id": id } }),
        None => {}
    }
    json!({ "auth": auth })
}

/// Makes a catalog URL point at the API version this library speaks:
/// catalogs list Cinder as `.../v3/<project>` or unversioned, Barbican
/// unversioned, Manila as `.../v2[/<project>]`.
fn versioned_endpoint(service: ServiceType, mut url: Url, project_id: Option<&str>) -> Url {
    let segments: Vec<String> = url
        .path_segments()
        .map(|s| s.map(str::to_string).collect())
        .unwrap_or_default();
    let has = |v: &str| segments.iter().any(|s| s == v);
    let mut extra: Vec<String> = Vec::new();
    match service {
        ServiceType::BlockStorage if !has("v3") => {
            extra.push("v3".into());
            extra.extend(project_id.map(str::to_string));
        }
        ServiceType::Compute if !has("v2.1") && !has("v2") => extra.push("v2.1".into()),
        ServiceType::SharedFileSystem if !has("v2") => {
            extra.push("v2".into());
            extra.extend(project_id.map(str::to_string));
        }
        ServiceType::KeyManager if !has("v1") => extra.push("v1".into()),
        ServiceType::Identity if !has("v3") => extra.push("v3".into()),
        _ => {}
    }
    if !extra.is_empty() {
        let path = format!("{}/{}", url.path().trim_end_matches('/'), extra.join("/"));
        url.set_path(&path);
    }
    url
}

/// The unversioned root of a versioned endpoint (`http://h/share/v2/p` →
/// `http://h/share/`), where the version document is served.
pub(crate) fn unversioned_root(url: &Url) -> Url {
    let mut u = url.clone();
    let segs: Vec<&str> = url.path_segments().map(|s| s.collect()).unwrap_or_default();
    let keep: Vec<&str> = segs
        .iter()
        .take_while(|s| {
            !(s.starts_with('v') && s[1..].chars().next().is_some_and(|c| c.is_ascii_digit()))
        })
        .copied()
        .collect();
    let path = if keep.is_empty() {
        "/".to_string()
    } else {
        format!("/{}/", keep.join("/"))
    };
    u.set_path(&path);
    u.set_query(None);
    u
}

/// The URL of `path` below `base`. Every segment of `path` must name
/// something: an empty one (an empty id) or a dot segment, even
/// percent-encoded (`%2E%2E` is `..` to a URL parser), would turn into a
/// step up or a list of everything. And the result stays below `base`.
fn join_url(
    operation: &'static str,
    base: &Url,
    path: &str,
    query: &[(String, String)],
) -> Result<Url> {
    let mut u = base.clone();
    let path = path.trim_start_matches('/');
    let joined = if path.is_empty() {
        base.path().to_string()
    } else {
        for segment in path.split('/') {
            let decoded = segment.to_ascii_lowercase().replace("%2e", ".");
            if segment.is_empty() || decoded == "." || decoded == ".." {
                return Err(Error::InvalidId {
                    operation,
                    id: segment.chars().take(64).collect(),
                });
            }
        }
        format!("{}/{}", base.path().trim_end_matches('/'), path)
    };
    u.set_path(&joined);
    if !u.path().starts_with(base.path().trim_end_matches('/')) {
        return Err(Error::InvalidId {
            operation,
            id: path.chars().take(64).collect(),
        });
    }
    if !query.is_empty() {
        let mut pairs = u.query_pairs_mut();
        for (k, v) in query {
            pairs.append_pair(k, v);
        }
    }
    Ok(u)
}

/// A rustls configuration with the ring provider and the system roots
/// (reqwest is built without a default provider, so every client must be
/// given one).
pub(crate) fn default_tls() -> Result<rustls::ClientConfig> {
    build_tls(&TlsOptions::default())
}

fn build_tls(tls: &TlsOptions) -> Result<rustls::ClientConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Tls(e.to_string()))?;
    let builder = if tls.insecure {
        tracing::warn!("tls-insecure is set: server certificates are NOT verified");
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(insecure::AcceptAnyCertificate(provider)))
    } else {
        let mut roots = rustls::RootCertStore::empty();
        let native = rustls_native_certs::load_native_certs();
        roots.add_parsable_certificates(native.certs);
        let mut sources = Vec::new();
        if let Some(ca) = &tls.ca_file {
            let pem = std::fs::read(ca)
                .map_err(|e| Error::Tls(format!("cannot read ca-file {}: {e}", ca.display())))?;
            sources.push((format!("ca-file {}", ca.display()), pem));
        }
        if let Some(pem) = &tls.ca_pem {
            sources.push((
                "the CA certificate text".to_string(),
                pem.as_bytes().to_vec(),
            ));
        }
        for (what, pem) in sources {
            let certs: Vec<_> = rustls_pemfile::certs(&mut pem.as_slice())
                .collect::<std::result::Result<_, _>>()
                .map_err(|e| Error::Tls(format!("{what}: {e}")))?;
            if certs.is_empty() {
                return Err(Error::Tls(format!("{what} holds no PEM certificate")));
            }
            for c in certs {
                roots
                    .add(c)
                    .map_err(|e| Error::Tls(format!("{what}: {e}")))?;
            }
        }
        builder.with_root_certificates(roots)
    };
    let client_pem = match (&tls.cert_pem, &tls.key_pem) {
        (Some(cert), Some(key)) => Some((
            "the client certificate".to_string(),
            cert.as_bytes().to_vec(),
            "the client key".to_string(),
            key.expose().as_bytes().to_vec(),
        )),
        _ => match (&tls.cert_file, &tls.key_file) {
            (Some(cert), Some(key)) => Some((
                format!("cert-file {}", cert.display()),
                std::fs::read(cert).map_err(|e| {
                    Error::Tls(format!("cannot read cert-file {}: {e}", cert.display()))
                })?,
                format!("key-file {}", key.display()),
                std::fs::read(key).map_err(|e| {
                    Error::Tls(format!("cannot read key-file {}: {e}", key.display()))
                })?,
            )),
            _ => None,
        },
    };
    match client_pem {
        Some((cert_what, cert_pem, key_what, key_pem)) => {
            let key_pem = zeroize::Zeroizing::new(key_pem);
            let chain: Vec<_> = rustls_pemfile::certs(&mut cert_pem.as_slice())
                .collect::<std::result::Result<_, _>>()
                .map_err(|e| Error::Tls(format!("{cert_what}: {e}")))?;
            let key_der = rustls_pemfile::private_key(&mut key_pem.as_slice())
                .map_err(|e| Error::Tls(format!("{key_what}: {e}")))?
                .ok_or_else(|| Error::Tls(format!("{key_what} holds no private key")))?;
            builder
                .with_client_auth_cert(chain, key_der)
                .map_err(|e| Error::Tls(format!("client certificate: {e}")))
        }
        None => Ok(builder.with_no_client_auth()),
    }
}

mod insecure {
    use std::sync::Arc;

    use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
    use rustls::crypto::CryptoProvider;
    use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
    use rustls::{DigitallySignedStruct, SignatureScheme};

    /// `tls-insecure = true`: accepts any certificate but still checks that
    /// the handshake signatures are valid.
    #[derive(Debug)]
    pub struct AcceptAnyCertificate(pub Arc<CryptoProvider>);

    impl ServerCertVerifier for AcceptAnyCertificate {
        fn verify_server_cert(
            &self,
            _end_entity: &CertificateDer<'_>,
            _intermediates: &[CertificateDer<'_>],
            _server_name: &ServerName<'_>,
            _ocsp_response: &[u8],
            _now: UnixTime,
        ) -> Result<ServerCertVerified, rustls::Error> {
            Ok(ServerCertVerified::assertion())
        }

        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls12_signature(
                message,
                cert,
                dss,
                &self.0.signature_verification_algorithms,
            )
        }

        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls13_signature(
                message,
                cert,
                dss,
                &self.0.signature_verification_algorithms,
            )
        }

        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            self.0.signature_verification_algorithms.supported_schemes()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_versioning() {
        let u = |s: &str| Url::parse(s).unwrap();
        assert_eq!(
            versioned_endpoint(ServiceType::BlockStorage, u("http://h/volume"), Some("p1"))
                .as_str(),
            "http://h/volume/v3/p1"
        );
        assert_eq!(
            versioned_endpoint(
                ServiceType::BlockStorage,
                u("http://h:8776/v3/p1"),
                Some("p1")
            )
            .as_str(),
            "http://h:8776/v3/p1"
        );
        assert_eq!(
            versioned_endpoint(ServiceType::KeyManager, u("http://h:9311"), None).as_str(),
            "http://h:9311/v1"
        );
        assert_eq!(
            versioned_endpoint(ServiceType::Compute, u("http://h/compute/v2.1"), None).as_str(),
            "http://h/compute/v2.1"
        );
        assert_eq!(
            unversioned_root(&u("http://h/share/v2/p1")).as_str(),
            "http://h/share/"
        );
        assert_eq!(
            unversioned_root(&u("http://h:8786/v2")).as_str(),
            "http://h:8786/"
        );
    }

    #[test]
    fn token_url() {
        let u = |s: &str| Url::parse(s).unwrap();
        assert_eq!(
            tokens_url(&u("http://k:5000")).as_str(),
            "http://k:5000/v3/auth/tokens"
        );
        assert_eq!(
            tokens_url(&u("http://k/identity/v3/")).as_str(),
            "http://k/identity/v3/auth/tokens"
        );
    }

    #[test]
    fn url_join_and_query() {
        let base = Url::parse("http://h/volume/v3/p").unwrap();
        let q = vec![("name".to_string(), "a b&c".to_string())];
        assert_eq!(
            join_url("t", &base, "volumes/detail", &q).unwrap().as_str(),
            "http://h/volume/v3/p/volumes/detail?name=a+b%26c"
        );
        for walking in [
            "types/..",
            "types/%2E%2E",
            "types/.%2e",
            "types/.",
            "types/%2e",
            "types/",
            "types//extra_specs",
        ] {
            assert!(
                matches!(
                    join_url("t", &base, walking, &[]),
                    Err(Error::InvalidId { .. })
                ),
                "{walking}"
            );
        }
    }
}
