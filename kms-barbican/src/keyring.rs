//! The keys the plugin holds: the current key-encryption key, the ones it
//! replaced, and any fetched on demand because a Decrypt named them. Keys
//! live only in memory (zeroed on drop); Encrypt, Decrypt and Status never
//! wait for Barbican unless a Decrypt names a key not held yet.
//!
//! Which keys Decrypt may use: the current one; every key the plugin has
//! sealed under (its [`KeyRecord`], which outlives a restart); the keys
//! the configuration stages or keeps (`[KeyManager] decrypt-key-ids`) and
//! `--previous-key-id`; never a key the configuration retired
//! (`retired-key-ids`), which the record forgets.

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
use crate::key_record::{KeyRecord, KeyRecordError, RecordedKey, is_uuid};
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
        "the ciphertext's key is not one this plugin decrypts with (the current key, keys it has sealed under, [KeyManager] decrypt-key-ids, --previous-key-id)"
    )]
    UnnamedKey,
    /// A key the configuration retired (`retired-key-ids`): data still
    /// under it was not migrated.
    #[error(
        "the ciphertext is under Barbican secret {secret}, which [KeyManager] retired-key-ids retired: this object was not migrated (name the key in decrypt-key-ids instead, read the object and write it again)"
    )]
    RetiredKey { secret: String },
    #[error(transparent)]
    Record(#[from] KeyRecordError),
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
    /// Barbican secrets Decrypt may use besides the recorded ones: the
    /// current one, those it rotated from in this process, and
    /// `--previous-key-id`.
    named: BTreeSet<String>,
    /// `[KeyManager] decrypt-key-ids`, as last read.
    staged: BTreeSet<String>,
    /// `[KeyManager] retired-key-ids`, as last read.
    retired: BTreeSet<String>,
    /// The keys sealed under, by key_id, as the record holds them.
    recorded: Vec<RecordedKey>,
    /// Why the record was refused, if it was: Status is unhealthy and
    /// Encrypt refuses until an operator looks at it.
    record_problem: Option<String>,
    /// Why the last write of the record failed, until one succeeds:
    /// Encrypt under a key the record lacks refuses meanwhile, and Status
    /// says so.
    record_write_problem: Option<String>,
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
    record: KeyRecord,
    /// One writer of the record at a time.
    record_lock: std::sync::Mutex<()>,
}

impl<S> std::fmt::Debug for KeyRing<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyRing").finish_non_exhaustive()
    }
}

