//! Generic volume groups (3.13+) and group snapshots (3.14+), as Cinder
//! keeps them: a group of volume types in one zone, volumes added and
//! removed while it is `available` (`updating` meanwhile), a group
//! snapshot that snapshots every member volume in one operation (members
//! carry its name and id and cannot be deleted alone), and a group that is
//! deleted only when it holds no volumes and no snapshots.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use http::StatusCode;
use serde_json::{Value, json};

use super::*;
use crate::AppState;
use crate::errors::{ApiErr, ApiResult};
use crate::hypervisor::Hypervisor;
use crate::keystone::Ctx;
use crate::state::{
    Delays, GroupRec, GroupSnapshotRec, GroupTypeRec, SnapshotRec, World, new_id, now_iso,
};

/// Groups need 3.13, group snapshots 3.14: below, the routes do not exist.
fn need(mv: u32, min: u32) -> ApiResult<()> {
    if mv < min {
        return Err(ApiErr::not_found(S, "The resource could not be found."));
    }
    Ok(())
}

fn group_type_json(t: &GroupTypeRec) -> Value {
    json!({ "id": t.id, "name": t.name, "is_public": true, "description": null, "group_specs": t.group_specs })
}

fn group_json(w: &World, g: &GroupRec, with_volumes: bool) -> Value {
    let mut j = json!({
        "id": g.id, "name": g.name, "description": g.description, "status": g.status,
        "group_type": g.group_type_id, "volume_types": g.volume_type_ids,
        "availability_zone": g.availability_zone, "created_at": g.created_at,
        "group_snapshot_id": null, "source_group_id": null
    });
    if with_volumes {
        let volumes: Vec<&String> = w
            .volumes
            .values()
            .filter(|v| v.group_id.as_deref() == Some(g.id.as_str()))
            .map(|v| &v.id)
            .collect();
        j["volumes"] = json!(volumes);
    }
    j
}

fn group_snapshot_json(g: &GroupSnapshotRec) -> Value {
    json!({
        "id": g.id, "name": g.name, "description": g.description, "status": g.status,
        "group_id": g.group_id, "group_type_id": g.group_type_id, "created_at": g.created_at
    })
}

fn find_group_type<'a>(w: &'a World, id_or_name: &str) -> Option<&'a GroupTypeRec> {
    w.group_types
        .iter()
        .find(|t| t.id == id_or_name || t.name == id_or_name)
}

fn visible_group<'a>(w: &'a World, ctx: &Ctx, id: &str) -> ApiResult<&'a GroupRec> {
    w.groups
        .get(id)
        .filter(|g| g.project_id == ctx.project_id || ctx.admin)
        .ok_or_else(|| ApiErr::not_found(S, format!("Group {id} could not be found.")))
}

fn visible_group_snapshot<'a>(
    w: &'a World,
    ctx: &Ctx,
    id: &str,
) -> ApiResult<&'a GroupSnapshotRec> {
    w.group_snapshots
        .get(id)
        .filter(|g| g.project_id == ctx.project_id || ctx.admin)
        .ok_or_else(|| ApiErr::not_found(S, format!("GroupSnapshot {id} could not be found.")))
}

fn wants_volumes(q: &BTreeMap<String, String>) -> bool {
    q.get("list_volume")
        .is_some_and(|v| v.eq_ignore_ascii_case("true"))
}

pub(super) async fn list_group_types(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
    Extension(CinderMv(mv)): Extension<CinderMv>,
    Path(project): Path<String>,
) -> ApiResult<Json<Value>> {
    check_project(&ctx, &project)?;
    need(mv, 11)?;
    let w = state.world();
    Ok(Json(
        json!({ "group_types": w.group_types.iter().map(group_type_json).collect::<Vec<_>>() }),
    ))
}

