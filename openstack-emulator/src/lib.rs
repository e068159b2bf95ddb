//! An OpenStack emulator: a real HTTP server that keeps state and serves
//! the API surface the suite uses (Keystone v3, Cinder v3, Nova v2.1,
//! Manila v2, Barbican v1, the metadata service), moves resources through
//! the real services' status transitions with configurable delays, and
//! injects faults on demand. Optionally it plays the hypervisor: attached
//! volumes appear as loop devices under a by-id directory.
//!
//! [`proxy`] puts the same faults in front of real OpenStack services.
//!
//! It is a development and test backend, never a production default.

mod admin;
mod barbican;
mod cinder;
mod errors;
mod faults;
pub mod hypervisor;
mod keystone;
mod manila;
mod nova;
pub mod preconditions;
pub mod proxy;
mod state;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use http::{HeaderValue, Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tower::ServiceExt;
use url::Url;

pub use faults::{FaultAction, FaultRule, RequestToken, RetryHint};
use state::World;
pub use state::{CallRecord, Delays, Quotas};

/// Users the emulator knows. `admin` has the admin role in project
/// `admin`; `demo` is a member of project `demo`.
pub const ADMIN_USER: &str = "admin";
pub const ADMIN_PASSWORD: &str = "admin-secret";
pub const MEMBER_USER: &str = "demo";
pub const MEMBER_PASSWORD: &str = "demo-secret";
pub const DOMAIN: &str = "Default";
/// An application credential of the admin user.
pub const APP_CRED_ID: &str = "emulator-app-cred";
pub const APP_CRED_NAME: &str = "emulator-app-cred-name";
pub const APP_CRED_SECRET: &str = "emulator-app-cred-secret";

#[derive(Debug, Clone)]
pub struct HypervisorConfig {
    /// Where `virtio-<id[:20]>` links to the loop devices are made.
    pub by_id_dir: std::path::PathBuf,
    /// Further folders linked alike (the by-id folders of the machines
    /// whose node plugins are to see the devices).
    pub also_link_in: Vec<std::path::PathBuf>,
    /// Where the sparse backing files live.
    pub image_dir: std::path::PathBuf,
}

#[derive(Debug, Clone)]
pub struct EmulatorConfig {
    pub listen: SocketAddr,
    pub region: String,
    pub availability_zones: Vec<String>,
    /// Nova's `[cinder] cross_az_attach`: false refuses an attach across
    /// zones, as a multi-zone cloud is set up (Nova's default: true).
    pub cross_az_attach: bool,
    pub token_lifetime: Duration,
    pub delays: Delays,
    pub hypervisor: Option<HypervisorConfig>,
}

impl Default for EmulatorConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            region: "RegionOne".into(),
            availability_zones: vec!["nova".into()],
            cross_az_attach: true,
            token_lifetime: Duration::from_secs(3600),
            delays: Delays::default(),
            hypervisor: None,
        }
    }
}

pub(crate) struct AppState {
    world: Mutex<World>,
    pub base_url: Url,
    pub region: String,
    pub availability_zones: Vec<String>,
    pub hypervisor: Option<hypervisor::Hypervisor>,
}

impl AppState {
    /// The world, even if a handler panicked while holding it.
    pub fn world(&self) -> MutexGuard<'_, World> {
        self.world.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `f` on the world after `delay`, from a background task: how
    /// resources move from transient to settled states.
    pub fn after(
        self: &Arc<Self>,
        delay: Duration,
        f: impl FnOnce(&AppState, &mut World) + Send + 'static,
    ) {
        let this = self.clone();
        tokio::spawn(async move {
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            let mut w = this.world();
            f(&this, &mut w);
        });
    }
}

/// A running emulator. Dropping it stops the server; call
/// [`Emulator::shutdown`] to also wait for the hypervisor clean-up.
pub struct Emulator {
    state: Arc<AppState>,
    url: Url,
    stop: watch::Sender<bool>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl std::fmt::Debug for Emulator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Emulator")
            .field("url", &self.url.as_str())
            .finish()
    }
}

