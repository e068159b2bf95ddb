//! The runtime through a real Unix socket: socket rules, graceful
//! shutdown with a call in flight, per-RPC metrics, /healthz.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use plugin_runtime::{Endpoint, EndpointError, PluginServer, RuntimeError, connect_unix};
use proto::csi::v1::identity_client::IdentityClient;
use proto::csi::v1::identity_server::{Identity, IdentityServer};
use proto::csi::v1::*;
use tonic::{Request, Response, Status};

struct SlowIdentity;

#[tonic::async_trait]
impl Identity for SlowIdentity {
    async fn get_plugin_info(
        &self,
        _r: Request<GetPluginInfoRequest>,
    ) -> Result<Response<GetPluginInfoResponse>, Status> {
        Ok(Response::new(GetPluginInfoResponse {
            name: "test.csi".into(),
            vendor_version: "1".into(),
            manifest: Default::default(),
        }))
    }
    async fn get_plugin_capabilities(
        &self,
        _r: Request<GetPluginCapabilitiesRequest>,
    ) -> Result<Response<GetPluginCapabilitiesResponse>, Status> {
        Err(Status::invalid_argument("no capabilities here"))
    }
    async fn probe(&self, _r: Request<ProbeRequest>) -> Result<Response<ProbeResponse>, Status> {
        tokio::time::sleep(Duration::from_millis(600)).await;
        Ok(Response::new(ProbeResponse { ready: Some(true) }))
    }
}

fn routes() -> tonic::service::Routes {
    tonic::service::Routes::new(IdentityServer::new(SlowIdentity))
}

