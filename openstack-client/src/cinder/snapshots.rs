//! Snapshots (`/snapshots`): of a volume, tagged like it, listed by name,
//! volume or metadata.

use std::collections::BTreeMap;

use reqwest::Method;
use serde::Deserialize;

use super::*;

status_enum!(
    /// Cinder's snapshot statuses.
    SnapshotStatus {
        Creating => "creating",
        Available => "available",
        BackingUp => "backing-up",
        Deleting => "deleting",
        Error => "error",
        Deleted => "deleted",
        Unmanaging => "unmanaging",
        Restoring => "restoring",
        ErrorDeleting => "error_deleting",
    }
);

impl SnapshotStatus {
    pub fn is_error(&self) -> bool {
        self.as_str().starts_with("error")
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Snapshot {
    pub id: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub name: String,
    pub status: SnapshotStatus,
    pub size: u64,
    pub volume_id: String,
    #[serde(default)]
    pub created_at: Option<String>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub metadata: BTreeMap<String, String>,
    #[serde(default)]
    pub description: Option<String>,
    /// The group snapshot this snapshot is a member of (3.14).
    #[serde(default)]
    pub group_snapshot_id: Option<String>,
    /// Cinder's clock when it answered with this snapshot (its `Date`),
    /// as for [`Volume::read_at`]. None from a list.
    #[serde(skip)]
    pub read_at: Option<std::time::SystemTime>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CreateSnapshot {
    pub volume_id: String,
    pub name: String,
    pub description: Option<String>,
    /// Snapshot an attached volume.
    pub force: bool,
    pub metadata: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListSnapshots {
    pub name: Option<String>,
    pub volume_id: Option<String>,
    pub limit: Option<u32>,
    pub marker: Option<String>,
    /// Only snapshots whose metadata has every one of these pairs.
    pub metadata: BTreeMap<String, String>,
}

impl BlockStorage {
    pub async fn create_snapshot(&self, spec: &CreateSnapshot) -> Result<Snapshot> {
        let mut s = Map::new();
        s.insert("volume_id".into(), json!(spec.volume_id));
        s.insert("name".into(), json!(spec.name));
        s.insert("force".into(), json!(spec.force));
        opt(&mut s, "description", &spec.description);
        if !spec.metadata.is_empty() {
            s.insert("metadata".into(), json!(spec.metadata));
        }
        let resp = self
            .session
            .send(
                self.req(Method::POST, "snapshots", "snapshot_create")
                    .json(json!({ "snapshot": Value::Object(s) })),
            )
            .await?;
        Ok(resp.json::<SnapshotEnvelope>()?.snapshot)
    }

    pub async fn get_snapshot(&self, id: &str) -> Result<Snapshot> {
        let resp = self
            .session
            .send(self.mv(
                self.req(
                    Method::GET,
                    format!("snapshots/{}", seg(id)),
                    "snapshot_get",
                ),
                MV_GROUP_SNAPSHOTS,
            ))
            .await?;
        let mut s = resp.json::<SnapshotEnvelope>()?.snapshot;
        s.read_at = resp.date;
        Ok(s)
    }

    /// The snapshots named exactly `name` (Cinder's filter may match
    /// more loosely).
    pub async fn snapshots_named(&self, name: &str) -> Result<Vec<Snapshot>> {
        Ok(self
            .list_snapshots(&ListSnapshots {
                name: Some(name.to_string()),
                ..Default::default()
            })
            .await?
            .items
            .into_iter()
            .filter(|s| s.name == name)
            .collect())
    }

    pub async fn list_snapshots(&self, q: &ListSnapshots) -> Result<Page<Snapshot>> {
        let mut req = self.mv(
            self.req(Method::GET, "snapshots/detail", "snapshot_list"),
            MV_LIST_BY_NAME,
        );
        if let Some(n) = &q.name {
            req = req.query("name", n);
        }
        if let Some(v) = &q.volume_id {
            req = req.query("volume_id", v);
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
            snapshots: Vec<Snapshot>,
            #[serde(default)]
            snapshots_links: Vec<Link>,
        }
        let l: L = self.session.send(req).await?.json()?;
        let next = next_marker(&l.snapshots_links);
        let items = l
            .snapshots
            .into_iter()
            .filter(|s| {
                q.name.as_ref().is_none_or(|n| &s.name == n)
                    && q.volume_id.as_ref().is_none_or(|v| &s.volume_id == v)
                    && crate::common::has_all(&s.metadata, &q.metadata)
            })
            .collect();
        Ok(Page {
            items,
            next_marker: next,
        })
    }

    pub async fn delete_snapshot(&self, id: &str) -> Result<()> {
        self.session
            .send(self.req(
                Method::DELETE,
                format!("snapshots/{}", seg(id)),
                "snapshot_delete",
            ))
            .await?;
        Ok(())
    }

    /// All snapshots whose metadata has every pair of `metadata`.
    pub async fn snapshots_with_metadata(
        &self,
        metadata: &BTreeMap<String, String>,
    ) -> Result<Vec<Snapshot>> {
        all_pages(|marker| {
            let q = ListSnapshots {
                marker,
                metadata: metadata.clone(),
                ..Default::default()
            };
            async move { self.list_snapshots(&q).await }
        })
        .await
    }
}

#[derive(Deserialize)]
struct SnapshotEnvelope {
    snapshot: Snapshot,
}
