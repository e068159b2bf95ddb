//! Cinder v3: volumes (creating → available → reserved/attaching → in-use
//! → detaching → available; extending; retyping; deleting; error states),
//! snapshots, volume types, limits, microversions 3.0–3.70.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{Path, Query, Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json};
use http::StatusCode;
use serde_json::{Value, json};

use crate::AppState;
use crate::errors::{ApiErr, ApiResult, Style};
use crate::keystone::Ctx;
use crate::state::{Delays, SnapshotRec, VolumeRec, VolumeTypeRec, World, new_id, now_iso};

const S: Style = Style::Compute;
const MAX_MINOR: u32 = 70;

/// The request's microversion minor number (`volume 3.N`).
#[derive(Debug, Clone, Copy)]
pub struct CinderMv(pub u32);

pub fn routes(_state: Arc<AppState>) -> axum::Router<Arc<AppState>> {
    axum::Router::new()
        .route("/volumes", post(create_volume).get(list_volumes))
        .route("/volumes/detail", get(list_volumes))
        .route("/volumes/{id}", get(get_volume).delete(delete_volume))
        .route("/volumes/{id}/action", post(volume_action))
        .route(
            "/volumes/{id}/metadata",
            get(get_metadata).post(update_metadata),
        )
        .route("/snapshots", post(create_snapshot).get(list_snapshots))
        .route("/snapshots/detail", get(list_snapshots))
        .route("/snapshots/{id}", get(get_snapshot).delete(delete_snapshot))
        .route("/types", get(list_types).post(create_type))
        .route("/types/{id}", get(get_type))
        .route("/limits", get(limits))
        .layer(middleware::from_fn(microversion))
}

async fn microversion(mut req: Request, next: Next) -> Response {
    let header = req
        .headers()
        .get("openstack-api-version")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let minor = match header.as_deref().and_then(|h| h.strip_prefix("volume ")) {
        None => 0,
        Some(v) => match v
            .trim()
            .strip_prefix("3.")
            .and_then(|m| m.parse::<u32>().ok())
        {
            Some(m) if m <= MAX_MINOR => m,
            _ => {
                return ApiErr::new(
                    406,
                    S,
                    format!("Version {} is not supported by the API. Minimum is 3.0 and maximum is 3.{MAX_MINOR}.", v.trim()),
                )
                .into_response();
            }
        },
    };
    req.extensions_mut().insert(CinderMv(minor));
    let mut resp = next.run(req).await;
    if let Ok(v) = format!("volume 3.{minor}").parse() {
        resp.headers_mut().insert("openstack-api-version", v);
        resp.headers_mut().insert(
            "vary",
            http::HeaderValue::from_static("OpenStack-API-Version"),
        );
    }
    resp
}

fn check_project(ctx: &Ctx, project: &str) -> ApiResult<()> {
    if ctx.project_id != project {
        return Err(ApiErr::bad(
            S,
            format!(
                "Malformed request url: URL's project_id '{project}' doesn't match Context's project_id '{}'",
                ctx.project_id
            ),
        ));
    }
    Ok(())
}

pub fn volume_json(v: &VolumeRec) -> Value {
    let attachments: Vec<Value> = v
        .attachments
        .iter()
        .map(|a| {
            json!({
                "id": a.attachment_id, "attachment_id": a.attachment_id, "volume_id": v.id,
                "server_id": a.server_id, "device": a.device, "host_name": null, "attached_at": v.created_at
            })
        })
        .collect();
    json!({
        "id": v.id, "name": v.name, "description": v.description, "status": v.status, "size": v.size,
        "volume_type": v.volume_type, "availability_zone": v.availability_zone, "multiattach": v.multiattach,
        "bootable": if v.bootable { "true" } else { "false" }, "encrypted": false,
        "attachments": attachments, "metadata": v.metadata, "snapshot_id": v.snapshot_id,
        "source_volid": v.source_volid, "created_at": v.created_at, "updated_at": null, "links": []
    })
}

