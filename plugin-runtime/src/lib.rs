//! What every plugin binary shares: the Unix-socket endpoint, graceful
//! shutdown, logging, a span and metrics per RPC, the optional
//! `/metrics` + `/healthz` HTTP endpoint, and configuration reloads.

pub mod config_watch;
pub mod csi_identity;
pub mod endpoint;
pub mod exit_holds;
pub mod grpc;
pub mod http_endpoint;
pub mod logging;
pub mod reload;
pub mod upstream_args;

use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::registry::Registry;
use tokio::sync::watch;
use tokio_stream::wrappers::UnixListenerStream;

pub use endpoint::{Endpoint, EndpointError};
pub use exit_holds::ExitHolds;
pub use grpc::{GrpcMetrics, ObserveLayer};
pub use http_endpoint::{HealthCheck, parse_listen_address, parse_loopback_address};
pub use logging::{LogArgs, LogFormat};

/// Default socket mode of the CSI plugins (kubelet and sidecars share a
/// group); the KMS plugin uses 0600.
pub const CSI_SOCKET_MODE: u32 = 0o660;
pub const KMS_SOCKET_MODE: u32 = 0o600;

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error(transparent)]
    Endpoint(#[from] EndpointError),
    #[error("cannot serve /metrics on {addr}: {source}")]
    Http {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("gRPC server: {0}")]
    Grpc(#[from] tonic::transport::Error),
}

/// A plugin's gRPC server on a Unix socket.
pub struct PluginServer {
    endpoint: Endpoint,
    socket_mode: u32,
    http_endpoint: Option<SocketAddr>,
    registry: Arc<Mutex<Registry>>,
    grpc_metrics: GrpcMetrics,
    health: HealthCheck,
    http_routes: Vec<(&'static str, http_endpoint::HttpHandler)>,
    local: Option<(SocketAddr, Vec<(&'static str, http_endpoint::HttpHandler)>)>,
    grace: Duration,
    bound_http: Option<tokio::sync::oneshot::Sender<SocketAddr>>,
    exit_holds: ExitHolds,
    on_shutdown: Vec<Box<dyn FnOnce() + Send>>,
}

impl std::fmt::Debug for PluginServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginServer")
            .field("endpoint", &self.endpoint)
            .field("http_endpoint", &self.http_endpoint)
            .finish()
    }
}

impl PluginServer {
    pub fn new(endpoint: Endpoint) -> Self {
        let mut registry = Registry::default();
        let grpc_metrics = GrpcMetrics::default();
        grpc_metrics.register(&mut registry);
        Self {
            endpoint,
            socket_mode: CSI_SOCKET_MODE,
            http_endpoint: None,
            registry: Arc::new(Mutex::new(registry)),
            grpc_metrics,
            health: Arc::new(|| Box::pin(async { Ok(None) })),
            http_routes: Vec::new(),
            local: None,
            grace: Duration::from_secs(30),
            bound_http: None,
            exit_holds: ExitHolds::default(),
            on_shutdown: Vec::new(),
        }
    }

    /// Runs `hook` as the shutdown begins (before in-flight calls are
    /// waited for): work it starts through [`Self::exit_holds`] keeps the
    /// process, and the routes of [`Self::local_route`], until it ends.
    pub fn on_shutdown(mut self, hook: impl FnOnce() + Send + 'static) -> Self {
        self.on_shutdown.push(Box::new(hook));
        self
    }

    /// Work started by a handler that the shutdown waits for (up to the
    /// grace period) before `serve` returns.
    pub fn exit_holds(&self) -> ExitHolds {
        self.exit_holds.clone()
    }

    pub fn socket_mode(mut self, mode: u32) -> Self {
        self.socket_mode = mode;
        self
    }

    pub fn http_endpoint(mut self, addr: Option<SocketAddr>) -> Self {
        self.http_endpoint = addr;
        self
    }

    /// A further GET route of the HTTP endpoint (when it is served).
    pub fn http_route(mut self, path: &'static str, handler: http_endpoint::HttpHandler) -> Self {
        self.http_routes.push((path, handler));
        self
    }

    /// A GET route served only on `addr`, a loopback address of its own
    /// (never on the HTTP endpoint): what only this host's processes may
    /// ask. Routes of one server share that address.
    pub fn local_route(
        mut self,
        addr: SocketAddr,
        path: &'static str,
        handler: http_endpoint::HttpHandler,
    ) -> Self {
        let local = self.local.get_or_insert_with(|| (addr, Vec::new()));
        local.0 = addr;
        local.1.push((path, handler));
        self
    }

    /// What `/healthz` reports.
    pub fn health_check(mut self, health: HealthCheck) -> Self {
        self.health = health;
        self
    }

    /// How long in-flight calls may take to finish after a shutdown signal.
    pub fn grace_period(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// Tells the bound address of the HTTP endpoint once it listens (port 0).
    pub fn report_http_address(mut self, tx: tokio::sync::oneshot::Sender<SocketAddr>) -> Self {
        self.bound_http = Some(tx);
        self
    }

    /// The registry `/metrics` serves; register more metrics here.
    pub fn registry(&self) -> Arc<Mutex<Registry>> {
        self.registry.clone()
    }

    /// Serves `routes` until `shutdown` resolves: then stops accepting,
    /// lets in-flight calls finish (up to the grace period) and removes the
    /// socket.
    pub async fn serve(
        mut self,
        routes: tonic::service::Routes,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), RuntimeError> {
        let (stop_tx, stop_rx) = watch::channel(false);
        let http_task = match self.http_endpoint {
            Some(addr) => {
                let mut rx = stop_rx.clone();
                let (bound, task) = http_endpoint::serve(
                    addr,
                    self.registry.clone(),
                    self.health.clone(),
                    std::mem::take(&mut self.http_routes),
                    async move {
                        let _ = rx.wait_for(|stop| *stop).await;
                    },
                )
                .await
                .map_err(|source| RuntimeError::Http { addr, source })?;
                if let Some(tx) = self.bound_http.take() {
                    let _ = tx.send(bound);
                }
                Some(task)
            }
            None => None,
        };
        // the loopback routes last until the holds end: a neighbouring
        // container's preStop may ask them after this one was told to stop
        let (local_stop_tx, local_stop_rx) = watch::channel(false);
        let local_task = match self.local.take() {
            Some((addr, routes)) => {
                let mut rx = local_stop_rx;
                let (_, task) = http_endpoint::serve_local(addr, routes, async move {
                    let _ = rx.wait_for(|stop| *stop).await;
                })
                .await
                .map_err(|source| RuntimeError::Http { addr, source })?;
                Some(task)
            }
            None => None,
        };
        // the socket last: once it exists everything listens, and a plugin
        // that cannot listen on its HTTP endpoint leaves no socket behind
        // for kubelet or a sidecar to take for a live one
        tokio::pin!(shutdown);
        let mut waiting_since: Option<std::time::Instant> = None;
        let mut next_warning = 0;
        let (listener, socket_file) = loop {
            match endpoint::bind(&self.endpoint, self.socket_mode) {
                Ok(bound) => break bound,
                // Another plugin still serves on the endpoint: the release
                // this one replaces (upstream's node plugin under another
                // DaemonSet's name, which Helm deletes as it creates ours).
                // Its socket is taken over once it is gone, never from
                // under it; exiting instead would put this pod in
                // crash-loop back-off, minutes without a plugin here after
                // the old one went.
                Err(endpoint::EndpointError::InUse(path)) => {
                    let since = *waiting_since.get_or_insert_with(std::time::Instant::now);
                    let waited = since.elapsed().as_secs();
                    if waited >= next_warning {
                        next_warning = waited + 30;
                        tracing::warn!(socket = %path.display(), waited_s = waited, "another process serves on the endpoint: waiting for it to go before taking the socket over");
                    }
                    tokio::select! {
                        () = tokio::time::sleep(Duration::from_secs(1)) => {}
                        () = &mut shutdown => {
                            for hook in std::mem::take(&mut self.on_shutdown) {
                                hook();
                            }
                            let _ = stop_tx.send(true);
                            if let Some(t) = http_task {
                                let _ = t.await;
                            }
                            self.exit_holds.wait(self.grace).await;
                            let _ = local_stop_tx.send(true);
                            if let Some(t) = local_task {
                                let _ = t.await;
                            }
                            tracing::info!("stopped before serving: the endpoint was never free");
                            return Ok(());
                        }
                    }
                }
                Err(e) => {
                    let _ = stop_tx.send(true);
                    let _ = local_stop_tx.send(true);
                    return Err(e.into());
                }
            }
        };
        if let Some(since) = waiting_since {
            tracing::info!(
                waited_s = since.elapsed().as_secs(),
                "the endpoint's other server went: taking the socket over"
            );
        }
        tracing::info!(endpoint = %self.endpoint, mode = format!("{:o}", self.socket_mode), "serving gRPC");
        let mut drain_rx = stop_rx.clone();
        let server = tonic::transport::Server::builder()
            .layer(ObserveLayer::new(self.grpc_metrics.clone()))
            .add_routes(routes)
            .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async move {
                let _ = drain_rx.wait_for(|stop| *stop).await;
            });
        tokio::pin!(server);
        let result = tokio::select! {
            r = &mut server => r.map_err(RuntimeError::from),
            () = &mut shutdown => {
                tracing::info!(grace_s = self.grace.as_secs(), "shutting down: no new connections, finishing in-flight calls");
                for hook in std::mem::take(&mut self.on_shutdown) {
                    hook();
                }
                // the socket goes first, so that nobody connects to a
                // server that is going away
                socket_file.remove_if_ours();
                let _ = stop_tx.send(true);
                // Wait for calls, not connections: kubelet and the
                // sidecars keep idle connections open, and a drain that
                // waited for them would always take the whole grace period.
                let metrics = self.grpc_metrics.clone();
                let calls_done = async move {
                    while metrics.in_flight() > 0 {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                };
                tokio::select! {
                    r = &mut server => r.map_err(RuntimeError::from),
                    done = tokio::time::timeout(self.grace, calls_done) => {
                        if done.is_err() {
                            tracing::warn!(in_flight = self.grpc_metrics.in_flight(), "calls still running at the end of the grace period");
                        }
                        Ok(())
                    }
                }
            }
        };
        let _ = stop_tx.send(true);
        socket_file.remove_if_ours();
        if let Some(t) = http_task {
            let _ = t.await;
        }
        self.exit_holds.wait(self.grace).await;
        let _ = local_stop_tx.send(true);
        if let Some(t) = local_task {
            let _ = t.await;
        }
        tracing::info!("stopped");
        result
    }
}

/// Resolves on SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot watch SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT received"),
        () = term => tracing::info!("SIGTERM received"),
    }
}

/// A gRPC channel over a Unix socket (tests, the sanity suite, tools).
pub async fn connect_unix(
    path: &Path,
) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    let path = path.to_path_buf();
    tonic::transport::Endpoint::from_static("http://[::]:50051")
        .connect_with_connector(tower::service_fn(move |_| {
            let path = path.clone();
            async move {
                tokio::net::UnixStream::connect(path)
                    .await
                    .map(hyper_util::rt::TokioIo::new)
            }
        }))
        .await
}
