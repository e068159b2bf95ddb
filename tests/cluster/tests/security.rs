//! What a stolen plugin token is worth, tried with the token itself: the
//! one kubelet gave the plugin's pod (bound to it, so the apiserver knows
//! its node), never the admin's impersonation, which carries no node and
//! would refuse the plugin's own requests too.
//!
//! Needs `tests/cluster/cluster.py up`; run with `--ignored
//! --test-threads=1`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::time::Duration;

use cluster_tests::{APP_IMAGE, Cluster, PodOptions, SUITE_NAMESPACE, claim, pod};
use serde_json::{Value, json};

const MINUTE: Duration = Duration::from_secs(60);

fn name(v: &Value) -> String {
    v["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// A pod of the suite on node A whose name starts with `prefix`.
async fn suite_pod_on_a(c: &Cluster, prefix: &str) -> Value {
    c.list("pods", &["-n", SUITE_NAMESPACE])
        .await
        .unwrap()
        .into_iter()
        .find(|p| name(p).starts_with(prefix) && p["spec"]["nodeName"] == c.node.as_str())
        .unwrap_or_else(|| panic!("no pod {prefix}* on {}", c.node))
}

/// `kubectl create --dry-run=server` of `pod` in the suite's namespace as
/// the holder of `token` (None: the administrator): Ok, or the
/// apiserver's refusal.
async fn create_as(c: &Cluster, token: Option<&str>, pod: &Value) -> Result<(), String> {
    let args = [
        "create",
        "--dry-run=server",
        "-n",
        SUITE_NAMESPACE,
        "-f",
        "-",
    ];
    let input = Some(pod.to_string());
    match token {
        Some(t) => c.kubectl_with_token(t, &args, input.as_deref()).await,
        None => c.kubectl_with_input(&args, input.as_deref()).await,
    }
    .map(|_| ())
    .map_err(|e| e.to_string())
}

/// A mount pod as the plugin made it, under another name: what the API
/// holds of it, less what the API itself writes (uid, status...), so that
/// it can be created again.
fn replay_of(mount_pod: &Value) -> Value {
    let m = &mount_pod["metadata"];
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "ceph-fuse-replay",
            "labels": m["labels"],
            "annotations": m["annotations"],
            "ownerReferences": m["ownerReferences"],
        },
        "spec": mount_pod["spec"],
    })
}

