//! Cinder's attachments (`/attachments`, 3.27+): the records behind a
//! volume's `reserved`, `attaching`, `in-use` and `detaching`, one per
//! server. Nova creates and completes them; a driver reads them to see
//! what a stuck volume is waiting for, and deletes one that no server
//! will ever finish or release.

use reqwest::Method;
use serde::Deserialize;
use serde_json::{Value, json};

use super::*;

/// Cinder's attachments API.
pub const MV_ATTACHMENTS: &str = "3.27";
/// Completing an attachment (`os-complete`).
pub const MV_ATTACHMENT_COMPLETE: &str = "3.44";

status_enum!(
    /// An attachment's `status` (Cinder's `attach_status`).
    AttachStatus {
        Reserved => "reserved",
        Attaching => "attaching",
        Attached => "attached",
        Detaching => "detaching",
        Detached => "detached",
        ErrorAttaching => "error_attaching",
        ErrorDetaching => "error_detaching",
    }
);

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Attachment {
    pub id: String,
    pub status: AttachStatus,
    /// The server (Nova instance) it is for.
    #[serde(default)]
    pub instance: Option<String>,
    pub volume_id: String,
}

#[derive(Deserialize)]
struct AttachmentsEnvelope {
    attachments: Vec<Attachment>,
}

#[derive(Deserialize)]
struct AttachmentEnvelope {
    attachment: Attachment,
}

impl BlockStorage {
    /// The attachments of a volume, whatever their status.
    pub async fn volume_attachments(&self, volume_id: &str) -> Result<Vec<Attachment>> {
        let req = self.mv(
            self.req(Method::GET, "attachments", "attachment_list")
                .query("volume_id", volume_id),
            MV_ATTACHMENTS,
        );
        Ok(self
            .session
            .send(req)
            .await?
            .json::<AttachmentsEnvelope>()?
            .attachments)
    }

    /// Reserves the volume for `instance` (what Nova's API does before it
    /// asks its compute host to attach); with a `connector`, the
    /// attachment is `attaching` instead of `reserved`.
    pub async fn create_attachment(
        &self,
        volume_id: &str,
        instance: &str,
        connector: Option<Value>,
    ) -> Result<Attachment> {
        let mut body =
            json!({ "attachment": { "volume_uuid": volume_id, "instance_uuid": instance } });
        if let Some(c) = connector {
            body["attachment"]["connector"] = c;
        }
        let req = self.mv(
            self.req(Method::POST, "attachments", "attachment_create")
                .json(body),
            MV_ATTACHMENTS,
        );
        Ok(self
            .session
            .send(req)
            .await?
            .json::<AttachmentEnvelope>()?
            .attachment)
    }

    /// Marks the attachment attached (what a compute host does once the
    /// guest has the disk): the volume reads `in-use`.
    pub async fn complete_attachment(&self, id: &str) -> Result<()> {
        let req = self.mv(
            self.req(
                Method::POST,
                format!("attachments/{}/action", seg(id)),
                "attachment_complete",
            )
            .json(json!({ "os-complete": null })),
            MV_ATTACHMENT_COMPLETE,
        );
        self.session.send(req).await?;
        Ok(())
    }

    /// Deletes the attachment: the volume reads `available` once it has
    /// none left.
    pub async fn delete_attachment(&self, id: &str) -> Result<()> {
        let req = self.mv(
            self.req(
                Method::DELETE,
                format!("attachments/{}", seg(id)),
                "attachment_delete",
            ),
            MV_ATTACHMENTS,
        );
        self.session.send(req).await?;
        Ok(())
    }

    /// `os-begin_detaching`: the volume reads `detaching` (what Nova's API
    /// does before its compute host detaches).
    pub async fn begin_detaching(&self, volume_id: &str) -> Result<()> {
        self.volume_action(
            volume_id,
            json!({ "os-begin_detaching": null }),
            "volume_begin_detaching",
        )
        .await
    }

    /// `os-roll_detaching`: a `detaching` volume back to `in-use`, so that
    /// a detach can be asked again.
    pub async fn roll_detaching(&self, volume_id: &str) -> Result<()> {
        self.volume_action(
            volume_id,
            json!({ "os-roll_detaching": null }),
            "volume_roll_detaching",
        )
        .await
    }

    async fn volume_action(&self, volume_id: &str, body: Value, op: &'static str) -> Result<()> {
        let req = self
            .req(
                Method::POST,
                format!("volumes/{}/action", seg(volume_id)),
                op,
            )
            .json(body);
        self.session.send(req).await?;
        Ok(())
    }
}
