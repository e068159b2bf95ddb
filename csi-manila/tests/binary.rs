//! `manila-csi-plugin` as a process.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use proto::csi::v1::identity_client::IdentityClient;
use proto::csi::v1::{GetPluginInfoRequest, ProbeRequest};

const BIN: &str = env!("CARGO_BIN_EXE_manila-csi-plugin");

struct Plugin(Child);

impl Drop for Plugin {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn serves_identity_under_the_configured_name() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("csi.sock");
    let mut plugin = Plugin(
        Command::new(BIN)
            .arg(format!("--endpoint=unix://{}", sock.display()))
            .args([
                "--drivername=nfs.manila.csi.openstack.org",
                "--share-protocol-selector=NFS",
                // the node would wait for instance metadata to be ready
                "--provide-node-service=false",
            ])
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while !sock.exists() {
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut c = IdentityClient::new(plugin_runtime::connect_unix(&sock).await.unwrap());
    assert_eq!(
        c.get_plugin_info(GetPluginInfoRequest {})
            .await
            .unwrap()
            .into_inner()
            .name,
        "nfs.manila.csi.openstack.org"
    );
    assert_eq!(
        c.probe(ProbeRequest {}).await.unwrap().into_inner().ready,
        Some(true)
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(plugin.0.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert!(plugin.0.wait().unwrap().success());
    assert!(!sock.exists());
    // what this instance does not serve is said at start-up
    let mut log = String::new();
    std::io::Read::read_to_string(plugin.0.stderr.as_mut().unwrap(), &mut log).unwrap();
    for what in [
        "Node service (--provide-node-service=false)",
        "ListVolumes, ControllerGetVolume and GetCapacity",
    ] {
        assert!(
            log.lines()
                .any(|l| l.contains("not served by this instance") && l.contains(what)),
            "no start-up line for {what}: {log}"
        );
    }
    assert!(
        !log.contains('\u{1b}'),
        "colour codes in a log that is not a terminal: {log}"
    );
}

/// Upstream's manifests run the controller pod with both services and
/// its partner's endpoint, where the instance metadata may be out of
/// reach: it is ready (csi-provisioner waits for that), and NodeGetInfo
/// says Unavailable, naming the metadata.
#[tokio::test]
async fn upstreams_controller_form_is_ready_without_instance_metadata() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("csi.sock");
    // a metadata service that refuses every connection
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let _plugin = Plugin(
        Command::new(BIN)
            .arg(format!("--endpoint=unix://{}", sock.display()))
            .args([
                "--drivername=nfs.manila.csi.openstack.org",
                "--share-protocol-selector=NFS",
                // (and --pvc-annotations, which needs a cluster's API)
                "--fwdendpoint=unix:///var/lib/kubelet/plugins/csi-nfsplugin/csi.sock",
            ])
            .arg(format!("--metadata-url=http://{closed}/"))
            .arg(format!(
                "--state-dir={}",
                dir.path().join("state").display()
            ))
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while !sock.exists() {
        assert!(Instant::now() < deadline, "never served");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let channel = plugin_runtime::connect_unix(&sock).await.unwrap();
    let mut c = IdentityClient::new(channel.clone());
    let deadline = Instant::now() + Duration::from_secs(15);
    while c.probe(ProbeRequest {}).await.unwrap().into_inner().ready != Some(true) {
        assert!(
            Instant::now() < deadline,
            "a controller with the node service too never became ready without instance metadata"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let info = proto::csi::v1::node_client::NodeClient::new(channel)
        .node_get_info(proto::csi::v1::NodeGetInfoRequest {})
        .await
        .unwrap_err();
    assert_eq!(info.code(), tonic::Code::Unavailable, "{info:?}");
    assert!(info.message().contains("metadata"), "{info:?}");
}

#[test]
fn help_says_what_is_served_and_what_is_not() {
    let out = Command::new(BIN).arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for what in [
        "no partner CSI plugin",
        "--fwdendpoint is accepted but ignored",
        "served only with --cloud-config",
    ] {
        assert!(
            help.contains(what),
            "--help does not mention {what}: {help}"
        );
    }
}

#[test]
fn protocol_selector_is_required_and_checked() {
    let out = Command::new(BIN)
        .args(["--endpoint=/tmp/never.sock"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--share-protocol-selector"));
    let out = Command::new(BIN)
        .args([
            "--endpoint=/tmp/never.sock",
            "--share-protocol-selector=SMB",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid value 'SMB'"));
    let out = Command::new(BIN)
        .args([
            "--endpoint=/tmp/never.sock",
            "--share-protocol-selector=CEPHFS",
            "--runtime-config-file=/nonexistent.json",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent.json does not exist"));
}

/// Upstream's chart and manifests run the node and controller plugins as
/// `/bin/sh -c '/bin/manila-csi-plugin -v=N --with-topology --endpoint=…
/// --drivername=… --share-protocol-selector=… --fwdendpoint=…
/// --cluster-id=""'`: the program's path first (its image has no
/// entrypoint), then its flags. Ours takes that line as it is; any other
/// stray first argument is still refused.
#[test]
fn upstreams_command_line_naming_the_program_first_is_taken() {
    let out = Command::new(BIN)
        .args([
            "/bin/manila-csi-plugin",
            "-v=2",
            "--with-topology",
            "--endpoint=unix:///var/lib/kubelet/plugins/cephfs.manila.csi.openstack.org/csi.sock",
            "--drivername=cephfs.manila.csi.openstack.org",
            "--share-protocol-selector=CEPHFS",
            "--fwdendpoint=unix:///var/lib/kubelet/plugins/cephfs.csi.ceph.com/csi.sock",
            "--cluster-id=",
            "--help",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("--share-protocol-selector"));
    let out = Command::new(BIN)
        .args(["/bin/cinder-csi-plugin", "--help"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("unexpected argument"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
