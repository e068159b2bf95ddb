//! Which OpenStack session serves a request: the credentials in its CSI
//! secrets (upstream's `os-*` keys), a cloud.conf cloud the secret names
//! (`cloud` key), or the plugin's own cloud.conf.
//!
//! One Keystone session per distinct credential set, kept in a small LRU
//! cache keyed by a digest of the secret's values: a request with the same
//! secret reuses the token, a changed secret (a rotated password) gets a
//! new session at once, and an idle one is dropped when the cache is full.
//! What is cached is the driver's client built on the session (`C`), so
//! that what the client learns once (a negotiated microversion) is kept
//! with the token.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::Instant;

use openstack_client::config::ConfigEnv;
use openstack_client::config::secrets::{cloud_from_secrets, has_credentials, unknown_keys};
use openstack_client::{Session, SessionOptions};

use crate::errors::{DriverError, DriverResult};

/// Sessions kept for secrets-borne credentials.
pub const DEFAULT_CACHE_SIZE: usize = 32;

/// Where a request's session came from (for logs and metrics; never the
/// credentials themselves).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// `[Global]` or `[Global "name"]` of the plugin's cloud.conf.
    CloudConf(String),
    /// The request's secrets; the digest's first bytes tell sets apart.
    Secrets(String),
}

#[derive(Debug)]
struct Cached<C> {
    client: C,
    used: Instant,
}

/// Builds the driver's client on a session.
pub type MakeClient<C> = std::sync::Arc<dyn Fn(Session) -> C + Send + Sync>;

pub struct Credentials<C> {
    /// Clouds of the plugin's cloud.conf, by `[Global "name"]` (`""` is
    /// `[Global]`).
    clouds: BTreeMap<String, C>,
    cache: Mutex<HashMap<[u8; 32], Cached<C>>>,
    capacity: usize,
    options: SessionOptions,
    env: ConfigEnv,
    make: MakeClient<C>,
}

impl<C> std::fmt::Debug for Credentials<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("clouds", &self.clouds.keys().collect::<Vec<_>>())
            .field("capacity", &self.capacity)
            .finish()
    }
}

fn digest(secrets: &BTreeMap<String, String>) -> [u8; 32] {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    for (k, v) in secrets {
        // lengths first: ("ab","c") and ("a","bc") must differ
        ctx.update(&(k.len() as u64).to_be_bytes());
        ctx.update(k.as_bytes());
        ctx.update(&(v.len() as u64).to_be_bytes());
        ctx.update(v.as_bytes());
    }
    let mut out = [0u8; 32];
    out.copy_from_slice(ctx.finish().as_ref());
    out
}

impl<C: Clone> Credentials<C> {
    /// `clouds`: sessions for the plugin's cloud.conf (may be empty);
    /// `options`: for sessions built from secrets (metrics, timeouts);
    /// `make`: the client a request gets.
    pub fn new(
        clouds: BTreeMap<String, Session>,
        options: SessionOptions,
        env: ConfigEnv,
        make: MakeClient<C>,
    ) -> Self {
        Self {
            clouds: clouds.into_iter().map(|(n, s)| (n, make(s))).collect(),
            cache: Mutex::new(HashMap::new()),
            capacity: DEFAULT_CACHE_SIZE,
            options,
            env,
            make,
        }
    }

    pub fn with_capacity(mut self, capacity: usize) -> Self {
        self.capacity = capacity.max(1);
        self
    }

    /// Whether the plugin has credentials of its own (calls that carry no
    /// secrets, such as ListVolumes, need them).
    pub fn has_own(&self) -> bool {
        !self.clouds.is_empty()
    }

    /// The session of the plugin's own default cloud (`[Global]`, else the
    /// first configured one).
    pub fn own(&self) -> DriverResult<(C, Source)> {
        self.clouds
            .get("")
            .map(|s| (s.clone(), Source::CloudConf(String::new())))
            .or_else(|| {
                self.clouds
                    .iter()
                    .next()
                    .map(|(n, s)| (s.clone(), Source::CloudConf(n.clone())))
            })
            .ok_or_else(|| {
                DriverError::FailedPrecondition(
                    "this call carries no secrets and the plugin has no --cloud-config credentials"
                        .into(),
                )
            })
    }

