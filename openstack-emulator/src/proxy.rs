//! A fault proxy in front of real OpenStack services: the emulator's
//! faults (throttling with each retry hint, busy answers, held, lost and
//! dropped answers, delays) for the real test cloud. Each service gets a
//! listener of its own; Keystone's token answers are rewritten so that
//! their catalog names the proxy's listeners, so a client given the
//! proxied Keystone reaches every service through the proxy. Rules match
//! the path as the emulator shows it, the service's prefix first
//! (`/identity`, `/volume`, `/compute`, `/share`, `/key-manager`,
//! `/placement`): the same rule means the same on both.
//!
//! An admin listener takes the rules (`POST /faults`, `DELETE /faults`,
//! `GET /faults`) and reports the calls (`GET /calls`, `DELETE /calls`),
//! as the emulator's `/_admin` does; [`ProxyControl`] is its client.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::Json;
use axum::body::Body;
use axum::extract::State;
use axum::routing::{get, post};
use http::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::errors;
use crate::faults::{FaultAction, FaultRule, RequestToken};
use crate::state::CallRecord;

/// The largest request or answer body the proxy carries.
const MAX_BODY: usize = 64 << 20;

/// One service behind the proxy.
#[derive(Debug, Clone)]
pub struct Upstream {
    /// The emulator's path prefix of the service (`identity`, `volume`,
    /// `compute`, `share`, `key-manager`, `placement`).
    pub service: String,
    /// Where the proxy listens for it.
    pub listen: SocketAddr,
    /// Where the service listens.
    pub target: SocketAddr,
}

/// The most tokens whose issue time the proxy keeps.
const MAX_ISSUED: usize = 10_000;

#[derive(Debug, Default)]
struct ProxyState {
    faults: Mutex<Vec<FaultRule>>,
    calls: Mutex<Vec<CallRecord>>,
    /// When each token the proxy carried the answer of was issued, by a
    /// hash of the token (the token itself is not kept).
    issued: Mutex<HashMap<u64, std::time::Instant>>,
    /// The services' ports, and the proxy's port for each.
    ports: HashMap<u16, u16>,
}

impl ProxyState {
    fn faults(&self) -> MutexGuard<'_, Vec<FaultRule>> {
        self.faults.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn record(
        &self,
        method: &http::Method,
        path: &str,
        query: &str,
        status: Option<u16>,
        arrived: std::time::Instant,
        fault: Option<&str>,
    ) {
        let mut calls = self.calls.lock().unwrap_or_else(|p| p.into_inner());
        if calls.len() >= 100_000 {
            calls.drain(..50_000);
        }
        calls.push(CallRecord {
            method: method.to_string(),
            path: path.to_string(),
            query: query.to_string(),
            status,
            at_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            took_ms: arrived.elapsed().as_millis() as u64,
            fault: fault.map(str::to_string),
        });
    }

    fn matching_fault(
        &self,
        method: &http::Method,
        path: &str,
        token: RequestToken,
    ) -> Option<FaultAction> {
        // spent rules stay, with their counts, until cleared
        self.faults()
            .iter_mut()
            .find_map(|r| r.check(method, path, token))
    }

    fn issued(&self) -> MutexGuard<'_, HashMap<u64, std::time::Instant>> {
        self.issued.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A token answer carried: its token was issued now.
    fn token_issued(&self, token: &[u8]) {
        let mut issued = self.issued();
        if issued.len() >= MAX_ISSUED {
            // bounded: the oldest half forgotten (their requests then
            // count as carrying a token of an unknown issue time)
            let mut times: Vec<std::time::Instant> = issued.values().copied().collect();
            times.sort_unstable();
            let median = times[times.len() / 2];
            issued.retain(|_, at| *at >= median);
        }
        issued.insert(token_key(token), std::time::Instant::now());
    }

    /// What a request's token is known to be.
    fn request_token(&self, headers: &http::HeaderMap) -> RequestToken {
        match headers.get("x-auth-token") {
            None => RequestToken::Absent,
            Some(t) => self
                .issued()
                .get(&token_key(t.as_bytes()))
                .map_or(RequestToken::Unknown, |at| RequestToken::IssuedAt(*at)),
        }
    }
}

fn token_key(token: &[u8]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    token.hash(&mut h);
    h.finish()
}