fn snapshot_json(s: &SnapshotRec) -> Value {
    json!({
        "id": s.id, "name": s.name, "description": s.description, "status": s.status, "size": s.size,
        "volume_id": s.volume_id, "metadata": s.metadata, "created_at": s.created_at, "updated_at": null
    })
}

fn type_json(t: &VolumeTypeRec) -> Value {
    json!({ "id": t.id, "name": t.name, "extra_specs": t.extra_specs, "is_public": true, "description": null })
}

fn find_type<'a>(w: &'a World, id_or_name: &str) -> Option<&'a VolumeTypeRec> {
    w.volume_types
        .iter()
        .find(|t| t.id == id_or_name || t.name == id_or_name)
}

fn multiattach_type(t: &VolumeTypeRec) -> bool {
    t.extra_specs
        .get("multiattach")
        .is_some_and(|v| v.to_ascii_lowercase().contains("true"))
}

fn over_limit(resource: &str, limit: i64) -> ApiErr {
    let kind = match resource {
        "gigabytes" => "VolumeSizeExceedsAvailableQuota",
        "snapshots" => "SnapshotLimitExceeded",
        _ => "VolumeLimitExceeded",
    };
    ApiErr::new(
        413,
        S,
        format!(
            "{kind}: Maximum number of {resource} allowed ({limit}) exceeded for quota '{resource}'."
        ),
    )
}

fn int_field(v: &Value, key: &str) -> ApiResult<Option<u64>> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) if n.as_u64().is_some_and(|x| x > 0) => Ok(n.as_u64()),
        Some(Value::String(s)) if s.parse::<u64>().is_ok_and(|x| x > 0) => Ok(s.parse().ok()),
        Some(_) => Err(ApiErr::bad(
            S,
            format!(
                "Invalid input received: '{key}' parameter must be an integer and greater than 0."
            ),
        )),
    }
}

fn str_field(v: &Value, key: &str) -> Option<String> {
    v.get(key).and_then(Value::as_str).map(str::to_string)
}

