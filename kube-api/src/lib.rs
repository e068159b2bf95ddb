//! The few Kubernetes API calls the plugins make, and nothing else: get,
//! list, create and delete pods in one namespace; read a node, its
//! CSINode and the VolumeAttachments; remove one taint of a node; list
//! the handles of the driver's PersistentVolumes and
//! VolumeSnapshotContents ([`storage`]). With
//! the pod's own in-cluster credentials (the service account token,
//! re-read on every call because kubelet rotates it, and the cluster CA).
//!
//! No redirect is ever followed: the token goes to the apiserver named by
//! `KUBERNETES_SERVICE_HOST` and nowhere else.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use url::Url;

pub mod storage;

/// Where kubelet puts a pod's service account credentials.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// How long one API call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(15);

#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    #[error("Kubernetes API configuration: {0}")]
    Config(String),
    #[error("Kubernetes API {method} {path}: {message}")]
    Transport {
        method: &'static str,
        path: String,
        message: String,
    },
    #[error("Kubernetes API {method} {path}: HTTP {status}: {message}")]
    Status {
        method: &'static str,
        path: String,
        status: u16,
        /// The apiserver's `Status.reason` (`AlreadyExists`, `Forbidden`, ...).
        reason: String,
        message: String,
    },
    #[error("Kubernetes API {method} {path}: unexpected answer: {message}")]
    Decode {
        method: &'static str,
        path: String,
        message: String,
    },
}

impl KubeError {
    pub fn status(&self) -> Option<u16> {
        match self {
            KubeError::Status { status, .. } => Some(*status),
            _ => None,
        }
    }
}

pub type Result<T> = std::result::Result<T, KubeError>;

/// Whether a URL's host is this machine's loopback (`127.0.0.0/8`,
/// `::1`, `localhost`).
fn is_loopback(url: &Url) -> bool {
    match url.host() {
        Some(url::Host::Ipv4(a)) => a.is_loopback(),
        Some(url::Host::Ipv6(a)) => a.is_loopback(),
        Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        None => false,
    }
}

/// Where the bearer token comes from.
#[derive(Debug, Clone)]
pub enum Token {
    /// Re-read on every call (projected tokens are rotated by kubelet).
    File(PathBuf),
    Fixed(String),
}

impl Token {
    fn read(&self) -> Result<String> {
        match self {
            Token::Fixed(t) => Ok(t.clone()),
            Token::File(p) => std::fs::read_to_string(p)
                .map(|t| t.trim().to_string())
                .map_err(|e| {
                    KubeError::Config(format!(
                        "cannot read the service account token {}: {e}",
                        p.display()
                    ))
                }),
        }
    }
}

#[derive(Debug, Clone)]
pub struct Client {
    base: Url,
    http: reqwest::Client,
    token: Arc<Token>,
}

impl Client {
    /// The credentials kubelet gives a pod: the apiserver from
    /// `KUBERNETES_SERVICE_HOST`/`_PORT`, the token and CA from
    /// [`SERVICE_ACCOUNT_DIR`].
    pub fn in_cluster() -> Result<Self> {
        let host = std::env::var("KUBERNETES_SERVICE_HOST").map_err(|_| {
            KubeError::Config(
                "KUBERNETES_SERVICE_HOST is not set: not running in a pod of a cluster".into(),
            )
        })?;
        let port = std::env::var("KUBERNETES_SERVICE_PORT").unwrap_or_else(|_| "443".into());
        let host = if host.contains(':') && !host.starts_with('[') {
            format!("[{host}]")
        } else {
            host
        };
        let base = Url::parse(&format!("https://{host}:{port}/"))
            .map_err(|e| KubeError::Config(format!("apiserver address {host}:{port}: {e}")))?;
        let dir = Path::new(SERVICE_ACCOUNT_DIR);
        let ca = std::fs::read(dir.join("ca.crt")).map_err(|e| {
            KubeError::Config(format!(
                "cannot read {}: {e} (is automountServiceAccountToken off?)",
                dir.join("ca.crt").display()
            ))
        })?;
        Self::new(base, Some(&ca), Token::File(dir.join("token")))
    }

