//! StorageClass, VolumeAttributesClass and VolumeSnapshotClass parameters,
//! read as upstream's plugin reads them: the keys it knows are checked (a
//! malformed value is InvalidArgument naming the key), keys it does not
//! know are ignored and logged, so a class written for upstream, or for
//! the in-tree provisioner before it (legacy `fsType`), works unchanged.
//!
//! Mutable parameters are the exception: a VolumeAttributesClass asks for
//! a change, and a change this driver cannot make is refused, never
//! silently dropped.

use std::collections::{BTreeMap, HashMap};

use csi_common::parameters::{
    PROVISIONER_PREFIX, is_snapshot_metadata_key, is_volume_metadata_key,
};
use csi_common::{DriverError, DriverResult};
use host_ops::Filesystem;

/// The volume context key carrying a StorageClass's legacy `fsType` to the
/// node, which formats with it when the capability names no filesystem.
pub const FS_TYPE_CONTEXT_KEY: &str = "cinder.csi.openstack.org/fsType";

/// The provisioner's own filesystem key (it normally strips it; an older
/// one forwards it).
const PREFIXED_FS_TYPE: &str = "csi.storage.k8s.io/fstype";

/// Upstream's default wait for a backup: this many seconds per GiB, plus
/// [`BACKUP_BASE_SECONDS`].
pub const DEFAULT_BACKUP_SECONDS_PER_GIB: u64 = 20;
pub const BACKUP_BASE_SECONDS: u64 = 30;

/// The StorageClass keys this driver reads, besides the provisioner's
/// `csi.storage.k8s.io/*` (the README's reference is checked against it).
pub const STORAGE_CLASS_KEYS: &[&str] = &["type", "availability", "fsType"];
/// The VolumeSnapshotClass keys this driver reads.
pub const SNAPSHOT_CLASS_KEYS: &[&str] = &[
    "force-create",
    "type",
    "backup-max-duration-seconds-per-gb",
    "availability",
];
/// The VolumeAttributesClass keys ModifyVolume applies.
pub const VOLUME_ATTRIBUTES_CLASS_KEYS: &[&str] = &["type"];

/// A StorageClass or VolumeAttributesClass key `metadata.<key>` sets the
/// Cinder volume metadata `<key>`: per-volume properties (QoS hints,
/// billing, backup policy) without a volume type per combination, and
/// changed by a VolumeAttributesClass without a retype.
pub const CLASS_METADATA_PREFIX: &str = "metadata.";
/// At most this many `metadata.` keys in one class.
pub const MAX_CLASS_METADATA: usize = 32;
/// Prefixes of the metadata keys this driver and the sidecars write
/// (the cluster's identity, the claim's names, the driver's own records):
/// a class cannot set them.
const RESERVED_METADATA_PREFIXES: [&str; 2] = ["cinder.csi.openstack.org/", PROVISIONER_PREFIX];
/// Cinder's limit on a metadata key and on a value.
const CINDER_METADATA_MAX: usize = 255;

/// The metadata key a class's `metadata.<key>` sets: 1 to 255 of
/// `A-Za-z0-9-_:.` (Cinder's own rule, less `/` and space), a value of at
/// most 255; never one of the keys this driver or the sidecars own.
fn class_metadata_key<'k>(class: &str, key: &'k str, value: &str) -> DriverResult<&'k str> {
    let name = &key[CLASS_METADATA_PREFIX.len()..];
    let bad = |why: &str| {
        DriverError::InvalidArgument(format!(
            "{class} parameter {}: {why}",
            plugin_runtime::logging::caller_field(key)
        ))
    };
    if name.is_empty() || name.len() > CINDER_METADATA_MAX {
        return Err(bad("a Cinder metadata key has 1 to 255 characters"));
    }
    let lower = name.to_ascii_lowercase();
    if RESERVED_METADATA_PREFIXES
        .iter()
        .any(|p| lower.starts_with(p))
    {
        return Err(bad(
            "keys under cinder.csi.openstack.org/ and csi.storage.k8s.io/ are the driver's and the sidecars' own (the cluster's identity, the claim's names)",
        ));
    }
    // Cinder takes `/` and spaces too, but cannot remove a key holding
    // a `/` by its URL, and a class change must be able to
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "-_:.".contains(c))
    {
        return Err(bad(
            "a class's metadata key holds only letters, digits and - _ : . (no /: Cinder cannot remove such a key when the class changes)",
        ));
    }
    if value.len() > CINDER_METADATA_MAX {
        return Err(bad("a Cinder metadata value has at most 255 characters"));
    }
    Ok(name)
}