impl Emulator {
    /// Binds, seeds the world and starts serving.
    pub async fn start(config: EmulatorConfig) -> anyhow::Result<Self> {
        let listener = TcpListener::bind(config.listen).await?;
        let addr = listener.local_addr()?;
        let url = Url::parse(&format!("http://{addr}/"))?;
        let hypervisor = match &config.hypervisor {
            Some(h) => {
                let hv = hypervisor::Hypervisor::linking_in(
                    h.by_id_dir.clone(),
                    h.also_link_in.clone(),
                    h.image_dir.clone(),
                )?;
                // an earlier run may have crashed with devices attached
                hv.cleanup_all();
                Some(hv)
            }
            None => None,
        };
        let state = Arc::new(AppState {
            world: Mutex::new(World::new(&config)),
            base_url: url.clone(),
            region: config.region.clone(),
            availability_zones: config.availability_zones.clone(),
            hypervisor,
        });
        let router = router(state.clone());
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(serve(listener, router, state.clone(), stopped));
        tracing::info!(%url, "OpenStack emulator listening");
        Ok(Self {
            state,
            url,
            stop,
            task: Some(task),
        })
    }

    /// `http://127.0.0.1:PORT/`
    pub fn url(&self) -> &Url {
        &self.url
    }

    /// The Keystone v3 URL to put in `auth-url`.
    pub fn auth_url(&self) -> String {
        format!("{}identity/v3", self.url)
    }

    /// An upstream-style cloud.conf: `[Global]` is the admin user,
    /// `[Global "member"]` the non-admin user.
    pub fn cloud_conf(&self) -> String {
        let auth = self.auth_url();
        let region = &self.state.region;
        format!(
            "# written by openstack-emulator at {url}\n\
             [Global]\nauth-url = \"{auth}\"\nusername = \"{ADMIN_USER}\"\npassword = \"{ADMIN_PASSWORD}\"\n\
             user-domain-name = \"{DOMAIN}\"\ntenant-name = \"admin\"\ntenant-domain-name = \"{DOMAIN}\"\nregion = \"{region}\"\n\n\
             [Global \"member\"]\nauth-url = \"{auth}\"\nusername = \"{MEMBER_USER}\"\npassword = \"{MEMBER_PASSWORD}\"\n\
             user-domain-name = \"{DOMAIN}\"\ntenant-name = \"demo\"\ntenant-domain-name = \"{DOMAIN}\"\nregion = \"{region}\"\n\n\
             [Global \"appcred\"]\nauth-url = \"{auth}\"\napplication-credential-id = \"{APP_CRED_ID}\"\n\
             application-credential-secret = \"{APP_CRED_SECRET}\"\nregion = \"{region}\"\n",
            url = self.url
        )
    }

    /// A cloud.conf whose `[Global]` is the project member `demo`: what a
    /// plugin runs with in production (a member's rights, as an
    /// application credential has them), not the admin's.
    pub fn member_cloud_conf(&self) -> String {
        format!(
            "# written by openstack-emulator at {url}\n\
             [Global]\nauth-url = \"{auth}\"\nusername = \"{MEMBER_USER}\"\npassword = \"{MEMBER_PASSWORD}\"\n\
             user-domain-name = \"{DOMAIN}\"\ntenant-name = \"demo\"\ntenant-domain-name = \"{DOMAIN}\"\nregion = \"{region}\"\n",
            url = self.url,
            auth = self.auth_url(),
            region = &self.state.region,
        )
    }

    /// A clouds.yaml with clouds `emulator-admin` and `emulator-member`.
    pub fn clouds_yaml(&self) -> String {
        let auth = self.auth_url();
        let region = &self.state.region;
        let cloud = |name: &str, user: &str, password: &str, project: &str| {
            format!(
                "  {name}:\n    auth:\n      auth_url: \"{auth}\"\n      username: \"{user}\"\n      password: \"{password}\"\n      \
                 project_name: \"{project}\"\n      user_domain_name: \"{DOMAIN}\"\n      project_domain_name: \"{DOMAIN}\"\n    \
                 region_name: \"{region}\"\n    interface: public\n    identity_api_version: 3\n"
            )
        };
        format!(
            "clouds:\n{}{}",
            cloud("emulator-admin", ADMIN_USER, ADMIN_PASSWORD, "admin"),
            cloud("emulator-member", MEMBER_USER, MEMBER_PASSWORD, "demo")
        )
    }