/// A running proxy; dropping it stops every listener.
#[derive(Debug)]
pub struct FaultProxy {
    pub admin: SocketAddr,
    stop: watch::Sender<bool>,
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

impl FaultProxy {
    /// Listens for each upstream and for the admin API.
    pub async fn start(upstreams: Vec<Upstream>, admin: SocketAddr) -> std::io::Result<Self> {
        let state = Arc::new(ProxyState {
            ports: upstreams
                .iter()
                .map(|u| (u.target.port(), u.listen.port()))
                .collect(),
            ..Default::default()
        });
        let (stop, stopped) = watch::channel(false);
        for u in upstreams {
            let listener = TcpListener::bind(u.listen).await?;
            tokio::spawn(serve_upstream(
                listener,
                Arc::new(u),
                state.clone(),
                stopped.clone(),
            ));
        }
        let admin_listener = TcpListener::bind(admin).await?;
        let admin = admin_listener.local_addr()?;
        let app = axum::Router::new()
            .route(
                "/faults",
                post(add_fault).delete(clear_faults).get(list_faults),
            )
            .route("/calls", get(calls).delete(clear_calls))
            .route("/health", get(|| async { "ok" }))
            .with_state(state);
        let mut admin_stopped = stopped;
        tokio::spawn(async move {
            let _ = axum::serve(admin_listener, app)
                .with_graceful_shutdown(async move {
                    let _ = admin_stopped.changed().await;
                })
                .await;
        });
        Ok(Self { admin, stop })
    }
}

type St = State<Arc<ProxyState>>;

async fn add_fault(State(s): St, Json(rule): Json<FaultRule>) -> StatusCode {
    s.faults().push(rule.fresh());
    StatusCode::CREATED
}
async fn clear_faults(State(s): St) -> StatusCode {
    s.faults().clear();
    StatusCode::NO_CONTENT
}
async fn list_faults(State(s): St) -> Json<Vec<FaultRule>> {
    Json(s.faults().clone())
}
async fn calls(State(s): St) -> Json<Vec<CallRecord>> {
    Json(s.calls.lock().unwrap_or_else(|p| p.into_inner()).clone())
}
async fn clear_calls(State(s): St) -> StatusCode {
    s.calls.lock().unwrap_or_else(|p| p.into_inner()).clear();
    StatusCode::NO_CONTENT
}

async fn serve_upstream(
    listener: TcpListener,
    upstream: Arc<Upstream>,
    state: Arc<ProxyState>,
    stopped: watch::Receiver<bool>,
) {
    crate::serve_http1(listener, stopped, move |req| {
        let (upstream, state) = (upstream.clone(), state.clone());
        async move { handle(upstream, state, req).await }
    })
    .await
}

/// Makes hyper drop the connection without an answer.
#[derive(Debug, thiserror::Error)]
#[error("connection dropped by the fault proxy")]
struct Dropped;

async fn handle(
    upstream: Arc<Upstream>,
    state: Arc<ProxyState>,
    req: Request<Body>,
) -> Result<Response<Body>, Dropped> {
    let arrived = std::time::Instant::now();
    let method = req.method().clone();
    let path = format!("/{}{}", upstream.service, req.uri().path());
    let query = req.uri().query().unwrap_or_default().to_string();
    let token = state.request_token(req.headers());
    let fault = state.matching_fault(&method, &path, token);
    // a throttle that lets a call through served no fault to it
    let fault_name = fault
        .as_ref()
        .filter(|f| !matches!(f, FaultAction::Throttle { .. }))
        .map(FaultAction::name);
    // the service does the work whether or not the caller still waits
    let served = |req: Request<Body>| {
        let (upstream, state) = (upstream.clone(), state.clone());
        let task = tokio::spawn(async move { forward(&upstream, &state, req).await });
        async move {
            task.await
                .unwrap_or_else(|_| Err("the forwarding task failed".to_string()))
        }
    };
    let answered =
        |r: &Result<Response<Body>, String>| r.as_ref().ok().map(|r| r.status().as_u16());
    // forwarded after `millis` (waiting in the network or a queue), and
    // served even if its caller has left meanwhile
    let forwarded_later = |req: Request<Body>, millis: u64| {
        let (upstream, state) = (upstream.clone(), state.clone());
        let (method, path, query) = (method.clone(), path.clone(), query.clone());
        let named = fault_name.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(millis)).await;
            let r = forward(&upstream, &state, req).await;
            let marked = match &r {
                Err(_) => Some("service unreachable"),
                Ok(_) => named.as_deref(),
            };
            state.record(&method, &path, &query, answered(&r), arrived, marked);
            r
        })
    };
    let response = match fault {
        Some(FaultAction::Drop) => {
            state.record(&method, &path, &query, None, arrived, fault_name.as_deref());
            return Err(Dropped);
        }
        Some(FaultAction::Delay { millis }) => {
            return forwarded_later(req, millis)
                .await
                .unwrap_or_else(|_| Err("the forwarding task failed".into()))
                .or_else(|e| Ok(bad_gateway(&path, &e)));
        }
        Some(FaultAction::GatewayGaveUp {
            status,
            serve_after_millis,
        }) => {
            // nobody waits for the service's answer
            drop(forwarded_later(req, serve_after_millis));
            return Ok(errors::injected(
                status,
                &path,
                Some("the gateway gave up waiting for the service"),
                None,
                Default::default(),
            ));
        }
        Some(FaultAction::LoseAnswer) => {
            let r = served(req).await;
            state.record(
                &method,
                &path,
                &query,
                answered(&r),
                arrived,
                fault_name.as_deref(),
            );
            return Err(Dropped);
        }
        Some(FaultAction::HoldAnswer { millis }) => {
            let r = served(req).await;
            state.record(
                &method,
                &path,
                &query,
                answered(&r),
                arrived,
                fault_name.as_deref(),
            );
            tokio::time::sleep(Duration::from_millis(millis)).await;
            return r.or_else(|e| Ok(bad_gateway(&path, &e)));
        }
        Some(FaultAction::Status {
            status,
            message,
            retry_after,
            hint,
        }) => Ok(errors::injected(
            status,
            &path,
            message.as_deref(),
            retry_after.map(Duration::from_secs),
            hint,
        )),
        Some(FaultAction::Throttled { wait, hint }) => Ok(errors::injected(
            429,
            &path,
            Some("Rate limit exceeded: too many requests"),
            Some(wait),
            hint,
        )),
        Some(FaultAction::TokensExpired) => Ok(errors::token_expired()),
        Some(FaultAction::Json { status, body }) => {
            let mut r = axum::response::IntoResponse::into_response(Json(body));
            *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
            Ok(r)
        }
        Some(FaultAction::Throttle { .. }) | None => served(req).await,
    };
    // a service that cannot be reached (stopped: an outage) is marked too
    let marked = match &response {
        Err(_) => Some("service unreachable"),
        Ok(_) => fault_name.as_deref(),
    };
    state.record(&method, &path, &query, answered(&response), arrived, marked);
    Ok(response.unwrap_or_else(|e| bad_gateway(&path, &e)))
}

