//! Backups: creating → available → deleting → gone, restored into new
//! volumes (`backup_id` on volume create, microversion 3.47) through
//! `restoring`. A backup copies the volume's (or its snapshot's) data and
//! outlives the volume, as Cinder's backup service does.

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
use crate::hypervisor::Hypervisor;
use crate::keystone::Ctx;
use crate::state::{BackupRec, Delays, new_id, now_iso};

/// Key of a backup's data for [`Hypervisor::copy_data`].
pub fn backup_key(backup_id: &str) -> String {
    format!("backup-{backup_id}")
}

fn backup_json(b: &BackupRec) -> Value {
    json!({
        "id": b.id, "name": b.name, "description": b.description, "status": b.status,
        "size": b.size, "volume_id": b.volume_id, "snapshot_id": b.snapshot_id,
        "availability_zone": b.availability_zone, "metadata": b.metadata,
        "fail_reason": b.fail_reason, "container": "backups", "object_count": 0,
        "is_incremental": false, "has_dependent_backups": false,
        "created_at": b.created_at, "updated_at": null, "data_timestamp": b.created_at,
        "links": []
    })
}

fn visible_backup<'a>(w: &'a crate::state::World, ctx: &Ctx, id: &str) -> ApiResult<&'a BackupRec> {
    w.backups
        .get(id)
        .filter(|b| b.project_id == ctx.project_id || ctx.admin)
        .ok_or_else(|| ApiErr::not_found(S, format!("Backup {id} could not be found.")))
}

pub(super) async fn create_backup(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
    Path(project): Path<String>,
    Json(body): Json<Value>,
) -> ApiResult<Response> {
    check_project(&ctx, &project)?;
    let spec = body
        .get("backup")
        .ok_or_else(|| ApiErr::bad(S, "Missing required element 'backup' in request body."))?;
    let volume_id = str_field(spec, "volume_id")
        .ok_or_else(|| ApiErr::bad(S, "Invalid input received: volume_id is required"))?;
    let snapshot_id = str_field(spec, "snapshot_id");
    let force = match spec.get("force") {
        Some(Value::Bool(b)) => *b,
        Some(Value::String(s)) => s.eq_ignore_ascii_case("true"),
        _ => false,
    };
    let mut w = state.world();
    let v = w
        .volumes
        .get(&volume_id)
        .filter(|v| v.project_id == ctx.project_id || ctx.admin)
        .ok_or_else(|| ApiErr::not_found(S, format!("Volume {volume_id} could not be found.")))?
        .clone();
    // what is read: the snapshot, or the volume itself
    let (source_key, restore_status) = match &snapshot_id {
        Some(sid) => {
            let snap = w
                .snapshots
                .get(sid)
                .filter(|s| s.project_id == ctx.project_id || ctx.admin)
                .ok_or_else(|| {
                    ApiErr::not_found(S, format!("Snapshot {sid} could not be found."))
                })?;
            if snap.volume_id != volume_id {
                return Err(ApiErr::bad(
                    S,
                    format!(
                        "Invalid input received: Snapshot {sid} is not a snapshot of volume {volume_id}."
                    ),
                ));
            }
            if snap.status != "available" {
                return Err(ApiErr::bad(
                    S,
                    format!(
                        "Invalid snapshot: Snapshot to be backed up must be available, but the current status is \"{}\".",
                        snap.status
                    ),
                ));
            }
            (Hypervisor::snapshot_key(sid), "available".to_string())
        }
        None => {
            match v.status.as_str() {
                "available" => {}
                "in-use" if force => {}
                "in-use" => {
                    return Err(ApiErr::bad(
                        S,
                        "Invalid volume: Backing up an in-use volume must use the force flag.",
                    ));
                }
                other => {
                    return Err(ApiErr::bad(
                        S,
                        format!(
                            "Invalid volume: Volume to be backed up must be available or in-use, but the current status is \"{other}\"."
                        ),
                    ));
                }
            }
            (volume_id.clone(), v.status.clone())
        }
    };
    let metadata = crate::state::metadata_of(spec);
    let seq = w.next_seq();
    let b = BackupRec {
        seq,
        id: new_id(),
        project_id: ctx.project_id.clone(),
        name: str_field(spec, "name").unwrap_or_default(),
        description: str_field(spec, "description"),
        status: "creating".into(),
        size: v.size,
        volume_id: volume_id.clone(),
        snapshot_id: snapshot_id.clone(),
        availability_zone: str_field(spec, "availability_zone")
            .or_else(|| Some(v.availability_zone.clone())),
        metadata,
        fail_reason: None,
        created_at: now_iso(),
    };
    let id = b.id.clone();
    if let Some(hv) = &state.hypervisor
        && let Err(e) = hv.copy_data(&source_key, &backup_key(&id))
    {
        tracing::error!(backup = %id, error = %e, "could not copy the data backed up");
    }
    // the source is busy while it is read
    match &snapshot_id {
        Some(sid) => {
            if let Some(s) = w.snapshots.get_mut(sid) {
                s.status = "backing-up".into();
            }
        }
        None => {
            if let Some(v) = w.volumes.get_mut(&volume_id) {
                v.status = "backing-up".into();
                v.touch();
            }
        }
    }
    let body = json!({ "backup": { "id": id, "name": b.name, "links": [] } });
    w.backups.insert(id.clone(), b);
    let delay = Delays::d(w.delays.backup_create_ms);
    drop(w);
    state.after(delay, move |_, w| {
        if let Some(b) = w.backups.get_mut(&id)
            && b.status == "creating"
        {
            b.status = "available".into();
        }
        match &snapshot_id {
            Some(sid) => {
                if let Some(s) = w.snapshots.get_mut(sid)
                    && s.status == "backing-up"
                {
                    s.status = "available".into();
                }
            }
            None => {
                if let Some(v) = w.volumes.get_mut(&volume_id)
                    && v.status == "backing-up"
                {
                    v.status = restore_status;
                    v.touch();
                }
            }
        }
    });
    Ok((StatusCode::ACCEPTED, Json(body)).into_response())
}

