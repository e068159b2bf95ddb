//! Share groups and share group snapshots (2.55+, Manila's graduated
//! API): a group (creating → available) holds shares created in it; its
//! snapshot (creating → available) has one member per share, which are not
//! share snapshots; a group made from a group snapshot gets one new share
//! per member (creating_from_snapshot → available). A share with a member
//! cannot be deleted, nor a group with shares or snapshots.

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
use crate::state::{
    Delays, ShareGroupMemberRec, ShareGroupRec, ShareGroupSnapshotRec, ShareRec, new_id, now_iso,
};

use super::*;

/// The one share group type, Manila's `default_share_group_type`.
pub const DEFAULT_GROUP_TYPE_ID: &str = "5f3a9e1c-6d2b-4c7e-9a51-0b8d4e2f7c13";

/// Before 2.55 share groups answer only with the experimental header,
/// which no client of this emulator sends.
fn graduated(mv: u32) -> ApiResult<()> {
    if mv < 55 {
        return Err(ApiErr::not_found(S, "The resource could not be found."));
    }
    Ok(())
}

fn uuid_like(v: &str) -> bool {
    v.len() == 36 && v.chars().all(|c| c.is_ascii_hexdigit() || c == '-')
}

fn group_json(g: &ShareGroupRec) -> Value {
    json!({
        "id": g.id, "name": g.name, "description": g.description, "status": g.status,
        "project_id": g.project_id, "share_types": g.share_type_ids,
        "share_group_type_id": g.share_group_type_id, "availability_zone": g.availability_zone,
        "source_share_group_snapshot_id": g.source_snapshot_id, "share_network_id": null,
        "share_server_id": null, "host": "emulator@dummy#pool", "consistent_snapshot_support": null,
        "created_at": g.created_at, "links": []
    })
}

fn group_snapshot_json(g: &ShareGroupSnapshotRec) -> Value {
    let members: Vec<Value> = g
        .members
        .iter()
        .map(|m| json!({ "id": m.id, "share_id": m.share_id, "size": m.size }))
        .collect();
    json!({
        "id": g.id, "name": g.name, "description": g.description, "status": g.status,
        "project_id": g.project_id, "share_group_id": g.share_group_id, "members": members,
        "created_at": g.created_at, "links": []
    })
}

