//! Volumes: create (from snapshots, volumes and backups), list, get,
//! delete, actions (extend, retype, bootable, reset), metadata.

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
use crate::keystone::Ctx;
use crate::state::{Delays, VolumeRec, World, new_id, now_iso};

pub(super) async fn create_volume(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
    Extension(CinderMv(mv)): Extension<CinderMv>,
    Path(project): Path<String>,
    Json(body): Json<Value>,
) -> ApiResult<Response> {
    check_project(&ctx, &project)?;
    let spec = body
        .get("volume")
        .ok_or_else(|| ApiErr::bad(S, "Missing required element 'volume' in request body."))?;
    let mut w = state.world();
    let mut size = int_field(spec, "size")?;
    let mut az = str_field(spec, "availability_zone");
    let snapshot_id = str_field(spec, "snapshot_id");
    let source_volid = str_field(spec, "source_volid");
    let backup_id = str_field(spec, "backup_id");
    if let Some(bid) = &backup_id {
        let (s, backup_az) = super::backups::check_restore(&w, &ctx, bid, mv, size)?;
        size = Some(s);
        if az.is_none() {
            az = backup_az;
        }
    }
    if let Some(sid) = &snapshot_id {
        let snap = w
            .snapshots
            .get(sid)
            .filter(|s| s.project_id == ctx.project_id)
            .ok_or_else(|| ApiErr::not_found(S, format!("Snapshot {sid} could not be found.")))?;
        if snap.status != "available" {
            return Err(ApiErr::bad(
                S,
                "Invalid snapshot: Originating snapshot status must be one of 'available' values",
            ));
        }
        let s = size.unwrap_or(snap.size);
        if s < snap.size {
            return Err(ApiErr::bad(
                S,
                format!(
                    "Invalid input received: Volume size '{s}'GB cannot be smaller than the snapshot size {}GB. They must be >= original snapshot size.",
                    snap.size
                ),
            ));
        }
        size = Some(s);
        // Cinder's `cloned_volume_same_az` (true by default): a snapshot
        // is restored only in its volume's zone
        let snap_az = w
            .volumes
            .get(&snap.volume_id)
            .map(|v| v.availability_zone.clone());
        match (&az, snap_az) {
            (None, found) => az = found,
            (Some(asked), Some(found)) if *asked != found => {
                return Err(ApiErr::bad(
                    S,
                    "Invalid input received: Volume must be in the same availability zone as the snapshot",
                ));
            }
            _ => {}
        }
    }
    if let Some(src) = &source_volid {
        let vol = w
            .volumes
            .get(src)
            .filter(|v| v.project_id == ctx.project_id)
            .ok_or_else(|| ApiErr::not_found(S, format!("Volume {src} could not be found.")))?;
        if !matches!(vol.status.as_str(), "available" | "in-use") {
            return Err(ApiErr::bad(
                S,
                format!(
                    "Invalid volume: Source volume status must be available or in-use, but is {}.",
                    vol.status
                ),
            ));
        }
        let s = size.unwrap_or(vol.size);
        if s < vol.size {
            return Err(ApiErr::bad(
                S,
                format!(
                    "Invalid input received: Clones of volumes must be at least as large as their source ({}GB).",
                    vol.size
                ),
            ));
        }
        size = Some(s);
        match &az {
            None => az = Some(vol.availability_zone.clone()),
            Some(asked) if *asked != vol.availability_zone => {
                return Err(ApiErr::bad(
                    S,
                    "Invalid input received: Volume must be in the same availability zone as the source volume",
                ));
            }
            Some(_) => {}
        }
    }
    let size = size.ok_or_else(|| {
        ApiErr::bad(
            S,
            "Invalid input received: 'size' parameter must be an integer and greater than 0.",
        )
    })?;
    let az = az.unwrap_or_else(|| {
        state
            .availability_zones
            .first()
            .cloned()
            .unwrap_or_else(|| "nova".into())
    });
    if !state.availability_zones.contains(&az) {
        return Err(ApiErr::bad(
            S,
            format!("Invalid input received: Availability zone '{az}' is invalid."),
        ));
    }
    let vtype = match str_field(spec, "volume_type") {
        Some(t) => find_type(&w, &t).cloned().ok_or_else(|| {
            ApiErr::not_found(S, format!("Volume type with name {t} could not be found."))
        })?,
        None => find_type(&w, "__DEFAULT__")
            .cloned()
            .ok_or_else(|| ApiErr::new(500, S, "no default volume type"))?,
    };
    if let Some(m) = spec.get("metadata").filter(|m| !m.is_null()) {
        check_metadata(m)?;
    }
    let (count, gib) = w.project_volume_usage(&ctx.project_id);
    let q = w.quotas.clone();
    if q.volumes >= 0 && count + 1 > q.volumes {
        return Err(over_limit("volumes", q.volumes));
    }
    if q.gigabytes >= 0 && gib + size as i64 > q.gigabytes {
        return Err(over_limit("gigabytes", q.gigabytes));
    }
    let metadata: BTreeMap<String, String> = spec
        .get("metadata")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| {
                    (
                        k.clone(),
                        v.as_str()
                            .map(str::to_string)
                            .unwrap_or_else(|| v.to_string()),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    let hints = scheduler_hints(&body)?;
    let placed = hints_place(&w, &ctx.project_id, &az, &hints);
    let fail = w.failing_volume_creates > 0;
    if fail {
        w.failing_volume_creates -= 1;
    }
    if !placed {
        tracing::info!(?hints, az = %az, "no backend passes the affinity filters: the volume goes to error");
    }
    let fail = fail || !placed;
    let seq = w.next_seq();
    let vol = VolumeRec {
        seq,
        id: new_id(),
        project_id: ctx.project_id.clone(),
        name: str_field(spec, "name").unwrap_or_default(),
        description: str_field(spec, "description"),
        status: "creating".into(),
        size,
        volume_type: vtype.name.clone(),
        availability_zone: az,
        multiattach: multiattach_type(&vtype),
        bootable: false,
        attachments: Vec::new(),
        pending_attachments: Vec::new(),
        metadata,
        snapshot_id,
        source_volid,
        group_id: None,
        created_at: now_iso(),
        updated_at: now_iso(),
        generation: 0,
    };
    let id = vol.id.clone();
    if let Some(hv) = &state.hypervisor {
        let source = match (&vol.snapshot_id, &vol.source_volid) {
            (Some(s), _) => Some(crate::hypervisor::Hypervisor::snapshot_key(s)),
            (None, Some(v)) => Some(v.clone()),
            _ => None,
        };
        if let Some(src) = source
            && let Err(e) = hv.copy_data(&src, &id)
        {
            tracing::error!(volume = %id, error = %e, "could not copy the source's data");
        }
    }
    let body = json!({ "volume": volume_json(&vol, w.clock_offset_secs) });
    w.volumes.insert(id.clone(), vol);
    let delay = Delays::d(w.delays.volume_create_ms);
    drop(w);
    if let Some(bid) = backup_id {
        super::backups::restore_into(&state, bid, id);
        return Ok((StatusCode::ACCEPTED, Json(body)).into_response());
    }
    state.after(delay, move |_, w| {
        if let Some(v) = w.volumes.get_mut(&id)
            && v.status == "creating"
        {
            v.status = if fail {
                "error".into()
            } else {
                "available".into()
            };
            v.touch();
        }
    });
    Ok((StatusCode::ACCEPTED, Json(body)).into_response())
}

pub(super) async fn list_volumes(
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
        .volumes
        .values()
        .filter(|v| v.project_id == ctx.project_id)
        .filter(|v| q.get("name").is_none_or(|n| &v.name == n))
        .filter(|v| crate::state::metadata_matches(&v.metadata, filter.as_ref()))
        .filter(|v| q.get("status").is_none_or(|s| &v.status == s))
        .map(|v| (v.seq, v.id.clone(), v))
        .collect();
    let limit = parse_limit(&q)?;
    // a page is rendered, not the whole project (as a database query with
    // a limit)
    let (page, next) = paginate(items, limit, q.get("marker").map(String::as_str))?;
    let offset = w.clock_offset_secs;
    let page: Vec<Value> = page.into_iter().map(|v| volume_json(v, offset)).collect();
    let mut body = json!({ "volumes": page });
    if let Some(m) = next {
        body["volumes_links"] =
            json!([{ "rel": "next", "href": next_href(&state, &uri, limit, &m) }]);
    }
    Ok(Json(body))
}

pub(super) async fn get_volume(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
    Path((project, id)): Path<(String, String)>,
) -> ApiResult<Json<Value>> {
    check_project(&ctx, &project)?;
    let w = state.world();
    Ok(Json(
        json!({ "volume": volume_json(visible_volume(&w, &ctx, &id)?, w.clock_offset_secs) }),
    ))
}

const DELETABLE: &[&str] = &[
    "available",
    "error",
    "error_restoring",
    "error_extending",
    "error_managing",
];

pub(super) async fn delete_volume(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
    Path((project, id)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    check_project(&ctx, &project)?;
    let mut w = state.world();
    let v = visible_volume(&w, &ctx, &id)?;
    let has_snapshots = w.snapshots.values().any(|s| s.volume_id == id);
    if !DELETABLE.contains(&v.status.as_str())
        || !v.attachments.is_empty()
        || has_snapshots
        || v.group_id.is_some()
    {
        return Err(ApiErr::bad(
            S,
            "Invalid volume: Volume status must be available or error or error_restoring or error_extending or error_managing and must not be migrating, attached, belong to a group, have snapshots, awaiting a transfer, or be disassociated from snapshots after volume transfer.",
        ));
    }
    let delay = Delays::d(w.delays.volume_delete_ms);
    if let Some(v) = w.volumes.get_mut(&id) {
        v.status = "deleting".into();
        v.touch();
    }
    drop(w);
    state.after(delay, move |st, w| {
        w.volumes.remove(&id);
        if let Some(hv) = &st.hypervisor {
            hv.forget_volume(&id);
        }
    });
    Ok(StatusCode::ACCEPTED)
}

pub(super) async fn volume_action(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
    Extension(CinderMv(mv)): Extension<CinderMv>,
    Path((project, id)): Path<(String, String)>,
    Json(body): Json<Value>,
) -> ApiResult<Response> {
    check_project(&ctx, &project)?;
    let (action, args) = body
        .as_object()
        .and_then(|o| o.iter().next())
        .map(|(k, v)| (k.clone(), v.clone()))
        .ok_or_else(|| ApiErr::bad(S, "There is no such action: (empty)"))?;
    let mut w = state.world();
    let v = visible_volume(&w, &ctx, &id)?.clone();
    match action.as_str() {
        "os-extend" => {
            let new_size = int_field(&args, "new_size")?
                .ok_or_else(|| ApiErr::bad(S, "Invalid input received: new_size is required"))?;
            let in_use = v.status == "in-use";
            if in_use && mv < 42 {
                return Err(ApiErr::bad(
                    S,
                    format!(
                        "Invalid volume: Volume {id} status must be available, but current status is: in-use."
                    ),
                ));
            }
            if !(v.status == "available" || in_use) {
                return Err(ApiErr::bad(
                    S,
                    format!(
                        "Invalid volume: Volume {id} status must be available or in-use, but current status is: {}.",
                        v.status
                    ),
                ));
            }
            if new_size <= v.size {
                return Err(ApiErr::bad(
                    S,
                    format!(
                        "Invalid input received: New size for extend must be greater than current size. (current: {}, extended: {new_size}).",
                        v.size
                    ),
                ));
            }
            let (_, gib) = w.project_volume_usage(&ctx.project_id);
            let q = w.quotas.gigabytes;
            if q >= 0 && gib + (new_size - v.size) as i64 > q {
                return Err(over_limit("gigabytes", q));
            }
            let back_to = v.status.clone();
            set_status(&mut w, &id, "extending");
            let delay = Delays::d(w.delays.volume_extend_ms);
            drop(w);
            let st = state.clone();
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                if let Some(hv) = &st.hypervisor {
                    let hv = hv.clone();
                    let vid = id.clone();
                    let _ = tokio::task::spawn_blocking(move || hv.resize(&vid, new_size)).await;
                }
                let mut w = st.world();
                if let Some(v) = w.volumes.get_mut(&id) {
                    v.size = new_size;
                    v.status = back_to;
                    v.touch();
                }
            });
            Ok(StatusCode::ACCEPTED.into_response())
        }
        "os-retype" => {
            let new_type = args
                .get("new_type")
                .and_then(Value::as_str)
                .ok_or_else(|| ApiErr::bad(S, "Invalid input received: new_type is required"))?;
            let t = find_type(&w, new_type).cloned().ok_or_else(|| {
                ApiErr::not_found(
                    S,
                    format!("Volume type with name {new_type} could not be found."),
                )
            })?;
            if !matches!(v.status.as_str(), "available" | "in-use") {
                return Err(ApiErr::bad(
                    S,
                    format!(
                        "Invalid volume: Volume {id} status must be available or in-use, but current status is: {}.",
                        v.status
                    ),
                ));
            }
            if t.name == v.volume_type {
                return Err(ApiErr::bad(
                    S,
                    format!(
                        "Invalid input received: New volume type must be different from the current one ({}).",
                        v.volume_type
                    ),
                ));
            }
            if v.status == "in-use" && multiattach_type(&t) != v.multiattach {
                return Err(ApiErr::bad(
                    S,
                    "Invalid volume: Retyping an attached volume cannot change multiattach.",
                ));
            }
            let back_to = v.status.clone();
            set_status(&mut w, &id, "retyping");
            let delay = Delays::d(w.delays.volume_retype_ms);
            drop(w);
            state.after(delay, move |_, w| {
                if let Some(v) = w.volumes.get_mut(&id) {
                    v.volume_type = t.name.clone();
                    v.multiattach = multiattach_type(&t);
                    v.status = back_to;
                    v.touch();
                }
            });
            Ok(StatusCode::ACCEPTED.into_response())
        }
        "os-set_bootable" => {
            let b = match args.get("bootable") {
                Some(Value::Bool(b)) => *b,
                Some(Value::String(s)) => s.eq_ignore_ascii_case("true"),
                _ => {
                    return Err(ApiErr::bad(
                        S,
                        "Invalid input received: bootable must be a boolean",
                    ));
                }
            };
            if let Some(v) = w.volumes.get_mut(&id) {
                v.bootable = b;
            }
            Ok(StatusCode::OK.into_response())
        }
        // what Nova's API asks before its host detaches, and to undo it
        "os-begin_detaching" => {
            if v.status != "in-use" {
                return Err(ApiErr::bad(
                    S,
                    "Invalid volume: Unable to detach volume. Volume status must be 'in-use' and attach_status must be 'attached' to detach.",
                ));
            }
            set_status(&mut w, &id, "detaching");
            Ok(StatusCode::ACCEPTED.into_response())
        }
        "os-roll_detaching" => {
            if v.status == "detaching" {
                set_status(&mut w, &id, "in-use");
            }
            Ok(StatusCode::ACCEPTED.into_response())
        }
        "os-reset_status" => {
            if !ctx.admin {
                return Err(ApiErr::forbidden(
                    S,
                    "Policy doesn't allow volume_extension:volume_admin_actions:reset_status to be performed.",
                ));
            }
            let st = args
                .get("status")
                .and_then(Value::as_str)
                .ok_or_else(|| ApiErr::bad(S, "Must specify 'status'"))?;
            set_status(&mut w, &id, st);
            Ok(StatusCode::ACCEPTED.into_response())
        }
        other => Err(ApiErr::bad(S, format!("There is no such action: {other}"))),
    }
}

fn set_status(w: &mut World, id: &str, status: &str) {
    if let Some(v) = w.volumes.get_mut(id) {
        v.status = status.to_string();
        v.touch();
    }
}

pub(super) async fn get_metadata(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
    Path((project, id)): Path<(String, String)>,
) -> ApiResult<Json<Value>> {
    check_project(&ctx, &project)?;
    let w = state.world();
    Ok(Json(
        json!({ "metadata": visible_volume(&w, &ctx, &id)?.metadata }),
    ))
}

pub(super) async fn update_metadata(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
    Path((project, id)): Path<(String, String)>,
    Json(body): Json<Value>,
) -> ApiResult<Json<Value>> {
    check_project(&ctx, &project)?;
    let mut w = state.world();
    visible_volume(&w, &ctx, &id)?;
    let m = body
        .get("metadata")
        .ok_or_else(|| ApiErr::bad(S, "Malformed request body: metadata"))?;
    check_metadata(m)?;
    let add = m
        .as_object()
        .ok_or_else(|| ApiErr::bad(S, "Malformed request body: metadata"))?;
    let v = w
        .volumes
        .get_mut(&id)
        .ok_or_else(|| ApiErr::not_found(S, "gone"))?;
    for (k, val) in add {
        v.metadata.insert(
            k.clone(),
            val.as_str()
                .map(str::to_string)
                .unwrap_or_else(|| val.to_string()),
        );
    }
    Ok(Json(json!({ "metadata": v.metadata })))
}

/// Cinder's schema for metadata (`parameter_types.metadata_allows_null`):
/// keys of 1 to 255 of `A-Za-z0-9-_:. /`, string values of at most 255.
fn check_metadata(m: &Value) -> ApiResult<()> {
    let obj = m
        .as_object()
        .ok_or_else(|| ApiErr::bad(S, "Invalid input for field/attribute metadata."))?;
    for (k, v) in obj {
        let key_ok = (1..=255).contains(&k.chars().count())
            && k.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_:. /".contains(c));
        let value_ok = v.as_str().is_some_and(|v| v.chars().count() <= 255);
        if !key_ok || !value_ok {
            return Err(ApiErr::bad(
                S,
                format!("Invalid input for field/attribute metadata. Value: {m}."),
            ));
        }
    }
    Ok(())
}

/// `DELETE /volumes/{id}/metadata/{key}`: 404 for a key the volume lacks.
pub(super) async fn delete_metadata_key(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
    Path((project, id, key)): Path<(String, String, String)>,
) -> ApiResult<StatusCode> {
    check_project(&ctx, &project)?;
    let mut w = state.world();
    visible_volume(&w, &ctx, &id)?;
    let v = w
        .volumes
        .get_mut(&id)
        .ok_or_else(|| ApiErr::not_found(S, "gone"))?;
    if v.metadata.remove(&key).is_none() {
        return Err(ApiErr::not_found(S, "Metadata item was not found"));
    }
    Ok(StatusCode::OK)
}

/// `OS-SCH-HNT:scheduler_hints`' `same_host` and `different_host`: a
/// volume id or a list of them, as Cinder's schema takes them (anything
/// else is refused with 400).
fn scheduler_hints(body: &Value) -> ApiResult<BTreeMap<String, Vec<String>>> {
    let mut out = BTreeMap::new();
    let Some(hints) = body.get("OS-SCH-HNT:scheduler_hints") else {
        return Ok(out);
    };
    if hints.is_null() {
        return Ok(out);
    }
    let hints = hints.as_object().ok_or_else(|| {
        ApiErr::bad(
            S,
            "Invalid input for field/attribute OS-SCH-HNT:scheduler_hints.",
        )
    })?;
    for key in ["same_host", "different_host"] {
        let Some(v) = hints.get(key) else { continue };
        let ids: Vec<String> = match v {
            Value::String(id) => vec![id.clone()],
            Value::Array(a) => a
                .iter()
                .map(|i| i.as_str().map(str::to_string))
                .collect::<Option<_>>()
                .ok_or_else(|| {
                    ApiErr::bad(S, format!("Invalid input for field/attribute {key}."))
                })?,
            _ => {
                return Err(ApiErr::bad(
                    S,
                    format!("Invalid input for field/attribute {key}."),
                ));
            }
        };
        if ids.iter().any(|i| uuid::Uuid::parse_str(i).is_err()) {
            return Err(ApiErr::bad(
                S,
                format!("Invalid input for field/attribute {key}. Value: {ids:?} is not a 'uuid'"),
            ));
        }
        out.insert(key.to_string(), ids);
    }
    Ok(out)
}

/// Whether Cinder's SameBackendFilter and DifferentBackendFilter let the
/// volume onto the backend of zone `az` (one backend per zone here, as in
/// the real test cloud: [`crate::admin::Control::volume_host`]): some
/// `same_host` volume is there (the filter's query of those ids on the
/// backend finds one), no `different_host` volume is. A volume the hints
/// name that the project does not have is on no backend.
fn hints_place(w: &World, project: &str, az: &str, hints: &BTreeMap<String, Vec<String>>) -> bool {
    let zone_of = |id: &String| {
        w.volumes
            .get(id)
            .filter(|v| v.project_id == project && v.status != "deleting")
            .map(|v| v.availability_zone.as_str())
    };
    let same = hints
        .get("same_host")
        .is_none_or(|ids| ids.is_empty() || ids.iter().any(|id| zone_of(id) == Some(az)));
    let apart = hints
        .get("different_host")
        .into_iter()
        .flatten()
        .all(|id| zone_of(id) != Some(az));
    same && apart
}
