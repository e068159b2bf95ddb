//! Nova v2.1: servers, `os-volume_attachments` (which drive Cinder's
//! attachment state and the simulated hypervisor), flavors, and the
//! metadata service's `meta_data.json`.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use http::StatusCode;
use serde_json::{Value, json};

use crate::AppState;
use crate::errors::{ApiErr, ApiResult, Style};
use crate::keystone::Ctx;
use crate::state::{AttachmentRec, Delays, PendingAttachmentRec, ServerRec, World, new_id};

const S: Style = Style::Compute;
const MAX_MINOR: u32 = 96;

#[derive(Debug, Clone, Copy)]
pub struct NovaMv(pub u32);

pub fn routes(_state: Arc<AppState>) -> axum::Router<Arc<AppState>> {
    axum::Router::new()
        .route("/servers", post(create_server))
        .route("/servers/{id}", get(get_server).delete(delete_server))
        .route(
            "/servers/{id}/os-volume_attachments",
            get(list_attachments).post(attach),
        )
        .route(
            "/servers/{id}/os-volume_attachments/{volume_id}",
            delete(detach),
        )
        .route("/servers/{id}/action", post(server_action))
        .route(
            "/servers/{id}/os-instance-actions",
            get(list_instance_actions),
        )
        .route("/flavors", get(flavors))
        .layer(middleware::from_fn(microversion))
}

async fn microversion(mut req: Request, next: Next) -> Response {
    let legacy = req
        .headers()
        .get("x-openstack-nova-api-version")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let modern = req
        .headers()
        .get("openstack-api-version")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("compute "))
        .map(str::to_string);
    let minor = match modern.or(legacy) {
        None => 1,
        Some(v) => match v
            .trim()
            .strip_prefix("2.")
            .and_then(|m| m.parse::<u32>().ok())
        {
            Some(m) if (1..=MAX_MINOR).contains(&m) => m,
            _ => {
                return ApiErr::new(
                    406,
                    S,
                    format!("Version {} is not supported by the API. Minimum is 2.1 and maximum is 2.{MAX_MINOR}.", v.trim()),
                )
                .into_response();
            }
        },
    };
    req.extensions_mut().insert(NovaMv(minor));
    let mut resp = next.run(req).await;
    if let Ok(v) = format!("2.{minor}").parse() {
        resp.headers_mut().insert("x-openstack-nova-api-version", v);
    }
    if let Ok(v) = format!("compute 2.{minor}").parse() {
        resp.headers_mut().insert("openstack-api-version", v);
    }
    resp
}

fn server_json(s: &ServerRec) -> Value {
    let vols: Vec<Value> = s
        .volumes
        .keys()
        .map(|v| json!({ "id": v, "delete_on_termination": false }))
        .collect();
    json!({
        "id": s.id, "name": s.name, "status": s.status, "tenant_id": s.project_id,
        "OS-EXT-AZ:availability_zone": s.availability_zone, "OS-EXT-STS:task_state": null,
        "OS-EXT-STS:vm_state": s.status.to_ascii_lowercase(),
        "os-extended-volumes:volumes_attached": vols, "addresses": {}, "links": [],
        "image": if s.local_disks > 0 { json!({"id": "emulator-image", "links": []}) } else { json!("") },
        "flavor": {"original_name": "emulator", "vcpus": 1, "ram": 512,
                   "disk": u32::from(s.local_disks > 0), "ephemeral": u32::from(s.local_disks > 1),
                   "swap": if s.local_disks > 2 { 512 } else { 0 }, "extra_specs": {}}
    })
}

fn visible_server<'a>(w: &'a World, ctx: &Ctx, id: &str) -> ApiResult<&'a ServerRec> {
    w.servers
        .get(id)
        .filter(|s| s.project_id == ctx.project_id || ctx.admin)
        .ok_or_else(|| ApiErr::not_found(S, format!("Instance {id} could not be found.")))
}

/// Creates an ACTIVE server: booted from a bootable volume (the API), or
/// through the admin API as if from an image, with `local_disks` disks of
/// its own (a root, then ephemeral and swap; there is no image service).
pub fn insert_server(
    w: &mut World,
    project_id: &str,
    name: &str,
    az: &str,
    local_disks: u32,
) -> ServerRec {
    insert_server_as(w, new_id(), project_id, name, az, local_disks)
}