pub(super) async fn create_group(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
    axum::Extension(ManilaMv(mv)): axum::Extension<ManilaMv>,
    Path(project): Path<String>,
    Json(body): Json<Value>,
) -> ApiResult<Response> {
    check_project(&ctx, &project)?;
    graduated(mv)?;
    let spec = body
        .get("share_group")
        .and_then(Value::as_object)
        .ok_or_else(|| ApiErr::bad(S, "'share_group' is missing from the request body."))?;
    let valid = [
        "name",
        "description",
        "share_types",
        "share_group_type_id",
        "source_share_group_snapshot_id",
        "share_network_id",
        "availability_zone",
    ];
    let invalid: Vec<&String> = spec
        .keys()
        .filter(|k| !valid.contains(&k.as_str()))
        .collect();
    if !invalid.is_empty() {
        return Err(ApiErr::bad(
            S,
            format!("The fields {invalid:?} are invalid."),
        ));
    }
    let field = |k: &str| spec.get(k).and_then(Value::as_str).map(str::to_string);
    let source = field("source_share_group_snapshot_id");
    if source.is_some() {
        for k in ["share_types", "share_network_id", "availability_zone"] {
            if spec.contains_key(k) {
                return Err(ApiErr::bad(
                    S,
                    format!(
                        "Cannot supply both '{k}' and 'source_share_group_snapshot_id' attributes."
                    ),
                ));
            }
        }
    }
    let group_type = field("share_group_type_id").unwrap_or_else(|| DEFAULT_GROUP_TYPE_ID.into());
    if !uuid_like(&group_type) {
        return Err(ApiErr::bad(
            S,
            "The 'share_group_type_id' attribute must be a uuid.",
        ));
    }
    if group_type != DEFAULT_GROUP_TYPE_ID {
        return Err(ApiErr::not_found(
            S,
            format!("Share group type {group_type} could not be found."),
        ));
    }
    let mut w = state.world();
    let seq = w.next_seq();
    let id = new_id();
    let mut restored: Vec<ShareRec> = Vec::new();
    let (share_type_ids, zone) = match &source {
        Some(src) => {
            if !uuid_like(src) {
                return Err(ApiErr::bad(
                    S,
                    "The 'source_share_group_snapshot_id' attribute must be a uuid.",
                ));
            }
            let snap = w
                .share_group_snapshots
                .get(src)
                .filter(|x| x.project_id == ctx.project_id)
                .ok_or_else(|| {
                    ApiErr::bad(S, format!("Share group snapshot {src} could not be found."))
                })?
                .clone();
            if snap.status != "available" {
                return Err(ApiErr::conflict(
                    S,
                    format!(
                        "Invalid share group snapshot: Source share group snapshot status must be available, not {}.",
                        snap.status
                    ),
                ));
            }
            let from = w
                .share_groups
                .get(&snap.share_group_id)
                .cloned()
                .ok_or_else(|| {
                    ApiErr::bad(
                        S,
                        format!("Share group {} could not be found.", snap.share_group_id),
                    )
                })?;
            let used = w.shares.values().filter(|x| x.project_id == ctx.project_id);
            let (count, gib) = used.fold((0i64, 0i64), |(c, g), x| (c + 1, g + x.size as i64));
            let more: i64 = snap.members.iter().map(|m| m.size as i64).sum();
            let max_shares = w.manila_quota(&ctx.project_id, "shares");
            let max_gib = w.manila_quota(&ctx.project_id, "gigabytes");
            if (max_shares >= 0 && count + snap.members.len() as i64 > max_shares)
                || (max_gib >= 0 && gib + more > max_gib)
            {
                return Err(ApiErr::quota(
                    S,
                    "Requested share group exceeds the shares or gigabytes quota.",
                ));
            }
            for m in &snap.members {
                let of = w.shares.get(&m.share_id);
                let (type_id, type_name) = of
                    .map(|s| (s.share_type_id.clone(), s.share_type_name.clone()))
                    .unwrap_or_default();
                let seq = w.next_seq();
                restored.push(ShareRec {
                    seq,
                    id: new_id(),
                    project_id: ctx.project_id.clone(),
                    name: String::new(),
                    description: None,
                    status: "creating_from_snapshot".into(),
                    size: m.size,
                    protocol: m.protocol.clone(),
                    share_type_id: type_id,
                    share_type_name: type_name,
                    share_network_id: None,
                    availability_zone: from.availability_zone.clone(),
                    snapshot_id: None,
                    metadata: BTreeMap::new(),
                    created_at: now_iso(),
                    instance_id: new_id(),
                    share_group_id: Some(id.clone()),
                    source_member_id: Some(m.id.clone()),
                });
            }
            (from.share_type_ids.clone(), from.availability_zone.clone())
        }
        None => {
            let types: Vec<String> = match spec.get("share_types").and_then(Value::as_array) {
                Some(list) if !list.is_empty() => {
                    let mut ids = Vec::new();
                    for t in list {
                        let t = t.as_str().filter(|t| uuid_like(t)).ok_or_else(|| {
                            ApiErr::bad(S, "The 'share_types' attribute must be a list of uuids")
                        })?;
                        if !w.share_types.iter().any(|x| x.id == t) {
                            return Err(ApiErr::not_found(S, format!("Share type {t} not found.")));
                        }
                        ids.push(t.to_string());
                    }
                    ids
                }
                _ => match w.share_types.first() {
                    Some(t) => vec![t.id.clone()],
                    None => {
                        return Err(ApiErr::bad(
                            S,
                            "Must specify at least one share type as a default share type has not been configured.",
                        ));
                    }
                },
            };
            let zone = field("availability_zone").unwrap_or_else(|| {
                state
                    .availability_zones
                    .first()
                    .cloned()
                    .unwrap_or_else(|| "nova".into())
            });
            if !state.availability_zones.contains(&zone) {
                return Err(ApiErr::not_found(
                    S,
                    format!("Availability zone {zone} could not be found."),
                ));
            }
            (types, zone)
        }
    };
    let group = ShareGroupRec {
        seq,
        id: id.clone(),
        project_id: ctx.project_id.clone(),
        name: field("name").unwrap_or_default(),
        description: field("description"),
        status: "creating".into(),
        share_type_ids,
        share_group_type_id: group_type,
        availability_zone: zone,
        source_snapshot_id: source,
        created_at: now_iso(),
    };
    let out = json!({ "share_group": group_json(&group) });
    w.share_groups.insert(id.clone(), group);
    let shares: Vec<String> = restored.iter().map(|s| s.id.clone()).collect();
    for s in restored {
        w.shares.insert(s.id.clone(), s);
    }
    // a restore clones every member: the share creation delay, not the
    // snapshot's
    let delay = Delays::d(if shares.is_empty() {
        w.delays.share_snapshot_ms
    } else {
        w.delays.share_create_ms
    });
    drop(w);
    state.after(delay, move |_, w| {
        for sid in &shares {
            if let Some(x) = w.shares.get_mut(sid)
                && x.status == "creating_from_snapshot"
            {
                x.status = "available".into();
                if x.protocol == "CEPHFS" {
                    x.metadata
                        .insert("__mount_options".into(), "fs=cephfs".into());
                }
            }
        }
        if let Some(g) = w.share_groups.get_mut(&id)
            && g.status == "creating"
        {
            g.status = "available".into();
        }
    });
    Ok((StatusCode::ACCEPTED, Json(out)).into_response())
}

