//! Manila v2: shares, export locations, access rules, snapshots, share
//! types and user messages, at a microversion negotiated with the server.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Instant;

use http::Method;
use serde::Deserialize;
use serde_json::{Map, Value, json};
use tokio::sync::OnceCell;

use crate::cinder::{null_as_default, seg, status_enum, string_map};
use crate::common::MANILA_API_VERSION;
use crate::error::{Error, Result};
use crate::service::ServiceType;
use crate::session::{ApiRequest, Session, unversioned_root};

mod access;
mod catalog;
mod groups;
mod snapshots;

pub use access::{AccessRule, AccessRuleState, GrantAccess};
pub use catalog::{Pool, PoolCapabilities, ShareLimits, ShareType, UserMessage};
pub use groups::{
    CreateShareGroup, MV_SHARE_GROUPS, ShareGroup, ShareGroupSnapshot, ShareGroupSnapshotMember,
    ShareGroupSnapshotStatus, ShareGroupStatus,
};
pub use snapshots::{ShareSnapshot, ShareSnapshotStatus};

/// A Manila API microversion `2.N`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Microversion {
    pub major: u32,
    pub minor: u32,
}

impl Microversion {
    pub const fn new(major: u32, minor: u32) -> Self {
        Self { major, minor }
    }

    pub fn parse(s: &str) -> Option<Self> {
        let (a, b) = s.trim().split_once('.')?;
        Some(Self {
            major: a.parse().ok()?,
            minor: b.parse().ok()?,
        })
    }
}

impl fmt::Display for Microversion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// Oldest server this client works with (share `metadata` filters,
/// `cephx` access keys, consistent export locations).
pub const MIN_MICROVERSION: Microversion = Microversion::new(2, 37);
/// Newest behaviour this client knows how to read.
pub const MAX_MICROVERSION: Microversion = Microversion::new(2, 65);
/// `GET /share-access-rules` exists from here on.
pub(crate) const MV_ACCESS_RULES_API: Microversion = Microversion::new(2, 45);

status_enum!(
    /// Manila's share statuses.
    ShareStatus {
        Creating => "creating",
        CreatingFromSnapshot => "creating_from_snapshot",
        Available => "available",
        Error => "error",
        Deleting => "deleting",
        ErrorDeleting => "error_deleting",
        Extending => "extending",
        ExtendingError => "extending_error",
        Shrinking => "shrinking",
        ShrinkingError => "shrinking_error",
        ShrinkingPossibleDataLossError => "shrinking_possible_data_loss_error",
        Migrating => "migrating",
    }
);

