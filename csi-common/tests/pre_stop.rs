//! The node plugins' pre-stop hook against a stand-in apiserver that keeps
//! state (a node that can be cordoned, VolumeAttachments that go), with a
//! real mount of the driver below a kubelet directory: it returns at once
//! on a node that is not drained, and on a drained one only after the
//! driver's last attachment and last mount are gone, riding out API
//! errors meanwhile.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use csi_common::pre_stop::{Outcome, PreStopArgs, http_handler, run};
use csi_common::registration::RegistrationSocket;
use kube_api::Client;
use plugin_runtime::ExitHolds;

const DRIVER: &str = "cinder.csi.openstack.org";

#[derive(Default)]
struct Cluster {
    unschedulable: bool,
    /// the keys of the node's NoSchedule taints
    taints: Vec<String>,
    /// (name, attacher, node)
    attachments: Vec<(String, String, String)>,
    /// answer the next N lists with 500
    failing_lists: usize,
    /// answer the next N reads of the node with 500
    failing_node_gets: usize,
    /// answer every read of the node with 403 (the RBAC removed)
    forbidden: bool,
    lists: usize,
    node_gets: usize,
}

type Shared = Arc<Mutex<Cluster>>;

async fn node(State(s): State<Shared>) -> Response {
    let mut c = s.lock().unwrap();
    c.node_gets += 1;
    if c.forbidden {
        return (StatusCode::FORBIDDEN, "nodes is forbidden").into_response();
    }
    if c.failing_node_gets > 0 {
        c.failing_node_gets -= 1;
        return (StatusCode::INTERNAL_SERVER_ERROR, "etcd is slow").into_response();
    }
    axum::Json(serde_json::json!({
        "metadata": {"name": "node-1"},
        "spec": {
            "unschedulable": c.unschedulable,
            "taints": c.taints.iter().map(|k| serde_json::json!({"key": k, "effect": "NoSchedule"})).collect::<Vec<_>>(),
        }
    }))
    .into_response()
}

async fn attachments(State(s): State<Shared>) -> Response {
    let mut c = s.lock().unwrap();
    c.lists += 1;
    if c.failing_lists > 0 {
        c.failing_lists -= 1;
        return (StatusCode::INTERNAL_SERVER_ERROR, "etcd is slow").into_response();
    }
    let items: Vec<_> = c
        .attachments
        .iter()
        .map(|(n, a, node)| serde_json::json!({"metadata": {"name": n}, "spec": {"attacher": a, "nodeName": node}}))
        .collect();
    axum::Json(serde_json::json!({ "items": items })).into_response()
}

async fn apiserver(state: Shared) -> Client {
    let app = Router::new()
        .route("/api/v1/nodes/node-1", get(node))
        .route(
            "/apis/storage.k8s.io/v1/volumeattachments",
            get(attachments),
        )
        .with_state(state);
    common::client_of(app).await
}

fn args(root: &Path) -> PreStopArgs {
    // the hook's default idle time on a cordoned node
    args_idle(root, 30)
}

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

#[tokio::test]
async fn a_node_not_being_drained_lets_the_plugin_go_at_once() {
    let state = Shared::default();
    state.lock().unwrap().attachments = vec![("va-1".into(), DRIVER.into(), "node-1".into())];
    let client = apiserver(state.clone()).await;
    let dir = tempfile::tempdir().unwrap();
    let t = Instant::now();
    let out = run(&client, &args(dir.path()), DRIVER).await.unwrap();
    assert_eq!(out, Outcome::NotDraining);
    assert!(t.elapsed() < Duration::from_secs(2));
    assert_eq!(state.lock().unwrap().lists, 0, "nothing listed");
}