pub(super) async fn list_backups(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
    Path(project): Path<String>,
    uri: http::Uri,
    Query(q): Query<BTreeMap<String, String>>,
) -> ApiResult<Json<Value>> {
    check_project(&ctx, &project)?;
    let detail = uri.path().ends_with("/detail");
    let w = state.world();
    let items = w
        .backups
        .values()
        .filter(|b| b.project_id == ctx.project_id)
        .filter(|b| q.get("name").is_none_or(|n| &b.name == n))
        .filter(|b| q.get("volume_id").is_none_or(|v| &b.volume_id == v))
        .filter(|b| q.get("status").is_none_or(|s| &b.status == s))
        .map(|b| {
            let j = if detail {
                backup_json(b)
            } else {
                json!({ "id": b.id, "name": b.name, "links": [] })
            };
            (b.seq, b.id.clone(), j)
        })
        .collect();
    let limit = parse_limit(&q)?;
    let (page, next) = paginate(items, limit, q.get("marker").map(String::as_str))?;
    let mut body = json!({ "backups": page });
    if let Some(m) = next {
        body["backups_links"] =
            json!([{ "rel": "next", "href": next_href(&state, &uri, limit, &m) }]);
    }
    Ok(Json(body))
}

pub(super) async fn get_backup(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
    Path((project, id)): Path<(String, String)>,
) -> ApiResult<Json<Value>> {
    check_project(&ctx, &project)?;
    let w = state.world();
    Ok(Json(
        json!({ "backup": backup_json(visible_backup(&w, &ctx, &id)?) }),
    ))
}

pub(super) async fn delete_backup(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
    Path((project, id)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    check_project(&ctx, &project)?;
    let mut w = state.world();
    let status = visible_backup(&w, &ctx, &id)?.status.clone();
    if !matches!(status.as_str(), "available" | "error") {
        return Err(ApiErr::bad(
            S,
            "Invalid backup: Backup status must be available or error",
        ));
    }
    if let Some(b) = w.backups.get_mut(&id) {
        b.status = "deleting".into();
    }
    let delay = Delays::d(w.delays.backup_delete_ms);
    drop(w);
    state.after(delay, move |st, w| {
        w.backups.remove(&id);
        if let Some(hv) = &st.hypervisor {
            hv.forget_data(&backup_key(&id));
        }
    });
    Ok(StatusCode::ACCEPTED)
}

/// Checks a volume create's `backup_id` (needs 3.47): the backup must be
/// available and fit. Returns its size and zone.
pub(super) fn check_restore(
    w: &crate::state::World,
    ctx: &Ctx,
    backup_id: &str,
    mv: u32,
    size: Option<u64>,
) -> ApiResult<(u64, Option<String>)> {
    if mv < 47 {
        return Err(ApiErr::bad(
            S,
            "Invalid input for field/attribute volume. Additional properties are not allowed ('backup_id' was unexpected)",
        ));
    }
    let b = visible_backup(w, ctx, backup_id)?;
    if b.status != "available" {
        return Err(ApiErr::bad(
            S,
            format!(
                "Invalid backup: Backup status must be available but is {}.",
                b.status
            ),
        ));
    }
    let s = size.unwrap_or(b.size);
    if s < b.size {
        return Err(ApiErr::bad(
            S,
            format!(
                "Invalid input received: Volume size '{s}'GB cannot be smaller than the backup size {}GB.",
                b.size
            ),
        ));
    }
    Ok((s, b.availability_zone.clone()))
}

/// The backup is read into a new volume: it is `restoring` and the volume
/// `restoring-backup` until the copy is done.
pub(super) fn restore_into(state: &Arc<AppState>, backup_id: String, volume_id: String) {
    let delay = {
        let mut w = state.world();
        if let Some(b) = w.backups.get_mut(&backup_id) {
            b.status = "restoring".into();
        }
        Delays::d(w.delays.volume_create_ms)
    };
    let st = state.clone();
    state.after(delay, move |_, w| {
        if let Some(v) = w.volumes.get_mut(&volume_id)
            && v.status == "creating"
        {
            v.status = "restoring-backup".into();
            v.touch();
        }
        let restore = Delays::d(w.delays.backup_restore_ms);
        st.after(restore, move |st, w| {
            if let Some(hv) = &st.hypervisor
                && let Err(e) = hv.copy_data(&backup_key(&backup_id), &volume_id)
            {
                tracing::error!(backup = %backup_id, error = %e, "could not restore the backup's data");
            }
            if let Some(b) = w.backups.get_mut(&backup_id)
                && b.status == "restoring"
            {
                b.status = "available".into();
            }
            if let Some(v) = w.volumes.get_mut(&volume_id)
                && v.status == "restoring-backup"
            {
                v.status = "available".into();
                v.touch();
            }
        });
    });
}
