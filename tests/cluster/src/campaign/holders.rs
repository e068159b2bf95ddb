//! Never two writers, sampled where it happens: every 2 s, each node's
//! CSI mounts (read on the host, in the node's mount namespace, which no
//! fault of the campaign touches), and besides them Cinder's and Nova's
//! records. A single-attach Cinder volume staged or published on two
//! nodes, or one block device mounted on two, is two writers: an old
//! node's containers still writing after its kubelet stopped, a detach
//! the cloud did while a node held the volume. The sampler fails closed:
//! a round that cannot read a node is a failed sample, and every step
//! needs samples of the nodes through its whole window; the cloud's
//! records, which an outage keeps from being read, are counted apart.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::{Campaign, Invariant};
use crate::{Cluster, ClusterError, Result};

/// The Cinder driver's name: its volumes are single-attach here.
const CINDER_DRIVER: &str = "cinder.csi.openstack.org";

/// How often the nodes are sampled.
const EVERY: Duration = Duration::from_secs(2);

/// The longest a step may go without a sample of every node (a round of
/// three nodes takes about a second; a few rounds may run late when the
/// machine is loaded, none may be missing for longer).
pub const SAMPLE_GAP: Duration = Duration::from_secs(10);

/// A CSI mount on a node, as `cluster.py csi-mounts` reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeMount {
    pub node: String,
    pub target: String,
    pub driver: Option<String>,
    pub volume_handle: Option<String>,
    /// major:minor of what is mounted.
    pub device: String,
    /// A publish's pod (None: a staging mount).
    pub pod_uid: Option<String>,
    /// The PV kubelet recorded (a publish's).
    pub pv: Option<String>,
}

/// A Cinder volume mounted on two nodes, or a block device on two (an
/// anonymous device, major 0, is a FUSE or tmpfs mount: each its own).
pub fn two_nodes(mounts: &[NodeMount]) -> Vec<String> {
    let mut by_volume: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    let mut by_device: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for m in mounts {
        if m.driver.as_deref() == Some(CINDER_DRIVER)
            && let Some(h) = &m.volume_handle
        {
            by_volume.entry(h).or_default().insert(&m.node);
        }
        if !m.device.starts_with("0:") {
            by_device.entry(&m.device).or_default().insert(&m.node);
        }
    }
    let mut found = Vec::new();
    for (volume, nodes) in by_volume {
        if nodes.len() > 1 {
            found.push(format!("volume {volume} mounted on nodes {nodes:?}"));
        }
    }
    for (device, nodes) in by_device {
        if nodes.len() > 1 {
            found.push(format!("device {device} mounted on nodes {nodes:?}"));
        }
    }
    found
}

/// A single-attach volume held by two servers, by Cinder's records or
/// Nova's.
pub fn two_servers(volume: &str, in_cinder: &[String], in_nova: &[String]) -> Option<String> {
    let distinct = |v: &[String]| v.iter().collect::<BTreeSet<_>>().len();
    (distinct(in_cinder) > 1 || distinct(in_nova) > 1)
        .then(|| format!("volume {volume} on two servers: Cinder {in_cinder:?}, Nova {in_nova:?}"))
}

/// What the sampler took.
#[derive(Debug, Default)]
pub struct Samples {
    /// When each round that read every node's mounts ended.
    pub nodes_read: Vec<Instant>,
    /// The rounds that could not read a node: when, and why.
    pub nodes_failed: Vec<(Instant, String)>,
    /// Rounds of the cloud's records read, and not (an outage, a cut).
    pub cloud_read: usize,
    pub cloud_failed: usize,
    /// Two writers seen, each with the step it was seen in.
    pub seen: Vec<String>,
}

/// What keeps a window from counting as sampled: a failed round in it,
/// or a stretch longer than [`SAMPLE_GAP`] without a sample.
pub fn unsampled(
    read: &[Instant],
    failed: &[(Instant, String)],
    from: Instant,
    to: Instant,
) -> Vec<String> {
    let mut found: Vec<String> = failed
        .iter()
        .filter(|(t, _)| *t >= from && *t <= to)
        .map(|(t, why)| {
            format!(
                "a sample of the nodes failed {:.0} s into the step: {why}",
                t.saturating_duration_since(from).as_secs_f64()
            )
        })
        .collect();
    let mut last = from;
    for t in read
        .iter()
        .filter(|t| **t >= from && **t <= to)
        .chain([&to])
    {
        let gap = t.saturating_duration_since(last);
        if gap > SAMPLE_GAP {
            found.push(format!(
                "no sample of the nodes for {:.0} s, {:.0} s into the step",
                gap.as_secs_f64(),
                last.saturating_duration_since(from).as_secs_f64()
            ));
        }
        last = *t;
    }
    found
}

