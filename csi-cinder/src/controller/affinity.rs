//! A new volume placed as its claim's annotations ask (`--pvc-annotations`,
//! upstream's): `cinder.csi.openstack.org/affinity` names volumes whose
//! backend it must share, `…/anti-affinity` volumes whose backend it must
//! not, by name or id. They become Cinder's scheduler hints `same_host`
//! and `different_host` (ids only: names are looked up first), and the
//! volume context's `affinity` and `anti-affinity`, as upstream's.
//! A volume that the hints cannot place is one Cinder's scheduler puts
//! in `error`: the create fails with what Cinder said, and nothing is left.

use std::collections::HashMap;

use csi_common::claim_annotations::entries;
use csi_common::request::is_uuid;
use csi_common::{Context, DriverError, DriverResult};
use openstack_client::cinder::BlockStorage;
use proto::csi::v1 as csi;

use super::*;

pub const AFFINITY_ANNOTATION: &str = "cinder.csi.openstack.org/affinity";
pub const ANTI_AFFINITY_ANNOTATION: &str = "cinder.csi.openstack.org/anti-affinity";
const AFFINITY_CONTEXT_KEY: &str = "affinity";
const ANTI_AFFINITY_CONTEXT_KEY: &str = "anti-affinity";

/// The volumes (ids) a new volume shares its backend with, and those it
/// must not.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Placement {
    pub same_host: Vec<String>,
    pub different_host: Vec<String>,
}

impl Placement {
    pub(super) fn scheduler_hints(&self) -> std::collections::BTreeMap<String, Vec<String>> {
        [
            ("same_host", &self.same_host),
            ("different_host", &self.different_host),
        ]
        .into_iter()
        .filter(|(_, ids)| !ids.is_empty())
        .map(|(k, ids)| (k.to_string(), ids.clone()))
        .collect()
    }

    /// A volume Cinder could not create, when hints were given: they may
    /// be why (the backends they allow are full, or none is in the zone).
    pub(super) fn explain(&self, e: DriverError) -> DriverError {
        match e {
            DriverError::Internal(m) if self != &Self::default() => DriverError::Internal(format!(
                "{m}; or no backend in the zone is one the claim's annotations allow \
                 ({AFFINITY_ANNOTATION}: {:?}, {ANTI_AFFINITY_ANNOTATION}: {:?})",
                self.same_host, self.different_host
            )),
            e => e,
        }
    }

    pub(super) fn add_to_context(&self, context: &mut HashMap<String, String>) {
        for (key, ids) in [
            (AFFINITY_CONTEXT_KEY, &self.same_host),
            (ANTI_AFFINITY_CONTEXT_KEY, &self.different_host),
        ] {
            if !ids.is_empty() {
                context.insert(key.to_string(), ids.join(","));
            }
        }
    }
}

impl ControllerService {
    /// Where the claim of `r` asks its volume to be; nowhere in particular
    /// without `--pvc-annotations`, without a claim named in the
    /// parameters, or without those annotations.
    pub(super) async fn placement(
        &self,
        block: &BlockStorage,
        r: &csi::CreateVolumeRequest,
    ) -> DriverResult<Placement> {
        let Some(claims) = &self.opts.claims else {
            return Ok(Placement::default());
        };
        let Some(annotations) = claims.of_request(&r.parameters).await? else {
            return Ok(Placement::default());
        };
        let placement = Placement {
            same_host: self
                .volume_ids(
                    block,
                    &entries(&annotations, AFFINITY_ANNOTATION)?,
                    AFFINITY_ANNOTATION,
                )
                .await?,
            different_host: self
                .volume_ids(
                    block,
                    &entries(&annotations, ANTI_AFFINITY_ANNOTATION)?,
                    ANTI_AFFINITY_ANNOTATION,
                )
                .await?,
        };
        if let Some(both) = placement
            .same_host
            .iter()
            .find(|id| placement.different_host.contains(id))
        {
            return Err(DriverError::InvalidArgument(format!(
                "the claim's annotations ask for volume {both}'s backend and for any other: \
                 {AFFINITY_ANNOTATION} and {ANTI_AFFINITY_ANNOTATION} name it both"
            )));
        }
        Ok(placement)
    }

    /// The id of each volume named (by id or by name) in annotation `key`.
    /// One that does not exist (yet) fails the create until it does: the
    /// provisioner tries again.
    async fn volume_ids(
        &self,
        block: &BlockStorage,
        named: &[String],
        key: &str,
    ) -> DriverResult<Vec<String>> {
        let mut ids = Vec::with_capacity(named.len());
        for n in named {
            let found = if is_uuid(n) {
                match block.get_volume(n).await {
                    Ok(v) if !volume_gone(&v.status) => vec![v.id],
                    Ok(_) => Vec::new(),
                    Err(e) if e.is_not_found() => Vec::new(),
                    Err(e) => return Err(e).context(format!("looking up volume {n} ({key})")),
                }
            } else {
                block
                    .volumes_named(n)
                    .await
                    .context(format!("looking up volumes named {n} ({key})"))?
                    .into_iter()
                    .filter(|v| !volume_gone(&v.status))
                    .map(|v| v.id)
                    .collect()
            };
            match found.as_slice() {
                [id] => {
                    if !ids.contains(id) {
                        ids.push(id.clone());
                    }
                }
                [] => {
                    return Err(DriverError::FailedPrecondition(format!(
                        "the claim's annotation {key} names volume {n}, which Cinder does not have (yet)"
                    )));
                }
                _ => {
                    return Err(DriverError::InvalidArgument(format!(
                        "the claim's annotation {key} names {n}, which {} volumes are named: name it by id",
                        found.len()
                    )));
                }
            }
        }
        Ok(ids)
    }
}