    /// In-process control of the knobs the admin API offers over HTTP.
    pub fn control(&self) -> Control {
        Control {
            state: self.state.clone(),
        }
    }

    /// Stops serving and detaches every simulated device.
    pub async fn shutdown(mut self) {
        let _ = self.stop.send(true);
        if let Some(t) = self.task.take() {
            let _ = t.await;
        }
        if let Some(hv) = &self.state.hypervisor {
            hv.cleanup_all();
        }
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        if let Some(hv) = &self.state.hypervisor {
            hv.cleanup_all();
        }
    }
}

pub use admin::Control;

fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .nest("/identity", keystone::routes())
        .nest("/volume/v3/{project_id}", cinder::routes(state.clone()))
        .nest("/compute/v2.1", nova::routes(state.clone()))
        .route("/share", axum::routing::get(manila::versions))
        .route("/share/", axum::routing::get(manila::versions))
        .nest("/share", manila::routes(state.clone()))
        .nest("/key-manager", barbican::routes())
        .route(
            "/openstack/latest/meta_data.json",
            axum::routing::get(nova::metadata_service),
        )
        .nest("/_admin", admin::routes())
        .fallback(errors::not_found_fallback)
        .with_state(state)
}

async fn serve(
    listener: TcpListener,
    router: Router,
    state: Arc<AppState>,
    stopped: watch::Receiver<bool>,
) {
    serve_http1(listener, stopped, move |req| {
        let (router, state) = (router.clone(), state.clone());
        async move { handle(router, state, req).await }
    })
    .await
}

/// Accepts HTTP/1 connections until `stopped` changes, each request
/// answered by `handler` (an error drops its connection unanswered).
pub(crate) async fn serve_http1<H, Fut, E>(
    listener: TcpListener,
    mut stopped: watch::Receiver<bool>,
    handler: H,
) where
    H: Fn(Request<Body>) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<Response<Body>, E>> + Send + 'static,
    E: std::error::Error + Send + Sync + 'static,
{
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    continue;
                }
            },
            _ = stopped.changed() => return,
        };
        let handler = handler.clone();
        let mut conn_stopped = stopped.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                handler(req.map(Body::new))
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service);
            tokio::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => {}
                _ = conn_stopped.changed() => {}
            }
        });
    }
}

/// Error that makes hyper drop the connection without answering.
#[derive(Debug, thiserror::Error)]
#[error("connection dropped by fault injection")]
struct DroppedByFault;

