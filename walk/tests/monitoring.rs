//! Every metric a Grafana dashboard of `deploy/monitoring/dashboards`
//! queries is served on `/metrics` by its plugin: each plugin is started
//! with `--http-endpoint` against the emulator, made to serve a few calls,
//! and scraped.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use csi_sanity::harness::{
    CinderOnEmulator, HarnessOptions, ManilaOnEmulator, ManilaOptions, free_port, http_get,
};
use openstack_client::barbican::KeyManager;
use proto::csi::v1 as csi;
use proto::csi::v1::controller_client::ControllerClient;
use proto::kms::v2::EncryptRequest;
use proto::kms::v2::key_management_service_client::KeyManagementServiceClient;

fn dashboards() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/monitoring/dashboards")
}

/// Metric names a dashboard's queries select (`name{...}`), and the
/// variables' `label_values(name, ...)`.
fn queried_metrics(dashboard: &Path) -> BTreeSet<String> {
    let d: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dashboard).unwrap()).unwrap();
    let mut exprs: Vec<String> = Vec::new();
    for p in d["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().unwrap() {
            exprs.push(t["expr"].as_str().unwrap().to_string());
        }
    }
    let mut out = BTreeSet::new();
    for e in exprs {
        let chars: Vec<char> = e.chars().collect();
        let mut i = 0;
        while i < chars.len() {
            if chars[i].is_ascii_alphabetic() || chars[i] == '_' {
                let start = i;
                while i < chars.len()
                    && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':')
                {
                    i += 1;
                }
                if chars.get(i) == Some(&'{') {
                    out.insert(chars[start..i].iter().collect());
                }
                // skip a selector's inside: label names are not metrics
                if chars.get(i) == Some(&'{') {
                    while i < chars.len() && chars[i] != '}' {
                        i += 1;
                    }
                }
            } else {
                i += 1;
            }
        }
    }
    assert!(!out.is_empty(), "{} queries no metric", dashboard.display());
    out
}

/// Whether `/metrics` text serves `name`: a family of that name, a counter
/// family whose samples are `name`, or a histogram's series.
fn serves(text: &str, name: &str) -> bool {
    text.lines().any(|l| {
        let mut f = l.split_whitespace();
        match (f.next(), f.next(), f.next(), f.next()) {
            (Some("#"), Some("TYPE"), Some(family), Some(kind)) => {
                family == name
                    || (kind == "counter" && name == format!("{family}_total"))
                    || (kind == "histogram"
                        && ["_bucket", "_sum", "_count"]
                            .iter()
                            .any(|s| name == format!("{family}{s}")))
            }
            _ => false,
        }
    })
}

fn check(dashboard: &str, text: &str) {
    let missing: Vec<String> = queried_metrics(&dashboards().join(dashboard))
        .into_iter()
        .filter(|m| !serves(text, m))
        .collect();
    assert!(
        missing.is_empty(),
        "{dashboard} queries metrics its plugin does not serve: {missing:?}\n{text}"
    );
}

fn mount_cap() -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_type: Some(csi::volume_capability::AccessType::Mount(Default::default())),
        access_mode: Some(csi::volume_capability::AccessMode {
            mode: csi::volume_capability::access_mode::Mode::MultiNodeMultiWriter as i32,
        }),
    }
}

