//! Cinder's attachments API (3.27+): the record behind each server's hold
//! on a volume, `reserved` → `attaching` → `attached`; created by Nova
//! (or anyone with the volume), completed by a compute host, deleted to
//! release the volume.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde_json::{Value, json};

use super::{CinderMv, S, check_project, visible_volume};
use crate::AppState;
use crate::errors::{ApiErr, ApiResult};
use crate::keystone::Ctx;
use crate::state::{AttachmentRec, PendingAttachmentRec, World, new_id};

const MIN_MINOR: u32 = 27;

fn check_mv(mv: u32) -> ApiResult<()> {
    if mv < MIN_MINOR {
        return Err(ApiErr::not_found(S, "The resource could not be found."));
    }
    Ok(())
}

fn attachment_json(id: &str, status: &str, server: &str, volume: &str) -> Value {
    json!({ "id": id, "status": status, "instance": server, "volume_id": volume })
}

/// Every attachment of the project's volumes: (id, status, server, volume).
fn all_attachments(w: &World, ctx: &Ctx) -> Vec<(String, String, String, String)> {
    let mut out = Vec::new();
    for v in w
        .volumes
        .values()
        .filter(|v| v.project_id == ctx.project_id || ctx.admin)
    {
        for a in &v.attachments {
            let status = if v.status == "detaching" {
                "detaching"
            } else {
                "attached"
            };
            out.push((
                a.attachment_id.clone(),
                status.to_string(),
                a.server_id.clone(),
                v.id.clone(),
            ));
        }
        for p in &v.pending_attachments {
            out.push((
                p.attachment_id.clone(),
                p.status.clone(),
                p.server_id.clone(),
                v.id.clone(),
            ));
        }
    }
    out
}

pub(super) async fn list_attachments(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
    Extension(CinderMv(mv)): Extension<CinderMv>,
    Path(project): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> ApiResult<Json<Value>> {
    check_project(&ctx, &project)?;
    check_mv(mv)?;
    let w = state.world();
    let list: Vec<Value> = all_attachments(&w, &ctx)
        .into_iter()
        .filter(|(_, _, server, volume)| {
            q.get("volume_id").is_none_or(|v| v == volume)
                && q.get("instance_id").is_none_or(|i| i == server)
        })
        .map(|(id, status, server, volume)| attachment_json(&id, &status, &server, &volume))
        .collect();
    Ok(Json(json!({ "attachments": list })))
}

pub(super) async fn create_attachment(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
    Extension(CinderMv(mv)): Extension<CinderMv>,
    Path(project): Path<String>,
    Json(body): Json<Value>,
) -> ApiResult<Response> {
    check_project(&ctx, &project)?;
    check_mv(mv)?;
    let spec = body
        .get("attachment")
        .ok_or_else(|| ApiErr::bad(S, "Missing required element 'attachment' in request body."))?;
    let field = |k: &str| spec.get(k).and_then(Value::as_str).map(str::to_string);
    let volume_id = field("volume_uuid")
        .ok_or_else(|| ApiErr::bad(S, "Invalid input received: volume_uuid is required"))?;
    let server_id = field("instance_uuid");
    let connected = spec.get("connector").is_some_and(|c| !c.is_null());
    let mut w = state.world();
    let v = visible_volume(&w, &ctx, &volume_id)?.clone();
    let ok = v.status == "available" || (v.multiattach && v.status == "in-use");
    if !ok {
        return Err(ApiErr::bad(
            S,
            format!(
                "Invalid volume: Volume {volume_id} status must be available or in-use (multiattach), but is {}",
                v.status
            ),
        ));
    }
    let status = if connected { "attaching" } else { "reserved" };
    let id = new_id();
    if let Some(v) = w.volumes.get_mut(&volume_id) {
        v.pending_attachments.push(PendingAttachmentRec {
            attachment_id: id.clone(),
            server_id: server_id.clone().unwrap_or_default(),
            status: status.into(),
        });
        if v.status == "available" {
            v.status = status.into();
            v.touch();
        }
    }
    Ok((
        StatusCode::OK,
        Json(json!({ "attachment": attachment_json(&id, status, &server_id.unwrap_or_default(), &volume_id) })),
    )
        .into_response())
}

pub(super) async fn attachment_action(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
    Extension(CinderMv(mv)): Extension<CinderMv>,
    Path((project, id)): Path<(String, String)>,
    Json(body): Json<Value>,
) -> ApiResult<StatusCode> {
    check_project(&ctx, &project)?;
    if mv < 44 || body.get("os-complete").is_none() {
        return Err(ApiErr::bad(S, "There is no such action"));
    }
    let mut w = state.world();
    let (vid, _) = find(&w, &ctx, &id)?;
    let Some(v) = w.volumes.get_mut(&vid) else {
        return Err(not_found(&id));
    };
    let Some(pos) = v
        .pending_attachments
        .iter()
        .position(|p| p.attachment_id == id)
    else {
        // completing an attached one again changes nothing
        return Ok(StatusCode::NO_CONTENT);
    };
    let p = v.pending_attachments.remove(pos);
    v.attachments.push(AttachmentRec {
        attachment_id: p.attachment_id,
        server_id: p.server_id,
        device: String::new(),
    });
    v.status = "in-use".into();
    v.touch();
    Ok(StatusCode::NO_CONTENT)
}

pub(super) async fn delete_attachment(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
    Extension(CinderMv(mv)): Extension<CinderMv>,
    Path((project, id)): Path<(String, String)>,
) -> ApiResult<Json<Value>> {
    check_project(&ctx, &project)?;
    check_mv(mv)?;
    let mut w = state.world();
    let (vid, _) = find(&w, &ctx, &id)?;
    if let Some(v) = w.volumes.get_mut(&vid) {
        v.pending_attachments.retain(|p| p.attachment_id != id);
        v.attachments.retain(|a| a.attachment_id != id);
        v.status = if !v.attachments.is_empty() {
            "in-use".into()
        } else if let Some(p) = v.pending_attachments.first() {
            p.status.clone()
        } else {
            "available".into()
        };
        v.touch();
    }
    Ok(Json(json!({ "attachments": [] })))
}

fn not_found(id: &str) -> ApiErr {
    ApiErr::not_found(S, format!("VolumeAttachment {id} could not be found."))
}

/// The volume and server of attachment `id`.
fn find(w: &World, ctx: &Ctx, id: &str) -> ApiResult<(String, String)> {
    all_attachments(w, ctx)
        .into_iter()
        .find(|(a, ..)| a == id)
        .map(|(_, _, server, volume)| (volume, server))
        .ok_or_else(|| not_found(id))
}