impl ShareStatus {
    pub fn is_error(&self) -> bool {
        self.as_str().contains("error")
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Share {
    pub id: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub name: String,
    pub status: ShareStatus,
    pub size: u64,
    pub share_proto: String,
    #[serde(default)]
    pub share_type: Option<String>,
    #[serde(default)]
    pub share_type_name: Option<String>,
    #[serde(default)]
    pub share_network_id: Option<String>,
    #[serde(default)]
    pub availability_zone: Option<String>,
    #[serde(default)]
    pub snapshot_id: Option<String>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub metadata: BTreeMap<String, String>,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub created_at: Option<String>,
    /// The share group it was created in (2.31+); it never leaves it.
    #[serde(default)]
    pub share_group_id: Option<String>,
    /// The group snapshot member it was made from (2.31+).
    #[serde(default)]
    pub source_share_group_snapshot_member_id: Option<String>,
    /// Manila's clock when it answered with this share (its `Date`), for
    /// reading `created_at` against; None when it did not say (or the
    /// share came from a list).
    #[serde(skip)]
    pub read_at: Option<std::time::SystemTime>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ExportLocation {
    pub id: String,
    pub path: String,
    #[serde(default)]
    pub preferred: bool,
    #[serde(default)]
    pub is_admin_only: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CreateShare {
    /// `NFS`, `CEPHFS`, ...
    pub protocol: String,
    pub size_gib: u64,
    pub name: String,
    pub description: Option<String>,
    pub share_type: Option<String>,
    pub share_network_id: Option<String>,
    pub availability_zone: Option<String>,
    pub snapshot_id: Option<String>,
    /// Created in this share group (2.31+).
    pub share_group_id: Option<String>,
    pub metadata: BTreeMap<String, String>,
}

/// One page of shares or snapshots: Manila pages by offset.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListPage {
    /// Entries to return at most (Manila's `limit`).
    pub limit: Option<u32>,
    /// Entries to skip (Manila's `offset`).
    pub offset: u64,
    pub name: Option<String>,
    /// Snapshots of this share only (snapshot listings).
    pub share_id: Option<String>,
}

impl ListPage {
    /// `req` asking for this page, oldest first (a stable order for offset
    /// paging while entries are being created).
    pub(crate) fn query(&self, mut req: ApiRequest) -> ApiRequest {
        req = req
            .query("sort_key", "created_at")
            .query("sort_dir", "asc")
            .query("offset", self.offset);
        if let Some(l) = self.limit {
            req = req.query("limit", l);
        }
        if let Some(n) = &self.name {
            req = req.query("name", n);
        }
        if let Some(id) = &self.share_id {
            req = req.query("share_id", id);
        }
        req
    }
}

/// The Manila v2 API. Cheap to clone; clones share the negotiated
/// microversion.
#[derive(Debug, Clone)]
pub struct SharedFileSystems {
    session: Session,
    deadline: Option<Instant>,
    version: Arc<OnceCell<Microversion>>,
}

impl SharedFileSystems {
    pub fn new(session: Session) -> Self {
        Self {
            session,
            deadline: None,
            version: Arc::new(OnceCell::new()),
        }
    }

    pub fn with_deadline(&self, deadline: Instant) -> Self {
        Self {
            deadline: Some(deadline),
            ..self.clone()
        }
    }

    /// The microversion in use: the highest both sides support, found once
    /// from the server's version document.
    pub async fn microversion(&self) -> Result<Microversion> {
        self.version
            .get_or_try_init(|| self.negotiate())
            .await
            .copied()
    }

    async fn negotiate(&self) -> Result<Microversion> {
        let op = "version_discovery";
        let endpoint = self.session.endpoint(ServiceType::SharedFileSystem).await?;
        let mut req = ApiRequest::new(ServiceType::SharedFileSystem, Method::GET, "", op)
            .deadline(self.deadline);
        req.absolute_base = Some(unversioned_root(&endpoint));
        #[derive(Deserialize)]
        struct V {
            id: String,
            #[serde(default)]
            version: String,
            #[serde(default)]
            min_version: String,
        }
        #[derive(Deserialize)]
        struct Doc {
            versions: Vec<V>,
        }
        let doc: Doc = self.session.send(req).await?.json()?;
        let v2 = doc
            .versions
            .iter()
            .find(|v| v.id.starts_with("v2"))
            .ok_or_else(|| Error::Unsupported {
                operation: op,
                message: "the server offers no v2 API".into(),
            })?;
        let server_max = Microversion::parse(&v2.version).ok_or_else(|| Error::Unsupported {
            operation: op,
            message: "the server supports no microversions".into(),
        })?;
        let server_min = Microversion::parse(&v2.min_version).unwrap_or(Microversion::new(2, 0));
        if server_max < MIN_MICROVERSION || server_min > MAX_MICROVERSION {
            return Err(Error::Unsupported {
                operation: op,
                message: format!(
                    "Manila supports microversions {server_min}..{server_max}, this client needs {MIN_MICROVERSION}..{MAX_MICROVERSION}"
                ),
            });
        }
        let chosen = server_max.min(MAX_MICROVERSION);
        tracing::debug!(%chosen, %server_max, "negotiated the Manila microversion");
        Ok(chosen)
    }

    async fn req(
        &self,
        method: Method,
        path: impl Into<String>,
        op: &'static str,
    ) -> Result<ApiRequest> {
        let v = self.microversion().await?;
        Ok(
            ApiRequest::new(ServiceType::SharedFileSystem, method, path, op)
                .deadline(self.deadline)
                .header(MANILA_API_VERSION.clone(), &v.to_string()),
        )
    }

    pub async fn create_share(&self, spec: &CreateShare) -> Result<Share> {
        let mut s = Map::new();
        s.insert("share_proto".into(), json!(spec.protocol));
        s.insert("size".into(), json!(spec.size_gib));
        s.insert("name".into(), json!(spec.name));
        for (k, v) in [
            ("description", &spec.description),
            ("share_type", &spec.share_type),
            ("share_network_id", &spec.share_network_id),
            ("availability_zone", &spec.availability_zone),
            ("snapshot_id", &spec.snapshot_id),
            ("share_group_id", &spec.share_group_id),
        ] {
            if let Some(v) = v {
                s.insert(k.into(), json!(v));
            }
        }
        if !spec.metadata.is_empty() {
            s.insert("metadata".into(), json!(spec.metadata));
        }
        let req = self
            .req(Method::POST, "shares", "share_create")
            .await?
            .json(json!({ "share": Value::Object(s) }));
        Ok(self.session.send(req).await?.json::<ShareEnvelope>()?.share)
    }

    pub async fn get_share(&self, id: &str) -> Result<Share> {
        let req = self
            .req(Method::GET, format!("shares/{}", seg(id)), "share_get")
            .await?;
        let resp = self.session.send(req).await?;
        let mut share = resp.json::<ShareEnvelope>()?.share;
        share.read_at = resp.date;
        Ok(share)
    }

    /// Merges `metadata` into the share's metadata.
    pub async fn update_share_metadata(
        &self,
        id: &str,
        metadata: &BTreeMap<String, String>,
    ) -> Result<()> {
        let req = self
            .req(
                Method::POST,
                format!("shares/{}/metadata", seg(id)),
                "share_metadata_update",
            )
            .await?
            .json(json!({ "metadata": metadata }));
        self.session.send(req).await?;
        Ok(())
    }

    pub async fn list_shares_named(&self, name: &str) -> Result<Vec<Share>> {
        #[derive(Deserialize)]
        struct L {
            shares: Vec<Share>,
        }
        let req = self
            .req(Method::GET, "shares/detail", "share_list")
            .await?
            .query("name", name);
        let l: L = self.session.send(req).await?.json()?;
        Ok(l.shares.into_iter().filter(|s| s.name == name).collect())
    }

    /// One page of the project's shares, oldest first (a stable order for
    /// offset paging while shares are being created).
    pub async fn list_shares(&self, q: &ListPage) -> Result<Vec<Share>> {
        #[derive(Deserialize)]
        struct L {
            shares: Vec<Share>,
        }
        let req = q.query(self.req(Method::GET, "shares/detail", "share_list").await?);
        Ok(self.session.send(req).await?.json::<L>()?.shares)
    }

    /// All shares whose metadata has every pair of `metadata` (Manila
    /// filters, and this client checks), following pagination.
    pub async fn shares_with_metadata(
        &self,
        metadata: &BTreeMap<String, String>,
    ) -> Result<Vec<Share>> {
        const PAGE: u32 = 500;
        #[derive(Deserialize)]
        struct L {
            shares: Vec<Share>,
        }
        let mut out = Vec::new();
        let mut offset = 0u64;
        loop {
            let req = self
                .req(Method::GET, "shares/detail", "share_list")
                .await?
                .query("sort_key", "created_at")
                .query("sort_dir", "asc")
                .query("offset", offset)
                .query("limit", PAGE)
                .query("metadata", crate::common::metadata_filter(metadata));
            let page = self.session.send(req).await?.json::<L>()?.shares;
            let last = page.len() < PAGE as usize;
            offset += page.len() as u64;
            out.extend(
                page.into_iter()
                    .filter(|s| crate::common::has_all(&s.metadata, metadata)),
            );
            if last {
                return Ok(out);
            }
        }
    }

    pub async fn delete_share(&self, id: &str) -> Result<()> {
        self.delete_share_in(id, None).await
    }

    /// Deletes a share; one in a share group is deleted only when its
    /// group is named (Manila refuses it otherwise).
    pub async fn delete_share_in(&self, id: &str, share_group_id: Option<&str>) -> Result<()> {
        let mut req = self
            .req(
                Method::DELETE,
                format!("shares/{}", seg(id)),
                "share_delete",
            )
            .await?;
        if let Some(g) = share_group_id {
            req = req.query("share_group_id", g);
        }
        self.session.send(req).await?;
        Ok(())
    }

    /// Deletes `share`, naming its share group when it is in one.
    pub async fn delete_share_of(&self, share: &Share) -> Result<()> {
        self.delete_share_in(&share.id, share.share_group_id.as_deref())
            .await
    }

    /// Sets the share's name and description (Manila's `display_name`,
    /// `display_description`).
    pub async fn rename_share(&self, id: &str, name: &str, description: &str) -> Result<()> {
        let req = self
            .req(Method::PUT, format!("shares/{}", seg(id)), "share_update")
            .await?
            .json(json!({ "share": { "display_name": name, "display_description": description } }));
        self.session.send(req).await?;
        Ok(())
    }

    async fn action(
        &self,
        id: &str,
        op: &'static str,
        body: Value,
    ) -> Result<crate::session::ApiResponse> {
        let req = self
            .req(Method::POST, format!("shares/{}/action", seg(id)), op)
            .await?
            .json(body);
        self.session.send(req).await
    }

    pub async fn extend_share(&self, id: &str, new_size_gib: u64) -> Result<()> {
        self.action(
            id,
            "share_extend",
            json!({ "extend": { "new_size": new_size_gib } }),
        )
        .await
        .map(|_| ())
    }

    pub async fn shrink_share(&self, id: &str, new_size_gib: u64) -> Result<()> {
        self.action(
            id,
            "share_shrink",
            json!({ "shrink": { "new_size": new_size_gib } }),
        )
        .await
        .map(|_| ())
    }

    /// Export locations visible to this user (admin-only ones are hidden
    /// from non-admins by the server).
    pub async fn list_export_locations(&self, share_id: &str) -> Result<Vec<ExportLocation>> {
        #[derive(Deserialize)]
        struct L {
            export_locations: Vec<ExportLocation>,
        }
        let req = self
            .req(
                Method::GET,
                format!("shares/{}/export_locations", seg(share_id)),
                "export_location_list",
            )
            .await?;
        Ok(self.session.send(req).await?.json::<L>()?.export_locations)
    }
}

#[derive(Deserialize)]
struct ShareEnvelope {
    share: Share,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn microversion_order() {
        assert!(Microversion::parse("2.9").unwrap() < Microversion::parse("2.37").unwrap());
        assert_eq!(Microversion::parse("2.65").unwrap().to_string(), "2.65");
        assert!(Microversion::parse("x").is_none());
    }
}
