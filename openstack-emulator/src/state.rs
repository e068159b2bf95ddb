//! Everything the emulator remembers.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, SystemTime};

use http::Method;
use serde::{Deserialize, Serialize};

use crate::faults::{FaultAction, FaultRule};
use crate::{
    ADMIN_PASSWORD, ADMIN_USER, APP_CRED_ID, APP_CRED_NAME, APP_CRED_SECRET, EmulatorConfig,
    MEMBER_PASSWORD, MEMBER_USER,
};

/// How long each transient state lasts.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct Delays {
    pub volume_create_ms: u64,
    pub volume_delete_ms: u64,
    pub volume_attach_ms: u64,
    pub volume_detach_ms: u64,
    pub volume_extend_ms: u64,
    pub volume_retype_ms: u64,
    pub snapshot_create_ms: u64,
    pub snapshot_delete_ms: u64,
    pub backup_create_ms: u64,
    pub backup_delete_ms: u64,
    pub backup_restore_ms: u64,
    pub share_create_ms: u64,
    pub share_delete_ms: u64,
    pub share_resize_ms: u64,
    pub access_rule_ms: u64,
    pub share_snapshot_ms: u64,
    pub order_ms: u64,
}

impl Default for Delays {
    fn default() -> Self {
        Self {
            volume_create_ms: 50,
            // deletions take a while in a real Cinder (about a second):
            // enough here that a caller who does not wait for them sees
            // them under way
            volume_delete_ms: 250,
            volume_attach_ms: 100,
            volume_detach_ms: 100,
            volume_extend_ms: 50,
            volume_retype_ms: 50,
            snapshot_create_ms: 50,
            snapshot_delete_ms: 250,
            backup_create_ms: 300,
            backup_delete_ms: 250,
            backup_restore_ms: 300,
            share_create_ms: 50,
            share_delete_ms: 50,
            share_resize_ms: 50,
            access_rule_ms: 50,
            share_snapshot_ms: 50,
            order_ms: 50,
        }
    }
}

impl Delays {
    pub fn d(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    /// Every transient state lasts `ms`.
    pub fn uniform(ms: u64) -> Self {
        Self {
            volume_create_ms: ms,
            volume_delete_ms: ms,
            volume_attach_ms: ms,
            volume_detach_ms: ms,
            volume_extend_ms: ms,
            volume_retype_ms: ms,
            snapshot_create_ms: ms,
            snapshot_delete_ms: ms,
            backup_create_ms: ms,
            backup_delete_ms: ms,
            backup_restore_ms: ms,
            share_create_ms: ms,
            share_delete_ms: ms,
            share_resize_ms: ms,
            access_rule_ms: ms,
            share_snapshot_ms: ms,
            order_ms: ms,
        }
    }
}

/// Per-project limits; `-1` is unlimited.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct Quotas {
    pub volumes: i64,
    pub gigabytes: i64,
    pub snapshots: i64,
    pub shares: i64,
    pub share_gigabytes: i64,
    /// Manila's `share_group_snapshots`.
    pub share_group_snapshots: i64,
}

impl Default for Quotas {
    fn default() -> Self {
        Self {
            volumes: -1,
            gigabytes: -1,
            snapshots: -1,
            shares: -1,
            share_gigabytes: -1,
            share_group_snapshots: -1,
        }
    }
}

#[derive(Debug, Clone)]
pub struct User {
    pub id: String,
    pub name: String,
    pub password: String,
    pub project_id: String,
    pub admin: bool,
}

#[derive(Debug, Clone)]
pub struct AppCred {
    pub id: String,
    pub name: String,
    pub secret: String,
    pub user_id: String,
}

#[derive(Debug, Clone)]
pub struct Project {
    pub id: String,
    pub name: String,
}

