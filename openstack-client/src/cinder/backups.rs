//! Backups (`/backups`): of a volume or of one of its snapshots, restored
//! into new volumes with `backup_id` on volume create.

use std::collections::BTreeMap;

use reqwest::Method;
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::*;

status_enum!(
    /// Cinder's backup statuses.
    BackupStatus {
        Creating => "creating",
        Available => "available",
        Deleting => "deleting",
        Error => "error",
        Restoring => "restoring",
        ErrorDeleting => "error_deleting",
    }
);

impl BackupStatus {
    pub fn is_error(&self) -> bool {
        self.as_str().starts_with("error")
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Backup {
    pub id: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub name: String,
    pub status: BackupStatus,
    /// GiB of the volume backed up.
    pub size: u64,
    pub volume_id: String,
    #[serde(default)]
    pub snapshot_id: Option<String>,
    #[serde(default)]
    pub created_at: Option<String>,
    #[serde(default)]
    pub availability_zone: Option<String>,
    #[serde(default)]
    pub fail_reason: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CreateBackup {
    pub volume_id: String,
    pub name: String,
    pub description: Option<String>,
    /// Back up from this snapshot of the volume.
    pub snapshot_id: Option<String>,
    /// Back up an attached volume.
    pub force: bool,
    pub availability_zone: Option<String>,
    pub metadata: BTreeMap<String, String>,
}

impl BlockStorage {
    pub async fn create_backup(&self, spec: &CreateBackup) -> Result<Backup> {
        let mut b = Map::new();
        b.insert("volume_id".into(), json!(spec.volume_id));
        b.insert("name".into(), json!(spec.name));
        b.insert("force".into(), json!(spec.force));
        b.insert("incremental".into(), json!(false));
        opt(&mut b, "description", &spec.description);
        opt(&mut b, "snapshot_id", &spec.snapshot_id);
        opt(&mut b, "availability_zone", &spec.availability_zone);
        if !spec.metadata.is_empty() {
            b.insert("metadata".into(), json!(spec.metadata));
        }
        #[derive(Deserialize)]
        struct Created {
            id: String,
        }
        #[derive(Deserialize)]
        struct E {
            backup: Created,
        }
        // the answer carries only the id (and name): read the rest
        let created = self
            .session
            .send(
                self.mv(
                    self.req(Method::POST, "backups", "backup_create")
                        .json(json!({ "backup": Value::Object(b) })),
                    MV_BACKUP_AZ,
                ),
            )
            .await?
            .json::<E>()?
            .backup;
        self.get_backup(&created.id).await
    }

    pub async fn get_backup(&self, id: &str) -> Result<Backup> {
        #[derive(Deserialize)]
        struct E {
            backup: Backup,
        }
        let resp = self
            .session
            .send(self.req(Method::GET, format!("backups/{}", seg(id)), "backup_get"))
            .await?;
        Ok(resp.json::<E>()?.backup)
    }

    /// Backups of this name (and of this volume, when given).
    pub async fn backups_named(&self, name: &str, volume_id: Option<&str>) -> Result<Vec<Backup>> {
        #[derive(Deserialize)]
        struct L {
            backups: Vec<Backup>,
        }
        let mut req = self
            .req(Method::GET, "backups/detail", "backup_list")
            .query("name", name);
        if let Some(v) = volume_id {
            req = req.query("volume_id", v);
        }
        let l: L = self.session.send(req).await?.json()?;
        Ok(l.backups
            .into_iter()
            .filter(|b| b.name == name && volume_id.is_none_or(|v| b.volume_id == v))
            .collect())
    }

    pub async fn delete_backup(&self, id: &str) -> Result<()> {
        self.session
            .send(self.req(
                Method::DELETE,
                format!("backups/{}", seg(id)),
                "backup_delete",
            ))
            .await?;
        Ok(())
    }
}
