//! StorageClass parameters (CreateVolume) and volume attributes (the node's
//! volume context), read as upstream's validator reads them: the keys it
//! knows are checked (an empty value or a malformed one is InvalidArgument,
//! naming the key), keys it does not know are ignored, so a StorageClass
//! written for upstream's plugin (or carrying keys the provisioner
//! forwards, such as the legacy `fsType`) works unchanged.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

use csi_common::{DriverError, DriverResult};

use crate::share_protocol::ShareProtocol;

use csi_common::parameters::is_volume_metadata_key;

/// How a CephFS share is mounted on the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CephMounter {
    /// ceph-fuse (upstream's default).
    #[default]
    Fuse,
    /// The kernel client, `mount -t ceph`.
    Kernel,
}

impl CephMounter {
    pub fn as_str(self) -> &'static str {
        match self {
            CephMounter::Fuse => "fuse",
            CephMounter::Kernel => "kernel",
        }
    }
}

/// The node-side options a StorageClass passes through to the volume
/// context (upstream's adapter options).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MountParameters {
    pub cephfs_mounter: CephMounter,
    pub cephfs_kernel_mount_options: Option<String>,
    pub cephfs_fuse_mount_options: Option<String>,
}

impl MountParameters {
    /// The volume context keys they are written back as.
    pub fn to_context(&self, ctx: &mut HashMap<String, String>) {
        ctx.insert("cephfs-mounter".into(), self.cephfs_mounter.as_str().into());
        if let Some(o) = &self.cephfs_kernel_mount_options {
            ctx.insert("cephfs-kernelMountOptions".into(), o.clone());
        }
        if let Some(o) = &self.cephfs_fuse_mount_options {
            ctx.insert("cephfs-fuseMountOptions".into(), o.clone());
        }
    }
}

/// What CreateVolume reads from a StorageClass.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShareParameters {
    /// Manila share type (name or id); upstream's default is `default`.
    pub share_type: String,
    pub share_network_id: Option<String>,
    pub availability: Option<String>,
    pub auto_topology: bool,
    /// `appendShareMetadata` and the provisioner's keys.
    pub metadata: BTreeMap<String, String>,
    pub group_id: Option<String>,
    /// cephx user; `None`: the share's name.
    pub cephfs_client_id: Option<String>,
    /// IPs/CIDRs granted NFS access; empty: the operator's default.
    pub nfs_share_clients: Vec<String>,
    pub mount: MountParameters,
    /// `backingSnapshot`: a volume from a snapshot reads the snapshot
    /// itself, read-only, instead of a copy of it.
    pub backing_snapshot: bool,
    /// Keys ignored (logged, so a typo is visible).
    pub ignored: Vec<String>,
}

/// The volume attribute naming the snapshot a backed volume publishes.
pub const BACKING_SNAPSHOT_ATTRIBUTE: &str = "backingSnapshotID";

fn empty(key: &str) -> DriverError {
    DriverError::InvalidArgument(format!("parameter {key:?} cannot be empty"))
}

fn invalid(key: &str, value: &str, why: &str) -> DriverError {
    DriverError::InvalidArgument(format!("parameter {key:?} = {value:?}: {why}"))
}

/// `nfs-shareClient`: IPs or CIDRs, comma-separated. `0.0.0.0/0` is
/// accepted only as written.
pub fn parse_share_clients(v: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for item in v.split(',').map(str::trim) {
        if item.is_empty() {
            return Err(format!("{v:?} has an empty entry"));
        }
        let (addr, prefix) = match item.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (item, None),
        };
        let ip: IpAddr = addr
            .parse()
            .map_err(|_| format!("{item:?} is not an IP address or CIDR"))?;
        if let Some(p) = prefix {
            let max = if ip.is_ipv4() { 32 } else { 128 };
            match p.parse::<u8>() {
                Ok(n) if n <= max => {}
                _ => return Err(format!("{item:?} has an invalid prefix length")),
            }
        }
        out.push(item.to_string());
    }
    Ok(out)
}

