//! The KMS v2 gRPC service: the only place that sees tonic types. Every
//! error is mapped to a status here; no plaintext, key or ciphertext is
//! ever logged.

use std::collections::HashMap;
use std::sync::Arc;

use plugin_runtime::logging::caller_field;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use proto::kms::v2 as kms;
use proto::kms::v2::key_management_service_server::KeyManagementService;
use tonic::{Request, Response, Status};

use crate::envelope::{EnvelopeError, FORMAT_ANNOTATION, FORMAT_V1_NAME};
use crate::keyring::{KeyRing, KeyRingError};
use crate::keystore::{KeyStore, KeyStoreError};

/// Which key a refused Decrypt named: a retired key's Barbican secret,
/// or `unnamed` for any key the plugin does not decrypt with (bounded:
/// only keys the operator retired get a label of their own).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusedLabels {
    pub key: String,
}

#[derive(Debug)]
pub struct KmsService<S> {
    ring: Arc<KeyRing<S>>,
    refused: Family<RefusedLabels, Counter>,
}

impl<S> KmsService<S> {
    /// `refused` counts Decrypts refused for their key (registered by the
    /// plugin as `kms_decrypt_refused`).
    pub fn new(ring: Arc<KeyRing<S>>, refused: Family<RefusedLabels, Counter>) -> Self {
        Self { ring, refused }
    }
}

fn to_status(e: KeyRingError) -> Status {
    use EnvelopeError as E;
    match &e {
        KeyRingError::NotReady(_) => Status::unavailable(e.to_string()),
        KeyRingError::Envelope(E::Random) => Status::internal(e.to_string()),
        KeyRingError::Envelope(_)
        | KeyRingError::BadKeyId(_)
        | KeyRingError::BadAnnotation(_)
        | KeyRingError::UnnamedKey => Status::invalid_argument(e.to_string()),
        KeyRingError::KeyChanged { .. }
        | KeyRingError::BadKey { .. }
        | KeyRingError::RetiredKey { .. } => Status::failed_precondition(e.to_string()),
        KeyRingError::Record(_) => Status::unavailable(e.to_string()),
        KeyRingError::Store(KeyStoreError::NotFound(_)) => Status::not_found(e.to_string()),
        KeyRingError::Store(KeyStoreError::Denied { .. }) => {
            Status::permission_denied(e.to_string())
        }
        KeyRingError::Store(KeyStoreError::Unavailable(_)) => Status::unavailable(e.to_string()),
    }
}

#[tonic::async_trait]
impl<S: KeyStore> KeyManagementService for KmsService<S> {
    async fn status(
        &self,
        _r: Request<kms::StatusRequest>,
    ) -> Result<Response<kms::StatusResponse>, Status> {
        let h = self.ring.health();
        let healthz = match &h.problem {
            None => "ok".to_string(),
            Some(p) => {
                tracing::warn!(problem = %p, "unhealthy");
                p.clone()
            }
        };
        Ok(Response::new(kms::StatusResponse {
            version: "v2".into(),
            healthz,
            key_id: h.key_id,
        }))
    }

    async fn encrypt(
        &self,
        r: Request<kms::EncryptRequest>,
    ) -> Result<Response<kms::EncryptResponse>, Status> {
        let req = r.into_inner();
        let span = tracing::debug_span!("encrypt", uid = %caller_field(&req.uid), bytes = req.plaintext.len());
        let _e = span.enter();
        let (ciphertext, key_id) = self.ring.encrypt(&req.plaintext).map_err(to_status)?;
        let annotations = HashMap::from([(FORMAT_ANNOTATION.to_string(), FORMAT_V1_NAME.to_vec())]);
        Ok(Response::new(kms::EncryptResponse {
            ciphertext,
            key_id,
            annotations,
        }))
    }

    async fn decrypt(
        &self,
        r: Request<kms::DecryptRequest>,
    ) -> Result<Response<kms::DecryptResponse>, Status> {
        let req = r.into_inner();
        let plaintext = self
            .ring
            .decrypt(&req.ciphertext, &req.key_id, &req.annotations)
            .await
            .map_err(|e| {
                match &e {
                    KeyRingError::RetiredKey { secret } => {
                        // an object the migration missed: said loudly
                        tracing::warn!(uid = %caller_field(&req.uid), key_id = %caller_field(&req.key_id), error = %e, "decrypt refused: a retired key");
                        self.refused
                            .get_or_create(&RefusedLabels { key: secret.clone() })
                            .inc();
                    }
                    KeyRingError::UnnamedKey => {
                        tracing::info!(uid = %caller_field(&req.uid), key_id = %caller_field(&req.key_id), error = %e, "decrypt refused");
                        self.refused
                            .get_or_create(&RefusedLabels {
                                key: "unnamed".into(),
                            })
                            .inc();
                    }
                    _ => {
                        tracing::info!(uid = %caller_field(&req.uid), key_id = %caller_field(&req.key_id), error = %e, "decrypt refused")
                    }
                }
                to_status(e)
            })?;
        Ok(Response::new(kms::DecryptResponse {
            plaintext: plaintext.to_vec(),
        }))
    }
}
