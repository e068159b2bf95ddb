//! The client against a stand-in apiserver on loopback: what it sends
//! (token, selectors, delete options) and how it reads the answers
//! (404, 409, Status errors), and that no redirect carries its token away.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use kube_api::{Client, Created, Token};

#[derive(Default)]
struct Seen {
    tokens: Vec<String>,
    queries: Vec<HashMap<String, String>>,
    deletes: Vec<serde_json::Value>,
}

type Shared = Arc<Mutex<Seen>>;

fn record(s: &Shared, h: &HeaderMap) {
    let t = h
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    s.lock().unwrap().tokens.push(t);
}

fn pod(name: &str, phase: &str) -> serde_json::Value {
    serde_json::json!({
        "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}")},
        "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "img:1"}]},
        "status": {"phase": phase, "containerStatuses": [{"name": "c", "state": {"terminated": {"exitCode": 1, "reason": "Error", "message": "ceph-fuse: bad key"}}}]}
    })
}

fn status(code: StatusCode, reason: &str) -> Response {
    (
        code,
        axum::Json(serde_json::json!({"kind": "Status", "reason": reason, "message": format!("{reason} here")})),
    )
        .into_response()
}

async fn serve(app: Router) -> String {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let a = l.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
    format!("http://{a}/")
}

async fn apiserver(seen: Shared, elsewhere: String) -> String {
    let app = Router::new()
        .route(
            "/api/v1/namespaces/ns/pods",
            get(
                |State(s): State<Shared>,
                 h: HeaderMap,
                 Query(q): Query<HashMap<String, String>>| async move {
                    record(&s, &h);
                    s.lock().unwrap().queries.push(q);
                    axum::Json(
                        serde_json::json!({"items": [pod("a", "Running"), pod("b", "Failed")]}),
                    )
                    .into_response()
                },
            )
            .post(
                |State(s): State<Shared>,
                 h: HeaderMap,
                 axum::Json(body): axum::Json<serde_json::Value>| async move {
                    record(&s, &h);
                    let name = body["metadata"]["name"].as_str().unwrap_or("").to_string();
                    if name == "taken" {
                        return status(StatusCode::CONFLICT, "AlreadyExists");
                    }
                    if name == "refused" {
                        return status(StatusCode::FORBIDDEN, "Forbidden");
                    }
                    (StatusCode::CREATED, axum::Json(pod(&name, "Pending"))).into_response()
                },
            ),
        )
        .route(
            "/api/v1/namespaces/ns/pods/{name}",
            get(
                |State(s): State<Shared>, h: HeaderMap, Path(name): Path<String>| async move {
                    record(&s, &h);
                    match name.as_str() {
                        "gone" => status(StatusCode::NOT_FOUND, "NotFound"),
                        "moved" => (
                            StatusCode::TEMPORARY_REDIRECT,
                            [(
                                "location",
                                format!("{elsewhere}api/v1/namespaces/ns/pods/x"),
                            )],
                        )
                            .into_response(),
                        n => axum::Json(pod(n, "Failed")).into_response(),
                    }
                },
            )
            .delete(
                |State(s): State<Shared>,
                 h: HeaderMap,
                 Path(name): Path<String>,
                 axum::Json(body): axum::Json<serde_json::Value>| async move {
                    record(&s, &h);
                    s.lock().unwrap().deletes.push(body);
                    if name == "gone" {
                        return status(StatusCode::NOT_FOUND, "NotFound");
                    }
                    axum::Json(pod(&name, "Running")).into_response()
                },
            ),
        )
        .route(
            "/api/v1/namespaces/ns/podtemplates",
            get(
                |State(s): State<Shared>,
                 h: HeaderMap,
                 Query(q): Query<HashMap<String, String>>| async move {
                    record(&s, &h);
                    s.lock().unwrap().queries.push(q);
                    axum::Json(serde_json::json!({"items": [{
                        "metadata": {"name": "tpl", "namespace": "ns", "uid": "uid-tpl"},
                        "template": {"spec": {"containers": [{"name": "c", "image": "img:1"}]}}
                    }]}))
                },
            ),
        )
        .with_state(seen);
    serve(app).await
}

#[tokio::test]
async fn pod_templates_are_listed_by_their_labels_for_their_uid() {
    let seen: Shared = Default::default();
    let url = apiserver(seen.clone(), "http://127.0.0.1:9/".into()).await;
    let c = Client::new(url.parse().unwrap(), None, Token::Fixed("t".into())).unwrap();
    let found = c.list_pod_templates("ns", "a=b,c=d").await.unwrap();
    assert_eq!(
        found
            .iter()
            .map(|m| (m.name.as_str(), m.uid.as_str()))
            .collect::<Vec<_>>(),
        [("tpl", "uid-tpl")]
    );
    let s = seen.lock().unwrap();
    assert_eq!(
        s.queries[0].get("labelSelector").map(String::as_str),
        Some("a=b,c=d")
    );
    assert_eq!(s.tokens, ["Bearer t"]);
}

