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

/// The plugins under test (see `workspace_binaries`: this workspace's, or
/// those in `CSI_SANITY_PLUGIN_DIR`, e.g. an older release).
fn binaries() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| csi_sanity::harness::workspace_binaries().expect("building the plugins"))
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
                // the node keeps its records here, not in the machine's
                // kubelet directory
                format!("--path-root={}", dir.path().display()),
                format!("--state-dir={}", dir.path().join("state").display()),
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

/// The whole suite against `cinder-csi-plugin` (controller and node in one
/// process) on the emulator, whose hypervisor turns attachments into loop
/// devices: staging runs mkfs and mounts for real.
#[tokio::test]
async fn cinder_conforms_on_the_emulator_with_real_devices() {
    if !openstack_emulator::preconditions::root("loop devices, mounts") {
        return;
    }
    let log = csi_sanity::harness::test_log(&format!("cinder-sanity-{}.log", std::process::id()));
    let mut opts = csi_sanity::harness::HarnessOptions::new(binaries().join("cinder-csi-plugin"));
    opts.log_file = Some(log.clone());
    // Nova sets no limit (its default): the controller keeps the server
    // within the node's (node-volume-attach-limit, 25 disks in all)
    let h = csi_sanity::harness::CinderOnEmulator::start(opts)
        .await
        .unwrap();
    wait_ready(&h.socket).await;
    let mut cfg = csi_sanity::SuiteConfig::new(&h.socket, h.kubelet_dir.join("sanity"));
    cfg.attach_limit_enforced = true;
    cfg.snapshot_classes = vec![backup_class()];
    cfg.mutable_parameters = retype();
    // this machine's root lacks CAP_SYS_RESOURCE, which ext4's online
    // resize ioctl requires; xfs grows online without it
    cfg.expansion_fs_type = "xfs".into();
    let suite = csi_sanity::Suite::connect(cfg).await.unwrap();
    let report = suite.run().await;
    println!("{report}");
    let failures = report.failures();
    let logs = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_file(&log);
    assert!(failures.is_empty(), "{report}\n--- plugin log ---\n{logs}");
    assert_eq!(
        report.count(|o| matches!(o, csi_sanity::Outcome::Skip(_))),
        0,
        "{report}"
    );
    assert!(
        csi_sanity::harness::mounts_below(h.dir.path()).is_empty(),
        "mounts left behind"
    );
}

/// Cinder's backups as snapshots, of attached volumes (as upstream's
/// VolumeSnapshotClass for backups is written).
fn backup_class() -> std::collections::HashMap<String, String> {
    [("type", "backup"), ("force-create", "true")]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A VolumeAttributesClass that retypes, as csi-sanity's runs use
/// (`tests/sanity/cinder/mutable-parameters.yaml`): both clouds have the
/// `multiattach` type.
fn retype() -> std::collections::HashMap<String, String> {
    [("type".to_string(), "multiattach".to_string())].into()
}

async fn wait_ready(sock: &Path) {
    csi_sanity::harness::wait_until_ready(sock).await.unwrap();
}

/// The same suite against real Keystone, Cinder and Nova (the test cloud of
/// `tests/openstack/cloud.py`, profile block or all), selected by
/// `OPENSTACK_TEST_BACKEND=real`; devices come from the cloud's hypervisor
/// agent.
#[tokio::test]
#[ignore = "real tier: needs tests/openstack/cloud.py up block (or all) and OPENSTACK_TEST_BACKEND=real"]
async fn cinder_conforms_on_the_real_cloud() {
    assert_eq!(
        std::env::var("OPENSTACK_TEST_BACKEND").as_deref(),
        Ok("real"),
        "set OPENSTACK_TEST_BACKEND=real"
    );
    let cloud_dir = std::env::var("OPENSTACK_TEST_CLOUD_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            PathBuf::from(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../.openstack-cloud"
            ))
        });
    assert!(
        cloud_dir.join("test-server-id").exists(),
        "the real cloud runs no Nova: bring it up with profile block or all"
    );
    assert!(
        nix::unistd::geteuid().is_root(),
        "needs root: the hypervisor agent's loop devices are mounted"
    );
    let log =
        csi_sanity::harness::test_log(&format!("cinder-sanity-real-{}.log", std::process::id()));
    let h = csi_sanity::harness::CinderOnRealCloud::start(
        &binaries().join("cinder-csi-plugin"),
        &cloud_dir,
        Some(log.clone()),
    )
    .await
    .unwrap();
    wait_ready(&h.socket).await;
    let mut cfg = csi_sanity::SuiteConfig::new(&h.socket, h.kubelet_dir.join("sanity"));
    cfg.expansion_fs_type = "xfs".into();
    cfg.timeout = Duration::from_secs(120);
    cfg.attach_limit_enforced = h.attach_limit_enforced;
    cfg.snapshot_classes = vec![backup_class()];
    cfg.mutable_parameters = retype();
    let report = csi_sanity::Suite::connect(cfg).await.unwrap().run().await;
    println!("{report}");
    let logs = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_file(&log);
    assert!(
        report.failures().is_empty(),
        "{report}\n--- plugin log ---\n{logs}"
    );
    // every check runs on the real cloud too: a capability no longer
    // advertised, or a Nova without its disk limit, would drop some
    assert_eq!(
        report.count(|o| matches!(o, csi_sanity::Outcome::Skip(_))),
        0,
        "{report}"
    );
    assert!(
        csi_sanity::harness::mounts_below(h.dir.path()).is_empty(),
        "mounts left behind"
    );
}