pub(super) async fn create_group_type(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
    Extension(CinderMv(mv)): Extension<CinderMv>,
    Path(project): Path<String>,
    Json(body): Json<Value>,
) -> ApiResult<Json<Value>> {
    check_project(&ctx, &project)?;
    need(mv, 11)?;
    if !ctx.admin {
        return Err(ApiErr::forbidden(
            S,
            "Policy doesn't allow group:group_types:create to be performed.",
        ));
    }
    let spec = body
        .get("group_type")
        .ok_or_else(|| ApiErr::bad(S, "Missing required element 'group_type' in request body."))?;
    let name = str_field(spec, "name")
        .ok_or_else(|| ApiErr::bad(S, "Invalid input received: name is required"))?;
    let mut w = state.world();
    if w.group_types.iter().any(|t| t.name == name) {
        return Err(ApiErr::conflict(
            S,
            format!("Group Type {name} already exists."),
        ));
    }
    let group_specs = spec
        .get("group_specs")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                .collect()
        })
        .unwrap_or_default();
    let t = GroupTypeRec {
        id: new_id(),
        name,
        group_specs,
    };
    let out = group_type_json(&t);
    w.group_types.push(t);
    Ok(Json(json!({ "group_type": out })))
}

pub(super) async fn create_group(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
    Extension(CinderMv(mv)): Extension<CinderMv>,
    Path(project): Path<String>,
    Json(body): Json<Value>,
) -> ApiResult<Response> {
    check_project(&ctx, &project)?;
    need(mv, 13)?;
    let spec = body
        .get("group")
        .ok_or_else(|| ApiErr::bad(S, "Missing required element 'group' in request body."))?;
    let mut w = state.world();
    let group_type = str_field(spec, "group_type").ok_or_else(|| {
        ApiErr::bad(
            S,
            "Invalid input for field/attribute group. 'group_type' is a required property",
        )
    })?;
    let group_type_id = find_group_type(&w, &group_type)
        .ok_or_else(|| {
            ApiErr::not_found(
                S,
                format!("Group type with name {group_type} could not be found."),
            )
        })?
        .id
        .clone();
    let wanted: Vec<String> = spec
        .get("volume_types")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    if wanted.is_empty() {
        return Err(ApiErr::bad(
            S,
            "Invalid input for field/attribute group. 'volume_types' is a required property",
        ));
    }
    let mut volume_type_ids = Vec::new();
    for t in &wanted {
        let vt = find_type(&w, t).ok_or_else(|| {
            ApiErr::not_found(S, format!("Volume type with name {t} could not be found."))
        })?;
        volume_type_ids.push(vt.id.clone());
    }
    let az = str_field(spec, "availability_zone").unwrap_or_else(|| {
        state
            .availability_zones
            .first()
            .cloned()
            .unwrap_or_else(|| "nova".into())
    });
    let seq = w.next_seq();
    let g = GroupRec {
        seq,
        id: new_id(),
        project_id: ctx.project_id.clone(),
        name: str_field(spec, "name").unwrap_or_default(),
        description: str_field(spec, "description"),
        status: "creating".into(),
        group_type_id,
        volume_type_ids,
        availability_zone: az,
        created_at: now_iso(),
    };
    let id = g.id.clone();
    let body = json!({ "group": { "id": id, "name": g.name } });
    w.groups.insert(id.clone(), g);
    let delay = Delays::d(w.delays.volume_create_ms);
    drop(w);
    state.after(delay, move |_, w| {
        if let Some(g) = w.groups.get_mut(&id)
            && g.status == "creating"
        {
            g.status = "available".into();
        }
    });
    Ok((StatusCode::ACCEPTED, Json(body)).into_response())
}

pub(super) async fn list_groups(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
    Extension(CinderMv(mv)): Extension<CinderMv>,
    Path(project): Path<String>,
    Query(q): Query<BTreeMap<String, String>>,
) -> ApiResult<Json<Value>> {
    check_project(&ctx, &project)?;
    need(mv, 13)?;
    let w = state.world();
    let with_volumes = mv >= 25 && wants_volumes(&q);
    let mut groups: Vec<&GroupRec> = w
        .groups
        .values()
        .filter(|g| g.project_id == ctx.project_id)
        .filter(|g| q.get("name").is_none_or(|n| &g.name == n))
        .collect();
    groups.sort_by_key(|g| std::cmp::Reverse(g.seq));
    let list: Vec<Value> = groups
        .iter()
        .map(|g| group_json(&w, g, with_volumes))
        .collect();
    Ok(Json(json!({ "groups": list })))
}

