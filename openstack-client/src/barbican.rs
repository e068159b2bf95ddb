//! Barbican v1: secrets and key orders.

use std::time::{Duration, Instant};

use base64::Engine as _;
use http::{HeaderName, Method};
use serde::Deserialize;
use serde_json::{Value, json};
use zeroize::{Zeroize, Zeroizing};

use crate::cinder::seg;
use crate::common::{Poll, poll_until};
use crate::error::{Error, Result};
use crate::service::ServiceType;
use crate::session::{ApiRequest, Session};

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct SecretMetadata {
    pub secret_ref: String,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub status: Option<String>,
    #[serde(default)]
    pub algorithm: Option<String>,
    #[serde(default)]
    pub bit_length: Option<u32>,
    #[serde(default)]
    pub mode: Option<String>,
    #[serde(default)]
    pub secret_type: Option<String>,
    #[serde(default)]
    pub created: Option<String>,
    #[serde(default)]
    pub expiration: Option<String>,
}

impl SecretMetadata {
    /// The UUID at the end of `secret_ref`.
    pub fn uuid(&self) -> &str {
        uuid_of(&self.secret_ref)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Order {
    pub order_ref: String,
    pub status: String,
    #[serde(default)]
    pub secret_ref: Option<String>,
    #[serde(default)]
    pub error_reason: Option<String>,
    #[serde(default)]
    pub error_status_code: Option<Value>,
}

/// A secret to store.
#[derive(Clone, Default)]
pub struct CreateSecret {
    pub name: String,
    pub payload: Option<Zeroizing<Vec<u8>>>,
    pub algorithm: Option<String>,
    pub bit_length: Option<u32>,
    pub mode: Option<String>,
    /// `symmetric`, `opaque`, `passphrase`, ...
    pub secret_type: String,
}

impl std::fmt::Debug for CreateSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CreateSecret")
            .field("name", &self.name)
            .field("payload", &self.payload.as_ref().map(|_| "<redacted>"))
            .field("algorithm", &self.algorithm)
            .field("bit_length", &self.bit_length)
            .finish()
    }
}

/// The Barbican v1 API. Cheap to clone.
#[derive(Debug, Clone)]
pub struct KeyManager {
    session: Session,
    deadline: Option<Instant>,
}

pub(crate) fn uuid_of(reference: &str) -> &str {
    reference
        .trim_end_matches('/')
        .rsplit('/')
        .next()
        .unwrap_or(reference)
}

impl KeyManager {
    pub fn new(session: Session) -> Self {
        Self {
            session,
            deadline: None,
        }
    }

    pub fn with_deadline(&self, deadline: Instant) -> Self {
        Self {
            deadline: Some(deadline),
            ..self.clone()
        }
    }

    fn req(&self, method: Method, path: impl Into<String>, op: &'static str) -> ApiRequest {
        ApiRequest::new(ServiceType::KeyManager, method, path, op).deadline(self.deadline)
    }

    pub async fn get_secret(&self, uuid: &str) -> Result<SecretMetadata> {
        self.session
            .send(self.req(Method::GET, format!("secrets/{}", seg(uuid)), "secret_get"))
            .await?
            .json()
    }

    /// The raw payload bytes, in a buffer wiped on drop.
    pub async fn get_secret_payload(&self, uuid: &str) -> Result<Zeroizing<Vec<u8>>> {
        let req = self
            .req(
                Method::GET,
                format!("secrets/{}/payload", seg(uuid)),
                "secret_payload_get",
            )
            .header(
                HeaderName::from_static("accept"),
                "application/octet-stream",
            );
        let resp = self.session.send(req).await?;
        let out = Zeroizing::new(resp.body.to_vec());
        // wipe the transport buffer too when we hold its only reference
        if let Ok(mut owned) = resp.body.try_into_mut() {
            owned.as_mut().zeroize();
        }
        Ok(out)
    }