async fn create_volume(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
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
        if az.is_none() {
            az = w
                .volumes
                .get(&snap.volume_id)
                .map(|v| v.availability_zone.clone());
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
        if az.is_none() {
            az = Some(vol.availability_zone.clone());
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
    let fail = w.failing_volume_creates > 0;
    if fail {
        w.failing_volume_creates -= 1;
    }
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
        metadata,
        snapshot_id,
        source_volid,
        created_at: now_iso(),
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
    let body = json!({ "volume": volume_json(&vol) });
    w.volumes.insert(id.clone(), vol);
    let delay = Delays::d(w.delays.volume_create_ms);
    drop(w);
    state.after(delay, move |_, w| {
        if let Some(v) = w.volumes.get_mut(&id)
            && v.status == "creating"
        {
            v.status = if fail {
                "error".into()
            } else {
                "available".into()
            };
            v.generation += 1;
        }
    });
    Ok((StatusCode::ACCEPTED, Json(body)).into_response())
}

/// Sorted newest first, like Cinder's default `created_at:desc`; then
/// `marker`/`limit`.
fn paginate<T: Clone>(
    items: Vec<(u64, String, T)>,
    limit: Option<usize>,
    marker: Option<&str>,
) -> ApiResult<(Vec<T>, Option<String>)> {
    let mut items = items;
    items.sort_by_key(|i| std::cmp::Reverse(i.0));
    let start = match marker {
        None => 0,
        Some(m) => items
            .iter()
            .position(|(_, id, _)| id == m)
            .map(|i| i + 1)
            .ok_or_else(|| {
                ApiErr::bad(S, format!("Invalid input received: marker [{m}] not found"))
            })?,
    };
    let rest = &items[start..];
    match limit {
        Some(l) if rest.len() > l => {
            let page: Vec<T> = rest[..l].iter().map(|(_, _, t)| t.clone()).collect();
            Ok((page, Some(rest[l - 1].1.clone())))
        }
        _ => Ok((rest.iter().map(|(_, _, t)| t.clone()).collect(), None)),
    }
}

fn parse_limit(q: &BTreeMap<String, String>) -> ApiResult<Option<usize>> {
    match q.get("limit") {
        None => Ok(None),
        Some(l) => l.parse::<usize>().map(Some).map_err(|_| {
            ApiErr::bad(
                S,
                format!("Invalid input received: limit '{l}' must be an integer"),
            )
        }),
    }
}

async fn list_volumes(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
    Path(project): Path<String>,
    uri: http::Uri,
    Query(q): Query<BTreeMap<String, String>>,
) -> ApiResult<Json<Value>> {
    check_project(&ctx, &project)?;
    let w = state.world();
    let items = w
        .volumes
        .values()
        .filter(|v| v.project_id == ctx.project_id)
        .filter(|v| q.get("name").is_none_or(|n| &v.name == n))
        .filter(|v| q.get("status").is_none_or(|s| &v.status == s))
        .map(|v| (v.seq, v.id.clone(), volume_json(v)))
        .collect();
    let limit = parse_limit(&q)?;
    let (page, next) = paginate(items, limit, q.get("marker").map(String::as_str))?;
    let mut body = json!({ "volumes": page });
    if let Some(m) = next {
        body["volumes_links"] =
            json!([{ "rel": "next", "href": next_href(&state, &uri, limit, &m) }]);
    }
    Ok(Json(body))
}

fn next_href(state: &AppState, uri: &http::Uri, limit: Option<usize>, marker: &str) -> String {
    let base = format!(
        "{}{}",
        state.base_url.as_str().trim_end_matches('/'),
        uri.path()
    );
    let mut u = url::Url::parse(&base).unwrap_or_else(|_| state.base_url.clone());
    {
        let mut p = u.query_pairs_mut();
        if let Some(q) = uri.query() {
            for (k, v) in url::form_urlencoded::parse(q.as_bytes()) {
                if k != "marker" {
                    p.append_pair(&k, &v);
                }
            }
        }
        if limit.is_none() {
            p.append_pair("limit", "1000");
        }
        p.append_pair("marker", marker);
    }
    u.to_string()
}

fn visible_volume<'a>(w: &'a World, ctx: &Ctx, id: &str) -> ApiResult<&'a VolumeRec> {
    w.volumes
        .get(id)
        .filter(|v| v.project_id == ctx.project_id || ctx.admin)
        .ok_or_else(|| ApiErr::not_found(S, format!("Volume {id} could not be found.")))
}

async fn get_volume(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
    Path((project, id)): Path<(String, String)>,
) -> ApiResult<Json<Value>> {
    check_project(&ctx, &project)?;
    let w = state.world();
    Ok(Json(
        json!({ "volume": volume_json(visible_volume(&w, &ctx, &id)?) }),
    ))
}

const DELETABLE: &[&str] = &[
    "available",
    "error",
    "error_restoring",
    "error_extending",
    "error_managing",
];