/// `cluster.py csi-mounts`'s answer for `node`.
fn node_mounts(node: &str, out: &str) -> Result<Vec<NodeMount>> {
    let json = out
        .lines()
        .rev()
        .find(|l| l.starts_with('['))
        .ok_or_else(|| ClusterError::Other(format!("csi-mounts {node}: no list in {out:?}")))?;
    let v: Value = serde_json::from_str(json)
        .map_err(|e| ClusterError::Other(format!("csi-mounts {node}: {e}: {out}")))?;
    Ok(v.as_array()
        .into_iter()
        .flatten()
        .map(|m| NodeMount {
            node: node.to_string(),
            target: m["target"].as_str().unwrap_or_default().to_string(),
            driver: m["driver"].as_str().map(str::to_string),
            volume_handle: m["volume_handle"].as_str().map(str::to_string),
            device: m["device"].as_str().unwrap_or_default().to_string(),
            pod_uid: m["pod_uid"].as_str().map(str::to_string),
            pv: m["pv"].as_str().map(str::to_string),
        })
        .collect())
}

/// A node's CSI mounts, now.
pub(super) async fn read_node(c: &Cluster, node: &str) -> Result<Vec<NodeMount>> {
    node_mounts(node, &c.cluster_py(&["csi-mounts", node]).await?)
}

/// Every node's CSI mounts, now.
pub async fn read_nodes(c: &Cluster, nodes: &[String]) -> Result<Vec<NodeMount>> {
    let mut all = Vec::new();
    for node in nodes {
        all.extend(read_node(c, node).await?);
    }
    Ok(all)
}

/// One look at Cinder's and Nova's records of the campaign's single-
/// attach volumes.
async fn read_cloud(
    c: &Cluster,
    (cinder, nova): (
        &openstack_client::cinder::BlockStorage,
        &openstack_client::nova::Compute,
    ),
    n: &str,
    servers: &[String],
) -> Result<Vec<String>> {
    let claims = c.list("pvc", &["-n", n]).await?;
    let mut by_nova: HashMap<String, Vec<String>> = HashMap::new();
    for s in servers {
        let atts = nova
            .list_volume_attachments(s)
            .await
            .map_err(|e| ClusterError::Other(e.to_string()))?;
        for a in atts {
            by_nova.entry(a.volume_id).or_default().push(s.clone());
        }
    }
    let mut found = Vec::new();
    for claim in claims.iter().filter(|p| {
        let mode = &p["spec"]["accessModes"][0];
        mode == "ReadWriteOnce" || mode == "ReadWriteOncePod"
    }) {
        let Some(pv) = claim["spec"]["volumeName"].as_str() else {
            continue;
        };
        let Some(pv) = c.get("pv", pv, None).await? else {
            continue;
        };
        let Some(id) = pv["spec"]["csi"]["volumeHandle"].as_str() else {
            continue;
        };
        let v = cinder
            .get_volume(id)
            .await
            .map_err(|e| ClusterError::Other(e.to_string()))?;
        if v.multiattach {
            continue;
        }
        let in_cinder: Vec<String> = v.attached_servers().map(str::to_string).collect();
        let in_nova = by_nova.get(id).cloned().unwrap_or_default();
        found.extend(two_servers(id, &in_cinder, &in_nova));
    }
    Ok(found)
}

impl Campaign {
    /// The samplers, started: every [`EVERY`], the nodes; and, apart
    /// (an outage keeps its reads waiting), the cloud's records.
    pub(super) async fn start_sampler(&mut self) -> Result<()> {
        let nodes = self.c.nodes().await?;
        let servers: Vec<String> = nodes
            .iter()
            .map(|node| self.c.server_of(node))
            .collect::<Result<_>>()?;
        // one session each (a new one asks Keystone for a token)
        let (cinder, nova) = (self.c.cinder()?, self.c.nova()?);
        let (c, n) = (self.c.clone(), self.n().to_string());
        let (samples, step) = (self.samples.clone(), self.step.clone());
        let on_nodes = tokio::spawn(async move {
            loop {
                let round = Instant::now();
                let seen = read_nodes(&c, &nodes).await;
                let at = step.lock().map(|s| s.clone()).unwrap_or_default();
                if let Ok(mut s) = samples.lock() {
                    match seen {
                        Ok(mounts) => {
                            s.nodes_read.push(Instant::now());
                            for why in two_nodes(&mounts) {
                                s.seen.push(format!(
                                    "{:?} during {at}: {why}",
                                    Invariant::NeverTwoWriters
                                ));
                            }
                        }
                        Err(e) => s.nodes_failed.push((Instant::now(), e.to_string())),
                    }
                }
                tokio::time::sleep(EVERY.saturating_sub(round.elapsed())).await;
            }
        });
        let (c, samples, step) = (self.c.clone(), self.samples.clone(), self.step.clone());
        let in_cloud = tokio::spawn(async move {
            loop {
                let round = Instant::now();
                let seen = read_cloud(&c, (&cinder, &nova), &n, &servers).await;
                let at = step.lock().map(|s| s.clone()).unwrap_or_default();
                if let Ok(mut s) = samples.lock() {
                    match seen {
                        Ok(found) => {
                            s.cloud_read += 1;
                            for why in found {
                                s.seen.push(format!(
                                    "{:?} during {at}: {why}",
                                    Invariant::NeverTwoWriters
                                ));
                            }
                        }
                        Err(_) => s.cloud_failed += 1,
                    }
                }
                tokio::time::sleep(EVERY.saturating_sub(round.elapsed())).await;
            }
        });
        self.samplers = vec![on_nodes, in_cloud];
        Ok(())
    }

