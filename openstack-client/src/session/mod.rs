//! A Keystone v3 session: authenticates, caches the scoped token and its
//! catalog, refreshes the token before it expires, re-authenticates once on
//! a 401 (concurrent callers share that one re-authentication), finds
//! endpoints by service type and alias, and sends every request with
//! retries, metrics and a tracing span.
//!
//! The parts: [`options`] (what a caller sets), [`connection`] (one set of
//! credentials: its HTTP client, token and requests), [`tokens`] (what a
//! login sends and keeps), [`endpoints`] (catalog URLs and joining),
//! [`requests`] (what a service client sends and gets, and the retry
//! hints of a refusal), [`pacing`] (what is sent while a service
//! throttles), [`tls`].

mod connection;
mod endpoints;
mod options;
mod pacing;
mod requests;
mod tls;
mod tokens;

use std::sync::Arc;

use url::Url;

use crate::config::CloudConfig;
use crate::error::Result;
use crate::service::ServiceType;

use self::connection::Connection;

pub(crate) use self::endpoints::unversioned_root;
pub use self::options::{CatalogEndpoint, CatalogEntry, RetryPolicy, SessionOptions};
pub(crate) use self::requests::{ApiRequest, ApiResponse};
pub use self::requests::{MAX_RETRY_HINT, parse_retry_hint};
pub(crate) use self::tls::default_tls;

/// Cheap to clone; clones share the connection (HTTP client, token) and
/// see [`Session::reconfigure`] together: a request runs on the connection
/// current when it starts, so in-flight calls finish on the old
/// credentials while new calls use the new ones.
#[derive(Debug, Clone)]
pub struct Session {
    current: Arc<std::sync::RwLock<Connection>>,
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
