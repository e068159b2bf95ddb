//! `barbican-kms-plugin` driven over its socket the way a kube-apiserver
//! drives it, against the emulator's Barbican.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use aes::cipher::{BlockEncryptMut, KeyIvInit, block_padding::Pkcs7};
use csi_sanity::harness::{free_port, http_get};
use openstack_client::barbican::{CreateSecret, KeyManager};
use openstack_client::config::{CloudConf, ConfigEnv};
use openstack_client::{Session, SessionOptions};
use openstack_emulator::{Emulator, EmulatorConfig, FaultAction, FaultRule};
use proto::kms::v2::key_management_service_client::KeyManagementServiceClient;
use proto::kms::v2::{DecryptRequest, EncryptRequest, StatusRequest};
use tonic::transport::Channel;
use zeroize::Zeroizing;

const BIN: &str = env!("CARGO_BIN_EXE_barbican-kms-plugin");

struct Plugin {
    child: Child,
    socket: PathBuf,
    log: PathBuf,
}

impl Drop for Plugin {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Plugin {
    fn start(dir: &Path, conf: &Path, extra: &[&str]) -> Plugin {
        Self::start_on(dir, "kms.sock", conf, extra)
    }

    /// With its socket `run/<socket>` (its log `<socket>.log`, but for
    /// `kms.sock`'s `plugin.log`).
    fn start_on(dir: &Path, socket: &str, conf: &Path, extra: &[&str]) -> Plugin {
        let log = if socket == "kms.sock" {
            dir.join("plugin.log")
        } else {
            dir.join(format!("{socket}.log"))
        };
        let socket = dir.join("run").join(socket);
        let child = Command::new(BIN)
            .arg("--socketpath")
            .arg(&socket)
            .arg("--cloud-config")
            .arg(conf)
            .args(["--refresh-interval", "200ms", "--log-level", "debug"])
            .args(extra)
            .stderr(std::fs::File::create(&log).unwrap())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        Plugin { child, socket, log }
    }

    async fn client(&self) -> KeyManagementServiceClient<Channel> {
        // a socket left by a killed predecessor refuses until replaced
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(ch) = plugin_runtime::connect_unix(&self.socket).await {
                return KeyManagementServiceClient::new(ch);
            }
            assert!(
                Instant::now() < deadline,
                "no socket; log:\n{}",
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn sighup(&self) {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGHUP,
        )
        .unwrap();
    }
}

/// The emulator's Barbican, or the real test cloud's with
/// `OPENSTACK_TEST_BACKEND=real` (`tests/openstack/cloud.py up kms`).
struct Cloud {
    /// Kept running for the test's length (None: the real cloud).
    _emu: Option<Emulator>,
    conf_text: String,
    barbican: KeyManager,
}

impl Cloud {
    async fn start() -> Cloud {
        let (emu, conf_text) = if std::env::var("OPENSTACK_TEST_BACKEND").as_deref() == Ok("real") {
            let dir = std::env::var_os("OPENSTACK_TEST_CLOUD_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|| {
                    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.openstack-cloud"))
                });
            let text = std::fs::read_to_string(dir.join("cloud-admin.conf"))
                .expect("no real test cloud: run tests/openstack/cloud.py up kms");
            (None, text)
        } else {
            let emu = Emulator::start(EmulatorConfig::default()).await.unwrap();
            let text = emu.cloud_conf();
            (Some(emu), text)
        };
        let conf = CloudConf::from_texts(
            &[(PathBuf::from("c"), conf_text.clone())],
            ConfigEnv::default(),
        )
        .unwrap();
        let barbican = KeyManager::new(
            Session::new(conf.cloud("").unwrap(), SessionOptions::default()).unwrap(),
        );
        Cloud {
            _emu: emu,
            conf_text,
            barbican,
        }
    }

    async fn secret(&self, bytes: &[u8]) -> String {
        self.barbican
            .create_secret(&CreateSecret {
                name: "kek".into(),
                payload: Some(Zeroizing::new(bytes.to_vec())),
                algorithm: Some("aes".into()),
                bit_length: Some(256),
                mode: Some("gcm".into()),
                secret_type: "symmetric".into(),
            })
            .await
            .unwrap()
    }

    /// A secret holding `key`, and a cloud.conf naming it in a fresh
    /// directory.
    async fn configured(&self, key: &[u8]) -> (String, tempfile::TempDir, PathBuf) {
        let secret = self.secret(key).await;
        let dir = tempfile::tempdir().unwrap();
        let conf = dir.path().join("cloud.conf");
        self.write_conf(&conf, &secret);
        (secret, dir, conf)
    }

    fn write_conf(&self, path: &Path, key_id: &str) {
        self.write_conf_with(path, key_id, "");
    }