fn bad_gateway(path: &str, why: &str) -> Response<Body> {
    errors::injected(
        502,
        path,
        Some(&format!(
            "the fault proxy could not reach the service: {why}"
        )),
        None,
        Default::default(),
    )
}

/// Sends the request on to the service (a connection of its own) and
/// brings its answer back, a token answer's catalog rewritten to name the
/// proxy.
async fn forward(
    upstream: &Upstream,
    state: &ProxyState,
    req: Request<Body>,
) -> Result<Response<Body>, String> {
    let (mut parts, body) = req.into_parts();
    let body = axum::body::to_bytes(body, MAX_BODY)
        .await
        .map_err(|e| format!("reading the request: {e}"))?;
    let target = upstream.target;
    parts.headers.insert(
        http::header::HOST,
        http::HeaderValue::from_str(&target.to_string()).map_err(|e| e.to_string())?,
    );
    let stream = TcpStream::connect(target)
        .await
        .map_err(|e| format!("{target}: {e}"))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("{target}: {e}"))?;
    tokio::spawn(conn);
    let answer = sender
        .send_request(Request::from_parts(parts, Body::from(body)))
        .await
        .map_err(|e| format!("{target}: {e}"))?;
    let (mut parts, body) = answer.into_parts();
    let body = axum::body::to_bytes(Body::new(body), MAX_BODY)
        .await
        .map_err(|e| format!("reading the answer: {e}"))?;
    // a token answer (Keystone's, whichever listener it came through)
    if parts.status.is_success()
        && let Some(token) = parts.headers.get("x-subject-token")
    {
        state.token_issued(token.as_bytes());
    }
    let body = if parts.headers.contains_key("x-subject-token") {
        let rewritten = proxied_catalog(&body, &state.ports);
        parts.headers.remove(http::header::CONTENT_LENGTH);
        rewritten
    } else {
        body.to_vec()
    };
    Ok(Response::from_parts(parts, Body::from(body)))
}

/// A token answer whose catalog names the proxy's listener instead of
/// each proxied service's.
fn proxied_catalog(body: &[u8], ports: &HashMap<u16, u16>) -> Vec<u8> {
    let Ok(mut v) = serde_json::from_slice::<serde_json::Value>(body) else {
        return body.to_vec();
    };
    if let Some(catalog) = v
        .pointer_mut("/token/catalog")
        .and_then(serde_json::Value::as_array_mut)
    {
        for entry in catalog {
            let Some(endpoints) = entry
                .get_mut("endpoints")
                .and_then(serde_json::Value::as_array_mut)
            else {
                continue;
            };
            for ep in endpoints {
                let Some(url) = ep.get("url").and_then(|u| u.as_str()) else {
                    continue;
                };
                let Ok(mut u) = url::Url::parse(url) else {
                    continue;
                };
                if let Some(proxied) = u.port().and_then(|p| ports.get(&p))
                    && u.set_port(Some(*proxied)).is_ok()
                {
                    ep["url"] = serde_json::Value::String(
                        u.to_string().trim_end_matches('/').to_string()
                            + if url.ends_with('/') { "/" } else { "" },
                    );
                }
            }
        }
    }
    serde_json::to_vec(&v).unwrap_or_else(|_| body.to_vec())
}

