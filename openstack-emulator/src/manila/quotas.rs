//! A project's quotas (`quota-sets/{project}`), as Manila's
//! `api/v2/quota_sets.py` answers them: anyone reads their own project's,
//! an admin any project's and sets them; a limit below what the project
//! uses already is refused unless `force` says so.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, Query, State};
use serde_json::{Map, Value, json};

use crate::AppState;
use crate::errors::{ApiErr, ApiResult};
use crate::keystone::Ctx;
use crate::state::World;

use super::*;

/// Manila's quota keys at microversion 2.65 (`quota-sets`), in its order.
pub const MANILA_QUOTA_KEYS: [&str; 10] = [
    "shares",
    "gigabytes",
    "snapshots",
    "snapshot_gigabytes",
    "share_networks",
    "share_groups",
    "share_group_snapshots",
    "share_replicas",
    "replica_gigabytes",
    "per_share_gigabytes",
];

impl World {
    /// `project`'s Manila limit for `key` (one of MANILA_QUOTA_KEYS): what
    /// an admin set for it, else the emulator's quota (-1 where it has
    /// none).
    pub fn manila_quota(&self, project: &str, key: &str) -> i64 {
        if let Some(v) = self
            .manila_project_quotas
            .get(project)
            .and_then(|q| q.get(key))
        {
            return *v;
        }
        match key {
            "shares" => self.quotas.shares,
            "gigabytes" => self.quotas.share_gigabytes,
            "share_group_snapshots" => self.quotas.share_group_snapshots,
            _ => -1,
        }
    }
}

/// Keys a quota set may carry besides limits (Manila's NON_QUOTA_KEYS).
const NON_QUOTA_KEYS: [&str; 4] = ["tenant_id", "id", "force", "share_type"];

pub(super) async fn show_quotas(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
    Path((project, target)): Path<(String, String)>,
) -> ApiResult<Json<Value>> {
    check_project(&ctx, &project)?;
    if !ctx.admin && target != ctx.project_id {
        return Err(ApiErr::forbidden(
            S,
            "Policy doesn't allow quota_set:show to be performed.",
        ));
    }
    Ok(Json(quota_set(&state.world(), &target)))
}

pub(super) async fn update_quotas(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
    Path((project, target)): Path<(String, String)>,
    Query(query): Query<BTreeMap<String, String>>,
    Json(body): Json<Value>,
) -> ApiResult<Json<Value>> {
    check_project(&ctx, &project)?;
    if !ctx.admin {
        return Err(ApiErr::forbidden(
            S,
            "Policy doesn't allow quota_set:update to be performed.",
        ));
    }
    if query.contains_key("user_id") || query.contains_key("share_type") {
        // per-user and per-share-type quotas are not kept here: refuse
        // rather than set the project's
        return Err(ApiErr::bad(
            S,
            "the emulator keeps no per-user or per-share-type quotas",
        ));
    }
    let set = body
        .get("quota_set")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    if !MANILA_QUOTA_KEYS
        .iter()
        .any(|k| set.get(*k).is_some_and(|v| !v.is_null()))
    {
        return Err(ApiErr::bad(
            S,
            "Must supply at least one quota field to update.",
        ));
    }
    let bad: Vec<&str> = set
        .keys()
        .map(String::as_str)
        .filter(|k| !MANILA_QUOTA_KEYS.contains(k) && !NON_QUOTA_KEYS.contains(k))
        .collect();
    if !bad.is_empty() {
        return Err(ApiErr::bad(
            S,
            format!("Bad key(s) {} in quota_set.", bad.join(",")),
        ));
    }
    let force = set.get("force").is_some_and(|f| {
        f.as_bool()
            .or_else(|| {
                f.as_str().map(|s| {
                    matches!(
                        s.to_ascii_lowercase().as_str(),
                        "true" | "1" | "yes" | "on" | "y" | "t"
                    )
                })
            })
            .unwrap_or(false)
    });
    let mut w = state.world();
    let used = in_use(&w, &target);
    let mut limits = BTreeMap::new();
    for key in MANILA_QUOTA_KEYS {
        let Some(v) = set.get(key).filter(|v| !v.is_null()) else {
            continue;
        };
        let limit = v
            .as_i64()
            .or_else(|| v.as_str().and_then(|s| s.trim().parse().ok()))
            .ok_or_else(|| ApiErr::bad(S, format!("Quota '{v}' for {key} should be integer.")))?;
        let used = used.get(key).copied().unwrap_or(0);
        // as quota_sets.py checks: against use when a limit is set, then
        // the settable minimum (the use) unless unlimited or forced
        if !force && limit >= 0 && w.manila_quota(&target, key) >= 0 && used > limit {
            return Err(ApiErr::bad(
                S,
                format!(
                    "Quota value {limit} for {key} is smaller than already used and reserved {used}."
                ),
            ));
        }
        if limit < -1 {
            return Err(ApiErr::bad(S, "Quota limit must be -1 or greater."));
        }
        if !force && limit != -1 && limit < used {
            return Err(ApiErr::bad(
                S,
                format!("Quota limit must be greater than {used}."),
            ));
        }
        limits.insert(key.to_string(), limit);
    }
    w.manila_project_quotas
        .entry(target.clone())
        .or_default()
        .extend(limits);
    Ok(Json(quota_set(&w, &target)))
}

fn quota_set(w: &World, project: &str) -> Value {
    let mut q = Map::new();
    q.insert("id".into(), json!(project));
    for key in MANILA_QUOTA_KEYS {
        q.insert(key.into(), json!(w.manila_quota(project, key)));
    }
    json!({ "quota_set": q })
}

/// What `project` holds of each resource a quota counts.
fn in_use(w: &World, project: &str) -> BTreeMap<&'static str, i64> {
    let shares: Vec<_> = w
        .shares
        .values()
        .filter(|x| x.project_id == project)
        .collect();
    let count = |n: usize| n as i64;
    BTreeMap::from([
        ("shares", count(shares.len())),
        (
            "gigabytes",
            shares.iter().map(|x| x.size as i64).sum::<i64>(),
        ),
        (
            "snapshots",
            count(
                w.share_snapshots
                    .values()
                    .filter(|x| x.project_id == project)
                    .count(),
            ),
        ),
        (
            "share_groups",
            count(
                w.share_groups
                    .values()
                    .filter(|x| x.project_id == project)
                    .count(),
            ),
        ),
        (
            "share_group_snapshots",
            count(
                w.share_group_snapshots
                    .values()
                    .filter(|x| x.project_id == project)
                    .count(),
            ),
        ),
    ])
}
