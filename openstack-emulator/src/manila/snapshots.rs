//! Share snapshots: created (creating → available), listed, read and
//! deleted.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use http::StatusCode;
use serde_json::{Value, json};

use crate::AppState;
use crate::errors::{ApiErr, ApiResult};
use crate::keystone::Ctx;
use crate::state::{Delays, ShareSnapshotRec, new_id, now_iso};

use super::*;

pub(super) async fn create_snapshot(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
    Path(project): Path<String>,
    Json(body): Json<Value>,
) -> ApiResult<Response> {
    check_project(&ctx, &project)?;
    let spec = body
        .get("snapshot")
        .ok_or_else(|| ApiErr::bad(S, "Snapshot entity not found in request body"))?;
    let share_id = s(spec, "share_id")
        .ok_or_else(|| ApiErr::bad(S, "'share_id' is missing from the request body."))?;
    let mut w = state.world();
    let share = visible_share(&w, &ctx, &share_id)?.clone();
    let supports = w
        .share_types
        .iter()
        .find(|t| t.id == share.share_type_id)
        .is_some_and(|t| {
            t.extra_specs
                .get("snapshot_support")
                .is_some_and(|v| v.eq_ignore_ascii_case("true"))
        });
    if !supports {
        return Err(ApiErr::bad(
            S,
            format!(
                "Snapshots cannot be created for share '{share_id}' since it does not have that capability."
            ),
        ));
    }
    if share.status != "available" {
        return Err(ApiErr::bad(
            S,
            format!(
                "Invalid share: Source share status must be available, is {}.",
                share.status
            ),
        ));
    }
    let seq = w.next_seq();
    let snap = ShareSnapshotRec {
        seq,
        id: new_id(),
        project_id: ctx.project_id.clone(),
        name: s(spec, "name").unwrap_or_default(),
        description: s(spec, "description"),
        share_id,
        status: "creating".into(),
        size: share.size,
        created_at: now_iso(),
    };
    let id = snap.id.clone();
    let out = json!({ "snapshot": snapshot_json(&snap) });
    w.share_snapshots.insert(id.clone(), snap);
    let delay = Delays::d(w.delays.share_snapshot_ms);
    drop(w);
    state.after(delay, move |_, w| {
        if let Some(x) = w.share_snapshots.get_mut(&id)
            && x.status == "creating"
        {
            x.status = "available".into();
        }
    });
    Ok((StatusCode::ACCEPTED, Json(out)).into_response())
}

pub(super) async fn list_snapshots(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
    Path(project): Path<String>,
    Query(q): Query<BTreeMap<String, String>>,
) -> ApiResult<Json<Value>> {
    check_project(&ctx, &project)?;
    let w = state.world();
    let mut list: Vec<&ShareSnapshotRec> = w
        .share_snapshots
        .values()
        .filter(|x| x.project_id == ctx.project_id)
        .filter(|x| q.get("name").is_none_or(|n| &x.name == n))
        .filter(|x| q.get("share_id").is_none_or(|n| &x.share_id == n))
        .collect();
    list.sort_by_key(|x| std::cmp::Reverse(x.seq));
    if q.get("sort_dir").map(String::as_str) == Some("asc") {
        list.reverse();
    }
    let list: Vec<Value> = page(list, &q)?.into_iter().map(snapshot_json).collect();
    Ok(Json(json!({ "snapshots": list })))
}

pub(super) async fn get_snapshot(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
    Path((project, id)): Path<(String, String)>,
) -> ApiResult<Json<Value>> {
    check_project(&ctx, &project)?;
    let w = state.world();
    let x = w
        .share_snapshots
        .get(&id)
        .filter(|x| x.project_id == ctx.project_id || ctx.admin)
        .ok_or_else(|| ApiErr::not_found(S, format!("Snapshot {id} could not be found.")))?;
    Ok(Json(json!({ "snapshot": snapshot_json(x) })))
}

pub(super) async fn delete_snapshot(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
    Path((project, id)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    check_project(&ctx, &project)?;
    let mut w = state.world();
    let x = w
        .share_snapshots
        .get_mut(&id)
        .filter(|x| x.project_id == ctx.project_id || ctx.admin)
        .ok_or_else(|| ApiErr::not_found(S, format!("Snapshot {id} could not be found.")))?;
    x.status = "deleting".into();
    let delay = Delays::d(w.delays.share_snapshot_ms);
    drop(w);
    state.after(delay, move |_, w| {
        w.share_snapshots.remove(&id);
    });
    Ok(StatusCode::ACCEPTED)
}