pub fn cephx_id(v: &str) -> bool {
    !v.is_empty()
        && v.len() <= 255
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

fn mounter(key: &str, v: &str) -> DriverResult<CephMounter> {
    match v {
        "fuse" => Ok(CephMounter::Fuse),
        "kernel" => Ok(CephMounter::Kernel),
        _ => Err(invalid(key, v, "must be fuse or kernel")),
    }
}

/// Mount options pass through to mount(8) or ceph-fuse: no whitespace or
/// control characters (they would split into other arguments).
fn mount_options(key: &str, v: &str) -> DriverResult<String> {
    if v.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(invalid(
            key,
            v,
            "must not contain spaces or control characters",
        ));
    }
    Ok(v.to_string())
}

/// Keys the driver itself writes; `appendShareMetadata` cannot override
/// them.
fn reserved_metadata(k: &str) -> bool {
    k.starts_with("csi.storage.k8s.io/") || k.starts_with("manila.csi.openstack.org/")
}

/// The StorageClass keys this driver reads, besides the provisioner's
/// `csi.storage.k8s.io/*` (the README's reference is checked against it).
pub const STORAGE_CLASS_KEYS: &[&str] = &[
    "type",
    "shareNetworkID",
    "availability",
    "autoTopology",
    "appendShareMetadata",
    "groupID",
    "cephfs-mounter",
    "cephfs-clientID",
    "cephfs-kernelMountOptions",
    "cephfs-fuseMountOptions",
    "nfs-shareClient",
    "protocol",
    "backingSnapshot",
];
/// The volume attributes the node reads (static PVs name a share with
/// them; dynamic volumes get them from CreateVolume).
pub const VOLUME_ATTRIBUTE_KEYS: &[&str] = &[
    "shareID",
    "shareName",
    "shareAccessIDs",
    "shareAccessID",
    "cephfs-mounter",
    "cephfs-kernelMountOptions",
    "cephfs-fuseMountOptions",
    "exportLocations",
    "cephfs-fsName",
    BACKING_SNAPSHOT_ATTRIBUTE,
];

impl ShareParameters {
    pub fn parse(params: &HashMap<String, String>, protocol: ShareProtocol) -> DriverResult<Self> {
        let mut p = ShareParameters {
            share_type: "default".into(),
            ..Default::default()
        };
        let mut append = None;
        for (k, v) in params {
            let known = STORAGE_CLASS_KEYS.contains(&k.as_str());
            if known && v.is_empty() {
                return Err(empty(k));
            }
            match k.as_str() {
                "type" => p.share_type = v.clone(),
                "shareNetworkID" => p.share_network_id = Some(v.clone()),
                "availability" => p.availability = Some(v.clone()),
                "autoTopology" => {
                    p.auto_topology = match v.to_ascii_lowercase().as_str() {
                        "true" => true,
                        "false" => false,
                        _ => return Err(invalid(k, v, "must be true or false")),
                    }
                }
                "appendShareMetadata" => append = Some(v.clone()),
                "backingSnapshot" => {
                    p.backing_snapshot = match v.to_ascii_lowercase().as_str() {
                        "true" => true,
                        "false" => false,
                        _ => return Err(invalid(k, v, "must be true or false")),
                    }
                }
                "groupID" => p.group_id = Some(v.clone()),
                "cephfs-mounter" => p.mount.cephfs_mounter = mounter(k, v)?,
                "cephfs-clientID" => {
                    // upstream takes a comma list and uses the first
                    let first = v.split(',').next().unwrap_or_default().trim();
                    if !cephx_id(first) {
                        return Err(invalid(
                            k,
                            v,
                            "a cephx client id is letters, digits, '-', '_' and '.'",
                        ));
                    }
                    if first == "admin" {
                        return Err(invalid(k, v, "the admin id is reserved"));
                    }
                    p.cephfs_client_id = Some(first.to_string());
                }
                "cephfs-kernelMountOptions" => {
                    p.mount.cephfs_kernel_mount_options = Some(mount_options(k, v)?)
                }
                "cephfs-fuseMountOptions" => {
                    p.mount.cephfs_fuse_mount_options = Some(mount_options(k, v)?)
                }
                "nfs-shareClient" => {
                    p.nfs_share_clients =
                        parse_share_clients(v).map_err(|why| invalid(k, v, &why))?
                }
                "protocol" => {
                    if !v.eq_ignore_ascii_case(protocol.as_manila()) {
                        return Err(invalid(
                            k,
                            v,
                            &format!(
                                "this plugin instance serves {protocol} (--share-protocol-selector)"
                            ),
                        ));
                    }
                }
                k if is_volume_metadata_key(k) => {
                    p.metadata.insert(k.to_string(), v.clone());
                }
                other => p.ignored.push(other.to_string()),
            }
        }
        if let Some(json) = append {
            let extra: BTreeMap<String, String> = serde_json::from_str(&json).map_err(|e| {
                invalid(
                    "appendShareMetadata",
                    &json,
                    &format!("must be a JSON object of strings: {e}"),
                )
            })?;
            for (k, v) in extra {
                if reserved_metadata(&k) {
                    return Err(invalid(
                        "appendShareMetadata",
                        &json,
                        &format!("key {k:?} is set by the driver"),
                    ));
                }
                p.metadata.insert(k, v);
            }
        }
        p.ignored.sort();
        Ok(p)
    }
}