    /// How many secret-borne sessions are cached.
    pub fn cached(&self) -> usize {
        self.cache.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// The client for a request's secrets.
    pub fn client_for(&self, secrets: &HashMap<String, String>) -> DriverResult<(C, Source)> {
        let sorted: BTreeMap<String, String> = secrets
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        if has_credentials(&sorted) {
            return self.client_from_secrets(&sorted);
        }
        if let Some(name) = sorted.get("cloud") {
            return self
                .clouds
                .get(name)
                .map(|s| (s.clone(), Source::CloudConf(name.clone())))
                .ok_or_else(|| {
                    DriverError::InvalidArgument(format!(
                        "the secret's cloud {name:?} is not a cloud of the plugin's --cloud-config"
                    ))
                });
        }
        if self.clouds.is_empty() {
            return Err(DriverError::InvalidArgument(
                "no OpenStack credentials: give the StorageClass secrets with os-authURL and the other os-* keys, or start the plugin with --cloud-config".into(),
            ));
        }
        self.own()
    }

    fn client_from_secrets(&self, secrets: &BTreeMap<String, String>) -> DriverResult<(C, Source)> {
        let os: BTreeMap<String, String> = secrets
            .iter()
            .filter(|(k, _)| k.starts_with("os-"))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let key = digest(&os);
        let label: String = key[..4].iter().map(|b| format!("{b:02x}")).collect();
        {
            let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(c) = cache.get_mut(&key) {
                c.used = Instant::now();
                return Ok((c.client.clone(), Source::Secrets(label)));
            }
        }
        let unknown = unknown_keys(&os);
        if !unknown.is_empty() {
            tracing::warn!(keys = ?unknown, "unknown keys in the CSI secret are ignored");
        }
        let config = cloud_from_secrets(&os, &self.env)
            .map_err(|e| DriverError::InvalidArgument(format!("credentials in the secret: {e}")))?;
        let session = Session::new(config, self.options.clone())
            .map_err(|e| DriverError::InvalidArgument(format!("credentials in the secret: {e}")))?;
        tracing::info!(credentials = %label, "new Keystone session for a secret's credentials");
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        while cache.len() >= self.capacity {
            let Some(oldest) = cache.iter().min_by_key(|(_, c)| c.used).map(|(k, _)| *k) else {
                break;
            };
            cache.remove(&oldest);
        }
        // a racing request may have built one meanwhile: keep the first
        let c = cache.entry(key).or_insert_with(|| Cached {
            client: (self.make)(session),
            used: Instant::now(),
        });
        Ok((c.client.clone(), Source::Secrets(label)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secrets(pw: &str) -> HashMap<String, String> {
        [
            ("os-authURL", "http://127.0.0.1:1/identity/v3"),
            ("os-userName", "demo"),
            ("os-password", pw),
            ("os-projectName", "demo"),
            ("os-domainName", "Default"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
    }

    fn plain() -> Credentials<Session> {
        Credentials::new(
            BTreeMap::new(),
            SessionOptions::default(),
            ConfigEnv::default(),
            std::sync::Arc::new(|s| s),
        )
    }

    #[test]
    fn one_session_per_credential_set_bounded() {
        let c = plain().with_capacity(2);
        let (a, sa) = c.client_for(&secrets("one")).unwrap();
        let (b, sb) = c.client_for(&secrets("one")).unwrap();
        assert_eq!(sa, sb);
        assert!(a.same(&b), "the same session is reused");
        let (_, sc) = c.client_for(&secrets("two")).unwrap();
        assert_ne!(sa, sc, "a changed password is a new session");
        c.client_for(&secrets("three")).unwrap();
        assert_eq!(c.cached(), 2);
    }

    #[test]
    fn no_credentials_anywhere_is_a_clear_refusal() {
        let c = plain();
        let e = c.client_for(&HashMap::new()).unwrap_err();
        assert!(matches!(e, DriverError::InvalidArgument(_)), "{e}");
        let mut bad = secrets("x");
        bad.remove("os-authURL");
        let e = c.client_for(&bad).unwrap_err().to_string();
        assert!(e.contains("os-authURL") && !e.contains("x\""), "{e}");
        let e = c
            .client_for(&HashMap::from([("cloud".to_string(), "other".to_string())]))
            .unwrap_err();
        assert!(matches!(e, DriverError::InvalidArgument(_)), "{e}");
    }
}
