//! Keystone v3: password, application-credential and token
//! authentication, scoped tokens with a catalog, and the `Ctx` extractor
//! every other service uses to authenticate a request.

use std::sync::Arc;
use std::time::SystemTime;

use axum::Json;
use axum::extract::{FromRequestParts, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use http::StatusCode;
use http::request::Parts;
use serde_json::{Value, json};

use crate::AppState;
use crate::errors::{ApiErr, ApiResult, Style};
use crate::state::{TokenInfo, new_id};

pub fn routes() -> axum::Router<Arc<AppState>> {
    axum::Router::new()
        .route("/v3", get(version))
        .route("/v3/", get(version))
        .route("/v3/auth/tokens", post(issue_token).get(validate_token))
        .route(
            "/v3/users/{user_id}/application_credentials",
            post(create_app_credential),
        )
        .route(
            "/v3/users/{user_id}/application_credentials/{id}",
            axum::routing::delete(delete_app_credential),
        )
}

fn own_credentials(ctx: &Ctx, user_id: &str) -> ApiResult<()> {
    if ctx.user_id != user_id {
        return Err(ApiErr::forbidden(
            Style::Keystone,
            "You are not authorized to perform the requested action: identity:create_application_credential.",
        ));
    }
    if ctx.app_cred_id.is_some() {
        return Err(ApiErr::forbidden(
            Style::Keystone,
            "Using method 'application_credential' is not allowed for managing additional application credentials.",
        ));
    }
    Ok(())
}

/// An application credential of the caller, for the caller's project; its
/// secret is shown once.
async fn create_app_credential(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
    axum::extract::Path(user_id): axum::extract::Path<String>,
    Json(body): Json<Value>,
) -> ApiResult<(http::StatusCode, Json<Value>)> {
    own_credentials(&ctx, &user_id)?;
    let name = field(&body, &["application_credential", "name"])
        .ok_or_else(|| ApiErr::bad(Style::Keystone, "'name' is a required property"))?
        .to_string();
    let mut w = state.world();
    if w.app_creds
        .iter()
        .any(|c| c.user_id == user_id && c.name == name)
    {
        return Err(ApiErr::conflict(
            Style::Keystone,
            format!(
                "Conflict occurred attempting to store application_credential - Duplicate entry found with name {name}."
            ),
        ));
    }
    let cred = crate::state::AppCred {
        id: new_id().replace('-', ""),
        name: name.clone(),
        secret: new_id(),
        user_id: user_id.clone(),
    };
    let out = json!({ "application_credential": {
        "id": cred.id, "name": name, "secret": cred.secret, "user_id": user_id,
        "project_id": ctx.project_id, "unrestricted": false, "expires_at": null
    }});
    w.app_creds.push(cred);
    Ok((http::StatusCode::CREATED, Json(out)))
}

/// Deletes one; the tokens issued for it stop working.
async fn delete_app_credential(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
    axum::extract::Path((user_id, id)): axum::extract::Path<(String, String)>,
) -> ApiResult<http::StatusCode> {
    own_credentials(&ctx, &user_id)?;
    let mut w = state.world();
    let before = w.app_creds.len();
    w.app_creds
        .retain(|c| !(c.id == id && c.user_id == user_id));
    if w.app_creds.len() == before {
        return Err(ApiErr::not_found(
            Style::Keystone,
            format!("Could not find application credential: {id}."),
        ));
    }
    w.tokens
        .retain(|_, t| t.app_cred_id.as_deref() != Some(id.as_str()));
    Ok(http::StatusCode::NO_CONTENT)
}

/// Who is calling: the validated token's user and project.
#[derive(Debug, Clone)]
pub struct Ctx {
    pub project_id: String,
    pub admin: bool,
    pub user_id: String,
    /// The application credential the token was issued for: such a token
    /// may not manage application credentials (Keystone's "restricted").
    pub app_cred_id: Option<String>,
}

impl FromRequestParts<Arc<AppState>> for Ctx {
    type Rejection = ApiErr;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &Arc<AppState>,
    ) -> Result<Self, Self::Rejection> {
        let token = parts
            .headers
            .get("x-auth-token")
            .and_then(|v| v.to_str().ok())
            .ok_or_else(ApiErr::unauthorized)?;
        let info = state
            .world()
            .validate_token(token)
            .ok_or_else(ApiErr::unauthorized)?;
        Ok(Ctx {
            project_id: info.project_id,
            admin: info.admin,
            user_id: info.user_id,
            app_cred_id: info.app_cred_id,
        })
    }
}

