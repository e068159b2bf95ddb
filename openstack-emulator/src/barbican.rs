//! Barbican v1: secrets with payloads, and key orders (PENDING → ACTIVE).

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use base64::Engine as _;
use http::{HeaderMap, StatusCode};
use rand::RngCore;
use serde_json::{Value, json};

use crate::AppState;
use crate::errors::{ApiErr, ApiResult, Style};
use crate::keystone::Ctx;
use crate::state::{Delays, OrderRec, SecretRec, new_id, now_iso};

const S: Style = Style::Barbican;

pub fn routes() -> axum::Router<Arc<AppState>> {
    axum::Router::new()
        .route("/", get(versions))
        .route("/v1/secrets", get(list_secrets).post(create_secret))
        .route("/v1/secrets/{id}", get(get_secret).delete(delete_secret))
        .route("/v1/secrets/{id}/payload", get(get_payload))
        .route("/v1/orders", axum::routing::post(create_order))
        .route("/v1/orders/{id}", get(get_order))
}

async fn versions(State(state): State<Arc<AppState>>) -> Json<Value> {
    Json(
        json!({ "versions": { "values": [{ "id": "v1", "status": "stable",
        "links": [{ "rel": "self", "href": format!("{}key-manager/v1/", state.base_url) }] }] } }),
    )
}

fn secret_ref(state: &AppState, id: &str) -> String {
    format!("{}key-manager/v1/secrets/{id}", state.base_url)
}

fn secret_json(state: &AppState, s: &SecretRec) -> Value {
    json!({
        "secret_ref": secret_ref(state, &s.id), "name": s.name, "status": "ACTIVE", "algorithm": s.algorithm,
        "bit_length": s.bit_length, "mode": s.mode, "secret_type": s.secret_type, "created": s.created,
        "updated": s.created, "expiration": null, "creator_id": "u",
        "content_types": if s.payload.is_some() { json!({ "default": "application/octet-stream" }) } else { json!(null) }
    })
}

fn not_found() -> ApiErr {
    ApiErr::not_found(S, "Not Found. Sorry but your secret is in another castle.")
}

async fn create_secret(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
    Json(body): Json<Value>,
) -> ApiResult<Response> {
    let payload = match body.get("payload").and_then(Value::as_str) {
        None => None,
        Some(p) => {
            let ct = body
                .get("payload_content_type")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let enc = body
                .get("payload_content_encoding")
                .and_then(Value::as_str)
                .unwrap_or_default();
            match (ct, enc) {
                ("application/octet-stream", "base64") => Some(
                    base64::engine::general_purpose::STANDARD
                        .decode(p)
                        .map_err(|_| ApiErr::bad(S, "Provided object does not match schema 'Secret': payload is not base64"))?,
                ),
                ("text/plain", _) => Some(p.as_bytes().to_vec()),
                _ => return Err(ApiErr::bad(S, "Provided object does not match schema 'Secret': payload_content_type is not supported")),
            }
        }
    };
    if payload.as_ref().is_some_and(Vec::is_empty) {
        return Err(ApiErr::bad(
            S,
            "Provided object does not match schema 'Secret': If 'payload' specified, must be non empty",
        ));
    }
    let rec = SecretRec {
        id: new_id(),
        project_id: ctx.project_id.clone(),
        name: body.get("name").and_then(Value::as_str).map(str::to_string),
        payload,
        algorithm: body
            .get("algorithm")
            .and_then(Value::as_str)
            .map(str::to_string),
        bit_length: body
            .get("bit_length")
            .and_then(Value::as_u64)
            .map(|b| b as u32),
        mode: body.get("mode").and_then(Value::as_str).map(str::to_string),
        secret_type: body
            .get("secret_type")
            .and_then(Value::as_str)
            .unwrap_or("opaque")
            .to_string(),
        created: now_iso(),
    };
    let r = secret_ref(&state, &rec.id);
    state.world().secrets.insert(rec.id.clone(), rec);
    Ok((StatusCode::CREATED, Json(json!({ "secret_ref": r }))).into_response())
}

async fn list_secrets(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
    Query(q): Query<BTreeMap<String, String>>,
) -> Json<Value> {
    let w = state.world();
    let limit: usize = q.get("limit").and_then(|l| l.parse().ok()).unwrap_or(10);
    let offset: usize = q.get("offset").and_then(|l| l.parse().ok()).unwrap_or(0);
    let all: Vec<&SecretRec> = w
        .secrets
        .values()
        .filter(|s| s.project_id == ctx.project_id)
        .filter(|s| q.get("name").is_none_or(|n| s.name.as_ref() == Some(n)))
        .collect();
    let total = all.len();
    let page: Vec<Value> = all
        .into_iter()
        .skip(offset)
        .take(limit)
        .map(|s| secret_json(&state, s))
        .collect();
    Json(json!({ "secrets": page, "total": total }))
}

