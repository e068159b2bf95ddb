//! Volume metadata set by classes (`metadata.<key>` in a StorageClass or
//! a VolumeAttributesClass): written at creation, and changed by
//! ControllerModifyVolume with a metadata update alone (no retype).
//!
//! A VolumeAttributesClass says what the volume's metadata is while the
//! volume is in that class: moving to a class without a key removes it.
//! ModifyVolume is given only the new class, so the keys the current one
//! set are recorded on the volume itself ([`RECORD_KEY`]).

use std::collections::BTreeMap;

use csi_common::{DriverError, DriverResult};

use crate::parameters::VolumeParameters;

/// The keys the volume's VolumeAttributesClass set, comma-separated (a
/// class key cannot hold a comma).
pub const RECORD_KEY: &str = "cinder.csi.openstack.org/attributes-class-metadata";

/// What a class change does to the volume's metadata.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct MetadataChange {
    /// Keys to set (with the record of the class's keys).
    pub set: BTreeMap<String, String>,
    /// Keys the former class set that the new one does not.
    pub remove: Vec<String>,
}

fn record(keys: &BTreeMap<String, String>) -> DriverResult<String> {
    let joined = keys.keys().cloned().collect::<Vec<_>>().join(",");
    if joined.len() > 255 {
        return Err(DriverError::InvalidArgument(format!(
            "the VolumeAttributesClass's metadata keys come to {} characters together: at most 255 (Cinder's limit on the value recording them)",
            joined.len()
        )));
    }
    Ok(joined)
}

/// The metadata the classes give a new volume: the StorageClass's, then
/// the VolumeAttributesClass's over them, and the record of the latter.
pub fn at_create(params: &VolumeParameters) -> DriverResult<BTreeMap<String, String>> {
    let mut out = params.class_metadata.clone();
    out.extend(params.attributes_class_metadata.clone());
    if !params.attributes_class_metadata.is_empty() {
        out.insert(
            RECORD_KEY.to_string(),
            record(&params.attributes_class_metadata)?,
        );
    }
    Ok(out)
}

/// What moves a volume with metadata `current` into a class that sets
/// `wanted`: nothing when it is there already.
pub fn change(
    current: &BTreeMap<String, String>,
    wanted: &BTreeMap<String, String>,
) -> DriverResult<MetadataChange> {
    let recorded: Vec<String> = current
        .get(RECORD_KEY)
        .map(|r| {
            r.split(',')
                .filter(|k| !k.is_empty())
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    let mut set: BTreeMap<String, String> = wanted
        .iter()
        .filter(|(k, v)| current.get(*k) != Some(*v))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let new_record = record(wanted)?;
    let remove: Vec<String> = recorded
        .into_iter()
        .filter(|k| !wanted.contains_key(k) && current.contains_key(k))
        .collect();
    // an empty record rather than none: the key holds a `/`, and Cinder's
    // API cannot remove a key by a URL holding one
    let unrecorded = wanted.is_empty() && current.get(RECORD_KEY).is_none_or(String::is_empty);
    if !unrecorded && current.get(RECORD_KEY) != Some(&new_record) {
        set.insert(RECORD_KEY.to_string(), new_record);
    }
    Ok(MetadataChange { set, remove })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn a_class_change_sets_what_differs_and_removes_what_the_old_class_alone_set() {
        let current = m(&[
            ("billing", "a"),
            ("backup", "daily"),
            ("owner", "ops"),
            (RECORD_KEY, "backup,billing"),
        ]);
        let c = change(&current, &m(&[("billing", "b")])).unwrap();
        assert_eq!(c.set, m(&[("billing", "b"), (RECORD_KEY, "billing")]));
        // "owner" came from the StorageClass (not recorded): kept
        assert_eq!(c.remove, vec!["backup".to_string()]);
        // into a class that sets none: the class's keys and the record go
        let c = change(&current, &BTreeMap::new()).unwrap();
        assert_eq!(c.set, m(&[(RECORD_KEY, "")]));
        assert_eq!(c.remove, vec!["backup".to_string(), "billing".to_string()]);
    }

    #[test]
    fn a_volume_already_in_its_class_needs_nothing() {
        let current = m(&[("billing", "a"), (RECORD_KEY, "billing")]);
        assert_eq!(
            change(&current, &m(&[("billing", "a")])).unwrap(),
            MetadataChange::default()
        );
        assert_eq!(
            change(&m(&[("owner", "ops")]), &BTreeMap::new()).unwrap(),
            MetadataChange::default()
        );
        assert_eq!(
            change(&m(&[(RECORD_KEY, "")]), &BTreeMap::new()).unwrap(),
            MetadataChange::default()
        );
    }

    #[test]
    fn keys_too_long_together_for_the_record_are_refused() {
        let wanted: BTreeMap<String, String> = (0..30)
            .map(|i| (format!("{i:02}-{}", "k".repeat(10)), "v".to_string()))
            .collect();
        assert!(matches!(
            change(&BTreeMap::new(), &wanted),
            Err(DriverError::InvalidArgument(_))
        ));
    }
}
