//! The optional HTTP endpoint: `/metrics` (Prometheus text) and
//! `/healthz`.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::registry::Registry;

/// Says whether the plugin is healthy: `Ok(None)` yes; `Ok(Some(note))`
/// yes, with something an operator should know (served as `ok: note`);
/// `Err(reason)` no.
pub type HealthCheck = Arc<
    dyn Fn() -> Pin<Box<dyn Future<Output = Result<Option<String>, String>> + Send>> + Send + Sync,
>;

/// A further GET route of the endpoint: its status code and body.
pub type HttpHandler =
    Arc<dyn Fn() -> Pin<Box<dyn Future<Output = (u16, String)> + Send>> + Send + Sync>;

#[derive(Clone)]
struct HttpState {
    registry: Arc<Mutex<Registry>>,
    health: HealthCheck,
}

async fn metrics(State(s): State<HttpState>) -> impl IntoResponse {
    let mut body = String::new();
    let encoded = {
        let registry = s.registry.lock().unwrap_or_else(|p| p.into_inner());
        prometheus_client::encoding::text::encode(&mut body, &registry)
    };
    match encoded {
        Ok(()) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            body,
        ),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [(header::CONTENT_TYPE, "text/plain")],
            e.to_string(),
        ),
    }
}

async fn healthz(State(s): State<HttpState>) -> impl IntoResponse {
    match (s.health)().await {
        Ok(None) => (StatusCode::OK, "ok".to_string()),
        Ok(Some(note)) => (StatusCode::OK, format!("ok: {note}")),
        Err(reason) => (StatusCode::SERVICE_UNAVAILABLE, reason),
    }
}

fn add_routes<S: Clone + Send + Sync + 'static>(
    mut app: axum::Router<S>,
    routes: Vec<(&'static str, HttpHandler)>,
) -> axum::Router<S> {
    for (path, handler) in routes {
        app = app.route(
            path,
            get(move || {
                let handler = handler.clone();
                async move {
                    let (code, body) = handler().await;
                    (
                        StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
                        body,
                    )
                }
            }),
        );
    }
    app
}

/// Binds `addr` (a loopback address: see [`parse_loopback_address`]) and
/// serves only `routes` on it until `shutdown` resolves: what only a
/// process of this host may ask. Returns the bound address.
pub async fn serve_local(
    addr: SocketAddr,
    routes: Vec<(&'static str, HttpHandler)>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    if !addr.ip().is_loopback() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{addr} is not a loopback address"),
        ));
    }
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let paths: Vec<&str> = routes.iter().map(|(p, _)| *p).collect();
    let app = add_routes(axum::Router::new(), routes);
    let task = tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app)
            .with_graceful_shutdown(shutdown)
            .await
        {
            tracing::error!(error = %e, "the local endpoint failed");
        }
    });
    tracing::info!(address = %bound, paths = ?paths, "serving on loopback");
    Ok((bound, task))
}

/// Binds `addr` and serves until `shutdown` resolves. Returns the bound
/// address (port 0 picks one).
pub async fn serve(
    addr: SocketAddr,
    registry: Arc<Mutex<Registry>>,
    health: HealthCheck,
    extra: Vec<(&'static str, HttpHandler)>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let app = axum::Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz));
    let app = add_routes(app, extra).with_state(HttpState { registry, health });
    let task = tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app)
            .with_graceful_shutdown(shutdown)
            .await
        {
            tracing::error!(error = %e, "the metrics endpoint failed");
        }
    });
    tracing::info!(address = %bound, "serving /metrics and /healthz");
    Ok((bound, task))
}

/// An address only this host reaches: `127.0.0.1:9849`, `[::1]:9849`.
pub fn parse_loopback_address(s: &str) -> Result<SocketAddr, String> {
    let a: SocketAddr = s
        .parse()
        .map_err(|e| format!("{s:?} is not an address like 127.0.0.1:9849: {e}"))?;
    if a.ip().is_loopback() {
        Ok(a)
    } else {
        Err(format!(
            "{s:?} is not a loopback address: only this host's processes may reach it"
        ))
    }
}

/// `--http-endpoint` as upstream writes it: `127.0.0.1:8080`, or `:8080`
/// for every interface.
pub fn parse_listen_address(s: &str) -> Result<SocketAddr, String> {
    let full = if s.starts_with(':') {
        format!("0.0.0.0{s}")
    } else {
        s.to_string()
    };
    full.parse()
        .map_err(|e| format!("{s:?} is not an address like 127.0.0.1:8080 or :8080: {e}"))
}