/// Volume context keys CreateVolume writes for NodeStage.
pub const EXPORT_LOCATIONS_KEY: &str = "exportLocations";
pub const FS_NAME_KEY: &str = "cephfs-fsName";

/// The export locations a node may mount, as the volume context carries
/// them: a JSON list of `[path, preferred]`.
pub fn exports_to_context(locations: &[openstack_client::manila::ExportLocation]) -> String {
    let list: Vec<(&str, bool)> = locations
        .iter()
        .filter(|l| !l.is_admin_only)
        .map(|l| (l.path.as_str(), l.preferred))
        .collect();
    serde_json::to_string(&list).unwrap_or_else(|_| "[]".into())
}

/// The export locations of a volume context; `None` when absent or not
/// ours to read (the full lookup then answers).
pub fn exports_from_context(value: &str) -> Option<Vec<openstack_client::manila::ExportLocation>> {
    let list: Vec<(String, bool)> = serde_json::from_str(value).ok()?;
    if list.is_empty() {
        return None;
    }
    Some(
        list.into_iter()
            .enumerate()
            .map(
                |(i, (path, preferred))| openstack_client::manila::ExportLocation {
                    id: format!("context-{i}"),
                    path,
                    preferred,
                    is_admin_only: false,
                },
            )
            .collect(),
    )
}

/// A static PV's or a provisioned volume's attributes, as the node reads
/// them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeParameters {
    pub share_id: Option<String>,
    pub share_name: Option<String>,
    /// `shareAccessIDs` (comma list) and the older `shareAccessID`.
    pub access_ids: Vec<String>,
    pub mount: MountParameters,
    /// Export locations CreateVolume wrote (`exportLocations`); an
    /// unreadable value is ignored (the full lookup answers).
    pub export_locations: Option<Vec<openstack_client::manila::ExportLocation>>,
    /// `cephfs-fsName`
    pub fs_name: Option<String>,
    /// `backingSnapshotID`: the snapshot of the share that is published,
    /// read-only, instead of the share.
    pub backing_snapshot: Option<String>,
}

