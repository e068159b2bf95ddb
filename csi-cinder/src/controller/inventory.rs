//! What the controller answers about volumes: ValidateVolumeCapabilities,
//! ListVolumes and ControllerGetVolume.

use std::collections::HashMap;
use std::time::Instant;

use csi_common::paging::{marker_from_token, page_limit};
use csi_common::request::{is_uuid, require};
use csi_common::{Context, DriverError, DriverResult};
use openstack_client::cinder::{ListVolumes, Volume};
use proto::csi::v1 as csi;

use super::*;
use crate::capabilities::{capability_unsupported, parse_capabilities};
use crate::parameters::VolumeParameters;

impl ControllerService {
    pub(super) async fn validate(
        &self,
        r: csi::ValidateVolumeCapabilitiesRequest,
        deadline: Instant,
    ) -> DriverResult<csi::ValidateVolumeCapabilitiesResponse> {
        let id = require(&r.volume_id, "volume_id")?;
        let caps = parse_capabilities(&r.volume_capabilities)?;
        let cloud = self.cloud(&r.secrets)?;
        if !is_uuid(id) {
            return Err(DriverError::NotFound(format!("volume {id} does not exist")));
        }
        let v = cloud
            .block
            .with_deadline(deadline)
            .get_volume(id)
            .await
            .context(format!("volume {id}"))?;
        if volume_gone(&v.status) {
            return Err(DriverError::NotFound(format!(
                "volume {id} is being deleted"
            )));
        }
        let unconfirmed = |message: String| {
            Ok(csi::ValidateVolumeCapabilitiesResponse {
                confirmed: None,
                message,
            })
        };
        let params = match VolumeParameters::parse(&r.parameters, &r.mutable_parameters) {
            Ok(p) => p,
            Err(e) => return unconfirmed(e.to_string()),
        };
        if let Some(t) = &params.volume_type
            && v.volume_type.as_deref() != Some(t.as_str())
        {
            return unconfirmed(format!(
                "volume {id} has type {:?}, not {t:?}",
                v.volume_type
            ));
        }
        for c in &caps {
            if let Some(why) = capability_unsupported(c, v.multiattach) {
                return unconfirmed(why);
            }
        }
        Ok(csi::ValidateVolumeCapabilitiesResponse {
            confirmed: Some(csi::validate_volume_capabilities_response::Confirmed {
                volume_context: r.volume_context,
                volume_capabilities: r.volume_capabilities,
                parameters: r.parameters,
                mutable_parameters: r.mutable_parameters,
            }),
            message: String::new(),
        })
    }

    /// Tokens: a Cinder marker; with several clouds, `<marker>:<cloud>`
    /// (an empty marker starts that cloud).
    pub(super) async fn list_volumes(
        &self,
        r: csi::ListVolumesRequest,
        deadline: Instant,
    ) -> DriverResult<csi::ListVolumesResponse> {
        let mut limit = page_limit(r.max_entries)? as usize;
        let multi = self.clouds.len() > 1;
        // one cloud: a Cinder marker; several: `<marker>:<cloud>`, an
        // empty marker starting that cloud
        let (marker, cloud_name) = match (multi, r.starting_token.rsplit_once(':')) {
            (false, _) => (r.starting_token.as_str(), None),
            (true, Some((m, c))) => (m, Some(c)),
            (true, None) if r.starting_token.is_empty() => ("", None),
            (true, None) => {
                return Err(DriverError::Aborted(format!(
                    "starting_token {:?} is not one this driver issued",
                    r.starting_token
                )));
            }
        };
        let mut marker = marker_from_token(marker)?;
        let mut cloud_idx = match cloud_name {
            None => 0,
            Some(c) => self
                .clouds
                .iter()
                .position(|x| x.name == c)
                .ok_or_else(|| {
                    DriverError::Aborted(format!("starting_token names unknown cloud {c:?}"))
                })?,
        };
        let mut entries = Vec::new();
        let mut next_token = String::new();
        while cloud_idx < self.clouds.len() && limit > 0 {
            let cloud = &self.clouds[cloud_idx];
            let page = match cloud
                .block
                .with_deadline(deadline)
                .list_volumes(&ListVolumes {
                    name: None,
                    limit: Some(limit as u32),
                    marker: marker.clone(),
                    ..Default::default()
                })
                .await
            {
                Ok(p) => p,
                Err(openstack_client::Error::BadRequest(e))
                | Err(openstack_client::Error::NotFound(e))
                    if marker.is_some() =>
                {
                    return Err(DriverError::Aborted(format!(
                        "starting_token is no longer valid: {}",
                        e.message
                    )));
                }
                Err(e) => return Err(e).context("listing volumes"),
            };
            limit = limit.saturating_sub(page.items.len());
            // a volume being deleted is no longer the caller's
            for v in page.items.iter().filter(|v| !volume_gone(&v.status)) {
                entries.push(csi::list_volumes_response::Entry {
                    volume: Some(self.csi_volume(v, HashMap::new(), None)),
                    status: Some(csi::list_volumes_response::VolumeStatus {
                        published_node_ids: v.attached_servers().map(str::to_string).collect(),
                        volume_condition: Some(condition(v)),
                    }),
                });
            }
            match page.next_marker {
                Some(m) => {
                    next_token = if multi {
                        format!("{m}:{}", cloud.name)
                    } else {
                        m
                    };
                    break;
                }
                None => {
                    cloud_idx += 1;
                    marker = None;
                    if cloud_idx < self.clouds.len() {
                        next_token = format!(":{}", self.clouds[cloud_idx].name);
                    } else {
                        next_token.clear();
                    }
                }
            }
        }
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
        if !is_uuid(id) {
            return Err(DriverError::NotFound(format!("volume {id} does not exist")));
        }
        for cloud in &self.clouds {
            match cloud.block.with_deadline(deadline).get_volume(id).await {
                Ok(v) if volume_gone(&v.status) => break,
                Ok(v) => {
                    return Ok(csi::ControllerGetVolumeResponse {
                        volume: Some(self.csi_volume(&v, HashMap::new(), None)),
                        status: Some(csi::controller_get_volume_response::VolumeStatus {
                            published_node_ids: v.attached_servers().map(str::to_string).collect(),
                            volume_condition: Some(condition(&v)),
                        }),
                    });
                }
                Err(e) if e.is_not_found() => continue,
                Err(e) => return Err(e).context(format!("volume {id}")),
            }
        }
        Err(DriverError::NotFound(format!("volume {id} does not exist")))
    }
}

pub(super) fn condition(v: &Volume) -> csi::VolumeCondition {
    if v.status.is_error() {
        csi::VolumeCondition {
            abnormal: true,
            message: format!("Cinder reports volume {} in status {}", v.id, v.status),
        }
    } else {
        csi::VolumeCondition {
            abnormal: false,
            message: format!("volume is {}", v.status),
        }
    }
}
