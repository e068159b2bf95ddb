//! The node plugins' startup taint against a stand-in apiserver that keeps
//! state (a node and its taints, a CSINode kubelet fills in, JSON patches
//! applied with their `test` operations): the taint stays until the
//! driver is registered with its attach limit, only that taint goes, a
//! node changed under the patch is read again, and a refusal is ridden
//! out.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use csi_common::startup_taint::{Outcome, StartupTaint, not_registered, taint_key};
use kube_api::Client;
use serde_json::{Value, json};

const DRIVER: &str = "cinder.csi.openstack.org";

#[derive(Default)]
struct Cluster {
    taints: Vec<Value>,
    /// the CSINode, once kubelet made it
    csi_node: Option<Value>,
    node_gets: usize,
    patches: Vec<Value>,
    /// before applying the next patch, someone else adds this taint first
    race_with: Option<Value>,
    /// answer the next N patches 403, as a missing RBAC rule would
    forbidden: usize,
    content_types: Vec<String>,
}

type Shared = Arc<Mutex<Cluster>>;

async fn node(State(s): State<Shared>) -> Response {
    let mut c = s.lock().unwrap();
    c.node_gets += 1;
    axum::Json(json!({"metadata": {"name": "node-1"}, "spec": {"taints": c.taints}}))
        .into_response()
}

async fn csi_node(State(s): State<Shared>) -> Response {
    let c = s.lock().unwrap();
    match &c.csi_node {
        Some(v) => axum::Json(v.clone()).into_response(),
        None => (
            StatusCode::NOT_FOUND,
            axum::Json(json!({"kind": "Status", "reason": "NotFound"})),
        )
            .into_response(),
    }
}

/// A JSON patch as the apiserver applies it: all or nothing, 422 when a
/// `test` fails.
async fn patch_node(State(s): State<Shared>, h: HeaderMap, body: String) -> Response {
    let mut c = s.lock().unwrap();
    c.content_types.push(
        h.get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string(),
    );
    if c.forbidden > 0 {
        c.forbidden -= 1;
        return (
            StatusCode::FORBIDDEN,
            axum::Json(json!({"kind": "Status", "reason": "Forbidden", "message": "nodes \"node-1\" is forbidden"})),
        )
            .into_response();
    }
    if let Some(t) = c.race_with.take() {
        c.taints.insert(0, t);
    }
    let ops: Vec<Value> = serde_json::from_str(&body).unwrap();
    c.patches.push(Value::Array(ops.clone()));
    let mut taints = c.taints.clone();
    for op in &ops {
        let path = op["path"].as_str().unwrap();
        let rest = path
            .strip_prefix("/spec/taints/")
            .expect("only taints are patched");
        let (index, field) = match rest.split_once('/') {
            Some((i, f)) => (i.parse::<usize>().unwrap(), Some(f)),
            None => (rest.parse::<usize>().unwrap(), None),
        };
        match (op["op"].as_str().unwrap(), field) {
            ("test", Some(f)) => {
                if taints.get(index).map(|t| &t[f]) != Some(&op["value"]) {
                    return (
                        StatusCode::UNPROCESSABLE_ENTITY,
                        axum::Json(json!({"kind": "Status", "reason": "Invalid", "message": "the test failed"})),
                    )
                        .into_response();
                }
            }
            ("remove", None) if index < taints.len() => {
                taints.remove(index);
            }
            other => panic!("unexpected operation {other:?} in {ops:?}"),
        }
    }
    c.taints = taints;
    axum::Json(json!({"metadata": {"name": "node-1"}, "spec": {"taints": c.taints}}))
        .into_response()
}

async fn apiserver(state: Shared) -> Client {
    let app = Router::new()
        .route("/api/v1/nodes/node-1", get(node).patch(patch_node))
        .route("/apis/storage.k8s.io/v1/csinodes/node-1", get(csi_node))
        .with_state(state);
    common::client_of(app).await
}

fn taint(key: &str, effect: &str) -> Value {
    json!({"key": key, "effect": effect})
}

fn job(client: Client) -> StartupTaint {
    StartupTaint {
        client,
        node: "node-1".into(),
        driver: DRIVER.into(),
        wants_allocatable: true,
        poll: Duration::from_millis(50),
    }
}

fn keys(s: &Shared) -> Vec<String> {
    s.lock()
        .unwrap()
        .taints
        .iter()
        .map(|t| {
            format!(
                "{}:{}",
                t["key"].as_str().unwrap(),
                t["effect"].as_str().unwrap()
            )
        })
        .collect()
}