async fn get_secret(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    let w = state.world();
    let s = w
        .secrets
        .get(&id)
        .filter(|s| s.project_id == ctx.project_id)
        .ok_or_else(not_found)?;
    Ok(Json(secret_json(&state, s)))
}

async fn get_payload(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> ApiResult<Response> {
    let w = state.world();
    let s = w
        .secrets
        .get(&id)
        .filter(|s| s.project_id == ctx.project_id)
        .ok_or_else(not_found)?;
    let payload = s.payload.clone().ok_or_else(|| {
        ApiErr::not_found(S, "Not Found. Sorry but your payload is in another castle.")
    })?;
    let accept = headers
        .get("accept")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("*/*");
    if !(accept.contains("application/octet-stream") || accept.contains("*/*")) {
        return Err(ApiErr::new(
            406,
            S,
            format!("Wrong payload content-type: {accept}"),
        ));
    }
    Ok((
        [(http::header::CONTENT_TYPE, "application/octet-stream")],
        payload,
    )
        .into_response())
}

async fn delete_secret(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    let mut w = state.world();
    match w.secrets.get(&id) {
        Some(s) if s.project_id == ctx.project_id => {
            w.secrets.remove(&id);
            Ok(StatusCode::NO_CONTENT)
        }
        _ => Err(not_found()),
    }
}

async fn create_order(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
    Json(body): Json<Value>,
) -> ApiResult<Response> {
    if body.get("type").and_then(Value::as_str) != Some("key") {
        return Err(ApiErr::bad(
            S,
            "Provided object does not match schema 'Order': only 'key' orders are supported",
        ));
    }
    let meta = body.get("meta").cloned().unwrap_or(Value::Null);
    let algorithm = meta
        .get("algorithm")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_ascii_lowercase();
    let bits = meta.get("bit_length").and_then(Value::as_u64).unwrap_or(0);
    // like Barbican: an impossible AES bit length is refused up front, an
    // algorithm no plugin can generate is accepted and the order fails
    if algorithm == "aes" && !matches!(bits, 128 | 192 | 256) {
        return Err(ApiErr::bad(S, "Provided field value is not supported"));
    }
    let unsupported = algorithm != "aes";
    let order = OrderRec {
        id: new_id(),
        project_id: ctx.project_id.clone(),
        status: "PENDING".into(),
        secret_id: None,
        error_reason: None,
        created: now_iso(),
    };
    let oid = order.id.clone();
    let order_ref = format!("{}key-manager/v1/orders/{oid}", state.base_url);
    let mut w = state.world();
    w.orders.insert(oid.clone(), order);
    let delay = Delays::d(w.delays.order_ms);
    drop(w);
    let name = meta.get("name").and_then(Value::as_str).map(str::to_string);
    let mode = meta.get("mode").and_then(Value::as_str).map(str::to_string);
    let project = ctx.project_id.clone();
    state.after(delay, move |_, w| {
        if unsupported {
            if let Some(o) = w.orders.get_mut(&oid) {
                o.status = "ERROR".into();
                o.error_reason = Some(
                    "Process TypeOrder issue seen - Secret generate supported plugin not found.."
                        .into(),
                );
            }
            return;
        }
        let mut key = vec![0u8; (bits / 8) as usize];
        rand::rng().fill_bytes(&mut key);
        let secret = SecretRec {
            id: new_id(),
            project_id: project,
            name,
            payload: Some(key),
            algorithm: Some("aes".into()),
            bit_length: Some(bits as u32),
            mode,
            secret_type: "symmetric".into(),
            created: now_iso(),
        };
        let sid = secret.id.clone();
        w.secrets.insert(sid.clone(), secret);
        if let Some(o) = w.orders.get_mut(&oid) {
            o.status = "ACTIVE".into();
            o.secret_id = Some(sid);
        }
    });
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({ "order_ref": order_ref })),
    )
        .into_response())
}

async fn get_order(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    let w = state.world();
    let o = w
        .orders
        .get(&id)
        .filter(|o| o.project_id == ctx.project_id)
        .ok_or_else(|| {
            ApiErr::not_found(S, "Not Found. Sorry but your order is in another castle.")
        })?;
    Ok(Json(json!({
        "order_ref": format!("{}key-manager/v1/orders/{}", state.base_url, o.id), "type": "key", "status": o.status,
        "secret_ref": o.secret_id.as_ref().map(|s| secret_ref(&state, s)), "created": o.created,
        "error_reason": o.error_reason,
        "error_status_code": o.error_reason.as_ref().map(|_| "400")
    })))
}