async fn delete_volume(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
    Path((project, id)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    check_project(&ctx, &project)?;
    let mut w = state.world();
    let v = visible_volume(&w, &ctx, &id)?;
    let has_snapshots = w.snapshots.values().any(|s| s.volume_id == id);
    if !DELETABLE.contains(&v.status.as_str()) || !v.attachments.is_empty() || has_snapshots {
        return Err(ApiErr::bad(
            S,
            "Invalid volume: Volume status must be available or error or error_restoring or error_extending or error_managing and must not be migrating, attached, belong to a group, have snapshots, awaiting a transfer, or be disassociated from snapshots after volume transfer.",
        ));
    }
    let delay = Delays::d(w.delays.volume_delete_ms);
    if let Some(v) = w.volumes.get_mut(&id) {
        v.status = "deleting".into();
        v.generation += 1;
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

async fn volume_action(
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
                    v.generation += 1;
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
                    v.generation += 1;
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
        v.generation += 1;
    }
}

async fn get_metadata(
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

async fn update_metadata(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
    Path((project, id)): Path<(String, String)>,
    Json(body): Json<Value>,
) -> ApiResult<Json<Value>> {
    check_project(&ctx, &project)?;
    let mut w = state.world();
    visible_volume(&w, &ctx, &id)?;
    let add = body
        .get("metadata")
        .and_then(Value::as_object)
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

async fn create_snapshot(
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
    let metadata: BTreeMap<String, String> = spec
        .get("metadata")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                .collect()
        })
        .unwrap_or_default();
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

async fn list_snapshots(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
    Path(project): Path<String>,
    uri: http::Uri,
    Query(q): Query<BTreeMap<String, String>>,
) -> ApiResult<Json<Value>> {
    check_project(&ctx, &project)?;
    let w = state.world();
    let items = w
        .snapshots
        .values()
        .filter(|s| s.project_id == ctx.project_id)
        .filter(|s| q.get("name").is_none_or(|n| &s.name == n))
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

async fn get_snapshot(
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

async fn delete_snapshot(
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

async fn list_types(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
    Path(project): Path<String>,
) -> ApiResult<Json<Value>> {
    check_project(&ctx, &project)?;
    let w = state.world();
    Ok(Json(
        json!({ "volume_types": w.volume_types.iter().map(type_json).collect::<Vec<_>>() }),
    ))
}

async fn get_type(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
    Path((project, id)): Path<(String, String)>,
) -> ApiResult<Json<Value>> {
    check_project(&ctx, &project)?;
    let w = state.world();
    let t = w
        .volume_types
        .iter()
        .find(|t| t.id == id)
        .ok_or_else(|| ApiErr::not_found(S, format!("Volume type {id} could not be found.")))?;
    Ok(Json(json!({ "volume_type": type_json(t) })))
}

async fn create_type(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
    Path(project): Path<String>,
    Json(body): Json<Value>,
) -> ApiResult<Json<Value>> {
    check_project(&ctx, &project)?;
    if !ctx.admin {
        return Err(ApiErr::forbidden(
            S,
            "Policy doesn't allow volume_extension:types_manage to be performed.",
        ));
    }
    let spec = body
        .get("volume_type")
        .ok_or_else(|| ApiErr::bad(S, "Missing required element 'volume_type' in request body."))?;
    let name = str_field(spec, "name")
        .ok_or_else(|| ApiErr::bad(S, "Invalid input received: name is required"))?;
    let mut w = state.world();
    if w.volume_types.iter().any(|t| t.name == name) {
        return Err(ApiErr::conflict(
            S,
            format!("Volume Type {name} already exists."),
        ));
    }
    let extra_specs = spec
        .get("extra_specs")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                .collect()
        })
        .unwrap_or_default();
    let t = VolumeTypeRec {
        id: new_id(),
        name,
        extra_specs,
    };
    let out = type_json(&t);
    w.volume_types.push(t);
    Ok(Json(json!({ "volume_type": out })))
}

async fn limits(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
    Path(project): Path<String>,
) -> ApiResult<Json<Value>> {
    check_project(&ctx, &project)?;
    let w = state.world();
    let (count, gib) = w.project_volume_usage(&ctx.project_id);
    let snaps = w
        .snapshots
        .values()
        .filter(|s| s.project_id == ctx.project_id)
        .count();
    Ok(Json(json!({ "limits": { "rate": [], "absolute": {
        "maxTotalVolumes": w.quotas.volumes, "totalVolumesUsed": count,
        "maxTotalVolumeGigabytes": w.quotas.gigabytes, "totalGigabytesUsed": gib,
        "maxTotalSnapshots": w.quotas.snapshots, "totalSnapshotsUsed": snaps,
        "maxTotalBackups": -1, "totalBackupsUsed": 0, "maxTotalBackupGigabytes": -1, "totalBackupGigabytesUsed": 0
    }}})))
}