#[tokio::test]
async fn the_taint_stays_until_kubelet_registered_the_driver_and_its_limit_then_only_it_goes() {
    let state = Shared::default();
    let manila = taint_key("nfs.manila.csi.openstack.org");
    state.lock().unwrap().taints = vec![
        taint("node.kubernetes.io/not-ready", "NoSchedule"),
        taint(&taint_key(DRIVER), "NoExecute"),
        taint(&manila, "NoExecute"),
        taint(&taint_key(DRIVER), "NoSchedule"),
    ];
    let client = apiserver(state.clone()).await;
    let run = tokio::spawn(async move { job(client).remove_when_registered().await });

    // kubelet makes the CSINode, registers another driver, then ours
    // without and then with its limit: the taint stays through all of it
    let steps = [
        json!({"spec": {"drivers": null}}),
        json!({"spec": {"drivers": [{"name": "nfs.manila.csi.openstack.org", "nodeID": "n"}]}}),
        json!({"spec": {"drivers": [{"name": DRIVER, "nodeID": "server-1"}]}}),
    ];
    for step in steps {
        state.lock().unwrap().csi_node = Some(step.clone());
        let gets = state.lock().unwrap().node_gets;
        while state.lock().unwrap().node_gets < gets + 3 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(
            keys(&state).contains(&format!("{}:NoExecute", taint_key(DRIVER))),
            "the taint stayed with the CSINode at {step}"
        );
        assert!(state.lock().unwrap().patches.is_empty());
    }
    state.lock().unwrap().csi_node = Some(json!({"spec": {"drivers": [
        {"name": DRIVER, "nodeID": "server-1", "allocatable": {"count": 25}}
    ]}}));
    let outcome = tokio::time::timeout(Duration::from_secs(10), run)
        .await
        .expect("removed once registered")
        .unwrap();
    assert!(matches!(outcome, Outcome::Removed { .. }), "{outcome:?}");
    assert_eq!(
        keys(&state),
        [
            "node.kubernetes.io/not-ready:NoSchedule".to_string(),
            format!("{manila}:NoExecute"),
        ],
        "both effects of the driver's taint went, and nothing else"
    );
    let c = state.lock().unwrap();
    assert_eq!(c.patches.len(), 1, "one patch: {:?}", c.patches);
    assert_eq!(c.content_types, ["application/json-patch+json"]);
}

#[tokio::test]
async fn a_node_without_the_taint_is_left_alone() {
    let state = Shared::default();
    state.lock().unwrap().taints = vec![taint(&taint_key("other.csi.example.org"), "NoExecute")];
    let client = apiserver(state.clone()).await;
    let outcome = job(client).remove_when_registered().await;
    assert_eq!(outcome, Outcome::NotTainted);
    assert!(state.lock().unwrap().patches.is_empty());
    assert_eq!(keys(&state).len(), 1);
}

#[tokio::test]
async fn a_node_changed_under_the_patch_is_read_again_and_a_refusal_is_ridden_out() {
    let state = Shared::default();
    {
        let mut c = state.lock().unwrap();
        c.taints = vec![taint(&taint_key(DRIVER), "NoExecute")];
        c.csi_node = Some(json!({"spec": {"drivers": [
            {"name": DRIVER, "nodeID": "server-1", "allocatable": {"count": 25}}
        ]}}));
        // a missing permission first, then someone adds a taint between
        // the read and the patch
        c.forbidden = 2;
        c.race_with = Some(taint("example.com/maintenance", "NoSchedule"));
    }
    let client = apiserver(state.clone()).await;
    let outcome = tokio::time::timeout(
        Duration::from_secs(10),
        job(client).remove_when_registered(),
    )
    .await
    .expect("removed in the end");
    assert!(matches!(outcome, Outcome::Removed { .. }), "{outcome:?}");
    assert_eq!(keys(&state), ["example.com/maintenance:NoSchedule"]);
    let c = state.lock().unwrap();
    // the patch after the race tested index 0, which no longer held the
    // taint: refused whole; the next one, from a fresh read, tested index 1
    assert_eq!(c.patches.len(), 2, "{:?}", c.patches);
    assert_eq!(c.patches[1][0]["path"], "/spec/taints/1/key");
}

#[test]
fn registered_means_listed_with_a_limit_when_the_driver_has_one() {
    let node = |v: Value| -> kube_api::CsiNode { serde_json::from_value(v).unwrap() };
    assert!(not_registered(None, "uid-1", DRIVER, false).is_some());
    // kubelet's CSINode of a node without drivers says `null`
    let none = node(json!({"spec": {"drivers": null}}));
    assert!(not_registered(Some(&none), "uid-1", DRIVER, false).is_some());
    let listed = node(json!({
        "metadata": {"ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": "node-1", "uid": "uid-1"}]},
        "spec": {"drivers": [{"name": DRIVER, "nodeID": "x"}]}
    }));
    assert!(not_registered(Some(&listed), "uid-1", DRIVER, false).is_none());
    assert!(not_registered(Some(&listed), "uid-1", DRIVER, true).is_some());
    assert!(not_registered(Some(&listed), "uid-1", "other", false).is_some());
    // the same name, another node: a replaced machine's leftover
    let why = not_registered(Some(&listed), "uid-2", DRIVER, false).unwrap();
    assert!(why.contains("earlier node"), "{why}");
}
