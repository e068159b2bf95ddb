//! What NodeStage mounts, and how little it asks Manila for it.
//!
//! CreateVolume writes into the volume context what is not secret and
//! does not change while the share lives: its export locations
//! (`exportLocations`) and, for CephFS, its file system name
//! (`cephfs-fsName`), next to upstream's `shareID` and `shareAccessIDs`.
//! NodeStage then asks Manila only for the access rule (one call: the
//! cephx key, or that an NFS rule is still active). A context without
//! them (volumes provisioned before, static PVs) or one gone stale (the
//! rule is gone, the export moved and the mount fails) gets the full
//! lookup: the share, its rules and its export locations.

use std::collections::HashMap;

use csi_common::{Context, DriverError, DriverResult};
use openstack_client::manila::{AccessRule, ExportLocation, Share, SharedFileSystems};

use crate::parameters::{EXPORT_LOCATIONS_KEY, FS_NAME_KEY, NodeParameters, exports_to_context};
use crate::runtime_config::Cidr;
use crate::share_protocol::ShareProtocol;
use crate::shares::{
    check_cephx, check_export, check_fs_name, check_mountable, choose_export, resolve_share,
    usable_rule,
};

/// The CephFS file system a share lives in, from Manila's
/// `__mount_options` metadata (`fs=NAME`).
pub fn fs_name(metadata: &std::collections::BTreeMap<String, String>) -> Option<String> {
    metadata
        .get("__mount_options")?
        .split(',')
        .find_map(|o| o.trim().strip_prefix("fs="))
        .map(str::to_string)
        .filter(|s| !s.is_empty())
}

/// What CreateVolume adds to the volume context for NodeStage: the
/// share's export locations where Manila gave them (else NodeStage looks
/// them up; a failed list fails no create) and its CephFS file system.
pub fn context_for_stage<E: std::fmt::Display>(
    share: &Share,
    locations: Result<Vec<ExportLocation>, E>,
    protocol: ShareProtocol,
    context: &mut HashMap<String, String>,
) {
    let locations = match locations {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(share_id = %share.id, error = %e, "export locations not in the volume context; NodeStage will look them up");
            Vec::new()
        }
    };
    let exports = exports_to_context(&locations);
    if exports != "[]" {
        context.insert(EXPORT_LOCATIONS_KEY.into(), exports);
    }
    if protocol == ShareProtocol::Cephfs
        && let Some(fs) = fs_name(&share.metadata)
    {
        context.insert(FS_NAME_KEY.into(), fs);
    }
}

/// The share, access rule and export path a stage mounts.
#[derive(Debug, Clone)]
pub struct MountTarget {
    pub share_id: String,
    pub rule: AccessRule,
    pub export: String,
    pub fs_name: Option<String>,
    /// Taken from the volume context (one Manila call), not looked up.
    pub from_context: bool,
}

/// From the volume context and one call for the rule; `None` when the
/// context does not carry enough, or is stale (the rule is gone): the
/// caller then looks everything up.
pub async fn from_context(
    manila: &SharedFileSystems,
    volume_id: &str,
    params: &NodeParameters,
    protocol: ShareProtocol,
    matching: Option<&Cidr>,
) -> DriverResult<Option<MountTarget>> {
    let Some(exports) = params.export_locations.as_deref() else {
        return Ok(None);
    };
    if params.share_name.is_some() || params.access_ids.is_empty() {
        return Ok(None);
    }
    let Ok(export) = choose_export(exports, matching) else {
        return Ok(None);
    };
    let share_id = params
        .share_id
        .clone()
        .unwrap_or_else(|| volume_id.to_string());
    let rule = match usable_rule(manila, &share_id, &params.access_ids, protocol).await {
        Ok(r) => r,
        // gone or not active: the full lookup says why, or finds another
        Err(DriverError::FailedPrecondition(why)) | Err(DriverError::NotFound(why)) => {
            tracing::info!(volume_id, %why, "the volume context's access rule is not usable; looking the share up");
            return Ok(None);
        }
        Err(e) => return Err(e),
    };
    Ok(Some(MountTarget {
        share_id,
        rule,
        export: export.path,
        fs_name: params.fs_name.clone(),
        from_context: true,
    }))
}

/// Everything from Manila: the share (by id or name), its rule and its
/// export locations, asked at once when the share's id is known.
pub async fn from_manila(
    manila: &SharedFileSystems,
    volume_id: &str,
    params: &NodeParameters,
    protocol: ShareProtocol,
    matching: Option<&Cidr>,
) -> DriverResult<MountTarget> {
    let known = match &params.share_name {
        Some(_) => Some(resolve_share(manila, volume_id, params).await?),
        None => None,
    };
    let share_id = known.as_ref().map(|s| s.id.clone()).unwrap_or_else(|| {
        params
            .share_id
            .clone()
            .unwrap_or_else(|| volume_id.to_string())
    });
    if !csi_common::request::is_uuid(&share_id) {
        return Err(DriverError::NotFound(format!(
            "share {share_id} does not exist (share ids are UUIDs)"
        )));
    }
    let (share, rule, exports) = tokio::join!(
        async {
            match &known {
                Some(s) => Ok(s.clone()),
                None => resolve_share(manila, volume_id, params).await,
            }
        },
        usable_rule(manila, &share_id, &params.access_ids, protocol),
        async {
            manila
                .list_export_locations(&share_id)
                .await
                .context(format!("export locations of share {share_id}"))
        },
    );
    // the share's own problem first: it says the most
    let share = share?;
    check_mountable(&share, protocol)?;
    let rule = rule?;
    let export = choose_export(&exports?, matching)?;
    Ok(MountTarget {
        share_id: share.id.clone(),
        rule,
        export: export.path,
        fs_name: fs_name(&share.metadata),
        from_context: false,
    })
}

impl MountTarget {
    /// What Manila (or the context) said, checked before it reaches
    /// mount(8) or a Ceph file.
    pub fn check(&self, protocol: ShareProtocol) -> DriverResult<()> {
        check_export(&self.export)?;
        if let Some(f) = &self.fs_name {
            check_fs_name(f)?;
        }
        if protocol == ShareProtocol::Cephfs {
            check_cephx(
                &self.rule.access_to,
                self.rule.access_key.as_deref().unwrap_or_default(),
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceph_fs_name_from_share_metadata() {
        let m = |v: &str| {
            std::collections::BTreeMap::from([("__mount_options".to_string(), v.to_string())])
        };
        assert_eq!(fs_name(&m("fs=cephfs")).as_deref(), Some("cephfs"));
        assert_eq!(fs_name(&m("noatime, fs=other")).as_deref(), Some("other"));
        assert_eq!(fs_name(&m("fs=")), None);
        assert_eq!(fs_name(&Default::default()), None);
    }
}