/// A client of a proxy's (or the emulator's `/_admin`) fault API.
#[derive(Debug, Clone)]
pub struct ProxyControl {
    pub admin: SocketAddr,
}

impl ProxyControl {
    async fn call(
        &self,
        method: http::Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<(StatusCode, Vec<u8>), String> {
        let stream = TcpStream::connect(self.admin)
            .await
            .map_err(|e| format!("{}: {e}", self.admin))?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        let req = Request::builder()
            .method(method)
            .uri(path)
            .header(http::header::HOST, self.admin.to_string())
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Body::from(body.unwrap_or_default()))
            .map_err(|e| e.to_string())?;
        let r = sender.send_request(req).await.map_err(|e| e.to_string())?;
        let status = r.status();
        let bytes = axum::body::to_bytes(Body::new(r.into_body()), MAX_BODY)
            .await
            .map_err(|e| e.to_string())?;
        Ok((status, bytes.to_vec()))
    }

    /// The answer's body when its status is `want`; else what the admin
    /// API said (a rule the proxy did not take is an error, never a
    /// fault that silently never happens).
    async fn expect(
        &self,
        method: http::Method,
        path: &str,
        body: Option<Vec<u8>>,
        want: StatusCode,
    ) -> Result<Vec<u8>, String> {
        let what = format!("{method} {path}");
        let (status, body) = self.call(method, path, body).await?;
        if status != want {
            return Err(format!(
                "the fault proxy's {what} answered {status}, not {want}: {}",
                String::from_utf8_lossy(&body)
            ));
        }
        Ok(body)
    }

    pub async fn add_fault(&self, rule: &FaultRule) -> Result<(), String> {
        let body = serde_json::to_vec(rule).map_err(|e| e.to_string())?;
        self.expect(
            http::Method::POST,
            "/faults",
            Some(body),
            StatusCode::CREATED,
        )
        .await
        .map(drop)
    }

    /// The rules in place (spent ones too), each with how many requests
    /// it served its fault to.
    pub async fn faults(&self) -> Result<Vec<FaultRule>, String> {
        self.get_json("/faults").await
    }

    pub async fn clear_faults(&self) -> Result<(), String> {
        self.expect(
            http::Method::DELETE,
            "/faults",
            None,
            StatusCode::NO_CONTENT,
        )
        .await
        .map(drop)
    }

    pub async fn calls(&self) -> Result<Vec<CallRecord>, String> {
        self.get_json("/calls").await
    }

    /// What a GET of `path` answered OK, read as `T`.
    async fn get_json<T: serde::de::DeserializeOwned>(&self, path: &str) -> Result<T, String> {
        let body = self
            .expect(http::Method::GET, path, None, StatusCode::OK)
            .await?;
        serde_json::from_slice(&body).map_err(|e| e.to_string())
    }

    pub async fn clear_calls(&self) -> Result<(), String> {
        self.expect(http::Method::DELETE, "/calls", None, StatusCode::NO_CONTENT)
            .await
            .map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_answers_catalog_names_the_proxy() {
        let body = serde_json::json!({"token": {"catalog": [
            {"type": "volumev3", "endpoints": [
                {"interface": "public", "url": "http://127.0.0.1:25002/v3/abc"}]},
            {"type": "compute", "endpoints": [
                {"interface": "public", "url": "http://127.0.0.1:25003/v2.1"}]},
            {"type": "image", "endpoints": [
                {"interface": "public", "url": "http://127.0.0.1:9292/"}]},
        ]}});
        let ports = HashMap::from([(25002, 25502), (25003, 25503)]);
        let out: serde_json::Value = serde_json::from_slice(&proxied_catalog(
            &serde_json::to_vec(&body).unwrap(),
            &ports,
        ))
        .unwrap();
        let urls: Vec<&str> = out["token"]["catalog"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["endpoints"][0]["url"].as_str().unwrap())
            .collect();
        assert_eq!(
            urls,
            [
                "http://127.0.0.1:25502/v3/abc",
                "http://127.0.0.1:25503/v2.1",
                "http://127.0.0.1:9292/"
            ]
        );
        assert_eq!(proxied_catalog(b"not json", &ports), b"not json");
    }
}