#[tokio::test]
#[ignore = "needs the cluster tier: tests/cluster/cluster.py up (after tests/openstack/cloud.py up all)"]
async fn a_cephfs_node_plugins_token_starts_real_mount_pods_on_its_node_and_nothing_else() {
    let c = Cluster::from_env().unwrap();
    let plugin = suite_pod_on_a(&c, "csi-manila-cephfs-nodeplugin").await;
    let token = c.bound_token(&plugin).unwrap();

    // a real mount pod: a share staged for a pod on A
    let ns = c.namespace("mountpod").await.unwrap();
    let n = ns.name.clone();
    c.apply_in(
        &n,
        &[
            claim("share", "csi-manila-cephfs", "1Gi", "ReadWriteMany", false),
            pod("app", "share", "exec sleep 3600", PodOptions::default()),
        ]
        .join("---\n"),
    )
    .await
    .unwrap();
    c.wait_running(&n, "app", 3 * MINUTE).await.unwrap();
    let pv = c.get("pvc", "share", Some(&n)).await.unwrap().unwrap()["spec"]["volumeName"]
        .as_str()
        .unwrap()
        .to_string();
    let volume_id = c.get("pv", &pv, None).await.unwrap().unwrap()["spec"]["csi"]["volumeHandle"]
        .as_str()
        .unwrap()
        .to_string();
    let mount_pod = c
        .mount_pods()
        .await
        .unwrap()
        .into_iter()
        .find(|p| {
            p["metadata"]["annotations"]["manila.csi.openstack.org/volume-id"] == volume_id.as_str()
        })
        .expect("the share's mount pod");
    let real = replay_of(&mount_pod);
    create_as(&c, Some(&token), &real)
        .await
        .unwrap_or_else(|e| panic!("the plugin's own mount pod, made again, is refused: {e}"));

    // every way out, each refused with what it breaks
    type Change = fn(&mut Value);
    let escapes: &[(&str, Change, &str)] = &[
        (
            "the Secret of the controllers' credentials as its environment",
            |p| {
                p["spec"]["containers"][0]["envFrom"] =
                    json!([{"secretRef": {"name": "cloud-config"}}])
            },
            "container sets no envFrom",
        ),
        (
            "one key of the CephFS Secret as a variable",
            |p| {
                p["spec"]["containers"][0]["env"] = json!([{"name": "P", "valueFrom": {
                    "secretKeyRef": {"name": "csi-manila-secrets", "key": "os-password"}}}])
            },
            "container sets no env",
        ),
        (
            "an image of its own",
            |p| p["spec"]["containers"][0]["image"] = json!(APP_IMAGE),
            "runs the image of the mount pod template",
        ),
        (
            "a shell instead of ceph-fuse",
            |p| p["spec"]["containers"][0]["command"] = json!(["sh", "-c", "cat /etc/x"]),
            "runs ceph-fuse alone",
        ),
        (
            "arguments beside the command",
            |p| p["spec"]["containers"][0]["args"] = json!(["--help"]),
            "container sets no args",
        ),
        (
            "a hook that runs a shell",
            |p| {
                p["spec"]["containers"][0]["lifecycle"] =
                    json!({"postStart": {"exec": {"command": ["sh"]}}})
            },
            "one hook is its preStop waiting for its share's users",
        ),
        (
            "a preStop hook of its own",
            |p| {
                p["spec"]["containers"][0]["lifecycle"]["preStop"]["exec"]["command"] =
                    json!(["sh", "-c", "cat /var/lib/kubelet/pki/*"])
            },
            "one hook is its preStop waiting for its share's users",
        ),
        (
            "the plugin's hook beside a hook of its own",
            |p| {
                p["spec"]["containers"][0]["lifecycle"]["postStart"] =
                    json!({"exec": {"command": ["sh"]}})
            },
            "one hook is its preStop waiting for its share's users",
        ),
        (
            "a second container",
            |p| {
                let again = p["spec"]["containers"][0].clone();
                let mut again = again;
                again["name"] = json!("second");
                p["spec"]["containers"].as_array_mut().unwrap().push(again);
            },
            "has one container",
        ),
        (
            "an init container",
            |p| {
                p["spec"]["initContainers"] =
                    json!([{"name": "i", "image": APP_IMAGE, "command": ["true"]}])
            },
            "sets no spec.initContainers",
        ),
        (
            "the host's process namespace",
            |p| p["spec"]["hostPID"] = json!(true),
            "sets no spec.hostPID",
        ),
        (
            "a pull secret of the namespace",
            |p| p["spec"]["imagePullSecrets"] = json!([{"name": "cloud-config"}]),
            "sets no spec.imagePullSecrets",
        ),
        (
            "another service account",
            |p| {
                p["spec"]["serviceAccountName"] = json!("csi-manila-controller-sa");
                p["spec"]["serviceAccount"] = json!("csi-manila-controller-sa");
            },
            "no service account but the namespace's default",
        ),
        (
            "an API token",
            |p| p["spec"]["automountServiceAccountToken"] = json!(true),
            "no API token",
        ),
        (
            "a Secret volume",
            |p| {
                p["spec"]["volumes"]
                    .as_array_mut()
                    .unwrap()
                    .push(json!({"name": "s", "secret": {"secretName": "cloud-config"}}))
            },
            "mounts only the host paths of the mount pod template",
        ),
        (
            "a projected token of its own",
            |p| {
                p["spec"]["volumes"]
                    .as_array_mut()
                    .unwrap()
                    .push(json!({"name": "t",
                    "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}}))
            },
            "mounts only the host paths of the mount pod template",
        ),
        (
            "the host's root",
            |p| p["spec"]["volumes"][0]["hostPath"]["path"] = json!("/"),
            "mounts only the host paths of the mount pod template",
        ),
        (
            "a part of the kubelet directory mounted elsewhere",
            |p| {
                p["spec"]["containers"][0]["volumeMounts"][0]["subPath"] = json!("pods");
            },
            "mounts each host path at the same path, and whole",
        ),
        (
            "a user beside privileged",
            |p| {
                p["spec"]["containers"][0]["securityContext"]["runAsUser"] = json!(1000);
            },
            "sets nothing else of its security context",
        ),
        (
            "a pod security context",
            |p| p["spec"]["securityContext"] = json!({"runAsUser": 1000}),
            "sets no pod security context",
        ),
        (
            "another node",
            |p| p["spec"]["nodeName"] = json!("another-node"),
            "only on the node the plugin runs on",
        ),
        (
            "its Node as its owner (taken with the Node's deletion)",
            |p| {
                let node = p["spec"]["nodeName"].clone();
                p["metadata"]["ownerReferences"] = json!([{
                    "apiVersion": "v1", "kind": "Node", "name": node,
                    "uid": "6f1f1c39-5f4e-4a57-9d2b-000000000001", "controller": true,
                }]);
            },
            "one owner, its controller, is the mount pod template",
        ),
        // (a template of that name with another uid is not refused: the
        // policy takes no parameter, Kubernetes #133827, so it does not
        // know the uid; the garbage collector deletes such a pod, whose
        // owner does not exist)
        (
            "no owner (kubectl drain would need --force)",
            |p| {
                p["metadata"]
                    .as_object_mut()
                    .unwrap()
                    .remove("ownerReferences");
            },
            "one owner, its controller, is the mount pod template",
        ),
        (
            "no mount pod label",
            |p| {
                p["metadata"]["labels"]
                    .as_object_mut()
                    .unwrap()
                    .remove("app.kubernetes.io/component");
            },
            "only mount pods",
        ),
        // a Ready pod labelled as the cluster's DNS, in kube-system, would
        // take a share of every lookup into a black hole
        (
            "labelled as the cluster's DNS (k8s-app: kube-dns)",
            |p| p["metadata"]["labels"]["k8s-app"] = json!("kube-dns"),
            "carries only its three labels",
        ),
        (
            "an annotation of its own",
            |p| p["metadata"]["annotations"]["prometheus.io/scrape"] = json!("true"),
            "carries exactly its two annotations",
        ),
        (
            "a staging path outside kubelet's CSI staging (hook and mount point alike)",
            |p| {
                let outside = "/var/lib/kubelet/pods";
                let annotation = "manila.csi.openstack.org/staging-path";
                let staging = p["metadata"]["annotations"][annotation].clone();
                p["metadata"]["annotations"][annotation] = json!(outside);
                p["spec"]["containers"][0]["lifecycle"]["preStop"]["exec"]["command"][2] =
                    json!(format!("--staging-path={outside}"));
                for arg in p["spec"]["containers"][0]["command"]
                    .as_array_mut()
                    .unwrap()
                    .iter_mut()
                    .filter(|a| **a == staging)
                {
                    *arg = json!(outside);
                }
            },
            "carries exactly its two annotations",
        ),
        (
            "a finalizer (never deleted)",
            |p| p["metadata"]["finalizers"] = json!(["example.com/keep"]),
            "has no finalizer",
        ),
        (
            "off the host network",
            |p| p["spec"]["hostNetwork"] = json!(false),
            "settings are the node plugin's",
        ),
        (
            "restarted for ever",
            |p| p["spec"]["restartPolicy"] = json!("Always"),
            "settings are the node plugin's",
        ),
        (
            "another priority class",
            |p| {
                p["spec"]["priorityClassName"] = json!("system-cluster-critical");
                // the priority admission fills it in from the class
                p["spec"].as_object_mut().unwrap().remove("priority");
            },
            "settings are the node plugin's",
        ),
        (
            "a termination message written into the kubelet directory",
            |p| {
                p["spec"]["containers"][0]["terminationMessagePath"] =
                    json!("/var/lib/kubelet/termination")
            },
            "container is the node plugin's",
        ),
        (
            "no memory limit",
            |p| {
                p["spec"]["containers"][0]["resources"]
                    .as_object_mut()
                    .unwrap()
                    .remove("limits");
            },
            "container is the node plugin's",
        ),
        (
            "an argument of its own for ceph-fuse",
            |p| {
                let args = p["spec"]["containers"][0]["command"]
                    .as_array_mut()
                    .unwrap();
                args.insert(2, json!("--log-file=/var/lib/kubelet/pods/x"));
            },
            "with the node plugin's arguments alone",
        ),
        (
            "a ceph.conf of its own",
            |p| p["spec"]["containers"][0]["command"][3] = json!("/tmp/ceph.conf"),
            "with the node plugin's arguments alone",
        ),
    ];
    let mut admitted = Vec::new();
    for (what, change, refusal) in escapes {
        let mut p = real.clone();
        change(&mut p);
        match create_as(&c, Some(&token), &p).await {
            Ok(()) => admitted.push(format!("{what}: admitted")),
            Err(e) if e.contains(refusal) => println!("refused, {what}: {refusal}"),
            Err(e) => admitted.push(format!("{what}: refused for another reason: {e}")),
        }
    }
    assert!(admitted.is_empty(), "{admitted:#?}");

    // the NFS node plugin's token makes no pod at all (its own account,
    // without the mount pods' role)
    let nfs_plugin = suite_pod_on_a(&c, "csi-manila-nfs-nodeplugin").await;
    let nfs_token = c.bound_token(&nfs_plugin).unwrap();
    let refused = create_as(&c, Some(&nfs_token), &real).await;
    assert!(
        refused.as_ref().is_err_and(|e| e.contains("forbidden")),
        "the NFS node plugin's token made a mount pod: {refused:?}"
    );

    // the policy and its binding deleted and created again, as an
    // uninstall and an install do: the policy is in force again at once,
    // without an apiserver restart. (Had it a parameter of a built-in
    // kind, the apiserver would stop watching that kind here and go on
    // with the template it last saw, or refuse every mount pod once the
    // template is created again too, Kubernetes #133827: what the Helm
    // scenario's reinstall met; deploy/validate.py refuses such a policy.)
    let mut saved = Vec::new();
    for kind in [
        "validatingadmissionpolicy",
        "validatingadmissionpolicybinding",
    ] {
        let mut object = c
            .get(kind, "csi-manila-mount-pods", None)
            .await
            .unwrap()
            .expect("the mount pod policy installed");
        let meta = object["metadata"].as_object_mut().unwrap();
        for written_by_the_api in [
            "uid",
            "resourceVersion",
            "creationTimestamp",
            "generation",
            "managedFields",
        ] {
            meta.remove(written_by_the_api);
        }
        object.as_object_mut().unwrap().remove("status");
        saved.push(object);
    }
    c.kubectl(&[
        "delete",
        "validatingadmissionpolicybinding,validatingadmissionpolicy",
        "csi-manila-mount-pods",
    ])
    .await
    .unwrap();
    // the apiserver looks at its policies every second: long enough for it
    // to drop what the policy used
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    let list = json!({"apiVersion": "v1", "kind": "List", "items": saved}).to_string();
    c.kubectl_with_input(&["create", "-f", "-"], Some(&list))
        .await
        .unwrap();
    let own_image = escapes
        .iter()
        .find(|(what, _, _)| *what == "an image of its own")
        .unwrap();
    let mut foreign = real.clone();
    (own_image.1)(&mut foreign);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let back_in_force = loop {
        match create_as(&c, Some(&token), &foreign).await {
            Err(e) if e.contains(own_image.2) => break Ok(()),
            Err(e) if std::time::Instant::now() > deadline => break Err(e),
            Ok(()) if std::time::Instant::now() > deadline => {
                break Err("a mount pod of another image still admitted".to_string());
            }
            _ => tokio::time::sleep(std::time::Duration::from_millis(500)).await,
        }
    };
    back_in_force.expect("the mount pod policy in force again within 60 s");
    create_as(&c, Some(&token), &real)
        .await
        .unwrap_or_else(|e| {
            panic!("the plugin's mount pod refused after the policy came back: {e}")
        });
    // and only the plugin's namespace is looked at
    let elsewhere = c
        .kubectl_with_input(
            &["create", "--dry-run=server", "-n", &n, "-f", "-"],
            Some(&pod("elsewhere", "share", "true", PodOptions::default())),
        )
        .await;
    elsewhere.expect("a pod of another namespace refused");

    ns.close().await.unwrap();
}

/// A node on which both a node plugin's startup taint and another
/// agent's are (added here for the test, removed by the guard).
struct Tainted {
    kubeconfig: std::path::PathBuf,
    node: String,
    keys: Vec<String>,
}

impl Drop for Tainted {
    fn drop(&mut self) {
        for key in &self.keys {
            let _ = std::process::Command::new("kubectl")
                .arg(format!("--kubeconfig={}", self.kubeconfig.display()))
                .args(["taint", "node", &self.node, &format!("{key}-")])
                .output();
        }
    }
}

#[tokio::test]
#[ignore = "needs the cluster tier: tests/cluster/cluster.py up (after tests/openstack/cloud.py up all)"]
async fn a_node_plugins_token_lifts_only_its_own_drivers_startup_taint_of_its_own_node() {
    let c = Cluster::from_env().unwrap();
    let plugin = suite_pod_on_a(&c, "csi-cinder-nodeplugin").await;
    let token = c.bound_token(&plugin).unwrap();
    let own = "cinder.csi.openstack.org/agent-not-ready";
    let cilium = "node.cilium.io/agent-not-ready";
    // PreferNoSchedule: nothing of the other tests is kept off node A
    let _tainted = Tainted {
        kubeconfig: c.kubeconfig.clone(),
        node: c.node.clone(),
        keys: vec![own.into(), cilium.into()],
    };
    for key in [own, cilium] {
        c.kubectl(&[
            "taint",
            "node",
            &c.node,
            &format!("{key}=x:PreferNoSchedule"),
        ])
        .await
        .unwrap();
    }
    let as_plugin = |args: Vec<String>| {
        let (c, token) = (c.clone(), token.clone());
        async move {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            c.kubectl_with_token(&token, &args, None)
                .await
                .map_err(|e| e.to_string())
        }
    };
    let untaint = |node: &str, key: &str| {
        vec![
            "taint".to_string(),
            "node".into(),
            node.into(),
            format!("{key}-"),
            "--dry-run=server".into(),
        ]
    };
    as_plugin(untaint(&c.node, own))
        .await
        .unwrap_or_else(|e| panic!("its own startup taint, on its own node: {e}"));
    let refused = as_plugin(untaint(&c.node, cilium)).await.unwrap_err();
    assert!(
        refused.contains("only the driver's own startup taint"),
        "another agent's startup taint: {refused}"
    );
    let nodes = c.nodes().await.unwrap();
    let other = nodes.iter().find(|n| **n != c.node).unwrap();
    let refused = as_plugin(vec![
        "taint".into(),
        "node".into(),
        other.clone(),
        "example.com/by-a-node-plugin=x:NoSchedule".into(),
        "--dry-run=server".into(),
    ])
    .await
    .unwrap_err();
    assert!(
        refused.contains("only the node the plugin runs on"),
        "another node: {refused}"
    );
    let refused = as_plugin(vec![
        "taint".into(),
        "node".into(),
        c.node.clone(),
        "example.com/by-a-node-plugin=x:NoSchedule".into(),
        "--dry-run=server".into(),
    ])
    .await
    .unwrap_err();
    assert!(
        refused.contains("no taint added or changed"),
        "a taint added: {refused}"
    );
}

/// A service account made for a test, with bindings to the suite's own
/// roles (removed by the guard).
struct Renamed {
    kubeconfig: std::path::PathBuf,
    objects: Vec<(String, Option<String>)>,
}

impl Drop for Renamed {
    fn drop(&mut self) {
        for (what, namespace) in &self.objects {
            let mut cmd = std::process::Command::new("kubectl");
            cmd.env("KUBECONFIG", &self.kubeconfig).args([
                "delete",
                "--ignore-not-found",
                "--wait=false",
                what,
            ]);
            if let Some(n) = namespace {
                cmd.args(["-n", n]);
            }
            let _ = cmd.output();
        }
    }
}

#[tokio::test]
#[ignore = "needs the cluster tier: tests/cluster/cluster.py up (after tests/openstack/cloud.py up all)"]
async fn a_node_plugins_roles_confine_whoever_holds_them_under_any_name() {
    // a namePrefix overlay or a rename gives the node plugin's roles to an
    // account of another name: the policies confine it all the same (they
    // match whoever holds the roles' mark, not a name)
    let c = Cluster::from_env().unwrap();
    let sa = "renamed-csi-manila-node-sa";
    let subject = format!("{SUITE_NAMESPACE}:{sa}");
    let _guard = Renamed {
        kubeconfig: c.kubeconfig.clone(),
        objects: vec![
            (format!("serviceaccount/{sa}"), Some(SUITE_NAMESPACE.into())),
            (
                "rolebinding/renamed-mount-pods".into(),
                Some(SUITE_NAMESPACE.into()),
            ),
            ("clusterrolebinding/renamed-startup-taint".into(), None),
            ("clusterrolebinding/renamed-drain".into(), None),
        ],
    };
    for args in [
        vec!["create", "serviceaccount", sa, "-n", SUITE_NAMESPACE],
        vec![
            "create",
            "rolebinding",
            "renamed-mount-pods",
            "-n",
            SUITE_NAMESPACE,
            "--role=csi-manila-node-mount-pods",
            &format!("--serviceaccount={subject}"),
        ],
        vec![
            "create",
            "clusterrolebinding",
            "renamed-startup-taint",
            "--clusterrole=csi-manila-node-startup-taint",
            &format!("--serviceaccount={subject}"),
        ],
        vec![
            "create",
            "clusterrolebinding",
            "renamed-drain",
            "--clusterrole=csi-manila-node-drain",
            &format!("--serviceaccount={subject}"),
        ],
    ] {
        c.kubectl(&args).await.unwrap();
    }
    let token = c
        .kubectl(&[
            "create",
            "token",
            sa,
            "-n",
            SUITE_NAMESPACE,
            "--duration=10m",
        ])
        .await
        .unwrap()
        .trim()
        .to_string();
    // RBAC lets it create pods and patch nodes; the policies do not: a
    // plain pod labelled as a mount pod, and a label on a node
    let plain = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "renamed-account-pod",
            "labels": {"app.kubernetes.io/component": "ceph-fuse-mount"},
        },
        "spec": {
            "nodeName": c.node,
            "containers": [{"name": "app", "image": APP_IMAGE, "command": ["true"]}],
        },
    });
    let refused = create_as(&c, Some(&token), &plain)
        .await
        .expect_err("a pod of the renamed account admitted");
    assert!(refused.contains("csi-manila-mount-pods"), "{refused}");
    let refused = c
        .kubectl_with_token(
            &token,
            &[
                "patch",
                "node",
                &c.node,
                "--type=merge",
                "-p",
                r#"{"metadata":{"labels":{"example.com/by-a-renamed-account":"x"}}}"#,
                "--dry-run=server",
            ],
            None,
        )
        .await
        .expect_err("a node labelled by the renamed account")
        .to_string();
    assert!(
        refused.contains("csi-manila-node-startup-taint"),
        "{refused}"
    );
    // an administrator (every verb, so also the mark's `exempt`) is not
    // confined
    create_as(&c, None, &plain)
        .await
        .expect("the administrator's pod refused");
}