/// The same under a given id.
pub fn insert_server_as(
    w: &mut World,
    id: String,
    project_id: &str,
    name: &str,
    az: &str,
    local_disks: u32,
) -> ServerRec {
    let s = ServerRec {
        id,
        name: name.to_string(),
        project_id: project_id.to_string(),
        status: "ACTIVE".into(),
        availability_zone: az.to_string(),
        volumes: BTreeMap::new(),
        local_disks: local_disks.min(3),
    };
    w.servers.insert(s.id.clone(), s.clone());
    w.record_instance_action(&s.id, project_id, "create");
    s
}

async fn create_server(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
    axum::Extension(NovaMv(mv)): axum::Extension<NovaMv>,
    Json(body): Json<Value>,
) -> ApiResult<Response> {
    let spec = body
        .get("server")
        .ok_or_else(|| ApiErr::bad(S, "Invalid input for field/attribute server."))?;
    let name = spec
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| ApiErr::bad(S, "Invalid input for field/attribute name."))?;
    if spec.get("networks").and_then(Value::as_str) == Some("none") && mv < 37 {
        return Err(ApiErr::bad(
            S,
            "Invalid input for field/attribute networks. Value: none. 'none' is not of type 'array'",
        ));
    }
    let az = spec
        .get("availability_zone")
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| {
            state
                .availability_zones
                .first()
                .cloned()
                .unwrap_or_else(|| "nova".into())
        });
    if !state.availability_zones.contains(&az) {
        return Err(ApiErr::bad(
            S,
            "The requested availability zone is not available",
        ));
    }
    let mut w = state.world();
    let boot = spec
        .pointer("/block_device_mapping_v2/0/uuid")
        .and_then(Value::as_str)
        .ok_or_else(|| {
            ApiErr::bad(
                S,
                "Block Device Mapping is Invalid: this emulator boots only from a volume.",
            )
        })?
        .to_string();
    let vol = w
        .volumes
        .get(&boot)
        .filter(|v| v.project_id == ctx.project_id)
        .ok_or_else(|| {
            ApiErr::bad(
                S,
                format!("Block Device Mapping is Invalid: failed to get volume {boot}."),
            )
        })?;
    if !vol.bootable || vol.status != "available" {
        return Err(ApiErr::bad(
            S,
            format!(
                "Block Device Mapping is Invalid: Volume {boot} is not bootable or not available."
            ),
        ));
    }
    let mut s = insert_server(&mut w, &ctx.project_id, name, &az, 0);
    let device = "/dev/vda".to_string();
    if let Some(v) = w.volumes.get_mut(&boot) {
        v.status = "in-use".into();
        v.attachments.push(AttachmentRec {
            attachment_id: new_id(),
            server_id: s.id.clone(),
            device: device.clone(),
        });
    }
    s.volumes.insert(boot.clone(), device.clone());
    if let Some(rec) = w.servers.get_mut(&s.id) {
        rec.volumes.insert(boot, device);
    }
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({ "server": { "id": s.id, "links": [], "adminPass": "x" } })),
    )
        .into_response())
}

async fn get_server(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    let w = state.world();
    Ok(Json(
        json!({ "server": server_json(visible_server(&w, &ctx, &id)?) }),
    ))
}

async fn delete_server(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    let volumes: Vec<String> = {
        let mut w = state.world();
        let s = visible_server(&w, &ctx, &id)?.clone();
        w.servers.remove(&id);
        w.record_instance_action(&id, &s.project_id, "delete");
        if w.metadata_instance.as_deref() == Some(id.as_str()) {
            w.metadata_instance = None;
        }
        s.volumes.into_keys().collect()
    };
    // its volumes are released before the answer
    for vol in volumes {
        release_attachment(&state, &id, &vol).await;
    }
    Ok(StatusCode::NO_CONTENT)
}

/// `os-stop` and `os-start`: a shut-off server keeps its volumes, and
/// Nova attaches to and detaches from it as from a running one.
async fn server_action(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
    Path(id): Path<String>,
    Json(body): Json<Value>,
) -> ApiResult<StatusCode> {
    let mut w = state.world();
    let status = visible_server(&w, &ctx, &id)?.status.clone();
    let (want, from) = if body.get("os-stop").is_some() {
        ("SHUTOFF", "ACTIVE")
    } else if body.get("os-start").is_some() {
        ("ACTIVE", "SHUTOFF")
    } else {
        return Err(ApiErr::bad(S, "There is no such action"));
    };
    if status != from {
        return Err(ApiErr::conflict(
            S,
            format!(
                "Cannot 'action' instance {id} while it is in vm_state {}",
                status.to_lowercase()
            ),
        ));
    }
    if let Some(s) = w.servers.get_mut(&id) {
        s.status = want.into();
        let project = s.project_id.clone();
        let action = if want == "SHUTOFF" { "stop" } else { "start" };
        w.record_instance_action(&id, &project, action);
    }
    Ok(StatusCode::ACCEPTED)
}