#[tokio::test]
async fn a_drained_node_keeps_its_plugin_until_the_last_attachment_and_mount_are_gone() {
    assert!(is_root(), "needs root (a real mount), as every node test");
    let state = Shared::default();
    {
        let mut c = state.lock().unwrap();
        c.unschedulable = true;
        c.failing_lists = 3;
        c.attachments = vec![
            ("va-ours".into(), DRIVER.into(), "node-1".into()),
            // another driver's, and ours on another node: not waited for
            (
                "va-other-driver".into(),
                "other.csi.example.org".into(),
                "node-1".into(),
            ),
            ("va-other-node".into(), DRIVER.into(), "node-2".into()),
        ];
    }
    let client = apiserver(state.clone()).await;
    let dir = tempfile::tempdir().unwrap();
    let staging = dir.path().join(format!(
        "plugins/kubernetes.io/csi/{DRIVER}/0123abcd/globalmount"
    ));
    std::fs::create_dir_all(&staging).unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1m", "stage-test"])
        .arg(&staging)
        .status()
        .unwrap();
    assert!(mounted.success());
    let unmount = Unmount(staging.clone());

    let hook = tokio::spawn({
        let (client, args) = (client.clone(), args(dir.path()));
        async move { run(&client, &args, DRIVER).await }
    });
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(
        !hook.is_finished(),
        "returned with our attachment and mount left"
    );
    // the attachment goes (Kubernetes detached): the mount still holds it
    state
        .lock()
        .unwrap()
        .attachments
        .retain(|(n, _, _)| n != "va-ours");
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(!hook.is_finished(), "returned with our mount left");
    drop(unmount);
    let out = tokio::time::timeout(Duration::from_secs(5), hook)
        .await
        .expect("returned once nothing was left")
        .unwrap()
        .unwrap();
    assert!(matches!(out, Outcome::Released { waited } if waited >= Duration::from_millis(1400)));
    let c = state.lock().unwrap();
    assert_eq!(c.failing_lists, 0, "the failed lists were retried");
    assert!(c.lists > 5);
}

/// Unmounts when dropped (also when the test fails).
struct Unmount(std::path::PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

#[tokio::test]
async fn the_registrars_http_waits_share_one_run_of_the_hook() {
    let state = Shared::default();
    state.lock().unwrap().unschedulable = true;
    state.lock().unwrap().attachments = vec![("va-1".into(), DRIVER.into(), "node-1".into())];
    let client = apiserver(state.clone()).await;
    let dir = tempfile::tempdir().unwrap();
    let handler = http_handler(client, args(dir.path()), DRIVER.into(), None);
    let waits: Vec<_> = (0..20).map(|_| tokio::spawn(handler())).collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        waits.iter().all(|w| !w.is_finished()),
        "answered with an attachment left"
    );
    state.lock().unwrap().attachments.clear();
    for w in waits {
        let (code, body) = tokio::time::timeout(Duration::from_secs(5), w)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(code, 200);
        assert!(body.starts_with("Released"), "{body}");
    }
    assert_eq!(
        state.lock().unwrap().node_gets,
        1,
        "one run for twenty callers"
    );
}

#[tokio::test]
async fn an_early_answer_over_http_is_not_the_answer_at_the_drain() {
    let state = Shared::default();
    state.lock().unwrap().attachments = vec![("va-1".into(), DRIVER.into(), "node-1".into())];
    let client = apiserver(state.clone()).await;
    let dir = tempfile::tempdir().unwrap();
    let handler = http_handler(client, args(dir.path()), DRIVER.into(), None);
    // asked before any drain (by anyone who reaches the port)
    let (code, body) = handler().await;
    assert_eq!((code, body.trim()), (200, "NotDraining"));
    // the drain: the registrar's call waits for the attachment
    state.lock().unwrap().unschedulable = true;
    let wait = tokio::spawn(handler());
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!wait.is_finished(), "the early answer stood for the drain");
    state.lock().unwrap().attachments.clear();
    let (code, body) = tokio::time::timeout(Duration::from_secs(5), wait)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(code, 200);
    assert!(body.starts_with("Released"), "{body}");
    assert_eq!(state.lock().unwrap().node_gets, 2);
}