#[derive(Debug, Clone)]
pub struct TokenInfo {
    pub user_id: String,
    pub project_id: String,
    pub admin: bool,
    pub expires: SystemTime,
    /// The application credential the token was issued for.
    pub app_cred_id: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct AttachmentRec {
    pub attachment_id: String,
    pub server_id: String,
    pub device: String,
}

/// A Cinder attachment not attached (yet): `reserved` (Nova's API
/// reserved the volume for a server) or `attaching` (its compute host is
/// connecting it). Cinder shows it in `/attachments`, never in the
/// volume's `attachments`.
#[derive(Debug, Clone)]
pub struct PendingAttachmentRec {
    pub attachment_id: String,
    pub server_id: String,
    pub status: String,
}

#[derive(Debug, Clone)]
pub struct VolumeRec {
    pub seq: u64,
    pub id: String,
    pub project_id: String,
    pub name: String,
    pub description: Option<String>,
    pub status: String,
    pub size: u64,
    pub volume_type: String,
    pub availability_zone: String,
    pub multiattach: bool,
    pub bootable: bool,
    pub attachments: Vec<AttachmentRec>,
    pub pending_attachments: Vec<PendingAttachmentRec>,
    pub metadata: BTreeMap<String, String>,
    pub snapshot_id: Option<String>,
    pub source_volid: Option<String>,
    /// The generic volume group the volume belongs to.
    pub group_id: Option<String>,
    pub created_at: String,
    /// When its status last changed (Cinder's `updated_at`).
    pub updated_at: String,
    /// Bumped on every status change, so a stale transition is ignored.
    pub generation: u64,
}

impl VolumeRec {
    /// A status change: a transition scheduled before it is now stale,
    /// and `updated_at` says when.
    pub fn touch(&mut self) {
        self.generation += 1;
        self.updated_at = now_iso();
    }
}

#[derive(Debug, Clone)]
pub struct SnapshotRec {
    pub seq: u64,
    pub id: String,
    pub project_id: String,
    pub name: String,
    pub description: Option<String>,
    pub status: String,
    pub size: u64,
    pub volume_id: String,
    pub metadata: BTreeMap<String, String>,
    /// The group snapshot the snapshot is a member of.
    pub group_snapshot_id: Option<String>,
    pub created_at: String,
}

#[derive(Debug, Clone)]
pub struct BackupRec {
    pub seq: u64,
    pub id: String,
    pub project_id: String,
    pub name: String,
    pub description: Option<String>,
    pub status: String,
    pub size: u64,
    pub volume_id: String,
    pub snapshot_id: Option<String>,
    pub availability_zone: Option<String>,
    pub metadata: BTreeMap<String, String>,
    pub fail_reason: Option<String>,
    pub created_at: String,
}

#[derive(Debug, Clone)]
pub struct GroupTypeRec {
    pub id: String,
    pub name: String,
    pub group_specs: BTreeMap<String, String>,
}

#[derive(Debug, Clone)]
pub struct GroupRec {
    pub seq: u64,
    pub id: String,
    pub project_id: String,
    pub name: String,
    pub description: Option<String>,
    pub status: String,
    pub group_type_id: String,
    pub volume_type_ids: Vec<String>,
    pub availability_zone: String,
    pub created_at: String,
}

#[derive(Debug, Clone)]
pub struct GroupSnapshotRec {
    pub seq: u64,
    pub id: String,
    pub project_id: String,
    pub name: String,
    pub description: Option<String>,
    pub status: String,
    pub group_id: String,
    pub group_type_id: String,
    pub created_at: String,
}

#[derive(Debug, Clone)]
pub struct VolumeTypeRec {
    pub id: String,
    pub name: String,
    pub extra_specs: BTreeMap<String, String>,
}

#[derive(Debug, Clone)]
pub struct ServerRec {
    pub id: String,
    pub name: String,
    pub project_id: String,
    pub status: String,
    pub availability_zone: String,
    /// volume id → device
    pub volumes: BTreeMap<String, String>,
    /// Disks of its own, not volumes: a root booted from an image, then an
    /// ephemeral and a swap disk (0: booted from a volume).
    pub local_disks: u32,
}

/// Nova's record of what was done to a server (`os-instance-actions`),
/// kept after the server is deleted, as Nova keeps it until an operator
/// archives the database: the one way a project member can tell "deleted"
/// from "not mine" (both answer 404 to a GET of the server).
#[derive(Debug, Clone)]
pub struct InstanceActionsRec {
    pub project_id: String,
    pub deleted: bool,
    /// oldest first
    pub actions: Vec<InstanceActionRec>,
}

#[derive(Debug, Clone)]
pub struct InstanceActionRec {
    pub action: &'static str,
    pub request_id: String,
    pub start_time: String,
}

#[derive(Debug, Clone)]
pub struct ShareRec {
    pub seq: u64,
    pub id: String,
    pub project_id: String,
    pub name: String,
    pub description: Option<String>,
    pub status: String,
    pub size: u64,
    pub protocol: String,
    pub share_type_id: String,
    pub share_type_name: String,
    pub share_network_id: Option<String>,
    pub availability_zone: String,
    pub snapshot_id: Option<String>,
    pub metadata: BTreeMap<String, String>,
    pub created_at: String,
    pub instance_id: String,
    /// The share group it was created in; never changes.
    pub share_group_id: Option<String>,
    /// The group snapshot member it was made from.
    pub source_member_id: Option<String>,
}

#[derive(Debug, Clone)]
pub struct ShareGroupRec {
    pub seq: u64,
    pub id: String,
    pub project_id: String,
    pub name: String,
    pub description: Option<String>,
    pub status: String,
    pub share_type_ids: Vec<String>,
    pub share_group_type_id: String,
    pub availability_zone: String,
    pub source_snapshot_id: Option<String>,
    pub created_at: String,
}

#[derive(Debug, Clone)]
pub struct ShareGroupMemberRec {
    pub id: String,
    pub share_id: String,
    pub size: u64,
    pub protocol: String,
}

#[derive(Debug, Clone)]
pub struct ShareGroupSnapshotRec {
    pub seq: u64,
    pub id: String,
    pub project_id: String,
    pub name: String,
    pub description: Option<String>,
    pub status: String,
    pub share_group_id: String,
    pub members: Vec<ShareGroupMemberRec>,
    pub created_at: String,
}

#[derive(Debug, Clone)]
pub struct AccessRuleRec {
    pub id: String,
    pub share_id: String,
    pub access_type: String,
    pub access_to: String,
    pub access_level: String,
    pub state: String,
    pub access_key: Option<String>,
    pub created_at: String,
    /// Set at the grant (microversion 2.45+).
    pub metadata: BTreeMap<String, String>,
}

#[derive(Debug, Clone)]
pub struct ShareSnapshotRec {
    pub seq: u64,
    pub id: String,
    pub project_id: String,
    pub name: String,
    pub description: Option<String>,
    pub share_id: String,
    pub status: String,
    pub size: u64,
    pub created_at: String,
}

#[derive(Debug, Clone)]
pub struct ShareTypeRec {
    pub id: String,
    pub name: String,
    pub extra_specs: BTreeMap<String, String>,
}

#[derive(Debug, Clone)]
pub struct MessageRec {
    pub id: String,
    pub project_id: String,
    pub resource_id: String,
    pub action_id: String,
    pub detail_id: String,
    pub user_message: String,
    pub created_at: String,
}

#[derive(Debug, Clone)]
pub struct SecretRec {
    pub id: String,
    pub project_id: String,
    pub name: Option<String>,
    pub payload: Option<Vec<u8>>,
    pub algorithm: Option<String>,
    pub bit_length: Option<u32>,
    pub mode: Option<String>,
    pub secret_type: String,
    pub created: String,
}

#[derive(Debug, Clone)]
pub struct OrderRec {
    pub id: String,
    pub project_id: String,
    pub status: String,
    pub secret_id: Option<String>,
    pub error_reason: Option<String>,
    pub created: String,
}

/// One request the emulator saw (for tests that count calls).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct CallRecord {
    pub method: String,
    pub path: String,
    /// The query string, without `?` (empty: none): what a list asked for
    /// (a name, a metadata filter, a page's limit).
    #[serde(default)]
    pub query: String,
    /// None when the connection was dropped by a fault.
    pub status: Option<u16>,
    /// When it was answered (or dropped), in milliseconds since the Unix
    /// epoch.
    pub at_ms: u64,
    /// How long it took from its arrival until then (ms): where a wait of
    /// the plugins' went (a call queued at a busy API, or the work).
    #[serde(default)]
    pub took_ms: u64,
    /// The fault it got, if any (`answer lost`, `delayed 1500 ms`,
    /// `throttled`, `status 409`, ...): a lost, delayed or dropped answer
    /// told from a normal one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fault: Option<String>,
}

