//! Knobs, over HTTP (`/_admin/...`) and in-process ([`Control`]): fault
//! injection, state-transition delays, quotas, token lifetime and
//! revocation, failing creations, servers, the metadata-service instance,
//! catalog aliases, Manila's microversion range, and the call log.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::Json;
use axum::extract::State;
use axum::routing::{get, post, put};
use http::StatusCode;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::AppState;
use crate::faults::FaultRule;
use crate::state::{CallRecord, Delays, Quotas};

/// In-process handle on the emulator's knobs.
#[derive(Clone)]
pub struct Control {
    pub(crate) state: Arc<AppState>,
}

impl std::fmt::Debug for Control {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Control")
    }
}

impl Control {
    pub fn add_fault(&self, rule: FaultRule) {
        self.state.world().faults.push(rule.fresh());
    }
    pub fn clear_faults(&self) {
        self.state.world().faults.clear();
    }
    /// The rules in place (spent ones too), each with how many requests
    /// it served its fault to.
    pub fn faults(&self) -> Vec<FaultRule> {
        self.state.world().faults.clone()
    }
    pub fn set_delays(&self, delays: Delays) {
        self.state.world().delays = delays;
    }
    pub fn set_quotas(&self, quotas: Quotas) {
        self.state.world().quotas = quotas;
    }
    pub fn set_token_lifetime(&self, lifetime: Duration) {
        self.state.world().token_lifetime = lifetime;
    }
    /// Invalidates every issued token: the next request of each client
    /// gets a 401.
    pub fn revoke_tokens(&self) {
        self.state.world().tokens.clear();
    }
    /// Expires every issued token now.
    pub fn expire_tokens(&self) {
        let now = SystemTime::now();
        for t in self.state.world().tokens.values_mut() {
            t.expires = now;
        }
    }
    /// A user's new password; the user's tokens are revoked, as Keystone
    /// does on a password change. Returns whether the user exists.
    pub fn set_password(&self, user: &str, password: &str) -> bool {
        let mut w = self.state.world();
        let Some(u) = w.users.iter_mut().find(|u| u.name == user || u.id == user) else {
            return false;
        };
        u.password = password.to_string();
        let id = u.id.clone();
        w.tokens.retain(|_, t| t.user_id != id);
        true
    }
    /// A new application credential of `user`: `(id, secret)`.
    pub fn create_app_credential(&self, user: &str, name: &str) -> Option<(String, String)> {
        let mut w = self.state.world();
        let user_id = w
            .users
            .iter()
            .find(|u| u.name == user || u.id == user)?
            .id
            .clone();
        let cred = crate::state::AppCred {
            id: crate::state::new_id().replace('-', ""),
            name: name.to_string(),
            secret: crate::state::new_id(),
            user_id,
        };
        let out = (cred.id.clone(), cred.secret.clone());
        w.app_creds.push(cred);
        Some(out)
    }
    /// Deletes an application credential and revokes the tokens issued
    /// for it.
    pub fn delete_app_credential(&self, id: &str) {
        let mut w = self.state.world();
        w.app_creds.retain(|c| c.id != id);
        w.tokens.retain(|_, t| t.app_cred_id.as_deref() != Some(id));
    }
    pub fn issued_tokens(&self) -> usize {
        self.state.world().tokens.len()
    }
    pub fn fail_next_volume_creates(&self, n: u32) {
        self.state.world().failing_volume_creates = n;
    }
    pub fn fail_next_share_creates(&self, n: u32) {
        self.state.world().failing_share_creates = n;
    }
    pub fn fail_next_share_group_snapshots(&self, n: u32) {
        self.state.world().failing_share_group_snapshots = n;
    }
    /// The id of `project` (by name or id) and the zone seeded resources
    /// are put in (the first).
    fn seeding_into(&self, w: &crate::state::World, project: &str) -> Option<(String, String)> {
        let pid = w
            .projects
            .iter()
            .find(|p| p.name == project || p.id == project)?
            .id
            .clone();
        let zone = self
            .state
            .availability_zones
            .first()
            .cloned()
            .unwrap_or_else(|| "nova".into());
        Some((pid, zone))
    }
    /// Puts `count` 1 GiB volumes of the default type straight into
    /// `project` (no API calls: for scale figures), `available`, or `in-use`
    /// by `attached_to` when given (Nova's record of the attachments is not
    /// made). Returns their ids.
    pub fn seed_volumes(
        &self,
        project: &str,
        count: usize,
        attached_to: Option<&str>,
    ) -> Option<Vec<String>> {
        let mut w = self.state.world();
        let (pid, zone) = self.seeding_into(&w, project)?;
        let mut ids = Vec::with_capacity(count);
        for i in 0..count {
            let seq = w.next_seq();
            let id = crate::state::new_id();
            let attachments = attached_to
                .map(|server| {
                    vec![crate::state::AttachmentRec {
                        attachment_id: crate::state::new_id(),
                        server_id: server.to_string(),
                        device: "/dev/vdb".into(),
                    }]
                })
                .unwrap_or_default();
            let v = crate::state::VolumeRec {
                seq,
                id: id.clone(),
                project_id: pid.clone(),
                name: format!("seeded-{i}"),
                description: None,
                status: if attachments.is_empty() {
                    "available".into()
                } else {
                    "in-use".into()
                },
                size: 1,
                volume_type: "__DEFAULT__".into(),
                availability_zone: zone.clone(),
                multiattach: false,
                bootable: false,
                attachments,
                pending_attachments: Vec::new(),
                metadata: Default::default(),
                snapshot_id: None,
                source_volid: None,
                group_id: None,
                created_at: crate::state::now_iso(),
                updated_at: crate::state::now_iso(),
                generation: 0,
            };
            w.volumes.insert(id.clone(), v);
            ids.push(id);
        }
        Some(ids)
    }
    /// Puts `count` 1 GiB `available` shares of `protocol` and the share
    /// type `default` straight into `project` (no API calls, no access
    /// rules: for scale figures). Returns their ids.
    pub fn seed_shares(&self, project: &str, count: usize, protocol: &str) -> Option<Vec<String>> {
        let mut w = self.state.world();
        let (pid, zone) = self.seeding_into(&w, project)?;
        let share_type = w.share_types.iter().find(|t| t.name == "default")?.clone();
        let mut ids = Vec::with_capacity(count);
        for i in 0..count {
            let seq = w.next_seq();
            let id = crate::state::new_id();
            let share = crate::state::ShareRec {
                seq,
                id: id.clone(),
                project_id: pid.clone(),
                name: format!("seeded-{i}"),
                description: None,
                status: "available".into(),
                size: 1,
                protocol: protocol.to_uppercase(),
                share_type_id: share_type.id.clone(),
                share_type_name: share_type.name.clone(),
                share_network_id: None,
                availability_zone: zone.clone(),
                snapshot_id: None,
                metadata: Default::default(),
                created_at: crate::state::now_iso(),
                instance_id: crate::state::new_id(),
                share_group_id: None,
                source_member_id: None,
            };
            w.shares.insert(id.clone(), share);
            ids.push(id);
        }
        Some(ids)
    }
    /// Nova's `[compute] max_disk_devices_to_attach` (root disk included;
    /// -1: unlimited).
    pub fn set_max_disk_devices(&self, max: i64) {
        self.state.world().max_disk_devices_to_attach = max;
    }
    /// The next `n` attaches fail on the compute host, whose cleanup never
    /// reaches Cinder: Nova forgets them, Cinder keeps them `reserved`.
    pub fn fail_attaches_losing_cleanup(&self, n: u32) {
        self.state.world().attaches_losing_cleanup = n;
    }
    /// The next `n` attaches stop with the compute host dead mid-attach:
    /// Nova keeps its record, Cinder stays `attaching`.
    pub fn stall_attaches(&self, n: u32) {
        self.state.world().attaches_stalling = n;
    }
    /// The next `n` detaches never complete: the volume stays `detaching`.
    pub fn stall_detaches(&self, n: u32) {
        self.state.world().detaches_stalling = n;
    }
    /// The server disappears from Nova while Cinder still has its
    /// attachments (its compute host was gone when it was deleted).
    pub fn forget_server(&self, id: &str) {
        let mut w = self.state.world();
        if let Some(s) = w.servers.remove(id) {
            w.record_instance_action(id, &s.project_id, "delete");
        }
        if w.metadata_instance.as_deref() == Some(id) {
            w.metadata_instance = None;
        }
    }
    /// An operator archives Nova's database (`nova-manage db
    /// archive_deleted_rows`): deleted servers leave no trace, and a GET of
    /// their actions answers 404 as for a server that never was.
    pub fn archive_deleted_servers(&self) {
        self.state
            .world()
            .instance_actions
            .retain(|_, r| !r.deleted);
    }
    /// Makes the volume's status look `age` older than it is (Cinder's
    /// `updated_at`), as if it had been stuck that long.
    pub fn age_volume_status(&self, volume_id: &str, age: std::time::Duration) {
        let mut w = self.state.world();
        if let Some(v) = w.volumes.get_mut(volume_id) {
            v.updated_at = crate::state::iso_at(std::time::SystemTime::now() - age);
        }
    }
    /// Makes a volume, snapshot, share or share snapshot look made `age`
    /// ago (its `created_at`), as one left from long before a test.
    /// Whether `id` names one.
    pub fn backdate(&self, id: &str, age: std::time::Duration) -> bool {
        let at = crate::state::iso_at(std::time::SystemTime::now() - age);
        let mut w = self.state.world();
        if let Some(v) = w.volumes.get_mut(id) {
            v.created_at = at;
        } else if let Some(s) = w.snapshots.get_mut(id) {
            s.created_at = at;
        } else if let Some(s) = w.shares.get_mut(id) {
            s.created_at = at;
        } else if let Some(s) = w.share_snapshots.get_mut(id) {
            s.created_at = at;
        } else {
            return false;
        }
        true
    }
    /// The cloud's clock `secs` from this machine's (negative: behind):
    /// its answers' `Date` and volumes' `updated_at` read so.
    pub fn set_clock_offset(&self, secs: i64) {
        self.state.world().clock_offset_secs = secs;
    }
    /// Nova's `[cinder] cross_az_attach` (true by default, as Nova's).
    pub fn set_cross_az_attach(&self, allowed: bool) {
        self.state.world().cross_az_attach = allowed;
    }
    /// Creates an ACTIVE server in `project` ("admin" or "demo") booted
    /// from an image (one disk of its own), returns its id.
    pub fn create_server(
        &self,
        project: &str,
        name: &str,
        availability_zone: &str,
    ) -> Option<String> {
        self.create_server_with_disks(project, name, availability_zone, 1)
    }

