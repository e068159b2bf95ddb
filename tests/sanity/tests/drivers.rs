//! Runs the conformance checks against each driver binary.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

struct Plugin(Child);

impl Drop for Plugin {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The workspace's driver binaries, built if missing or stale.
fn binaries() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let status = Command::new(env!("CARGO"))
            .args([
                "build",
                "--quiet",
                "-p",
                "csi-cinder",
                "-p",
                "csi-manila",
                "--bins",
            ])
            .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
            .status()
            .unwrap();
        assert!(status.success(), "building the drivers failed");
        // target/<profile>/deps/this-test → target/<profile>
        std::env::current_exe()
            .unwrap()
            .parent()
            .unwrap()
            .parent()
            .unwrap()
            .to_path_buf()
    })
}

async fn start(bin: &str, args: &[String], sock: &Path) -> Plugin {
    let child = Command::new(binaries().join(bin))
        .args(args)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let p = Plugin(child);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !sock.exists() {
        assert!(
            Instant::now() < deadline,
            "{bin} never opened {}",
            sock.display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    p
}

#[tokio::test]
async fn cinder_node_plugin_identity_conforms() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("csi.sock");
    let _p = start(
        "cinder-csi-plugin",
        &[
            format!("--endpoint=unix://{}", sock.display()),
            "--provide-controller-service=false".into(),
        ],
        &sock,
    )
    .await;
    let v = csi_sanity::check_identity(&sock).await.unwrap();
    assert!(v.is_empty(), "{v:?}");
}

#[tokio::test]
async fn manila_plugin_identity_conforms() {
    for proto in ["NFS", "CEPHFS"] {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("csi.sock");
        let _p = start(
            "manila-csi-plugin",
            &[
                format!("--endpoint=unix://{}", sock.display()),
                format!("--share-protocol-selector={proto}"),
                format!(
                    "--drivername={}.manila.csi.openstack.org",
                    proto.to_lowercase()
                ),
            ],
            &sock,
        )
        .await;
        let v = csi_sanity::check_identity(&sock).await.unwrap();
        assert!(v.is_empty(), "{proto}: {v:?}");
    }
}

mod broken {
    use std::sync::Arc;

    use plugin_runtime::PluginServer;
    use plugin_runtime::csi_identity::IdentityService;
    use proto::csi::v1 as csi;
    use proto::csi::v1::identity_server::IdentityServer;

    /// The checks must catch a plugin that breaks the spec.
    #[tokio::test]
    async fn the_checks_catch_a_non_conforming_plugin() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("bad.sock");
        let unknown_cap = csi::PluginCapability {
            r#type: Some(csi::plugin_capability::Type::Service(
                csi::plugin_capability::Service { r#type: 0 },
            )),
        };
        let identity = IdentityService::new(
            "Bad_Name-".into(),
            String::new(),
            vec![unknown_cap],
            Arc::new(|| Box::pin(async { Err(tonic::Status::internal("broken")) })),
        );
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(
            PluginServer::new(sock.to_str().unwrap().parse().unwrap()).serve(
                tonic::service::Routes::new(IdentityServer::new(identity)),
                async move {
                    let _ = rx.await;
                },
            ),
        );
        while !sock.exists() {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        let v = csi_sanity::check_identity(&sock).await.unwrap();
        let checks: Vec<_> = v.iter().map(|v| v.check).collect();
        assert_eq!(
            checks,
            vec![
                "GetPluginInfo",
                "GetPluginInfo",
                "GetPluginCapabilities",
                "Probe"
            ],
            "{v:?}"
        );
        tx.send(()).unwrap();
        server.await.unwrap().unwrap();
    }
}