/// A GET of `path` on `addr` over plain HTTP: its status code and body,
/// or why no answer came.
async fn http_get(addr: &str, path: &str) -> Result<(u16, String), String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::time::timeout(Duration::from_secs(5), tokio::net::TcpStream::connect(addr))
        .await
        .map_err(|_| format!("{addr}: no connection within 5 s"))?
        .map_err(|e| format!("{addr}: {e}"))?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut answer = String::new();
    tokio::time::timeout(Duration::from_secs(30), s.read_to_string(&mut answer))
        .await
        .map_err(|_| format!("{addr}{path}: no answer within 30 s"))?
        .map_err(|e| e.to_string())?;
    let code = answer
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("{addr}{path}: not HTTP: {answer:?}"))?;
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((code, body))
}

#[tokio::test]
#[ignore = "needs the cluster tier: tests/cluster/cluster.py up (after tests/openstack/cloud.py up all)"]
async fn the_pre_stop_route_answers_on_the_nodes_loopback_only() {
    // each ask reads the API under the account all nodes share, and tells
    // the drain state: only the node's own kubelet may ask (the
    // registrar's preStop), never whoever reaches the metrics port
    let c = Cluster::from_env().unwrap();
    for (metrics, local) in [(9829, 9849), (9830, 9850), (9831, 9851)] {
        // node A runs in this host's namespaces: its loopback is ours
        let (code, body) = http_get(&format!("127.0.0.1:{local}"), "/pre-stop")
            .await
            .unwrap();
        assert_eq!((code, body.trim()), (200, "NotDraining"), "port {local}");
        let (code, _) = http_get(&format!("127.0.0.1:{metrics}"), "/pre-stop")
            .await
            .unwrap();
        assert_eq!(code, 404, "/pre-stop on the metrics port {metrics}");
    }
    // node B from outside it: its metrics answer, its hook does not
    let nodes = c.nodes().await.unwrap();
    let b = nodes.iter().find(|n| **n != c.node).unwrap();
    let node = c.get("node", b, None).await.unwrap().unwrap();
    let ip = node["status"]["addresses"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["type"] == "InternalIP")
        .and_then(|a| a["address"].as_str())
        .unwrap()
        .to_string();
    for (metrics, local) in [(9829, 9849), (9830, 9850), (9831, 9851)] {
        let (code, _) = http_get(&format!("{ip}:{metrics}"), "/metrics")
            .await
            .unwrap();
        assert_eq!(code, 200, "{b}'s metrics on {ip}:{metrics}");
        let (code, _) = http_get(&format!("{ip}:{metrics}"), "/pre-stop")
            .await
            .unwrap();
        assert_eq!(code, 404, "{b}'s /pre-stop on its metrics port {metrics}");
        let e = http_get(&format!("{ip}:{local}"), "/pre-stop")
            .await
            .expect_err("node B's hook reached from outside it");
        assert!(e.contains("refused"), "{e}");
    }
}