/// Creates and deletes a volume, so that the call and API families exist.
async fn create_and_delete(
    socket: &Path,
    params: &[(&str, &str)],
    secrets: HashMap<String, String>,
    cap: csi::VolumeCapability,
) {
    csi_sanity::harness::wait_until_ready(socket).await.unwrap();
    let mut c = ControllerClient::new(plugin_runtime::connect_unix(socket).await.unwrap());
    let v = c
        .create_volume(csi::CreateVolumeRequest {
            name: "pvc-metrics".into(),
            volume_capabilities: vec![cap],
            parameters: params
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            secrets: secrets.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    c.delete_volume(csi::DeleteVolumeRequest {
        volume_id: v.volume_id,
        secrets,
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn cinder_serves_what_its_dashboard_queries() {
    let bins = csi_sanity::harness::workspace_binaries().unwrap();
    let port = free_port().unwrap();
    let mut o = HarnessOptions::new(bins.join("cinder-csi-plugin"));
    o.hypervisor = false;
    o.extra_args = vec![format!("--http-endpoint=127.0.0.1:{port}")];
    let h = CinderOnEmulator::start(o).await.unwrap();
    let mut cap = mount_cap();
    cap.access_mode = Some(csi::volume_capability::AccessMode {
        mode: csi::volume_capability::access_mode::Mode::SingleNodeWriter as i32,
    });
    create_and_delete(&h.socket, &[], HashMap::new(), cap).await;
    check(
        "cinder-csi.json",
        &http_get(port, "/metrics").await.unwrap().1,
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn manila_serves_what_its_dashboard_queries() {
    let bins = csi_sanity::harness::workspace_binaries().unwrap();
    let port = free_port().unwrap();
    let mut o = ManilaOptions::new(bins.join("manila-csi-plugin"), "NFS");
    o.stand_ins = false;
    o.extra_args = vec![format!("--http-endpoint=127.0.0.1:{port}")];
    let h = ManilaOnEmulator::start(o).await.unwrap();
    create_and_delete(
        &h.socket,
        &[("nfs-shareClient", "10.0.0.0/24")],
        h.member_secrets(),
        mount_cap(),
    )
    .await;
    check(
        "manila-csi.json",
        &http_get(port, "/metrics").await.unwrap().1,
    );
}

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn kms_serves_what_its_dashboard_queries() {
    let bins = csi_sanity::harness::workspace_binaries().unwrap();
    let emulator = openstack_emulator::Emulator::start(Default::default())
        .await
        .unwrap();
    let barbican = KeyManager::new(suite_walk::session_of(&emulator.cloud_conf()).unwrap());
    let key = suite_walk::secrets::new_key(&barbican, "kek")
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let conf_path = dir.path().join("cloud.conf");
    std::fs::write(
        &conf_path,
        format!("{}\n[KeyManager]\nkey-id = {key}\n", emulator.cloud_conf()),
    )
    .unwrap();
    // Barbican fails the first key fetch (the plugin retries), so that the
    // API failure series the dashboard shows exists
    emulator.control().add_fault(
        openstack_emulator::FaultRule::new(
            Some("GET"),
            "/payload",
            openstack_emulator::FaultAction::Status {
                status: 503,
                message: None,
                retry_after: None,
                hint: Default::default(),
            },
        )
        .times(1),
    );
    let port = free_port().unwrap();
    let socket = dir.path().join("kms.sock");
    let _plugin = Killed(
        Command::new(bins.join("barbican-kms-plugin"))
            .arg("--socketpath")
            .arg(&socket)
            .arg("--cloud-config")
            .arg(&conf_path)
            .arg(format!("--http-endpoint=127.0.0.1:{port}"))
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    csi_sanity::harness::wait_for_socket(&socket).await.unwrap();
    let mut kms =
        KeyManagementServiceClient::new(plugin_runtime::connect_unix(&socket).await.unwrap());
    let deadline = Instant::now() + Duration::from_secs(20);
    while kms
        .encrypt(EncryptRequest {
            plaintext: vec![1; 32],
            uid: "m".into(),
        })
        .await
        .is_err()
    {
        assert!(Instant::now() < deadline, "Encrypt never succeeded");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // a Decrypt under a key the plugin does not know: the refusals'
    // family exists once one is counted
    let refused = kms
        .decrypt(proto::kms::v2::DecryptRequest {
            ciphertext: vec![0; 64],
            uid: "r".into(),
            key_id: format!("{}:0011223344556677", uuid_like()),
            annotations: HashMap::new(),
        })
        .await;
    assert!(refused.is_err());
    check(
        "barbican-kms.json",
        &http_get(port, "/metrics").await.unwrap().1,
    );
}

#[test]
fn the_metric_check_notices_an_unserved_metric() {
    let text = "# TYPE grpc_server_handled counter\n# TYPE lat histogram\n";
    assert!(serves(text, "grpc_server_handled_total"));
    assert!(serves(text, "lat_bucket"));
    assert!(!serves(text, "grpc_server_handled_bogus"));
    assert!(!serves(text, "kms_key_age_seconds"));
}

/// A well-formed Barbican secret id no key of the test has.
fn uuid_like() -> &'static str {
    "00000000-0000-4000-8000-00000000beef"
}
