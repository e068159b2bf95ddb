//! Manila v2: shares (creating → available, extending, shrinking,
//! deleting, error with a user message), export locations (admin-only
//! ones hidden from non-admins), access rules (queued_to_apply → active,
//! cephx access keys), snapshots, share types, messages; microversion
//! negotiation through the version document.
//!
//! This file holds the routes, the microversion and what every handler
//! shares, with share types, messages, pools and limits; [`shares`],
//! [`access`] and [`snapshots`] hold theirs.

mod access;
mod groups;
mod quotas;
mod shares;
mod snapshots;

use access::{get_access_rule, list_access_rules};
use groups::{
    create_group, create_group_snapshot, delete_group, delete_group_snapshot, get_group,
    get_group_snapshot, list_group_snapshots, list_groups,
};
use shares::{
    create_share, delete_share, export_locations, get_share, list_shares, share_action,
    update_share, update_share_metadata,
};
use snapshots::{create_snapshot, delete_snapshot, get_snapshot, list_snapshots};

use crate::AppState;
use crate::errors::{ApiErr, ApiResult, Style};
use crate::keystone::Ctx;
use crate::state::{AccessRuleRec, MessageRec, ShareRec, ShareSnapshotRec, World};
use axum::Json;
use axum::extract::{Path, Query, Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::Arc;

const S: Style = Style::Compute;

#[derive(Debug, Clone, Copy)]
pub struct ManilaMv(pub u32);

pub fn routes(state: Arc<AppState>) -> axum::Router<Arc<AppState>> {
    let v2 = axum::Router::new()
        .route("/shares", post(create_share))
        .route("/shares/detail", get(list_shares))
        .route(
            "/shares/{id}",
            get(get_share).put(update_share).delete(delete_share),
        )
        .route("/shares/{id}/action", post(share_action))
        .route("/shares/{id}/metadata", post(update_share_metadata))
        .route("/shares/{id}/export_locations", get(export_locations))
        .route("/share-access-rules", get(list_access_rules))
        .route("/share-access-rules/{id}", get(get_access_rule))
        .route("/snapshots", post(create_snapshot))
        .route("/snapshots/detail", get(list_snapshots))
        .route("/snapshots/{id}", get(get_snapshot).delete(delete_snapshot))
        .route("/share-groups", post(create_group))
        .route("/share-groups/detail", get(list_groups))
        .route("/share-groups/{id}", get(get_group).delete(delete_group))
        .route("/share-group-snapshots", post(create_group_snapshot))
        .route("/share-group-snapshots/detail", get(list_group_snapshots))
        .route(
            "/share-group-snapshots/{id}",
            get(get_group_snapshot).delete(delete_group_snapshot),
        )
        .route("/types", get(list_types))
        .route("/messages", get(list_messages))
        .route("/scheduler-stats/pools/detail", get(list_pools))
        .route("/limits", get(limits))
        .route(
            "/quota-sets/{target}",
            get(quotas::show_quotas).put(quotas::update_quotas),
        )
        .layer(middleware::from_fn_with_state(state, microversion));
    axum::Router::new().nest("/v2/{project_id}", v2)
}

/// Version discovery answers 300 Multiple Choices, as real Manila does.
pub async fn versions(State(state): State<Arc<AppState>>) -> (axum::http::StatusCode, Json<Value>) {
    let max = state.world().manila_max_minor;
    let base = format!("{}share/", state.base_url);
    (
        axum::http::StatusCode::MULTIPLE_CHOICES,
        Json(json!({ "versions": [
            { "id": "v1.0", "status": "DEPRECATED", "version": "", "min_version": "", "links": [{ "rel": "self", "href": format!("{base}v1/") }] },
            { "id": "v2.0", "status": "CURRENT", "version": format!("2.{max}"), "min_version": "2.0", "links": [{ "rel": "self", "href": format!("{base}v2/") }] }
        ]})),
    )
}

async fn microversion(
    State(state): State<Arc<AppState>>,
    mut req: Request,
    next: Next,
) -> Response {
    let max = state.world().manila_max_minor;
    let header = req
        .headers()
        .get("x-openstack-manila-api-version")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let minor = match header {
        None => 0,
        Some(v) => match v
            .trim()
            .strip_prefix("2.")
            .and_then(|m| m.parse::<u32>().ok())
        {
            Some(m) if m <= max => m,
            _ => {
                return ApiErr::new(406, S, format!("Version {} is not supported by the API. Minimum is 2.0 and maximum is 2.{max}.", v.trim()))
                    .into_response();
            }
        },
    };
    req.extensions_mut().insert(ManilaMv(minor));
    let mut resp = next.run(req).await;
    if let Ok(v) = format!("2.{minor}").parse() {
        resp.headers_mut()
            .insert("x-openstack-manila-api-version", v);
    }
    resp
}

fn check_project(ctx: &Ctx, project: &str) -> ApiResult<()> {
    if ctx.project_id != project {
        return Err(ApiErr::bad(
            S,
            format!(
                "Malformed request url: project_id '{project}' doesn't match the token's project"
            ),
        ));
    }
    Ok(())
}

fn share_json(s: &ShareRec) -> Value {
    // share_group_id and source_share_group_snapshot_member_id are shown
    // from 2.31 on; this emulator shows them always (the clients here ask
    // for 2.37 and up)
    json!({
        "share_group_id": s.share_group_id,
        "source_share_group_snapshot_member_id": s.source_member_id,
        "id": s.id, "name": s.name, "description": s.description, "status": s.status, "size": s.size,
        "share_proto": s.protocol, "share_type": s.share_type_id, "share_type_name": s.share_type_name,
        "share_network_id": s.share_network_id, "availability_zone": s.availability_zone,
        "snapshot_id": s.snapshot_id, "metadata": s.metadata, "created_at": s.created_at,
        "project_id": s.project_id, "is_public": false, "links": []
    })
}

fn rule_json(r: &AccessRuleRec) -> Value {
    json!({
        "id": r.id, "share_id": r.share_id, "access_type": r.access_type, "access_to": r.access_to,
        "access_level": r.access_level, "state": r.state, "access_key": r.access_key,
        "created_at": r.created_at, "metadata": r.metadata
    })
}

fn snapshot_json(s: &ShareSnapshotRec) -> Value {
    json!({
        "id": s.id, "name": s.name, "description": s.description, "share_id": s.share_id, "status": s.status,
        "size": s.size, "share_size": s.size, "created_at": s.created_at, "share_proto": null
    })
}

fn visible_share<'a>(w: &'a World, ctx: &Ctx, id: &str) -> ApiResult<&'a ShareRec> {
    w.shares
        .get(id)
        .filter(|s| s.project_id == ctx.project_id || ctx.admin)
        .ok_or_else(|| ApiErr::not_found(S, format!("Share {id} could not be found.")))
}