/// The whole suite against `manila-csi-plugin` for each protocol on the
/// emulator: the node runs in a private mount namespace whose stand-in
/// mount helpers bind local directories (this machine has no NFS or CephFS
/// client), so staging, publishing, sharing and read-only mounts are real
/// up to mount(8).
#[tokio::test]
async fn manila_conforms_on_the_emulator_for_both_protocols() {
    if !openstack_emulator::preconditions::root("mount namespaces, mounts") {
        return;
    }
    for (protocol, parameters) in [
        ("NFS", vec![("nfs-shareClient", "10.0.0.0/8")]),
        ("CEPHFS", vec![("type", "cephfs")]),
    ] {
        let log = csi_sanity::harness::test_log(&format!(
            "manila-sanity-{protocol}-{}.log",
            std::process::id()
        ));
        let mut o =
            csi_sanity::harness::ManilaOptions::new(binaries().join("manila-csi-plugin"), protocol);
        o.log_file = Some(log.clone());
        let h = csi_sanity::harness::ManilaOnEmulator::start(o)
            .await
            .unwrap();
        wait_ready(&h.socket).await;
        let mut cfg = csi_sanity::SuiteConfig::new(&h.socket, h.kubelet_dir.join("sanity"));
        cfg.secrets = h.member_secrets();
        cfg.parameters = parameters
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        // every share in one share group, so that the group checks can
        // snapshot the two they make (Manila snapshots a group whole)
        let share_type = if protocol == "CEPHFS" {
            "cephfs"
        } else {
            "default"
        };
        let group =
            csi_sanity::harness::share_group_for(&h.member_manila().unwrap(), "sanity", share_type)
                .await
                .unwrap();
        cfg.parameters.insert("groupID".into(), group);
        // the stand-in mounts bind one directory per export, which no
        // snapshot copies
        cfg.restores_hold_data = false;
        cfg.block = false;
        cfg.shared = true;
        cfg.node_view = Some(PathBuf::from(format!("/proc/{}", h.plugin_pid().unwrap())));
        let report = csi_sanity::Suite::connect(cfg).await.unwrap().run().await;
        println!("{protocol}:\n{report}");
        let logs = std::fs::read_to_string(&log).unwrap_or_default();
        let _ = std::fs::remove_file(&log);
        assert!(
            report.failures().is_empty(),
            "{protocol}: {report}\n--- plugin log ---\n{logs}"
        );
        // publish/unpublish and the attach limit (shares are not
        // attached), ModifyVolume (a share's type is an admin's)
        assert_eq!(
            report.count(|o| matches!(o, csi_sanity::Outcome::Skip(_))),
            4,
            "{report}"
        );
        assert!(h.mounts_below_dir().is_empty(), "mounts left behind");
    }
}

/// The suite against `manila-csi-plugin` (CEPHFS) on the real test cloud:
/// real Manila with its CephFS driver on a real Ceph, real ceph-fuse mounts
/// shared by several publishers; a grown share shows its new quota in the
/// mount. Run with `--ignored` and `OPENSTACK_TEST_BACKEND=real` once
/// `tests/openstack/cloud.py up file` (or `all`) is up.
#[tokio::test]
#[ignore = "needs root and the real test cloud with Ceph (tests/openstack/cloud.py up file)"]
async fn manila_cephfs_conforms_on_the_real_cloud() {
    let (h, log) = manila_on_real_cloud("CEPHFS").await;
    let mut cfg = csi_sanity::SuiteConfig::new(&h.socket, h.kubelet_dir.join("sanity"));
    cfg.secrets = h.secrets.clone();
    cfg.parameters = [("type".to_string(), "cephfs".to_string())].into();
    cfg.group_lifecycle_unsupported = Some(CEPHFS_GROUPS.into());
    cfg.block = false;
    cfg.shared = true;
    cfg.quota_on_node = true;
    cfg.timeout = Duration::from_secs(120);
    let report = csi_sanity::Suite::connect(cfg).await.unwrap().run().await;
    println!("{report}");
    check_manila_real_report(&h, &report, &log);
}

