//! A Keystone token and its catalog, and what a login sends for it.

use std::time::{Duration, Instant};

use serde_json::json;
use url::Url;

use crate::config::{AuthMethod, CloudConfig, DomainRef, ProjectRef, Scope, UserRef};
use crate::secret::SecretString;

use super::options::CatalogEntry;

#[derive(Debug)]
pub(super) struct Token {
    pub(super) value: SecretString,
    pub(super) issued: Instant,
    pub(super) expires: Instant,
    pub(super) project_id: Option<String>,
    pub(super) user_id: Option<String>,
    pub(super) catalog: Vec<CatalogEntry>,
}

impl Token {
    pub(super) fn fresh(&self, margin: Duration, now: Instant) -> bool {
        let lifetime = self.expires.saturating_duration_since(self.issued);
        let margin = margin.min(lifetime / 2);
        now + margin < self.expires
    }
}

pub(super) fn tokens_url(auth_url: &Url) -> Url {
    let mut u = auth_url.clone();
    let path = u.path().trim_end_matches('/').to_string();
    let base = if path.ends_with("/v3") {
        path
    } else {
        format!("{path}/v3")
    };
    u.set_path(&format!("{base}/auth/tokens"));
    u
}

pub(super) fn domain_json(d: &DomainRef) -> serde_json::Value {
    match d {
        DomainRef::Id(id) => json!({ "id": id }),
        DomainRef::Name(n) => json!({ "name": n }),
    }
}

pub(super) fn user_json(u: &UserRef) -> serde_json::Value {
    match u {
        UserRef::Id(id) => json!({ "id": id }),
        UserRef::Name { name, domain } => json!({ "name": name, "domain": domain_json(domain) }),
    }
}

pub(super) fn auth_body(cfg: &CloudConfig) -> serde_json::Value {
    let identity = match &cfg.auth {
        AuthMethod::Password { user, password } => {
            let mut u = user_json(user);
            u["password"] = json!(password.expose());
            json!({ "methods": ["password"], "password": { "user": u } })
        }
        AuthMethod::ApplicationCredentialId { id, secret } => {
            json!({ "methods": ["application_credential"], "application_credential": { "id": id, "secret": secret.expose() } })
        }
        AuthMethod::ApplicationCredentialName { name, user, secret } => json!({
            "methods": ["application_credential"],
            "application_credential": { "name": name, "secret": secret.expose(), "user": user_json(user) }
        }),
        AuthMethod::Token { token } => {
            json!({ "methods": ["token"], "token": { "id": token.expose() } })
        }
    };
    let mut auth = json!({ "identity": identity });
    match &cfg.scope {
        Some(Scope::Project(ProjectRef::Id(id))) => {
            auth["scope"] = json!({ "project": { "id": id } })
        }
        Some(Scope::Project(ProjectRef::Name { name, domain })) => {
            auth["scope"] = json!({ "project": { "name": name, "domain": domain_json(domain) } })
        }
        Some(Scope::Trust(id)) => auth["scope"] = json!({ "OS-TRUST:trust": { "id": id } }),
        None => {}
    }
    json!({ "auth": auth })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_url() {
        let u = |s: &str| Url::parse(s).unwrap();
        assert_eq!(
            tokens_url(&u("http://k:5000")).as_str(),
            "http://k:5000/v3/auth/tokens"
        );
        assert_eq!(
            tokens_url(&u("http://k/identity/v3/")).as_str(),
            "http://k/identity/v3/auth/tokens"
        );
    }
}