    /// A client of the apiserver at `base`, trusting only `ca_pem` (an
    /// `http://` base, for tests, needs none).
    pub fn new(base: Url, ca_pem: Option<&[u8]>, token: Token) -> Result<Self> {
        let mut builder = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .timeout(CALL_TIMEOUT);
        // a bearer token in clear text leaves this machine never: plain
        // http only to a loopback address (a test's stand-in apiserver)
        if base.scheme() != "https" && !is_loopback(&base) {
            return Err(KubeError::Config(format!(
                "{base}: the apiserver must be https (plain http only on a loopback address): its bearer token would cross the network in clear text"
            )));
        }
        if ca_pem.is_none() && base.scheme() == "https" {
            return Err(KubeError::Config(
                "an https apiserver needs its CA certificate".into(),
            ));
        }
        // reqwest has no TLS provider of its own here: every client gets
        // one, trusting the cluster CA alone
        builder = builder.use_preconfigured_tls(tls(ca_pem)?);
        let http = builder
            .build()
            .map_err(|e| KubeError::Config(format!("HTTP client: {e}")))?;
        Ok(Self {
            base,
            http,
            token: Arc::new(token),
        })
    }

    /// The apiserver this client asks.
    pub fn base(&self) -> &Url {
        &self.base
    }

    /// The namespace of this pod: `POD_NAMESPACE`, else the service
    /// account's.
    pub fn own_namespace() -> Result<String> {
        if let Ok(ns) = std::env::var("POD_NAMESPACE")
            && !ns.is_empty()
        {
            return Ok(ns);
        }
        let f = Path::new(SERVICE_ACCOUNT_DIR).join("namespace");
        std::fs::read_to_string(&f)
            .map(|s| s.trim().to_string())
            .map_err(|e| {
                KubeError::Config(format!(
                    "POD_NAMESPACE is not set and {} cannot be read: {e}",
                    f.display()
                ))
            })
    }

    async fn call(
        &self,
        method: &'static str,
        path: &str,
        query: &[(&str, &str)],
        body: Option<&serde_json::Value>,
    ) -> Result<serde_json::Value> {
        let url = self
            .base
            .join(path.trim_start_matches('/'))
            .map_err(|e| KubeError::Config(format!("{path}: {e}")))?;
        let m = match method {
            "GET" => reqwest::Method::GET,
            "POST" => reqwest::Method::POST,
            "DELETE" => reqwest::Method::DELETE,
            "PATCH" => reqwest::Method::PATCH,
            other => return Err(KubeError::Config(format!("method {other}"))),
        };
        let mut req = self
            .http
            .request(m, url)
            .query(query)
            .bearer_auth(self.token.read()?)
            .header("Accept", "application/json");
        if let Some(b) = body {
            // the only patch sent is a JSON patch, whose `test` operations
            // make it apply to the object as it was read, or not at all
            let content_type = if method == "PATCH" {
                "application/json-patch+json"
            } else {
                "application/json"
            };
            req = req
                .header(reqwest::header::CONTENT_TYPE, content_type)
                .body(b.to_string());
        }
        let transport = |e: reqwest::Error| KubeError::Transport {
            method,
            path: path.to_string(),
            message: e.to_string(),
        };
        let resp = req.send().await.map_err(transport)?;
        let status = resp.status();
        let bytes = resp.bytes().await.map_err(transport)?;
        let value: serde_json::Value = if bytes.is_empty() {
            serde_json::Value::Null
        } else {
            match serde_json::from_slice(&bytes) {
                Ok(v) => v,
                // a refusal that is not the apiserver's JSON (a proxy's
                // page) is still a refusal with its code
                Err(_) if !status.is_success() => serde_json::json!({
                    "message": String::from_utf8_lossy(&bytes).chars().take(200).collect::<String>(),
                }),
                Err(e) => {
                    return Err(KubeError::Decode {
                        method,
                        path: path.to_string(),
                        message: format!("HTTP {status}: {e}"),
                    });
                }
            }
        };
        if status.is_success() {
            return Ok(value);
        }
        let text = |k: &str| {
            value
                .get(k)
                .and_then(|v| v.as_str())
                .unwrap_or("")
                .to_string()
        };
        Err(KubeError::Status {
            method,
            path: path.to_string(),
            status: status.as_u16(),
            reason: text("reason"),
            message: text("message"),
        })
    }

    fn pods_path(namespace: &str) -> String {
        format!("api/v1/namespaces/{namespace}/pods")
    }