async fn handle(
    router: Router,
    state: Arc<AppState>,
    req: Request<Body>,
) -> Result<Response<Body>, DroppedByFault> {
    let arrived = std::time::Instant::now();
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or_default().to_string();
    let request_id = format!("req-{}", uuid::Uuid::new_v4());
    let fault = if path.starts_with("/_admin") {
        None
    } else {
        // the emulator does not tell when a token was issued
        let token = if req.headers().contains_key("x-auth-token") {
            RequestToken::Unknown
        } else {
            RequestToken::Absent
        };
        state.world().match_fault(&method, &path, token)
    };
    // a throttle that lets a call through served no fault to it
    let fault_name = fault
        .as_ref()
        .filter(|f| !matches!(f, FaultAction::Throttle { .. }))
        .map(FaultAction::name);
    // The service does the work whether or not the caller waits for it,
    // as a real API does: a caller that gives up (or whose connection is
    // dropped) does not stop it.
    let serve = |router: Router, req: Request<Body>| async move {
        match tokio::spawn(router.oneshot(req)).await {
            Ok(r) => r.unwrap_or_else(|e| match e {}),
            Err(_) => errors::injected(
                500,
                "/",
                Some("the request's handler failed"),
                None,
                Default::default(),
            ),
        }
    };
    let mut response = match fault {
        Some(FaultAction::Drop) => {
            state
                .world()
                .record_call(&method, &path, &query, None, arrived, fault_name.as_deref());
            return Err(DroppedByFault);
        }
        Some(FaultAction::Delay { millis }) => {
            let (router, st, method, at, asked, named) = (
                router.clone(),
                state.clone(),
                method.clone(),
                path.clone(),
                query.clone(),
                fault_name.clone(),
            );
            // the request waits in the network or a queue, and is served
            // even if its caller has left meanwhile
            let served = tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(millis)).await;
                let r = serve(router, req).await;
                st.world().record_call(
                    &method,
                    &at,
                    &asked,
                    Some(r.status().as_u16()),
                    arrived,
                    named.as_deref(),
                );
                r
            });
            let mut r = served.await.unwrap_or_else(|_| {
                errors::injected(
                    500,
                    "/",
                    Some("the request's handler failed"),
                    None,
                    Default::default(),
                )
            });
            add_request_id(&mut r, &path, &request_id);
            add_date(&mut r, &state);
            return Ok(r);
        }
        Some(FaultAction::GatewayGaveUp {
            status,
            serve_after_millis,
        }) => {
            let (st, method, at, asked, named) = (
                state.clone(),
                method.clone(),
                path.clone(),
                query.clone(),
                fault_name.clone(),
            );
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(serve_after_millis)).await;
                let r = serve(router, req).await;
                st.world().record_call(
                    &method,
                    &at,
                    &asked,
                    Some(r.status().as_u16()),
                    arrived,
                    named.as_deref(),
                );
            });
            let mut r = errors::injected(
                status,
                &path,
                Some("the gateway gave up waiting for the service"),
                None,
                Default::default(),
            );
            add_request_id(&mut r, &path, &request_id);
            add_date(&mut r, &state);
            return Ok(r);
        }
        Some(FaultAction::LoseAnswer) => {
            let r = serve(router, req).await;
            state.world().record_call(
                &method,
                &path,
                &query,
                Some(r.status().as_u16()),
                arrived,
                fault_name.as_deref(),
            );
            return Err(DroppedByFault);
        }
        Some(FaultAction::HoldAnswer { millis }) => {
            let mut r = serve(router, req).await;
            state.world().record_call(
                &method,
                &path,
                &query,
                Some(r.status().as_u16()),
                arrived,
                fault_name.as_deref(),
            );
            tokio::time::sleep(Duration::from_millis(millis)).await;
            add_request_id(&mut r, &path, &request_id);
            add_date(&mut r, &state);
            return Ok(r);
        }
        Some(FaultAction::Status {
            status,
            message,
            retry_after,
            hint,
        }) => errors::injected(
            status,
            &path,
            message.as_deref(),
            retry_after.map(Duration::from_secs),
            hint,
        ),
        Some(FaultAction::Throttled { wait, hint }) => errors::injected(
            429,
            &path,
            Some("Rate limit exceeded: too many requests"),
            Some(wait),
            hint,
        ),
        Some(FaultAction::TokensExpired) => errors::token_expired(),
        Some(FaultAction::Json { status, body }) => {
            let mut r = axum::response::IntoResponse::into_response(axum::Json(body));
            *r.status_mut() =
                axum::http::StatusCode::from_u16(status).unwrap_or(axum::http::StatusCode::OK);
            r
        }
        // matched and let through (a throttle with a free slot)
        Some(FaultAction::Throttle { .. }) | None => serve(router, req).await,
    };
    if !path.starts_with("/_admin") {
        state.world().record_call(
            &method,
            &path,
            &query,
            Some(response.status().as_u16()),
            arrived,
            fault_name.as_deref(),
        );
    }
    add_request_id(&mut response, &path, &request_id);
    add_date(&mut response, &state);
    Ok(response)
}

/// The answer's `Date` by the cloud's clock (`clock_offset_secs` from
/// this machine's), as every OpenStack API sends one.
fn add_date(response: &mut Response<Body>, state: &AppState) {
    let offset = state.world().clock_offset_secs;
    let now = std::time::SystemTime::now();
    let at = if offset >= 0 {
        now + Duration::from_secs(offset.unsigned_abs())
    } else {
        now - Duration::from_secs(offset.unsigned_abs())
    };
    if let Ok(v) = HeaderValue::from_str(&httpdate::fmt_http_date(at)) {
        response.headers_mut().insert(http::header::DATE, v);
    }
}

fn add_request_id(response: &mut Response<Body>, path: &str, request_id: &str) {
    if let Ok(v) = HeaderValue::from_str(request_id) {
        response
            .headers_mut()
            .insert("x-openstack-request-id", v.clone());
        if path.starts_with("/compute") {
            response.headers_mut().insert("x-compute-request-id", v);
        }
    }
}