pub struct World {
    pub seq: u64,
    pub users: Vec<User>,
    pub app_creds: Vec<AppCred>,
    pub projects: Vec<Project>,
    pub tokens: HashMap<String, TokenInfo>,
    pub token_lifetime: Duration,
    pub volumes: BTreeMap<String, VolumeRec>,
    pub snapshots: BTreeMap<String, SnapshotRec>,
    pub backups: BTreeMap<String, BackupRec>,
    pub group_types: Vec<GroupTypeRec>,
    pub groups: BTreeMap<String, GroupRec>,
    pub group_snapshots: BTreeMap<String, GroupSnapshotRec>,
    pub volume_types: Vec<VolumeTypeRec>,
    pub servers: BTreeMap<String, ServerRec>,
    /// server id → its actions, deleted servers' too
    pub instance_actions: BTreeMap<String, InstanceActionsRec>,
    pub shares: BTreeMap<String, ShareRec>,
    pub access_rules: BTreeMap<String, AccessRuleRec>,
    pub share_snapshots: BTreeMap<String, ShareSnapshotRec>,
    pub share_groups: BTreeMap<String, ShareGroupRec>,
    pub share_group_snapshots: BTreeMap<String, ShareGroupSnapshotRec>,
    pub share_types: Vec<ShareTypeRec>,
    pub messages: Vec<MessageRec>,
    pub secrets: BTreeMap<String, SecretRec>,
    pub orders: BTreeMap<String, OrderRec>,
    pub quotas: Quotas,
    /// Manila quotas an admin set for a project (`PUT quota-sets/{id}`):
    /// project → key → limit, over `quotas`.
    pub manila_project_quotas: BTreeMap<String, BTreeMap<String, i64>>,
    pub delays: Delays,
    pub faults: Vec<FaultRule>,
    pub calls: Vec<CallRecord>,
    /// The next N volume creations end in `error`.
    pub failing_volume_creates: u32,
    /// The next N share creations end in `error` (with a user message).
    pub failing_share_creates: u32,
    /// The next N share group snapshots end in `error`.
    pub failing_share_group_snapshots: u32,
    /// Nova's `[compute] max_disk_devices_to_attach`: disk devices per
    /// server, the root disk included; -1: unlimited (Nova's default).
    pub max_disk_devices_to_attach: i64,
    /// How far the cloud's clock is from this machine's (seconds; negative:
    /// behind): its answers' `Date` and the volumes' `updated_at` read so,
    /// as from services on hosts whose clocks differ from the nodes'.
    pub clock_offset_secs: i64,
    /// Nova's `[cinder] cross_az_attach` (Nova's default: true); false
    /// refuses attaching a volume to a server of another zone.
    pub cross_az_attach: bool,
    /// Faults of a compute host: the next N attaches fail on the host and
    /// its cleanup never reaches Cinder (Nova forgets the attachment,
    /// Cinder keeps it `reserved`)...
    pub attaches_losing_cleanup: u32,
    /// ...the next N attaches stop with the host dead mid-attach (Nova
    /// keeps its record, Cinder stays `attaching`)...
    pub attaches_stalling: u32,
    /// ...and the next N detaches never complete (the volume stays
    /// `detaching`).
    pub detaches_stalling: u32,
    /// The server the metadata service answers for.
    pub metadata_instance: Option<String>,
    /// Catalog types under which each service is registered.
    pub catalog_types: BTreeMap<String, Vec<String>>,
    /// Manila's advertised microversion range.
    pub manila_max_minor: u32,
}

