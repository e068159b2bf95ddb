//! Access rules: what a rule may name for each protocol, and rules
//! listed and read (cephx keys once active).

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, Query, State};
use serde_json::{Value, json};

use crate::AppState;
use crate::errors::{ApiErr, ApiResult};
use crate::keystone::Ctx;

use super::*;

pub(super) fn validate_rule(
    protocol: &str,
    access_type: &str,
    access_to: &str,
    level: &str,
) -> ApiResult<()> {
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

pub(super) async fn list_access_rules(
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

pub(super) async fn get_access_rule(
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