/// An API error reading the node does not end the hook (kubelet would
/// count a failed hook as done, and the registrar would deregister the
/// driver at once): it reads the node again until it can tell.
#[tokio::test]
async fn an_api_error_reading_the_node_keeps_the_hook_waiting() {
    let state = Shared::default();
    {
        let mut c = state.lock().unwrap();
        c.unschedulable = true;
        c.failing_node_gets = 3;
        c.attachments = vec![("va-1".into(), DRIVER.into(), "node-1".into())];
    }
    let client = apiserver(state.clone()).await;
    let dir = tempfile::tempdir().unwrap();
    let hook = tokio::spawn({
        let (client, args) = (client.clone(), args(dir.path()));
        async move { run(&client, &args, DRIVER).await }
    });
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(!hook.is_finished(), "ended on an API error");
    assert_eq!(state.lock().unwrap().failing_node_gets, 0, "read again");
    state.lock().unwrap().attachments.clear();
    let out = tokio::time::timeout(Duration::from_secs(5), hook)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(matches!(out, Outcome::Released { .. }), "{out:?}");

    // the driver's RBAC removed (an uninstall): a refusal ends the hook at
    // once instead of holding the plugin for its grace period
    state.lock().unwrap().forbidden = true;
    let t = Instant::now();
    let err = run(&client, &args(dir.path()), DRIVER).await.unwrap_err();
    assert!(
        err.to_string().contains("403") || err.to_string().contains("forbidden"),
        "{err}"
    );
    assert!(t.elapsed() < Duration::from_secs(2));
}

/// Anyone who reaches the plugin's port can ask `/pre-stop` in a loop:
/// each answer is of now, but runs start at most once per poll interval,
/// so the flood costs the API at most one read of the node per interval.
#[tokio::test]
async fn a_flood_of_http_asks_costs_one_node_read_per_interval() {
    let state = Shared::default();
    let client = apiserver(state.clone()).await;
    let dir = tempfile::tempdir().unwrap();
    let handler = http_handler(client, args(dir.path()), DRIVER.into(), None);
    let t = Instant::now();
    let mut answers = 0;
    while t.elapsed() < Duration::from_secs(1) {
        let (code, body) = handler().await;
        assert_eq!((code, body.trim()), (200, "NotDraining"));
        answers += 1;
    }
    let reads = state.lock().unwrap().node_gets;
    // the interval is 100 ms here: about ten runs in the second
    assert!(
        reads <= 12,
        "{reads} reads of the node for {answers} asks in 1 s"
    );
    assert!(answers >= 5, "every ask answered: {answers}");
}

fn args_idle(root: &Path, idle_secs: u64) -> PreStopArgs {
    use clap::Parser;
    PreStopArgs::parse_from([
        "pre-stop-hook",
        "--node-name=node-1",
        &format!("--path-root={}", root.display()),
        "--poll-interval-ms=100",
        &format!("--cordoned-idle-secs={idle_secs}"),
    ])
}

/// A node cordoned for maintenance (no drain under way): a plugin rolled
/// out there stops once none of its volumes left for the idle time, not
/// after its whole grace period; a node the autoscaler removes keeps it
/// until its volumes are gone.
#[tokio::test]
async fn a_cordoned_node_whose_volumes_stay_lets_the_plugin_go_after_the_idle_time() {
    let state = Shared::default();
    {
        let mut c = state.lock().unwrap();
        c.unschedulable = true;
        c.attachments = vec![("va-1".into(), DRIVER.into(), "node-1".into())];
    }
    let client = apiserver(state.clone()).await;
    let dir = tempfile::tempdir().unwrap();
    let out = tokio::time::timeout(
        Duration::from_secs(20),
        run(&client, &args_idle(dir.path(), 1), DRIVER),
    )
    .await
    .expect("a cordoned node held the plugin past its idle time")
    .unwrap();
    assert!(
        matches!(out, Outcome::CordonedIdle { waited } if waited >= Duration::from_secs(1)),
        "{out:?}"
    );

    // the autoscaler's taint: the node goes away, its volumes must leave
    state.lock().unwrap().taints = vec!["ToBeDeletedByClusterAutoscaler".into()];
    let waiting = tokio::spawn({
        let (client, root) = (client.clone(), dir.path().to_path_buf());
        async move { run(&client, &args_idle(&root, 1), DRIVER).await }
    });
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        !waiting.is_finished(),
        "left a node being removed before its volumes"
    );
    state.lock().unwrap().attachments.clear();
    let out = tokio::time::timeout(Duration::from_secs(20), waiting)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(matches!(out, Outcome::Released { .. }), "{out:?}");
}