async fn version(State(state): State<Arc<AppState>>) -> Json<Value> {
    Json(json!({ "version": {
        "id": "v3.14", "status": "stable",
        "links": [{ "rel": "self", "href": format!("{}identity/v3/", state.base_url) }]
    }}))
}

fn field<'a>(v: &'a Value, path: &[&str]) -> Option<&'a str> {
    let mut cur = v;
    for p in path {
        cur = cur.get(p)?;
    }
    cur.as_str()
}

fn bad_auth(m: &str) -> ApiErr {
    ApiErr::new(401, Style::Keystone, m)
}

async fn issue_token(
    State(state): State<Arc<AppState>>,
    Json(body): Json<Value>,
) -> ApiResult<Response> {
    let identity = body
        .pointer("/auth/identity")
        .ok_or_else(|| ApiErr::bad(Style::Keystone, "Expecting to find identity in auth."))?;
    let methods: Vec<&str> = identity
        .get("methods")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut w = state.world();
    let mut app_cred = None;
    let user = if methods.contains(&"password") {
        let u = identity
            .pointer("/password/user")
            .ok_or_else(|| ApiErr::bad(Style::Keystone, "Expecting to find user in password."))?;
        let pw = field(u, &["password"]).unwrap_or_default();
        let found = if let Some(id) = field(u, &["id"]) {
            w.users.iter().find(|x| x.id == id)
        } else {
            let name = field(u, &["name"]).unwrap_or_default();
            let domain_ok = field(u, &["domain", "name"])
                .map(|d| d.eq_ignore_ascii_case(crate::DOMAIN))
                .unwrap_or(false)
                || field(u, &["domain", "id"]) == Some("default");
            if !domain_ok {
                return Err(bad_auth(
                    "The request you have made requires authentication.",
                ));
            }
            w.users.iter().find(|x| x.name == name)
        };
        match found {
            Some(u) if u.password == pw => u.clone(),
            _ => {
                return Err(bad_auth(
                    "The request you have made requires authentication.",
                ));
            }
        }
    } else if methods.contains(&"application_credential") {
        // (the credential's id is kept with the token: deleting the
        // credential revokes its tokens, as Keystone does)
        let ac = identity
            .get("application_credential")
            .cloned()
            .unwrap_or(Value::Null);
        let secret = field(&ac, &["secret"]).unwrap_or_default();
        let found = match (field(&ac, &["id"]), field(&ac, &["name"])) {
            (Some(id), _) => w.app_creds.iter().find(|c| c.id == id),
            (None, Some(name)) => w.app_creds.iter().find(|c| c.name == name),
            _ => None,
        };
        let cred = match found {
            Some(c) if c.secret == secret => {
                app_cred = Some(c.id.clone());
                c.clone()
            }
            Some(_) => {
                return Err(bad_auth(
                    "The request you have made requires authentication.",
                ));
            }
            // as Keystone: an unknown (deleted) credential is a 404
            None => {
                return Err(ApiErr::not_found(
                    Style::Keystone,
                    format!(
                        "Could not find Application Credential: {}.",
                        field(&ac, &["id"])
                            .or(field(&ac, &["name"]))
                            .unwrap_or_default()
                    ),
                ));
            }
        };
        w.users
            .iter()
            .find(|u| u.id == cred.user_id)
            .cloned()
            .ok_or_else(|| bad_auth("user gone"))?
    } else if methods.contains(&"token") {
        let presented = field(identity, &["token", "id"])
            .unwrap_or_default()
            .to_string();
        let info = w
            .validate_token(&presented)
            .ok_or_else(|| bad_auth("The request you have made requires authentication."))?;
        w.users
            .iter()
            .find(|u| u.id == info.user_id)
            .cloned()
            .ok_or_else(|| bad_auth("user gone"))?
    } else {
        return Err(bad_auth("Unsupported authentication method."));
    };

    // scope: explicit project, else the user's own (application
    // credentials are pre-scoped)
    let project = match body.pointer("/auth/scope/project") {
        Some(p) => {
            let found = if let Some(id) = field(p, &["id"]) {
                w.projects.iter().find(|x| x.id == id)
            } else {
                w.projects
                    .iter()
                    .find(|x| Some(x.name.as_str()) == field(p, &["name"]))
            };
            match found {
                Some(pr) if pr.id == user.project_id => pr.clone(),
                _ => return Err(bad_auth("User has no access to project")),
            }
        }
        None => w
            .projects
            .iter()
            .find(|p| p.id == user.project_id)
            .cloned()
            .ok_or_else(|| bad_auth("no project"))?,
    };
    let token = format!("gAAAA{}", new_id().replace('-', ""));
    let lifetime = w.token_lifetime;
    let expires = SystemTime::now() + lifetime;
    w.tokens.insert(
        token.clone(),
        TokenInfo {
            user_id: user.id.clone(),
            project_id: project.id.clone(),
            admin: user.admin,
            expires,
            app_cred_id: app_cred,
        },
    );
    let catalog = catalog(&state, &w.catalog_types, &project.id);
    drop(w);
    let expires_at = time::OffsetDateTime::now_utc() + lifetime;
    let expires_at = expires_at
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default();
    let roles = if user.admin {
        json!([{ "name": "admin" }, { "name": "member" }])
    } else {
        json!([{ "name": "member" }])
    };
    let body = json!({ "token": {
        "methods": methods,
        "expires_at": expires_at,
        "user": { "id": user.id, "name": user.name, "domain": { "id": "default", "name": crate::DOMAIN } },
        "project": { "id": project.id, "name": project.name, "domain": { "id": "default", "name": crate::DOMAIN } },
        "roles": roles,
        "catalog": catalog,
    }});
    let mut resp = (StatusCode::CREATED, Json(body)).into_response();
    if let Ok(v) = token.parse() {
        resp.headers_mut().insert("x-subject-token", v);
    }
    Ok(resp)
}