pub(super) async fn list_groups(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
    axum::Extension(ManilaMv(mv)): axum::Extension<ManilaMv>,
    Path(project): Path<String>,
    Query(q): Query<BTreeMap<String, String>>,
) -> ApiResult<Json<Value>> {
    check_project(&ctx, &project)?;
    graduated(mv)?;
    let w = state.world();
    let mut list: Vec<&ShareGroupRec> = w
        .share_groups
        .values()
        .filter(|x| x.project_id == ctx.project_id)
        .filter(|x| q.get("name").is_none_or(|n| &x.name == n))
        .filter(|x| {
            q.get("source_share_group_snapshot_id")
                .is_none_or(|n| x.source_snapshot_id.as_ref() == Some(n))
        })
        .collect();
    list.sort_by_key(|x| std::cmp::Reverse(x.seq));
    let list: Vec<Value> = page(list, &q)?.into_iter().map(group_json).collect();
    Ok(Json(json!({ "share_groups": list })))
}

pub(super) async fn get_group(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
    axum::Extension(ManilaMv(mv)): axum::Extension<ManilaMv>,
    Path((project, id)): Path<(String, String)>,
) -> ApiResult<Json<Value>> {
    check_project(&ctx, &project)?;
    graduated(mv)?;
    let w = state.world();
    let g = w
        .share_groups
        .get(&id)
        .filter(|x| x.project_id == ctx.project_id || ctx.admin)
        .ok_or_else(|| ApiErr::not_found(S, format!("Share group {id} could not be found.")))?;
    Ok(Json(json!({ "share_group": group_json(g) })))
}

