//! KMS v2 envelope encryption through `barbican-kms-plugin`, as a
//! kube-apiserver drives it: Status, Encrypt a data-key seed, Decrypt it,
//! then a key rotation (a new Barbican secret named in cloud.conf, SIGHUP)
//! after which the old ciphertext still decrypts and Status and Encrypt
//! report the new key. The Barbican requests are counted at the emulator:
//! the key is fetched once, not once per call.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use openstack_client::barbican::{CreateSecret, KeyManager};
use openstack_emulator::Emulator;
use proto::kms::v2::key_management_service_client::KeyManagementServiceClient;
use proto::kms::v2::{DecryptRequest, EncryptRequest, EncryptResponse, StatusRequest};
use ring::rand::SecureRandom;
use tonic::transport::Channel;
use zeroize::Zeroizing;

use crate::volume::short;
use crate::{Logs, Report, StepFailure, answer, ensure};

/// Calls made in the walk's load step, as an apiserver encrypting and
/// reading back that many Secrets.
const LOAD: usize = 200;

/// The plugin process; stopped when dropped.
struct Plugin {
    child: Child,
    socket: PathBuf,
}

impl Drop for Plugin {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn random_bytes(n: usize) -> Result<Zeroizing<Vec<u8>>, StepFailure> {
    let mut v = Zeroizing::new(vec![0u8; n]);
    ring::rand::SystemRandom::new()
        .fill(&mut v)
        .map_err(|_| StepFailure::Check("no randomness from the system".into()))?;
    Ok(v)
}

/// A Barbican key as an operator creates one: 32 random bytes, AES.
pub async fn new_key(barbican: &KeyManager, name: &str) -> Result<String, StepFailure> {
    Ok(barbican
        .create_secret(&CreateSecret {
            name: name.into(),
            payload: Some(random_bytes(32)?),
            algorithm: Some("aes".into()),
            bit_length: Some(256),
            mode: Some("gcm".into()),
            secret_type: "symmetric".into(),
        })
        .await?)
}

fn write_conf(path: &Path, cloud_conf: &str, key_id: &str) -> Result<(), StepFailure> {
    std::fs::write(
        path,
        format!("{cloud_conf}\n[KeyManager]\nkey-id = {key_id}\n"),
    )?;
    Ok(())
}

/// Requests the emulator's Barbican has seen: (all, key payload fetches).
fn barbican_calls(emulator: &Emulator) -> (usize, usize) {
    let calls: Vec<_> = emulator
        .control()
        .calls()
        .into_iter()
        .filter(|c| c.path.contains("/key-manager/"))
        .collect();
    let fetches = calls
        .iter()
        .filter(|c| c.method == "GET" && c.path.ends_with("/payload"))
        .count();
    (calls.len(), fetches)
}

async fn encrypt(
    kms: &mut KeyManagementServiceClient<Channel>,
    plaintext: Vec<u8>,
    uid: &str,
) -> Result<EncryptResponse, StepFailure> {
    answer(
        "Encrypt",
        kms.encrypt(EncryptRequest {
            plaintext,
            uid: uid.into(),
        })
        .await,
    )
}

async fn decrypt(
    kms: &mut KeyManagementServiceClient<Channel>,
    sealed: &EncryptResponse,
    uid: &str,
) -> Result<Vec<u8>, StepFailure> {
    Ok(answer(
        "Decrypt",
        kms.decrypt(DecryptRequest {
            ciphertext: sealed.ciphertext.clone(),
            uid: uid.into(),
            key_id: sealed.key_id.clone(),
            annotations: sealed.annotations.clone(),
        })
        .await,
    )?
    .plaintext)
}

/// Walks envelope encryption and a key rotation; every step goes into
/// `report`.
pub async fn walk(report: &mut Report, emulator: &Emulator, binary: &Path, logs: &Logs) {
    report.part(
        "secrets",
        "barbican-kms-plugin, KMS v2 over its socket (encryption of Secrets at rest)",
    );
    let Ok(dir) = tempfile::Builder::new().prefix("suite-walk-kms-").tempdir() else {
        report.skip("start barbican-kms-plugin", "no temporary directory");
        return;
    };
    let cloud_conf = emulator.cloud_conf();
    let conf_path = dir.path().join("cloud.conf");
    let barbican = match crate::session_of(&cloud_conf) {
        Ok(s) => KeyManager::new(s),
        Err(e) => {
            report.skip("start barbican-kms-plugin", &format!("no session: {e}"));
            return;
        }
    };

    let started = report
        .step("start barbican-kms-plugin", async {
            let key = new_key(&barbican, "kek-suite-walk-1").await?;
            write_conf(&conf_path, &cloud_conf, &key)?;
            let socket = dir.path().join("kms.sock");
            let log = std::fs::File::create(logs.file("barbican-kms-plugin.log"))?;
            let child = Command::new(binary)
                .arg("--socketpath")
                .arg(&socket)
                .arg("--cloud-config")
                .arg(&conf_path)
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()?;
            let plugin = Plugin { child, socket };
            csi_sanity::harness::wait_for_socket(&plugin.socket).await?;
            let ch = plugin_runtime::connect_unix(&plugin.socket).await?;
            let d = format!(
                "pid {}, socket {}; key-encryption key: Barbican secret {} (created for the walk)",
                plugin.child.id(),
                plugin.socket.display(),
                short(&key)
            );
            Ok(((plugin, KeyManagementServiceClient::new(ch), key), d))
        })
        .await;
    let Some((plugin, mut kms, first_key)) = started else {
        return;
    };

    let status = report
        .step("Status", async {
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                let s = answer("Status", kms.status(StatusRequest {}).await)?;
                if s.healthz == "ok" {
                    ensure(s.version == "v2", || format!("version {}", s.version))?;
                    let d = format!("version v2, healthz ok, key_id {}", s.key_id);
                    return Ok((s.key_id, d));
                }
                ensure(Instant::now() < deadline, || {
                    format!("never healthy: {}", s.healthz)
                })?;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await;
    let Some(first_id) = status else { return };

    let seed = match random_bytes(32) {
        Ok(s) => s,
        Err(e) => {
            report.skip("Encrypt a data-key seed", &e.to_string());
            return;
        }
    };
    let sealed = report
        .step("Encrypt a data-key seed", async {
            let r = encrypt(&mut kms, seed.to_vec(), "walk-1").await?;
            ensure(r.key_id == first_id, || {
                format!("Encrypt says key {}, Status {first_id}", r.key_id)
            })?;
            let d = format!(
                "32-byte seed sealed into {} bytes (AES-256-GCM under the Barbican key)",
                r.ciphertext.len()
            );
            Ok((r, d))
        })
        .await;
    let Some(sealed) = sealed else { return };
    report
        .step("Decrypt it", async {
            let back = Zeroizing::new(decrypt(&mut kms, &sealed, "walk-2").await?);
            ensure(*back == *seed, || "the plaintext differs".into())?;
            Ok(((), "the same 32 bytes".into()))
        })
        .await;
    report
        .step(
            &format!("{LOAD} Encrypt + Decrypt (Barbican calls)"),
            async {
                let before = barbican_calls(emulator);
                for i in 0..LOAD {
                    let uid = format!("load-{i}");
                    let r = encrypt(&mut kms, seed.to_vec(), &uid).await?;
                    let back = Zeroizing::new(decrypt(&mut kms, &r, &uid).await?);
                    ensure(*back == *seed, || format!("call {i}: plaintext differs"))?;
                }
                let after = barbican_calls(emulator);
                ensure(after.1 == before.1, || {
                    format!("{} key fetches during the calls", after.1 - before.1)
                })?;
                Ok((
                    (),
                    format!(
                        "{} calls, {} Barbican requests made by them; {} key fetch in all so far",
                        2 * LOAD,
                        after.0 - before.0,
                        after.1
                    ),
                ))
            },
        )
        .await;

    let rotated = report
        .step("rotate the key (cloud.conf + SIGHUP)", async {
            let key = new_key(&barbican, "kek-suite-walk-2").await?;
            write_conf(&conf_path, &cloud_conf, &key)?;
            let asked = Instant::now();
            nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(i32::try_from(plugin.child.id()).unwrap_or(i32::MAX)),
                nix::sys::signal::Signal::SIGHUP,
            )
            .map_err(std::io::Error::from)?;
            let deadline = asked + Duration::from_secs(30);
            loop {
                let s = answer("Status", kms.status(StatusRequest {}).await)?;
                if s.healthz == "ok" && s.key_id.starts_with(&key) {
                    let d = format!(
                        "Status reports key_id {} after {} ms",
                        s.key_id,
                        asked.elapsed().as_millis()
                    );
                    return Ok((s.key_id, d));
                }
                ensure(Instant::now() < deadline, || {
                    format!("still on key {} ({})", s.key_id, s.healthz)
                })?;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await;
    let Some(new_id) = rotated else { return };
    report
        .step("the old ciphertext still decrypts", async {
            let back = Zeroizing::new(decrypt(&mut kms, &sealed, "walk-3").await?);
            ensure(*back == *seed, || "the plaintext differs".into())?;
            Ok((
                (),
                format!(
                    "sealed under {}, opened after the rotation",
                    short(&first_key)
                ),
            ))
        })
        .await;
    report
        .step("Encrypt uses the new key", async {
            let r = encrypt(&mut kms, seed.to_vec(), "walk-4").await?;
            ensure(r.key_id == new_id, || {
                format!("Encrypt says {}, Status {new_id}", r.key_id)
            })?;
            let (all, fetches) = barbican_calls(emulator);
            ensure(fetches == 2, || format!("{fetches} key fetches for two keys"))?;
            Ok((
                (),
                format!(
                    "key_id {}; Barbican: {fetches} key fetches (one per key), {all} requests in all",
                    r.key_id
                ),
            ))
        })
        .await;
    drop(plugin);
}
