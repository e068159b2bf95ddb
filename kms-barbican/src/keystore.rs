//! Where key-encryption keys come from: Barbican in production, anything
//! implementing [`KeyStore`] in tests.

use std::future::Future;
use std::time::{Duration, Instant};

use openstack_client::barbican::KeyManager;
use zeroize::Zeroizing;

#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum KeyStoreError {
    #[error("Barbican secret {0} does not exist (or is not visible to these credentials)")]
    NotFound(String),
    #[error("Barbican refused access to secret {id}: {message}")]
    Denied { id: String, message: String },
    #[error("Barbican is unavailable: {0}")]
    Unavailable(String),
}

pub trait KeyStore: Send + Sync + 'static {
    /// The payload of secret `id`.
    fn fetch(
        &self,
        id: &str,
    ) -> impl Future<Output = Result<Zeroizing<Vec<u8>>, KeyStoreError>> + Send;
}

/// Barbican, through the suite's OpenStack client.
#[derive(Debug, Clone)]
pub struct BarbicanKeyStore {
    client: KeyManager,
    timeout: Duration,
}

impl BarbicanKeyStore {
    pub fn new(client: KeyManager, timeout: Duration) -> Self {
        Self { client, timeout }
    }
}

impl KeyStore for BarbicanKeyStore {
    async fn fetch(&self, id: &str) -> Result<Zeroizing<Vec<u8>>, KeyStoreError> {
        use openstack_client::Error;
        let started = Instant::now();
        let result = self
            .client
            .with_deadline(started + self.timeout)
            .get_secret_payload(id)
            .await;
        match result {
            Ok(key) => {
                tracing::debug!(
                    secret = id,
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    "fetched a key from Barbican"
                );
                Ok(key)
            }
            Err(Error::NotFound(_)) => Err(KeyStoreError::NotFound(id.to_string())),
            Err(e @ (Error::Unauthorized(_) | Error::Forbidden(_))) => Err(KeyStoreError::Denied {
                id: id.to_string(),
                message: e.to_string(),
            }),
            Err(e) => Err(KeyStoreError::Unavailable(e.to_string())),
        }
    }
}
