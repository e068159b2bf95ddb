//! What a caller sets on a session, and the catalog entries it reads.

use std::time::Duration;

use serde::Deserialize;

use crate::metrics::ApiMetrics;

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
