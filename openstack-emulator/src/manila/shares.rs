//! Shares: created (scheduled onto a pool, or refused with a user
//! message), listed, read, deleted, and their actions (access, extend,
//! shrink, revert); their export locations.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use http::StatusCode;
use rand::RngCore;
use serde_json::{Value, json};

use crate::AppState;
use crate::errors::{ApiErr, ApiResult};
use crate::keystone::Ctx;
use crate::state::{AccessRuleRec, Delays, MessageRec, ShareRec, new_id, now_iso};

use super::access::validate_rule;
use super::*;

pub(super) async fn create_share(
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
    let share_group_id = s(spec, "share_group_id");
    let group_zone = match &share_group_id {
        None => None,
        Some(gid) => {
            let g = w
                .share_groups
                .get(gid)
                .filter(|g| g.project_id == ctx.project_id)
                .ok_or_else(|| {
                    ApiErr::not_found(S, format!("Share group {gid} could not be found."))
                })?;
            if g.status != "available" {
                return Err(ApiErr::bad(
                    S,
                    format!(
                        "Invalid share group: Share group status must be available, not {}.",
                        g.status
                    ),
                ));
            }
            if !g.share_type_ids.contains(&st.id) {
                return Err(ApiErr::bad(
                    S,
                    format!(
                        "Invalid input received: The specified share type ({}) is not supported by the specified share group.",
                        st.id
                    ),
                ));
            }
            Some(g.availability_zone.clone())
        }
    };
    if let (Some(gz), Some(az)) = (&group_zone, s(spec, "availability_zone"))
        && gz != &az
    {
        return Err(ApiErr::bad(
            S,
            format!(
                "Invalid input received: Share cannot have AZ ('{az}') different than share group's one ({gz})."
            ),
        ));
    }
    let az = group_zone
        .or_else(|| s(spec, "availability_zone"))
        .unwrap_or_else(|| {
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
    let max_shares = w.manila_quota(&ctx.project_id, "shares");
    if max_shares >= 0 && count + 1 > max_shares {
        return Err(ApiErr::quota(
            S,
            format!("Maximum number of shares allowed ({max_shares}) exceeded"),
        ));
    }
    let max_gib = w.manila_quota(&ctx.project_id, "gigabytes");
    if max_gib >= 0 && gib + size as i64 > max_gib {
        return Err(ApiErr::quota(
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
        share_group_id,
        source_member_id: None,
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

pub(super) async fn list_shares(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
    Path(project): Path<String>,
    Query(q): Query<BTreeMap<String, String>>,
) -> ApiResult<Json<Value>> {
    check_project(&ctx, &project)?;
    let filter = crate::state::metadata_filter(&q, S)?;
    let w = state.world();
    let mut list: Vec<&ShareRec> = w
        .shares
        .values()
        .filter(|x| x.project_id == ctx.project_id)
        .filter(|x| q.get("name").is_none_or(|n| &x.name == n))
        .filter(|x| {
            q.get("share_group_id")
                .is_none_or(|g| x.share_group_id.as_ref() == Some(g))
        })
        .filter(|x| crate::state::metadata_matches(&x.metadata, filter.as_ref()))
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

pub(super) async fn get_share(
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

/// `POST /shares/{id}/metadata`: merges the keys given into the share's
/// metadata and answers with all of it (Manila's "update share metadata").
pub(super) async fn update_share_metadata(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
    Path((project, id)): Path<(String, String)>,
    Json(body): Json<Value>,
) -> ApiResult<Json<Value>> {
    check_project(&ctx, &project)?;
    let given = body
        .get("metadata")
        .and_then(Value::as_object)
        .ok_or_else(|| ApiErr::bad(S, "Malformed request body"))?;
    let mut merged = Vec::new();
    for (k, v) in given {
        let v = v
            .as_str()
            .ok_or_else(|| ApiErr::bad(S, format!("Metadata value for {k} must be a string")))?;
        if k.is_empty() || k.len() > 255 || v.len() > 1023 {
            return Err(ApiErr::bad(S, "Invalid metadata key or value length"));
        }
        merged.push((k.clone(), v.to_string()));
    }
    let mut w = state.world();
    visible_share(&w, &ctx, &id)?;
    let share = w
        .shares
        .get_mut(&id)
        .ok_or_else(|| ApiErr::not_found(S, format!("Share {id} could not be found.")))?;
    share.metadata.extend(merged);
    Ok(Json(json!({ "metadata": share.metadata })))
}

/// `PUT /shares/{id}`: renames (`display_name`) or redescribes it.
pub(super) async fn update_share(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
    Path((project, id)): Path<(String, String)>,
    Json(body): Json<Value>,
) -> ApiResult<Json<Value>> {
    check_project(&ctx, &project)?;
    let spec = body
        .get("share")
        .ok_or_else(|| ApiErr::bad(S, "Share entity not found in request body"))?;
    let mut w = state.world();
    visible_share(&w, &ctx, &id)?;
    let share = w
        .shares
        .get_mut(&id)
        .ok_or_else(|| ApiErr::not_found(S, format!("Share {id} could not be found.")))?;
    if let Some(n) = s(spec, "display_name") {
        share.name = n;
    }
    if let Some(d) = s(spec, "display_description") {
        share.description = Some(d);
    }
    Ok(Json(json!({ "share": share_json(share) })))
}

pub(super) async fn delete_share(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
    Path((project, id)): Path<(String, String)>,
    Query(q): Query<BTreeMap<String, String>>,
) -> ApiResult<StatusCode> {
    check_project(&ctx, &project)?;
    let mut w = state.world();
    let share = visible_share(&w, &ctx, &id)?;
    if let Some(g) = &share.share_group_id {
        match q.get("share_group_id") {
            None => {
                return Err(ApiErr::bad(
                    S,
                    "Must provide 'share_group_id' as a request parameter when deleting a share in a share group.",
                ));
            }
            Some(given) if given != g => {
                return Err(ApiErr::bad(
                    S,
                    "The specified 'share_group_id' does not match the share group id of the share.",
                ));
            }
            Some(_) => {}
        }
    }
    let members = w
        .share_group_snapshots
        .values()
        .flat_map(|g| &g.members)
        .filter(|m| m.share_id == id)
        .count();
    if members > 0 {
        return Err(ApiErr::new(
            403,
            S,
            format!(
                "Invalid share: Share still has {members} dependent share group snapshot members."
            ),
        ));
    }
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

pub(super) async fn share_action(
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
            let gib: i64 = w
                .shares
                .values()
                .filter(|x| x.project_id == ctx.project_id)
                .map(|x| x.size as i64)
                .sum();
            let q = w.manila_quota(&ctx.project_id, "gigabytes");
            if grow && q >= 0 && gib + (new_size - share.size) as i64 > q {
                // Manila's extend answers its quota with 403, not the
                // 413 of a create
                return Err(ApiErr::new(
                    403,
                    S,
                    "Requested share exceeds allowed project/user or share type gigabytes quota.",
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
            // Manila reads a rule's metadata from 2.45 on (strings only)
            let mut metadata = BTreeMap::new();
            if mv >= 45
                && let Some(m) = args.get("metadata").filter(|m| !m.is_null())
            {
                let Some(m) = m.as_object() else {
                    return Err(ApiErr::bad(
                        S,
                        "Invalid input received: metadata must be a dict",
                    ));
                };
                for (k, v) in m {
                    let Some(v) = v.as_str() else {
                        return Err(ApiErr::bad(
                            S,
                            format!(
                                "Invalid input received: metadata value of {k} is not a string"
                            ),
                        ));
                    };
                    if k.is_empty() || k.len() > 255 || v.len() > 1023 {
                        return Err(ApiErr::bad(
                            S,
                            "Invalid input received: metadata key or value out of bounds",
                        ));
                    }
                    metadata.insert(k.clone(), v.to_string());
                }
            }
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
                metadata,
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

pub(super) async fn export_locations(
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
