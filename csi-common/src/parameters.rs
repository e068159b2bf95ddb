//! Keys the Kubernetes sidecars add to a request's parameters
//! (`--extra-create-metadata` on csi-provisioner and csi-snapshotter,
//! `--extra-modify-metadata` on csi-resizer). Both drivers record them as
//! metadata on what they create, so an operator can tell which claim an
//! OpenStack resource serves.

/// The sidecars' own prefix: keys under it are never the user's.
pub const PROVISIONER_PREFIX: &str = "csi.storage.k8s.io/";
pub const PVC_NAME: &str = "csi.storage.k8s.io/pvc/name";
pub const PVC_NAMESPACE: &str = "csi.storage.k8s.io/pvc/namespace";
pub const PV_NAME: &str = "csi.storage.k8s.io/pv/name";
pub const SNAPSHOT_NAME: &str = "csi.storage.k8s.io/volumesnapshot/name";
pub const SNAPSHOT_NAMESPACE: &str = "csi.storage.k8s.io/volumesnapshot/namespace";
pub const SNAPSHOT_CONTENT_NAME: &str = "csi.storage.k8s.io/volumesnapshotcontent/name";

/// Whether a volume parameter is one the provisioner or the resizer adds
/// about the claim (recorded as metadata).
pub fn is_volume_metadata_key(k: &str) -> bool {
    matches!(k, PVC_NAME | PVC_NAMESPACE | PV_NAME)
}

/// Whether a snapshot parameter is one the snapshotter adds.
pub fn is_snapshot_metadata_key(k: &str) -> bool {
    matches!(
        k,
        SNAPSHOT_NAME | SNAPSHOT_NAMESPACE | SNAPSHOT_CONTENT_NAME
    )
}

/// Parameters from `key, value` pairs (classes written in code and tests).
pub fn from_pairs(pairs: &[(&str, &str)]) -> std::collections::HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}