impl NodeParameters {
    pub fn parse(ctx: &HashMap<String, String>) -> DriverResult<Self> {
        let mut p = NodeParameters::default();
        for (k, v) in ctx {
            let known = VOLUME_ATTRIBUTE_KEYS.contains(&k.as_str());
            if known && v.is_empty() {
                return Err(DriverError::InvalidArgument(format!(
                    "volume attribute {k:?} cannot be empty"
                )));
            }
            match k.as_str() {
                "shareID" => p.share_id = Some(v.clone()),
                "shareName" => p.share_name = Some(v.clone()),
                "shareAccessIDs" | "shareAccessID" => {
                    for id in v.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                        if !p.access_ids.iter().any(|x| x == id) {
                            p.access_ids.push(id.to_string());
                        }
                    }
                }
                "cephfs-mounter" => p.mount.cephfs_mounter = mounter(k, v)?,
                "cephfs-kernelMountOptions" => {
                    p.mount.cephfs_kernel_mount_options = Some(mount_options(k, v)?)
                }
                "cephfs-fuseMountOptions" => {
                    p.mount.cephfs_fuse_mount_options = Some(mount_options(k, v)?)
                }
                "exportLocations" => p.export_locations = exports_from_context(v),
                "cephfs-fsName" => p.fs_name = Some(v.clone()),
                BACKING_SNAPSHOT_ATTRIBUTE => {
                    // a name that becomes a path below `.snap`
                    if !csi_common::request::is_uuid(v) {
                        return Err(DriverError::InvalidArgument(format!(
                            "volume attribute {k:?} = {v:?}: a snapshot id is a UUID"
                        )));
                    }
                    p.backing_snapshot = Some(v.to_ascii_lowercase())
                }
                _ => {}
            }
        }
        if p.share_id.is_some() && p.share_name.is_some() {
            return Err(DriverError::InvalidArgument(
                "volume attributes shareID and shareName exclude each other".into(),
            ));
        }
        Ok(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use csi_common::parameters::{PVC_NAME, from_pairs as m};

    #[test]
    fn upstream_storage_classes_parse_and_unknown_keys_are_ignored() {
        let p = ShareParameters::parse(
            &m(&[
                ("type", "cephfs"),
                ("cephfs-mounter", "kernel"),
                ("cephfs-clientID", "k8s,other"),
                ("fsType", "ext4"),
                ("csi.storage.k8s.io/pvc/name", "data"),
                ("appendShareMetadata", r#"{"team":"a"}"#),
                ("autoTopology", "TRUE"),
            ]),
            ShareProtocol::Cephfs,
        )
        .unwrap();
        assert_eq!(p.share_type, "cephfs");
        assert_eq!(p.mount.cephfs_mounter, CephMounter::Kernel);
        assert_eq!(p.cephfs_client_id.as_deref(), Some("k8s"));
        assert!(p.auto_topology);
        assert_eq!(p.ignored, vec!["fsType".to_string()]);
        assert_eq!(p.metadata.get("team").map(String::as_str), Some("a"));
        assert_eq!(p.metadata.get(PVC_NAME).map(String::as_str), Some("data"));
        let d = ShareParameters::parse(&HashMap::new(), ShareProtocol::Nfs).unwrap();
        assert_eq!(d.share_type, "default");
        assert!(d.nfs_share_clients.is_empty());
    }

    #[test]
    fn bad_values_name_their_key() {
        for (k, v) in [
            ("type", ""),
            ("cephfs-mounter", "nfs"),
            ("autoTopology", "yes"),
            ("nfs-shareClient", "10.0.0.0/33"),
            ("nfs-shareClient", "everyone"),
            ("nfs-shareClient", "10.0.0.1,"),
            ("appendShareMetadata", "[1]"),
            (
                "appendShareMetadata",
                r#"{"manila.csi.openstack.org/cluster":"x"}"#,
            ),
            ("cephfs-clientID", "bad id"),
            ("cephfs-fuseMountOptions", "a b"),
            ("protocol", "CEPHFS"),
        ] {
            let e = ShareParameters::parse(&m(&[(k, v)]), ShareProtocol::Nfs).unwrap_err();
            assert!(
                matches!(&e, DriverError::InvalidArgument(msg) if msg.contains(k)),
                "{k}={v}: {e}"
            );
        }
        assert_eq!(
            parse_share_clients("10.0.0.1, 192.168.0.0/16,::1/128").unwrap(),
            vec!["10.0.0.1", "192.168.0.0/16", "::1/128"]
        );
    }

    #[test]
    fn node_attributes_of_static_volumes() {
        let p = NodeParameters::parse(&m(&[
            ("shareID", "s"),
            ("shareAccessIDs", "a, b"),
            ("shareAccessID", "a"),
        ]))
        .unwrap();
        assert_eq!(p.access_ids, vec!["a", "b"]);
        assert!(NodeParameters::parse(&m(&[("shareID", "s"), ("shareName", "n")])).is_err());
        assert!(NodeParameters::parse(&m(&[("shareAccessID", "")])).is_err());
    }

    #[test]
    fn export_locations_round_trip_through_the_context() {
        let l = |path: &str, preferred, admin| openstack_client::manila::ExportLocation {
            id: "x".into(),
            path: path.into(),
            preferred,
            is_admin_only: admin,
        };
        let text = exports_to_context(&[
            l("10.0.0.1:6789,10.0.0.2:6789:/volumes/a", true, false),
            l("10.0.0.9:/admin", false, true),
        ]);
        let back = exports_from_context(&text).unwrap();
        assert_eq!(back.len(), 1, "admin-only locations stay out");
        assert_eq!(back[0].path, "10.0.0.1:6789,10.0.0.2:6789:/volumes/a");
        assert!(back[0].preferred);
        assert!(exports_from_context("not json").is_none());
        assert!(exports_from_context("[]").is_none());
    }
}
