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
            .stderr(Stdio::null())
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