    /// The same with more `[KeyManager]` lines; written aside and renamed,
    /// as kubelet swaps a mounted file.
    fn write_conf_with(&self, path: &Path, key_id: &str, more: &str) {
        let tmp = path.with_extension("new");
        std::fs::write(
            &tmp,
            format!(
                "{}\n[KeyManager]\nkey-id = {key_id}\n{more}",
                self.conf_text
            ),
        )
        .unwrap();
        std::fs::rename(&tmp, path).unwrap();
    }
}

async fn wait_healthy(c: &mut KeyManagementServiceClient<Channel>) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let s = c.status(StatusRequest {}).await.unwrap().into_inner();
        if s.healthz == "ok" {
            assert_eq!(s.version, "v2");
            return s.key_id;
        }
        assert!(Instant::now() < deadline, "never healthy: {}", s.healthz);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn wait_status(
    c: &mut KeyManagementServiceClient<Channel>,
    what: &str,
    pred: impl Fn(&str, &str) -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let s = c.status(StatusRequest {}).await.unwrap().into_inner();
        if pred(&s.healthz, &s.key_id) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: status stayed {:?} / {}",
            s.healthz,
            s.key_id
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn seed(n: u8) -> Vec<u8> {
    (0..32).map(|i| i ^ n).collect()
}

#[tokio::test]
async fn drives_like_an_apiserver_and_survives_restart() {
    let cloud = Cloud::start().await;
    let key = [7u8; 32];
    let secret = cloud.secret(&key).await;
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("cloud.conf");
    cloud.write_conf(&conf, &secret);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let http = format!("127.0.0.1:{port}");
    let plugin = Plugin::start(dir.path(), &conf, &["--http-endpoint", &http]);
    let mut c = plugin.client().await;
    assert_eq!(
        std::fs::metadata(&plugin.socket)
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o600
    );

    // Status, then Encrypt of a 32-byte seed, as the apiserver does at start
    let key_id = wait_healthy(&mut c).await;
    assert!(key_id.starts_with(&format!("{secret}:")), "{key_id}");
    let enc = encrypt(&mut c, seed(1), "u-1").await;
    assert_eq!(enc.key_id, key_id, "Encrypt and Status agree on key_id");
    assert!(enc.ciphertext.len() <= 1024 && !enc.ciphertext.is_empty());
    assert!(enc.annotations.keys().all(|k| {
        k.contains('.')
            && k.chars()
                .all(|c| c.is_ascii_lowercase() || c == '.' || c == '-')
    }));

    // a burst of Decrypts with the returned key_id and annotations
    let mut tasks = Vec::new();
    for i in 0..300 {
        let mut c = c.clone();
        let (ct, kid, ann) = (
            enc.ciphertext.clone(),
            enc.key_id.clone(),
            enc.annotations.clone(),
        );
        tasks.push(tokio::spawn(async move {
            c.decrypt(DecryptRequest {
                ciphertext: ct,
                uid: format!("d-{i}"),
                key_id: kid,
                annotations: ann,
            })
            .await
        }));
    }
    for t in tasks {
        assert_eq!(t.await.unwrap().unwrap().into_inner().plaintext, seed(1));
    }

    // /healthz mirrors Status; /metrics counts RPCs and Barbican fetches
    let (code, body) = http_get(port, "/healthz").await.unwrap();
    assert_eq!((code, body.trim()), (200, "ok"));
    let (_, metrics) = http_get(port, "/metrics").await.unwrap();
    for want in [
        "grpc_server_handled_total{method=\"/v2.KeyManagementService/Decrypt\",code=\"OK\"} 300",
        "grpc_server_handled_total{method=\"/v2.KeyManagementService/Encrypt\",code=\"OK\"} 1",
        "request=\"secret_payload_get\",status=\"200\"}",
        "kms_key_age_seconds",
        "kms_key_refresh_failures_total 0",
    ] {
        assert!(metrics.contains(want), "{want} missing from:\n{metrics}");
    }

    // no seed or key material in the log, at debug level
    let log = std::fs::read_to_string(&plugin.log).unwrap();
    for secret_bytes in [seed(1), key.to_vec(), enc.ciphertext.clone()] {
        let as_list = format!("{:?}", &secret_bytes[..8]);
        assert!(
            !log.contains(&as_list[1..as_list.len() - 1]),
            "key material in the log"
        );
    }

    // a restarted plugin still opens what the old one sealed
    drop(c);
    drop(plugin);
    let plugin = Plugin::start(dir.path(), &conf, &[]);
    let mut c = plugin.client().await;
    assert_eq!(wait_healthy(&mut c).await, key_id);
    let dec = c
        .decrypt(DecryptRequest {
            ciphertext: enc.ciphertext,
            uid: "r".into(),
            key_id: enc.key_id,
            annotations: enc.annotations,
        })
        .await
        .unwrap();
    assert_eq!(dec.into_inner().plaintext, seed(1));
}

#[tokio::test]
async fn rotation_keeps_old_data_readable() {
    let cloud = Cloud::start().await;
    let (_first, dir, conf) = cloud.configured(&[1u8; 32]).await;
    let plugin = Plugin::start(dir.path(), &conf, &[]);
    let mut c = plugin.client().await;
    let old_id = wait_healthy(&mut c).await;
    let old = encrypt(&mut c, seed(2), "a").await;

    // key-id changes in the file; SIGHUP (a changed file alone also works)
    let second = cloud.secret(&[2u8; 32]).await;
    cloud.write_conf(&conf, &second);
    plugin.sighup();
    wait_status(&mut c, "rotation", |h, k| {
        h == "ok" && k.starts_with(&second)
    })
    .await;
    let new = encrypt(&mut c, seed(3), "b").await;
    assert!(new.key_id.starts_with(&second) && new.key_id != old_id);
    let status = c.status(StatusRequest {}).await.unwrap().into_inner();
    assert_eq!(
        status.key_id, new.key_id,
        "Status and Encrypt agree after rotation"
    );
    for (ct, want) in [(old, seed(2)), (new, seed(3))] {
        let pt = c
            .decrypt(DecryptRequest {
                ciphertext: ct.ciphertext,
                uid: "d".into(),
                key_id: ct.key_id,
                annotations: ct.annotations,
            })
            .await
            .unwrap()
            .into_inner()
            .plaintext;
        assert_eq!(pt, want);
    }
}

#[tokio::test]
async fn a_slow_barbican_is_waited_for_past_a_short_refresh_interval_on_the_emulator() {
    // every answer of Barbican 600 ms late (a loaded cloud; CI's real one
    // took over 200 ms), the refresh interval 200 ms: a fetch still gets
    // the time Barbican takes, and the plugin serves
    let (emu, cloud) = emulated().await;
    let (_secret, dir, conf) = cloud.configured(&[0x33u8; 32]).await;
    emu.control().add_fault(FaultRule::new(
        None,
        "/key-manager/",
        FaultAction::Delay { millis: 600 },
    ));
    let plugin = Plugin::start(dir.path(), &conf, &[]);
    let mut c = plugin.client().await;
    wait_healthy(&mut c).await;
    let enc = encrypt(&mut c, seed(0x34), "slow").await;
    assert_eq!(decrypt(&mut c, &enc, "slow").await.unwrap(), seed(0x34));
}

#[tokio::test]
async fn barbican_outage_degrades_only_after_the_allowed_staleness_on_the_emulator() {
    // outages are injected by the emulator, whatever the backend chosen
    let (emu, cloud) = emulated().await;
    let (_secret, dir, conf) = cloud.configured(&[9u8; 32]).await;
    let plugin = Plugin::start(dir.path(), &conf, &["--max-staleness", "2s"]);
    let mut c = plugin.client().await;
    wait_healthy(&mut c).await;
    let enc = encrypt(&mut c, seed(4), "e").await;

    emu.control()
        .add_fault(FaultRule::new(None, "/key-manager/", FaultAction::Drop));
    // keeps serving from the cached key
    let started = Instant::now();
    let pt = c
        .decrypt(DecryptRequest {
            ciphertext: enc.ciphertext.clone(),
            uid: "o".into(),
            key_id: enc.key_id.clone(),
            annotations: enc.annotations.clone(),
        })
        .await
        .unwrap();
    assert_eq!(pt.into_inner().plaintext, seed(4));
    c.encrypt(EncryptRequest {
        plaintext: seed(5),
        uid: "o2".into(),
    })
    .await
    .unwrap();
    assert_eq!(
        c.status(StatusRequest {})
            .await
            .unwrap()
            .into_inner()
            .healthz,
        "ok",
        "healthy within the staleness"
    );
    wait_status(&mut c, "degraded", |h, _| {
        h.contains("not confirmed by Barbican")
    })
    .await;
    assert!(
        started.elapsed() >= Duration::from_millis(1500),
        "degraded too early: {:?}",
        started.elapsed()
    );
    // and recovers
    emu.control().clear_faults();
    wait_healthy(&mut c).await;
}

#[tokio::test]
async fn decrypts_what_the_upstream_plugin_wrote() {
    let cloud = Cloud::start().await;
    let key = [0x42u8; 32];
    let secret = cloud.secret(&key).await;
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("cloud.conf");
    cloud.write_conf(&conf, &secret);
    let plugin = Plugin::start(dir.path(), &conf, &[]);
    let mut c = plugin.client().await;
    wait_healthy(&mut c).await;
    // upstream: IV ‖ AES-256-CBC(PKCS#7(seed)), key_id = the bare secret UUID
    let iv = [3u8; 16];
    let body = cbc::Encryptor::<aes::Aes256>::new_from_slices(&key, &iv)
        .unwrap()
        .encrypt_padded_vec_mut::<Pkcs7>(&seed(6));
    let legacy = [iv.as_slice(), &body].concat();
    let pt = c
        .decrypt(DecryptRequest {
            ciphertext: legacy.clone(),
            uid: "l".into(),
            key_id: secret.clone(),
            annotations: HashMap::new(),
        })
        .await
        .unwrap()
        .into_inner()
        .plaintext;
    assert_eq!(pt, seed(6));
    // a broken legacy ciphertext is refused
    let err = c
        .decrypt(DecryptRequest {
            ciphertext: legacy[..40].to_vec(),
            uid: "l2".into(),
            key_id: secret,
            annotations: HashMap::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err}");
}

#[tokio::test]
async fn bad_input_gets_clear_errors_and_the_process_stays_up() {
    let cloud = Cloud::start().await;
    let (_secret, dir, conf) = cloud.configured(&[5u8; 32]).await;
    let plugin = Plugin::start(dir.path(), &conf, &[]);
    let mut c = plugin.client().await;
    wait_healthy(&mut c).await;
    let enc = encrypt(&mut c, seed(7), "x").await;
    let dec = |ct: Vec<u8>, kid: &str, ann: HashMap<String, Vec<u8>>| DecryptRequest {
        ciphertext: ct,
        uid: "b".into(),
        key_id: kid.into(),
        annotations: ann,
    };

    let code =
        |r: Result<tonic::Response<proto::kms::v2::EncryptResponse>, tonic::Status>| r.unwrap_err();
    let e = code(
        c.encrypt(EncryptRequest {
            plaintext: vec![],
            uid: "e".into(),
        })
        .await,
    );
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(e.message().contains("empty"), "{e}");
    let e = code(
        c.encrypt(EncryptRequest {
            plaintext: vec![1; 2000],
            uid: "e".into(),
        })
        .await,
    );
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(e.message().contains("2000 bytes"), "{e}");

    let cases: Vec<(DecryptRequest, tonic::Code, &str)> = vec![
        (
            dec(enc.ciphertext.clone(), "", enc.annotations.clone()),
            tonic::Code::InvalidArgument,
            "key_id",
        ),
        (
            dec(
                enc.ciphertext.clone(),
                &"x".repeat(2000),
                enc.annotations.clone(),
            ),
            tonic::Code::InvalidArgument,
            "key_id",
        ),
        (
            dec(enc.ciphertext.clone(), "not-a-key-id", HashMap::new()),
            tonic::Code::InvalidArgument,
            "key_id",
        ),
        (
            dec(
                enc.ciphertext.clone(),
                &enc.key_id,
                HashMap::from([("evil.example.com".to_string(), b"x".to_vec())]),
            ),
            tonic::Code::InvalidArgument,
            "annotation",
        ),
        (
            dec(
                enc.ciphertext.clone(),
                &enc.key_id,
                HashMap::from([(
                    kms_barbican::envelope::FORMAT_ANNOTATION.to_string(),
                    b"rot13".to_vec(),
                )]),
            ),
            tonic::Code::InvalidArgument,
            "not a format",
        ),
        (
            {
                let mut t = enc.ciphertext.clone();
                t[20] ^= 1;
                dec(t, &enc.key_id, enc.annotations.clone())
            },
            tonic::Code::InvalidArgument,
            "does not authenticate",
        ),
        (
            dec(vec![], &enc.key_id, enc.annotations.clone()),
            tonic::Code::InvalidArgument,
            "shorter",
        ),
    ];
    for (req, want, text) in cases {
        let e = c.decrypt(req).await.unwrap_err();
        assert_eq!(e.code(), want, "{e}");
        assert!(e.message().contains(text), "{e}");
    }

    // keys the operator did not name: one answer, whether Barbican holds
    // the secret (readable with the plugin's credentials) or not, and no
    // fingerprint of it
    let other = cloud.secret(&[9u8; 32]).await;
    let mut answers = Vec::new();
    for key_id in [
        "00000000-0000-4000-8000-000000000000:0123456789abcdef".to_string(),
        format!("{other}:0123456789abcdef"),
        other.clone(),
    ] {
        let legacy = !key_id.contains(':');
        let req = dec(
            if legacy {
                vec![0u8; 48]
            } else {
                enc.ciphertext.clone()
            },
            &key_id,
            if legacy {
                HashMap::new()
            } else {
                enc.annotations.clone()
            },
        );
        let e = c.decrypt(req).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");
        answers.push(e.message().to_string());
    }
    assert!(answers.iter().all(|a| a == &answers[0]), "{answers:?}");
    assert!(
        answers[0].contains("not one this plugin decrypts with"),
        "{answers:?}"
    );

    // a legacy ciphertext that does not open: one answer whatever failed
    // (a padding oracle otherwise)
    let secret = enc.key_id.split(':').next().unwrap().to_string();
    let mut legacy_answers = Vec::new();
    for ct in [vec![0u8; 48], vec![0u8; 40], vec![7u8; 64]] {
        let e = c
            .decrypt(dec(ct, &secret, HashMap::new()))
            .await
            .unwrap_err();
        legacy_answers.push((e.code(), e.message().to_string()));
    }
    assert!(
        legacy_answers.iter().all(|a| a == &legacy_answers[0]),
        "{legacy_answers:?}"
    );

    // request fields reach the log escaped and bounded
    for uid in [
        "pod\nFORGED rotation applied".to_string(),
        "u".repeat(120_000),
    ] {
        let _ = c
            .decrypt(DecryptRequest {
                ciphertext: vec![1],
                uid,
                key_id: "k\nFORGED".into(),
                annotations: HashMap::new(),
            })
            .await
            .unwrap_err();
    }
    let log = std::fs::read_to_string(&plugin.log).unwrap();
    assert!(
        !log.lines().any(|l| l.starts_with("FORGED")),
        "a forged line"
    );
    assert!(
        log.lines().all(|l| l.len() < 4096),
        "a log line of {} bytes",
        log.lines().map(str::len).max().unwrap_or(0)
    );
    // still serving
    wait_healthy(&mut c).await;
}

#[tokio::test]
async fn an_unusable_key_or_login_keeps_status_unhealthy_with_the_reason() {
    let cloud = Cloud::start().await;
    let short = cloud.secret(&[1u8; 16]).await;
    let dir = tempfile::tempdir().unwrap();
    for (key_id, conf_text, want) in [
        (short.clone(), None, "16 bytes"),
        (
            "3f1d2c4b-0000-4000-8000-000000000000".to_string(),
            None,
            "does not exist",
        ),
        (
            short.clone(),
            Some(cloud.conf_text.clone().replace("admin-secret", "wrong")),
            "refused password authentication",
        ),
    ] {
        let conf = dir.path().join(format!("c-{}.conf", want.len()));
        match conf_text {
            None => cloud.write_conf(&conf, &key_id),
            Some(text) => {
                std::fs::write(&conf, format!("{text}\n[KeyManager]\nkey-id = {key_id}\n")).unwrap()
            }
        }
        let sub = dir.path().join(format!("p-{}", want.len()));
        std::fs::create_dir_all(&sub).unwrap();
        let plugin = Plugin::start(&sub, &conf, &[]);
        let mut c = plugin.client().await;
        wait_status(&mut c, want, |h, _| h.contains(want)).await;
        let e = c
            .encrypt(EncryptRequest {
                plaintext: seed(1),
                uid: "n".into(),
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unavailable, "{want}: {e}");
    }

    // a cloud.conf without [KeyManager] key-id is refused at start
    let conf = dir.path().join("nokey.conf");
    std::fs::write(&conf, cloud.conf_text.clone()).unwrap();
    let out = Command::new(BIN)
        .args(["--socketpath", "/tmp/never-kms.sock", "--cloud-config"])
        .arg(&conf)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("[KeyManager] key-id"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `--previous-key-id` keys are loaded at start: with Barbican cut off
/// afterwards, old data still decrypts (no on-demand fetch is possible).
#[tokio::test]
async fn previous_keys_are_loaded_at_start_on_the_emulator() {
    // outages are injected by the emulator, whatever the backend chosen
    let (emu, cloud) = emulated().await;
    let (old, dir, conf) = cloud.configured(&[11u8; 32]).await;
    let first = Plugin::start(dir.path(), &conf, &[]);
    let mut c = first.client().await;
    wait_healthy(&mut c).await;
    let sealed = encrypt(&mut c, seed(8), "p").await;
    drop(c);
    drop(first);

    let new = cloud.secret(&[12u8; 32]).await;
    cloud.write_conf(&conf, &new);
    let second = Plugin::start(dir.path(), &conf, &["--previous-key-id", &old]);
    let mut c = second.client().await;
    wait_healthy(&mut c).await;
    // the previous key is loaded right after the current one
    let deadline = Instant::now() + Duration::from_secs(10);
    while !std::fs::read_to_string(&second.log)
        .unwrap_or_default()
        .contains("previous key loaded")
    {
        assert!(Instant::now() < deadline, "previous key never loaded");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    emu.control()
        .add_fault(FaultRule::new(None, "/key-manager/", FaultAction::Drop));
    let pt = c
        .decrypt(DecryptRequest {
            ciphertext: sealed.ciphertext,
            uid: "q".into(),
            key_id: sealed.key_id,
            annotations: sealed.annotations,
        })
        .await
        .unwrap()
        .into_inner()
        .plaintext;
    assert_eq!(pt, seed(8));
}

async fn encrypt(
    c: &mut KeyManagementServiceClient<Channel>,
    plaintext: Vec<u8>,
    uid: &str,
) -> proto::kms::v2::EncryptResponse {
    c.encrypt(EncryptRequest {
        plaintext,
        uid: uid.into(),
    })
    .await
    .unwrap()
    .into_inner()
}

/// The value of a metric line starting with `prefix`.
fn metric(text: &str, prefix: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// Fault injection: the emulator's Barbican, whatever the backend chosen.
async fn emulated() -> (Emulator, Cloud) {
    let emu = Emulator::start(EmulatorConfig::default()).await.unwrap();
    let conf_text = emu.cloud_conf();
    let conf = CloudConf::from_texts(
        &[(PathBuf::from("c"), conf_text.clone())],
        ConfigEnv::default(),
    )
    .unwrap();
    let barbican =
        KeyManager::new(Session::new(conf.cloud("").unwrap(), SessionOptions::default()).unwrap());
    (
        emu,
        Cloud {
            _emu: None,
            conf_text,
            barbican,
        },
    )
}

#[tokio::test]
async fn a_rotation_asked_for_during_a_barbican_outage_applies_when_it_ends_on_the_emulator() {
    let (emu, cloud) = emulated().await;
    let (first, dir, conf) = cloud.configured(&[1u8; 32]).await;
    let second = cloud.secret(&[2u8; 32]).await;
    let port = free_port().unwrap();
    let http = format!("127.0.0.1:{port}");
    let plugin = Plugin::start(
        dir.path(),
        &conf,
        &["--max-staleness", "6s", "--http-endpoint", &http],
    );
    let mut c = plugin.client().await;
    let old_id = wait_healthy(&mut c).await;

    // Barbican answers 503 for a while; meanwhile the operator rotates:
    // the file changes, then SIGHUP
    emu.control().add_fault(FaultRule::new(
        None,
        "/key-manager",
        FaultAction::Status {
            status: 503,
            message: None,
            retry_after: None,
            hint: Default::default(),
        },
    ));
    cloud.write_conf(&conf, &second);
    tokio::time::sleep(Duration::from_millis(300)).await;
    plugin.sighup();
    // the current key still works: healthy, old key; but the rotation is
    // pending, and says so (waited for, then for its age to pass 1 s)
    let deadline = Instant::now() + Duration::from_secs(20);
    let (code, body) = loop {
        let (code, body) = http_get(port, "/healthz").await.unwrap();
        if body.contains(&second) || Instant::now() > deadline {
            break (code, body);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(code, 200, "{body}");
    assert!(
        body.starts_with("ok: rotation to Barbican secret") && body.contains(&second),
        "{body}"
    );
    let s = c.status(StatusRequest {}).await.unwrap().into_inner();
    assert_eq!(
        (s.healthz.as_str(), s.key_id.as_str()),
        ("ok", old_id.as_str())
    );
    // and at least one attempt failed against the outage before it ends
    // (an attempt still in flight when it ends applies without failing:
    // on a loaded machine Barbican's 503s took that long)
    let m = loop {
        let (_, m) = http_get(port, "/metrics").await.unwrap();
        if (metric(&m, "kms_key_rotation_pending_seconds").is_some_and(|v| v > 1.0)
            && metric(&m, "kms_key_rotation_failures_total").is_some_and(|v| v >= 1.0))
            || Instant::now() > deadline
        {
            break m;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        metric(&m, "kms_key_rotation_pending_seconds").is_some_and(|v| v > 1.0)
            && metric(&m, "kms_key_rotation_failures_total").is_some_and(|v| v >= 1.0),
        "{m}\n{}",
        std::fs::read_to_string(&plugin.log).unwrap_or_default()
    );
    assert!(
        m.contains(&format!(
            "kms_key_info{{current_secret=\"{first}\",wanted_secret=\"{second}\"}} 1"
        )),
        "{m}"
    );
    assert!(encrypt(&mut c, seed(4), "during").await.key_id == old_id);

    // Barbican is back: the rotation applies within a refresh interval
    emu.control().clear_faults();
    wait_status(&mut c, "the pending rotation", |h, k| {
        h == "ok" && k.starts_with(&second)
    })
    .await;
    assert!(
        encrypt(&mut c, seed(5), "after")
            .await
            .key_id
            .starts_with(&second)
    );
    // the gauges follow within their update tick
    let mut m = String::new();
    for _ in 0..40 {
        m = http_get(port, "/metrics").await.unwrap().1;
        if metric(&m, "kms_key_rotation_pending_seconds") == Some(0.0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        metric(&m, "kms_key_rotation_pending_seconds"),
        Some(0.0),
        "{m}"
    );
    let failures = metric(&m, "kms_key_rotation_failures_total").unwrap();
    assert!(failures >= 1.0, "{m}");
    let (_, body) = http_get(port, "/healthz").await.unwrap();
    assert_eq!(body.trim(), "ok");
    // one line per failed attempt, and the change (file, then SIGHUP)
    // applied once
    let log = std::fs::read_to_string(&plugin.log).unwrap();
    assert_eq!(
        log.matches("cannot rotate to the new key yet").count() as f64,
        failures,
        "{log}"
    );
    assert_eq!(log.matches("configuration reloaded").count(), 1, "{log}");
    assert!(!log.contains('\u{1b}'), "colour codes in a log file");
}

#[tokio::test]
async fn a_rotation_that_never_applies_degrades_after_the_allowed_staleness_on_the_emulator() {
    let (emu, cloud) = emulated().await;
    let (_first, dir, conf) = cloud.configured(&[1u8; 32]).await;
    let plugin = Plugin::start(dir.path(), &conf, &["--max-staleness", "2s"]);
    let mut c = plugin.client().await;
    wait_healthy(&mut c).await;
    // a key id Barbican does not have
    cloud.write_conf(&conf, "00000000-0000-4000-8000-00000000dead");
    let asked = Instant::now();
    plugin.sighup();
    wait_status(&mut c, "unhealthy after the allowed staleness", |h, _| {
        h.contains("has not applied")
    })
    .await;
    // never before the 2 s it may take (the key in use still works)
    assert!(
        asked.elapsed() >= Duration::from_secs(2),
        "unhealthy {:?} after the rotation was asked for, within the allowed staleness",
        asked.elapsed()
    );
    // naming the current key again cancels it
    let back = cloud.secret(&[9u8; 32]).await;
    cloud.write_conf(&conf, &back);
    plugin.sighup();
    wait_status(&mut c, "the new key", |h, k| {
        h == "ok" && k.starts_with(&back)
    })
    .await;
    drop(emu);
}

#[tokio::test]
async fn rotated_barbican_credentials_apply_without_a_restart_on_the_emulator() {
    let (emu, cloud) = emulated().await;
    let (_first, dir, conf) = cloud.configured(&[1u8; 32]).await;
    let plugin = Plugin::start(dir.path(), &conf, &[]);
    let mut c = plugin.client().await;
    wait_healthy(&mut c).await;
    let third = cloud.secret(&[3u8; 32]).await;
    // the password changes in Keystone; the plugin's file follows
    assert!(emu.control().set_password("admin", "rotated-secret"));
    let rotated = cloud.conf_text.replace("admin-secret", "rotated-secret");
    std::fs::write(
        &conf,
        format!("{rotated}\n[KeyManager]\nkey-id = {third}\n"),
    )
    .unwrap();
    // the new key is fetched with the new credentials, no restart
    wait_status(&mut c, "rotation with the new credentials", |h, k| {
        h == "ok" && k.starts_with(&third)
    })
    .await;
    let log = std::fs::read_to_string(&plugin.log).unwrap();
    assert!(log.contains("new Barbican credentials"), "{log}");
    assert!(
        !log.contains("rotated-secret"),
        "a password reached the log"
    );
}

/// A cloud.conf authenticating with an application credential.
fn app_cred_conf(
    admin: &Session,
    cred: &openstack_client::identity::ApplicationCredential,
    key_id: &str,
) -> String {
    let cfg = admin.config();
    format!(
        "[Global]\nauth-url = \"{}\"\napplication-credential-id = \"{}\"\napplication-credential-secret = \"{}\"\n{}\n[KeyManager]\nkey-id = {key_id}\n",
        cfg.auth_url,
        cred.id,
        cred.secret.expose(),
        cfg.region
            .as_deref()
            .map(|r| format!("region = \"{r}\""))
            .unwrap_or_default()
    )
}

/// On the emulator and on the real test cloud: an operator rotates the
/// plugin's application credential (a new one in the Secret, the old one
/// deleted); the plugin keeps working without a restart.
#[tokio::test]
async fn a_rotated_application_credential_applies_without_a_restart() {
    let cloud = Cloud::start().await;
    let conf = CloudConf::from_texts(
        &[(PathBuf::from("c"), cloud.conf_text.clone())],
        ConfigEnv::default(),
    )
    .unwrap();
    let admin = Session::new(conf.cloud("").unwrap(), SessionOptions::default()).unwrap();
    let identity = openstack_client::identity::Identity::new(admin.clone());
    let first_cred = identity
        .create_application_credential(&format!("kms-test-{}", std::process::id()))
        .await
        .unwrap();
    let first = cloud.secret(&[5u8; 32]).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cloud.conf");
    std::fs::write(&path, app_cred_conf(&admin, &first_cred, &first)).unwrap();
    let plugin = Plugin::start(dir.path(), &path, &[]);
    let mut c = plugin.client().await;
    assert!(wait_healthy(&mut c).await.starts_with(&first));

    // the new credential and a new key in the Secret; the old credential
    // deleted (its tokens revoked)
    let second_cred = identity
        .create_application_credential(&format!("kms-test-{}-2", std::process::id()))
        .await
        .unwrap();
    let second = cloud.secret(&[6u8; 32]).await;
    std::fs::write(&path, app_cred_conf(&admin, &second_cred, &second)).unwrap();
    identity
        .delete_application_credential(&first_cred.id)
        .await
        .unwrap();
    // the new key can only have been fetched with the new credential
    wait_status(&mut c, "rotation with the new credential", |h, k| {
        h == "ok" && k.starts_with(&second)
    })
    .await;
    let log = std::fs::read_to_string(&plugin.log).unwrap();
    assert!(log.contains("new Barbican credentials"), "{log}");
    assert!(
        !log.contains(second_cred.secret.expose()),
        "a credential secret reached the log"
    );
    drop(plugin);
    identity
        .delete_application_credential(&second_cred.id)
        .await
        .unwrap();
}

async fn decrypt(
    c: &mut KeyManagementServiceClient<Channel>,
    ct: &proto::kms::v2::EncryptResponse,
    uid: &str,
) -> Result<Vec<u8>, tonic::Status> {
    c.decrypt(DecryptRequest {
        ciphertext: ct.ciphertext.clone(),
        uid: uid.into(),
        key_id: ct.key_id.clone(),
        annotations: ct.annotations.clone(),
    })
    .await
    .map(|r| r.into_inner().plaintext)
}

/// The key ids the plugin's key record lists (beside its socket).
fn recorded_key_ids(dir: &Path) -> Vec<String> {
    recorded_in(&dir.join("run/kms-keys.json"))
}

/// The key ids the key record at `path` lists.
fn recorded_in(path: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    if text.is_empty() {
        return Vec::new();
    }
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["key_id"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn keys_it_sealed_under_survive_a_restart_after_a_rotation_without_any_flag() {
    let cloud = Cloud::start().await;
    let (first, dir, conf) = cloud.configured(&[0x31u8; 32]).await;
    let plugin = Plugin::start(dir.path(), &conf, &[]);
    let mut c = plugin.client().await;
    let first_id = wait_healthy(&mut c).await;
    assert!(
        recorded_key_ids(dir.path()).is_empty(),
        "nothing sealed yet, nothing recorded"
    );
    let old = encrypt(&mut c, seed(0x41), "before").await;
    assert_eq!(
        recorded_key_ids(dir.path()),
        std::slice::from_ref(&first_id),
        "recorded by the time Encrypt answers"
    );

    // rotation by configuration; the old key is named by nothing but the
    // plugin's own record
    let second = cloud.secret(&[0x32u8; 32]).await;
    cloud.write_conf(&conf, &second);
    plugin.sighup();
    wait_status(&mut c, "rotation", |h, k| {
        h == "ok" && k.starts_with(&second)
    })
    .await;
    assert_eq!(
        recorded_key_ids(dir.path()),
        std::slice::from_ref(&first_id),
        "a key is recorded when it first seals, not when it is named"
    );
    let new = encrypt(&mut c, seed(0x42), "after").await;
    assert_eq!(
        recorded_key_ids(dir.path()),
        [first_id.clone(), new.key_id.clone()]
    );

    // killed, as a node dies; started again with the same flags
    drop(c);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(plugin.child.id() as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    drop(plugin);
    let plugin = Plugin::start(dir.path(), &conf, &[]);
    let mut c = plugin.client().await;
    assert!(wait_healthy(&mut c).await.starts_with(&second));
    assert_eq!(decrypt(&mut c, &old, "old").await.unwrap(), seed(0x41));
    assert_eq!(decrypt(&mut c, &new, "new").await.unwrap(), seed(0x42));

    // the record: root-only, key ids only, no key material
    let path = dir.path().join("run/kms-keys.json");
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains(&first) && text.contains(&second));
    for key in [[0x31u8; 32], [0x32u8; 32]] {
        for shape in [
            format!("{:?}", &key[..8]),
            key[..8].iter().map(|b| format!("{b:02x}")).collect(),
            "MTExMTEx".to_string(),
            "MjIyMjIy".to_string(),
        ] {
            assert!(
                !text.contains(&shape),
                "key material in the record: {shape}"
            );
        }
    }
}

/// A KMS migration runs the old plugin and its successor side by side,
/// their sockets in one directory: each keeps a key record of its own,
/// named after its socket, so that neither loses the other's keys; the
/// successor takes over the keys of the record the directory had (the
/// one every plugin there wrote before) once. After the old plugin has
/// rotated, the successor, restarted with no flag, still opens what it
/// sealed.
#[tokio::test]
async fn plugins_sharing_a_socket_directory_keep_a_key_record_each() {
    let cloud = Cloud::start().await;
    let (_first, dir, conf) = cloud.configured(&[0x71u8; 32]).await;
    let old = Plugin::start(dir.path(), &conf, &[]);
    let mut c_old = old.client().await;
    let old_key = wait_healthy(&mut c_old).await;
    encrypt(&mut c_old, seed(0x71), "old-1").await;

    let second = cloud.secret(&[0x72u8; 32]).await;
    let conf_new = dir.path().join("cloud-new.conf");
    cloud.write_conf(&conf_new, &second);
    let new = Plugin::start_on(dir.path(), "kms-new.sock", &conf_new, &[]);
    let mut c_new = new.client().await;
    let new_key = wait_healthy(&mut c_new).await;
    let new_record = dir.path().join("run/kms-new-keys.json");
    assert_eq!(
        recorded_in(&new_record),
        std::slice::from_ref(&old_key),
        "the directory's record taken over"
    );
    let sealed = encrypt(&mut c_new, seed(0x72), "new-1").await;
    assert_eq!(recorded_in(&new_record), [old_key.clone(), new_key.clone()]);
    assert_eq!(
        recorded_key_ids(dir.path()),
        std::slice::from_ref(&old_key),
        "the old plugin's record is its own"
    );

    // the old plugin rotates and seals: its record changes, not the
    // successor's
    let third = cloud.secret(&[0x73u8; 32]).await;
    cloud.write_conf(&conf, &third);
    old.sighup();
    wait_status(&mut c_old, "rotation", |h, k| {
        h == "ok" && k.starts_with(&third)
    })
    .await;
    let rotated = encrypt(&mut c_old, seed(0x73), "old-2").await;
    assert_eq!(
        recorded_key_ids(dir.path()),
        [old_key.clone(), rotated.key_id]
    );
    assert_eq!(recorded_in(&new_record), [old_key, new_key]);

    // the successor killed and started again with the same flags
    drop(c_new);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(new.child.id() as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    drop(new);
    let new = Plugin::start_on(dir.path(), "kms-new.sock", &conf_new, &[]);
    let mut c_new = new.client().await;
    wait_healthy(&mut c_new).await;
    assert_eq!(
        decrypt(&mut c_new, &sealed, "new-2").await.unwrap(),
        seed(0x72)
    );
    let leftovers: Vec<_> = std::fs::read_dir(dir.path().join("run"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");
}

/// A record that cannot be written: Encrypt under a key it lacks refuses
/// (Unavailable, retried by the apiserver) and Status says why, instead of
/// "ok"; once it can be written, both recover without a restart.
#[tokio::test]
async fn a_record_that_cannot_be_written_makes_status_say_so() {
    let cloud = Cloud::start().await;
    let (_secret, dir, conf) = cloud.configured(&[0x81u8; 32]).await;
    let record_dir = dir.path().join("not-yet");
    let record = record_dir.join("keys.json");
    let arg = format!("--key-record={}", record.display());
    let plugin = Plugin::start(dir.path(), &conf, &[&arg]);
    let mut c = plugin.client().await;
    wait_healthy(&mut c).await;
    let refused = c
        .encrypt(EncryptRequest {
            plaintext: seed(0x81),
            uid: "a".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
    wait_status(&mut c, "unwritable record", |h, _| {
        h.contains("key record") && h.contains("cannot be written")
    })
    .await;
    std::fs::create_dir(&record_dir).unwrap();
    let sealed = encrypt(&mut c, seed(0x82), "b").await;
    assert_eq!(recorded_in(&record), std::slice::from_ref(&sealed.key_id));
    wait_healthy(&mut c).await;
}

#[tokio::test]
async fn a_record_that_is_not_the_plugins_own_is_refused_loudly_and_left_alone() {
    let cloud = Cloud::start().await;
    let (_secret, dir, conf) = cloud.configured(&[0x51u8; 32]).await;
    let plugin = Plugin::start(dir.path(), &conf, &[]);
    let mut c = plugin.client().await;
    wait_healthy(&mut c).await;
    let sealed = encrypt(&mut c, seed(0x61), "a").await;
    drop(c);
    drop(plugin);
    let path = dir.path().join("run/kms-keys.json");
    let good = std::fs::read_to_string(&path).unwrap();

    // edited by hand (a key id changed without the plugin), then writable
    // by others, then not a record at all
    let edited = good.replacen(&sealed.key_id[37..], "0000000000000000", 1);
    for (what, text, mode) in [
        ("edited", edited.as_str(), 0o600),
        ("writable by others", good.as_str(), 0o666),
        ("garbage", "{not json", 0o600),
    ] {
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        let plugin = Plugin::start(dir.path(), &conf, &[]);
        let mut c = plugin.client().await;
        wait_status(&mut c, what, |h, _| h.contains("key record")).await;
        let refused = c
            .encrypt(EncryptRequest {
                plaintext: seed(0x62),
                uid: "b".into(),
            })
            .await
            .unwrap_err();
        assert_eq!(
            refused.code(),
            tonic::Code::Unavailable,
            "{what}: {refused:?}"
        );
        assert!(
            refused.message().contains("key record"),
            "{what}: {refused:?}"
        );
        // what the current key sealed still opens
        assert_eq!(
            decrypt(&mut c, &sealed, "d").await.unwrap(),
            seed(0x61),
            "{what}"
        );
        drop(c);
        drop(plugin);
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            text,
            "{what}: the refused record is left as it was"
        );
        let log = std::fs::read_to_string(dir.path().join("plugin.log")).unwrap();
        assert!(log.contains("key record is refused"), "{what}: {log}");
    }

    // the operator puts the good record back: healthy again
    std::fs::write(&path, &good).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    let plugin = Plugin::start(dir.path(), &conf, &[]);
    let mut c = plugin.client().await;
    wait_healthy(&mut c).await;
    encrypt(&mut c, seed(0x63), "c").await;
}

#[tokio::test]
async fn keys_are_staged_and_retired_by_configuration_read_live() {
    let cloud = Cloud::start().await;
    let (first, dir, conf) = cloud.configured(&[0x71u8; 32]).await;
    let port = free_port().unwrap();
    let http = format!("127.0.0.1:{port}");
    let plugin = Plugin::start(dir.path(), &conf, &["--http-endpoint", &http]);
    let mut c = plugin.client().await;
    let first_id = wait_healthy(&mut c).await;
    let old = encrypt(&mut c, seed(0x81), "old").await;

    // another control-plane node's plugin seals under a new key first
    let second = cloud.secret(&[0x72u8; 32]).await;
    let (_, other_dir, other_conf) = cloud.configured(&[0u8; 32]).await;
    cloud.write_conf(&other_conf, &second);
    let other = Plugin::start(other_dir.path(), &other_conf, &[]);
    let mut o = other.client().await;
    wait_healthy(&mut o).await;
    let theirs = encrypt(&mut o, seed(0x82), "theirs").await;

    // this plugin does not decrypt it: the key is not staged here yet
    let e = decrypt(&mut c, &theirs, "t1").await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");

    // staged by configuration, re-read without a restart or a signal
    cloud.write_conf_with(&conf, &first, &format!("decrypt-key-ids = {second}\n"));
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match decrypt(&mut c, &theirs, "t2").await {
            Ok(pt) => {
                assert_eq!(pt, seed(0x82));
                break;
            }
            Err(e) => assert!(Instant::now() < deadline, "never staged: {e:?}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // still encrypting under the first key: staging is not switching
    assert_eq!(encrypt(&mut c, seed(0x83), "x").await.key_id, first_id);

    // a decrypt-key-ids entry that is not a UUID is refused; the plugin
    // keeps what it had
    cloud.write_conf_with(&conf, &first, "decrypt-key-ids = not-a-uuid\n");
    plugin.sighup();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(decrypt(&mut c, &theirs, "t3").await.unwrap(), seed(0x82));

    // switch, then retire the first key once "storage is migrated"
    cloud.write_conf_with(&conf, &second, &format!("decrypt-key-ids = {first}\n"));
    wait_status(&mut c, "switch", |h, k| h == "ok" && k.starts_with(&second)).await;
    let new = encrypt(&mut c, seed(0x84), "new").await;
    assert!(new.key_id.starts_with(&second));
    assert_eq!(decrypt(&mut c, &old, "o1").await.unwrap(), seed(0x81));
    assert!(recorded_key_ids(dir.path()).contains(&first_id));
    cloud.write_conf_with(&conf, &second, &format!("retired-key-ids = {first}\n"));
    let deadline = Instant::now() + Duration::from_secs(20);
    let refused = loop {
        match decrypt(&mut c, &old, "not-migrated").await {
            Err(e) if e.code() == tonic::Code::FailedPrecondition => break e,
            other => assert!(Instant::now() < deadline, "never retired: {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        refused.message().contains("retired") && refused.message().contains(&first),
        "{refused:?}"
    );
    // the record is rewritten beside the refusal, not before it: a busy
    // machine sees the refusal first (the record still holds the key for
    // a moment); it must forget the key within the bound all the same
    while recorded_key_ids(dir.path()).contains(&first_id) {
        assert!(
            Instant::now() < deadline,
            "the record forgets a retired key"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // the new key's data still reads; the refusal is counted by key, and
    // logged with the key_id the apiserver sent
    assert_eq!(decrypt(&mut c, &new, "n").await.unwrap(), seed(0x84));
    let (_, metrics) = http_get(port, "/metrics").await.unwrap();
    assert_eq!(
        metric(
            &metrics,
            &format!("kms_decrypt_refused_total{{key=\"{first}\"}}")
        ),
        Some(1.0),
        "{metrics}"
    );
    let log = std::fs::read_to_string(&plugin.log).unwrap();
    assert!(
        log.lines()
            .any(|l| l.contains("a retired key") && l.contains(&old.key_id)),
        "{log}"
    );

    // a restart keeps it retired; retiring the current key is ignored
    cloud.write_conf_with(
        &conf,
        &second,
        &format!("retired-key-ids = {first}, {second}\n"),
    );
    drop(c);
    drop(plugin);
    let plugin = Plugin::start(dir.path(), &conf, &[]);
    let mut c = plugin.client().await;
    assert!(wait_healthy(&mut c).await.starts_with(&second));
    assert_eq!(
        decrypt(&mut c, &old, "again").await.unwrap_err().code(),
        tonic::Code::FailedPrecondition
    );
    assert_eq!(decrypt(&mut c, &new, "n2").await.unwrap(), seed(0x84));
    assert!(
        encrypt(&mut c, seed(0x85), "y")
            .await
            .key_id
            .starts_with(&second)
    );
}