/// The `metadata` object of a create request (a value that is not a string
/// reads as empty).
pub fn metadata_of(spec: &serde_json::Value) -> BTreeMap<String, String> {
    spec.get("metadata")
        .and_then(serde_json::Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                .collect()
        })
        .unwrap_or_default()
}

/// The `metadata` filter of a list (Cinder's and Manila's): a dict
/// literal, `{"k": "v"}` or Python's `{'k': 'v'}`. Entries whose metadata
/// lacks any pair are left out.
pub fn metadata_filter(
    q: &BTreeMap<String, String>,
    style: crate::errors::Style,
) -> Result<Option<BTreeMap<String, String>>, crate::errors::ApiErr> {
    let Some(text) = q.get("metadata") else {
        return Ok(None);
    };
    serde_json::from_str::<BTreeMap<String, String>>(&text.replace('\'', "\""))
        .map(Some)
        .map_err(|_| crate::errors::ApiErr::bad(style, format!("Invalid metadata filter: {text}")))
}

/// Whether `metadata` has every pair `filter` asks for.
pub fn metadata_matches(
    metadata: &BTreeMap<String, String>,
    filter: Option<&BTreeMap<String, String>>,
) -> bool {
    filter.is_none_or(|f| f.iter().all(|(k, v)| metadata.get(k) == Some(v)))
}