/// `os-instance-actions`: what was done to the server, newest first; from
/// 2.21 a deleted server's too (its project's members and admins see it;
/// anyone else gets the 404 of a server that does not exist).
async fn list_instance_actions(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
    axum::Extension(NovaMv(mv)): axum::Extension<NovaMv>,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    let w = state.world();
    let not_found = || ApiErr::not_found(S, format!("Instance {id} could not be found."));
    let rec = w
        .instance_actions
        .get(&id)
        .filter(|r| r.project_id == ctx.project_id || ctx.admin)
        .filter(|r| !r.deleted || mv >= 21)
        .ok_or_else(not_found)?;
    let list: Vec<Value> = rec
        .actions
        .iter()
        .rev()
        .map(|a| {
            let mut v = json!({
                "action": a.action, "instance_uuid": id, "request_id": a.request_id,
                "project_id": rec.project_id, "user_id": null, "start_time": a.start_time,
                "message": null,
            });
            if mv >= 58 {
                v["updated_at"] = json!(a.start_time);
            }
            v
        })
        .collect();
    Ok(Json(json!({ "instanceActions": list })))
}

fn attachment_json(server_id: &str, volume_id: &str, device: &str) -> Value {
    json!({ "id": volume_id, "volumeId": volume_id, "serverId": server_id, "device": device })
}

async fn list_attachments(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    let w = state.world();
    let s = visible_server(&w, &ctx, &id)?;
    let list: Vec<Value> = s
        .volumes
        .iter()
        .map(|(v, d)| attachment_json(&s.id, v, d))
        .collect();
    Ok(Json(json!({ "volumeAttachments": list })))
}