    /// The pod, or None when there is none by that name.
    pub async fn get_pod(&self, namespace: &str, name: &str) -> Result<Option<Pod>> {
        match self
            .call(
                "GET",
                &format!("{}/{name}", Self::pods_path(namespace)),
                &[],
                None,
            )
            .await
        {
            Ok(v) => decode("GET", name, v).map(Some),
            Err(e) if e.status() == Some(404) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Pods of the namespace matching the selectors (empty: all).
    pub async fn list_pods(
        &self,
        namespace: &str,
        label_selector: &str,
        field_selector: &str,
    ) -> Result<Vec<Pod>> {
        let path = Self::pods_path(namespace);
        let v = self
            .call(
                "GET",
                &path,
                &[
                    ("labelSelector", label_selector),
                    ("fieldSelector", field_selector),
                ],
                None,
            )
            .await?;
        let list: PodList = decode("GET", &path, v)?;
        Ok(list.items)
    }

    /// The metadata of the PodTemplates of `namespace` that carry the
    /// labels of `label_selector` (their specs are not read).
    pub async fn list_pod_templates(
        &self,
        namespace: &str,
        label_selector: &str,
    ) -> Result<Vec<ObjectMeta>> {
        let path = format!("api/v1/namespaces/{namespace}/podtemplates");
        let v = self
            .call("GET", &path, &[("labelSelector", label_selector)], None)
            .await?;
        let list: MetadataList = decode("GET", &path, v)?;
        Ok(list.items.into_iter().map(|i| i.metadata).collect())
    }

    /// Creates the pod; one of that name already there is
    /// [`Created::AlreadyExists`].
    pub async fn create_pod(&self, namespace: &str, pod: &serde_json::Value) -> Result<Created> {
        let path = Self::pods_path(namespace);
        match self.call("POST", &path, &[], Some(pod)).await {
            Ok(v) => decode("POST", &path, v).map(|p| Created::New(Box::new(p))),
            Err(e) if e.status() == Some(409) => Ok(Created::AlreadyExists),
            Err(e) => Err(e),
        }
    }

    /// Deletes the pod (gone already is success). `uid` makes sure it is
    /// the pod that was looked at, not a newer one of the same name.
    pub async fn delete_pod(
        &self,
        namespace: &str,
        name: &str,
        grace_period_seconds: Option<u32>,
        uid: Option<&str>,
    ) -> Result<()> {
        let mut body = serde_json::json!({"kind": "DeleteOptions", "apiVersion": "v1"});
        if let Some(g) = grace_period_seconds {
            body["gracePeriodSeconds"] = g.into();
        }
        if let Some(u) = uid {
            body["preconditions"] = serde_json::json!({ "uid": u });
        }
        match self
            .call(
                "DELETE",
                &format!("{}/{name}", Self::pods_path(namespace)),
                &[],
                Some(&body),
            )
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if e.status() == Some(404) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// A node's name as the API allows it (a DNS subdomain: at most 253
/// lowercase letters, digits, `-` and `.`), so that it can only ever name
/// a node in a request's path.
fn node_path(name: &str, under: &str) -> Result<String> {
    let valid = !name.is_empty()
        && name.len() <= 253
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && name
            .split('.')
            .all(|part| !part.is_empty() && !part.starts_with('-') && !part.ends_with('-'));
    if !valid {
        return Err(KubeError::Config(format!(
            "{name:?} is not a node name (a DNS subdomain)"
        )));
    }
    Ok(format!("{under}/{name}"))
}

impl Client {
    /// The node, or None when there is none by that name.
    pub async fn get_node(&self, name: &str) -> Result<Option<Node>> {
        let path = node_path(name, "api/v1/nodes")?;
        match self.call("GET", &path, &[], None).await {
            Ok(v) => decode("GET", &path, v).map(Some),
            Err(e) if e.status() == Some(404) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The node's CSINode (the drivers kubelet registered on it), or None
    /// while kubelet has not made it.
    pub async fn get_csi_node(&self, name: &str) -> Result<Option<CsiNode>> {
        let path = node_path(name, "apis/storage.k8s.io/v1/csinodes")?;
        match self.call("GET", &path, &[], None).await {
            Ok(v) => decode("GET", &path, v).map(Some),
            Err(e) if e.status() == Some(404) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Removes the taints of `node` (as read) whose key is `key`: one JSON
    /// patch that first tests each one is still where it was read, so a
    /// node changed since fails with HTTP 422 and nothing is removed.
    /// Returns how many were removed (0: none had that key).
    pub async fn remove_node_taints(&self, node: &Node, key: &str) -> Result<usize> {
        let path = node_path(&node.metadata.name, "api/v1/nodes")?;
        let at: Vec<usize> = node
            .spec
            .taints
            .iter()
            .enumerate()
            .filter(|(_, t)| t.key == key)
            .map(|(i, _)| i)
            .collect();
        if at.is_empty() {
            return Ok(0);
        }
        // from the last, so that each index still means what was read
        let ops: Vec<serde_json::Value> = at
            .iter()
            .rev()
            .flat_map(|i| {
                [
                    serde_json::json!({"op": "test", "path": format!("/spec/taints/{i}/key"), "value": key}),
                    serde_json::json!({"op": "remove", "path": format!("/spec/taints/{i}")}),
                ]
            })
            .collect();
        self.call("PATCH", &path, &[], Some(&serde_json::Value::Array(ops)))
            .await?;
        Ok(at.len())
    }

    /// Every VolumeAttachment of the cluster (the API selects them by no
    /// field but their name).
    pub async fn list_volume_attachments(&self) -> Result<Vec<VolumeAttachment>> {
        let path = "apis/storage.k8s.io/v1/volumeattachments";
        let v = self.call("GET", path, &[], None).await?;
        let list: VolumeAttachmentList = decode("GET", path, v)?;
        Ok(list.items)
    }
}

/// The parts of a node the plugins read.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Node {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: NodeSpec,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct NodeSpec {
    /// Cordoned (`kubectl cordon`, and so `kubectl drain`).
    #[serde(default)]
    pub unschedulable: bool,
    #[serde(default, deserialize_with = "null_as_empty")]
    pub taints: Vec<Taint>,
}

/// A list the API may write as `null`.
fn null_as_empty<'de, D, T>(d: D) -> std::result::Result<Vec<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Ok(Option::<Vec<T>>::deserialize(d)?.unwrap_or_default())
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct Taint {
    #[serde(default)]
    pub key: String,
    #[serde(default)]
    pub effect: String,
}

/// The parts of a CSINode the plugins read.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct CsiNode {
    #[serde(default)]
    pub metadata: CsiNodeMeta,
    #[serde(default)]
    pub spec: CsiNodeSpec,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CsiNodeMeta {
    /// kubelet makes its node the CSINode's owner
    #[serde(default, deserialize_with = "null_as_empty")]
    pub owner_references: Vec<OwnerReference>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct OwnerReference {
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub uid: String,
    /// Whether the owner is the object's controller.
    #[serde(default)]
    pub controller: Option<bool>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct CsiNodeSpec {
    /// The drivers kubelet registered (`null` on a node with none).
    #[serde(default, deserialize_with = "null_as_empty")]
    pub drivers: Vec<CsiNodeDriver>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CsiNodeDriver {
    pub name: String,
    #[serde(default)]
    pub node_id: String,
    /// How many volumes the node takes, from NodeGetInfo's limit.
    #[serde(default)]
    pub allocatable: Option<VolumeNodeResources>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct VolumeNodeResources {
    #[serde(default)]
    pub count: Option<i64>,
}

#[derive(Debug, Clone, Deserialize)]
struct VolumeAttachmentList {
    #[serde(default)]
    items: Vec<VolumeAttachment>,
}

/// The parts of a VolumeAttachment the plugins read.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct VolumeAttachment {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: VolumeAttachmentSpec,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeAttachmentSpec {
    /// The CSI driver's name.
    #[serde(default)]
    pub attacher: String,
    #[serde(default)]
    pub node_name: String,
}

fn decode<T: serde::de::DeserializeOwned>(
    method: &'static str,
    path: &str,
    v: serde_json::Value,
) -> Result<T> {
    serde_json::from_value(v).map_err(|e| KubeError::Decode {
        method,
        path: path.to_string(),
        message: e.to_string(),
    })
}

fn tls(ca_pem: Option<&[u8]>) -> Result<rustls::ClientConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    let certs: Vec<_> = rustls_pemfile::certs(&mut ca_pem.unwrap_or_default())
        .collect::<std::result::Result<_, _>>()
        .map_err(|e| KubeError::Config(format!("cluster CA: {e}")))?;
    if certs.is_empty() && ca_pem.is_some() {
        return Err(KubeError::Config(
            "the cluster CA file holds no certificate".into(),
        ));
    }
    for c in certs {
        roots
            .add(c)
            .map_err(|e| KubeError::Config(format!("cluster CA: {e}")))?;
    }
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| KubeError::Config(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

/// What [`Client::create_pod`] found.
#[derive(Debug, Clone)]
pub enum Created {
    New(Box<Pod>),
    AlreadyExists,
}

#[derive(Debug, Clone, Deserialize)]
struct MetadataList {
    #[serde(default)]
    items: Vec<WithMetadata>,
}

#[derive(Debug, Clone, Deserialize)]
struct WithMetadata {
    #[serde(default)]
    metadata: ObjectMeta,
}

#[derive(Debug, Clone, Deserialize)]
struct PodList {
    #[serde(default)]
    items: Vec<Pod>,
}

/// The parts of a pod the plugins read.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Pod {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: PodSpec,
    #[serde(default)]
    pub status: PodStatus,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectMeta {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub namespace: String,
    #[serde(default)]
    pub uid: String,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    #[serde(default)]
    pub deletion_timestamp: Option<String>,
    #[serde(default, deserialize_with = "null_as_empty")]
    pub owner_references: Vec<OwnerReference>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodSpec {
    #[serde(default)]
    pub node_name: String,
    #[serde(default)]
    pub containers: Vec<Container>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Container {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub image: String,
    #[serde(default)]
    pub image_pull_policy: Option<String>,
    #[serde(default, deserialize_with = "null_as_empty")]
    pub command: Vec<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodStatus {
    /// Pending, Running, Succeeded, Failed or Unknown.
    #[serde(default)]
    pub phase: String,
    #[serde(default)]
    pub container_statuses: Vec<ContainerStatus>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerStatus {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub state: ContainerState,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct ContainerState {
    #[serde(default)]
    pub running: Option<serde_json::Value>,
    #[serde(default)]
    pub waiting: Option<StateDetail>,
    #[serde(default)]
    pub terminated: Option<StateDetail>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StateDetail {
    #[serde(default)]
    pub reason: Option<String>,
    #[serde(default)]
    pub message: Option<String>,
    #[serde(default)]
    pub exit_code: Option<i32>,
}

impl Pod {
    /// Ended for good (its containers will not run again).
    pub fn finished(&self) -> bool {
        matches!(self.status.phase.as_str(), "Succeeded" | "Failed")
    }

    /// Why its containers are not running, when they are not: the
    /// termination or waiting reason and message.
    pub fn trouble(&self) -> Option<String> {
        self.status.container_statuses.iter().find_map(|c| {
            let (what, d) = match (&c.state.terminated, &c.state.waiting) {
                (Some(t), _) => ("terminated", t),
                (None, Some(w)) if w.reason.as_deref() != Some("ContainerCreating") => {
                    ("waiting", w)
                }
                _ => return None,
            };
            let mut s = format!("container {} {what}", c.name);
            if let Some(code) = d.exit_code {
                s.push_str(&format!(" with exit code {code}"));
            }
            if let Some(r) = &d.reason {
                s.push_str(&format!(" ({r})"));
            }
            if let Some(m) = d
                .message
                .as_deref()
                .map(str::trim)
                .filter(|m| !m.is_empty())
            {
                s.push_str(&format!(": {m}"));
            }
            Some(s)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_goes_in_clear_text_only_to_this_machine() {
        let token = || Token::Fixed("t".into());
        for ok in [
            "http://127.0.0.1:8080/",
            "http://127.9.0.1/",
            "http://[::1]:80/",
            "http://localhost:1/",
        ] {
            assert!(
                Client::new(Url::parse(ok).unwrap(), None, token()).is_ok(),
                "{ok}"
            );
        }
        for refused in [
            "http://10.0.0.1:6443/",
            "http://apiserver.example:80/",
            "http://localhost.example/",
        ] {
            let e = Client::new(Url::parse(refused).unwrap(), None, token()).unwrap_err();
            assert!(e.to_string().contains("must be https"), "{refused}: {e}");
        }
    }
}
