//! Keystone beyond authentication: the caller's application credentials,
//! which operators rotate (create a new one, move the plugins to it,
//! delete the old one).

use http::Method;
use serde::Deserialize;
use serde_json::json;

use crate::cinder::seg;
use crate::error::{Error, Result};
use crate::secret::SecretString;
use crate::service::ServiceType;
use crate::session::{ApiRequest, Session};

#[derive(Debug, Clone)]
pub struct Identity {
    session: Session,
}

/// A new application credential: its secret is shown only once.
#[derive(Debug, Clone)]
pub struct ApplicationCredential {
    pub id: String,
    pub name: String,
    pub secret: SecretString,
}

impl Identity {
    pub fn new(session: Session) -> Self {
        Self { session }
    }

    async fn user_path(&self) -> Result<String> {
        let user = self
            .session
            .user_id()
            .await?
            .ok_or_else(|| Error::InvalidResponse {
                operation: "token_issue",
                message: "the token names no user".into(),
            })?;
        Ok(format!("users/{}/application_credentials", seg(&user)))
    }

    /// An application credential of the session's user, for its project.
    pub async fn create_application_credential(&self, name: &str) -> Result<ApplicationCredential> {
        #[derive(Deserialize)]
        struct Created {
            id: String,
            name: String,
            secret: String,
        }
        #[derive(Deserialize)]
        struct E {
            application_credential: Created,
        }
        let path = self.user_path().await?;
        let e: E = self
            .session
            .send(
                ApiRequest::new(
                    ServiceType::Identity,
                    Method::POST,
                    path,
                    "application_credential_create",
                )
                .json(json!({ "application_credential": { "name": name } })),
            )
            .await?
            .json()?;
        Ok(ApplicationCredential {
            id: e.application_credential.id,
            name: e.application_credential.name,
            secret: SecretString::new(e.application_credential.secret),
        })
    }

    /// Deletes one; Keystone revokes the tokens issued for it.
    pub async fn delete_application_credential(&self, id: &str) -> Result<()> {
        let path = format!("{}/{}", self.user_path().await?, seg(id));
        self.session
            .send(ApiRequest::new(
                ServiceType::Identity,
                Method::DELETE,
                path,
                "application_credential_delete",
            ))
            .await?;
        Ok(())
    }
}
