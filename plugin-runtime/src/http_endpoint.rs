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
    let mut app = axum::Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz));
    for (path, handler) in extra {
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
    let app = app.with_state(HttpState { registry, health });
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
