//! ceph-fuse daemons in pods of their own (`--mount-pods`), so that a
//! restart, an upgrade, a liveness kill or an out-of-memory kill of the
//! node plugin never breaks a mount a running pod uses: the FUSE daemon
//! lives in a pod of the plugin's image on the same node, one per staged
//! share, with its own memory limit.
//!
//! A mount pod is privileged on the host network (the share's network is
//! the host's) and mounts the kubelet directory with Bidirectional
//! propagation, like the node plugin; it runs `ceph-fuse -f` on the staging
//! path with the ceph.conf and keyring the plugin wrote into its state
//! directory (below the kubelet directory, root only). Its name is derived
//! from the node and the staging path, so that every call finds it again;
//! the plugin's service account may only create such pods on its own node
//! (deploy/manila/base/mount-pods-policy.yaml).
//!
//! A mount pod's controller is the mount pod template (the PodTemplate
//! deploy/ puts in the plugin's namespace, which the admission policy also
//! reads): `kubectl drain` refuses pods without a controller unless forced,
//! and forcing would kill ceph-fuse under the apps' last writes. Owned, it
//! is evicted like any pod; its preStop hook ([`crate::mount_pod_hook`])
//! keeps ceph-fuse running until no pod uses the share, for at most its
//! grace period, so that the apps' last writes go through and a drain
//! never waits forever on it. Not the Node: a Node object deleted and
//! registered again (`kubectl delete node`, a cloud controller's glitch)
//! would have the garbage collector delete every mount pod of the node at
//! once, under the running apps, and later ones would name a uid that no
//! longer exists. The template's uid is read for each new mount pod, so
//! that a template made again (a reinstall) is followed; deleting it (an
//! uninstall) ends the mount pods, as it ends the plugin.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use csi_common::{DriverError, DriverResult};
use kube_api::{Client, Created, Pod};

/// Labels every mount pod carries (and the admission policy checks).
pub const COMPONENT_LABEL: &str = "app.kubernetes.io/component";
pub const COMPONENT: &str = "ceph-fuse-mount";
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
pub const VOLUME_ANNOTATION: &str = "manila.csi.openstack.org/volume-id";
pub const STAGING_ANNOTATION: &str = "manila.csi.openstack.org/staging-path";
/// The plugin's binary in its image: a mount pod's preStop runs it.
pub const BINARY_IN_IMAGE: &str = "/usr/local/bin/manila-csi-plugin";
/// How long an evicted mount pod may wait for the apps using its share
/// (its preStop, [`crate::mount_pod_hook`]) before ceph-fuse is stopped.
pub const GRACE_SECONDS: u32 = 120;

#[derive(Debug, Clone)]
pub struct MountPodOptions {
    /// This node's Kubernetes name (the downward API's spec.nodeName).
    pub node_name: String,
    pub namespace: String,
    /// The plugin's own image (it holds ceph-fuse).
    pub image: String,
    pub image_pull_policy: Option<String>,
    /// The kubelet directory, mounted into the pod at the same path: the
    /// staging paths and the state directory lie below it.
    pub kubelet_dir: PathBuf,
    /// The CSI driver name: mount pods are labelled managed by it.
    pub driver_name: String,
    /// Each mount pod's memory limit (ceph-fuse's caches live there).
    pub memory_limit: String,
}

/// The labels of the mount pod template (deploy/manila's
/// mount-pod-template.yaml, whose image, kubelet directory and name the
/// admission policy holds mount pods to).
pub const TEMPLATE_SELECTOR: &str =
    "app.kubernetes.io/name=manila-csi-plugin,app.kubernetes.io/component=ceph-fuse-mount-template";

/// The object a mount pod names as its controller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    pub name: String,
    pub uid: String,
}

#[derive(Debug)]
pub struct MountPods {
    kube: Client,
    opts: MountPodOptions,
}