pub fn now_iso() -> String {
    iso_at(std::time::SystemTime::now())
}

/// An RFC 3339 time `offset_secs` later (earlier when negative): what a
/// cloud whose clock is that far off writes.
pub fn shifted_iso(iso: &str, offset_secs: i64) -> String {
    if offset_secs == 0 {
        return iso.to_string();
    }
    match time::OffsetDateTime::parse(iso, &time::format_description::well_known::Rfc3339) {
        Ok(t) => (t + time::Duration::seconds(offset_secs))
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap_or_else(|_| iso.to_string()),
        Err(_) => iso.to_string(),
    }
}

pub fn iso_at(t: std::time::SystemTime) -> String {
    time::OffsetDateTime::from(t)
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|_| "1970-01-01T00:00:00Z".into())
}

pub fn new_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

impl World {
    /// Records an action on a server of `project_id` (`create`, `delete`,
    /// `attach_volume`, `detach_volume`, `stop`, `start`).
    pub fn record_instance_action(
        &mut self,
        server_id: &str,
        project_id: &str,
        action: &'static str,
    ) {
        let rec = self
            .instance_actions
            .entry(server_id.to_string())
            .or_insert_with(|| InstanceActionsRec {
                project_id: project_id.to_string(),
                deleted: false,
                actions: Vec::new(),
            });
        if action == "delete" {
            rec.deleted = true;
        }
        rec.actions.push(InstanceActionRec {
            action,
            request_id: format!("req-{}", new_id()),
            start_time: now_iso(),
        });
    }