impl<S: KeyStore> KeyRing<S> {
    /// A ring whose current key is `current_secret`, recording the keys
    /// it seals under in `record` (loaded here: a refused record makes the
    /// ring unhealthy, see [`KeyRing::health`]).
    pub fn new(
        store: S,
        current_secret: String,
        max_staleness: Duration,
        record: KeyRecord,
    ) -> Self {
        let (recorded, record_problem) = match record.load() {
            Ok(keys) => (keys, None),
            Err(e) => {
                tracing::error!(error = %e, "the key record is refused: Encrypt refuses and Status is unhealthy until it is fixed (it is left as it is)");
                (Vec::new(), Some(e.to_string()))
            }
        };
        if !recorded.is_empty() {
            tracing::info!(
                keys = recorded.len(),
                path = %record.path().display(),
                "keys this plugin sealed under, from its record, are usable by Decrypt"
            );
        }
        Self {
            store,
            rng: SystemRandom::new(),
            record,
            record_lock: std::sync::Mutex::new(()),
            state: RwLock::new(State {
                named: BTreeSet::from([current_secret.clone()]),
                staged: BTreeSet::new(),
                retired: BTreeSet::new(),
                recorded,
                record_problem,
                record_write_problem: None,
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

    /// Whether Decrypt may use `secret`: `Err` names why not.
    fn may_decrypt(&self, secret: &str) -> Result<(), KeyRingError> {
        let st = self.read();
        if st.current_secret == secret {
            return Ok(());
        }
        if st.retired.contains(secret) {
            return Err(KeyRingError::RetiredKey {
                secret: secret.to_string(),
            });
        }
        if st.named.contains(secret)
            || st.staged.contains(secret)
            || st.recorded.iter().any(|k| k.secret == secret)
        {
            Ok(())
        } else {
            Err(KeyRingError::UnnamedKey)
        }
    }

    /// The Barbican secrets of the recorded keys (loaded at start, like
    /// `--previous-key-id`).
    pub fn recorded_secrets(&self) -> Vec<String> {
        self.read()
            .recorded
            .iter()
            .map(|k| k.secret.clone())
            .collect()
    }

    /// The configuration's `decrypt-key-ids` and `retired-key-ids`, at
    /// start and on every change: staged keys become usable, retired ones
    /// unusable and forgotten by the record (the current key cannot be
    /// retired). Returns what changed, for the reload's log.
    pub fn configure_keys(&self, decrypt: &[String], retired: &[String]) -> Vec<String> {
        let mut changes = Vec::new();
        let current = self.current_secret();
        let retired: BTreeSet<String> = retired
            .iter()
            .filter(|r| {
                if **r == current {
                    tracing::error!(secret = %r, "[KeyManager] retired-key-ids names the current key: ignored (rotate away from it first)");
                    false
                } else {
                    true
                }
            })
            .cloned()
            .collect();
        let staged: BTreeSet<String> = decrypt
            .iter()
            .filter(|d| !retired.contains(*d))
            .cloned()
            .collect();
        {
            let mut st = self.write();
            if st.staged != staged {
                changes.push(format!(
                    "keys Decrypt may use besides the current one: {}",
                    listed(&staged)
                ));
                st.staged = staged;
            }
            if st.retired != retired {
                changes.push(format!("retired keys: {}", listed(&retired)));
                st.retired = retired.clone();
                // a retired key's in-memory copy goes too
                st.known.retain(|_, k| !retired.contains(k.secret_id()));
                st.named.retain(|n| !retired.contains(n));
            }
        }
        match self.forget_recorded(&retired) {
            Ok(gone) => {
                for k in gone {
                    changes.push(format!("key {k} removed from the key record"));
                }
            }
            Err(e) => {
                tracing::error!(error = %e, "retired keys could not be removed from the key record");
                changes.push(format!("retired keys stay in the key record: {e}"));
            }
        }
        changes
    }

    /// Removes the keys of `retired` secrets from the record; their ids.
    fn forget_recorded(&self, retired: &BTreeSet<String>) -> Result<Vec<String>, KeyRingError> {
        let _writer = self.record_lock.lock().unwrap_or_else(|p| p.into_inner());
        let (keep, gone): (Vec<RecordedKey>, Vec<RecordedKey>) = {
            let st = self.read();
            if st.record_problem.is_some() {
                return Ok(Vec::new());
            }
            st.recorded
                .iter()
                .cloned()
                .partition(|k| !retired.contains(&k.secret))
        };
        if gone.is_empty() {
            return Ok(Vec::new());
        }
        self.record.save(&keep)?;
        self.write().recorded = keep;
        Ok(gone.into_iter().map(|k| k.key_id).collect())
    }

    /// Records `kek` as a key sealed under, unless it is already: the
    /// record is on disk before the first ciphertext under a key leaves.
    fn ensure_recorded(&self, kek: &Kek) -> Result<(), KeyRingError> {
        let listed = |st: &State| st.recorded.iter().any(|k| k.key_id == kek.key_id());
        // (a refused record never gets here: Encrypt answers with it first)
        if listed(&self.read()) {
            return Ok(());
        }
        let _writer = self.record_lock.lock().unwrap_or_else(|p| p.into_inner());
        let mut keys = {
            let st = self.read();
            if listed(&st) {
                return Ok(());
            }
            st.recorded.clone()
        };
        keys.push(RecordedKey {
            secret: kek.secret_id().to_string(),
            key_id: kek.key_id().to_string(),
            first_sealed: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
        });
        if let Err(e) = self.record.save(&keys) {
            tracing::error!(error = %e, key_id = kek.key_id(), "the key record could not be written: Encrypt under this key refuses until it can");
            self.write().record_write_problem = Some(e.to_string());
            return Err(e.into());
        }
        tracing::info!(key_id = kek.key_id(), path = %self.record.path().display(), "key recorded: Decrypt uses it after a restart too");
        let mut st = self.write();
        st.recorded = keys;
        st.record_write_problem = None;
        Ok(())
    }

    pub async fn load_previous(&self, secret: &str) -> Result<String, KeyRingError> {
        if self.read().retired.contains(secret) {
            return Err(KeyRingError::RetiredKey {
                secret: secret.to_string(),
            });
        }
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
        if let Some(p) = &st.record_problem {
            return Health {
                key_id: st
                    .current
                    .as_ref()
                    .map_or_else(|| st.current_secret.clone(), |k| k.key_id().to_string()),
                problem: Some(format!(
                    "the key record is refused: {p}; move it aside only once every key it lists is named in [KeyManager] decrypt-key-ids"
                )),
                note: None,
            };
        }
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
        if let Some(p) = &st.record_write_problem
            && !st.recorded.iter().any(|k| k.key_id == key_id)
        {
            // Encrypt refuses under a key the record lacks: Status says
            // what Encrypt answers
            return Health {
                key_id,
                problem: Some(format!(
                    "the current key is not in the key record, which cannot be written: {p}"
                )),
                note: None,
            };
        }
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
        // a refused record is the answer whatever else is the matter: it
        // lasts until an operator acts, unlike a key not fetched yet
        if let Some(p) = &self.read().record_problem {
            return Err(KeyRingError::NotReady(format!(
                "the key record is refused ({p}); nothing is encrypted until it is fixed"
            )));
        }
        let kek =
            self.read().current.clone().ok_or_else(|| {
                KeyRingError::NotReady("the key-encryption key is not loaded".into())
            })?;
        self.ensure_recorded(&kek)?;
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
                self.may_decrypt(secret)?;
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
                self.may_decrypt(key_id)?;
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

/// `a, b`, or `none`: a set of secrets as the reload's log says it.
fn listed(secrets: &BTreeSet<String>) -> String {
    if secrets.is_empty() {
        "none".to_string()
    } else {
        secrets.iter().cloned().collect::<Vec<_>>().join(", ")
    }
}
