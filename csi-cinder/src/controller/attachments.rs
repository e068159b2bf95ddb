//! Attachments through Nova: publish and unpublish, each bounded by the
//! caller's deadline.

use std::collections::HashMap;
use std::time::Instant;

use csi_common::request::{is_uuid, require};
use csi_common::waits::wait_until;
use csi_common::{Context, DriverError, DriverResult};
use openstack_client::cinder::{BlockStorage, Volume, VolumeStatus};
use openstack_client::common::Poll;
use proto::csi::v1 as csi;

use super::*;
use crate::capabilities::{capability_unsupported, parse_capability};
use crate::errors::attach_error;

impl ControllerService {
    pub(super) async fn publish(
        &self,
        r: csi::ControllerPublishVolumeRequest,
        deadline: Instant,
    ) -> DriverResult<csi::ControllerPublishVolumeResponse> {
        let id = require(&r.volume_id, "volume_id")?;
        let node = require(&r.node_id, "node_id")?;
        let cap = r
            .volume_capability
            .as_ref()
            .ok_or_else(|| DriverError::InvalidArgument("volume_capability is required".into()))
            .and_then(parse_capability)?;
        let cloud = self.cloud(&r.secrets)?;
        if !is_uuid(id) {
            return Err(DriverError::NotFound(format!("volume {id} does not exist")));
        }
        if !is_uuid(node) {
            return Err(DriverError::NotFound(format!(
                "node {node} does not exist (node ids are Nova server UUIDs)"
            )));
        }
        let _guard = self.locks.lock(id, deadline).await?;
        let block = cloud.block.with_deadline(deadline);
        let compute = cloud.compute.with_deadline(deadline);
        // the server's listing for its attach limit beside the volume's
        // read (one round trip less at a busy API; none if a listing of
        // the server is recent or under way)
        let (v, ()) = tokio::join!(
            block.get_volume(id),
            self.slots.prefetch(&compute, node, id)
        );
        let v = v.context(format!("volume {id}"))?;
        let v = self.repair_before_attach(&block, &compute, v, node).await?;
        if let Some(why) = capability_unsupported(&cap, v.multiattach) {
            return Err(DriverError::InvalidArgument(why));
        }
        let attached_here = v
            .attachments
            .iter()
            .any(|a| a.server_id.as_deref() == Some(node));
        if attached_here {
            self.not_being_detached(&block, &v, node).await?;
        } else {
            // a detach that got no answer has landed (or never will)
            self.unanswered.settle_on_volume(&block, &v, node).await;
        }
        if !attached_here {
            let others: Vec<&str> = v.attached_servers().filter(|s| *s != node).collect();
            if !others.is_empty() && !v.multiattach {
                return Err(DriverError::FailedPrecondition(format!(
                    "volume {id} is attached to {others:?} and its type does not allow multi-attach"
                )));
            }
            // a slot of the server's attach limit, taken before the
            // attach is asked for (see [`super::slots`])
            let slot = self
                .slots
                .take(&compute, node, id, self.opts.attach_limit)
                .await?;
            match v.status {
                VolumeStatus::Available | VolumeStatus::InUse => {
                    match compute.attach_volume(node, id, v.multiattach).await {
                        Ok(a) => {
                            slot.requested();
                            tracing::info!(volume_id = id, node, device = ?a.device, "attach requested")
                        }
                        // attaching already (a retry of an earlier call)
                        Err(openstack_client::Error::Conflict(e)) => {
                            slot.requested();
                            tracing::info!(volume_id = id, node, error = %e, "attach in progress")
                        }
                        Err(e) => {
                            // an attach that got no answer may have been done
                            if e.outcome_unknown() {
                                slot.requested();
                            }
                            return Err(attach_error(e, id, node));
                        }
                    }
                }
                // an earlier attempt's attach is still under way
                VolumeStatus::Attaching | VolumeStatus::Reserved => slot.requested(),
                ref s => {
                    return Err(DriverError::FailedPrecondition(format!(
                        "volume {id} is {s}; cannot attach"
                    )));
                }
            }
        }
        let device = self.wait_attached(&block, id, node, deadline).await?;
        let mut context = HashMap::new();
        if let Some(d) = device {
            context.insert("DevicePath".to_string(), d);
        }
        Ok(csi::ControllerPublishVolumeResponse {
            publish_context: context,
        })
    }

    /// An attachment to `node` is what a publish may answer OK on only if
    /// no detach is taking it away: one under way (Cinder's `detaching`),
    /// or one sent without an answer that may still land (see
    /// [`super::unanswered`]). Aborted (the CSI code for an operation
    /// pending on the volume): the caller asks again, and the volume is
    /// attached afresh once the detach is done.
    async fn not_being_detached(
        &self,
        block: &BlockStorage,
        v: &Volume,
        node: &str,
    ) -> DriverResult<()> {
        let id = v.id.as_str();
        if v.status == VolumeStatus::Detaching {
            self.unanswered.settle_on_volume(block, v, node).await;
            return Err(DriverError::Aborted(format!(
                "volume {id} is being detached from {node}: it is attached again once that is done"
            )));
        }
        let bound = self.opts.stuck_after;
        if let Some(age) = self.unanswered.pending_on(v, node, bound) {
            return Err(DriverError::Aborted(format!(
                "a detach of volume {id} from {node} got no answer {}s ago and may still land: the volume is not reported attached until it has shown, or until {}s (--stuck-attachment-secs) have passed",
                age.as_secs(),
                bound.as_secs()
            )));
        }
        Ok(())
    }

