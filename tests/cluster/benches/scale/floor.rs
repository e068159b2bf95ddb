//! The floor under a move (issue 38, item 5): a second Cinder driver of
//! ours, `floor.cinder.csi.openstack.org`, deployed beside the real one
//! from the same manifests (its controller and node plugins, the same
//! images and sidecar settings), whose cloud is an OpenStack emulator in
//! this process that answers at once: every status transition immediate,
//! an attached volume a loop device linked in the node's by-id folder the
//! moment Nova's attach is answered. The emulator's servers carry the
//! nodes' own server ids, which the node plugins read from the real
//! metadata service. The same move through it is the time Kubernetes and
//! our plugins take when OpenStack takes none: what our driver adds above
//! it is compared with OpenStack's own time for the same work.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use cluster_tests::{Cluster, SUITE_NAMESPACE};
use openstack_emulator::{CallRecord, Delays, Emulator, EmulatorConfig, HypervisorConfig};
use serde_json::{Value, json};

pub(super) const FLOOR_DRIVER: &str = "floor.cinder.csi.openstack.org";
pub(super) const FLOOR_CLASS: &str = "floor-cinder";
const REAL_DRIVER: &str = "cinder.csi.openstack.org";
const CONTROLLER: &str = "csi-cinder-controllerplugin";
const NODE: &str = "csi-cinder-nodeplugin";
const SECRET: &str = "floor-cloud-config";
/// The real driver's ports on the host network (liveness probes,
/// metrics, the pre-stop hook): the floor's are these plus 10000.
const PORTS: [u16; 5] = [9808, 9809, 9828, 9829, 9849];
const MINUTE: Duration = Duration::from_secs(60);

/// The floor driver's apps, as their pods are labelled.
pub(super) fn floor_app(app: &str) -> String {
    format!("floor-{app}")
}

pub(super) struct Floor {
    emulator: Emulator,
    _scratch: tempfile::TempDir,
}

impl Floor {
    /// Starts the emulator and deploys the floor driver; None (said why)
    /// where the real driver's manifests are not in the cluster.
    pub(super) async fn deploy(c: &Cluster) -> Option<Floor> {
        let zones = c.node_zones().await.unwrap();
        let scratch = tempfile::tempdir().unwrap();
        let emulator = Emulator::start(EmulatorConfig {
            availability_zones: zones
                .values()
                .cloned()
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect(),
            delays: Delays::uniform(0),
            hypervisor: Some(HypervisorConfig {
                by_id_dir: scratch.path().join("by-id"),
                also_link_in: by_id_dirs(c, &zones),
                image_dir: scratch.path().join("images"),
            }),
            ..Default::default()
        })
        .await
        .unwrap();
        let control = emulator.control();
        for (node, zone) in &zones {
            let server = c.server_of(node).unwrap();
            assert!(
                control.create_server_as(&server, "demo", node, zone, 1),
                "the emulator's server {server} for {node}"
            );
        }
        let floor = Floor {
            emulator,
            _scratch: scratch,
        };

        let secret = json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": SECRET, "namespace": SUITE_NAMESPACE},
            "stringData": {"cloud.conf": floor.emulator.member_cloud_conf()},
        });
        c.apply(&secret.to_string()).await.unwrap();
        for (kind, name, ns) in [
            ("csidriver", REAL_DRIVER, None),
            ("deployment", CONTROLLER, Some(SUITE_NAMESPACE)),
            ("daemonset", NODE, Some(SUITE_NAMESPACE)),
        ] {
            let Some(real) = c.get(kind, name, ns).await.unwrap() else {
                println!("the floor: no {kind} {name} in the cluster, nothing measured");
                floor.remove(c).await;
                return None;
            };
            c.apply(&floor_copy(real).to_string()).await.unwrap();
        }
        c.apply(&format!(
            "apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata:\n  name: {FLOOR_CLASS}\nprovisioner: {FLOOR_DRIVER}\nreclaimPolicy: Delete\nvolumeBindingMode: WaitForFirstConsumer\n"
        ))
        .await
        .unwrap();
        floor.wait_ready(c, zones.len()).await;
        Some(floor)
    }

    /// Until the floor's controller is ready and its node plugin is
    /// registered with every node's kubelet.
    async fn wait_ready(&self, c: &Cluster, nodes: usize) {
        c.wait_for("the floor driver ready", 3 * MINUTE, || async {
            let controller = c
                .get("deployment", &floor_app(CONTROLLER), Some(SUITE_NAMESPACE))
                .await?;
            let node = c
                .get("daemonset", &floor_app(NODE), Some(SUITE_NAMESPACE))
                .await?;
            let registered = c
                .list("csinodes", &[])
                .await?
                .iter()
                .filter(|n| {
                    n["spec"]["drivers"]
                        .as_array()
                        .is_some_and(|d| d.iter().any(|d| d["name"] == FLOOR_DRIVER))
                })
                .count();
            let ready = |o: &Option<Value>, field: &str| {
                o.as_ref()
                    .and_then(|o| o["status"][field].as_u64())
                    .unwrap_or(0)
            };
            Ok(
                if ready(&controller, "readyReplicas") >= 1
                    && ready(&node, "numberReady") as usize >= nodes
                    && registered >= nodes
                {
                    Ok(())
                } else {
                    Err(format!(
                        "controller ready: {}, node plugins ready: {}, registered on {registered} nodes",
                        ready(&controller, "readyReplicas"),
                        ready(&node, "numberReady")
                    ))
                },
            )
        })
        .await
        .unwrap();
    }

    /// The emulator's calls since the last [`Floor::clear_calls`], each
    /// with when it was answered and how long it took.
    pub(super) fn calls(&self) -> Vec<CallRecord> {
        self.emulator.control().calls()
    }

    pub(super) fn clear_calls(&self) {
        self.emulator.control().clear_calls();
    }

    /// Takes the floor driver out of the cluster (its volumes must be gone:
    /// the moves' namespaces closed), then stops the emulator, which
    /// detaches its loop devices and removes their links.
    pub(super) async fn remove(self, c: &Cluster) {
        c.delete("storageclass", FLOOR_CLASS, None).await.unwrap();
        for (kind, name) in [("deployment", CONTROLLER), ("daemonset", NODE)] {
            c.delete(kind, &floor_app(name), Some(SUITE_NAMESPACE))
                .await
                .unwrap();
        }
        c.wait_for("the floor driver's pods gone", 3 * MINUTE, || async {
            let left = c
                .list("pods", &["-n", SUITE_NAMESPACE])
                .await?
                .iter()
                .filter(|p| {
                    p["metadata"]["labels"]["app"]
                        .as_str()
                        .is_some_and(|a| a.starts_with("floor-"))
                })
                .count();
            Ok(if left == 0 {
                Ok(())
            } else {
                Err(format!("{left} pods"))
            })
        })
        .await
        .unwrap();
        c.delete("csidriver", FLOOR_DRIVER, None).await.unwrap();
        c.delete("secret", SECRET, Some(SUITE_NAMESPACE))
            .await
            .unwrap();
        self.emulator.shutdown().await;
    }
}

