//! What a controller reads to know which of its cloud resources the
//! cluster still uses: the volume handles of its driver's
//! PersistentVolumes and the snapshot handles of its
//! VolumeSnapshotContents, and the share a static Manila PV names by its
//! attributes; the addresses of its Nodes; and the uid of the namespace
//! that tells one cluster from another. Listed a page at a time (500), so that a cluster of
//! thousands costs a few calls and bounded memory per page.

use std::collections::{BTreeMap, HashSet};
use std::net::IpAddr;

use serde::Deserialize;

use crate::{Client, KubeError, Result, decode};

const PAGE: &str = "500";

#[derive(Debug, Default, Deserialize)]
struct ListMeta {
    #[serde(default, rename = "continue")]
    next: Option<String>,
}

#[derive(Debug, Deserialize)]
struct List<T> {
    #[serde(default)]
    metadata: ListMeta,
    #[serde(default = "Vec::new")]
    items: Vec<T>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct PersistentVolume {
    #[serde(default)]
    spec: PvSpec,
}

#[derive(Debug, Default, Deserialize)]
struct PvSpec {
    #[serde(default)]
    csi: Option<CsiSource>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct CsiSource {
    #[serde(default)]
    driver: String,
    #[serde(default)]
    volume_handle: String,
    /// A static PV's way of naming what it mounts (Manila's `shareID`,
    /// `shareName`).
    #[serde(default)]
    volume_attributes: BTreeMap<String, String>,
}

/// What one PersistentVolume of a driver names.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CsiVolumeRef {
    pub volume_handle: String,
    pub volume_attributes: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
struct ObjectMeta {
    #[serde(default)]
    uid: String,
}

#[derive(Debug, Deserialize)]
struct Namespace {
    metadata: ObjectMeta,
}

#[derive(Debug, Default, Deserialize)]
struct NodeAddressesOnly {
    #[serde(default)]
    metadata: NodeName,
    #[serde(default)]
    status: NodeStatus,
}

#[derive(Debug, Default, Deserialize)]
struct NodeName {
    #[serde(default)]
    name: String,
}

#[derive(Debug, Default, Deserialize)]
struct NodeStatus {
    #[serde(default)]
    addresses: Option<Vec<NodeAddress>>,
}

#[derive(Debug, Default, Deserialize)]
struct NodeAddress {
    #[serde(default)]
    address: String,
}

#[derive(Debug, Default, Deserialize)]
struct SnapshotContent {
    #[serde(default)]
    spec: ContentSpec,
    #[serde(default)]
    status: Option<ContentStatus>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ContentSpec {
    #[serde(default)]
    driver: String,
    #[serde(default)]
    source: ContentSource,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ContentSource {
    /// A pre-provisioned snapshot.
    #[serde(default)]
    snapshot_handle: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ContentStatus {
    /// A dynamically made snapshot, once the sidecar has it.
    #[serde(default)]
    snapshot_handle: Option<String>,
}

impl Client {
    /// Every page of a cluster-wide list.
    async fn list_all<T: serde::de::DeserializeOwned>(&self, path: &str) -> Result<Vec<T>> {
        let mut out = Vec::new();
        let mut next: Option<String> = None;
        loop {
            let mut query = vec![("limit", PAGE)];
            if let Some(c) = next.as_deref() {
                query.push(("continue", c));
            }
            let v = self.call("GET", path, &query, None).await?;
            let page: List<T> = decode("GET", path, v)?;
            out.extend(page.items);
            match page.metadata.next.filter(|c| !c.is_empty()) {
                Some(c) => next = Some(c),
                None => return Ok(out),
            }
        }
    }

    /// What every PersistentVolume of `driver` names: its volume handle
    /// and its attributes.
    pub async fn csi_volumes(&self, driver: &str) -> Result<Vec<CsiVolumeRef>> {
        let pvs: Vec<PersistentVolume> = self.list_all("api/v1/persistentvolumes").await?;
        Ok(pvs
            .into_iter()
            .filter_map(|pv| pv.spec.csi)
            .filter(|csi| csi.driver == driver)
            .map(|csi| CsiVolumeRef {
                volume_handle: csi.volume_handle,
                volume_attributes: csi.volume_attributes,
            })
            .collect())
    }

    /// The uid of a namespace (`kube-system`'s tells one cluster from
    /// another: it is made once, with the cluster, and never changes).
    pub async fn namespace_uid(&self, name: &str) -> Result<String> {
        let path = format!("api/v1/namespaces/{name}");
        let v = self.call("GET", &path, &[], None).await?;
        let ns: Namespace = decode("GET", &path, v)?;
        if ns.metadata.uid.is_empty() {
            return Err(KubeError::Decode {
                method: "GET",
                path,
                message: "the namespace has no uid".into(),
            });
        }
        Ok(ns.metadata.uid)
    }

    /// Every IP address a Node of the cluster has (its status's
    /// addresses that are IPs: internal and external; host names are
    /// left out), with the node's name.
    pub async fn node_addresses(&self) -> Result<BTreeMap<IpAddr, String>> {
        let nodes: Vec<NodeAddressesOnly> = self.list_all("api/v1/nodes").await?;
        Ok(nodes
            .into_iter()
            .flat_map(|n| {
                let name = n.metadata.name;
                n.status
                    .addresses
                    .unwrap_or_default()
                    .into_iter()
                    .filter_map(move |a| Some((a.address.parse::<IpAddr>().ok()?, name.clone())))
            })
            .collect())
    }

    /// The snapshot handles of every VolumeSnapshotContent of `driver`;
    /// None when the cluster has no snapshot API (the CRDs are not
    /// installed: nothing can name a snapshot).
    pub async fn csi_snapshot_handles(&self, driver: &str) -> Result<Option<HashSet<String>>> {
        let path = "apis/snapshot.storage.k8s.io/v1/volumesnapshotcontents";
        let contents: Vec<SnapshotContent> = match self.list_all(path).await {
            Ok(c) => c,
            Err(e @ KubeError::Status { status: 404, .. }) => {
                tracing::debug!(error = %e, "no snapshot API");
                return Ok(None);
            }
            Err(e) => return Err(e),
        };
        Ok(Some(
            contents
                .into_iter()
                .filter(|c| c.spec.driver == driver)
                .flat_map(|c| {
                    [
                        c.spec.source.snapshot_handle,
                        c.status.and_then(|s| s.snapshot_handle),
                    ]
                })
                .flatten()
                .filter(|h| !h.is_empty())
                .collect(),
        ))
    }
}

#[derive(Debug, Default, Deserialize)]
struct AnnotationsOnly {
    #[serde(default)]
    metadata: AnnotatedMeta,
}

#[derive(Debug, Default, Deserialize)]
struct AnnotatedMeta {
    #[serde(default)]
    annotations: BTreeMap<String, String>,
}

/// Whether `s` is a name the apiserver gives an object: a DNS-1123
/// subdomain (`max` 253) or label (`max` 63, no dot). A name that is not
/// one never reaches a request path.
pub fn is_object_name(s: &str, max: usize, dots: bool) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= max
        && b.first().is_some_and(u8::is_ascii_alphanumeric)
        && b.last().is_some_and(u8::is_ascii_alphanumeric)
        && b.iter().all(|c| {
            c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-' || (dots && *c == b'.')
        })
}

impl Client {
    /// The annotations of a PersistentVolumeClaim, or None when there is
    /// no claim by that name. The namespace and the name must be names
    /// the apiserver could have given (else a Config error, nothing sent).
    pub async fn pvc_annotations(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<BTreeMap<String, String>>> {
        if !is_object_name(namespace, 63, false) || !is_object_name(name, 253, true) {
            return Err(KubeError::Config(format!(
                "{namespace:?}/{name:?} is not the namespace and name of a claim"
            )));
        }
        let path = format!("api/v1/namespaces/{namespace}/persistentvolumeclaims/{name}");
        match self.call("GET", &path, &[], None).await {
            Ok(v) => {
                let pvc: AnnotationsOnly = decode("GET", &path, v)?;
                Ok(Some(pvc.metadata.annotations))
            }
            Err(e) if e.status() == Some(404) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod names {
    use super::is_object_name;

    #[test]
    fn only_names_the_apiserver_gives_pass() {
        for ok in ["data", "a", "web-0", "x.y-z", "0abc"] {
            assert!(is_object_name(ok, 253, true), "{ok}");
        }
        for bad in [
            "", "-a", "a-", "A", "a/b", "..", "a b", "a?x=1", "%2e%2e", ".a", "a.",
        ] {
            assert!(!is_object_name(bad, 253, true), "{bad}");
        }
        assert!(!is_object_name("x.y", 63, false));
        assert!(!is_object_name(&"a".repeat(64), 63, false));
        assert!(is_object_name(&"a".repeat(253), 253, true));
    }
}