async fn validate_token(
    _caller: Ctx,
    State(state): State<Arc<AppState>>,
    headers: http::HeaderMap,
) -> ApiResult<StatusCode> {
    let subject = headers
        .get("x-subject-token")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    match state.world().validate_token(&subject) {
        Some(_) => Ok(StatusCode::OK),
        None => Err(ApiErr::not_found(Style::Keystone, "Could not find token.")),
    }
}

fn catalog(
    state: &AppState,
    types: &std::collections::BTreeMap<String, Vec<String>>,
    project_id: &str,
) -> Value {
    let base = state.base_url.as_str();
    let url_for = |service: &str| match service {
        "block-storage" => format!("{base}volume/v3/{project_id}"),
        "compute" => format!("{base}compute/v2.1"),
        "shared-file-system" => format!("{base}share/v2/{project_id}"),
        "key-manager" => format!("{base}key-manager"),
        _ => format!("{base}identity/v3"),
    };
    let mut entries = vec![entry(
        "identity",
        "keystone",
        &format!("{base}identity/v3"),
        &state.region,
    )];
    for (service, aliases) in types {
        for t in aliases {
            entries.push(entry(t, service, &url_for(service), &state.region));
        }
    }
    Value::Array(entries)
}

fn entry(service_type: &str, name: &str, url: &str, region: &str) -> Value {
    let eps: Vec<Value> = ["public", "internal", "admin"]
        .iter()
        .map(|i| json!({ "id": new_id(), "interface": i, "region": region, "region_id": region, "url": url }))
        .collect();
    json!({ "id": new_id(), "type": service_type, "name": name, "endpoints": eps })
}
