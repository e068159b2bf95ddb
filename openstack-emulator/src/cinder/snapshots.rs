//! Snapshots: creating → available → deleting → gone.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use http::StatusCode;
use serde_json::{Value, json};

use super::*;
use crate::AppState;
use crate::errors::{ApiErr, ApiResult};
use crate::keystone::Ctx;
use crate::state::{Delays, SnapshotRec, new_id, now_iso};

pub(super) fn snapshot_json(s: &SnapshotRec) -> Value {
    json!({
        "id": s.id, "name": s.name, "description": s.description, "status": s.status, "size": s.size,
        "volume_id": s.volume_id, "metadata": s.metadata, "created_at": s.created_at, "updated_at": null,
        "group_snapshot_id": s.group_snapshot_id
    })
}

pub(super) async fn create_snapshot(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
    Path(project): Path<String>,
    Json(body): Json<Value>,
) -> ApiResult<Response> {
    check_project(&ctx, &project)?;
    let spec = body
        .get("snapshot")
        .ok_or_else(|| ApiErr::bad(S, "Missing required element 'snapshot' in request body."))?;
    let volume_id = str_field(spec, "volume_id")
        .ok_or_else(|| ApiErr::bad(S, "Invalid input received: volume_id is required"))?;
    let force = match spec.get("force") {
        Some(Value::Bool(b)) => *b,
        Some(Value::String(s)) => s.eq_ignore_ascii_case("true"),
        _ => false,
    };
    let mut w = state.world();
    let v = visible_volume(&w, &ctx, &volume_id)?.clone();
    let ok = v.status == "available" || (v.status == "in-use" && force);
    if !ok {
        return Err(ApiErr::bad(
            S,
            format!(
                "Invalid volume: Volume {volume_id} status must be available, but current status is: {}.",
                v.status
            ),
        ));
    }
    let used = w
        .snapshots
        .values()
        .filter(|s| s.project_id == ctx.project_id)
        .count() as i64;
    if w.quotas.snapshots >= 0 && used + 1 > w.quotas.snapshots {
        return Err(over_limit("snapshots", w.quotas.snapshots));
    }
    let metadata = crate::state::metadata_of(spec);
    let seq = w.next_seq();
    let snap = SnapshotRec {
        seq,
        id: new_id(),
        project_id: ctx.project_id.clone(),
        name: str_field(spec, "name").unwrap_or_default(),
        description: str_field(spec, "description"),
        status: "creating".into(),
        size: v.size,
        volume_id,
        metadata,
        group_snapshot_id: None,
        created_at: now_iso(),
    };
    let id = snap.id.clone();
    if let Some(hv) = &state.hypervisor
        && let Err(e) = hv.copy_data(
            &snap.volume_id,
            &crate::hypervisor::Hypervisor::snapshot_key(&id),
        )
    {
        tracing::error!(snapshot = %id, error = %e, "could not copy the volume's data");
    }
    let body = json!({ "snapshot": snapshot_json(&snap) });
    w.snapshots.insert(id.clone(), snap);
    let delay = Delays::d(w.delays.snapshot_create_ms);
    drop(w);
    state.after(delay, move |_, w| {
        if let Some(s) = w.snapshots.get_mut(&id)
            && s.status == "creating"
        {
            s.status = "available".into();
        }
    });
    Ok((StatusCode::ACCEPTED, Json(body)).into_response())
}

pub(super) async fn list_snapshots(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
    Path(project): Path<String>,
    uri: http::Uri,
    Query(q): Query<BTreeMap<String, String>>,
) -> ApiResult<Json<Value>> {
    check_project(&ctx, &project)?;
    let filter = crate::state::metadata_filter(&q, S)?;
    let w = state.world();
    let items = w
        .snapshots
        .values()
        .filter(|s| s.project_id == ctx.project_id)
        .filter(|s| q.get("name").is_none_or(|n| &s.name == n))
        .filter(|s| crate::state::metadata_matches(&s.metadata, filter.as_ref()))
        .filter(|s| q.get("volume_id").is_none_or(|v| &s.volume_id == v))
        .filter(|s| q.get("status").is_none_or(|st| &s.status == st))
        .map(|s| (s.seq, s.id.clone(), snapshot_json(s)))
        .collect();
    let limit = parse_limit(&q)?;
    let (page, next) = paginate(items, limit, q.get("marker").map(String::as_str))?;
    let mut body = json!({ "snapshots": page });
    if let Some(m) = next {
        body["snapshots_links"] =
            json!([{ "rel": "next", "href": next_href(&state, &uri, limit, &m) }]);
    }
    Ok(Json(body))
}

pub(super) async fn get_snapshot(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
    Path((project, id)): Path<(String, String)>,
) -> ApiResult<Json<Value>> {
    check_project(&ctx, &project)?;
    let w = state.world();
    let s = w
        .snapshots
        .get(&id)
        .filter(|s| s.project_id == ctx.project_id || ctx.admin)
        .ok_or_else(|| ApiErr::not_found(S, format!("Snapshot {id} could not be found.")))?;
    Ok(Json(json!({ "snapshot": snapshot_json(s) })))
}

pub(super) async fn delete_snapshot(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
    Path((project, id)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    check_project(&ctx, &project)?;
    let mut w = state.world();
    let s = w
        .snapshots
        .get_mut(&id)
        .filter(|s| s.project_id == ctx.project_id || ctx.admin)
        .ok_or_else(|| ApiErr::not_found(S, format!("Snapshot {id} could not be found.")))?;
    if s.group_snapshot_id.is_some() {
        return Err(ApiErr::bad(
            S,
            "Invalid snapshot: Snapshot status must be available or error and must not be part of a group.",
        ));
    }
    if !matches!(s.status.as_str(), "available" | "error" | "error_deleting") {
        return Err(ApiErr::bad(
            S,
            format!(
                "Invalid snapshot: Snapshot status must be available or error, but is {}.",
                s.status
            ),
        ));
    }
    s.status = "deleting".into();
    let delay = Delays::d(w.delays.snapshot_delete_ms);
    drop(w);
    state.after(delay, move |st, w| {
        w.snapshots.remove(&id);
        if let Some(hv) = &st.hypervisor {
            hv.forget_snapshot(&id);
        }
    });
    Ok(StatusCode::ACCEPTED)
}
