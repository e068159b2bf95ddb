//! Manila v2: shares (creating → available, extending, shrinking,
//! deleting, error with a user message), export locations (admin-only
//! ones hidden from non-admins), access rules (queued_to_apply → active,
//! cephx access keys), snapshots, share types, messages; microversion
//! negotiation through the version document.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, Query, Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use base64::Engine as _;
use http::StatusCode;
use rand::RngCore;
use serde_json::{Value, json};

use crate::AppState;
use crate::errors::{ApiErr, ApiResult, Style};
use crate::keystone::Ctx;
use crate::state::{
    AccessRuleRec, Delays, MessageRec, ShareRec, ShareSnapshotRec, World, new_id, now_iso,
};

const S: Style = Style::Compute;

#[derive(Debug, Clone, Copy)]
pub struct ManilaMv(pub u32);

pub fn routes(state: Arc<AppState>) -> axum::Router<Arc<AppState>> {
    let v2 = axum::Router::new()
        .route("/shares", post(create_share))
        .route("/shares/detail", get(list_shares))
        .route("/shares/{id}", get(get_share).delete(delete_share))
        .route("/shares/{id}/action", post(share_action))
        .route("/shares/{id}/export_locations", get(export_locations))
        .route("/share-access-rules", get(list_access_rules))
        .route("/share-access-rules/{id}", get(get_access_rule))
        .route("/snapshots", post(create_snapshot))
        .route("/snapshots/detail", get(list_snapshots))
        .route("/snapshots/{id}", get(get_snapshot).delete(delete_snapshot))
        .route("/types", get(list_types))
        .route("/messages", get(list_messages))
        .route("/scheduler-stats/pools/detail", get(list_pools))
        .route("/limits", get(limits))
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
    json!({
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
        "created_at": r.created_at, "metadata": {}
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

async fn create_share(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
    Path(project): Path<String>,
    Json(body): Json<Value>,
) -> ApiResult<Response> {
    check_project(&ctx, &project)?;
    let spec = body
        .get("share")
        .ok_or_else(|| ApiErr::bad(S, "Share entity not found in request body"))?;
    let protocol = s(spec, "share_proto")
        .unwrap_or_default()
        .to_ascii_uppercase();
    if !PROTOCOLS.contains(&protocol.as_str()) {
        return Err(ApiErr::bad(
            S,
            format!(
                "Invalid share protocol provided: {protocol}. It is either disabled or unsupported."
            ),
        ));
    }
    let size = spec
        .get("size")
        .and_then(Value::as_u64)
        .filter(|s| *s > 0)
        .ok_or_else(|| {
            ApiErr::bad(
                S,
                "Invalid input received: Share size must be an integer greater than 0.",
            )
        })?;
    let mut w = state.world();
    let st = match s(spec, "share_type") {
        Some(t) => w
            .share_types
            .iter()
            .find(|x| x.id == t || x.name == t)
            .cloned()
            .ok_or_else(|| ApiErr::not_found(S, format!("Share type {t} not found.")))?,
        None => w
            .share_types
            .first()
            .cloned()
            .ok_or_else(|| ApiErr::bad(S, "No default share type is configured."))?,
    };
    let snapshot_id = s(spec, "snapshot_id");
    if let Some(sid) = &snapshot_id {
        let snap = w
            .share_snapshots
            .get(sid)
            .filter(|x| x.project_id == ctx.project_id)
            .ok_or_else(|| ApiErr::not_found(S, format!("Snapshot {sid} could not be found.")))?;
        let from_snapshot = st
            .extra_specs
            .get("create_share_from_snapshot_support")
            .is_some_and(|v| v.eq_ignore_ascii_case("true"));
        if !from_snapshot {
            return Err(ApiErr::bad(
                S,
                format!(
                    "Invalid input received: A new share may not be created from snapshot {sid} with share type {}: the type does not support create_share_from_snapshot_support.",
                    st.name
                ),
            ));
        }
        if snap.status != "available" {
            return Err(ApiErr::bad(
                S,
                format!(
                    "Invalid snapshot: Snapshot status must be available, is {}.",
                    snap.status
                ),
            ));
        }
        if size < snap.size {
            return Err(ApiErr::bad(
                S,
                format!(
                    "Invalid input received: Share size cannot be smaller than the snapshot size ({}).",
                    snap.size
                ),
            ));
        }
    }
    let az = s(spec, "availability_zone").unwrap_or_else(|| {
        state
            .availability_zones
            .first()
            .cloned()
            .unwrap_or_else(|| "nova".into())
    });
    if !state.availability_zones.contains(&az) {
        return Err(ApiErr::not_found(
            S,
            format!("Availability zone {az} could not be found."),
        ));
    }
    let used: Vec<&ShareRec> = w
        .shares
        .values()
        .filter(|x| x.project_id == ctx.project_id)
        .collect();
    let (count, gib) = (
        used.len() as i64,
        used.iter().map(|x| x.size as i64).sum::<i64>(),
    );
    if w.quotas.shares >= 0 && count + 1 > w.quotas.shares {
        return Err(ApiErr::new(
            413,
            S,
            format!(
                "Maximum number of shares allowed ({}) exceeded",
                w.quotas.shares
            ),
        ));
    }
    if w.quotas.share_gigabytes >= 0 && gib + size as i64 > w.quotas.share_gigabytes {
        return Err(ApiErr::new(
            413,
            S,
            "Requested share exceeds allowed project/user or share type gigabytes quota.",
        ));
    }
    let metadata = crate::state::metadata_of(spec);
    // the scheduler fails a share the backend pool cannot hold, like the
    // dummy backend of the test cloud (1210 GiB free), and says why
    let too_big = size > POOL_FREE_GIB;
    let fail = too_big || w.failing_share_creates > 0;
    if !too_big && fail {
        w.failing_share_creates -= 1;
    }
    let seq = w.next_seq();
    let share = ShareRec {
        seq,
        id: new_id(),
        project_id: ctx.project_id.clone(),
        name: s(spec, "name").unwrap_or_default(),
        description: s(spec, "description"),
        status: if snapshot_id.is_some() {
            "creating_from_snapshot".into()
        } else {
            "creating".into()
        },
        size,
        protocol: protocol.clone(),
        share_type_id: st.id.clone(),
        share_type_name: st.name.clone(),
        share_network_id: s(spec, "share_network_id"),
        availability_zone: az,
        snapshot_id,
        metadata,
        created_at: now_iso(),
        instance_id: new_id(),
    };
    let id = share.id.clone();
    let out = json!({ "share": share_json(&share) });
    w.shares.insert(id.clone(), share);
    let delay = Delays::d(w.delays.share_create_ms);
    drop(w);
    state.after(delay, move |_, w| {
        let project = w.shares.get(&id).map(|x| x.project_id.clone());
        if let Some(x) = w.shares.get_mut(&id)
            && x.status.starts_with("creating")
        {
            x.status = if fail { "error".into() } else { "available".into() };
            if !fail && x.protocol == "CEPHFS" {
                x.metadata.insert("__mount_options".into(), "fs=cephfs".into());
            }
        }
        if fail && let Some(project_id) = project {
            w.messages.push(MessageRec {
                id: new_id(),
                project_id,
                resource_id: id.clone(),
                action_id: "001".into(),
                // Manila's message_field: 008 capabilities, 009 capacity
                detail_id: if too_big { "009".into() } else { "008".into() },
                user_message: format!(
                    "allocate host: No storage could be allocated for this share request, {} filter didn't succeed.",
                    if too_big { "Capacity" } else { "Capabilities" }
                ),
                created_at: now_iso(),
            });
        }
    });
    Ok((StatusCode::OK, Json(out)).into_response())
}

async fn list_shares(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
    Path(project): Path<String>,
    Query(q): Query<BTreeMap<String, String>>,
) -> ApiResult<Json<Value>> {
    check_project(&ctx, &project)?;
    let w = state.world();
    let mut list: Vec<&ShareRec> = w
        .shares
        .values()
        .filter(|x| x.project_id == ctx.project_id)
        .filter(|x| q.get("name").is_none_or(|n| &x.name == n))
        .collect();
    list.sort_by_key(|x| std::cmp::Reverse(x.seq));
    if q.get("sort_dir").map(String::as_str) == Some("asc") {
        list.reverse();
    }
    let list = page(list, &q)?;
    Ok(Json(
        json!({ "shares": list.into_iter().map(share_json).collect::<Vec<_>>() }),
    ))
}

async fn get_share(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
    Path((project, id)): Path<(String, String)>,
) -> ApiResult<Json<Value>> {
    check_project(&ctx, &project)?;
    let w = state.world();
    Ok(Json(
        json!({ "share": share_json(visible_share(&w, &ctx, &id)?) }),
    ))
}

async fn delete_share(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
    Path((project, id)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    check_project(&ctx, &project)?;
    let mut w = state.world();
    let share = visible_share(&w, &ctx, &id)?;
    if !matches!(
        share.status.as_str(),
        "available" | "error" | "extending_error" | "shrinking_error"
    ) {
        return Err(ApiErr::bad(
            S,
            format!(
                "Invalid share: Share status must be one of ('available', 'error', 'inactive'), got {}.",
                share.status
            ),
        ));
    }
    let deps = w
        .share_snapshots
        .values()
        .filter(|x| x.share_id == id)
        .count();
    if deps > 0 {
        return Err(ApiErr::conflict(
            S,
            format!("Share still has {deps} dependent snapshots."),
        ));
    }
    if let Some(x) = w.shares.get_mut(&id) {
        x.status = "deleting".into();
    }
    let delay = Delays::d(w.delays.share_delete_ms);
    drop(w);
    state.after(delay, move |_, w| {
        w.shares.remove(&id);
        w.access_rules.retain(|_, r| r.share_id != id);
    });
    Ok(StatusCode::ACCEPTED)
}

async fn share_action(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
    axum::Extension(ManilaMv(mv)): axum::Extension<ManilaMv>,
    Path((project, id)): Path<(String, String)>,
    Json(body): Json<Value>,
) -> ApiResult<Response> {
    check_project(&ctx, &project)?;
    let (action, args) = body
        .as_object()
        .and_then(|o| o.iter().next())
        .map(|(k, v)| (k.trim_start_matches("os-").to_string(), v.clone()))
        .ok_or_else(|| ApiErr::bad(S, "Invalid request body"))?;
    let mut w = state.world();
    let share = visible_share(&w, &ctx, &id)?.clone();
    match action.as_str() {
        "extend" | "shrink" => {
            let new_size = args
                .get("new_size")
                .and_then(Value::as_u64)
                .ok_or_else(|| ApiErr::bad(S, "New share size must be specified as an integer."))?;
            if share.status != "available" {
                return Err(ApiErr::bad(
                    S,
                    format!(
                        "Invalid share: Share {id} status must be 'available', but current status is: {}.",
                        share.status
                    ),
                ));
            }
            let grow = action == "extend";
            if grow && new_size <= share.size {
                return Err(ApiErr::bad(
                    S,
                    format!(
                        "Invalid input received: New size for extend must be greater than current size. (current: {}, extended: {new_size}).",
                        share.size
                    ),
                ));
            }
            if !grow && (new_size >= share.size || new_size == 0) {
                return Err(ApiErr::bad(
                    S,
                    format!(
                        "Invalid input received: New size for shrink must be less than current size and greater than 0. (current: {}, new: {new_size}).",
                        share.size
                    ),
                ));
            }
            if let Some(x) = w.shares.get_mut(&id) {
                x.status = if grow {
                    "extending".into()
                } else {
                    "shrinking".into()
                };
            }
            let delay = Delays::d(w.delays.share_resize_ms);
            drop(w);
            state.after(delay, move |_, w| {
                if let Some(x) = w.shares.get_mut(&id) {
                    x.size = new_size;
                    x.status = "available".into();
                }
            });
            Ok(StatusCode::ACCEPTED.into_response())
        }
        "allow_access" => {
            let access_type = s(&args, "access_type").unwrap_or_default();
            let access_to = s(&args, "access_to").unwrap_or_default();
            let access_level = s(&args, "access_level").unwrap_or_else(|| "rw".into());
            validate_rule(&share.protocol, &access_type, &access_to, &access_level)?;
            if w.access_rules.values().any(|r| {
                r.share_id == id && r.access_type == access_type && r.access_to == access_to
            }) {
                return Err(ApiErr::bad(
                    S,
                    format!("Share access {access_type}:{access_to} exists."),
                ));
            }
            let rule = AccessRuleRec {
                id: new_id(),
                share_id: id.clone(),
                access_type: access_type.clone(),
                access_to,
                access_level,
                state: "queued_to_apply".into(),
                access_key: None,
                created_at: now_iso(),
            };
            let rid = rule.id.clone();
            let mut out = rule_json(&rule);
            if mv < 21 {
                out.as_object_mut().map(|o| o.remove("access_key"));
            }
            w.access_rules.insert(rid.clone(), rule);
            let delay = Delays::d(w.delays.access_rule_ms);
            drop(w);
            state.after(delay, move |_, w| {
                if let Some(r) = w.access_rules.get_mut(&rid)
                    && r.state == "queued_to_apply"
                {
                    r.state = "active".into();
                    if r.access_type == "cephx" {
                        let mut key = [0u8; 16];
                        rand::rng().fill_bytes(&mut key);
                        r.access_key = Some(base64::engine::general_purpose::STANDARD.encode(key));
                    }
                }
            });
            Ok(Json(json!({ "access": out })).into_response())
        }
        "deny_access" => {
            let rid = s(&args, "access_id")
                .ok_or_else(|| ApiErr::bad(S, "Access ID must be specified."))?;
            let r = w
                .access_rules
                .get_mut(&rid)
                .filter(|r| r.share_id == id)
                .ok_or_else(|| ApiErr::not_found(S, format!("Access rule {rid} not found.")))?;
            r.state = "queued_to_deny".into();
            let delay = Delays::d(w.delays.access_rule_ms);
            drop(w);
            state.after(delay, move |_, w| {
                w.access_rules.remove(&rid);
            });
            Ok(StatusCode::ACCEPTED.into_response())
        }
        "access_list" => {
            let list: Vec<Value> = w
                .access_rules
                .values()
                .filter(|r| r.share_id == id)
                .map(rule_json)
                .collect();
            Ok(Json(json!({ "access_list": list })).into_response())
        }
        other => Err(ApiErr::bad(
            S,
            format!("Invalid request body: unknown action {other}"),
        )),
    }
}

fn validate_rule(protocol: &str, access_type: &str, access_to: &str, level: &str) -> ApiResult<()> {
    if !matches!(level, "rw" | "ro") {
        return Err(ApiErr::bad(S, format!("Invalid access level: {level}.")));
    }
    match (protocol, access_type) {
        ("NFS", "ip") | ("CIFS", "ip") => {
            let (addr, prefix) = access_to.split_once('/').unwrap_or((access_to, "32"));
            let ok = addr.parse::<std::net::IpAddr>().is_ok()
                && prefix.parse::<u8>().is_ok_and(|p| p <= 128);
            if !ok {
                return Err(ApiErr::bad(
                    S,
                    format!("Invalid input received: Invalid IP access_to: {access_to}"),
                ));
            }
            Ok(())
        }
        ("CEPHFS", "cephx") => {
            if access_to.is_empty()
                || access_to.contains(char::is_whitespace)
                || access_to == "admin"
            {
                return Err(ApiErr::bad(
                    S,
                    format!("Invalid input received: Invalid cephx access_to: {access_to:?}"),
                ));
            }
            Ok(())
        }
        (p, t) => Err(ApiErr::bad(
            S,
            format!(
                "Invalid share access type: only {} access is supported for {p} shares, not {t}.",
                if p == "CEPHFS" { "cephx" } else { "ip" }
            ),
        )),
    }
}

async fn export_locations(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
    Path((project, id)): Path<(String, String)>,
) -> ApiResult<Json<Value>> {
    check_project(&ctx, &project)?;
    let w = state.world();
    let share = visible_share(&w, &ctx, &id)?;
    if share.status != "available"
        && !share.status.starts_with("extending")
        && !share.status.starts_with("shrinking")
    {
        return Ok(Json(json!({ "export_locations": [] })));
    }
    let mut list = vec![];
    if share.protocol == "CEPHFS" {
        list.push(json!({
            "id": format!("{}-1", share.instance_id), "share_instance_id": share.instance_id,
            "path": format!("127.0.0.1:6789:/volumes/_nogroup/{}/{}", share.id, share.instance_id),
            "preferred": true, "is_admin_only": false, "metadata": {}
        }));
    } else {
        list.push(json!({
            "id": format!("{}-1", share.instance_id), "share_instance_id": share.instance_id,
            "path": format!("127.0.0.1:/shares/share-{}", share.id), "preferred": true, "is_admin_only": false, "metadata": {}
        }));
        list.push(json!({
            "id": format!("{}-2", share.instance_id), "share_instance_id": share.instance_id,
            "path": format!("127.0.0.2:/shares/share-{}", share.id), "preferred": false, "is_admin_only": true, "metadata": {}
        }));
    }
    if !ctx.admin {
        list.retain(|l| l["is_admin_only"] != json!(true));
        for l in &mut list {
            l.as_object_mut().map(|o| o.remove("share_instance_id"));
        }
    }
    Ok(Json(json!({ "export_locations": list })))
}

async fn list_access_rules(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
    axum::Extension(ManilaMv(mv)): axum::Extension<ManilaMv>,
    Path(project): Path<String>,
    Query(q): Query<BTreeMap<String, String>>,
) -> ApiResult<Json<Value>> {
    check_project(&ctx, &project)?;
    if mv < 45 {
        return Err(ApiErr::not_found(S, "The resource could not be found."));
    }
    let share_id = q
        .get("share_id")
        .ok_or_else(|| ApiErr::bad(S, "share_id must be specified."))?;
    let w = state.world();
    visible_share(&w, &ctx, share_id)?;
    let list: Vec<Value> = w
        .access_rules
        .values()
        .filter(|r| &r.share_id == share_id)
        .map(rule_json)
        .collect();
    Ok(Json(json!({ "access_list": list })))
}

async fn get_access_rule(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
    axum::Extension(ManilaMv(mv)): axum::Extension<ManilaMv>,
    Path((project, id)): Path<(String, String)>,
) -> ApiResult<Json<Value>> {
    check_project(&ctx, &project)?;
    if mv < 45 {
        return Err(ApiErr::not_found(S, "The resource could not be found."));
    }
    let w = state.world();
    let r = w
        .access_rules
        .get(&id)
        .ok_or_else(|| ApiErr::not_found(S, format!("Access rule {id} not found.")))?;
    visible_share(&w, &ctx, &r.share_id)?;
    Ok(Json(json!({ "access": rule_json(r) })))
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

async fn list_snapshots(
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

async fn get_snapshot(
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

async fn delete_snapshot(
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
        "maxTotalShares": w.quotas.shares, "totalSharesUsed": count,
        "maxTotalShareGigabytes": w.quotas.share_gigabytes, "totalShareGigabytesUsed": gib,
        "maxTotalShareSnapshots": -1, "totalShareSnapshotsUsed": w.share_snapshots.values().filter(|x| x.project_id == ctx.project_id).count()
    }}})))
}