/// Refuses a class with more `metadata.` keys than [`MAX_CLASS_METADATA`].
fn bounded_class_metadata(class: &str, m: &BTreeMap<String, String>) -> DriverResult<()> {
    if m.len() > MAX_CLASS_METADATA {
        return Err(DriverError::InvalidArgument(format!(
            "the {class} sets {} metadata keys: at most {MAX_CLASS_METADATA}",
            m.len()
        )));
    }
    Ok(())
}

fn invalid(key: &str, value: &str, why: &str) -> DriverError {
    DriverError::InvalidArgument(format!("parameter {key}={value:?}: {why}"))
}

fn non_empty(v: &str) -> Option<String> {
    Some(v.to_string()).filter(|v| !v.is_empty())
}

/// Go's `strconv.ParseBool`, which upstream uses for its flags in classes.
fn parse_bool(key: &str, v: &str) -> DriverResult<bool> {
    match v {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        _ => Err(invalid(key, v, "must be true or false")),
    }
}

/// Logs the keys a class sets that this driver ignores: the first 16,
/// each escaped and bounded (whoever writes the class chose them).
fn log_ignored(class: &str, ignored: &[String]) {
    if !ignored.is_empty() {
        let shown: Vec<String> = ignored
            .iter()
            .take(16)
            .map(|k| plugin_runtime::logging::caller_field(k))
            .collect();
        tracing::warn!(keys = ?shown, count = ignored.len(), "{class} parameters this driver does not know are ignored");
    }
}

/// What CreateVolume reads from a StorageClass (and the mutable
/// parameters of a VolumeAttributesClass given at creation).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VolumeParameters {
    /// Cinder volume type, name or id.
    pub volume_type: Option<String>,
    /// Cinder availability zone; overrides the topology's.
    pub availability: Option<String>,
    /// `fsType` of in-tree StorageClasses.
    pub fs_type: Option<Filesystem>,
    /// The provisioner's claim keys, written as volume metadata.
    pub metadata: BTreeMap<String, String>,
    /// The StorageClass's `metadata.<key>` entries.
    pub class_metadata: BTreeMap<String, String>,
    /// The VolumeAttributesClass's `metadata.<key>` entries (they win over
    /// the StorageClass's).
    pub attributes_class_metadata: BTreeMap<String, String>,
    pub ignored: Vec<String>,
}

impl VolumeParameters {
    pub fn parse(
        parameters: &HashMap<String, String>,
        mutable: &HashMap<String, String>,
    ) -> DriverResult<Self> {
        let mut p = VolumeParameters::default();
        for (k, v) in parameters {
            match k.as_str() {
                "type" => p.volume_type = non_empty(v),
                "availability" => p.availability = non_empty(v),
                k if k.eq_ignore_ascii_case("fstype") || k == PREFIXED_FS_TYPE => {
                    if !v.is_empty() {
                        let fs = Filesystem::parse(v).map_err(|_| {
                            invalid(k, v, "this driver formats ext2, ext3, ext4, xfs and btrfs")
                        })?;
                        // two spellings that disagree: no key order may decide
                        if p.fs_type.is_some_and(|other| other != fs) {
                            return Err(invalid(
                                k,
                                v,
                                "another fsType key names another filesystem",
                            ));
                        }
                        p.fs_type = Some(fs);
                    }
                }
                k if is_volume_metadata_key(k) => {
                    p.metadata.insert(k.to_string(), v.clone());
                }
                k if k.starts_with(PROVISIONER_PREFIX) => {}
                k if k.starts_with(CLASS_METADATA_PREFIX) => {
                    let name = class_metadata_key("StorageClass", k, v)?;
                    p.class_metadata.insert(name.to_string(), v.clone());
                }
                other => p.ignored.push(other.to_string()),
            }
        }
        bounded_class_metadata("StorageClass", &p.class_metadata)?;
        let changes = MutableParameters::parse(mutable)?;
        if changes.volume_type.is_some() {
            p.volume_type = changes.volume_type;
        }
        p.metadata.extend(changes.metadata);
        p.attributes_class_metadata = changes.class_metadata;
        p.ignored.sort();
        log_ignored("StorageClass", &p.ignored);
        Ok(p)
    }
}

/// What ControllerModifyVolume can change: the volume type (a Cinder
/// retype), and the claim keys csi-resizer adds with
/// `--extra-modify-metadata` (recorded as volume metadata).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MutableParameters {
    pub volume_type: Option<String>,
    pub metadata: BTreeMap<String, String>,
    /// The class's `metadata.<key>` entries: the volume's metadata set
    /// from the class it is in now.
    pub class_metadata: BTreeMap<String, String>,
}