    /// The same with `local_disks` disks of its own (root, ephemeral,
    /// swap): a server that looks like the machine its node plugin runs on.
    pub fn create_server_with_disks(
        &self,
        project: &str,
        name: &str,
        availability_zone: &str,
        local_disks: u32,
    ) -> Option<String> {
        let mut w = self.state.world();
        let pid = project_id(&w, project)?;
        Some(crate::nova::insert_server(&mut w, &pid, name, availability_zone, local_disks).id)
    }
    /// An ACTIVE server under the id a real machine has (one whose
    /// metadata service names it: a cluster node whose plugins are to be
    /// served by this emulator); false when the project is unknown or the
    /// id taken.
    pub fn create_server_as(
        &self,
        id: &str,
        project: &str,
        name: &str,
        availability_zone: &str,
        local_disks: u32,
    ) -> bool {
        let mut w = self.state.world();
        let Some(pid) = project_id(&w, project) else {
            return false;
        };
        if w.servers.contains_key(id) {
            return false;
        }
        crate::nova::insert_server_as(
            &mut w,
            id.to_string(),
            &pid,
            name,
            availability_zone,
            local_disks,
        );
        true
    }
    pub fn set_metadata_instance(&self, server_id: Option<String>) {
        self.state.world().metadata_instance = server_id;
    }
    /// Catalog types for a service (`block-storage`, `compute`,
    /// `shared-file-system`, `key-manager`).
    pub fn set_catalog_types(&self, service: &str, types: &[&str]) {
        self.state.world().catalog_types.insert(
            service.to_string(),
            types.iter().map(|t| t.to_string()).collect(),
        );
    }
    pub fn set_manila_max_microversion(&self, minor: u32) {
        self.state.world().manila_max_minor = minor;
    }
    pub fn calls(&self) -> Vec<CallRecord> {
        self.state.world().calls.clone()
    }
    pub fn clear_calls(&self) {
        self.state.world().calls.clear();
    }
    /// The backend a volume is on, as an admin sees it
    /// (`os-vol-host-attr:host`): one per availability zone here.
    pub fn volume_host(&self, id: &str) -> Option<String> {
        self.state
            .world()
            .volumes
            .get(id)
            .map(|v| format!("emulator@lvm-{}#lvm", v.availability_zone))
    }
    /// Status of a volume as the emulator holds it.
    pub fn volume_status(&self, id: &str) -> Option<String> {
        self.state.world().volumes.get(id).map(|v| v.status.clone())
    }
}

