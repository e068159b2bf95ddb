//! The keys the plugin holds: the current key-encryption key, the ones it
//! replaced, and any fetched on demand because a Decrypt named them. Keys
//! live only in memory (zeroed on drop); Encrypt, Decrypt and Status never
//! wait for Barbican unless a Decrypt names a key not held yet.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use ring::rand::SystemRandom;
use tokio::sync::Mutex;
use zeroize::Zeroizing;

use crate::envelope::{
    EnvelopeError, FORMAT_ANNOTATION, FORMAT_V1_NAME, Kek, MAX_CIPHERTEXT, MAX_KEY_ID,
    MIN_CIPHERTEXT,
};
use crate::keystore::{KeyStore, KeyStoreError};

#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum KeyRingError {
    #[error("not ready: {0}")]
    NotReady(String),
    #[error(transparent)]
    Envelope(#[from] EnvelopeError),
    #[error("key_id {0:?} is not a key_id of this plugin")]
    BadKeyId(String),
    /// The secret's payload no longer matches the key_id (its real
    /// fingerprint goes to the log, not to the caller).
    #[error(
        "key_id {key_id} names Barbican secret {secret}, whose payload changed since it was sealed"
    )]
    KeyChanged { key_id: String, secret: String },
    /// A key_id naming a secret the operator did not name: one answer for
    /// all of them, given before anything is fetched.
    #[error(
        "the ciphertext's key is not one this plugin decrypts with (the current key, keys it rotated from, --previous-key-id)"
    )]
    UnnamedKey,
    #[error("annotation {0}")]
    BadAnnotation(String),
    #[error("Barbican secret {secret} is unusable as a key: {source}")]
    BadKey {
        secret: String,
        source: EnvelopeError,
    },
    #[error(transparent)]
    Store(#[from] KeyStoreError),
}

#[derive(Debug)]
struct State {
    current_secret: String,
    /// Barbican secrets Decrypt may use: the current one, those it
    /// rotated from in this process, and `--previous-key-id`.
    named: BTreeSet<String>,
    current: Option<Arc<Kek>>,
    /// every key held, by key_id
    known: HashMap<String, Arc<Kek>>,
    last_refresh: Option<Instant>,
    last_error: Option<String>,
    refresh_failures: u64,
    /// A rotation the operator asked for that has not applied yet.
    pending: Option<PendingRotation>,
}

/// A key id the configuration names that is not the current key yet
/// (Barbican was unreachable, or refused it): remembered and retried until
/// it applies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingRotation {
    pub secret: String,
    pub since: Instant,
    pub attempts: u32,
    pub last_error: Option<String>,
}

/// What Status reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Health {
    /// The current key_id, or the configured secret while no key is held.
    pub key_id: String,
    /// `None` when healthy, else why not.
    pub problem: Option<String>,
    /// Healthy, but an operator should know (a rotation not applied yet).
    pub note: Option<String>,
}

pub struct KeyRing<S> {
    store: S,
    rng: SystemRandom,
    state: RwLock<State>,
    max_staleness: Duration,
    fetch_lock: Mutex<()>,
}

impl<S> std::fmt::Debug for KeyRing<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyRing").finish_non_exhaustive()
    }
}

