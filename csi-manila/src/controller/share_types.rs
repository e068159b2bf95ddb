//! Share types as the controller reads them: found by name or id, and
//! their capabilities (extra specs).

use csi_common::{Context, DriverError, DriverResult};
use openstack_client::manila::{ShareType, SharedFileSystems};

/// An extra spec that is true (`True`, `<is> True`).
pub(super) fn spec_true(t: &ShareType, key: &str) -> bool {
    t.extra_specs.get(key).is_some_and(|v| {
        v.trim()
            .trim_start_matches("<is>")
            .trim()
            .eq_ignore_ascii_case("true")
    })
}

/// A share type by name or id.
pub(super) async fn share_type(
    manila: &SharedFileSystems,
    wanted: &str,
) -> DriverResult<ShareType> {
    manila
        .list_share_types()
        .await
        .context("listing share types")?
        .into_iter()
        .find(|t| t.name == wanted || t.id == wanted)
        .ok_or_else(|| {
            DriverError::InvalidArgument(format!("share type {wanted:?} does not exist"))
        })
}

/// The share type a snapshot-based create needs: both snapshot
/// capabilities.
pub(super) fn check_snapshot_capable(t: &ShareType, what: &str) -> DriverResult<()> {
    if !spec_true(t, "snapshot_support") || !spec_true(t, "create_share_from_snapshot_support") {
        return Err(DriverError::InvalidArgument(format!(
            "{what} needs a share type with snapshot_support and create_share_from_snapshot_support; {:?} has {}",
            t.name,
            ["snapshot_support", "create_share_from_snapshot_support"]
                .iter()
                .map(|k| format!(
                    "{k}={}",
                    t.extra_specs.get(*k).map(String::as_str).unwrap_or("unset")
                ))
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    Ok(())
}