/// A cordoned node whose volumes keep leaving is being drained: each
/// volume that leaves starts the idle time again.
#[tokio::test]
async fn a_cordoned_node_whose_volumes_keep_leaving_keeps_the_plugin_until_the_last() {
    let state = Shared::default();
    {
        let mut c = state.lock().unwrap();
        c.unschedulable = true;
        c.attachments = (1..=4)
            .map(|i| (format!("va-{i}"), DRIVER.to_string(), "node-1".to_string()))
            .collect();
    }
    let client = apiserver(state.clone()).await;
    let dir = tempfile::tempdir().unwrap();
    let waiting = tokio::spawn({
        let (client, root) = (client.clone(), dir.path().to_path_buf());
        async move { run(&client, &args_idle(&root, 3), DRIVER).await }
    });
    // one leaves every 1.5 s: 6 s in all, twice the idle time
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert!(!waiting.is_finished(), "left while volumes were leaving");
        state.lock().unwrap().attachments.pop();
    }
    let out = tokio::time::timeout(Duration::from_secs(20), waiting)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(
        matches!(out, Outcome::Released { waited } if waited >= Duration::from_secs(5)),
        "{out:?}"
    );
}

/// A registrar's socket at the driver's registration path.
fn registrar_socket(path: &Path) -> (std::os::unix::net::UnixListener, u64) {
    use std::os::unix::fs::MetadataExt;
    let _ = std::fs::remove_file(path);
    let listener = std::os::unix::net::UnixListener::bind(path).unwrap();
    let ino = std::fs::metadata(path).unwrap().ino();
    (listener, ino)
}

fn registration(root: &Path) -> (RegistrationSocket, ExitHolds) {
    std::fs::create_dir_all(root.join("plugins_registry")).unwrap();
    (RegistrationSocket::new(root, DRIVER), ExitHolds::default())
}

