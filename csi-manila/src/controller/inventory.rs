//! What the controller answers about shares: ValidateVolumeCapabilities,
//! ListVolumes, ControllerGetVolume and GetCapacity.

use std::time::Instant;

use csi_common::paging::{offset_from_token, offset_token, page_limit};
use csi_common::request::{Capability, GIB, is_uuid, require};
use csi_common::{Context, DriverError, DriverResult};
use openstack_client::manila::{ListPage, Share, SharedFileSystems};
use proto::csi::v1 as csi;

use super::ControllerService;
use crate::capabilities::parse_capabilities;
use crate::shares::is_gone;

/// What ValidateVolumeCapabilities confirms: the request as it came.
fn confirmed(r: csi::ValidateVolumeCapabilitiesRequest) -> csi::ValidateVolumeCapabilitiesResponse {
    csi::ValidateVolumeCapabilitiesResponse {
        confirmed: Some(csi::validate_volume_capabilities_response::Confirmed {
            volume_context: r.volume_context,
            volume_capabilities: r.volume_capabilities,
            parameters: r.parameters,
            mutable_parameters: r.mutable_parameters,
        }),
        message: String::new(),
    }
}

impl ControllerService {
    pub(super) async fn validate(
        &self,
        r: csi::ValidateVolumeCapabilitiesRequest,
        deadline: Instant,
    ) -> DriverResult<csi::ValidateVolumeCapabilitiesResponse> {
        let id = require(&r.volume_id, "volume_id")?;
        if r.volume_capabilities.is_empty() {
            return Err(DriverError::InvalidArgument(
                "volume_capabilities are required".into(),
            ));
        }
        let manila = self.manila(&r.secrets)?.with_deadline(deadline);
        let refuse = |message: String| {
            Ok(csi::ValidateVolumeCapabilitiesResponse {
                confirmed: None,
                message,
            })
        };
        if let Some((snapshot, rule)) = super::backed::parse_handle(id) {
            self.backed_rule(&manila, snapshot, rule).await?;
            let caps = match parse_capabilities(&r.volume_capabilities) {
                Ok(c) => c,
                Err(DriverError::InvalidArgument(m)) => return refuse(m),
                Err(e) => return Err(e),
            };
            if let Some(c) = caps.iter().find(|c| !c.read_only_mode()) {
                return refuse(format!(
                    "volume {id} is backed by snapshot {snapshot}: read-only, not {:?}",
                    c.mode
                ));
            }
            return Ok(confirmed(r));
        }
        let share = self.our_share(&manila, id).await?;
        let caps: Vec<Capability> = match parse_capabilities(&r.volume_capabilities) {
            Ok(c) => c,
            Err(DriverError::InvalidArgument(m)) => return refuse(m),
            Err(e) => return Err(e),
        };
        let _ = caps;
        if let Some(t) = r.parameters.get("type")
            && share.share_type_name.as_deref() != Some(t.as_str())
            && share.share_type.as_deref() != Some(t.as_str())
        {
            return refuse(format!(
                "share {id} has type {:?}, not {t:?}",
                share.share_type_name
            ));
        }
        Ok(confirmed(r))
    }

    /// A share of this instance's protocol, else NotFound.
    pub(super) async fn our_share(
        &self,
        manila: &SharedFileSystems,
        id: &str,
    ) -> DriverResult<Share> {
        if !is_uuid(id) {
            return Err(DriverError::NotFound(format!("volume {id} does not exist")));
        }
        let s = manila.get_share(id).await.context(format!("share {id}"))?;
        if !s
            .share_proto
            .eq_ignore_ascii_case(self.opts.protocol.as_manila())
            || is_gone(&s.status)
        {
            return Err(DriverError::NotFound(format!(
                "volume {id} is not a {} share of this driver",
                self.opts.protocol
            )));
        }
        Ok(s)
    }

