//! Cinder v3: volumes, snapshots, volume types, limits.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Instant;

use http::Method;
use serde::Deserialize;
use serde_json::{Map, Value, json};

use crate::common::{Link, OPENSTACK_API_VERSION, Page, all_pages, next_marker};
use crate::error::Result;
use crate::service::ServiceType;
use crate::session::{ApiRequest, Session};

mod attachments;
mod backups;
mod groups;
mod snapshots;

pub use attachments::{AttachStatus, Attachment, MV_ATTACHMENT_COMPLETE, MV_ATTACHMENTS};
pub use backups::{Backup, BackupStatus, CreateBackup};
pub use groups::{CreateGroup, Group, GroupSnapshot, GroupSnapshotStatus, GroupStatus, GroupType};
pub use snapshots::{CreateSnapshot, ListSnapshots, Snapshot, SnapshotStatus};

/// Listing by name filter (`?name=`) is reliable from this microversion on.
pub const MV_LIST_BY_NAME: &str = "3.34";
/// Extending an attached (`in-use`) volume needs this microversion.
pub const MV_EXTEND_IN_USE: &str = "3.42";
/// Restore a backup into a new volume, and a backup's availability zone.
pub const MV_BACKUP_AZ: &str = "3.51";
/// Generic volume groups, and a group's volumes listed with it (3.25).
pub const MV_GROUPS: &str = "3.25";
/// Group snapshots, and a snapshot's `group_snapshot_id`.
pub const MV_GROUP_SNAPSHOTS: &str = "3.14";