/// A project's id, found by its name or id.
fn project_id(w: &crate::state::World, project: &str) -> Option<String> {
    w.projects
        .iter()
        .find(|p| p.name == project || p.id == project)
        .map(|p| p.id.clone())
}

pub fn routes() -> axum::Router<Arc<AppState>> {
    axum::Router::new()
        .route(
            "/faults",
            post(add_fault).delete(clear_faults).get(list_faults),
        )
        .route("/delays", put(set_delays).get(get_delays))
        .route("/quotas", put(set_quotas).get(get_quotas))
        .route("/tokens", axum::routing::delete(revoke_tokens))
        .route("/token-lifetime", put(set_token_lifetime))
        .route("/failures", put(set_failures))
        .route("/servers", post(create_server))
        .route("/compute", put(set_compute))
        .route("/metadata-instance", put(set_metadata_instance))
        .route("/catalog", put(set_catalog))
        .route("/calls", get(calls).delete(clear_calls))
        .route("/health", get(|| async { "ok" }))
}

type St = State<Arc<AppState>>;

async fn add_fault(State(s): St, Json(rule): Json<FaultRule>) -> StatusCode {
    s.world().faults.push(rule.fresh());
    StatusCode::CREATED
}
async fn clear_faults(State(s): St) -> StatusCode {
    s.world().faults.clear();
    StatusCode::NO_CONTENT
}
async fn list_faults(State(s): St) -> Json<Vec<FaultRule>> {
    Json(s.world().faults.clone())
}
async fn set_delays(State(s): St, Json(d): Json<Delays>) -> StatusCode {
    s.world().delays = d;
    StatusCode::NO_CONTENT
}
async fn get_delays(State(s): St) -> Json<Delays> {
    Json(s.world().delays.clone())
}
async fn set_quotas(State(s): St, Json(q): Json<Quotas>) -> StatusCode {
    s.world().quotas = q;
    StatusCode::NO_CONTENT
}
async fn get_quotas(State(s): St) -> Json<Quotas> {
    Json(s.world().quotas.clone())
}
async fn revoke_tokens(State(s): St) -> StatusCode {
    s.world().tokens.clear();
    StatusCode::NO_CONTENT
}

