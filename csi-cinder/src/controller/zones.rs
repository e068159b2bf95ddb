//! Which zone a new volume goes to: the one the request asks for, unless
//! the volume is made from a snapshot or a volume. Cinder restores and
//! clones only in the source's zone (`cloned_volume_same_az`, its
//! default); a restore asked for elsewhere lands in the source's zone when
//! the request allows it there (the answer's topology says so, and the
//! scheduler places the pod to match), and is refused otherwise, so that
//! no PV names a zone its volume is not in.

use csi_common::{Context, DriverError, DriverResult};
use openstack_client::cinder::BlockStorage;
use proto::csi::v1 as csi;

use super::ControllerService;
use super::volumes::Source;
use crate::TOPOLOGY_KEY;

/// The zones a request's topology names, in the order given.
fn zones_in(topologies: &[csi::Topology]) -> Vec<&str> {
    topologies
        .iter()
        .filter_map(|t| t.segments.get(TOPOLOGY_KEY).map(String::as_str))
        .collect()
}

impl ControllerService {
    /// The zone the request asks for: the StorageClass's `availability`,
    /// else (with topology) the first preferred zone, else the first
    /// requisite one.
    pub(super) fn requested_zone(
        &self,
        r: &csi::CreateVolumeRequest,
        availability: Option<&str>,
    ) -> Option<String> {
        if let Some(a) = availability {
            return Some(a.to_string());
        }
        if !self.opts.with_topology {
            return None;
        }
        let req = r.accessibility_requirements.as_ref()?;
        zones_in(&req.preferred)
            .into_iter()
            .chain(zones_in(&req.requisite))
            .next()
            .map(str::to_string)
    }

    /// The zone to create a volume made from `source` in (see the module's
    /// comment). With `ignore-volume-az` the cluster's zones are not
    /// Cinder's, so the request's zone is passed on unchanged.
    pub(super) async fn zone_for_source(
        &self,
        block: &BlockStorage,
        r: &csi::CreateVolumeRequest,
        availability: Option<&str>,
        source: &Source,
    ) -> DriverResult<Option<String>> {
        let requested = self.requested_zone(r, availability);
        if self.opts.ignore_volume_az {
            return Ok(requested);
        }
        let (what, source_zone) = match source {
            Source::Empty | Source::Backup(_) => return Ok(requested),
            Source::Volume(v) => (
                format!("source volume {}", v.id),
                v.availability_zone.clone(),
            ),
            Source::Snapshot(s) => match block.get_volume(&s.volume_id).await {
                Ok(v) => (format!("snapshot {}", s.id), v.availability_zone),
                // Cinder keeps a volume while it has snapshots; if it is
                // gone anyway, Cinder itself decides (and says why)
                Err(e) if e.is_not_found() => return Ok(requested),
                Err(e) => return Err(e).context(format!("the volume of snapshot {}", s.id)),
            },
        };
        let Some(asked) = requested else {
            return Ok(None);
        };
        if asked == source_zone {
            return Ok(Some(asked));
        }
        if let Some(a) = availability {
            return Err(DriverError::InvalidArgument(format!(
                "the StorageClass asks for zone {a:?}, but the {what} is in zone {source_zone:?}: \
                 Cinder restores and clones only in the source's zone"
            )));
        }
        let allowed = r
            .accessibility_requirements
            .as_ref()
            .map(|req| zones_in(&req.requisite))
            .unwrap_or_default();
        if allowed.is_empty() || allowed.contains(&source_zone.as_str()) {
            tracing::info!(
                asked = %asked, zone = %source_zone,
                "the {what} is in another zone than preferred: created in its zone, which the request allows"
            );
            return Ok(Some(source_zone));
        }
        Err(DriverError::ResourceExhausted(format!(
            "the {what} is in zone {source_zone:?}, and Cinder restores and clones only in the source's zone; \
             the request allows only zones {allowed:?}"
        )))
    }
}
