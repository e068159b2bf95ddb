//! A stand-in apiserver for what a controller reads of the cluster: the
//! kube-system namespace (its uid is the cluster's identity), its
//! PersistentVolumes and VolumeSnapshotContents, a page (of two) at a
//! time as an apiserver pages with `limit` and `continue`, and its Nodes'
//! addresses, to the bearer of one token only. A test sets what it lists, can make a PV appear
//! from a given listing on (one made between a report and its
//! deletions), and can take the snapshot API away; and the annotations
//! of PersistentVolumeClaims, read one at a time (counted).

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};

use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::{Value, json};

use super::HarnessError;

const TOKEN: &str = "stand-in-t0ken";

/// The uid of the stand-in's kube-system namespace, unless a test sets
/// another.
pub const CLUSTER_UID: &str = "5b1d0c7e-2f4a-4f7e-9a43-000000000001";

/// What the stand-in lists.
#[derive(Debug)]
pub struct Objects {
    /// The uid of kube-system: the cluster's identity.
    pub cluster_uid: String,
    /// (driver, volume handle) of each PV.
    pub pvs: Vec<(String, String)>,
    /// (driver, volume attributes) of each static PV naming a share by
    /// its attributes (its handle is a name of the operator's).
    pub static_pvs: Vec<(String, BTreeMap<String, String>)>,
    /// The snapshot API is not installed (the list answers 404).
    pub no_snapshot_api: bool,
    /// (driver, snapshot handle) of each VolumeSnapshotContent.
    pub contents: Vec<(String, String)>,
    /// A PV listed from the `late_from`-th listing of PVs on.
    pub late_pv: Option<(String, String)>,
    pub late_from: usize,
    /// Listings of PVs so far (their first pages).
    pub pv_lists: usize,
    /// (name, addresses) of each Node.
    pub nodes: Vec<(String, Vec<String>)>,
    /// Listings of Nodes so far (their first pages).
    pub node_lists: usize,
    /// (namespace, name) → annotations of each PersistentVolumeClaim.
    pub pvcs: BTreeMap<(String, String), BTreeMap<String, String>>,
    /// Reads of a claim so far, found or not.
    pub pvc_reads: usize,
}

impl Default for Objects {
    fn default() -> Self {
        Self {
            cluster_uid: CLUSTER_UID.into(),
            pvs: Vec::new(),
            static_pvs: Vec::new(),
            no_snapshot_api: false,
            contents: Vec::new(),
            late_pv: None,
            late_from: 0,
            pv_lists: 0,
            nodes: Vec::new(),
            node_lists: 0,
            pvcs: BTreeMap::new(),
            pvc_reads: 0,
        }
    }
}

type Shared = Arc<Mutex<Objects>>;

pub struct StandInApiserver {
    pub url: String,
    pub token_file: PathBuf,
    objects: Shared,
    _dir: tempfile::TempDir,
}

impl std::fmt::Debug for StandInApiserver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StandInApiserver")
            .field("url", &self.url)
            .finish()
    }
}

fn authorized(h: &HeaderMap) -> bool {
    h.get("authorization").and_then(|v| v.to_str().ok()) == Some(&format!("Bearer {TOKEN}"))
}

fn paged(items: Vec<Value>, q: &HashMap<String, String>) -> Value {
    let from: usize = q.get("continue").and_then(|c| c.parse().ok()).unwrap_or(0);
    let page: Vec<Value> = items.iter().skip(from).take(2).cloned().collect();
    let next = (from + 2 < items.len()).then(|| (from + 2).to_string());
    json!({"metadata": {"continue": next}, "items": page})
}