pub(super) async fn delete_group(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
    axum::Extension(ManilaMv(mv)): axum::Extension<ManilaMv>,
    Path((project, id)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    check_project(&ctx, &project)?;
    graduated(mv)?;
    let mut w = state.world();
    let g = w
        .share_groups
        .get(&id)
        .filter(|x| x.project_id == ctx.project_id || ctx.admin)
        .ok_or_else(|| ApiErr::not_found(S, format!("Share group {id} could not be found.")))?;
    if !matches!(g.status.as_str(), "available" | "error") {
        return Err(ApiErr::conflict(
            S,
            "Invalid share group: Share group status must be one of ('available', 'error').",
        ));
    }
    if w.share_group_snapshots
        .values()
        .any(|s| s.share_group_id == id)
    {
        return Err(ApiErr::conflict(
            S,
            "Invalid share group: Cannot delete a share group with snapshots",
        ));
    }
    if w.shares
        .values()
        .any(|s| s.share_group_id.as_deref() == Some(id.as_str()))
    {
        return Err(ApiErr::conflict(
            S,
            "Invalid share group: Cannot delete a share group with shares",
        ));
    }
    if let Some(g) = w.share_groups.get_mut(&id) {
        g.status = "deleting".into();
    }
    let delay = Delays::d(w.delays.share_delete_ms);
    drop(w);
    state.after(delay, move |_, w| {
        w.share_groups.remove(&id);
    });
    Ok(StatusCode::ACCEPTED)
}

pub(super) async fn create_group_snapshot(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
    axum::Extension(ManilaMv(mv)): axum::Extension<ManilaMv>,
    Path(project): Path<String>,
    Json(body): Json<Value>,
) -> ApiResult<Response> {
    check_project(&ctx, &project)?;
    graduated(mv)?;
    let spec = body.get("share_group_snapshot").ok_or_else(|| {
        ApiErr::bad(
            S,
            "'share_group_snapshot' is missing from the request body.",
        )
    })?;
    let gid = s(spec, "share_group_id")
        .ok_or_else(|| ApiErr::bad(S, "Must supply 'share_group_id' attribute."))?;
    let mut w = state.world();
    let g = w
        .share_groups
        .get(&gid)
        .filter(|x| x.project_id == ctx.project_id)
        .ok_or_else(|| ApiErr::bad(S, format!("Share group {gid} could not be found.")))?;
    if g.status != "available" {
        return Err(ApiErr::conflict(
            S,
            format!(
                "Invalid share group: Share group status must be available, not {}.",
                g.status
            ),
        ));
    }
    let shares: Vec<&ShareRec> = w
        .shares
        .values()
        .filter(|x| x.share_group_id.as_deref() == Some(gid.as_str()))
        .collect();
    if let Some(busy) = shares.iter().find(|x| x.status != "available") {
        return Err(ApiErr::conflict(
            S,
            format!(
                "Invalid share group: Share {} in share group must have status of available but has status of {}.",
                busy.id, busy.status
            ),
        ));
    }
    // Manila reserves its quota after the checks above
    // (share_group/api.py): ShareGroupSnapshotsLimitExceeded, a 413
    let taken = w
        .share_group_snapshots
        .values()
        .filter(|x| x.project_id == ctx.project_id)
        .count() as i64;
    let max = w.manila_quota(&ctx.project_id, "share_group_snapshots");
    if max >= 0 && taken + 1 > max {
        return Err(ApiErr::quota(
            S,
            "ShareGroupSnapshotsLimitExceeded: Maximum number of allowed share-group-snapshots is exceeded.",
        ));
    }
    let members: Vec<ShareGroupMemberRec> = shares
        .iter()
        .map(|x| ShareGroupMemberRec {
            id: new_id(),
            share_id: x.id.clone(),
            size: x.size,
            protocol: x.protocol.clone(),
        })
        .collect();
    let seq = w.next_seq();
    let snap = ShareGroupSnapshotRec {
        seq,
        id: new_id(),
        project_id: ctx.project_id.clone(),
        name: s(spec, "name").unwrap_or_default(),
        description: s(spec, "description"),
        status: "creating".into(),
        share_group_id: gid,
        members,
        created_at: now_iso(),
    };
    let id = snap.id.clone();
    let out = json!({ "share_group_snapshot": group_snapshot_json(&snap) });
    w.share_group_snapshots.insert(id.clone(), snap);
    let fail = w.failing_share_group_snapshots > 0;
    if fail {
        w.failing_share_group_snapshots -= 1;
    }
    let delay = Delays::d(w.delays.share_snapshot_ms);
    drop(w);
    state.after(delay, move |_, w| {
        if let Some(x) = w.share_group_snapshots.get_mut(&id)
            && x.status == "creating"
        {
            x.status = if fail { "error" } else { "available" }.into();
        }
    });
    Ok((StatusCode::ACCEPTED, Json(out)).into_response())
}

pub(super) async fn list_group_snapshots(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
    axum::Extension(ManilaMv(mv)): axum::Extension<ManilaMv>,
    Path(project): Path<String>,
    Query(q): Query<BTreeMap<String, String>>,
) -> ApiResult<Json<Value>> {
    check_project(&ctx, &project)?;
    graduated(mv)?;
    let w = state.world();
    let mut list: Vec<&ShareGroupSnapshotRec> = w
        .share_group_snapshots
        .values()
        .filter(|x| x.project_id == ctx.project_id)
        .filter(|x| q.get("name").is_none_or(|n| &x.name == n))
        .collect();
    list.sort_by_key(|x| std::cmp::Reverse(x.seq));
    let list: Vec<Value> = page(list, &q)?
        .into_iter()
        .map(group_snapshot_json)
        .collect();
    Ok(Json(json!({ "share_group_snapshots": list })))
}

pub(super) async fn get_group_snapshot(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
    axum::Extension(ManilaMv(mv)): axum::Extension<ManilaMv>,
    Path((project, id)): Path<(String, String)>,
) -> ApiResult<Json<Value>> {
    check_project(&ctx, &project)?;
    graduated(mv)?;
    let w = state.world();
    let g = w
        .share_group_snapshots
        .get(&id)
        .filter(|x| x.project_id == ctx.project_id || ctx.admin)
        .ok_or_else(|| {
            ApiErr::not_found(S, format!("Share group snapshot {id} could not be found."))
        })?;
    Ok(Json(
        json!({ "share_group_snapshot": group_snapshot_json(g) }),
    ))
}

pub(super) async fn delete_group_snapshot(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
    axum::Extension(ManilaMv(mv)): axum::Extension<ManilaMv>,
    Path((project, id)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    check_project(&ctx, &project)?;
    graduated(mv)?;
    let mut w = state.world();
    let g = w
        .share_group_snapshots
        .get_mut(&id)
        .filter(|x| x.project_id == ctx.project_id || ctx.admin)
        .ok_or_else(|| {
            ApiErr::not_found(S, format!("Share group snapshot {id} could not be found."))
        })?;
    if !matches!(g.status.as_str(), "available" | "error") {
        return Err(ApiErr::conflict(
            S,
            "Invalid share group snapshot: Share group snapshot status must be one of ('available', 'error').",
        ));
    }
    g.status = "deleting".into();
    let delay = Delays::d(w.delays.share_snapshot_ms);
    drop(w);
    state.after(delay, move |_, w| {
        w.share_group_snapshots.remove(&id);
    });
    Ok(StatusCode::ACCEPTED)
}