    pub(super) async fn list_volumes(
        &self,
        r: csi::ListVolumesRequest,
        deadline: Instant,
    ) -> DriverResult<csi::ListVolumesResponse> {
        let limit = page_limit(r.max_entries)?;
        let offset = offset_from_token(&r.starting_token)?;
        let manila = self.own_manila()?.with_deadline(deadline);
        let page = manila
            .list_shares(&ListPage {
                limit: Some(limit),
                offset,
                ..Default::default()
            })
            .await
            .context("listing shares")?;
        let next_token = if page.len() as u32 == limit {
            offset_token(offset + page.len() as u64)
        } else {
            String::new()
        };
        let entries = page
            .iter()
            .filter(|s| {
                s.share_proto
                    .eq_ignore_ascii_case(self.opts.protocol.as_manila())
            })
            .filter(|s| !is_gone(&s.status))
            .map(|s| csi::list_volumes_response::Entry {
                volume: Some(self.csi_volume(s)),
                status: Some(csi::list_volumes_response::VolumeStatus {
                    published_node_ids: Vec::new(),
                    volume_condition: Some(condition(s)),
                }),
            })
            .collect();
        Ok(csi::ListVolumesResponse {
            entries,
            next_token,
        })
    }

    pub(super) async fn get_volume(
        &self,
        r: csi::ControllerGetVolumeRequest,
        deadline: Instant,
    ) -> DriverResult<csi::ControllerGetVolumeResponse> {
        let id = require(&r.volume_id, "volume_id")?;
        let manila = self.own_manila()?.with_deadline(deadline);
        if let Some((snapshot, rule)) = super::backed::parse_handle(id) {
            return self.get_backed_volume(&manila, id, snapshot, rule).await;
        }
        let s = self.our_share(&manila, id).await?;
        let mut cond = condition(&s);
        if s.status.is_error()
            && let Ok(m) = manila.list_user_messages(id).await
            && let Some(m) = m.first()
        {
            cond.message = format!("{}: {}", cond.message, m.user_message);
        }
        Ok(csi::ControllerGetVolumeResponse {
            volume: Some(self.csi_volume(&s)),
            status: Some(csi::controller_get_volume_response::VolumeStatus {
                published_node_ids: Vec::new(),
                volume_condition: Some(cond),
            }),
        })
    }

    /// Free capacity: the pools' (when these credentials may read them)
    /// or the project's share-gigabytes quota left, whichever is smaller.
    pub(super) async fn capacity(
        &self,
        r: csi::GetCapacityRequest,
        deadline: Instant,
    ) -> DriverResult<csi::GetCapacityResponse> {
        if let Some(c) = &r.volume_capabilities.first() {
            crate::capabilities::parse_capability(c)?;
        }
        let manila = self.own_manila()?.with_deadline(deadline);
        let pools = match manila.list_pools().await {
            Ok(p) => Some(
                p.iter()
                    .filter(|p| {
                        p.capabilities.storage_protocol.as_deref().is_none_or(|sp| {
                            sp.to_ascii_uppercase()
                                .contains(self.opts.protocol.as_manila())
                        })
                    })
                    .filter_map(|p| p.capabilities.free_gib())
                    .map(|g| (g.max(0.0) * GIB as f64) as i64)
                    .sum::<i64>(),
            ),
            Err(openstack_client::Error::Forbidden(_)) => None,
            Err(e) => return Err(e).context("reading Manila's pools"),
        };
        let limits = manila
            .share_limits()
            .await
            .context("reading the share quota")?;
        let left = limits
            .max_gib
            .map(|max| (max.saturating_sub(limits.used_gib) as i64).saturating_mul(GIB));
        let available = match (pools, left) {
            (Some(p), Some(q)) => p.min(q),
            (Some(p), None) => p,
            (None, Some(q)) => q,
            (None, None) => {
                return Err(DriverError::FailedPrecondition(
                    "capacity unknown: these credentials may not read Manila's pools (admin only by default) and the project has no share quota".into(),
                ));
            }
        };
        Ok(csi::GetCapacityResponse {
            available_capacity: available,
            maximum_volume_size: None,
            minimum_volume_size: Some(GIB),
        })
    }
}

/// A share's health from its status.
fn condition(s: &Share) -> csi::VolumeCondition {
    if s.status.is_error() {
        csi::VolumeCondition {
            abnormal: true,
            message: format!("Manila reports share {} in status {}", s.id, s.status),
        }
    } else {
        csi::VolumeCondition {
            abnormal: false,
            message: format!("share is {}", s.status),
        }
    }
}