async fn attach(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
    axum::Extension(NovaMv(mv)): axum::Extension<NovaMv>,
    Path(server_id): Path<String>,
    Json(body): Json<Value>,
) -> ApiResult<Json<Value>> {
    let volume_id = body
        .pointer("/volumeAttachment/volumeId")
        .and_then(Value::as_str)
        .ok_or_else(|| ApiErr::bad(S, "Invalid input for field/attribute volumeAttachment."))?
        .to_string();
    let mut w = state.world();
    visible_server(&w, &ctx, &server_id)?;
    let vol = w
        .volumes
        .get(&volume_id)
        .filter(|v| v.project_id == ctx.project_id || ctx.admin)
        .ok_or_else(|| ApiErr::not_found(S, format!("Volume {volume_id} could not be found.")))?
        .clone();
    if vol.multiattach && mv < 60 {
        return Err(ApiErr::bad(
            S,
            "Multiattach volumes are only supported starting with compute API version 2.60.",
        ));
    }
    if w.servers
        .get(&server_id)
        .is_some_and(|s| s.volumes.contains_key(&volume_id))
    {
        return Err(ApiErr::bad(
            S,
            format!("Invalid volume: volume {volume_id} already attached"),
        ));
    }
    let ok = vol.status == "available" || (vol.status == "in-use" && vol.multiattach);
    if !ok {
        return Err(ApiErr::bad(
            S,
            format!(
                "Invalid volume: volume '{volume_id}' status must be 'available'. Currently in '{}'",
                vol.status
            ),
        ));
    }
    // `[cinder] cross_az_attach = False`: checked in the API call, before
    // anything is reserved (nova/volume/cinder.py check_availability_zone)
    if !w.cross_az_attach
        && let Some(server) = w.servers.get(&server_id)
        && server.availability_zone != vol.availability_zone
    {
        return Err(ApiErr::bad(
            S,
            format!(
                "Invalid volume: Instance {server_id} and volume {volume_id} are not in the same availability_zone. Instance is in {}. Volume is in {}",
                server.availability_zone, vol.availability_zone
            ),
        ));
    }
    // Nova counts every disk, the root included (a volume of those booted
    // from one), and refuses in the API call (403 TooManyDiskDevices)
    // before anything is reserved
    let max = w.max_disk_devices_to_attach;
    let disks = w
        .servers
        .get(&server_id)
        .map_or(0, |s| s.volumes.len() + s.local_disks as usize) as i64;
    if max >= 0 && disks + 1 > max {
        return Err(ApiErr::forbidden(
            S,
            format!(
                "The maximum allowed number of disk devices ({max}) to attach to a single instance has been exceeded."
            ),
        ));
    }
    let device = w.next_device(&server_id);
    if let Some(s) = w.servers.get_mut(&server_id) {
        s.volumes.insert(volume_id.clone(), device.clone());
        let project = s.project_id.clone();
        w.record_instance_action(&server_id, &project, "attach_volume");
    }
    let was_in_use = vol.status == "in-use";
    // Nova's API reserves the volume in Cinder (an attachment of its own)
    // before its compute host connects it
    let attachment_id = new_id();
    if let Some(v) = w.volumes.get_mut(&volume_id) {
        v.pending_attachments.push(PendingAttachmentRec {
            attachment_id: attachment_id.clone(),
            server_id: server_id.clone(),
            status: "reserved".into(),
        });
        if !was_in_use {
            v.status = "reserved".into();
            v.touch();
        }
    }
    // injected faults of the compute host
    let loses_cleanup = take_one(&mut w.attaches_losing_cleanup);
    let stalls = !loses_cleanup && take_one(&mut w.attaches_stalling);
    let delay = Delays::d(w.delays.volume_attach_ms);
    drop(w);
    let st = state.clone();
    let (sid, vid, dev) = (server_id.clone(), volume_id.clone(), device.clone());
    tokio::spawn(async move {
        tokio::time::sleep(delay / 2).await;
        if loses_cleanup {
            // the host failed the attach and rolled back Nova's record,
            // but its call to delete Cinder's attachment was lost
            let mut w = st.world();
            if let Some(s) = w.servers.get_mut(&sid) {
                s.volumes.remove(&vid);
            }
            return;
        }
        {
            let mut w = st.world();
            if let Some(v) = w.volumes.get_mut(&vid) {
                if let Some(p) = v
                    .pending_attachments
                    .iter_mut()
                    .find(|p| p.attachment_id == attachment_id)
                {
                    p.status = "attaching".into();
                }
                if v.status == "reserved" {
                    v.status = "attaching".into();
                    v.touch();
                }
            }
        }
        if stalls {
            // the host died mid-attach: nothing moves any more
            return;
        }
        tokio::time::sleep(delay / 2).await;
        let mut attached_ok = true;
        if let Some(hv) = &st.hypervisor {
            let hv = hv.clone();
            let size = st.world().volumes.get(&vid).map(|v| v.size).unwrap_or(1);
            let id = vid.clone();
            match tokio::task::spawn_blocking(move || hv.attach(&id, size)).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => {
                    tracing::error!(volume = %vid, error = %e, "hypervisor could not attach");
                    attached_ok = false;
                }
                Err(e) => {
                    tracing::error!(volume = %vid, error = %e, "hypervisor task failed");
                    attached_ok = false;
                }
            }
        }
        let mut w = st.world();
        // the server may have been deleted meanwhile
        let server_alive = w
            .servers
            .get(&sid)
            .is_some_and(|s| s.volumes.contains_key(&vid));
        if let Some(v) = w.volumes.get_mut(&vid) {
            let still_pending = v
                .pending_attachments
                .iter()
                .any(|p| p.attachment_id == attachment_id);
            v.pending_attachments
                .retain(|p| p.attachment_id != attachment_id);
            if attached_ok && server_alive && still_pending {
                v.attachments.push(AttachmentRec {
                    attachment_id,
                    server_id: sid.clone(),
                    device: dev,
                });
                v.status = "in-use".into();
            } else {
                v.status = if v.attachments.is_empty() {
                    "available".into()
                } else {
                    "in-use".into()
                };
            }
            v.touch();
            if !(attached_ok && server_alive && still_pending)
                && let Some(s) = w.servers.get_mut(&sid)
            {
                s.volumes.remove(&vid);
            }
        }
    });
    Ok(Json(
        json!({ "volumeAttachment": attachment_json(&server_id, &volume_id, &device) }),
    ))
}

