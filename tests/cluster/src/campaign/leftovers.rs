//! Nothing left behind: every CSI mount on a node, and every attachment
//! of one of the cluster's volumes to a node's server, is owned by an
//! object of the cluster. A call that failed for good (kubelet never
//! unstages a stage answered so; the attacher forgets a publish) or a
//! fault between two steps of a call would leave one that nothing owns:
//! a mount that holds a device, an attachment that keeps a volume from
//! another node.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::Campaign;
use crate::{ClusterError, Result};

/// The tag the Cinder driver puts on the volumes it makes for the
/// cluster (deploy/ runs it with `--cluster=kubernetes`).
const CLUSTER_TAG: (&str, &str) = ("cinder.csi.openstack.org/cluster", "kubernetes");

/// A CSI mount below a node's kubelet directory, as `cluster.py
/// csi-mounts` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CsiMount {
    pub target: String,
    /// A publish's pod (None: a staging mount).
    pub pod_uid: Option<String>,
    pub pv: Option<String>,
}

/// What the cluster's objects own. An object being deleted owns
/// nothing: past the catch-up time, an attachment whose VolumeAttachment
/// is still being deleted is a detach that keeps failing, and a mount of
/// a pod stuck Terminating an unmount that does.
#[derive(Debug, Default)]
pub struct Owners {
    /// (node, PV) of every VolumeAttachment not being deleted.
    pub attached: HashSet<(String, String)>,
    /// The uids of every pod not being deleted.
    pub pods: HashSet<String>,
    /// (node, PV) of every claim a pod on a node (not being deleted)
    /// uses.
    pub used: HashSet<(String, String)>,
}

/// The mounts and attachments of `node` that nothing owns. `attachments`:
/// the PVs of the cluster's volumes its server holds.
pub fn unowned(
    node: &str,
    mounts: &[CsiMount],
    attachments: &[String],
    owners: &Owners,
) -> Vec<String> {
    let held = |pv: &str| {
        let key = (node.to_string(), pv.to_string());
        owners.attached.contains(&key) || owners.used.contains(&key)
    };
    let mut found = Vec::new();
    for m in mounts {
        let owned = match (&m.pod_uid, &m.pv) {
            (Some(uid), _) => owners.pods.contains(uid),
            (None, Some(pv)) => held(pv),
            (None, None) => false,
        };
        if !owned {
            found.push(format!(
                "{node}: mount {} ({:?}) owned by no pod or attachment",
                m.target, m.pv
            ));
        }
    }
    for pv in attachments {
        if !owners.attached.contains(&(node.to_string(), pv.clone())) {
            found.push(format!(
                "{node}: its server holds {pv}'s volume, and no VolumeAttachment says so"
            ));
        }
    }
    found
}

impl Campaign {
    /// What the cluster's objects own, now.
    async fn owners(&self) -> Result<Owners> {
        let mut o = Owners::default();
        let deleting = |o: &Value| !o["metadata"]["deletionTimestamp"].is_null();
        for va in self.c.list("volumeattachments", &[]).await? {
            if deleting(&va) {
                continue;
            }
            if let (Some(node), Some(pv)) = (
                va["spec"]["nodeName"].as_str(),
                va["spec"]["source"]["persistentVolumeName"].as_str(),
            ) {
                o.attached.insert((node.to_string(), pv.to_string()));
            }
        }
        let claims: HashMap<(String, String), String> = self
            .c
            .list("pvc", &["-A"])
            .await?
            .iter()
            .filter_map(|c| {
                Some((
                    (
                        c["metadata"]["namespace"].as_str()?.to_string(),
                        c["metadata"]["name"].as_str()?.to_string(),
                    ),
                    c["spec"]["volumeName"].as_str()?.to_string(),
                ))
            })
            .collect();
        for p in self.c.list("pods", &["-A"]).await? {
            if deleting(&p) {
                continue;
            }
            if let Some(uid) = p["metadata"]["uid"].as_str() {
                o.pods.insert(uid.to_string());
            }
            let (Some(node), Some(ns)) = (
                p["spec"]["nodeName"].as_str(),
                p["metadata"]["namespace"].as_str(),
            ) else {
                continue;
            };
            for v in p["spec"]["volumes"].as_array().into_iter().flatten() {
                if let Some(claim) = v["persistentVolumeClaim"]["claimName"].as_str()
                    && let Some(pv) = claims.get(&(ns.to_string(), claim.to_string()))
                {
                    o.used.insert((node.to_string(), pv.clone()));
                }
            }
        }
        Ok(o)
    }