fn api(what: &str, e: kube_api::KubeError) -> DriverError {
    match e.status() {
        Some(403) => DriverError::FailedPrecondition(format!(
            "{what}: {e} (the node plugin's service account needs pods create/get/list/delete in its namespace)"
        )),
        Some(s) if s >= 500 || s == 429 => DriverError::Unavailable(format!("{what}: {e}")),
        None => DriverError::Unavailable(format!("{what}: {e}")),
        _ => DriverError::Internal(format!("{what}: {e}")),
    }
}

/// The one template among those found in `ns`.
fn the_template(ns: &str, found: &[kube_api::ObjectMeta]) -> DriverResult<Owner> {
    match found {
        [t] if !t.uid.is_empty() => Ok(Owner {
            name: t.name.clone(),
            uid: t.uid.clone(),
        }),
        [] | [_] => Err(DriverError::FailedPrecondition(format!(
            "no mount pod template in namespace {ns} (a PodTemplate labelled {TEMPLATE_SELECTOR}: \
             deploy/manila's mount-pod-template.yaml); mount pods are owned by it, and the admission policy refuses any other owner"
        ))),
        many => Err(DriverError::FailedPrecondition(format!(
            "{} mount pod templates in namespace {ns} ({}): exactly one may carry the labels {TEMPLATE_SELECTOR}",
            many.len(),
            many.iter()
                .map(|t| t.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

impl MountPods {
    pub fn new(kube: Client, opts: MountPodOptions) -> Self {
        Self { kube, opts }
    }

    /// The image and pull policy of the plugin's own container, read from
    /// its pod (`POD_NAME`): mount pods run exactly what the plugin runs.
    pub async fn own_image(
        kube: &Client,
        namespace: &str,
        pod_name: &str,
    ) -> Result<(String, Option<String>), String> {
        let pod = kube
            .get_pod(namespace, pod_name)
            .await
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("pod {namespace}/{pod_name} does not exist"))?;
        let c = pod
            .spec
            .containers
            .iter()
            .find(|c| c.name == "manila-csi-plugin")
            .or_else(|| {
                pod.spec
                    .containers
                    .iter()
                    .find(|c| c.image.contains("manila-csi-plugin"))
            })
            .ok_or_else(|| {
                format!(
                    "pod {namespace}/{pod_name} has no container manila-csi-plugin: give --mount-pod-image"
                )
            })?;
        Ok((c.image.clone(), c.image_pull_policy.clone()))
    }

    pub fn options(&self) -> &MountPodOptions {
        &self.opts
    }

    /// The mount pod of a staging path on this node.
    pub fn name_for(&self, staging: &Path) -> String {
        let d = ring::digest::digest(
            &ring::digest::SHA256,
            format!("{}\0{}", self.opts.node_name, staging.display()).as_bytes(),
        );
        let hex: String = d.as_ref()[..10]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        format!("ceph-fuse-{hex}")
    }

    fn label_selector(&self) -> String {
        format!(
            "{COMPONENT_LABEL}={COMPONENT},{MANAGED_BY_LABEL}={}",
            self.opts.driver_name
        )
    }

    /// The mount pod template of the plugin's namespace: the mount pods'
    /// controller. None there, or more than one, is the deployment's fault
    /// (the admission policy refuses every mount pod then too).
    pub async fn owner(&self) -> DriverResult<Owner> {
        let ns = &self.opts.namespace;
        let found = self
            .kube
            .list_pod_templates(ns, TEMPLATE_SELECTOR)
            .await
            .map_err(|e| match e.status() {
                Some(403) => DriverError::FailedPrecondition(format!(
                    "reading the mount pod template: {e} (the node plugin's service account needs podtemplates get/list in its namespace)"
                )),
                _ => api("reading the mount pod template", e),
            })?;
        the_template(ns, &found)
    }

    /// The pod that runs `ceph-fuse -f <args>`, owned by `owner`.
    pub fn spec(
        &self,
        name: &str,
        volume_id: &str,
        staging: &Path,
        args: &[String],
        owner: &Owner,
    ) -> serde_json::Value {
        let kubelet = self.opts.kubelet_dir.to_string_lossy();
        let mut command = vec!["ceph-fuse".to_string(), "-f".to_string()];
        command.extend(args.iter().cloned());
        let mut container = serde_json::json!({
            "name": "ceph-fuse",
            "image": self.opts.image,
            "command": command,
            // ceph-fuse's last words, when it fails to mount
            "terminationMessagePolicy": "FallbackToLogsOnError",
            // evicted (a drain), it outlives the apps that use its share
            "lifecycle": {"preStop": {"exec": {"command": [
                BINARY_IN_IMAGE,
                crate::mount_pod_hook::SUBCOMMAND,
                format!("--staging-path={}", staging.display()),
            ]}}},
            "securityContext": {"privileged": true, "readOnlyRootFilesystem": true},
            "resources": {
                "requests": {"cpu": "10m", "memory": "32Mi"},
                "limits": {"memory": self.opts.memory_limit},
            },
            "volumeMounts": [
                {"name": "kubelet-dir", "mountPath": kubelet, "mountPropagation": "Bidirectional"},
                {"name": "fuse", "mountPath": "/dev/fuse"},
            ],
        });
        if let Some(p) = &self.opts.image_pull_policy {
            container["imagePullPolicy"] = p.clone().into();
        }
        serde_json::json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": self.opts.namespace,
                "ownerReferences": [{
                    "apiVersion": "v1",
                    "kind": "PodTemplate",
                    "name": owner.name,
                    "uid": owner.uid,
                    "controller": true,
                }],
                "labels": {
                    COMPONENT_LABEL: COMPONENT,
                    MANAGED_BY_LABEL: self.opts.driver_name,
                    "app.kubernetes.io/name": "manila-csi-plugin",
                },
                "annotations": {
                    VOLUME_ANNOTATION: volume_id,
                    STAGING_ANNOTATION: staging.to_string_lossy(),
                },
            },
            "spec": {
                "nodeName": self.opts.node_name,
                "hostNetwork": true,
                "dnsPolicy": "ClusterFirstWithHostNet",
                "restartPolicy": "Never",
                "priorityClassName": "system-node-critical",
                "tolerations": [{"operator": "Exists"}],
                "automountServiceAccountToken": false,
                "enableServiceLinks": false,
                "terminationGracePeriodSeconds": GRACE_SECONDS,
                "containers": [container],
                "volumes": [
                    {"name": "kubelet-dir", "hostPath": {"path": kubelet, "type": "Directory"}},
                    {"name": "fuse", "hostPath": {"path": "/dev/fuse", "type": "CharDevice"}},
                ],
            },
        })
    }

    /// Creates the mount pod of `staging`, or keeps the one that runs
    /// already; a finished one (its daemon gone) is replaced.
    pub async fn ensure(
        &self,
        volume_id: &str,
        staging: &Path,
        args: &[String],
        deadline: Instant,
    ) -> DriverResult<String> {
        let ns = &self.opts.namespace;
        let name = self.name_for(staging);
        let owner = self.owner().await?;
        let spec = self.spec(&name, volume_id, staging, args, &owner);
        loop {
            match self.kube.create_pod(ns, &spec).await {
                Ok(Created::New(_)) => {
                    tracing::info!(volume_id, pod = %name, "mount pod created");
                    return Ok(name);
                }
                Ok(Created::AlreadyExists) => {}
                Err(e) => return Err(api(&format!("creating mount pod {name}"), e)),
            }
            let Some(pod) = self
                .kube
                .get_pod(ns, &name)
                .await
                .map_err(|e| api(&format!("reading mount pod {name}"), e))?
            else {
                continue;
            };
            // a pod of that name that is not the one this plugin makes
            // (another owner, command, image, node or share) is never
            // taken for this share's daemon
            if let Some(why) = not_made_here(&pod, &spec) {
                return Err(DriverError::FailedPrecondition(format!(
                    "pod {name} holds this share's mount pod name but is not this plugin's mount pod ({why}): left alone; delete it if it is not yours"
                )));
            }
            if !pod.finished() && pod.metadata.deletion_timestamp.is_none() {
                return Ok(name);
            }
            // a daemon that ended (a node reboot, a crash): a new pod
            tracing::info!(volume_id, pod = %name, phase = %pod.status.phase, "mount pod ended; replacing it");
            self.delete_and_wait(&pod, Some(0), deadline).await?;
        }
    }

    /// The mount pod, if there is one.
    pub async fn get(&self, name: &str) -> DriverResult<Option<Pod>> {
        self.kube
            .get_pod(&self.opts.namespace, name)
            .await
            .map_err(|e| api(&format!("reading mount pod {name}"), e))
    }

    /// Ends a mount pod and waits until it is gone (its daemon exits
    /// with it). `grace` 0 kills at once (a hung daemon).
    pub async fn end(&self, name: &str, grace: Option<u32>, deadline: Instant) -> DriverResult<()> {
        let Some(pod) = self.get(name).await? else {
            return Ok(());
        };
        self.delete_and_wait(&pod, grace, deadline).await
    }

    async fn delete_and_wait(
        &self,
        pod: &Pod,
        grace: Option<u32>,
        deadline: Instant,
    ) -> DriverResult<()> {
        let (ns, name) = (&self.opts.namespace, &pod.metadata.name);
        self.kube
            .delete_pod(ns, name, grace, Some(&pod.metadata.uid))
            .await
            .or_else(|e| match e.status() {
                // a newer pod of that name: not ours to delete
                Some(409) => Ok(()),
                _ => Err(e),
            })
            .map_err(|e| api(&format!("deleting mount pod {name}"), e))?;
        loop {
            match self.get(name).await? {
                None => return Ok(()),
                Some(p) if p.metadata.uid != pod.metadata.uid => return Ok(()),
                Some(_) => {}
            }
            if Instant::now() >= deadline {
                return Err(DriverError::DeadlineExceeded(format!(
                    "mount pod {name} is still being deleted"
                )));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Mount pods of this driver on this node.
    pub async fn on_this_node(&self) -> DriverResult<Vec<Pod>> {
        self.kube
            .list_pods(
                &self.opts.namespace,
                &self.label_selector(),
                &format!("spec.nodeName={}", self.opts.node_name),
            )
            .await
            .map_err(|e| api("listing mount pods", e))
    }
}

/// Why `pod` is not a mount pod this plugin made for what `spec`
/// describes: its controller must be the mount pod template (by uid),
/// and its node, its labels and annotations of a mount pod (its volume and
/// staging path), and its daemon (`ceph-fuse -f` on that staging path)
/// this plugin's. Its image and other arguments are not compared: a mount
/// pod made by the version before an upgrade is taken over as it runs.
/// (A pod made by a template remade since has an owner of another uid:
/// the garbage collector deletes it, and a new one follows.)
fn not_made_here(pod: &Pod, spec: &serde_json::Value) -> Option<String> {
    let meta = &spec["metadata"];
    let owner_uid = meta["ownerReferences"][0]["uid"]
        .as_str()
        .unwrap_or_default();
    let controlled =
        pod.metadata.owner_references.len() == 1
            && pod.metadata.owner_references.iter().all(|o| {
                o.kind == "PodTemplate" && o.uid == owner_uid && o.controller == Some(true)
            });
    if !controlled {
        return Some("its controller is not the mount pod template".into());
    }
    if pod.spec.node_name != spec["spec"]["nodeName"].as_str().unwrap_or_default() {
        return Some(format!("it is of node {:?}", pod.spec.node_name));
    }
    for (key, theirs) in [
        ("labels", &pod.metadata.labels),
        ("annotations", &pod.metadata.annotations),
    ] {
        let ours = meta[key].as_object().into_iter().flatten();
        if let Some((k, _)) = ours
            .filter(|(k, _)| key == "annotations" || *k != "app.kubernetes.io/name")
            .find(|(k, v)| theirs.get(*k).map(String::as_str) != v.as_str())
        {
            return Some(format!("its {key} differ at {k}"));
        }
    }
    let [c] = pod.spec.containers.as_slice() else {
        return Some(format!("it has {} containers", pod.spec.containers.len()));
    };
    let staging = meta["annotations"][STAGING_ANNOTATION]
        .as_str()
        .unwrap_or_default();
    let daemon = c.command.len() > 2
        && c.command[..2] == ["ceph-fuse", "-f"]
        && c.command.iter().any(|a| a == staging);
    if !daemon {
        return Some(format!("it runs {:?}", c.command));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pods() -> MountPods {
        let kube = Client::new(
            "http://127.0.0.1:1/".parse().unwrap(),
            None,
            kube_api::Token::Fixed("t".into()),
        )
        .unwrap();
        MountPods::new(
            kube,
            MountPodOptions {
                node_name: "node-a".into(),
                namespace: "openstack-system".into(),
                image: "registry.example.com/manila-csi-plugin:1".into(),
                image_pull_policy: Some("IfNotPresent".into()),
                kubelet_dir: "/var/lib/kubelet".into(),
                driver_name: "cephfs.manila.csi.openstack.org".into(),
                memory_limit: "512Mi".into(),
            },
        )
    }

    #[test]
    fn only_a_pod_made_as_this_plugin_makes_it_is_taken_for_a_mount_pod() {
        let p = pods();
        let s = Path::new("/var/lib/kubelet/plugins/kubernetes.io/csi/x/globalmount");
        let owner = Owner {
            name: "csi-manila-mount-pod".into(),
            uid: "uid-of-the-template".into(),
        };
        let args = [
            "--id".to_string(),
            "alice".into(),
            s.to_string_lossy().into(),
        ];
        let spec = p.spec("ceph-fuse-1", "vol-1", s, &args, &owner);
        // as the API answers with it
        let mut answer = spec.clone();
        answer["metadata"]["uid"] = "uid-of-the-pod".into();
        answer["status"] = serde_json::json!({"phase": "Running"});
        let ours: Pod = serde_json::from_value(answer.clone()).unwrap();
        assert_eq!(not_made_here(&ours, &spec), None);
        // the version before an upgrade's, of another image
        let mut older = answer.clone();
        older["spec"]["containers"][0]["image"] = "manila-csi-plugin:0.0.9".into();
        let older: Pod = serde_json::from_value(older).unwrap();
        assert_eq!(
            not_made_here(&older, &spec),
            None,
            "taken over across an upgrade"
        );
        type Change = fn(&mut serde_json::Value);
        let impostors: &[(&str, Change)] = &[
            ("no owner", |a| {
                a["metadata"]["ownerReferences"] = serde_json::json!([])
            }),
            ("another template", |a| {
                a["metadata"]["ownerReferences"][0]["uid"] = "other".into()
            }),
            ("another node", |a| a["spec"]["nodeName"] = "node-b".into()),
            ("another component", |a| {
                a["metadata"]["labels"][COMPONENT_LABEL] = "kube-dns".into()
            }),
            ("another share", |a| {
                a["metadata"]["annotations"][STAGING_ANNOTATION] = "/var/lib/kubelet/y".into()
            }),
            ("two containers", |a| {
                let c = a["spec"]["containers"][0].clone();
                a["spec"]["containers"] = serde_json::json!([c.clone(), c]);
            }),
            ("another command", |a| {
                a["spec"]["containers"][0]["command"] = serde_json::json!(["sleep", "infinity"])
            }),
        ];
        for (what, change) in impostors {
            let mut a = answer.clone();
            change(&mut a);
            let pod: Pod = serde_json::from_value(a).unwrap();
            assert!(
                not_made_here(&pod, &spec).is_some(),
                "{what} taken for ours"
            );
        }
    }

    #[test]
    fn mount_pods_are_named_per_node_and_staging_path() {
        let p = pods();
        let s = Path::new("/var/lib/kubelet/plugins/kubernetes.io/csi/x/globalmount");
        let a = p.name_for(s);
        assert_eq!(a, p.name_for(s), "found again");
        assert!(a.starts_with("ceph-fuse-") && a.len() <= 63, "{a}");
        assert_ne!(
            a,
            p.name_for(Path::new(
                "/var/lib/kubelet/plugins/kubernetes.io/csi/y/globalmount"
            ))
        );
        let mut other = pods();
        other.opts.node_name = "node-b".into();
        assert_ne!(a, other.name_for(s), "the same PV staged on another node");
    }

    #[test]
    fn the_pod_runs_ceph_fuse_in_the_foreground_on_this_node_only() {
        let p = pods();
        let s = Path::new("/var/lib/kubelet/plugins/kubernetes.io/csi/x/globalmount");
        let owner = Owner {
            name: "csi-manila-mount-pod".into(),
            uid: "uid-of-the-template".into(),
        };
        let spec = p.spec(
            "ceph-fuse-1",
            "vol-1",
            s,
            &["--id".into(), "alice".into(), s.to_string_lossy().into()],
            &owner,
        );
        let c = &spec["spec"]["containers"][0];
        assert_eq!(c["command"][0], "ceph-fuse");
        assert_eq!(
            c["command"][1], "-f",
            "kept in the foreground: the container is the daemon"
        );
        assert_eq!(spec["spec"]["nodeName"], "node-a");
        assert_eq!(spec["spec"]["restartPolicy"], "Never");
        assert_eq!(spec["spec"]["automountServiceAccountToken"], false);
        assert_eq!(c["volumeMounts"][0]["mountPropagation"], "Bidirectional");
        assert_eq!(c["resources"]["limits"]["memory"], "512Mi");
        assert_eq!(spec["metadata"]["labels"][COMPONENT_LABEL], COMPONENT);
        assert_eq!(spec["metadata"]["annotations"][VOLUME_ANNOTATION], "vol-1");
        // the template is its controller (drained like any pod), not the
        // node (whose deletion would take it under the apps)
        let o = &spec["metadata"]["ownerReferences"];
        assert_eq!(o.as_array().map(Vec::len), Some(1));
        assert_eq!(
            (
                &o[0]["apiVersion"],
                &o[0]["kind"],
                &o[0]["name"],
                &o[0]["uid"],
                &o[0]["controller"]
            ),
            (
                &"v1".into(),
                &"PodTemplate".into(),
                &"csi-manila-mount-pod".into(),
                &"uid-of-the-template".into(),
                &true.into()
            )
        );
        let text = spec.to_string();
        assert!(
            !text.contains("key ="),
            "no key in the pod: it reads the keyring file"
        );
    }

    #[test]
    fn exactly_one_template_owns_the_mount_pods() {
        let meta = |name: &str, uid: &str| kube_api::ObjectMeta {
            name: name.into(),
            uid: uid.into(),
            ..Default::default()
        };
        assert_eq!(
            the_template("ns", &[meta("t", "u1")]).unwrap(),
            Owner {
                name: "t".into(),
                uid: "u1".into()
            }
        );
        for found in [vec![], vec![meta("t", "")]] {
            let e = the_template("ns", &found).unwrap_err();
            assert!(
                matches!(&e, DriverError::FailedPrecondition(m) if m.contains("no mount pod template in namespace ns")),
                "{e:?}"
            );
        }
        let e = the_template("ns", &[meta("t", "u1"), meta("u", "u2")]).unwrap_err();
        assert!(
            matches!(&e, DriverError::FailedPrecondition(m) if m.contains("2 mount pod templates") && m.contains("t, u")),
            "{e:?}"
        );
    }
}