fn kept_links(root: &Path) -> Vec<String> {
    std::fs::read_dir(root.join("plugins_registry"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .filter(|n| n.starts_with('.'))
        .collect()
}

/// A node's registration folder with our registrar's socket at the
/// driver's registration path, and the plugin's `/pre-stop` handler that
/// hands that path over.
struct Handover {
    dir: tempfile::TempDir,
    path: std::path::PathBuf,
    holds: ExitHolds,
    /// our registrar's socket, until it stops
    ours: Option<std::os::unix::net::UnixListener>,
    handler: plugin_runtime::http_endpoint::HttpHandler,
}

impl Handover {
    /// `removal_bound`: how long the plugin waits for the registrar to
    /// remove the path (the default when `None`).
    async fn new(removal_bound: Option<Duration>) -> Self {
        let client = apiserver(Shared::default()).await;
        let dir = tempfile::tempdir().unwrap();
        let (mut socket, holds) = registration(dir.path());
        if let Some(bound) = removal_bound {
            socket = socket.with_removal_bound(bound);
        }
        let path = socket.path().to_path_buf();
        let (ours, _) = registrar_socket(&path);
        let handler = http_handler(
            client,
            args(dir.path()),
            DRIVER.into(),
            Some((socket, holds.clone())),
        );
        Self {
            dir,
            path,
            holds,
            ours: Some(ours),
            handler,
        }
    }

    /// node-driver-registrar's SIGTERM: os.Remove(path), os.Exit(0); then
    /// the plugin's holds run out.
    async fn our_registrar_stops(&mut self) {
        std::fs::remove_file(&self.path).unwrap();
        drop(self.ours.take());
        self.holds.wait(Duration::from_secs(5)).await;
    }
}

/// The successor's socket is at the registration path (kubelet registers
/// the driver again through it) and no kept link is left below `root`.
fn assert_put_back(
    root: &Path,
    path: &Path,
    successor: &std::os::unix::net::UnixListener,
    successor_ino: u64,
) {
    use std::os::unix::fs::MetadataExt;
    let back = std::fs::symlink_metadata(path)
        .expect("the successor's socket, removed by our registrar, was not put back");
    assert_eq!(
        back.ino(),
        successor_ino,
        "another socket than the successor's"
    );
    std::os::unix::net::UnixStream::connect(path).unwrap();
    successor.accept().unwrap();
    assert_eq!(kept_links(root), Vec::<String>::new());
}

/// The rollback to upstream's release: its registrar replaced ours' socket
/// at the registration path; ours, told to stop after the plugin's answer,
/// removes the path and exits. The successor's socket is back at the path
/// (kubelet registers the driver again through it), and nothing is left.
#[tokio::test]
async fn a_successors_registration_socket_removed_by_our_stopping_registrar_is_put_back() {
    let mut h = Handover::new(None).await;
    let (successor, successor_ino) = registrar_socket(&h.path);
    assert_eq!((h.handler)().await, (200, "NotDraining\n".into()));
    h.our_registrar_stops().await;
    assert_put_back(h.dir.path(), &h.path, &successor, successor_ino);
}

/// An ordinary stop (an uninstall, a rolling update): the registrar
/// removes its own socket and exits; nothing is put back.
#[tokio::test]
async fn our_registrars_own_socket_stays_removed_when_it_stops() {
    let mut h = Handover::new(None).await;
    assert_eq!((h.handler)().await.0, 200);
    h.our_registrar_stops().await;
    assert!(
        std::fs::symlink_metadata(&h.path).is_err(),
        "a dead registrar's socket was put back for kubelet"
    );
    assert_eq!(kept_links(h.dir.path()), Vec::<String>::new());
}

/// Anyone on the node's loopback can ask /pre-stop: with no registrar
/// stopping, the path keeps its socket and the kept link goes.
#[tokio::test]
async fn an_ask_without_a_stop_leaves_the_registration_socket_as_it_was() {
    use std::os::unix::fs::MetadataExt;
    let h = Handover::new(Some(Duration::from_millis(300))).await;
    let ino = std::fs::metadata(&h.path).unwrap().ino();
    assert_eq!((h.handler)().await.0, 200);
    assert_eq!(
        kept_links(h.dir.path()).len(),
        1,
        "nothing kept while the registrar may stop"
    );
    h.holds.wait(Duration::from_secs(5)).await;
    assert_eq!(std::fs::symlink_metadata(&h.path).unwrap().ino(), ino);
    assert_eq!(kept_links(h.dir.path()), Vec::<String>::new());
}

/// Upstream's pod starting in the same second as ours stops: its registrar
/// replaces the socket at the path after the plugin kept ours', and ours,
/// stopping, then removes the path, which holds the successor's socket by
/// now. The socket put back is the one the path held last: the
/// successor's.
#[tokio::test]
async fn a_successor_that_replaces_the_socket_after_it_was_kept_is_the_one_put_back() {
    let mut h = Handover::new(None).await;
    assert_eq!((h.handler)().await, (200, "NotDraining\n".into()));
    // the successor's registrar starts: os.Remove(path), then listens there
    let (successor, successor_ino) = registrar_socket(&h.path);
    tokio::time::sleep(Duration::from_millis(200)).await;
    // ours is told to stop: it removes the path and exits
    h.our_registrar_stops().await;
    assert_put_back(h.dir.path(), &h.path, &successor, successor_ino);
}

fn free_loopback_port() -> std::net::SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// A tiny HTTP/1.1 GET (no HTTP client among the dev-dependencies).
async fn http_get(addr: std::net::SocketAddr, path: &str) -> std::io::Result<u16> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).await?;
    Ok(buf
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0))
}