async fn detach(
    State(state): State<Arc<AppState>>,
    ctx: Ctx,
    Path((server_id, volume_id)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    let mut w = state.world();
    let s = visible_server(&w, &ctx, &server_id)?;
    if !s.volumes.contains_key(&volume_id) {
        return Err(ApiErr::not_found(
            S,
            format!("volume_id not found: {volume_id}"),
        ));
    }
    let status = w
        .volumes
        .get(&volume_id)
        .map(|v| v.status.clone())
        .unwrap_or_default();
    if matches!(status.as_str(), "reserved" | "attaching") {
        return Err(ApiErr::conflict(
            S,
            format!("Cannot 'detach_volume' while volume {volume_id} is {status}"),
        ));
    }
    let attached_here = w
        .volumes
        .get(&volume_id)
        .is_some_and(|v| v.attachments.iter().any(|a| a.server_id == server_id));
    if !attached_here {
        return Err(ApiErr::conflict(
            S,
            format!("Volume {volume_id} is {status} on this instance; retry later"),
        ));
    }
    if let Some(v) = w.volumes.get_mut(&volume_id) {
        v.status = "detaching".into();
        v.touch();
    }
    let project = w
        .servers
        .get(&server_id)
        .map(|s| s.project_id.clone())
        .unwrap_or_default();
    w.record_instance_action(&server_id, &project, "detach_volume");
    if take_one(&mut w.detaches_stalling) {
        // the host never detaches: the volume stays `detaching`
        return Ok(StatusCode::ACCEPTED);
    }
    let delay = Delays::d(w.delays.volume_detach_ms);
    drop(w);
    let st = state.clone();
    tokio::spawn(async move {
        tokio::time::sleep(delay).await;
        release_attachment(&st, &server_id, &volume_id).await;
    });
    Ok(StatusCode::ACCEPTED)
}

/// A volume leaves a server. The guest loses the device first (unless
/// another server still has the volume), then Cinder's attachment goes
/// and the volume reads `available` (or `in-use`, attached elsewhere), as
/// with real Nova (libvirt detaches, then Cinder's attachment is deleted):
/// whoever sees `available` finds no device.
async fn release_attachment(state: &Arc<AppState>, server_id: &str, volume_id: &str) {
    let last = {
        let w = state.world();
        w.volumes
            .get(volume_id)
            .is_none_or(|v| v.attachments.iter().all(|a| a.server_id == server_id))
    };
    if last && let Some(hv) = &state.hypervisor {
        let hv = hv.clone();
        let id = volume_id.to_string();
        let _ = tokio::task::spawn_blocking(move || hv.detach(&id)).await;
    }
    let mut w = state.world();
    if let Some(s) = w.servers.get_mut(server_id) {
        s.volumes.remove(volume_id);
    }
    if let Some(v) = w.volumes.get_mut(volume_id) {
        v.attachments.retain(|a| a.server_id != server_id);
        v.status = if v.attachments.is_empty() {
            "available".into()
        } else {
            "in-use".into()
        };
        v.touch();
    }
}

/// Takes one of a fault's remaining occurrences.
fn take_one(remaining: &mut u32) -> bool {
    if *remaining == 0 {
        return false;
    }
    *remaining -= 1;
    true
}

async fn flavors(_ctx: Ctx) -> Json<Value> {
    Json(json!({ "flavors": [
        { "id": "1", "name": "m1.tiny", "links": [] },
        { "id": "2", "name": "m1.small", "links": [] }
    ]}))
}

/// `GET /openstack/latest/meta_data.json` for the server chosen with the
/// admin API (`PUT /_admin/metadata-instance`).
pub async fn metadata_service(State(state): State<Arc<AppState>>) -> Response {
    let w = state.world();
    let Some(s) = w
        .metadata_instance
        .as_ref()
        .and_then(|id| w.servers.get(id))
    else {
        return (
            StatusCode::NOT_FOUND,
            "no instance is bound to the metadata service",
        )
            .into_response();
    };
    let devices: Vec<Value> = s
        .volumes
        .iter()
        .enumerate()
        .map(|(i, (vol, _))| json!({ "type": "disk", "bus": "scsi", "address": format!("0:0:0:{}", i + 1), "serial": vol, "tags": [] }))
        .collect();
    Json(json!({
        "uuid": s.id, "name": s.name, "hostname": s.name, "availability_zone": s.availability_zone,
        "project_id": s.project_id, "launch_index": 0, "devices": devices, "meta": {}
    }))
    .into_response()
}
