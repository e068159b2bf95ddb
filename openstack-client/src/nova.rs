//! Nova: servers and their volume attachments.

use std::time::Instant;

use http::Method;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::cinder::seg;
use crate::common::{NOVA_API_VERSION, OPENSTACK_API_VERSION};
use crate::error::Result;
use crate::service::ServiceType;
use crate::session::{ApiRequest, Session};

/// Attaching a multiattach volume needs this microversion.
pub const MV_MULTIATTACH: &str = "2.60";
/// `networks: "none"` on server create needs this microversion.
pub const MV_NETWORKS_NONE: &str = "2.37";
/// A server's flavor with its disks embedded needs this microversion.
pub const MV_FLAVOR_DETAILS: &str = "2.47";
/// The actions of a deleted server are listed from this microversion on.
pub const MV_DELETED_INSTANCE_ACTIONS: &str = "2.21";

/// One entry of a server's `os-instance-actions`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct InstanceAction {
    /// `create`, `delete`, `attach_volume`, `stop`, ...
    pub action: String,
    #[serde(default)]
    pub request_id: Option<String>,
    #[serde(default)]
    pub start_time: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Server {
    pub id: String,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub status: String,
    #[serde(default, rename = "OS-EXT-AZ:availability_zone")]
    pub availability_zone: Option<String>,
    #[serde(default, rename = "OS-EXT-STS:task_state")]
    pub task_state: Option<String>,
    /// Booted from an image: its root disk is local, not a volume (Nova
    /// answers `""` for a server booted from a volume).
    #[serde(default, rename = "image", deserialize_with = "booted_from_image")]
    pub booted_from_image: bool,
    /// The flavor, with its local disks when Nova embeds them (2.47+).
    #[serde(default)]
    pub flavor: ServerFlavor,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct ServerFlavor {
    /// GiB of ephemeral disk (0: none).
    #[serde(default)]
    pub ephemeral: u64,
    /// MiB of swap disk (0: none).
    #[serde(default)]
    pub swap: u64,
}

impl Server {
    /// The disks the server has that are not volumes: a local root, an
    /// ephemeral disk, a swap disk. Nova's per-server disk limit counts
    /// them with the volumes.
    pub fn local_disks(&self) -> u32 {
        u32::from(self.booted_from_image)
            + u32::from(self.flavor.ephemeral > 0)
            + u32::from(self.flavor.swap > 0)
    }
}

fn booted_from_image<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> std::result::Result<bool, D::Error> {
    Ok(match serde_json::Value::deserialize(d)? {
        serde_json::Value::Object(m) => !m.is_empty(),
        serde_json::Value::String(s) => !s.is_empty(),
        _ => false,
    })
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ServerVolumeAttachment {
    #[serde(default)]
    pub id: Option<String>,
    #[serde(rename = "volumeId")]
    pub volume_id: String,
    #[serde(rename = "serverId", default)]
    pub server_id: Option<String>,
    #[serde(default)]
    pub device: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Flavor {
    pub id: String,
    pub name: String,
}

/// A server booted from an existing bootable volume, with no network.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CreateServer {
    pub name: String,
    pub flavor_ref: String,
    pub boot_volume_id: String,
    pub availability_zone: Option<String>,
}

/// The Nova v2.1 API. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Compute {
    session: Session,
    deadline: Option<Instant>,
}

impl Compute {
    pub fn new(session: Session) -> Self {
        Self {
            session,
            deadline: None,
        }
    }

    pub fn with_deadline(&self, deadline: Instant) -> Self {
        Self {
            deadline: Some(deadline),
            ..self.clone()
        }
    }

    fn req(
        &self,
        method: Method,
        path: impl Into<String>,
        op: &'static str,
        mv: Option<&str>,
    ) -> ApiRequest {
        let mut r = ApiRequest::new(ServiceType::Compute, method, path, op).deadline(self.deadline);
        if let Some(v) = mv {
            r = r
                .header(NOVA_API_VERSION.clone(), v)
                .header(OPENSTACK_API_VERSION.clone(), &format!("compute {v}"));
        }
        r
    }

    pub async fn get_server(&self, id: &str) -> Result<Server> {
        #[derive(Deserialize)]
        struct E {
            server: Server,
        }
        Ok(self
            .session
            .send(self.req(
                Method::GET,
                format!("servers/{}", seg(id)),
                "server_get",
                Some(MV_FLAVOR_DETAILS),
            ))
            .await?
            .json::<E>()?
            .server)
    }

    /// What was done to the server, newest first; a deleted server's too,
    /// for its own project (until Nova's database is archived). Another
    /// project's server answers not found, as one that never existed.
    pub async fn list_instance_actions(&self, server_id: &str) -> Result<Vec<InstanceAction>> {
        #[derive(Deserialize)]
        struct L {
            #[serde(rename = "instanceActions")]
            instance_actions: Vec<InstanceAction>,
        }
        let r = self
            .session
            .send(self.req(
                Method::GET,
                format!("servers/{}/os-instance-actions", seg(server_id)),
                "instance_action_list",
                Some(MV_DELETED_INSTANCE_ACTIONS),
            ))
            .await?;
        Ok(r.json::<L>()?.instance_actions)
    }

    pub async fn list_volume_attachments(
        &self,
        server_id: &str,
    ) -> Result<Vec<ServerVolumeAttachment>> {
        #[derive(Deserialize)]
        struct L {
            #[serde(rename = "volumeAttachments")]
            volume_attachments: Vec<ServerVolumeAttachment>,
        }
        let r = self
            .session
            .send(self.req(
                Method::GET,
                format!("servers/{}/os-volume_attachments", seg(server_id)),
                "volume_attachment_list",
                None,
            ))
            .await?;
        Ok(r.json::<L>()?.volume_attachments)
    }

    /// Asks Nova to attach; the attachment completes asynchronously.
    pub async fn attach_volume(
        &self,
        server_id: &str,
        volume_id: &str,
        multiattach: bool,
    ) -> Result<ServerVolumeAttachment> {
        #[derive(Deserialize)]
        struct E {
            #[serde(rename = "volumeAttachment")]
            volume_attachment: ServerVolumeAttachment,
        }
        let req = self
            .req(
                Method::POST,
                format!("servers/{}/os-volume_attachments", seg(server_id)),
                "volume_attach",
                multiattach.then_some(MV_MULTIATTACH),
            )
            .json(json!({ "volumeAttachment": { "volumeId": volume_id } }));
        Ok(self.session.send(req).await?.json::<E>()?.volume_attachment)
    }

    /// Asks Nova to detach; completes asynchronously.
    pub async fn detach_volume(&self, server_id: &str, volume_id: &str) -> Result<()> {
        self.session
            .send(
                self.req(
                    Method::DELETE,
                    format!(
                        "servers/{}/os-volume_attachments/{}",
                        seg(server_id),
                        seg(volume_id)
                    ),
                    "volume_detach",
                    None,
                )
                // a second copy, sent while the first may still be on its
                // way, could land after a newer attach: the caller decides
                .single_flight(),
            )
            .await?;
        Ok(())
    }

    /// Shuts the server off (`os-stop`); completes asynchronously
    /// (`SHUTOFF`).
    pub async fn stop_server(&self, id: &str) -> Result<()> {
        self.server_action(id, json!({ "os-stop": null }), "server_stop")
            .await
    }

    /// Starts a shut-off server (`os-start`); completes asynchronously.
    pub async fn start_server(&self, id: &str) -> Result<()> {
        self.server_action(id, json!({ "os-start": null }), "server_start")
            .await
    }

    async fn server_action(&self, id: &str, body: Value, op: &'static str) -> Result<()> {
        self.session
            .send(
                self.req(
                    Method::POST,
                    format!("servers/{}/action", seg(id)),
                    op,
                    None,
                )
                .json(body),
            )
            .await?;
        Ok(())
    }

    pub async fn create_server(&self, spec: &CreateServer) -> Result<Server> {
        let mut server = json!({
            "name": spec.name,
            "flavorRef": spec.flavor_ref,
            "networks": "none",
            "block_device_mapping_v2": [{
                "boot_index": 0,
                "uuid": spec.boot_volume_id,
                "source_type": "volume",
                "destination_type": "volume",
                "delete_on_termination": false
            }]
        });
        if let Some(az) = &spec.availability_zone {
            server["availability_zone"] = json!(az);
        }
        #[derive(Deserialize)]
        struct Created {
            id: String,
        }
        #[derive(Deserialize)]
        struct E {
            server: Created,
        }
        let r = self
            .session
            .send(
                self.req(
                    Method::POST,
                    "servers",
                    "server_create",
                    Some(MV_NETWORKS_NONE),
                )
                .json(json!({ "server": server })),
            )
            .await?;
        let id = r.json::<E>()?.server.id;
        self.get_server(&id).await
    }

    pub async fn delete_server(&self, id: &str) -> Result<()> {
        self.session
            .send(self.req(
                Method::DELETE,
                format!("servers/{}", seg(id)),
                "server_delete",
                None,
            ))
            .await?;
        Ok(())
    }

    pub async fn list_flavors(&self) -> Result<Vec<Flavor>> {
        #[derive(Deserialize)]
        struct L {
            flavors: Vec<Flavor>,
        }
        Ok(self
            .session
            .send(self.req(Method::GET, "flavors", "flavor_list", None))
            .await?
            .json::<L>()?
            .flavors)
    }
}
