//! `cinder-csi-plugin` as a process: flags, configuration errors,
//! readiness against the emulator, Identity over the socket, SIGTERM.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use csi_sanity::harness::{free_port, http_get, wait_for_socket};
use openstack_emulator::{Emulator, EmulatorConfig, FaultAction, FaultRule};
use proto::csi::v1 as csi;
use proto::csi::v1::controller_client::ControllerClient;
use proto::csi::v1::identity_client::IdentityClient;
use proto::csi::v1::volume_capability::access_mode::Mode;
use proto::csi::v1::{GetPluginCapabilitiesRequest, GetPluginInfoRequest, ProbeRequest};

mod common;
use common::{create_req, mount_cap};

const BIN: &str = env!("CARGO_BIN_EXE_cinder-csi-plugin");

struct Plugin(Child);

impl Drop for Plugin {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn write_conf(dir: &Path, emu: &Emulator) -> PathBuf {
    let p = dir.join("cloud.conf");
    std::fs::write(&p, emu.cloud_conf()).unwrap();
    p
}

/// Asks Probe every 100 ms until it says ready; fails with `failure`
/// after 15 s.
async fn probe_until_ready(client: &mut IdentityClient<tonic::transport::Channel>, failure: &str) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while client
        .probe(ProbeRequest {})
        .await
        .unwrap()
        .into_inner()
        .ready
        != Some(true)
    {
        assert!(Instant::now() < deadline, "{failure}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn serves_identity_becomes_ready_and_stops_on_sigterm() {
    let emu = Emulator::start(EmulatorConfig::default()).await.unwrap();
    // Keystone refuses the first two connections: the plugin must retry
    emu.control().add_fault(
        FaultRule::new(
            Some("POST"),
            "/auth/tokens",
            FaultAction::Status {
                status: 503,
                message: None,
                retry_after: None,
                hint: Default::default(),
            },
        )
        .times(2),
    );
    let dir = tempfile::tempdir().unwrap();
    let conf = write_conf(dir.path(), &emu);
    let sock = dir.path().join("csi/csi.sock");
    let port = free_port().unwrap();
    let child = Command::new(BIN)
        .arg(format!("--endpoint=unix://{}", sock.display()))
        .arg(format!("--cloud-config={}", conf.display()))
        .arg(format!("--http-endpoint=127.0.0.1:{port}"))
        .arg("--provide-node-service=false")
        .arg("--log-format=json")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut plugin = Plugin(child);
    // read as it comes: a full pipe would stall the plugin's logging
    let mut pipe = plugin.0.stderr.take().unwrap();
    let stderr_reader = std::thread::spawn(move || {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut pipe, &mut text).unwrap();
        text
    });
    wait_for_socket(&sock).await.unwrap();
    let mut client = IdentityClient::new(plugin_runtime::connect_unix(&sock).await.unwrap());
    let info = client
        .get_plugin_info(GetPluginInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.name, "cinder.csi.openstack.org");
    assert_eq!(info.vendor_version, env!("CARGO_PKG_VERSION"));
    let caps = client
        .get_plugin_capabilities(GetPluginCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    // controller + node, topology on: the controller and group controller
    // services, topology, online and offline expansion
    assert_eq!(caps.capabilities.len(), 5, "{caps:?}");

    probe_until_ready(&mut client, "never became ready").await;
    let (status, body) = http_get(port, "/metrics").await.unwrap();
    assert_eq!(status, 200);
    assert!(body.contains("openstack_api_requests_total{service=\"identity\",request=\"token_issue\",status=\"503\"} 2"), "{body}");
    assert!(
        body.contains("grpc_server_handled_total{method=\"/csi.v1.Identity/Probe\",code=\"OK\"}"),
        "{body}"
    );
    assert_eq!(http_get(port, "/healthz").await.unwrap().0, 200);

    // paths a caller makes up share one label: /metrics does not grow
    let mut grpc = tonic::client::Grpc::new(plugin_runtime::connect_unix(&sock).await.unwrap());
    for i in 0..300 {
        grpc.ready().await.unwrap();
        let path: String = if i % 2 == 0 {
            format!("/csi.v1.Identity/Made{i}Up")
        } else {
            format!("/x{i}.Service/Call")
        };
        let call = grpc.unary::<ProbeRequest, ProbeRequest, _>(
            tonic::Request::new(ProbeRequest {}),
            http::uri::PathAndQuery::from_maybe_shared(path.clone()).unwrap(),
            tonic_prost::ProstCodec::default(),
        );
        let err = tokio::time::timeout(Duration::from_secs(10), call)
            .await
            .expect("an unknown method is answered")
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::Unimplemented, "{path:?}");
    }
    let (_, after) = http_get(port, "/metrics").await.unwrap();
    assert!(
        after.contains("grpc_server_handled_total{method=\"unknown\",code=\"Unimplemented\"} 300"),
        "{after}"
    );
    assert!(!after.contains("Made0Up") && !after.contains("x1.Service"));
    assert!(
        after.len() < body.len() + 4096,
        "/metrics grew from {} to {} bytes",
        body.len(),
        after.len()
    );

    // a change is logged when done, with its time; a read is not (at info)
    let mut controller = ControllerClient::new(plugin_runtime::connect_unix(&sock).await.unwrap());
    let made = controller
        .create_volume(create_req(
            "logged-when-done",
            mount_cap("ext4", Mode::SingleNodeWriter),
            1,
        ))
        .await
        .unwrap()
        .into_inner();
    let id = made.volume.unwrap().volume_id;
    controller
        .controller_get_volume(csi::ControllerGetVolumeRequest {
            volume_id: id.clone(),
        })
        .await
        .unwrap();

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(plugin.0.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = plugin.0.wait().unwrap();
    assert!(status.success(), "{status:?}");
    assert!(!sock.exists(), "the socket is removed on SIGTERM");
    let stderr = stderr_reader.join().unwrap();
    let answered: Vec<serde_json::Value> = stderr
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|l| l["message"] == "answered OK")
        .collect();
    assert!(
        answered.iter().any(|l| l["span"]["name"] == "CreateVolume"
            && l["duration_ms"].as_f64().is_some_and(|ms| ms > 0.0)),
        "no line for the create, with its time: {stderr}"
    );
    assert!(
        !answered
            .iter()
            .any(|l| l["span"]["name"] == "ControllerGetVolume"),
        "a read logged at info: {stderr}"
    );
    assert!(
        !stderr.contains("admin-secret"),
        "a password reached the log"
    );
    assert!(
        stderr.lines().all(|l| l.starts_with('{')),
        "JSON logs: {stderr}"
    );
    // what this instance does not serve is said at start-up
    for what in [
        "Node service (--provide-node-service=false)",
        "GetCapacity and PUBLISH_READONLY",
    ] {
        assert!(
            stderr
                .lines()
                .any(|l| l.contains("not served by this instance") && l.contains(what)),
            "no start-up line for {what}: {stderr}"
        );
    }
}

#[test]
fn help_says_what_is_not_served() {
    let out = Command::new(BIN).arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    for what in [
        "Not served: GetCapacity",
        "PUBLISH_READONLY",
        "--pvc-annotations",
    ] {
        assert!(
            help.contains(what),
            "--help does not mention {what}: {help}"
        );
    }
}

/// Upstream's manifests run the controller pod with both services (no
/// `--provide-node-service=false`), where the instance metadata may be out
/// of reach: it is ready once its cloud answers (csi-provisioner waits for
/// that), and NodeGetInfo says Unavailable, naming the metadata.
#[tokio::test]
async fn upstreams_controller_form_is_ready_without_instance_metadata() {
    let emu = Emulator::start(EmulatorConfig::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let conf = write_conf(dir.path(), &emu);
    let sock = dir.path().join("csi.sock");
    // a metadata service that refuses every connection
    let closed = free_port().unwrap();
    let _plugin = Plugin(
        Command::new(BIN)
            .arg(format!("--endpoint=unix://{}", sock.display()))
            .arg(format!("--cloud-config={}", conf.display()))
            .arg("--cluster=kubernetes")
            .arg("--v=1")
            .arg(format!("--metadata-url=http://127.0.0.1:{closed}/"))
            .arg(format!(
                "--http-endpoint=127.0.0.1:{}",
                free_port().unwrap()
            ))
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_for_socket(&sock).await.unwrap();
    let channel = plugin_runtime::connect_unix(&sock).await.unwrap();
    let mut client = IdentityClient::new(channel.clone());
    probe_until_ready(
        &mut client,
        "a controller with the node service too never became ready without instance metadata",
    )
    .await;
    let info = proto::csi::v1::node_client::NodeClient::new(channel)
        .node_get_info(proto::csi::v1::NodeGetInfoRequest {})
        .await
        .unwrap_err();
    assert_eq!(info.code(), tonic::Code::Unavailable, "{info:?}");
    assert!(info.message().contains("metadata"), "{info:?}");
}

#[tokio::test]
async fn wrong_password_keeps_it_unready_with_a_reason() {
    let emu = Emulator::start(EmulatorConfig::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("cloud.conf");
    std::fs::write(
        &conf,
        emu.cloud_conf().replace("admin-secret", "wrong-password"),
    )
    .unwrap();
    let sock = dir.path().join("csi.sock");
    let port = free_port().unwrap();
    let _plugin = Plugin(
        Command::new(BIN)
            .arg(format!("--endpoint={}", sock.display()))
            .arg(format!("--cloud-config={}", conf.display()))
            .arg(format!("--http-endpoint=127.0.0.1:{port}"))
            .arg("--provide-node-service=false")
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_for_socket(&sock).await.unwrap();
    let mut client = IdentityClient::new(plugin_runtime::connect_unix(&sock).await.unwrap());
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        client
            .probe(ProbeRequest {})
            .await
            .unwrap()
            .into_inner()
            .ready,
        Some(false)
    );
    let (status, body) = http_get(port, "/healthz").await.unwrap();
    assert_eq!(status, 503);
    assert!(body.contains("refused password authentication"), "{body}");
    assert!(!body.contains("wrong-password"));
}

fn run_expecting_failure(args: &[&str]) -> String {
    let out = Command::new(BIN).args(args).output().unwrap();
    assert!(!out.status.success(), "{args:?} should fail");
    String::from_utf8_lossy(&out.stderr).to_string()
}

#[test]
fn bad_flags_and_configuration_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let sock = format!("--endpoint={}/x.sock", dir.path().display());
    let err = run_expecting_failure(&[&sock, "--cloud-config=/nonexistent/cloud.conf"]);
    assert!(err.contains("cannot read /nonexistent/cloud.conf"), "{err}");

    let err = run_expecting_failure(&[&sock]);
    assert!(err.contains("--cloud-config is required"), "{err}");

    let bad = dir.path().join("bad.conf");
    std::fs::write(&bad, "[Global]\nauth-url = not-a-url\n").unwrap();
    let err = run_expecting_failure(&[&sock, &format!("--cloud-config={}", bad.display())]);
    assert!(
        err.contains("auth-url") && err.contains("not-a-url"),
        "{err}"
    );

    let err = run_expecting_failure(&[
        &sock,
        "--provide-controller-service=false",
        "--provide-node-service=false",
    ]);
    assert!(err.contains("at least one of"), "{err}");

    let err = run_expecting_failure(&[
        &sock,
        "--provide-controller-service=false",
        "--driver-name=bad_name",
    ]);
    assert!(err.contains("driver name"), "{err}");

    let err = run_expecting_failure(&[
        "--endpoint=tcp://127.0.0.1:1",
        "--provide-controller-service=false",
    ]);
    assert!(err.contains("only unix sockets"), "{err}");

    let empty = dir.path().join("empty.conf");
    std::fs::write(&empty, "").unwrap();
    let err = run_expecting_failure(&[&sock, &format!("--cloud-config={}", empty.display())]);
    assert!(err.contains("is empty"), "{err}");

    // 0 would take every attach and detach under way for stuck
    let err = run_expecting_failure(&[&sock, "--stuck-attachment-secs=0"]);
    assert!(
        err.contains("--stuck-attachment-secs") && err.contains("0 is not in 1.."),
        "{err}"
    );
}

/// A plugin process killed when the test ends, also by a panic.
struct KilledOnDrop(Child);

impl Drop for KilledOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Another plugin serving on the endpoint (the release being replaced:
/// upstream's node plugin, under a DaemonSet Helm deletes as it creates
/// ours) keeps it while it serves: ours waits, without exiting (an exit
/// would put its pod in crash-loop back-off, minutes without a plugin on
/// the node after the old one went), and takes the socket over once the
/// other is gone, leaving it stale.
#[tokio::test]
async fn a_live_socket_is_never_taken_over_and_taken_once_its_server_is_gone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("csi.sock");
    let live = std::os::unix::net::UnixListener::bind(&path).unwrap();
    live.set_nonblocking(true).unwrap();
    let log = dir.path().join("plugin.log");
    let mut plugin = KilledOnDrop(
        Command::new(BIN)
            .args([
                &format!("--endpoint=unix://{}", path.display()),
                "--provide-controller-service=false",
            ])
            .env("RUST_LOG", "info")
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    let logged = || std::fs::read_to_string(&log).unwrap_or_default();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !logged().contains("another process serves on the endpoint") {
        assert!(
            plugin.0.try_wait().unwrap().is_none(),
            "the plugin exited: {}",
            logged()
        );
        assert!(
            Instant::now() < deadline,
            "no word of waiting: {}",
            logged()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // a while later it still waits, and the endpoint is still the other's
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(plugin.0.try_wait().unwrap().is_none(), "{}", logged());
    let _probe = std::os::unix::net::UnixStream::connect(&path).unwrap();
    assert!(
        live.accept().is_ok(),
        "the other server's socket was replaced"
    );
    assert!(!logged().contains("serving gRPC"), "{}", logged());

    // the other server goes (its socket file stays, stale): ours takes over
    drop(live);
    let deadline = Instant::now() + Duration::from_secs(20);
    // (a node plugin without instance metadata answers, not ready)
    loop {
        if let Ok(channel) = plugin_runtime::connect_unix(&path).await
            && IdentityClient::new(channel)
                .probe(ProbeRequest {})
                .await
                .is_ok()
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not serving after the other went: {}",
            logged()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(logged().contains("taking the socket over"), "{}", logged());
}

/// The first line of a starting plugin's log that contains `needle`,
/// before it serves gRPC (within 20 s); or all it logged until then.
fn logged_line(args: &[String], needle: &str) -> Result<String, String> {
    use std::io::{BufRead, BufReader};
    let mut child = Command::new(BIN)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let _plugin = Plugin(child);
    let until = Instant::now() + Duration::from_secs(20);
    let mut seen = String::new();
    while let Some(left) = until.checked_duration_since(Instant::now()) {
        match rx.recv_timeout(left) {
            Ok(line) if line.contains(needle) => return Ok(line),
            Ok(line) if line.contains("serving gRPC") => return Err(seen + &line),
            Ok(line) => seen.push_str(&(line + "\n")),
            Err(_) => break,
        }
    }
    Err(seen)
}

#[test]
fn a_node_plugin_given_credentials_says_it_needs_none() {
    let dir = tempfile::tempdir().unwrap();
    let sock = format!("--endpoint=unix://{}/csi.sock", dir.path().display());
    let with = dir.path().join("with.conf");
    std::fs::write(
        &with,
        "[Global]\nauth-url=https://keystone.example.com:5000/v3\nusername=csi\npassword=hunter2-not-logged\nproject-name=p\n\
         [BlockStorage]\nnode-volume-attach-limit=25\n",
    )
    .unwrap();
    let args = |conf: &Path| {
        vec![
            sock.clone(),
            format!("--cloud-config={}", conf.display()),
            "--provide-controller-service=false".into(),
            format!("--path-root={}", dir.path().display()),
        ]
    };
    let line = logged_line(&args(&with), "holds credentials").unwrap_or_else(|log| {
        panic!("no warning that the node plugin holds credentials; it logged:\n{log}")
    });
    assert!(line.contains("[Global] password"), "{line}");
    assert!(
        !line.contains("hunter2"),
        "the secret itself is never logged: {line}"
    );

    // the node's own cloud.conf, as deploy/'s cloud-config-node: no word
    let _ = std::fs::remove_file(dir.path().join("csi.sock"));
    let without = dir.path().join("without.conf");
    std::fs::write(&without, "[BlockStorage]\nnode-volume-attach-limit=25\n").unwrap();
    let args = args(&without);
    let quiet = logged_line(&args, "holds credentials");
    assert!(quiet.is_err(), "warned without credentials: {quiet:?}");
}

/// Upstream's chart and manifests give the program's own path as the first
/// argument (`args: [/bin/cinder-csi-plugin, -v=2, --endpoint=…]`; its
/// image has no entrypoint, ours has): ours takes such a manifest as it
/// is, and still refuses any other stray argument.
#[test]
fn upstreams_manifests_first_argument_naming_the_program_is_taken() {
    let out = Command::new(BIN)
        .args(["/bin/cinder-csi-plugin", "-v=2", "--help"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("--endpoint"));
    let err = run_expecting_failure(&["/bin/something-else", "--help"]);
    assert!(err.contains("unexpected argument"), "{err}");
}