impl MutableParameters {
    pub fn parse(mutable: &HashMap<String, String>) -> DriverResult<Self> {
        let mut p = MutableParameters::default();
        for (k, v) in mutable {
            match k.as_str() {
                "type" if !v.is_empty() => p.volume_type = Some(v.clone()),
                k if is_volume_metadata_key(k) => {
                    p.metadata.insert(k.to_string(), v.clone());
                }
                // other sidecar keys describe the request, not the volume
                k if k.starts_with(PROVISIONER_PREFIX) => {}
                k if k.starts_with(CLASS_METADATA_PREFIX) => {
                    let name = class_metadata_key("VolumeAttributesClass", k, v)?;
                    p.class_metadata.insert(name.to_string(), v.clone());
                }
                other => {
                    return Err(DriverError::InvalidArgument(format!(
                        "mutable parameter {}={} is not supported: a VolumeAttributesClass can change \"type\" (a Cinder retype) and metadata.<key> (the volume's metadata)",
                        plugin_runtime::logging::caller_field(other),
                        plugin_runtime::logging::caller_field(v)
                    )));
                }
            }
        }
        bounded_class_metadata("VolumeAttributesClass", &p.class_metadata)?;
        Ok(p)
    }
}

/// What a CSI snapshot is in Cinder.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SnapshotKind {
    /// A Cinder snapshot, on the volume's backend (fast; the volume cannot
    /// be deleted while it exists).
    #[default]
    Snapshot,
    /// A Cinder backup, in the backup store (slow; independent of the
    /// volume).
    Backup,
}

impl SnapshotKind {
    pub fn as_str(self) -> &'static str {
        match self {
            SnapshotKind::Snapshot => "snapshot",
            SnapshotKind::Backup => "backup",
        }
    }
}

/// What CreateSnapshot reads from a VolumeSnapshotClass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotParameters {
    pub kind: SnapshotKind,
    /// Snapshot or back up an attached (`in-use`) volume.
    pub force: bool,
    /// How long a backup may take per GiB of the volume.
    pub backup_seconds_per_gib: u64,
    /// Availability zone of a backup.
    pub availability: Option<String>,
    pub metadata: BTreeMap<String, String>,
    pub ignored: Vec<String>,
}

impl Default for SnapshotParameters {
    fn default() -> Self {
        SnapshotParameters {
            kind: SnapshotKind::Snapshot,
            force: false,
            backup_seconds_per_gib: DEFAULT_BACKUP_SECONDS_PER_GIB,
            availability: None,
            metadata: BTreeMap::new(),
            ignored: Vec::new(),
        }
    }
}

impl SnapshotParameters {
    pub fn parse(parameters: &HashMap<String, String>) -> DriverResult<Self> {
        let mut p = SnapshotParameters::default();
        for (k, v) in parameters {
            match k.as_str() {
                "force-create" => p.force = parse_bool(k, v)?,
                "type" => {
                    p.kind = match v.as_str() {
                        "" | "snapshot" => SnapshotKind::Snapshot,
                        "backup" => SnapshotKind::Backup,
                        _ => return Err(invalid(k, v, "must be \"snapshot\" or \"backup\"")),
                    }
                }
                "backup-max-duration-seconds-per-gb" => {
                    p.backup_seconds_per_gib = v
                        .parse::<u64>()
                        .ok()
                        .filter(|s| (1..=MAX_BACKUP_SECONDS_PER_GIB).contains(s))
                        .ok_or_else(|| {
                            invalid(
                                k,
                                v,
                                &format!("must be a number of seconds from 1 to {MAX_BACKUP_SECONDS_PER_GIB}"),
                            )
                        })?;
                }
                "availability" => p.availability = non_empty(v),
                k if is_snapshot_metadata_key(k) => {
                    p.metadata.insert(k.to_string(), v.clone());
                }
                k if k.starts_with(PROVISIONER_PREFIX) => {}
                other => p.ignored.push(other.to_string()),
            }
        }
        p.ignored.sort();
        log_ignored("VolumeSnapshotClass", &p.ignored);
        Ok(p)
    }

    /// How long a backup of a volume of `size_gib` may take (upstream's
    /// formula).
    pub fn backup_timeout(&self, size_gib: u64) -> std::time::Duration {
        std::time::Duration::from_secs(
            self.backup_seconds_per_gib
                .saturating_mul(size_gib)
                .saturating_add(BACKUP_BASE_SECONDS),
        )
    }
}

/// A day per GiB: any longer budget is a mistake (or an overflow).
pub const MAX_BACKUP_SECONDS_PER_GIB: u64 = 86_400;