    /// Waits until Cinder shows the volume in use by `node`; returns the
    /// device name Nova chose (a hint only: the node finds the device by id).
    pub(super) async fn wait_attached(
        &self,
        block: &BlockStorage,
        id: &str,
        node: &str,
        deadline: Instant,
    ) -> DriverResult<Option<String>> {
        let _pending = self.metrics.waiting("attach");
        let r = wait_until(
            "volume_attach",
            deadline,
            |s| format!("volume {id} is not attached to {node} yet (volume is {s})"),
            || async {
                let v = block.get_volume(id).await?;
                let att = v
                    .attachments
                    .iter()
                    .find(|a| a.server_id.as_deref() == Some(node));
                Ok(match (&v.status, att) {
                    (VolumeStatus::InUse, Some(a)) => Poll::Ready(Ok(a.device.clone())),
                    (s, _) if s.is_error() => Poll::Ready(Err(s.to_string())),
                    // Nova rolled the attach back
                    (VolumeStatus::Available, None) => {
                        Poll::Ready(Err("available (the attach failed)".to_string()))
                    }
                    (s, _) => Poll::Pending(s.to_string()),
                })
            },
        )
        .await?;
        r.map_err(|s| {
            DriverError::Internal(format!(
                "attaching volume {id} to {node} failed: volume is {s}"
            ))
        })
    }

    pub(super) async fn unpublish(
        &self,
        r: csi::ControllerUnpublishVolumeRequest,
        deadline: Instant,
    ) -> DriverResult<csi::ControllerUnpublishVolumeResponse> {
        let id = require(&r.volume_id, "volume_id")?;
        let node = require(&r.node_id, "node_id")?;
        let cloud = self.cloud(&r.secrets)?;
        if !is_uuid(id) || !is_uuid(node) {
            // nothing of that name can be attached
            return Ok(csi::ControllerUnpublishVolumeResponse {});
        }
        let _guard = self.locks.lock(id, deadline).await?;
        let block = cloud.block.with_deadline(deadline);
        let compute = cloud.compute.with_deadline(deadline);
        let v = match block.get_volume(id).await {
            Ok(v) => v,
            Err(e) if e.is_not_found() => return Ok(csi::ControllerUnpublishVolumeResponse {}),
            Err(e) => return Err(e).context(format!("volume {id}")),
        };
        let attached_here = v
            .attachments
            .iter()
            .any(|a| a.server_id.as_deref() == Some(node));
        if !attached_here {
            // a detach of unknown outcome has shown (or never will)
            self.unanswered.settle_on_volume(&block, &v, node).await;
        }
        let done = self
            .repair_before_detach(&block, &compute, &v, node, attached_here)
            .await?;
        if done.is_some() {
            return Ok(csi::ControllerUnpublishVolumeResponse {});
        }
        // a detach the repair asked again reads in-use now: read afresh
        // (only a detaching volume can have been repaired; any other is as
        // read above, which saves a call per detach)
        let v = if v.status == VolumeStatus::Detaching {
            match block.get_volume(id).await {
                Ok(v) => v,
                Err(e) if e.is_not_found() => {
                    return Ok(csi::ControllerUnpublishVolumeResponse {});
                }
                Err(e) => return Err(e).context(format!("volume {id}")),
            }
        } else {
            v
        };
        let _pending = self.metrics.waiting("detach");
        // a detach of unknown outcome still on its way is waited for, not
        // sent again: two copies in flight, the second answered, the
        // first could land after a newer attach
        let on_its_way = self.unanswered.pending_on(&v, node, self.opts.stuck_after);
        if let Some(age) = on_its_way {
            tracing::info!(
                volume_id = id,
                node,
                sent_secs_ago = age.as_secs(),
                "a detach of unknown outcome is on its way: waiting for it to show"
            );
        }
        if v.status != VolumeStatus::Detaching && on_its_way.is_none() {
            match compute.detach_volume(node, id).await {
                Ok(()) => tracing::info!(volume_id = id, node, "detach requested"),
                // the attachment is gone meanwhile, or the server
                Err(e) if e.is_not_found() => {
                    tracing::info!(volume_id = id, node, "server or attachment gone in Nova");
                    self.release_what_nova_forgot(&block, &compute, id, node)
                        .await?;
                    return Ok(csi::ControllerUnpublishVolumeResponse {});
                }
                // a detach is already under way
                Err(openstack_client::Error::Conflict(e)) => {
                    tracing::info!(volume_id = id, node, error = %e, "detach in progress")
                }
                Err(e) => {
                    if e.outcome_unknown() {
                        tracing::warn!(volume_id = id, node, error = %e, "the detach's outcome is unknown: it may still land, and the volume is not reported attached to this node until it has");
                        self.unanswered.record_on_volume(&block, id, node).await;
                    }
                    return Err(e).context(format!("detaching volume {id} from {node}"));
                }
            }
        }
        wait_until(
            "volume_detach",
            deadline,
            |s| format!("volume {id} is still attached to {node} (volume is {s})"),
            || async {
                let v = match block.get_volume(id).await {
                    Ok(v) => v,
                    Err(e) if e.is_not_found() => return Ok(Poll::Ready(())),
                    Err(e) => return Err(e),
                };
                if v.attachments
                    .iter()
                    .any(|a| a.server_id.as_deref() == Some(node))
                {
                    Ok(Poll::Pending(v.status.to_string()))
                } else {
                    Ok(Poll::Ready(()))
                }
            },
        )
        .await?;
        self.unanswered.settle_on_volume(&block, &v, node).await;
        Ok(csi::ControllerUnpublishVolumeResponse {})
    }
}