    /// A node's CSI mounts, each with its PV: as kubelet recorded it (a
    /// publish), or found by the volume handle it recorded (a staging).
    async fn csi_mounts(
        &self,
        node: &str,
        pv_of: &HashMap<String, String>,
    ) -> Result<Vec<CsiMount>> {
        Ok(super::holders::read_node(&self.c, node)
            .await?
            .into_iter()
            .map(|m| CsiMount {
                target: m.target,
                pod_uid: m.pod_uid,
                pv: m
                    .pv
                    .or_else(|| m.volume_handle.and_then(|h| pv_of.get(&h).cloned())),
            })
            .collect())
    }

    /// The PVs of the cluster's volumes that `node`'s server holds.
    async fn attached_pvs(
        &self,
        (nova, cinder): (
            &openstack_client::nova::Compute,
            &openstack_client::cinder::BlockStorage,
        ),
        node: &str,
        pv_of: &HashMap<String, String>,
    ) -> Result<Vec<String>> {
        let server = self.c.server_of(node)?;
        let mut pvs = Vec::new();
        let attachments = nova
            .list_volume_attachments(&server)
            .await
            .map_err(|e| ClusterError::Other(format!("{node}'s attachments: {e}")))?;
        for a in attachments {
            let Ok(v) = cinder.get_volume(&a.volume_id).await else {
                continue;
            };
            if v.metadata.get(CLUSTER_TAG.0).map(String::as_str) == Some(CLUSTER_TAG.1) {
                pvs.push(pv_of.get(&a.volume_id).cloned().unwrap_or(a.volume_id));
            }
        }
        Ok(pvs)
    }

    /// What nothing owns, on every node, now.
    pub async fn left_behind(&self) -> Result<Vec<String>> {
        let owners = self.owners().await?;
        let pv_of: HashMap<String, String> = self
            .c
            .list("pv", &[])
            .await?
            .iter()
            .filter_map(|pv| {
                Some((
                    pv["spec"]["csi"]["volumeHandle"].as_str()?.to_string(),
                    pv["metadata"]["name"].as_str()?.to_string(),
                ))
            })
            .collect();
        // one session of each for every node's look (each new one asks
        // Keystone for a token)
        let (nova, cinder) = (self.c.nova()?, self.c.cinder()?);
        let mut found = Vec::new();
        for node in self.c.nodes().await? {
            let mounts = self.csi_mounts(&node, &pv_of).await?;
            let attached = self.attached_pvs((&nova, &cinder), &node, &pv_of).await?;
            found.extend(unowned(&node, &mounts, &attached, &owners));
        }
        Ok(found)
    }

    /// What is still left behind once the cluster had `bound` to finish
    /// what it was doing (detaches and unmounts run after convergence).
    pub async fn wait_nothing_left_behind(&self, bound: Duration) -> Result<Vec<String>> {
        let until = Instant::now() + bound;
        loop {
            let found = self.left_behind().await?;
            if found.is_empty() || Instant::now() >= until {
                return Ok(found);
            }
            tokio::time::sleep(Duration::from_secs(5)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mount_or_attachment_nothing_owns_is_seen() {
        let mut o = Owners::default();
        o.attached.insert(("b".into(), "pv-1".into()));
        o.pods.insert("uid-1".into());
        o.used.insert(("b".into(), "pv-2".into()));
        let m = |t: &str, uid: Option<&str>, pv: &str| CsiMount {
            target: t.into(),
            pod_uid: uid.map(str::to_string),
            pv: Some(pv.into()),
        };
        let owned = [
            m("s1", None, "pv-1"),
            m("s2", None, "pv-2"),
            m("p1", Some("uid-1"), "pv-1"),
        ];
        assert!(unowned("b", &owned, &["pv-1".into()], &o).is_empty());
        assert_eq!(
            unowned("c", &[m("s1", None, "pv-1")], &[], &o).len(),
            1,
            "owned on b only"
        );
        assert_eq!(
            unowned("b", &[m("p2", Some("uid-2"), "pv-1")], &[], &o).len(),
            1,
            "a gone pod's"
        );
        assert_eq!(
            unowned("b", &[], &["pv-2".into()], &o).len(),
            1,
            "attached, no VolumeAttachment"
        );
    }
}