/// Where each node's plugins look for their disks: node A's is the
/// host's /dev/disk/by-id, the others' the folders the test cloud's
/// hypervisor agent links their servers' disks in.
fn by_id_dirs(c: &Cluster, zones: &BTreeMap<String, String>) -> Vec<PathBuf> {
    let path = c.cloud_dir.join("node-server-names.json");
    let servers: Value = std::fs::read_to_string(&path)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(Value::Null);
    let mut dirs = vec![PathBuf::from("/dev/disk/by-id")];
    for node in zones.keys().filter(|n| **n != c.node) {
        if let Some(dir) = servers[node]["by_id_dir"].as_str() {
            dirs.push(PathBuf::from(dir));
        }
    }
    dirs
}

/// A copy of one of the real driver's objects for the floor driver: its
/// own name and labels, driver name, kubelet paths, host ports and
/// controller credentials; nothing else changed.
fn floor_copy(real: Value) -> Value {
    let kind = real["kind"].as_str().unwrap_or_default().to_string();
    let name = real["metadata"]["name"].as_str().unwrap_or_default();
    let mut copy = real.clone();
    copy["metadata"] = json!({
        "name": if kind == "CSIDriver" { FLOOR_DRIVER.to_string() } else { floor_app(name) },
    });
    if real["metadata"]["labels"].is_object() {
        copy["metadata"]["labels"] = real["metadata"]["labels"].clone();
    }
    if let Some(ns) = real["metadata"]["namespace"].as_str() {
        copy["metadata"]["namespace"] = json!(ns);
    }
    if let Some(o) = copy.as_object_mut() {
        o.remove("status");
    }
    rewrite(&mut copy, None);
    // (pointer_mut: indexing would add the path to a CSIDriver)
    if let Some(containers) = copy
        .pointer_mut("/spec/template/spec/containers")
        .and_then(Value::as_array_mut)
    {
        for plugin in containers
            .iter_mut()
            .filter(|c| c["name"] == "cinder-csi-plugin")
        {
            if let Some(args) = plugin["args"].as_array_mut() {
                args.push(json!(format!("--driver-name={FLOOR_DRIVER}")));
            }
        }
    }
    copy
}

/// The rewriting of [`floor_copy`], through every string and number.
fn rewrite(v: &mut Value, key: Option<&str>) {
    match v {
        Value::String(s) => {
            let mut t = s
                .replace(&format!("/{REAL_DRIVER}"), &format!("/{FLOOR_DRIVER}"))
                .replace(&format!("={REAL_DRIVER}"), &format!("={FLOOR_DRIVER}"));
            for app in [CONTROLLER, NODE] {
                if t == app {
                    t = floor_app(app);
                }
            }
            for port in PORTS {
                let (from, to) = (format!(":{port}"), format!(":{}", port + 10000));
                if t.ends_with(&from) {
                    t = format!("{}{to}", &t[..t.len() - from.len()]);
                }
            }
            if key == Some("secretName") && t == "cloud-config" {
                t = SECRET.to_string();
            }
            *s = t;
        }
        Value::Number(n) if matches!(key, Some("containerPort" | "port" | "hostPort")) => {
            if let Some(p) = n
                .as_u64()
                .filter(|p| PORTS.iter().any(|q| u64::from(*q) == *p))
            {
                *v = json!(p + 10000);
            }
        }
        Value::Array(items) => {
            for item in items {
                rewrite(item, key);
            }
        }
        Value::Object(fields) => {
            for (k, item) in fields.iter_mut() {
                rewrite(item, Some(k));
            }
        }
        _ => {}
    }
}