macro_rules! status_enum {
    ($(#[$m:meta])* $name:ident { $($variant:ident => $s:literal),* $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash)]
        pub enum $name {
            $($variant,)*
            Other(String),
        }

        impl $name {
            pub fn parse(s: &str) -> Self {
                match s {
                    $($s => $name::$variant,)*
                    other => $name::Other(other.to_string()),
                }
            }

            pub fn as_str(&self) -> &str {
                match self {
                    $($name::$variant => $s,)*
                    $name::Other(s) => s,
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
                Ok(Self::parse(&String::deserialize(d)?))
            }
        }
    };
}
pub(crate) use status_enum;

status_enum!(
    /// Cinder's volume statuses.
    VolumeStatus {
        Creating => "creating",
        Available => "available",
        Reserved => "reserved",
        Attaching => "attaching",
        Detaching => "detaching",
        InUse => "in-use",
        Maintenance => "maintenance",
        Deleting => "deleting",
        AwaitingTransfer => "awaiting-transfer",
        Error => "error",
        ErrorDeleting => "error_deleting",
        BackingUp => "backing-up",
        RestoringBackup => "restoring-backup",
        ErrorBackingUp => "error_backing-up",
        ErrorRestoring => "error_restoring",
        ErrorExtending => "error_extending",
        Downloading => "downloading",
        Uploading => "uploading",
        Retyping => "retyping",
        Extending => "extending",
    }
);

impl VolumeStatus {
    pub fn is_error(&self) -> bool {
        self.as_str().starts_with("error")
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct VolumeAttachment {
    #[serde(default)]
    pub server_id: Option<String>,
    #[serde(default)]
    pub attachment_id: Option<String>,
    #[serde(default)]
    pub device: Option<String>,
    #[serde(default)]
    pub host_name: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Volume {
    pub id: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub name: String,
    pub status: VolumeStatus,
    /// GiB
    pub size: u64,
    #[serde(default)]
    pub volume_type: Option<String>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub availability_zone: String,
    #[serde(default)]
    pub multiattach: bool,
    #[serde(default, deserialize_with = "bool_or_string")]
    pub bootable: bool,
    #[serde(default)]
    pub attachments: Vec<VolumeAttachment>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub metadata: BTreeMap<String, String>,
    #[serde(default)]
    pub snapshot_id: Option<String>,
    #[serde(default)]
    pub source_volid: Option<String>,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub created_at: Option<String>,
    /// When its status last changed (Cinder's time, UTC without a zone).
    #[serde(default)]
    pub updated_at: Option<String>,
    /// Cinder's clock when it answered with this volume (its `Date`):
    /// what `updated_at` is aged against, since the local clock may be
    /// off from Cinder's. None when Cinder did not say (or the volume
    /// came from a list).
    #[serde(skip)]
    pub read_at: Option<std::time::SystemTime>,
}

impl Volume {
    /// Servers this volume is attached to.
    pub fn attached_servers(&self) -> impl Iterator<Item = &str> {
        self.attachments
            .iter()
            .filter_map(|a| a.server_id.as_deref())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct VolumeType {
    pub id: String,
    pub name: String,
    #[serde(default, deserialize_with = "string_map")]
    pub extra_specs: BTreeMap<String, String>,
    #[serde(default)]
    pub is_public: Option<bool>,
}

impl VolumeType {
    /// `multiattach="<is> True"` in the extra specs.
    pub fn multiattach(&self) -> bool {
        self.extra_specs.get("multiattach").is_some_and(|v| {
            v.trim()
                .trim_start_matches("<is>")
                .trim()
                .eq_ignore_ascii_case("true")
        })
    }
}

/// The absolute limits of the project (`-1` means unlimited).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AbsoluteLimits {
    #[serde(default)]
    pub max_total_volumes: i64,
    #[serde(default)]
    pub total_volumes_used: i64,
    #[serde(default)]
    pub max_total_volume_gigabytes: i64,
    #[serde(default)]
    pub total_gigabytes_used: i64,
    #[serde(default)]
    pub max_total_snapshots: i64,
    #[serde(default)]
    pub total_snapshots_used: i64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CreateVolume {
    pub name: String,
    pub size_gib: u64,
    pub description: Option<String>,
    pub volume_type: Option<String>,
    pub availability_zone: Option<String>,
    pub snapshot_id: Option<String>,
    pub source_volume_id: Option<String>,
    /// Restore this backup into the new volume (microversion 3.47).
    pub backup_id: Option<String>,
    pub metadata: BTreeMap<String, String>,
    /// e.g. `same_host` / `different_host` → list of volume ids
    pub scheduler_hints: BTreeMap<String, Vec<String>>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListVolumes {
    pub name: Option<String>,
    pub limit: Option<u32>,
    pub marker: Option<String>,
    /// Only volumes whose metadata has every one of these pairs (Cinder's
    /// `metadata` filter; checked here too, for servers that ignore it).
    pub metadata: BTreeMap<String, String>,
}

/// The Cinder v3 API. Cheap to clone.
#[derive(Debug, Clone)]
pub struct BlockStorage {
    session: Session,
    deadline: Option<Instant>,
    use_microversions: bool,
}

impl BlockStorage {
    pub fn new(session: Session) -> Self {
        Self {
            session,
            deadline: None,
            use_microversions: true,
        }
    }

    /// The same client, bounding every call (retries included) by `deadline`.
    pub fn with_deadline(&self, deadline: Instant) -> Self {
        Self {
            deadline: Some(deadline),
            ..self.clone()
        }
    }

    /// `[BlockStorage] ignore-volume-microversion`: for clouds whose Cinder
    /// is too old for 3.34/3.42.
    pub fn without_microversions(mut self) -> Self {
        self.use_microversions = false;
        self
    }

    pub fn session(&self) -> &Session {
        &self.session
    }

    fn req(&self, method: Method, path: impl Into<String>, op: &'static str) -> ApiRequest {
        ApiRequest::new(ServiceType::BlockStorage, method, path, op).deadline(self.deadline)
    }

    fn mv(&self, req: ApiRequest, version: &str) -> ApiRequest {
        if self.use_microversions {
            req.header(OPENSTACK_API_VERSION.clone(), &format!("volume {version}"))
        } else {
            req
        }
    }

    pub async fn create_volume(&self, spec: &CreateVolume) -> Result<Volume> {
        let mut v = Map::new();
        v.insert("size".into(), json!(spec.size_gib));
        v.insert("name".into(), json!(spec.name));
        opt(&mut v, "description", &spec.description);
        opt(&mut v, "volume_type", &spec.volume_type);
        opt(&mut v, "availability_zone", &spec.availability_zone);
        opt(&mut v, "snapshot_id", &spec.snapshot_id);
        opt(&mut v, "source_volid", &spec.source_volume_id);
        opt(&mut v, "backup_id", &spec.backup_id);
        if !spec.metadata.is_empty() {
            v.insert("metadata".into(), json!(spec.metadata));
        }
        let mut body = json!({ "volume": Value::Object(v) });
        if !spec.scheduler_hints.is_empty() {
            body["OS-SCH-HNT:scheduler_hints"] = json!(spec.scheduler_hints);
        }
        let mut req = self
            .req(Method::POST, "volumes", "volume_create")
            .json(body);
        if spec.backup_id.is_some() {
            req = self.mv(req, MV_BACKUP_AZ);
        }
        let resp = self.session.send(req).await?;
        let mut v = resp.json::<VolumeEnvelope>()?.volume;
        v.read_at = resp.date;
        Ok(v)
    }

    pub async fn get_volume(&self, id: &str) -> Result<Volume> {
        let resp = self
            .session
            .send(self.req(Method::GET, format!("volumes/{}", seg(id)), "volume_get"))
            .await?;
        let mut v = resp.json::<VolumeEnvelope>()?.volume;
        v.read_at = resp.date;
        Ok(v)
    }

    pub async fn list_volumes(&self, q: &ListVolumes) -> Result<Page<Volume>> {
        let mut req = self.mv(
            self.req(Method::GET, "volumes/detail", "volume_list"),
            MV_LIST_BY_NAME,
        );
        if let Some(n) = &q.name {
            req = req.query("name", n);
        }
        if let Some(l) = q.limit {
            req = req.query("limit", l);
        }
        if let Some(m) = &q.marker {
            req = req.query("marker", m);
        }
        if !q.metadata.is_empty() {
            req = req.query("metadata", crate::common::metadata_filter(&q.metadata));
        }
        #[derive(Deserialize)]
        struct L {
            volumes: Vec<Volume>,
            #[serde(default)]
            volumes_links: Vec<Link>,
        }
        let l: L = self.session.send(req).await?.json()?;
        let next = next_marker(&l.volumes_links);
        // Cinder's name filter matches exactly from 3.34 on; older
        // servers (or ignore-volume-microversion) may return more
        let items = l
            .volumes
            .into_iter()
            .filter(|v| {
                q.name.as_ref().is_none_or(|n| &v.name == n)
                    && crate::common::has_all(&v.metadata, &q.metadata)
            })
            .collect();
        Ok(Page {
            items,
            next_marker: next,
        })
    }

    /// All volumes named `name` (following pagination).
    pub async fn volumes_named(&self, name: &str) -> Result<Vec<Volume>> {
        all_pages(|marker| {
            let q = ListVolumes {
                name: Some(name.to_string()),
                marker,
                ..Default::default()
            };
            async move { self.list_volumes(&q).await }
        })
        .await
    }

    /// All volumes whose metadata has every pair of `metadata` (following
    /// pagination; Cinder filters, and this client checks).
    pub async fn volumes_with_metadata(
        &self,
        metadata: &BTreeMap<String, String>,
    ) -> Result<Vec<Volume>> {
        all_pages(|marker| {
            let q = ListVolumes {
                marker,
                metadata: metadata.clone(),
                ..Default::default()
            };
            async move { self.list_volumes(&q).await }
        })
        .await
    }

    pub async fn delete_volume(&self, id: &str) -> Result<()> {
        self.session
            .send(self.req(
                Method::DELETE,
                format!("volumes/{}", seg(id)),
                "volume_delete",
            ))
            .await?;
        Ok(())
    }

    /// Grows a volume; `in_use` selects microversion 3.42 (online extend).
    pub async fn extend_volume(&self, id: &str, new_size_gib: u64, in_use: bool) -> Result<()> {
        let mut req = self
            .req(
                Method::POST,
                format!("volumes/{}/action", seg(id)),
                "volume_expand",
            )
            .json(json!({ "os-extend": { "new_size": new_size_gib } }));
        if in_use {
            req = self.mv(req, MV_EXTEND_IN_USE);
        }
        self.session.send(req).await?;
        Ok(())
    }

    /// Merges `metadata` into the volume's metadata.
    pub async fn update_volume_metadata(
        &self,
        id: &str,
        metadata: &BTreeMap<String, String>,
    ) -> Result<BTreeMap<String, String>> {
        let resp = self
            .session
            .send(
                self.req(
                    Method::POST,
                    format!("volumes/{}/metadata", seg(id)),
                    "volume_metadata_update",
                )
                .json(json!({ "metadata": metadata })),
            )
            .await?;
        Ok(resp.json::<MetadataEnvelope>()?.metadata)
    }

    /// Removes one key of the volume's metadata; a key that is not there
    /// is no error (the removal is what was asked).
    pub async fn delete_volume_metadata_key(&self, id: &str, key: &str) -> Result<()> {
        match self
            .session
            .send(self.req(
                Method::DELETE,
                format!("volumes/{}/metadata/{}", seg(id), seg(key)),
                "volume_metadata_delete",
            ))
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if e.is_not_found() => {
                // Cinder answers 404 for the volume too: tell them apart
                self.get_volume(id).await.map(|_| ())
            }
            Err(e) => Err(e),
        }
    }

    pub async fn get_volume_metadata(&self, id: &str) -> Result<BTreeMap<String, String>> {
        let resp = self
            .session
            .send(self.req(
                Method::GET,
                format!("volumes/{}/metadata", seg(id)),
                "volume_metadata_get",
            ))
            .await?;
        Ok(resp.json::<MetadataEnvelope>()?.metadata)
    }

    /// Changes the volume type, migrating the data if the backend must.
    pub async fn retype_volume(&self, id: &str, new_type: &str) -> Result<()> {
        let body =
            json!({ "os-retype": { "new_type": new_type, "migration_policy": "on-demand" } });
        self.session
            .send(
                self.req(
                    Method::POST,
                    format!("volumes/{}/action", seg(id)),
                    "volume_retype",
                )
                .json(body),
            )
            .await?;
        Ok(())
    }

    pub async fn set_bootable(&self, id: &str, bootable: bool) -> Result<()> {
        let body = json!({ "os-set_bootable": { "bootable": bootable } });
        self.session
            .send(
                self.req(
                    Method::POST,
                    format!("volumes/{}/action", seg(id)),
                    "volume_set_bootable",
                )
                .json(body),
            )
            .await?;
        Ok(())
    }

    /// Admin only: forces a volume's status (`os-reset_status`).
    pub async fn reset_volume_status(&self, id: &str, status: &str) -> Result<()> {
        let body = json!({ "os-reset_status": { "status": status } });
        self.session
            .send(
                self.req(
                    Method::POST,
                    format!("volumes/{}/action", seg(id)),
                    "volume_reset_status",
                )
                .json(body),
            )
            .await?;
        Ok(())
    }

    pub async fn list_volume_types(&self) -> Result<Vec<VolumeType>> {
        #[derive(Deserialize)]
        struct L {
            volume_types: Vec<VolumeType>,
        }
        Ok(self
            .session
            .send(self.req(Method::GET, "types", "volume_type_list"))
            .await?
            .json::<L>()?
            .volume_types)
    }

    /// A volume type by id or name.
    pub async fn get_volume_type(&self, id_or_name: &str) -> Result<VolumeType> {
        #[derive(Deserialize)]
        struct E {
            volume_type: VolumeType,
        }
        match self
            .session
            .send(self.req(
                Method::GET,
                format!("types/{}", seg(id_or_name)),
                "volume_type_get",
            ))
            .await
        {
            Ok(r) => Ok(r.json::<E>()?.volume_type),
            Err(e) if e.is_not_found() => {
                let all = self.list_volume_types().await?;
                all.into_iter().find(|t| t.name == id_or_name).ok_or(e)
            }
            Err(e) => Err(e),
        }
    }

    /// Admin only: creates a volume type with extra specs.
    pub async fn create_volume_type(
        &self,
        name: &str,
        extra_specs: &BTreeMap<String, String>,
    ) -> Result<VolumeType> {
        #[derive(Deserialize)]
        struct E {
            volume_type: VolumeType,
        }
        let body = json!({ "volume_type": { "name": name, "extra_specs": extra_specs } });
        Ok(self
            .session
            .send(
                self.req(Method::POST, "types", "volume_type_create")
                    .json(body),
            )
            .await?
            .json::<E>()?
            .volume_type)
    }

    /// Admin only: sets quotas of `project_id` (`gigabytes`, or
    /// `gigabytes_<volume type>` for one type; -1 is unlimited).
    pub async fn set_quotas(&self, project_id: &str, quotas: &BTreeMap<String, i64>) -> Result<()> {
        let body = json!({ "quota_set": quotas });
        self.session
            .send(
                self.req(
                    Method::PUT,
                    format!("os-quota-sets/{project_id}"),
                    "quota_set_update",
                )
                .json(body),
            )
            .await?;
        Ok(())
    }

    pub async fn absolute_limits(&self) -> Result<AbsoluteLimits> {
        #[derive(Deserialize)]
        struct Limits {
            absolute: AbsoluteLimits,
        }
        #[derive(Deserialize)]
        struct E {
            limits: Limits,
        }
        Ok(self
            .session
            .send(self.req(Method::GET, "limits", "limits_get"))
            .await?
            .json::<E>()?
            .limits
            .absolute)
    }
}

#[derive(Deserialize)]
struct VolumeEnvelope {
    volume: Volume,
}

#[derive(Deserialize)]
struct MetadataEnvelope {
    metadata: BTreeMap<String, String>,
}

fn opt(m: &mut Map<String, Value>, key: &str, v: &Option<String>) {
    if let Some(v) = v {
        m.insert(key.into(), json!(v));
    }
}

/// Percent-encodes an id used as a path segment, so that an id supplied by
/// a user cannot walk to another URL.
pub(crate) fn seg(id: &str) -> String {
    if id.is_empty() || id.chars().all(|c| c == '.') {
        return id.replace('.', "%2E");
    }
    url::form_urlencoded::byte_serialize(id.as_bytes())
        .collect::<String>()
        .replace('+', "%20")
}

/// Extra specs as strings: Manila and Cinder send some as JSON booleans
/// or numbers (`"driver_handles_share_servers": false`).
pub(crate) fn string_map<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> std::result::Result<BTreeMap<String, String>, D::Error> {
    let raw: Option<BTreeMap<String, Value>> = Option::deserialize(d)?;
    Ok(raw
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| {
            let text = match v {
                Value::String(s) => s,
                Value::Null => String::new(),
                other => other.to_string(),
            };
            (k, text)
        })
        .collect())
}

pub(crate) fn null_as_default<'de, D, T>(d: D) -> std::result::Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// Cinder reports `bootable` as the string "true"/"false".
fn bool_or_string<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<bool, D::Error> {
    Ok(match Value::deserialize(d)? {
        Value::Bool(b) => b,
        Value::String(s) => s.eq_ignore_ascii_case("true"),
        _ => false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn volume_json_shapes() {
        let v: Volume = serde_json::from_value(json!({
            "id": "v1", "name": null, "status": "in-use", "size": 2, "bootable": "true",
            "availability_zone": "nova", "metadata": {}, "attachments": [{"server_id": "s1", "device": "/dev/vdb"}],
            "multiattach": false
        }))
        .unwrap();
        assert_eq!(v.status, VolumeStatus::InUse);
        assert!(v.bootable);
        assert_eq!(v.attached_servers().collect::<Vec<_>>(), vec!["s1"]);
        assert_eq!(
            VolumeStatus::parse("error_extending"),
            VolumeStatus::ErrorExtending
        );
        assert!(VolumeStatus::parse("error_extending").is_error());
        assert_eq!(
            VolumeStatus::parse("weird"),
            VolumeStatus::Other("weird".into())
        );
    }

    #[test]
    fn extra_specs_may_be_booleans() {
        let t: VolumeType = serde_json::from_value(
            json!({"id": "t", "name": "t", "extra_specs": {"a": false, "b": 3, "c": "x"}}),
        )
        .unwrap();
        assert_eq!(t.extra_specs.get("a").map(String::as_str), Some("false"));
        assert_eq!(t.extra_specs.get("b").map(String::as_str), Some("3"));
    }

    #[test]
    fn multiattach_spec() {
        let t = |v: &str| VolumeType {
            id: "t".into(),
            name: "t".into(),
            extra_specs: [("multiattach".into(), v.into())].into(),
            is_public: None,
        };
        assert!(t("<is> True").multiattach());
        assert!(t("true").multiattach());
        assert!(!t("<is> False").multiattach());
    }

    #[test]
    fn ids_cannot_escape_their_segment() {
        assert_eq!(seg("../../admin"), "..%2F..%2Fadmin");
        assert_eq!(seg("a b"), "a%20b");
        assert_eq!(seg(".."), "%2E%2E");
    }
}