impl<S: KeyStore> KeyRing<S> {
    pub fn new(store: S, current_secret: String, max_staleness: Duration) -> Self {
        Self {
            store,
            rng: SystemRandom::new(),
            state: RwLock::new(State {
                named: BTreeSet::from([current_secret.clone()]),
                current_secret,
                current: None,
                known: HashMap::new(),
                last_refresh: None,
                last_error: None,
                refresh_failures: 0,
                pending: None,
            }),
            max_staleness,
            fetch_lock: Mutex::new(()),
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, State> {
        self.state.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, State> {
        self.state.write().unwrap_or_else(|p| p.into_inner())
    }

    async fn fetch_kek(&self, secret: &str) -> Result<Kek, KeyRingError> {
        let payload = self.store.fetch(secret).await?;
        Kek::new(secret, &payload).map_err(|source| KeyRingError::BadKey {
            secret: secret.to_string(),
            source,
        })
    }

    /// Fetches the current secret again. A changed payload becomes the new
    /// current key; the previous one stays for Decrypt.
    pub async fn refresh(&self) -> Result<(), KeyRingError> {
        let secret = self.read().current_secret.clone();
        match self.fetch_kek(&secret).await {
            Ok(kek) => {
                let mut st = self.write();
                if st.current_secret != secret {
                    // rotated meanwhile; this fetch is for the old secret
                    st.known
                        .entry(kek.key_id().to_string())
                        .or_insert_with(|| Arc::new(kek));
                    return Ok(());
                }
                let kek = Arc::new(kek);
                if st.current.as_ref().map(|c| c.key_id()) != Some(kek.key_id()) {
                    tracing::info!(key_id = kek.key_id(), "current key-encryption key loaded");
                }
                st.known.insert(kek.key_id().to_string(), kek.clone());
                st.current = Some(kek);
                st.last_refresh = Some(Instant::now());
                st.last_error = None;
                Ok(())
            }
            Err(e) => {
                let mut st = self.write();
                st.refresh_failures += 1;
                st.last_error = Some(e.to_string());
                tracing::warn!(error = %e, failures = st.refresh_failures, "key refresh failed; serving from the cached key");
                Err(e)
            }
        }
    }

    /// Rotation: `secret` becomes the current key once fetched; the old
    /// key stays available for Decrypt.
    pub async fn rotate_to(&self, secret: &str) -> Result<(), KeyRingError> {
        let kek = Arc::new(self.fetch_kek(secret).await?);
        let mut st = self.write();
        st.current_secret = secret.to_string();
        st.named.insert(secret.to_string());
        st.known.insert(kek.key_id().to_string(), kek.clone());
        tracing::info!(key_id = kek.key_id(), "rotated to a new key-encryption key");
        st.current = Some(kek);
        st.last_refresh = Some(Instant::now());
        st.last_error = None;
        if st.pending.as_ref().is_some_and(|p| p.secret == secret) {
            st.pending = None;
        }
        Ok(())
    }

    /// The configuration names `secret` as the key: a rotation to it is
    /// pending until [`KeyRing::rotate_pending`] applies it (asking for the
    /// current key cancels a pending rotation). Returns whether this is a
    /// new request.
    pub fn want(&self, secret: &str) -> bool {
        let mut st = self.write();
        if st.current_secret == secret {
            return st.pending.take().is_some();
        }
        if st.pending.as_ref().is_some_and(|p| p.secret == secret) {
            return false;
        }
        st.pending = Some(PendingRotation {
            secret: secret.to_string(),
            since: Instant::now(),
            attempts: 0,
            last_error: None,
        });
        true
    }

    /// The Barbican secret of the current key.
    pub fn current_secret(&self) -> String {
        self.read().current_secret.clone()
    }

    pub fn pending(&self) -> Option<PendingRotation> {
        self.read().pending.clone()
    }

    /// One attempt at the pending rotation, if any: `None` when nothing is
    /// pending.
    pub async fn rotate_pending(&self) -> Option<Result<String, KeyRingError>> {
        let secret = self.read().pending.as_ref()?.secret.clone();
        Some(match self.rotate_to(&secret).await {
            Ok(()) => Ok(secret),
            Err(e) => {
                let mut st = self.write();
                if let Some(p) = st.pending.as_mut().filter(|p| p.secret == secret) {
                    p.attempts += 1;
                    p.last_error = Some(e.to_string());
                }
                Err(e)
            }
        })
    }

    /// Loads an older key so that Decrypt finds it without a round trip.
    /// Names earlier keys (`--previous-key-id`) Decrypt may use; they are
    /// fetched by [`KeyRing::load_previous`] or on first use.
    pub fn name_previous(&self, secrets: &[String]) {
        self.write().named.extend(secrets.iter().cloned());
    }

    fn is_named(&self, secret: &str) -> bool {
        self.read().named.contains(secret)
    }

    pub async fn load_previous(&self, secret: &str) -> Result<String, KeyRingError> {
        self.name_previous(&[secret.to_string()]);
        let kek = Arc::new(self.fetch_kek(secret).await?);
        let key_id = kek.key_id().to_string();
        self.write().known.insert(key_id.clone(), kek);
        Ok(key_id)
    }

    pub fn refresh_failures(&self) -> u64 {
        self.read().refresh_failures
    }

    /// Age of the current key since it was last confirmed in Barbican.
    pub fn key_age(&self) -> Option<Duration> {
        self.read().last_refresh.map(|t| t.elapsed())
    }

    /// Healthy only with a current key that passes an encrypt/decrypt
    /// self-test and was confirmed within the allowed staleness. Local:
    /// no remote call.
    pub fn health(&self) -> Health {
        let st = self.read();
        let Some(kek) = st.current.clone() else {
            let why = st
                .last_error
                .clone()
                .unwrap_or_else(|| "the key has not been fetched yet".into());
            return Health {
                key_id: st.current_secret.clone(),
                problem: Some(format!("no key-encryption key: {why}")),
                note: None,
            };
        };
        let key_id = kek.key_id().to_string();
        let probe = [0x5a_u8; 32];
        let self_test = kek
            .seal(&self.rng, &probe)
            .and_then(|ct| kek.open(&ct))
            .map(|pt| *pt == probe);
        if self_test != Ok(true) {
            return Health {
                key_id,
                problem: Some("the encrypt/decrypt self-test failed".into()),
                note: None,
            };
        }
        let age = st
            .last_refresh
            .map(|t| t.elapsed())
            .unwrap_or(Duration::MAX);
        if age > self.max_staleness {
            let why = st.last_error.clone().unwrap_or_default();
            return Health {
                key_id,
                problem: Some(format!(
                    "key not confirmed by Barbican for {}s (allowed {}s): {why}",
                    age.as_secs(),
                    self.max_staleness.as_secs()
                )),
                note: None,
            };
        }
        // a rotation that has not applied: the current key still works, so
        // healthy, until it has waited as long as an outage may last
        if let Some(p) = &st.pending {
            let waited = p.since.elapsed();
            let what = format!(
                "rotation to Barbican secret {} requested {}s ago has not applied ({} attempts{})",
                p.secret,
                waited.as_secs(),
                p.attempts,
                p.last_error
                    .as_deref()
                    .map(|e| format!(", last: {e}"))
                    .unwrap_or_default()
            );
            if waited > self.max_staleness {
                return Health {
                    key_id,
                    problem: Some(format!("{what}; allowed {}s", self.max_staleness.as_secs())),
                    note: None,
                };
            }
            return Health {
                key_id,
                problem: None,
                note: Some(format!("{what}; encrypting with the current key meanwhile")),
            };
        }
        Health {
            key_id,
            problem: None,
            note: None,
        }
    }

    /// Seals `plaintext` with the current key.
    pub fn encrypt(&self, plaintext: &[u8]) -> Result<(Vec<u8>, String), KeyRingError> {
        let kek =
            self.read().current.clone().ok_or_else(|| {
                KeyRingError::NotReady("the key-encryption key is not loaded".into())
            })?;
        let ct = kek.seal(&self.rng, plaintext)?;
        Ok((ct, kek.key_id().to_string()))
    }

    /// Opens a ciphertext with the key its `key_id` names, fetching that
    /// key from Barbican if it is not held.
    pub async fn decrypt(
        &self,
        ciphertext: &[u8],
        key_id: &str,
        annotations: &HashMap<String, Vec<u8>>,
    ) -> Result<Zeroizing<Vec<u8>>, KeyRingError> {
        if key_id.is_empty() || key_id.len() > MAX_KEY_ID {
            return Err(KeyRingError::BadKeyId(format!("{} bytes", key_id.len())));
        }
        // sizes first: nothing is fetched for a ciphertext no key opens
        if ciphertext.len() > MAX_CIPHERTEXT {
            return Err(EnvelopeError::CiphertextTooLong(ciphertext.len()).into());
        }
        if ciphertext.len() < MIN_CIPHERTEXT {
            return Err(EnvelopeError::CiphertextTooShort(ciphertext.len()).into());
        }
        match key_id.split_once(':') {
            Some((secret, fp)) => {
                for (k, v) in annotations {
                    if k != FORMAT_ANNOTATION {
                        return Err(KeyRingError::BadAnnotation(format!("{k:?} is unknown")));
                    }
                    if v.as_slice() != FORMAT_V1_NAME {
                        return Err(KeyRingError::BadAnnotation(format!(
                            "{k} = {:?} is not a format this plugin reads",
                            String::from_utf8_lossy(v)
                        )));
                    }
                }
                if !is_uuid(secret) || fp.len() != 16 || !fp.bytes().all(|b| b.is_ascii_hexdigit())
                {
                    return Err(KeyRingError::BadKeyId(key_id.to_string()));
                }
                if !self.is_named(secret) {
                    return Err(KeyRingError::UnnamedKey);
                }
                let kek = self.kek_by_key_id(key_id, secret).await?;
                Ok(kek.open(ciphertext)?)
            }
            None => {
                // the upstream plugin's key_id: the bare secret UUID
                if !is_uuid(key_id) {
                    return Err(KeyRingError::BadKeyId(key_id.to_string()));
                }
                if !annotations.is_empty() {
                    return Err(KeyRingError::BadAnnotation(
                        "legacy ciphertexts carry no annotations".into(),
                    ));
                }
                if !self.is_named(key_id) {
                    return Err(KeyRingError::UnnamedKey);
                }
                let kek = self.kek_by_secret(key_id).await?;
                Ok(kek.open_legacy(ciphertext)?)
            }
        }
    }

    async fn kek_by_key_id(&self, key_id: &str, secret: &str) -> Result<Arc<Kek>, KeyRingError> {
        if let Some(k) = self.read().known.get(key_id) {
            return Ok(k.clone());
        }
        // one fetch at a time: a burst of Decrypts for the same unknown
        // key waits for the first one's fetch
        let _guard = self.fetch_lock.lock().await;
        if let Some(k) = self.read().known.get(key_id) {
            return Ok(k.clone());
        }
        let kek = Arc::new(self.fetch_kek(secret).await?);
        if kek.key_id() != key_id {
            tracing::warn!(
                key_id,
                secret,
                actual = kek.key_id(),
                "a Decrypt names a key whose Barbican secret now holds another key"
            );
            return Err(KeyRingError::KeyChanged {
                key_id: key_id.to_string(),
                secret: secret.to_string(),
            });
        }
        tracing::info!(key_id, "fetched an older key-encryption key for Decrypt");
        self.write().known.insert(key_id.to_string(), kek.clone());
        Ok(kek)
    }

    async fn kek_by_secret(&self, secret: &str) -> Result<Arc<Kek>, KeyRingError> {
        let held = || {
            self.read()
                .known
                .values()
                .find(|k| k.secret_id() == secret)
                .cloned()
        };
        if let Some(k) = held() {
            return Ok(k);
        }
        let _guard = self.fetch_lock.lock().await;
        if let Some(k) = held() {
            return Ok(k);
        }
        let kek = Arc::new(self.fetch_kek(secret).await?);
        self.write()
            .known
            .insert(kek.key_id().to_string(), kek.clone());
        Ok(kek)
    }
}

fn is_uuid(s: &str) -> bool {
    s.len() == 36
        && s.char_indices().all(|(i, c)| {
            if matches!(i, 8 | 13 | 18 | 23) {
                c == '-'
            } else {
                c.is_ascii_hexdigit()
            }
        })
}
