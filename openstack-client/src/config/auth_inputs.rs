//! Credentials as gathered from clouds.yaml, an INI section or a
//! Secret, before they are checked and turned into a [`CloudConfig`].

use std::collections::BTreeMap;
use std::path::PathBuf;

use url::Url;

use crate::secret::SecretString;
use crate::service::{Interface, ServiceType};

use super::*;

/// Credentials gathered from clouds.yaml and/or an INI section before they
/// are checked and turned into a [`CloudConfig`].
#[derive(Debug, Clone, Default)]
pub(crate) struct AuthInputs {
    pub auth_url: Option<String>,
    pub username: Option<String>,
    pub user_id: Option<String>,
    pub password: Option<SecretString>,
    pub project_id: Option<String>,
    pub project_name: Option<String>,
    pub project_domain_id: Option<String>,
    pub project_domain_name: Option<String>,
    pub user_domain_id: Option<String>,
    pub user_domain_name: Option<String>,
    pub domain_id: Option<String>,
    pub domain_name: Option<String>,
    pub region: Option<String>,
    pub interface: Option<String>,
    pub ca_file: Option<String>,
    pub ca_pem: Option<String>,
    pub insecure: Option<bool>,
    pub cert_file: Option<String>,
    pub key_file: Option<String>,
    pub cert_pem: Option<String>,
    pub key_pem: Option<SecretString>,
    pub trust_id: Option<String>,
    pub app_cred_id: Option<String>,
    pub app_cred_name: Option<String>,
    pub app_cred_secret: Option<SecretString>,
    pub token: Option<SecretString>,
    pub endpoint_overrides: BTreeMap<ServiceType, String>,
}

impl AuthInputs {
    pub(super) fn overlay_ini(&mut self, s: &gcfg::Section) {
        let get = |k: &str| s.get(k).map(|e| e.value.clone()).filter(|v| !v.is_empty());
        let set = |slot: &mut Option<String>, v: Option<String>| {
            if v.is_some() {
                *slot = v;
            }
        };
        set(&mut self.auth_url, get("auth-url"));
        set(&mut self.username, get("username"));
        set(&mut self.user_id, get("user-id"));
        set(
            &mut self.project_id,
            get("tenant-id").or_else(|| get("project-id")),
        );
        set(
            &mut self.project_name,
            get("tenant-name").or_else(|| get("project-name")),
        );
        set(
            &mut self.project_domain_id,
            get("tenant-domain-id").or_else(|| get("project-domain-id")),
        );
        set(
            &mut self.project_domain_name,
            get("tenant-domain-name").or_else(|| get("project-domain-name")),
        );
        set(&mut self.user_domain_id, get("user-domain-id"));
        set(&mut self.user_domain_name, get("user-domain-name"));
        set(&mut self.domain_id, get("domain-id"));
        set(&mut self.domain_name, get("domain-name"));
        set(&mut self.region, get("region"));
        set(&mut self.interface, get("os-endpoint-type"));
        set(&mut self.ca_file, get("ca-file"));
        set(&mut self.cert_file, get("cert-file"));
        set(&mut self.key_file, get("key-file"));
        set(&mut self.trust_id, get("trust-id"));
        set(&mut self.app_cred_id, get("application-credential-id"));
        set(&mut self.app_cred_name, get("application-credential-name"));
        if let Some(v) = get("tls-insecure") {
            self.insecure = Some(matches!(
                v.to_ascii_lowercase().as_str(),
                "true" | "yes" | "on" | "1"
            ));
        }
        if let Some(v) = get("password") {
            self.password = Some(SecretString::new(v));
        }
        if let Some(v) = get("application-credential-secret") {
            self.app_cred_secret = Some(SecretString::new(v));
        }
        if let Some(v) = get("token") {
            self.token = Some(SecretString::new(v));
        }
        // a trust is used by the trustee: its id and password stand in
        // for the user
        if self.trust_id.is_some() {
            if let Some(v) = get("trustee-id") {
                self.user_id = Some(v);
            }
            if let Some(v) = get("trustee-password") {
                self.password = Some(SecretString::new(v));
            }
        }
    }