    pub fn new(config: &EmulatorConfig) -> Self {
        let admin_project = Project {
            id: "a0000000000000000000000000000001".into(),
            name: "admin".into(),
        };
        let demo_project = Project {
            id: "d0000000000000000000000000000002".into(),
            name: "demo".into(),
        };
        let users = vec![
            User {
                id: "u-admin".into(),
                name: ADMIN_USER.into(),
                password: ADMIN_PASSWORD.into(),
                project_id: admin_project.id.clone(),
                admin: true,
            },
            User {
                id: "u-demo".into(),
                name: MEMBER_USER.into(),
                password: MEMBER_PASSWORD.into(),
                project_id: demo_project.id.clone(),
                admin: false,
            },
        ];
        let app_creds = vec![AppCred {
            id: APP_CRED_ID.into(),
            name: APP_CRED_NAME.into(),
            secret: APP_CRED_SECRET.into(),
            user_id: "u-admin".into(),
        }];
        let volume_types = vec![
            VolumeTypeRec {
                id: new_id(),
                name: "__DEFAULT__".into(),
                extra_specs: BTreeMap::new(),
            },
            VolumeTypeRec {
                id: new_id(),
                name: "multiattach".into(),
                extra_specs: [("multiattach".to_string(), "<is> True".to_string())].into(),
            },
        ];
        let share_type = |name: &str, specs: &[(&str, &str)]| ShareTypeRec {
            id: new_id(),
            name: name.into(),
            extra_specs: specs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        };
        let snapshots = [
            ("driver_handles_share_servers", "False"),
            ("snapshot_support", "True"),
            ("create_share_from_snapshot_support", "True"),
        ];
        // as the test cloud: `default` (the dummy backend), `cephfs` (the
        // real CephFS backend there), and one without snapshots
        let share_types = vec![
            share_type("default", &snapshots),
            share_type("cephfs", &snapshots),
            share_type(
                "no-snapshots",
                &[
                    ("driver_handles_share_servers", "False"),
                    ("snapshot_support", "False"),
                ],
            ),
        ];
        let catalog_types = [
            ("block-storage", vec!["block-storage", "volumev3"]),
            ("compute", vec!["compute"]),
            ("shared-file-system", vec!["sharev2"]),
            ("key-manager", vec!["key-manager"]),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.into_iter().map(str::to_string).collect()))
        .collect();
        Self {
            seq: 0,
            users,
            app_creds,
            projects: vec![admin_project, demo_project],
            tokens: HashMap::new(),
            token_lifetime: config.token_lifetime,
            volumes: BTreeMap::new(),
            snapshots: BTreeMap::new(),
            backups: BTreeMap::new(),
            // a generic group type, as an operator creates one; the
            // consistent one asks the backend for one-instant snapshots
            group_types: vec![
                GroupTypeRec {
                    id: new_id(),
                    name: "default".into(),
                    group_specs: BTreeMap::new(),
                },
                GroupTypeRec {
                    id: new_id(),
                    name: "consistent".into(),
                    group_specs: [(
                        "consistent_group_snapshot_enabled".to_string(),
                        "<is> True".to_string(),
                    )]
                    .into(),
                },
            ],
            groups: BTreeMap::new(),
            group_snapshots: BTreeMap::new(),
            volume_types,
            servers: BTreeMap::new(),
            instance_actions: BTreeMap::new(),
            shares: BTreeMap::new(),
            access_rules: BTreeMap::new(),
            share_snapshots: BTreeMap::new(),
            share_groups: BTreeMap::new(),
            share_group_snapshots: BTreeMap::new(),
            share_types,
            messages: Vec::new(),
            secrets: BTreeMap::new(),
            orders: BTreeMap::new(),
            quotas: Quotas::default(),
            manila_project_quotas: BTreeMap::new(),
            delays: config.delays.clone(),
            faults: Vec::new(),
            calls: Vec::new(),
            failing_volume_creates: 0,
            failing_share_creates: 0,
            failing_share_group_snapshots: 0,
            max_disk_devices_to_attach: -1,
            clock_offset_secs: 0,
            cross_az_attach: config.cross_az_attach,
            attaches_losing_cleanup: 0,
            attaches_stalling: 0,
            detaches_stalling: 0,
            metadata_instance: None,
            catalog_types,
            manila_max_minor: 87,
        }
    }

    pub fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    pub fn validate_token(&mut self, token: &str) -> Option<TokenInfo> {
        let now = SystemTime::now();
        self.tokens.retain(|_, t| t.expires > now);
        self.tokens.get(token).cloned()
    }

    pub fn match_fault(
        &mut self,
        method: &Method,
        path: &str,
        token: crate::faults::RequestToken,
    ) -> Option<FaultAction> {
        // spent rules stay, with their counts, until cleared
        self.faults
            .iter_mut()
            .find_map(|rule| rule.check(method, path, token))
    }

    pub fn record_call(
        &mut self,
        method: &Method,
        path: &str,
        query: &str,
        status: Option<u16>,
        arrived: std::time::Instant,
        fault: Option<&str>,
    ) {
        // bounded: a long soak must not grow the emulator without limit
        if self.calls.len() >= 100_000 {
            self.calls.drain(..50_000);
        }
        self.calls.push(CallRecord {
            method: method.to_string(),
            path: path.to_string(),
            query: query.to_string(),
            status,
            at_ms: SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            took_ms: arrived.elapsed().as_millis() as u64,
            fault: fault.map(str::to_string),
        });
    }

    pub fn project_volume_usage(&self, project: &str) -> (i64, i64) {
        let vols = self.volumes.values().filter(|v| v.project_id == project);
        let count = vols.clone().count() as i64;
        let gib = vols.map(|v| v.size as i64).sum();
        (count, gib)
    }

    /// Server-side check of a server's device names: vdb, vdc, ...
    pub fn next_device(&self, server_id: &str) -> String {
        let used: Vec<&String> = self
            .servers
            .get(server_id)
            .map(|s| s.volumes.values().collect())
            .unwrap_or_default();
        for c in b'b'..=b'z' {
            let dev = format!("/dev/vd{}", c as char);
            if !used.iter().any(|d| **d == dev) {
                return dev;
            }
        }
        "/dev/vdzz".into()
    }
}
