//! Share snapshots: made of a share, listed by name or share, read and
//! deleted.

use super::*;

status_enum!(
    /// Share snapshot statuses.
    ShareSnapshotStatus {
        Creating => "creating",
        Available => "available",
        Error => "error",
        Deleting => "deleting",
        ErrorDeleting => "error_deleting",
    }
);

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ShareSnapshot {
    pub id: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub name: String,
    pub share_id: String,
    pub status: ShareSnapshotStatus,
    pub size: u64,
    #[serde(default)]
    pub created_at: Option<String>,
    #[serde(default)]
    pub description: Option<String>,
    /// Manila's clock when it answered with this snapshot (its `Date`),
    /// as for [`Share::read_at`]. None from a list.
    #[serde(skip)]
    pub read_at: Option<std::time::SystemTime>,
}

#[derive(Deserialize)]
struct SnapshotEnvelope {
    snapshot: ShareSnapshot,
}

impl SharedFileSystems {
    /// Every snapshot of the project, following pagination.
    pub async fn all_snapshots(&self) -> Result<Vec<ShareSnapshot>> {
        const PAGE: u32 = 500;
        let mut out = Vec::new();
        loop {
            let page = self
                .list_snapshots(&ListPage {
                    limit: Some(PAGE),
                    offset: out.len() as u64,
                    ..Default::default()
                })
                .await?;
            let last = page.len() < PAGE as usize;
            out.extend(page);
            if last {
                return Ok(out);
            }
        }
    }

    pub async fn create_snapshot(
        &self,
        share_id: &str,
        name: &str,
        description: Option<&str>,
    ) -> Result<ShareSnapshot> {
        let mut s = json!({ "share_id": share_id, "name": name, "force": false });
        if let Some(d) = description {
            s["description"] = json!(d);
        }
        let req = self
            .req(Method::POST, "snapshots", "share_snapshot_create")
            .await?
            .json(json!({ "snapshot": s }));
        Ok(self
            .session
            .send(req)
            .await?
            .json::<SnapshotEnvelope>()?
            .snapshot)
    }

    pub async fn get_snapshot(&self, id: &str) -> Result<ShareSnapshot> {
        let req = self
            .req(
                Method::GET,
                format!("snapshots/{}", seg(id)),
                "share_snapshot_get",
            )
            .await?;
        let resp = self.session.send(req).await?;
        let mut snapshot = resp.json::<SnapshotEnvelope>()?.snapshot;
        snapshot.read_at = resp.date;
        Ok(snapshot)
    }

    pub async fn list_snapshots_named(&self, name: &str) -> Result<Vec<ShareSnapshot>> {
        #[derive(Deserialize)]
        struct L {
            snapshots: Vec<ShareSnapshot>,
        }
        let req = self
            .req(Method::GET, "snapshots/detail", "share_snapshot_list")
            .await?
            .query("name", name);
        let l: L = self.session.send(req).await?.json()?;
        Ok(l.snapshots.into_iter().filter(|s| s.name == name).collect())
    }

    /// One page of the project's snapshots (of one share when asked),
    /// oldest first.
    pub async fn list_snapshots(&self, q: &ListPage) -> Result<Vec<ShareSnapshot>> {
        #[derive(Deserialize)]
        struct L {
            snapshots: Vec<ShareSnapshot>,
        }
        let req = q.query(
            self.req(Method::GET, "snapshots/detail", "share_snapshot_list")
                .await?,
        );
        Ok(self.session.send(req).await?.json::<L>()?.snapshots)
    }

    pub async fn delete_snapshot(&self, id: &str) -> Result<()> {
        let req = self
            .req(
                Method::DELETE,
                format!("snapshots/{}", seg(id)),
                "share_snapshot_delete",
            )
            .await?;
        self.session.send(req).await?;
        Ok(())
    }
}