async fn wait_for_socket(p: &Path) {
    for _ in 0..200 {
        if p.exists() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("socket {} never appeared", p.display());
}

#[tokio::test]
async fn serves_with_mode_drains_in_flight_calls_and_removes_the_socket() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("nested/dir/csi.sock");
    let endpoint: Endpoint = format!("unix://{}", sock.display()).parse().unwrap();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let (http_tx, http_rx) = tokio::sync::oneshot::channel();
    let healthy = Arc::new(AtomicBool::new(true));
    let h = healthy.clone();
    let server = PluginServer::new(endpoint)
        .socket_mode(0o600)
        .http_endpoint(Some("127.0.0.1:0".parse().unwrap()))
        .report_http_address(http_tx)
        .health_check(Arc::new(move || {
            let ok = h.load(Ordering::SeqCst);
            Box::pin(async move {
                if ok {
                    Ok(None)
                } else {
                    Err("cloud unreachable".into())
                }
            })
        }));
    let task = tokio::spawn(server.serve(routes(), async move {
        let _ = stop_rx.await;
    }));
    wait_for_socket(&sock).await;
    let meta = std::fs::metadata(&sock).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    let http = http_rx.await.unwrap();

    let mut client = IdentityClient::new(connect_unix(&sock).await.unwrap());
    assert_eq!(
        client
            .get_plugin_info(GetPluginInfoRequest {})
            .await
            .unwrap()
            .into_inner()
            .name,
        "test.csi"
    );
    let err = client
        .get_plugin_capabilities(GetPluginCapabilitiesRequest {})
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);

    let metrics = reqwest_get(&format!("http://{http}/metrics")).await;
    assert!(
        metrics.1.contains(
            r#"grpc_server_handled_total{method="/csi.v1.Identity/GetPluginInfo",code="OK"} 1"#
        ),
        "{}",
        metrics.1
    );
    assert!(
        metrics.1.contains(r#"grpc_server_handled_total{method="/csi.v1.Identity/GetPluginCapabilities",code="InvalidArgument"} 1"#),
        "{}",
        metrics.1
    );
    assert!(metrics.1.contains("grpc_server_handling_seconds_bucket"));
    assert_eq!(
        reqwest_get(&format!("http://{http}/healthz")).await,
        (200, "ok".into())
    );
    healthy.store(false, Ordering::SeqCst);
    assert_eq!(
        reqwest_get(&format!("http://{http}/healthz")).await,
        (503, "cloud unreachable".into())
    );

    // a call in flight when the signal arrives still completes
    let mut slow = client.clone();
    let in_flight = tokio::spawn(async move { slow.probe(ProbeRequest {}).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    stop_tx.send(()).unwrap();
    let answer = in_flight.await.unwrap().unwrap().into_inner();
    assert_eq!(answer.ready, Some(true));
    task.await.unwrap().unwrap();
    assert!(!sock.exists(), "socket removed on shutdown");
    assert!(connect_unix(&sock).await.is_err());
}

/// A tiny HTTP/1.1 GET over TCP (the runtime does not depend on an HTTP
/// client).
async fn reqwest_get(url: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rest = url.strip_prefix("http://").unwrap();
    let (host, path) = rest.split_once('/').unwrap();
    let mut s = tokio::net::TcpStream::connect(host).await.unwrap();
    s.write_all(
        format!("GET /{path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut buf = String::new();
    s.read_to_string(&mut buf).await.unwrap();
    let status: u16 = buf.split_whitespace().nth(1).unwrap().parse().unwrap();
    let body = buf
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    // chunked bodies from axum: take the chunk payloads
    let body = if buf
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(&body)
    } else {
        body
    };
    (status, body)
}

fn dechunk(body: &str) -> String {
    let mut out = String::new();
    let mut rest = body;
    while let Some((len, tail)) = rest.split_once("\r\n") {
        let n = usize::from_str_radix(len.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.push_str(&tail[..n]);
        rest = &tail[n + 2..];
    }
    out
}

#[tokio::test]
async fn replaces_a_stale_socket_but_never_another_file() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("kms.sock");
    // a socket left by a crashed process
    drop(std::os::unix::net::UnixListener::bind(&sock).unwrap());
    assert!(sock.exists());
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(
        PluginServer::new(sock.to_str().unwrap().parse().unwrap()).serve(routes(), async move {
            let _ = stop_rx.await;
        }),
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut client = IdentityClient::new(connect_unix(&sock).await.unwrap());
    client
        .get_plugin_info(GetPluginInfoRequest {})
        .await
        .unwrap();
    stop_tx.send(()).unwrap();
    task.await.unwrap().unwrap();

    // a regular file is never removed
    let file = dir.path().join("important.sock");
    std::fs::write(&file, b"data").unwrap();
    let err = PluginServer::new(file.to_str().unwrap().parse().unwrap())
        .serve(routes(), std::future::pending())
        .await
        .unwrap_err();
    assert!(
        matches!(err, RuntimeError::Endpoint(EndpointError::NotASocket(_))),
        "{err}"
    );
    assert_eq!(std::fs::read(&file).unwrap(), b"data");
    assert!(err.to_string().contains("is not a socket"));
}

#[tokio::test]
async fn a_plugin_that_cannot_listen_for_http_leaves_no_socket() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("csi.sock");
    // the HTTP endpoint's port taken by someone else
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let err = PluginServer::new(sock.to_str().unwrap().parse().unwrap())
        .http_endpoint(Some(addr))
        .serve(routes(), std::future::pending())
        .await
        .unwrap_err();
    assert!(matches!(err, RuntimeError::Http { .. }), "{err}");
    // a socket here would be taken for a live plugin's (refusing every
    // connection) by kubelet, a sidecar or a test waiting for it
    assert!(
        !sock.exists(),
        "the plugin exits and leaves its socket: {err}"
    );
}

#[tokio::test]
async fn a_successor_that_took_the_socket_over_keeps_it_when_the_plugin_stops() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("csi.sock");
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = PluginServer::new(sock.to_str().unwrap().parse().unwrap());
    let holds = server.exit_holds();
    let task = tokio::spawn(server.serve(routes(), async move {
        let _ = stop_rx.await;
    }));
    wait_for_socket(&sock).await;
    // the next release (upstream's plugin on a rollback) starts while this
    // one still runs, and replaces the socket at the path, as Go's
    // plugins do
    std::fs::remove_file(&sock).unwrap();
    let successor = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let successor_ino = std::fs::metadata(&sock).unwrap().ino();
    // work a handler started that must outlive the server
    let finished = Arc::new(AtomicBool::new(false));
    let f = finished.clone();
    holds.spawn(async move {
        tokio::time::sleep(Duration::from_millis(400)).await;
        f.store(true, Ordering::SeqCst);
    });
    assert_eq!(holds.running(), 1);
    stop_tx.send(()).unwrap();
    task.await.unwrap().unwrap();
    assert!(
        finished.load(Ordering::SeqCst),
        "the plugin stopped before the work it was told to wait for"
    );
    let left = std::fs::symlink_metadata(&sock).expect("the successor's socket was removed");
    assert_eq!(left.ino(), successor_ino, "not the successor's socket");
    std::os::unix::net::UnixStream::connect(&sock).unwrap();
    successor.accept().unwrap();
}
