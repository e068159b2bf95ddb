//! Share groups (`/share-groups`) and share group snapshots
//! (`/share-group-snapshots`), out of experimental since 2.55: a share is
//! placed in a group when it is created (never later), a group snapshot
//! snapshots every share of the group, and its members are not share
//! snapshots: the only way back to their data is a new group made from
//! the group snapshot, one new share per member.

use super::*;

/// Share groups leave Manila's experimental API here (before, they need
/// the `X-OpenStack-Manila-API-Experimental` header this client never
/// sends).
pub const MV_SHARE_GROUPS: Microversion = Microversion::new(2, 55);

status_enum!(
    /// Share group statuses.
    ShareGroupStatus {
        Creating => "creating",
        Available => "available",
        Error => "error",
        Deleting => "deleting",
        ErrorDeleting => "error_deleting",
    }
);

status_enum!(
    /// Share group snapshot statuses (its members follow it).
    ShareGroupSnapshotStatus {
        Creating => "creating",
        Available => "available",
        Error => "error",
        Deleting => "deleting",
        ErrorDeleting => "error_deleting",
    }
);

impl ShareGroupStatus {
    pub fn is_error(&self) -> bool {
        self.as_str().starts_with("error")
    }
}

impl ShareGroupSnapshotStatus {
    pub fn is_error(&self) -> bool {
        self.as_str().starts_with("error")
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ShareGroup {
    pub id: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub name: String,
    pub status: ShareGroupStatus,
    #[serde(default)]
    pub description: Option<String>,
    /// Share type ids a share of the group may have.
    #[serde(default, deserialize_with = "null_as_default")]
    pub share_types: Vec<String>,
    #[serde(default)]
    pub share_group_type_id: Option<String>,
    #[serde(default)]
    pub source_share_group_snapshot_id: Option<String>,
    #[serde(default)]
    pub availability_zone: Option<String>,
    #[serde(default)]
    pub created_at: Option<String>,
}

/// One share's part of a group snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ShareGroupSnapshotMember {
    pub id: String,
    pub share_id: String,
    pub size: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ShareGroupSnapshot {
    pub id: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub name: String,
    pub status: ShareGroupSnapshotStatus,
    pub share_group_id: String,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub members: Vec<ShareGroupSnapshotMember>,
    #[serde(default)]
    pub created_at: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CreateShareGroup {
    pub name: String,
    pub description: Option<String>,
    /// Share type ids; Manila's default group type's when empty.
    pub share_types: Vec<String>,
    pub share_group_type_id: Option<String>,
    pub availability_zone: Option<String>,
    /// A group made from a group snapshot: one new share per member.
    pub source_share_group_snapshot_id: Option<String>,
}

#[derive(Deserialize)]
struct GroupEnvelope {
    share_group: ShareGroup,
}

#[derive(Deserialize)]
struct GroupSnapshotEnvelope {
    share_group_snapshot: ShareGroupSnapshot,
}

impl SharedFileSystems {
    /// A request to the share group API, refused here when the server is
    /// older than [`MV_SHARE_GROUPS`].
    async fn group_req(
        &self,
        method: Method,
        path: impl Into<String>,
        op: &'static str,
    ) -> Result<ApiRequest> {
        let v = self.microversion().await?;
        if v < MV_SHARE_GROUPS {
            return Err(Error::Unsupported {
                operation: op,
                message: format!(
                    "share groups need Manila microversion {MV_SHARE_GROUPS}, this server offers {v}"
                ),
            });
        }
        self.req(method, path, op).await
    }

    pub async fn create_share_group(&self, spec: &CreateShareGroup) -> Result<ShareGroup> {
        let mut g = Map::new();
        g.insert("name".into(), json!(spec.name));
        if !spec.share_types.is_empty() {
            g.insert("share_types".into(), json!(spec.share_types));
        }
        for (k, v) in [
            ("description", &spec.description),
            ("share_group_type_id", &spec.share_group_type_id),
            ("availability_zone", &spec.availability_zone),
            (
                "source_share_group_snapshot_id",
                &spec.source_share_group_snapshot_id,
            ),
        ] {
            if let Some(v) = v {
                g.insert(k.into(), json!(v));
            }
        }
        let req = self
            .group_req(Method::POST, "share-groups", "share_group_create")
            .await?
            .json(json!({ "share_group": Value::Object(g) }));
        Ok(self
            .session
            .send(req)
            .await?
            .json::<GroupEnvelope>()?
            .share_group)
    }

    pub async fn get_share_group(&self, id: &str) -> Result<ShareGroup> {
        let req = self
            .group_req(
                Method::GET,
                format!("share-groups/{}", seg(id)),
                "share_group_get",
            )
            .await?;
        Ok(self
            .session
            .send(req)
            .await?
            .json::<GroupEnvelope>()?
            .share_group)
    }

    /// The project's share groups made from group snapshot `source`.
    pub async fn share_groups_from(&self, source: &str) -> Result<Vec<ShareGroup>> {
        #[derive(Deserialize)]
        struct L {
            share_groups: Vec<ShareGroup>,
        }
        let req = self
            .group_req(Method::GET, "share-groups/detail", "share_group_list")
            .await?
            .query("source_share_group_snapshot_id", source);
        let l: L = self.session.send(req).await?.json()?;
        Ok(l.share_groups
            .into_iter()
            .filter(|g| g.source_share_group_snapshot_id.as_deref() == Some(source))
            .collect())
    }

    pub async fn delete_share_group(&self, id: &str) -> Result<()> {
        let req = self
            .group_req(
                Method::DELETE,
                format!("share-groups/{}", seg(id)),
                "share_group_delete",
            )
            .await?;
        self.session.send(req).await?;
        Ok(())
    }

    /// The shares of group `group_id` (every page).
    pub async fn shares_in_group(&self, group_id: &str) -> Result<Vec<Share>> {
        #[derive(Deserialize)]
        struct L {
            shares: Vec<Share>,
        }
        let req = self
            .group_req(Method::GET, "shares/detail", "share_list")
            .await?
            .query("share_group_id", group_id);
        let l: L = self.session.send(req).await?.json()?;
        Ok(l.shares
            .into_iter()
            .filter(|s| s.share_group_id.as_deref() == Some(group_id))
            .collect())
    }

    pub async fn create_share_group_snapshot(
        &self,
        share_group_id: &str,
        name: &str,
        description: Option<&str>,
    ) -> Result<ShareGroupSnapshot> {
        let mut s = json!({ "share_group_id": share_group_id, "name": name });
        if let Some(d) = description {
            s["description"] = json!(d);
        }
        let req = self
            .group_req(
                Method::POST,
                "share-group-snapshots",
                "share_group_snapshot_create",
            )
            .await?
            .json(json!({ "share_group_snapshot": s }));
        Ok(self
            .session
            .send(req)
            .await?
            .json::<GroupSnapshotEnvelope>()?
            .share_group_snapshot)
    }

    pub async fn get_share_group_snapshot(&self, id: &str) -> Result<ShareGroupSnapshot> {
        let req = self
            .group_req(
                Method::GET,
                format!("share-group-snapshots/{}", seg(id)),
                "share_group_snapshot_get",
            )
            .await?;
        Ok(self
            .session
            .send(req)
            .await?
            .json::<GroupSnapshotEnvelope>()?
            .share_group_snapshot)
    }

    pub async fn share_group_snapshots_named(&self, name: &str) -> Result<Vec<ShareGroupSnapshot>> {
        #[derive(Deserialize)]
        struct L {
            share_group_snapshots: Vec<ShareGroupSnapshot>,
        }
        let req = self
            .group_req(
                Method::GET,
                "share-group-snapshots/detail",
                "share_group_snapshot_list",
            )
            .await?
            .query("name", name);
        let l: L = self.session.send(req).await?.json()?;
        Ok(l.share_group_snapshots
            .into_iter()
            .filter(|s| s.name == name)
            .collect())
    }

    pub async fn delete_share_group_snapshot(&self, id: &str) -> Result<()> {
        let req = self
            .group_req(
                Method::DELETE,
                format!("share-group-snapshots/{}", seg(id)),
                "share_group_snapshot_delete",
            )
            .await?;
        self.session.send(req).await?;
        Ok(())
    }
}