/// What CreateVolumeGroupSnapshot reads from a VolumeGroupSnapshotClass.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GroupSnapshotParameters {
    /// Cinder group type (name or id) of the group the volumes are
    /// snapshotted through; `None`: the cloud's `default` group type.
    pub group_type: Option<String>,
    pub ignored: Vec<String>,
}

impl GroupSnapshotParameters {
    pub fn parse(parameters: &HashMap<String, String>) -> DriverResult<Self> {
        let mut p = GroupSnapshotParameters::default();
        for (k, v) in parameters {
            match k.as_str() {
                "groupType" => p.group_type = non_empty(v),
                k if k.starts_with(PROVISIONER_PREFIX) => {}
                other => p.ignored.push(other.to_string()),
            }
        }
        p.ignored.sort();
        log_ignored("VolumeGroupSnapshotClass", &p.ignored);
        Ok(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use csi_common::parameters::{PV_NAME, PVC_NAME, SNAPSHOT_NAME, from_pairs as m};

    #[test]
    fn storage_classes_in_the_wild_are_accepted() {
        let p = VolumeParameters::parse(
            &m(&[
                ("type", "fast"),
                ("availability", "nova"),
                ("fsType", "xfs"),
                (PVC_NAME, "data"),
                (PV_NAME, "pvc-1"),
                ("csi.storage.k8s.io/provisioner-secret-name", "x"),
                ("someOldKey", "v"),
            ]),
            &HashMap::new(),
        )
        .unwrap();
        assert_eq!(p.volume_type.as_deref(), Some("fast"));
        assert_eq!(p.availability.as_deref(), Some("nova"));
        assert_eq!(p.fs_type, Some(Filesystem::Xfs));
        assert_eq!(p.metadata.len(), 2);
        assert_eq!(p.ignored, vec!["someOldKey".to_string()]);
        let lower = VolumeParameters::parse(&m(&[("fstype", "ext3")]), &HashMap::new()).unwrap();
        assert_eq!(lower.fs_type, Some(Filesystem::Ext3));
    }

    #[test]
    fn two_fs_type_keys_that_disagree_are_refused() {
        let both = m(&[("fsType", "xfs"), (PREFIXED_FS_TYPE, "ext4")]);
        let e = VolumeParameters::parse(&both, &HashMap::new()).unwrap_err();
        assert!(e.to_string().contains("another filesystem"), "{e}");
        let agree = m(&[("fsType", "xfs"), ("FSTYPE", "xfs")]);
        assert_eq!(
            VolumeParameters::parse(&agree, &HashMap::new())
                .unwrap()
                .fs_type,
            Some(Filesystem::Xfs)
        );
    }

    #[test]
    fn a_filesystem_the_node_cannot_make_is_refused() {
        let e = VolumeParameters::parse(&m(&[("fsType", "zfs")]), &HashMap::new()).unwrap_err();
        assert!(matches!(e, DriverError::InvalidArgument(ref s) if s.contains("fsType")));
    }

    #[test]
    fn mutable_parameters_take_the_resizers_keys_and_refuse_others() {
        let p = MutableParameters::parse(&m(&[("type", "slow"), (PVC_NAME, "data")])).unwrap();
        assert_eq!(p.volume_type.as_deref(), Some("slow"));
        assert_eq!(p.metadata.get(PVC_NAME).map(String::as_str), Some("data"));
        assert!(MutableParameters::parse(&m(&[("iops", "100")])).is_err());
    }

    #[test]
    fn snapshot_classes() {
        let p = SnapshotParameters::parse(&m(&[
            ("force-create", "True"),
            ("type", "backup"),
            ("backup-max-duration-seconds-per-gb", "5"),
            ("availability", "az2"),
            (SNAPSHOT_NAME, "snap"),
        ]))
        .unwrap();
        assert!(p.force);
        assert_eq!(p.kind, SnapshotKind::Backup);
        assert_eq!(p.backup_timeout(2).as_secs(), 40);
        assert_eq!(p.availability.as_deref(), Some("az2"));
        assert_eq!(p.metadata.len(), 1);
        assert!(SnapshotParameters::parse(&m(&[("force-create", "yes")])).is_err());
        assert!(SnapshotParameters::parse(&m(&[("type", "clone")])).is_err());
        assert!(
            SnapshotParameters::parse(&m(&[("backup-max-duration-seconds-per-gb", "0")])).is_err()
        );
        assert_eq!(
            SnapshotParameters::default().backup_timeout(1).as_secs(),
            50
        );
    }
}