#[tokio::test]
async fn pods_are_read_created_and_deleted_with_a_fresh_token_each_time() {
    let seen: Shared = Default::default();
    let url = apiserver(seen.clone(), "http://127.0.0.1:9/".into()).await;
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "first\n").unwrap();
    let c = Client::new(url.parse().unwrap(), None, Token::File(token.clone())).unwrap();

    let p = c.get_pod("ns", "m1").await.unwrap().unwrap();
    assert_eq!(p.metadata.uid, "uid-m1");
    assert_eq!(p.spec.node_name, "n1");
    assert!(p.finished());
    let why = p.trouble().unwrap();
    assert!(
        why.contains("exit code 1") && why.contains("ceph-fuse: bad key"),
        "{why}"
    );
    assert!(
        c.get_pod("ns", "gone").await.unwrap().is_none(),
        "404 is None"
    );

    // kubelet rotates the projected token: the next call sends the new one
    std::fs::write(&token, "second").unwrap();
    let listed = c
        .list_pods("ns", "app=x", "spec.nodeName=n1")
        .await
        .unwrap();
    assert_eq!(listed.len(), 2);
    assert_eq!(listed[0].status.phase, "Running");
    {
        let s = seen.lock().unwrap();
        assert_eq!(
            s.tokens,
            vec!["Bearer first", "Bearer first", "Bearer second"]
        );
        assert_eq!(
            s.queries[0].get("labelSelector").map(String::as_str),
            Some("app=x")
        );
        assert_eq!(
            s.queries[0].get("fieldSelector").map(String::as_str),
            Some("spec.nodeName=n1")
        );
    }

    let body = serde_json::json!({"metadata": {"name": "new"}});
    assert!(
        matches!(c.create_pod("ns", &body).await.unwrap(), Created::New(p) if p.metadata.name == "new")
    );
    let taken = serde_json::json!({"metadata": {"name": "taken"}});
    assert!(matches!(
        c.create_pod("ns", &taken).await.unwrap(),
        Created::AlreadyExists
    ));
    let refused = serde_json::json!({"metadata": {"name": "refused"}});
    let e = c.create_pod("ns", &refused).await.unwrap_err();
    assert_eq!(e.status(), Some(403));
    assert!(e.to_string().contains("Forbidden"), "{e}");

    c.delete_pod("ns", "m1", Some(0), Some("uid-m1"))
        .await
        .unwrap();
    c.delete_pod("ns", "gone", None, None).await.unwrap();
    let s = seen.lock().unwrap();
    assert_eq!(s.deletes[0]["gracePeriodSeconds"], 0);
    assert_eq!(s.deletes[0]["preconditions"]["uid"], "uid-m1");
    assert!(s.deletes[1].get("gracePeriodSeconds").is_none());
}

#[tokio::test]
async fn a_redirect_is_never_followed_with_the_token() {
    let elsewhere: Shared = Default::default();
    let thief = serve(
        Router::new()
            .fallback(|State(s): State<Shared>, h: HeaderMap| async move {
                record(&s, &h);
                axum::Json(pod("x", "Running")).into_response()
            })
            .with_state(elsewhere.clone()),
    )
    .await;
    let url = apiserver(Default::default(), thief).await;
    let c = Client::new(url.parse().unwrap(), None, Token::Fixed("secret".into())).unwrap();
    let e = c.get_pod("ns", "moved").await.unwrap_err();
    assert_eq!(e.status(), Some(307), "{e}");
    assert!(
        elsewhere.lock().unwrap().tokens.is_empty(),
        "the token went across a redirect"
    );
}

#[test]
fn https_needs_the_cluster_ca_and_in_cluster_needs_a_cluster() {
    let e = Client::new(
        "https://127.0.0.1:6443/".parse().unwrap(),
        None,
        Token::Fixed("t".into()),
    )
    .unwrap_err();
    assert!(e.to_string().contains("CA"), "{e}");
    let e = Client::new(
        "https://127.0.0.1:6443/".parse().unwrap(),
        Some(b"not a certificate"),
        Token::Fixed("t".into()),
    )
    .unwrap_err();
    assert!(e.to_string().contains("no certificate"), "{e}");
}

#[tokio::test]
async fn a_node_name_can_only_name_a_node() {
    // nothing listens there: a name refused is refused before any request
    let client = Client::new(
        "http://127.0.0.1:9/".parse().unwrap(),
        None,
        Token::Fixed("t".into()),
    )
    .unwrap();
    for bad in [
        "../namespaces/kube-system/secrets",
        "a/b",
        "",
        "Node-1",
        "a..b",
        "-a",
        "a?watch=1",
    ] {
        let e = client.get_node(bad).await.unwrap_err();
        assert!(matches!(e, kube_api::KubeError::Config(_)), "{bad:?}: {e}");
        let e = client.get_csi_node(bad).await.unwrap_err();
        assert!(matches!(e, kube_api::KubeError::Config(_)), "{bad:?}: {e}");
    }
    // a valid name gets as far as the (absent) apiserver
    let e = client
        .get_node("k8s-test-node-b.example")
        .await
        .unwrap_err();
    assert!(matches!(e, kube_api::KubeError::Transport { .. }), "{e}");
}