pub(super) async fn get_group(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
    Extension(CinderMv(mv)): Extension<CinderMv>,
    Path((project, id)): Path<(String, String)>,
    Query(q): Query<BTreeMap<String, String>>,
) -> ApiResult<Json<Value>> {
    check_project(&ctx, &project)?;
    need(mv, 13)?;
    let w = state.world();
    let g = visible_group(&w, &ctx, &id)?;
    Ok(Json(
        json!({ "group": group_json(&w, g, mv >= 25 && wants_volumes(&q)) }),
    ))
}

fn ids(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_str)
        .map(|s| {
            s.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

pub(super) async fn update_group(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
    Extension(CinderMv(mv)): Extension<CinderMv>,
    Path((project, id)): Path<(String, String)>,
    Json(body): Json<Value>,
) -> ApiResult<Response> {
    check_project(&ctx, &project)?;
    need(mv, 13)?;
    let spec = body
        .get("group")
        .ok_or_else(|| ApiErr::bad(S, "Missing required element 'group' in request body."))?;
    let add = ids(spec.get("add_volumes"));
    let remove = ids(spec.get("remove_volumes"));
    let mut w = state.world();
    let g = visible_group(&w, &ctx, &id)?.clone();
    if g.status != "available" {
        return Err(ApiErr::bad(
            S,
            format!(
                "Invalid group: Cannot update group {id}, status must be available, and it cannot be in the middle of being created or deleted. Current status: {}.",
                g.status
            ),
        ));
    }
    for vid in &add {
        let v = w.volumes.get(vid).filter(|v| v.project_id == g.project_id).ok_or_else(|| {
            ApiErr::bad(
                S,
                format!("Invalid volume: Cannot add volume {vid} to group {id} because volume cannot be found."),
            )
        })?;
        if let Some(other) = &v.group_id
            && other != &id
        {
            return Err(ApiErr::bad(
                S,
                format!(
                    "Invalid volume: Cannot add volume {vid} to group {id} because it is already in group {other}."
                ),
            ));
        }
        let type_id = find_type(&w, &v.volume_type).map(|t| t.id.clone());
        if !type_id.is_some_and(|t| g.volume_type_ids.contains(&t)) {
            return Err(ApiErr::bad(
                S,
                format!(
                    "Invalid volume: Cannot add volume {vid} to group {id} because volume type {} is not supported by the group.",
                    v.volume_type
                ),
            ));
        }
        if !matches!(v.status.as_str(), "available" | "in-use") {
            return Err(ApiErr::bad(
                S,
                format!(
                    "Invalid volume: Cannot add volume {vid} to group {id} because volume is in an invalid state: {}. Valid states are: ('available', 'in-use').",
                    v.status
                ),
            ));
        }
    }
    for vid in &remove {
        let v = w
            .volumes
            .get(vid)
            .filter(|v| v.group_id.as_deref() == Some(id.as_str()))
            .ok_or_else(|| {
                ApiErr::bad(
                    S,
                    format!("Invalid volume: Cannot remove volume {vid} from group {id} because it is not in the group."),
                )
            })?;
        if !matches!(
            v.status.as_str(),
            "available" | "in-use" | "error" | "error_deleting"
        ) {
            return Err(ApiErr::bad(
                S,
                format!(
                    "Invalid volume: Cannot remove volume {vid} from group {id} because volume is in an invalid state: {}.",
                    v.status
                ),
            ));
        }
    }
    if let Some(g) = w.groups.get_mut(&id) {
        g.status = if add.is_empty() && remove.is_empty() {
            "available".into()
        } else {
            "updating".into()
        };
    }
    let delay = Delays::d(w.delays.volume_retype_ms);
    drop(w);
    state.after(delay, move |_, w| {
        for vid in &add {
            if let Some(v) = w.volumes.get_mut(vid) {
                v.group_id = Some(id.clone());
            }
        }
        for vid in &remove {
            if let Some(v) = w.volumes.get_mut(vid) {
                v.group_id = None;
            }
        }
        if let Some(g) = w.groups.get_mut(&id)
            && g.status == "updating"
        {
            g.status = "available".into();
        }
    });
    Ok(StatusCode::ACCEPTED.into_response())
}

pub(super) async fn group_action(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
    Extension(CinderMv(mv)): Extension<CinderMv>,
    Path((project, id)): Path<(String, String)>,
    Json(body): Json<Value>,
) -> ApiResult<Response> {
    check_project(&ctx, &project)?;
    need(mv, 13)?;
    let Some(args) = body.get("delete") else {
        return Err(ApiErr::bad(S, "There is no such action"));
    };
    let delete_volumes = args
        .get("delete-volumes")
        .is_some_and(|v| v.as_bool() == Some(true));
    let mut w = state.world();
    let g = visible_group(&w, &ctx, &id)?.clone();
    if !matches!(g.status.as_str(), "available" | "error") {
        return Err(ApiErr::bad(
            S,
            format!(
                "Invalid group: Group status must be available or error, but current status is: {}",
                g.status
            ),
        ));
    }
    if w.group_snapshots.values().any(|s| s.group_id == id) {
        return Err(ApiErr::bad(
            S,
            "Invalid group: Group has existing snapshots.",
        ));
    }
    let has_volumes = w
        .volumes
        .values()
        .any(|v| v.group_id.as_deref() == Some(id.as_str()));
    if has_volumes && !delete_volumes {
        return Err(ApiErr::bad(
            S,
            format!(
                "Invalid group: Group {id} still contains volumes. The delete-volumes flag is required to delete it."
            ),
        ));
    }
    if has_volumes {
        return Err(ApiErr::bad(
            S,
            "Invalid group: the emulator does not delete a group's volumes with it",
        ));
    }
    if let Some(g) = w.groups.get_mut(&id) {
        g.status = "deleting".into();
    }
    let delay = Delays::d(w.delays.volume_delete_ms);
    drop(w);
    state.after(delay, move |_, w| {
        w.groups.remove(&id);
    });
    Ok(StatusCode::ACCEPTED.into_response())
}

pub(super) async fn create_group_snapshot(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
    Extension(CinderMv(mv)): Extension<CinderMv>,
    Path(project): Path<String>,
    Json(body): Json<Value>,
) -> ApiResult<Response> {
    check_project(&ctx, &project)?;
    need(mv, 14)?;
    let spec = body.get("group_snapshot").ok_or_else(|| {
        ApiErr::bad(
            S,
            "Missing required element 'group_snapshot' in request body.",
        )
    })?;
    let group_id = str_field(spec, "group_id")
        .ok_or_else(|| ApiErr::bad(S, "Invalid input received: group_id is required"))?;
    let mut w = state.world();
    let g = visible_group(&w, &ctx, &group_id)?.clone();
    if g.status != "available" {
        return Err(ApiErr::bad(
            S,
            format!(
                "Invalid group: Group status must be available, but current status is: {}",
                g.status
            ),
        ));
    }
    let members: Vec<(String, u64)> = w
        .volumes
        .values()
        .filter(|v| v.group_id.as_deref() == Some(group_id.as_str()))
        .map(|v| (v.id.clone(), v.size))
        .collect();
    if let Some(v) = w.volumes.values().find(|v| {
        v.group_id.as_deref() == Some(group_id.as_str())
            && !matches!(v.status.as_str(), "available" | "in-use")
    }) {
        return Err(ApiErr::bad(
            S,
            format!(
                "Invalid volume: Volume {} status must be available or in-use, but current status is: {}.",
                v.id, v.status
            ),
        ));
    }
    let seq = w.next_seq();
    let gs = GroupSnapshotRec {
        seq,
        id: new_id(),
        project_id: ctx.project_id.clone(),
        name: str_field(spec, "name").unwrap_or_default(),
        description: str_field(spec, "description"),
        status: "creating".into(),
        group_id: group_id.clone(),
        group_type_id: g.group_type_id.clone(),
        created_at: now_iso(),
    };
    let gsid = gs.id.clone();
    let mut member_ids = Vec::new();
    for (vid, size) in members {
        let seq = w.next_seq();
        let snap = SnapshotRec {
            seq,
            id: new_id(),
            project_id: ctx.project_id.clone(),
            name: gs.name.clone(),
            description: gs.description.clone(),
            status: "creating".into(),
            size,
            volume_id: vid.clone(),
            metadata: BTreeMap::new(),
            group_snapshot_id: Some(gsid.clone()),
            created_at: gs.created_at.clone(),
        };
        // one instant for every member: the data is copied together
        if let Some(hv) = &state.hypervisor
            && let Err(e) = hv.copy_data(&vid, &Hypervisor::snapshot_key(&snap.id))
        {
            tracing::error!(snapshot = %snap.id, error = %e, "could not copy the volume's data");
        }
        member_ids.push(snap.id.clone());
        w.snapshots.insert(snap.id.clone(), snap);
    }
    let body = json!({ "group_snapshot": { "id": gsid, "name": gs.name, "group_type_id": gs.group_type_id } });
    w.group_snapshots.insert(gsid.clone(), gs);
    let delay = Delays::d(w.delays.snapshot_create_ms);
    drop(w);
    state.after(delay, move |_, w| {
        for id in &member_ids {
            if let Some(s) = w.snapshots.get_mut(id)
                && s.status == "creating"
            {
                s.status = "available".into();
            }
        }
        if let Some(g) = w.group_snapshots.get_mut(&gsid)
            && g.status == "creating"
        {
            g.status = "available".into();
        }
    });
    Ok((StatusCode::ACCEPTED, Json(body)).into_response())
}

pub(super) async fn list_group_snapshots(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
    Extension(CinderMv(mv)): Extension<CinderMv>,
    Path(project): Path<String>,
    Query(q): Query<BTreeMap<String, String>>,
) -> ApiResult<Json<Value>> {
    check_project(&ctx, &project)?;
    need(mv, 14)?;
    let w = state.world();
    let mut list: Vec<&GroupSnapshotRec> = w
        .group_snapshots
        .values()
        .filter(|g| g.project_id == ctx.project_id)
        .filter(|g| q.get("name").is_none_or(|n| &g.name == n))
        .filter(|g| q.get("status").is_none_or(|s| &g.status == s))
        .filter(|g| q.get("group_id").is_none_or(|s| &g.group_id == s))
        .collect();
    list.sort_by_key(|g| std::cmp::Reverse(g.seq));
    Ok(Json(
        json!({ "group_snapshots": list.into_iter().map(group_snapshot_json).collect::<Vec<_>>() }),
    ))
}

pub(super) async fn get_group_snapshot(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
    Extension(CinderMv(mv)): Extension<CinderMv>,
    Path((project, id)): Path<(String, String)>,
) -> ApiResult<Json<Value>> {
    check_project(&ctx, &project)?;
    need(mv, 14)?;
    let w = state.world();
    Ok(Json(
        json!({ "group_snapshot": group_snapshot_json(visible_group_snapshot(&w, &ctx, &id)?) }),
    ))
}

pub(super) async fn delete_group_snapshot(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
    Extension(CinderMv(mv)): Extension<CinderMv>,
    Path((project, id)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    check_project(&ctx, &project)?;
    need(mv, 14)?;
    let mut w = state.world();
    let status = visible_group_snapshot(&w, &ctx, &id)?.status.clone();
    if !matches!(status.as_str(), "available" | "error") {
        return Err(ApiErr::bad(
            S,
            "Invalid GroupSnapshot: GroupSnapshot status must be available or error, and no Group can be currently using it as source for its creation.",
        ));
    }
    if let Some(g) = w.group_snapshots.get_mut(&id) {
        g.status = "deleting".into();
    }
    for s in w.snapshots.values_mut() {
        if s.group_snapshot_id.as_deref() == Some(id.as_str()) {
            s.status = "deleting".into();
        }
    }
    let delay = Delays::d(w.delays.snapshot_delete_ms);
    drop(w);
    state.after(delay, move |st, w| {
        let members: Vec<String> = w
            .snapshots
            .values()
            .filter(|s| s.group_snapshot_id.as_deref() == Some(id.as_str()))
            .map(|s| s.id.clone())
            .collect();
        for m in members {
            w.snapshots.remove(&m);
            if let Some(hv) = &st.hypervisor {
                hv.forget_snapshot(&m);
            }
        }
        w.group_snapshots.remove(&id);
    });
    Ok(StatusCode::ACCEPTED)
}