fn s(v: &Value, k: &str) -> Option<String> {
    v.get(k).and_then(Value::as_str).map(str::to_string)
}

/// Free space of the emulated backend pool.
const POOL_FREE_GIB: u64 = 1210;

const PROTOCOLS: &[&str] = &["NFS", "CIFS", "CEPHFS", "GLUSTERFS", "HDFS", "MAPRFS"];

async fn list_types(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
    Path(project): Path<String>,
) -> ApiResult<Json<Value>> {
    check_project(&ctx, &project)?;
    let w = state.world();
    let list: Vec<Value> = w
        .share_types
        .iter()
        .map(|t| {
            let dhss = t.extra_specs.get("driver_handles_share_servers").cloned().unwrap_or_else(|| "False".into());
            json!({ "id": t.id, "name": t.name, "extra_specs": t.extra_specs,
                    "required_extra_specs": { "driver_handles_share_servers": dhss }, "is_default": false })
        })
        .collect();
    Ok(Json(json!({ "share_types": list })))
}

async fn list_messages(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
    Path(project): Path<String>,
    Query(q): Query<BTreeMap<String, String>>,
) -> ApiResult<Json<Value>> {
    check_project(&ctx, &project)?;
    let w = state.world();
    let mut list: Vec<&MessageRec> = w
        .messages
        .iter()
        .filter(|m| m.project_id == ctx.project_id)
        .filter(|m| q.get("resource_id").is_none_or(|r| &m.resource_id == r))
        .collect();
    if q.get("sort_dir").map(String::as_str) != Some("asc") {
        list.reverse();
    }
    let list: Vec<Value> = list
        .into_iter()
        .map(|m| {
            json!({ "id": m.id, "resource_type": "SHARE", "resource_id": m.resource_id, "action_id": m.action_id,
                    "detail_id": m.detail_id, "user_message": m.user_message, "message_level": "ERROR",
                    "created_at": m.created_at, "request_id": "req-emulated" })
        })
        .collect();
    Ok(Json(json!({ "messages": list })))
}

/// Manila's `limit`/`offset` paging (400 for values that are not
/// non-negative integers).
fn page<T>(list: Vec<T>, q: &BTreeMap<String, String>) -> ApiResult<Vec<T>> {
    let num = |k: &str| -> ApiResult<Option<usize>> {
        match q.get(k) {
            None => Ok(None),
            Some(v) => v.parse::<usize>().map(Some).map_err(|_| {
                ApiErr::bad(
                    S,
                    format!("Invalid input received: {k} must be a non-negative integer: {v}"),
                )
            }),
        }
    };
    let offset = num("offset")?.unwrap_or(0);
    let limit = num("limit")?.unwrap_or(usize::MAX);
    Ok(list.into_iter().skip(offset).take(limit).collect())
}

/// Backend pools; only admins may read them (Manila's default policy).
async fn list_pools(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
    Path(project): Path<String>,
) -> ApiResult<Json<Value>> {
    check_project(&ctx, &project)?;
    if !ctx.admin {
        return Err(ApiErr::new(
            403,
            S,
            "Policy doesn't allow scheduler_stats:pools:detail to be performed.",
        ));
    }
    let w = state.world();
    let used: u64 = w.shares.values().map(|x| x.size).sum();
    Ok(Json(json!({ "pools": [{
        "name": "emulator@dummy#pool", "host": "emulator", "backend": "dummy", "pool": "pool",
        "capabilities": {
            "free_capacity_gb": POOL_FREE_GIB.saturating_sub(used), "total_capacity_gb": POOL_FREE_GIB,
            "share_backend_name": "dummy", "storage_protocol": "NFS_CIFS_CEPHFS",
            "snapshot_support": true, "create_share_from_snapshot_support": true,
            "driver_handles_share_servers": false
        }
    }]})))
}

async fn limits(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
    Path(project): Path<String>,
) -> ApiResult<Json<Value>> {
    check_project(&ctx, &project)?;
    let w = state.world();
    let (count, gib) = w
        .shares
        .values()
        .filter(|x| x.project_id == ctx.project_id)
        .fold((0u64, 0u64), |(c, g), x| (c + 1, g + x.size));
    Ok(Json(json!({ "limits": { "rate": [], "absolute": {
        "maxTotalShares": w.manila_quota(&ctx.project_id, "shares"), "totalSharesUsed": count,
        "maxTotalShareGigabytes": w.manila_quota(&ctx.project_id, "gigabytes"), "totalShareGigabytesUsed": gib,
        "maxTotalShareSnapshots": -1, "totalShareSnapshotsUsed": w.share_snapshots.values().filter(|x| x.project_id == ctx.project_id).count()
    }}})))
}