    /// The step's window sampled throughout, and what the sampler saw in
    /// it (taken from its list, so that each is reported once).
    pub(super) fn check_samples(&self, label: &str, from: Instant, to: Instant) -> Vec<String> {
        let mut found = Vec::new();
        if self.samplers.is_empty() || self.samplers.iter().any(|s| s.is_finished()) {
            found.push(format!(
                "{:?} at {label}: a sampler is not running",
                Invariant::NeverTwoWriters
            ));
        }
        if let Ok(mut s) = self.samples.lock() {
            for why in unsampled(&s.nodes_read, &s.nodes_failed, from, to) {
                found.push(format!(
                    "{:?} at {label}: {why}",
                    Invariant::NeverTwoWriters
                ));
            }
            // one line for each thing seen, with how many samples saw it
            let mut seen: BTreeMap<String, usize> = BTreeMap::new();
            for why in s.seen.drain(..) {
                *seen.entry(why).or_default() += 1;
            }
            found.extend(
                seen.into_iter()
                    .map(|(why, n)| format!("{why} (in {n} samples)")),
            );
        }
        found
    }

    /// One sample of the nodes, judged now (the checks' own test).
    pub async fn two_writers_on_nodes(&self, label: &str) -> Result<Vec<String>> {
        let nodes = self.c.nodes().await?;
        Ok(two_nodes(&read_nodes(&self.c, &nodes).await?)
            .into_iter()
            .map(|why| format!("{:?} at {label}: {why}", Invariant::NeverTwoWriters))
            .collect())
    }

    /// Samples of the nodes taken and failed, of the cloud taken and
    /// failed.
    pub fn sample_counts(&self) -> (usize, usize, usize, usize) {
        self.samples.lock().map_or((0, 0, 0, 0), |s| {
            (
                s.nodes_read.len(),
                s.nodes_failed.len(),
                s.cloud_read,
                s.cloud_failed,
            )
        })
    }
}

/// The sampler's shared record.
pub(super) type SharedSamples = Arc<Mutex<Samples>>;

#[cfg(test)]
mod tests {
    use super::*;

    fn m(node: &str, driver: &str, handle: &str, device: &str) -> NodeMount {
        NodeMount {
            node: node.into(),
            target: format!("/var/lib/kubelet/{handle}"),
            driver: Some(driver.into()),
            volume_handle: Some(handle.into()),
            device: device.into(),
            pod_uid: None,
            pv: None,
        }
    }

    #[test]
    fn a_volume_or_device_on_two_nodes_is_seen() {
        let staged_and_published = [
            m("b", CINDER_DRIVER, "v1", "253:1"),
            m("b", CINDER_DRIVER, "v1", "253:1"),
            m("c", CINDER_DRIVER, "v2", "253:2"),
        ];
        assert!(two_nodes(&staged_and_published).is_empty());
        let found = two_nodes(&[
            m("b", CINDER_DRIVER, "v1", "253:1"),
            m("c", CINDER_DRIVER, "v1", "253:5"),
        ]);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].contains("v1"));
        let found = two_nodes(&[
            m("b", CINDER_DRIVER, "v1", "253:1"),
            m("c", "other", "x", "253:1"),
        ]);
        assert_eq!(found.len(), 1, "one device on two nodes: {found:?}");
        let shared = [
            m("b", "cephfs.manila.csi.openstack.org", "s", "0:55"),
            m("c", "cephfs.manila.csi.openstack.org", "s", "0:56"),
        ];
        assert!(
            two_nodes(&shared).is_empty(),
            "a share is many writers' by design"
        );
    }

    #[test]
    fn two_servers_holding_one_volume_are_seen_in_either_service() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert_eq!(two_servers("v", &s(&["a"]), &s(&["a"])), None);
        assert_eq!(
            two_servers("v", &s(&["a", "a"]), &s(&[])),
            None,
            "one server twice is one"
        );
        assert!(two_servers("v", &s(&["a", "b"]), &s(&["a"])).is_some());
        assert!(two_servers("v", &s(&["a"]), &s(&["a", "b"])).is_some());
    }

    #[test]
    fn a_window_without_samples_or_with_a_failed_one_is_seen() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let read: Vec<Instant> = (1..=30).map(|s| at(2 * s)).collect();
        assert!(unsampled(&read, &[], at(0), at(60)).is_empty());
        let found = unsampled(&read, &[(at(20), "no such node".into())], at(0), at(60));
        assert_eq!(found.len(), 1, "{found:?}");
        let holed: Vec<Instant> = read
            .iter()
            .copied()
            .filter(|t| *t < at(20) || *t > at(40))
            .collect();
        assert_eq!(unsampled(&holed, &[], at(0), at(60)).len(), 1);
        assert_eq!(
            unsampled(&read, &[], at(0), at(90)).len(),
            1,
            "the window's end counts"
        );
        assert_eq!(unsampled(&[], &[], at(0), at(5)).len(), 0, "a short window");
    }
}