/// Why the real cloud's CephFS backends (native and through NFS-Ganesha)
/// cannot pass the group lifecycle: Manila's CephFS driver snapshots a
/// share without its subvolume group, so no share of a share group can be
/// snapshotted (shown by `csi-manila/tests/real_cloud_groups.rs`).
const CEPHFS_GROUPS: &str = "Manila's CephFS driver cannot snapshot a share in a share group";

/// The Manila plugin for `protocol` on the real test cloud, with its own
/// credentials too (calls without secrets), logging to the file returned.
async fn manila_on_real_cloud(protocol: &str) -> (csi_sanity::harness::ManilaOnRealCloud, PathBuf) {
    assert_eq!(
        std::env::var("OPENSTACK_TEST_BACKEND").as_deref(),
        Ok("real"),
        "set OPENSTACK_TEST_BACKEND=real"
    );
    let cloud_dir = std::env::var("OPENSTACK_TEST_CLOUD_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            PathBuf::from(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../.openstack-cloud"
            ))
        });
    let log = csi_sanity::harness::test_log(&format!(
        "manila-sanity-real-{}-{}.log",
        protocol.to_ascii_lowercase(),
        std::process::id()
    ));
    let h = csi_sanity::harness::ManilaOnRealCloud::start(
        &binaries().join("manila-csi-plugin"),
        &cloud_dir,
        protocol,
        true,
        &[],
        Some(log.clone()),
    )
    .await
    .unwrap();
    wait_ready(&h.socket).await;
    (h, log)
}

/// No failure; what the emulator's run skips (publish/unpublish and the
/// attach limit: shares are not attached; ModifyVolume: a share's type is
/// an admin's) and the group lifecycle (see [`CEPHFS_GROUPS`]); no mount
/// left.
fn check_manila_real_report(
    h: &csi_sanity::harness::ManilaOnRealCloud,
    report: &csi_sanity::Report,
    log: &Path,
) {
    let logs = std::fs::read_to_string(log).unwrap_or_default();
    let _ = std::fs::remove_file(log);
    assert!(
        report.failures().is_empty(),
        "{report}\n--- plugin log ---\n{logs}"
    );
    assert_eq!(
        report.count(|o| matches!(o, csi_sanity::Outcome::Skip(_))),
        5,
        "{report}"
    );
    assert!(h.mounts_below_dir().is_empty(), "mounts left behind");
    assert!(
        csi_sanity::harness::mounts_below(h.dir.path()).is_empty(),
        "mounts left behind"
    );
}

/// The suite against `manila-csi-plugin` (NFS) on the real test cloud:
/// real Manila with its CephFS driver exporting through NFS-Ganesha; every
/// share opened to this node only. The node's mounts go to the stand-in
/// `mount.nfs` that asks Ganesha for the export first (no kernel NFS
/// client here), so the quota is not seen on the node.
#[tokio::test]
#[ignore = "needs root and the real test cloud with Ganesha (tests/openstack/cloud.py up file)"]
async fn manila_nfs_conforms_on_the_real_cloud() {
    let (h, log) = manila_on_real_cloud("NFS").await;
    let mut cfg = csi_sanity::SuiteConfig::new(&h.socket, h.kubelet_dir.join("sanity"));
    cfg.secrets = h.secrets.clone();
    cfg.parameters = [
        ("type".to_string(), "cephfs-nfs".to_string()),
        ("nfs-shareClient".to_string(), "127.0.0.1/32".to_string()),
    ]
    .into();
    cfg.group_lifecycle_unsupported = Some(CEPHFS_GROUPS.into());
    cfg.block = false;
    cfg.shared = true;
    cfg.quota_on_node = false;
    // the stand-in binds a local directory per export once Ganesha has
    // answered: no snapshot's data reaches it
    cfg.restores_hold_data = false;
    // the stand-in's mounts live in the plugin's own mount namespace
    cfg.node_view = Some(PathBuf::from(format!("/proc/{}", h.plugin_pid().unwrap())));
    cfg.timeout = Duration::from_secs(120);
    let report = csi_sanity::Suite::connect(cfg).await.unwrap().run().await;
    println!("{report}");
    check_manila_real_report(&h, &report, &log);
    // every stage went through the server: the stand-in asked Ganesha
    assert!(
        h.helper_calls().iter().any(|c| c.program == "nfs"),
        "no NFS mount was made"
    );
}