    /// Stores a secret; returns its UUID.
    pub async fn create_secret(&self, spec: &CreateSecret) -> Result<String> {
        let mut body = json!({ "name": spec.name, "secret_type": spec.secret_type });
        if let Some(p) = &spec.payload {
            body["payload"] = json!(base64::engine::general_purpose::STANDARD.encode(p.as_slice()));
            body["payload_content_type"] = json!("application/octet-stream");
            body["payload_content_encoding"] = json!("base64");
        }
        if let Some(a) = &spec.algorithm {
            body["algorithm"] = json!(a);
        }
        if let Some(b) = spec.bit_length {
            body["bit_length"] = json!(b);
        }
        if let Some(m) = &spec.mode {
            body["mode"] = json!(m);
        }
        #[derive(Deserialize)]
        struct Created {
            secret_ref: String,
        }
        let created: Created = self
            .session
            .send(
                self.req(Method::POST, "secrets", "secret_create")
                    .json(body),
            )
            .await?
            .json()?;
        Ok(uuid_of(&created.secret_ref).to_string())
    }

    /// Orders a new symmetric key generated by Barbican; returns the order
    /// UUID.
    pub async fn create_key_order(
        &self,
        name: &str,
        algorithm: &str,
        bit_length: u32,
        mode: &str,
    ) -> Result<String> {
        let body = json!({ "type": "key", "meta": {
            "name": name, "algorithm": algorithm, "bit_length": bit_length, "mode": mode,
            "payload_content_type": "application/octet-stream"
        }});
        #[derive(Deserialize)]
        struct Created {
            order_ref: String,
        }
        let created: Created = self
            .session
            .send(self.req(Method::POST, "orders", "order_create").json(body))
            .await?
            .json()?;
        Ok(uuid_of(&created.order_ref).to_string())
    }

    pub async fn get_order(&self, uuid: &str) -> Result<Order> {
        self.session
            .send(self.req(Method::GET, format!("orders/{}", seg(uuid)), "order_get"))
            .await?
            .json()
    }

    /// Waits until the order is `ACTIVE` and returns its secret's UUID.
    pub async fn wait_for_order(&self, uuid: &str, deadline: Instant) -> Result<String> {
        let this = self.with_deadline(deadline);
        poll_until(
            "order_wait",
            deadline,
            Duration::from_millis(100),
            Duration::from_secs(2),
            || {
                let this = this.clone();
                async move {
                    let o = this.get_order(uuid).await?;
                    match o.status.as_str() {
                        "ACTIVE" => match &o.secret_ref {
                            Some(r) => Ok(Poll::Ready(uuid_of(r).to_string())),
                            None => Err(Error::InvalidResponse {
                                operation: "order_wait",
                                message: "ACTIVE order without secret_ref".into(),
                            }),
                        },
                        "ERROR" => Err(Error::ResourceFailed {
                            operation: "order_wait",
                            id: uuid.to_string(),
                            status: "ERROR".into(),
                            detail: o.error_reason.clone(),
                        }),
                        other => Ok(Poll::Pending(other.to_string())),
                    }
                }
            },
        )
        .await
    }

    /// Secrets, optionally filtered by name.
    pub async fn list_secrets(
        &self,
        name: Option<&str>,
        limit: u32,
        offset: u32,
    ) -> Result<Vec<SecretMetadata>> {
        let mut req = self
            .req(Method::GET, "secrets", "secret_list")
            .query("limit", limit)
            .query("offset", offset);
        if let Some(n) = name {
            req = req.query("name", n);
        }
        #[derive(Deserialize)]
        struct L {
            secrets: Vec<SecretMetadata>,
        }
        Ok(self.session.send(req).await?.json::<L>()?.secrets)
    }

    pub async fn delete_secret(&self, uuid: &str) -> Result<()> {
        self.session
            .send(self.req(
                Method::DELETE,
                format!("secrets/{}", seg(uuid)),
                "secret_delete",
            ))
            .await?;
        Ok(())
    }
}