    pub(crate) fn resolve(self, name: &str, section: &str) -> Result<CloudConfig, ConfigError> {
        let missing = |key: &str, hint: Option<&str>| ConfigError::MissingKey {
            section: section.to_string(),
            key: key.to_string(),
            hint: hint.map(str::to_string),
        };
        let bad = |key: &str, message: String| ConfigError::InvalidValue {
            file: PathBuf::new(),
            line: 0,
            section: section.to_string(),
            key: key.to_string(),
            message,
        };
        let auth_url_raw = self
            .auth_url
            .clone()
            .ok_or_else(|| missing("auth-url", None))?;
        let auth_url = parse_auth_url(&auth_url_raw).map_err(|m| bad("auth-url", m))?;
        let user_domain = self
            .user_domain_id
            .clone()
            .map(DomainRef::Id)
            .or_else(|| self.user_domain_name.clone().map(DomainRef::Name))
            .or_else(|| self.domain_id.clone().map(DomainRef::Id))
            .or_else(|| self.domain_name.clone().map(DomainRef::Name));
        let user = || -> Result<UserRef, ConfigError> {
            if let Some(id) = &self.user_id {
                return Ok(UserRef::Id(id.clone()));
            }
            let name = self
                .username
                .clone()
                .ok_or_else(|| missing("username", Some("or user-id")))?;
            let domain = user_domain.clone().ok_or_else(|| {
                missing(
                    "user-domain-name",
                    Some("a user given by name needs user-domain-name or user-domain-id"),
                )
            })?;
            Ok(UserRef::Name { name, domain })
        };

        let auth = if let Some(secret) = self.app_cred_secret.clone() {
            if let Some(id) = &self.app_cred_id {
                AuthMethod::ApplicationCredentialId {
                    id: id.clone(),
                    secret,
                }
            } else if let Some(n) = &self.app_cred_name {
                AuthMethod::ApplicationCredentialName {
                    name: n.clone(),
                    user: user()?,
                    secret,
                }
            } else {
                return Err(missing(
                    "application-credential-id",
                    Some("or application-credential-name"),
                ));
            }
        } else if self.app_cred_id.is_some() || self.app_cred_name.is_some() {
            return Err(missing("application-credential-secret", None));
        } else if let Some(token) = self.token.clone() {
            AuthMethod::Token { token }
        } else {
            let password = self
                .password
                .clone()
                .ok_or_else(|| missing("password", None))?;
            AuthMethod::Password {
                user: user()?,
                password,
            }
        };

        let scope = match (&auth, &self.trust_id) {
            (
                AuthMethod::ApplicationCredentialId { .. }
                | AuthMethod::ApplicationCredentialName { .. },
                _,
            ) => None,
            (_, Some(trust)) => Some(Scope::Trust(trust.clone())),
            _ => {
                if let Some(id) = &self.project_id {
                    Some(Scope::Project(ProjectRef::Id(id.clone())))
                } else if let Some(pname) = &self.project_name {
                    let domain = self
                        .project_domain_id
                        .clone()
                        .map(DomainRef::Id)
                        .or_else(|| self.project_domain_name.clone().map(DomainRef::Name))
                        .or_else(|| user_domain.clone())
                        .ok_or_else(|| {
                            missing(
                                "tenant-domain-name",
                                Some("a project given by name needs its domain"),
                            )
                        })?;
                    Some(Scope::Project(ProjectRef::Name {
                        name: pname.clone(),
                        domain,
                    }))
                } else {
                    return Err(missing(
                        "tenant-id",
                        Some("or tenant-name: the project to scope the token to"),
                    ));
                }
            }
        };

        let interface = match &self.interface {
            Some(i) => i
                .parse::<Interface>()
                .map_err(|m| bad("os-endpoint-type", m))?,
            None => Interface::Public,
        };
        let has_cert = self.cert_file.is_some() || self.cert_pem.is_some();
        let has_key = self.key_file.is_some() || self.key_pem.is_some();
        if has_cert != has_key {
            return Err(missing(
                if has_cert { "key-file" } else { "cert-file" },
                Some("a TLS client certificate needs both cert-file and key-file"),
            ));
        }
        let mut endpoint_overrides = BTreeMap::new();
        for (svc, raw) in &self.endpoint_overrides {
            let url = Url::parse(raw)
                .map_err(|e| bad(&format!("{svc}_endpoint_override"), e.to_string()))?;
            endpoint_overrides.insert(*svc, url);
        }
        Ok(CloudConfig {
            name: name.to_string(),
            auth_url,
            auth,
            scope,
            region: self.region.clone(),
            interface,
            tls: TlsOptions {
                ca_file: self.ca_file.as_ref().map(PathBuf::from),
                ca_pem: self.ca_pem.clone(),
                insecure: self.insecure.unwrap_or(false),
                cert_file: self.cert_file.as_ref().map(PathBuf::from),
                key_file: self.key_file.as_ref().map(PathBuf::from),
                cert_pem: self.cert_pem.clone(),
                key_pem: self.key_pem.clone(),
            },
            endpoint_overrides,
        })
    }
}
