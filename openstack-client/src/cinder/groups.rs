//! Generic volume groups (`/groups`, 3.13+) and their snapshots
//! (`/group_snapshots`, 3.14+): a group snapshot snapshots every volume of
//! a group in one operation, each member a Cinder snapshot carrying the
//! group snapshot's id and name.

use std::collections::BTreeMap;

use http::Method;
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::*;

status_enum!(
    /// Cinder's group statuses.
    GroupStatus {
        Creating => "creating",
        Available => "available",
        Updating => "updating",
        InUse => "in-use",
        Deleting => "deleting",
        Deleted => "deleted",
        Error => "error",
        ErrorDeleting => "error_deleting",
    }
);

impl GroupStatus {
    pub fn is_error(&self) -> bool {
        self.as_str().starts_with("error")
    }
}

status_enum!(
    /// Cinder's group snapshot statuses.
    GroupSnapshotStatus {
        Creating => "creating",
        Available => "available",
        Deleting => "deleting",
        Deleted => "deleted",
        Error => "error",
        ErrorDeleting => "error_deleting",
    }
);

impl GroupSnapshotStatus {
    pub fn is_error(&self) -> bool {
        self.as_str().starts_with("error")
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct GroupType {
    pub id: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub name: String,
    #[serde(default)]
    pub is_public: bool,
    #[serde(default, deserialize_with = "string_map")]
    pub group_specs: BTreeMap<String, String>,
}

impl GroupType {
    /// Whether the backend snapshots the group's volumes at one instant
    /// (`consistent_group_snapshot_enabled="<is> True"`).
    pub fn consistent(&self) -> bool {
        self.group_specs
            .get("consistent_group_snapshot_enabled")
            .is_some_and(|v| v.to_ascii_lowercase().contains("true"))
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Group {
    pub id: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub name: String,
    pub status: GroupStatus,
    /// Group type id.
    #[serde(default, deserialize_with = "null_as_default")]
    pub group_type: String,
    /// Volume type ids.
    #[serde(default, deserialize_with = "null_as_default")]
    pub volume_types: Vec<String>,
    #[serde(default)]
    pub availability_zone: Option<String>,
    #[serde(default)]
    pub description: Option<String>,
    /// Member volume ids (listed from 3.25 with `list_volume=True`).
    #[serde(default, deserialize_with = "null_as_default")]
    pub volumes: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct GroupSnapshot {
    pub id: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub name: String,
    pub status: GroupSnapshotStatus,
    pub group_id: String,
    #[serde(default)]
    pub created_at: Option<String>,
    #[serde(default)]
    pub description: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CreateGroup {
    pub name: String,
    pub description: Option<String>,
    /// Group type, name or id.
    pub group_type: String,
    /// Volume types (names or ids) the group's volumes may have.
    pub volume_types: Vec<String>,
    pub availability_zone: Option<String>,
}

#[derive(Deserialize)]
struct GroupEnvelope {
    group: Group,
}

#[derive(Deserialize)]
struct GroupSnapshotEnvelope {
    group_snapshot: GroupSnapshot,
}

#[derive(Deserialize)]
struct Created {
    id: String,
}

impl BlockStorage {
    fn groups_mv(&self, req: ApiRequest) -> ApiRequest {
        self.mv(req, MV_GROUPS)
    }

    pub async fn list_group_types(&self) -> Result<Vec<GroupType>> {
        #[derive(Deserialize)]
        struct L {
            group_types: Vec<GroupType>,
        }
        let l: L = self
            .session
            .send(self.groups_mv(self.req(Method::GET, "group_types", "group_type_list")))
            .await?
            .json()?;
        Ok(l.group_types)
    }

    /// Admin only.
    pub async fn create_group_type(
        &self,
        name: &str,
        group_specs: &BTreeMap<String, String>,
    ) -> Result<GroupType> {
        #[derive(Deserialize)]
        struct E {
            group_type: GroupType,
        }
        let body = json!({ "group_type": {
            "name": name, "is_public": true, "group_specs": group_specs
        }});
        let e: E = self
            .session
            .send(
                self.groups_mv(self.req(Method::POST, "group_types", "group_type_create"))
                    .json(body),
            )
            .await?
            .json()?;
        Ok(e.group_type)
    }

    /// Asks for a group; it is `creating`, then `available`.
    pub async fn create_group(&self, spec: &CreateGroup) -> Result<Group> {
        let mut g = Map::new();
        g.insert("name".into(), json!(spec.name));
        g.insert("group_type".into(), json!(spec.group_type));
        g.insert("volume_types".into(), json!(spec.volume_types));
        opt(&mut g, "description", &spec.description);
        opt(&mut g, "availability_zone", &spec.availability_zone);
        #[derive(Deserialize)]
        struct E {
            group: Created,
        }
        let e: E = self
            .session
            .send(
                self.groups_mv(self.req(Method::POST, "groups", "group_create"))
                    .json(json!({ "group": Value::Object(g) })),
            )
            .await?
            .json()?;
        self.get_group(&e.group.id).await
    }

    /// The group with its member volumes.
    pub async fn get_group(&self, id: &str) -> Result<Group> {
        let req = self
            .groups_mv(self.req(Method::GET, format!("groups/{}", seg(id)), "group_get"))
            .query("list_volume", "True");
        Ok(self.session.send(req).await?.json::<GroupEnvelope>()?.group)
    }

    /// Groups of this name, with their member volumes.
    pub async fn groups_named(&self, name: &str) -> Result<Vec<Group>> {
        #[derive(Deserialize)]
        struct L {
            groups: Vec<Group>,
        }
        let req = self
            .groups_mv(self.req(Method::GET, "groups/detail", "group_list"))
            .query("name", name)
            .query("list_volume", "True");
        let l: L = self.session.send(req).await?.json()?;
        Ok(l.groups.into_iter().filter(|g| g.name == name).collect())
    }

    /// Adds and removes member volumes; the group is `updating`, then
    /// `available`.
    pub async fn update_group_volumes(
        &self,
        id: &str,
        add: &[String],
        remove: &[String],
    ) -> Result<()> {
        let mut g = Map::new();
        if !add.is_empty() {
            g.insert("add_volumes".into(), json!(add.join(",")));
        }
        if !remove.is_empty() {
            g.insert("remove_volumes".into(), json!(remove.join(",")));
        }
        self.session
            .send(
                self.groups_mv(self.req(
                    Method::PUT,
                    format!("groups/{}", seg(id)),
                    "group_update",
                ))
                .json(json!({ "group": Value::Object(g) })),
            )
            .await?;
        Ok(())
    }

    /// Deletes an empty group (its volumes are kept: `delete-volumes`
    /// false).
    pub async fn delete_group(&self, id: &str) -> Result<()> {
        self.session
            .send(
                self.groups_mv(self.req(
                    Method::POST,
                    format!("groups/{}/action", seg(id)),
                    "group_delete",
                ))
                .json(json!({ "delete": { "delete-volumes": false } })),
            )
            .await?;
        Ok(())
    }

    /// Snapshots every volume of the group; the group snapshot is
    /// `creating`, then `available`.
    pub async fn create_group_snapshot(
        &self,
        group_id: &str,
        name: &str,
        description: Option<&str>,
    ) -> Result<GroupSnapshot> {
        #[derive(Deserialize)]
        struct E {
            group_snapshot: Created,
        }
        let e: E = self
            .session
            .send(
                self.mv(
                    self.req(Method::POST, "group_snapshots", "group_snapshot_create"),
                    MV_GROUP_SNAPSHOTS,
                )
                .json(json!({ "group_snapshot": {
                    "group_id": group_id, "name": name, "description": description
                }})),
            )
            .await?
            .json()?;
        self.get_group_snapshot(&e.group_snapshot.id).await
    }

    pub async fn get_group_snapshot(&self, id: &str) -> Result<GroupSnapshot> {
        let resp = self
            .session
            .send(self.mv(
                self.req(
                    Method::GET,
                    format!("group_snapshots/{}", seg(id)),
                    "group_snapshot_get",
                ),
                MV_GROUP_SNAPSHOTS,
            ))
            .await?;
        Ok(resp.json::<GroupSnapshotEnvelope>()?.group_snapshot)
    }

    pub async fn group_snapshots_named(&self, name: &str) -> Result<Vec<GroupSnapshot>> {
        #[derive(Deserialize)]
        struct L {
            group_snapshots: Vec<GroupSnapshot>,
        }
        let req = self
            .mv(
                self.req(Method::GET, "group_snapshots/detail", "group_snapshot_list"),
                MV_GROUP_SNAPSHOTS,
            )
            .query("name", name);
        let l: L = self.session.send(req).await?.json()?;
        Ok(l.group_snapshots
            .into_iter()
            .filter(|g| g.name == name)
            .collect())
    }

    /// Deletes the group snapshot and its member snapshots.
    pub async fn delete_group_snapshot(&self, id: &str) -> Result<()> {
        self.session
            .send(self.mv(
                self.req(
                    Method::DELETE,
                    format!("group_snapshots/{}", seg(id)),
                    "group_snapshot_delete",
                ),
                MV_GROUP_SNAPSHOTS,
            ))
            .await?;
        Ok(())
    }

    /// The member snapshots of a group snapshot (they carry its name).
    pub async fn group_snapshot_members(&self, gs: &GroupSnapshot) -> Result<Vec<Snapshot>> {
        let mut members = Vec::new();
        let mut marker = None;
        loop {
            let page = self
                .list_snapshots(&ListSnapshots {
                    name: Some(gs.name.clone()),
                    marker: marker.take(),
                    ..Default::default()
                })
                .await?;
            members.extend(
                page.items
                    .into_iter()
                    .filter(|s| s.group_snapshot_id.as_deref() == Some(gs.id.as_str())),
            );
            match page.next_marker {
                Some(m) => marker = Some(m),
                None => return Ok(members),
            }
        }
    }
}