/// A `[Global]` section authenticating with an application credential of
/// the real cloud's user whose session `owner` is.
fn app_cred_global(
    owner: &openstack_client::Session,
    cred: &openstack_client::identity::ApplicationCredential,
) -> String {
    let cfg = owner.config();
    format!(
        "[Global]\nauth-url = \"{}\"\napplication-credential-id = \"{}\"\napplication-credential-secret = \"{}\"\n{}\n",
        cfg.auth_url,
        cred.id,
        cred.secret.expose(),
        cfg.region
            .as_deref()
            .map(|r| format!("region = \"{r}\""))
            .unwrap_or_default()
    )
}

/// On real Keystone and Cinder: the controller's application credential
/// is rotated (a new one in its Secret, kubelet-style; the old one
/// deleted, its tokens revoked) and it keeps provisioning without a
/// restart.
#[tokio::test]
#[ignore = "needs root and the real test cloud with Nova (tests/openstack/cloud.py up block)"]
async fn cinder_credentials_rotate_on_the_real_cloud() {
    use proto::csi::v1 as csi;
    assert_eq!(
        std::env::var("OPENSTACK_TEST_BACKEND").as_deref(),
        Ok("real"),
        "set OPENSTACK_TEST_BACKEND=real"
    );
    let cloud_dir = std::env::var("OPENSTACK_TEST_CLOUD_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            PathBuf::from(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../.openstack-cloud"
            ))
        });
    // a project member's application credential, as most operators deploy
    // the driver (the member creates its own)
    let member_text = std::fs::read_to_string(cloud_dir.join("cloud-member.conf")).unwrap();
    let conf = openstack_client::config::CloudConf::from_texts(
        &[(PathBuf::from("member.conf"), member_text)],
        openstack_client::config::ConfigEnv::default(),
    )
    .unwrap();
    let member = openstack_client::Session::new(
        conf.cloud("").unwrap(),
        openstack_client::SessionOptions::default(),
    )
    .unwrap();
    let identity = openstack_client::identity::Identity::new(member.clone());
    let tag = std::process::id();
    let first = identity
        .create_application_credential(&format!("csi-rotation-{tag}"))
        .await
        .unwrap();
    let log = csi_sanity::harness::test_log(&format!("cinder-rotation-{tag}.log"));
    let h = csi_sanity::harness::CinderOnRealCloud::start_with_credentials(
        &binaries().join("cinder-csi-plugin"),
        &cloud_dir,
        &app_cred_global(&member, &first),
        Some(log.clone()),
    )
    .await
    .unwrap();
    wait_ready(&h.socket).await;
    let mut c = proto::csi::v1::controller_client::ControllerClient::new(
        plugin_runtime::connect_unix(&h.socket).await.unwrap(),
    );
    let req = |name: &str| csi::CreateVolumeRequest {
        name: format!("{name}-{tag}"),
        volume_capabilities: vec![csi::VolumeCapability {
            access_type: Some(csi::volume_capability::AccessType::Mount(
                csi::volume_capability::MountVolume::default(),
            )),
            access_mode: Some(csi::volume_capability::AccessMode {
                mode: csi::volume_capability::access_mode::Mode::SingleNodeWriter as i32,
            }),
        }],
        ..Default::default()
    };
    let before = c
        .create_volume(req("rotation-before"))
        .await
        .unwrap()
        .into_inner();

    let second = identity
        .create_application_credential(&format!("csi-rotation-{tag}-2"))
        .await
        .unwrap();
    h.update_credentials(&app_cred_global(&member, &second))
        .unwrap();
    identity
        .delete_application_credential(&first.id)
        .await
        .unwrap();
    // the running controller takes the new credential (Cinder may still
    // accept a token of the deleted one from its validation cache, so a
    // successful call alone proves nothing): its log says Keystone accepted
    // it, and provisioning goes on
    let deadline = Instant::now() + Duration::from_secs(30);
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("Keystone accepts the new credentials")
    {
        assert!(Instant::now() < deadline, "never used the new credential");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let after = c
        .create_volume(req("rotation-after"))
        .await
        .unwrap_or_else(|s| panic!("CreateVolume after the rotation: {s}"))
        .into_inner();
    for v in [before, after] {
        c.delete_volume(csi::DeleteVolumeRequest {
            volume_id: v.volume.unwrap().volume_id,
            ..Default::default()
        })
        .await
        .unwrap();
    }
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_file(&log);
    assert!(
        text.contains("Keystone accepts the new credentials"),
        "{text}"
    );
    assert!(
        !text.contains(second.secret.expose()),
        "a secret reached the log"
    );
    drop(h);
    identity
        .delete_application_credential(&second.id)
        .await
        .unwrap();
}
