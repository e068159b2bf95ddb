//! Cinder v3: volumes (creating → available → reserved/attaching → in-use
//! → detaching → available; extending; retyping; deleting; error states),
//! snapshots, volume types, limits, microversions 3.0–3.70.

mod attachments;
mod backups;
mod groups;
mod snapshots;
mod volumes;

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};

use crate::AppState;
use crate::errors::{ApiErr, ApiResult, Style};
use crate::keystone::Ctx;
use crate::state::{VolumeRec, VolumeTypeRec, World, new_id};

const S: Style = Style::Compute;
const MAX_MINOR: u32 = 70;

/// The request's microversion minor number (`volume 3.N`).
#[derive(Debug, Clone, Copy)]
pub struct CinderMv(pub u32);

pub fn routes(_state: Arc<AppState>) -> axum::Router<Arc<AppState>> {
    axum::Router::new()
        .route(
            "/volumes",
            post(volumes::create_volume).get(volumes::list_volumes),
        )
        .route("/volumes/detail", get(volumes::list_volumes))
        .route(
            "/attachments",
            get(attachments::list_attachments).post(attachments::create_attachment),
        )
        .route("/attachments/detail", get(attachments::list_attachments))
        .route(
            "/attachments/{id}",
            axum::routing::delete(attachments::delete_attachment),
        )
        .route(
            "/attachments/{id}/action",
            post(attachments::attachment_action),
        )
        .route(
            "/volumes/{id}",
            get(volumes::get_volume).delete(volumes::delete_volume),
        )
        .route("/volumes/{id}/action", post(volumes::volume_action))
        .route(
            "/volumes/{id}/metadata",
            get(volumes::get_metadata).post(volumes::update_metadata),
        )
        .route(
            "/volumes/{id}/metadata/{key}",
            axum::routing::delete(volumes::delete_metadata_key),
        )
        .route(
            "/snapshots",
            post(snapshots::create_snapshot).get(snapshots::list_snapshots),
        )
        .route("/snapshots/detail", get(snapshots::list_snapshots))
        .route(
            "/snapshots/{id}",
            get(snapshots::get_snapshot).delete(snapshots::delete_snapshot),
        )
        .route(
            "/backups",
            post(backups::create_backup).get(backups::list_backups),
        )
        .route("/backups/detail", get(backups::list_backups))
        .route(
            "/backups/{id}",
            get(backups::get_backup).delete(backups::delete_backup),
        )
        .route(
            "/group_types",
            get(groups::list_group_types).post(groups::create_group_type),
        )
        .route(
            "/groups",
            post(groups::create_group).get(groups::list_groups),
        )
        .route("/groups/detail", get(groups::list_groups))
        .route(
            "/groups/{id}",
            get(groups::get_group).put(groups::update_group),
        )
        .route("/groups/{id}/action", post(groups::group_action))
        .route(
            "/group_snapshots",
            post(groups::create_group_snapshot).get(groups::list_group_snapshots),
        )
        .route("/group_snapshots/detail", get(groups::list_group_snapshots))
        .route(
            "/group_snapshots/{id}",
            get(groups::get_group_snapshot).delete(groups::delete_group_snapshot),
        )
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

/// A volume as Cinder answers it; its `updated_at` by the cloud's clock
/// (`clock_offset_secs` from this machine's).
pub fn volume_json(v: &VolumeRec, clock_offset_secs: i64) -> Value {
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
        "source_volid": v.source_volid, "group_id": v.group_id, "created_at": v.created_at,
        "updated_at": crate::state::shifted_iso(&v.updated_at, clock_offset_secs), "links": []
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
    ApiErr::quota(
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
    let (backups, backup_gib) = w
        .backups
        .values()
        .filter(|b| b.project_id == ctx.project_id)
        .fold((0u64, 0u64), |(n, g), b| (n + 1, g + b.size));
    Ok(Json(json!({ "limits": { "rate": [], "absolute": {
        "maxTotalVolumes": w.quotas.volumes, "totalVolumesUsed": count,
        "maxTotalVolumeGigabytes": w.quotas.gigabytes, "totalGigabytesUsed": gib,
        "maxTotalSnapshots": w.quotas.snapshots, "totalSnapshotsUsed": snaps,
        "maxTotalBackups": -1, "totalBackupsUsed": backups, "maxTotalBackupGigabytes": -1, "totalBackupGigabytesUsed": backup_gib
    }}})))
}