#[derive(Deserialize)]
struct Lifetime {
    seconds: u64,
}
async fn set_token_lifetime(State(s): St, Json(l): Json<Lifetime>) -> StatusCode {
    s.world().token_lifetime = Duration::from_secs(l.seconds);
    StatusCode::NO_CONTENT
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Failures {
    volume_creates: u32,
    share_creates: u32,
    share_group_snapshots: u32,
}
async fn set_failures(State(s): St, Json(f): Json<Failures>) -> StatusCode {
    let mut w = s.world();
    w.failing_volume_creates = f.volume_creates;
    w.failing_share_creates = f.share_creates;
    w.failing_share_group_snapshots = f.share_group_snapshots;
    StatusCode::NO_CONTENT
}

/// Nova's compute options the emulator models.
#[derive(Deserialize)]
struct ComputeOptions {
    max_disk_devices_to_attach: i64,
    #[serde(default)]
    cross_az_attach: Option<bool>,
}
async fn set_compute(State(s): St, Json(c): Json<ComputeOptions>) -> StatusCode {
    let mut w = s.world();
    w.max_disk_devices_to_attach = c.max_disk_devices_to_attach;
    if let Some(allowed) = c.cross_az_attach {
        w.cross_az_attach = allowed;
    }
    StatusCode::NO_CONTENT
}

#[derive(Deserialize)]
struct NewServer {
    name: String,
    #[serde(default)]
    project: Option<String>,
    #[serde(default)]
    availability_zone: Option<String>,
    /// Disks of its own (default 1: a root booted from an image).
    #[serde(default)]
    local_disks: Option<u32>,
}
async fn create_server(State(s): St, Json(n): Json<NewServer>) -> (StatusCode, Json<Value>) {
    let c = Control { state: s.clone() };
    let az = n.availability_zone.unwrap_or_else(|| {
        s.availability_zones
            .first()
            .cloned()
            .unwrap_or_else(|| "nova".into())
    });
    match c.create_server_with_disks(
        n.project.as_deref().unwrap_or("admin"),
        &n.name,
        &az,
        n.local_disks.unwrap_or(1),
    ) {
        Some(id) => (StatusCode::CREATED, Json(json!({ "id": id }))),
        None => (
            StatusCode::BAD_REQUEST,
            Json(json!({ "error": "unknown project" })),
        ),
    }
}

#[derive(Deserialize)]
struct MetadataInstance {
    server_id: Option<String>,
}
async fn set_metadata_instance(State(s): St, Json(m): Json<MetadataInstance>) -> StatusCode {
    s.world().metadata_instance = m.server_id;
    StatusCode::NO_CONTENT
}

#[derive(Deserialize)]
struct Catalog {
    service: String,
    types: Vec<String>,
}
async fn set_catalog(State(s): St, Json(c): Json<Catalog>) -> StatusCode {
    s.world().catalog_types.insert(c.service, c.types);
    StatusCode::NO_CONTENT
}
async fn calls(State(s): St) -> Json<Vec<CallRecord>> {
    Json(s.world().calls.clone())
}
async fn clear_calls(State(s): St) -> StatusCode {
    s.world().calls.clear();
    StatusCode::NO_CONTENT
}