/// Kubelet runs a pod's preStop hooks side by side: the plugin's own may
/// end, and the plugin be told to stop, before the registrar's request
/// reaches it. The plugin, stopping, still answers the registrar, and the
/// successor's socket its registrar then removes is put back before the
/// plugin exits.
#[tokio::test]
async fn a_plugin_told_to_stop_before_its_registrar_asks_still_hands_the_socket_over() {
    let dir = tempfile::tempdir().unwrap();
    let (socket, _) = registration(dir.path());
    let path = socket.path().to_path_buf();
    let (ours, _) = registrar_socket(&path);
    let (successor, successor_ino) = registrar_socket(&path);
    let addr = free_loopback_port();
    let (stop, serving) = serving_plugin(dir.path(), addr).await;
    // the plugin is told to stop first
    stop.send(()).unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    // then the registrar's preStop asks, and the registrar stops
    assert_eq!(
        http_get(addr, "/pre-stop").await.ok(),
        Some(200),
        "the stopping plugin did not answer its registrar's preStop"
    );
    std::fs::remove_file(&path).unwrap();
    drop(ours);
    tokio::time::timeout(Duration::from_secs(10), serving)
        .await
        .expect("the plugin did not exit")
        .unwrap()
        .unwrap();
    assert_put_back(dir.path(), &path, &successor, successor_ino);
}

/// The plugin serving with its `/pre-stop` route on `addr` (and so the
/// guard of its registration socket) in `dir`; stopped through the sender.
async fn serving_plugin(
    dir: &Path,
    addr: std::net::SocketAddr,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<Result<(), plugin_runtime::RuntimeError>>,
) {
    let client = apiserver(Shared::default()).await;
    let csi_socket = dir.join("csi.sock");
    let server = csi_common::pre_stop::with_route(
        plugin_runtime::PluginServer::new(
            format!("unix://{}", csi_socket.display()).parse().unwrap(),
        ),
        client,
        args(dir),
        DRIVER,
        addr,
    );
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(server.serve(tonic::service::Routes::default(), async move {
        let _ = stopped.await;
    }));
    for _ in 0..500 {
        if csi_socket.exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(csi_socket.exists(), "the plugin never served");
    (stop, serving)
}

/// Upstream's release replaced by ours: our registrar made its socket
/// while upstream's pod was still stopping, and upstream's registrar,
/// stopping, removes the path (by then ours'). Upstream's plugin puts
/// nothing back (it cannot see the folder); ours does, its registrar
/// still serving: kubelet registers the driver again within seconds. Our
/// own registrar's stop (its socket gone with it) is not undone, and
/// nothing is left once the plugin stops.
#[tokio::test]
async fn our_registrars_socket_removed_by_another_releases_stopping_registrar_is_put_back() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let (socket, _) = registration(dir.path());
    let path = socket.path().to_path_buf();
    let (stop, serving) = serving_plugin(dir.path(), free_loopback_port()).await;
    let (ours, ours_ino) = registrar_socket(&path);
    // the guard links it within its interval
    tokio::time::sleep(Duration::from_millis(600)).await;
    // upstream's registrar stops: os.Remove(path)
    std::fs::remove_file(&path).unwrap();
    let removed = Instant::now();
    let mut back = None;
    while removed.elapsed() < Duration::from_secs(5) {
        if let Ok(m) = std::fs::symlink_metadata(&path) {
            back = Some(m.ino());
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        back,
        Some(ours_ino),
        "our registrar's socket, removed by another's, was not put back within 5 s"
    );
    println!(
        "our registrar's socket put back {:?} after its removal",
        removed.elapsed()
    );
    std::os::unix::net::UnixStream::connect(&path).unwrap();
    ours.accept().unwrap();

    // our own registrar restarts: it removes its socket and exits
    std::fs::remove_file(&path).unwrap();
    drop(ours);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        std::fs::symlink_metadata(&path).is_err(),
        "a stopped registrar's socket was put back for kubelet"
    );
    // its restart makes a new one, guarded in its turn
    let (again, again_ino) = registrar_socket(&path);
    tokio::time::sleep(Duration::from_millis(600)).await;
    std::fs::remove_file(&path).unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        std::fs::symlink_metadata(&path).map(|m| m.ino()).ok(),
        Some(again_ino),
        "the restarted registrar's socket is not guarded"
    );
    drop(again);

    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), serving)
        .await
        .expect("the plugin did not exit")
        .unwrap()
        .unwrap();
    assert_eq!(kept_links(dir.path()), Vec::<String>::new());
}