async fn pvs(
    State(s): State<Shared>,
    h: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    if !authorized(&h) {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    let mut o = s.lock().unwrap_or_else(|p| p.into_inner());
    if !q.contains_key("continue") {
        o.pv_lists += 1;
    }
    let mut pvs = o.pvs.clone();
    if o.pv_lists >= o.late_from
        && let Some(late) = &o.late_pv
    {
        pvs.push(late.clone());
    }
    let items = pvs
        .iter()
        .map(
            |(driver, handle)| json!({"spec": {"csi": {"driver": driver, "volumeHandle": handle}}}),
        )
        .chain(
            o.static_pvs
                .iter()
                .enumerate()
                .map(|(i, (driver, attributes))| {
                    json!({"spec": {"csi": {
                        "driver": driver,
                        "volumeHandle": format!("static-pv-{i}"),
                        "volumeAttributes": attributes,
                    }}})
                }),
        )
        // a PV of another kind of volume
        .chain([json!({"spec": {"hostPath": {"path": "/x"}}})])
        .collect();
    axum::Json(paged(items, &q)).into_response()
}

async fn contents(
    State(s): State<Shared>,
    h: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    if !authorized(&h) {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    let o = s.lock().unwrap_or_else(|p| p.into_inner());
    if o.no_snapshot_api {
        return (
            StatusCode::NOT_FOUND,
            axum::Json(json!({"kind": "Status", "reason": "NotFound", "code": 404})),
        )
            .into_response();
    }
    let items = o
        .contents
        .iter()
        .map(|(driver, handle)| {
            json!({"spec": {"driver": driver, "source": {"volumeHandle": "v"}}, "status": {"snapshotHandle": handle}})
        })
        .collect();
    axum::Json(paged(items, &q)).into_response()
}

async fn nodes(
    State(s): State<Shared>,
    h: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    if !authorized(&h) {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    let mut o = s.lock().unwrap_or_else(|p| p.into_inner());
    if !q.contains_key("continue") {
        o.node_lists += 1;
    }
    let items = o
        .nodes
        .iter()
        .map(|(name, addresses)| {
            let addresses: Vec<Value> = addresses
                .iter()
                .map(|a| json!({"type": "InternalIP", "address": a}))
                .chain([json!({"type": "Hostname", "address": name})])
                .collect();
            json!({"metadata": {"name": name}, "status": {"addresses": addresses}})
        })
        .collect();
    axum::Json(paged(items, &q)).into_response()
}

async fn namespace(State(s): State<Shared>, h: HeaderMap, Path(name): Path<String>) -> Response {
    if !authorized(&h) {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    let o = s.lock().unwrap_or_else(|p| p.into_inner());
    let uid = if name == "kube-system" {
        o.cluster_uid.clone()
    } else {
        format!("uid-of-{name}")
    };
    axum::Json(json!({"kind": "Namespace", "metadata": {"name": name, "uid": uid}})).into_response()
}

async fn pvc(
    State(s): State<Shared>,
    h: HeaderMap,
    Path((namespace, name)): Path<(String, String)>,
) -> Response {
    if !authorized(&h) {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    let mut o = s.lock().unwrap_or_else(|p| p.into_inner());
    o.pvc_reads += 1;
    match o.pvcs.get(&(namespace.clone(), name.clone())) {
        Some(annotations) => axum::Json(json!({
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "namespace": namespace, "annotations": annotations},
        }))
        .into_response(),
        None => (
            StatusCode::NOT_FOUND,
            axum::Json(json!({"kind": "Status", "reason": "NotFound", "code": 404})),
        )
            .into_response(),
    }
}

impl StandInApiserver {
    pub async fn start() -> Result<Self, HarnessError> {
        let objects: Shared = Arc::default();
        let app = Router::new()
            .route("/api/v1/namespaces/{name}", get(namespace))
            .route("/api/v1/persistentvolumes", get(pvs))
            .route(
                "/api/v1/namespaces/{namespace}/persistentvolumeclaims/{name}",
                get(pvc),
            )
            .route("/api/v1/nodes", get(nodes))
            .route(
                "/apis/snapshot.storage.k8s.io/v1/volumesnapshotcontents",
                get(contents),
            )
            .with_state(objects.clone());
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let a = l.local_addr()?;
        tokio::spawn(async move {
            let _ = axum::serve(l, app).await;
        });
        let dir = tempfile::tempdir()?;
        let token_file = dir.path().join("token");
        std::fs::write(&token_file, format!("{TOKEN}\n"))?;
        Ok(Self {
            url: format!("http://{a}/"),
            token_file,
            objects,
            _dir: dir,
        })
    }

    /// What it lists, to change.
    pub fn objects(&self) -> MutexGuard<'_, Objects> {
        self.objects.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The plugin flags that point at it.
    pub fn flags(&self) -> Vec<String> {
        vec![
            format!("--kube-apiserver={}", self.url),
            format!("--kube-token-file={}", self.token_file.display()),
        ]
    }

    /// `<binary> orphans --cloud-config=<cloud_conf> <args>
    /// --output=json` against this stand-in: the report it printed (an
    /// error with what it said on standard error when it printed none).
    pub async fn orphan_report(
        &self,
        binary: &std::path::Path,
        cloud_conf: &std::path::Path,
        args: &[&str],
    ) -> Result<OrphanReport, HarnessError> {
        let out = tokio::process::Command::new(binary)
            .arg("orphans")
            .arg(format!("--cloud-config={}", cloud_conf.display()))
            .args(args)
            .arg("--output=json")
            .args(self.flags())
            .output()
            .await?;
        serde_json::from_slice(&out.stdout)
            .map(OrphanReport)
            .map_err(|e| {
                HarnessError::Output(format!(
                    "the orphan report: {e}: {}",
                    String::from_utf8_lossy(&out.stderr)
                ))
            })
    }
}

/// What `<plugin> orphans --output=json` printed.
#[derive(Debug, Clone)]
pub struct OrphanReport(pub Value);

impl OrphanReport {
    /// The ids the report lists under `key` (`orphans`, `unproven`,
    /// `held`, `young`).
    pub fn ids(&self, key: &str) -> Vec<String> {
        self.0["report"][key]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|o| o["id"].as_str().map(str::to_string))
            .collect()
    }
}

impl std::fmt::Display for OrphanReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:#}", self.0)
    }
}
