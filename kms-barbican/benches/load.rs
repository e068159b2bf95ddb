//! Load figures for the KMS plugin over its socket (printed; nothing is
//! asserted). Barbican is the emulator's, or the real test cloud's with
//! `OPENSTACK_TEST_BACKEND=real` (`tests/openstack/cloud.py up kms`).
//!
//! `cargo bench -p kms-barbican --bench load` (`BENCH_QUICK=1`: a handful
//! of calls per figure, as the test command runs it)

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use openstack_client::barbican::{CreateSecret, KeyManager};
use openstack_client::config::{CloudConf, ConfigEnv};
use openstack_client::{Session, SessionOptions};
use openstack_emulator::{Emulator, EmulatorConfig};
use proto::kms::v2::key_management_service_client::KeyManagementServiceClient;
use proto::kms::v2::{DecryptRequest, EncryptRequest, EncryptResponse, StatusRequest};
use tonic::transport::Channel;
use zeroize::Zeroizing;

const CONCURRENCY: usize = 16;

/// The calls a figure makes: `n`, or a handful with `BENCH_QUICK` (the
/// bench runs through, its figures mean little).
fn calls(n: usize) -> usize {
    if std::env::var_os("BENCH_QUICK").is_some() {
        n.min(200)
    } else {
        n
    }
}

struct Plugin(Child);

impl Drop for Plugin {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| {
            l.strip_prefix("VmRSS:")
                .map(|v| v.trim().trim_end_matches(" kB").trim().parse().unwrap())
        })
        .unwrap()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// Runs `total` calls of `op` over `CONCURRENCY` workers; returns calls/s
/// and the sorted latencies.
async fn drive<F, Fut>(total: usize, op: F) -> (f64, Vec<Duration>)
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let op = Arc::new(op);
    let started = Instant::now();
    let mut workers = Vec::new();
    for w in 0..CONCURRENCY {
        let op = op.clone();
        workers.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut i = w;
            while i < total {
                let t = Instant::now();
                op(i).await;
                lat.push(t.elapsed());
                i += CONCURRENCY;
            }
            lat
        }));
    }
    let mut all = Vec::with_capacity(total);
    for w in workers {
        all.extend(w.await.unwrap());
    }
    let rate = total as f64 / started.elapsed().as_secs_f64();
    all.sort();
    (rate, all)
}

fn report(name: &str, rate: f64, lat: &[Duration]) {
    println!(
        "{name:<44} {rate:>9.0}/s   p50 {:>7.3} ms   p99 {:>7.3} ms",
        percentile(lat, 0.5).as_secs_f64() * 1e3,
        percentile(lat, 0.99).as_secs_f64() * 1e3
    );
}

#[tokio::main]
async fn main() {
    let (_emu, conf_text, backend) =
        if std::env::var("OPENSTACK_TEST_BACKEND").as_deref() == Ok("real") {
            let dir = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.openstack-cloud"));
            (
                None,
                std::fs::read_to_string(dir.join("cloud-admin.conf"))
                    .expect("run tests/openstack/cloud.py up kms"),
                "real Barbican",
            )
        } else {
            let emu = Emulator::start(EmulatorConfig::default()).await.unwrap();
            let text = emu.cloud_conf();
            (Some(emu), text, "emulated Barbican")
        };
    let conf = CloudConf::from_texts(
        &[(PathBuf::from("c"), conf_text.clone())],
        ConfigEnv::default(),
    )
    .unwrap();
    let barbican =
        KeyManager::new(Session::new(conf.cloud("").unwrap(), SessionOptions::default()).unwrap());
    let mut key = [0u8; 32];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut key).unwrap();
    let secret = barbican
        .create_secret(&CreateSecret {
            name: "bench-kek".into(),
            payload: Some(Zeroizing::new(key.to_vec())),
            secret_type: "symmetric".into(),
            ..Default::default()
        })
        .await
        .unwrap();

    let dir = tempfile::tempdir().unwrap();
    let conf_path = dir.path().join("cloud.conf");
    std::fs::write(
        &conf_path,
        format!("{conf_text}\n[KeyManager]\nkey-id = {secret}\n"),
    )
    .unwrap();
    let socket = dir.path().join("kms.sock");
    let plugin = Plugin(
        Command::new(env!("CARGO_BIN_EXE_barbican-kms-plugin"))
            .arg("--socketpath")
            .arg(&socket)
            .arg("--cloud-config")
            .arg(&conf_path)
            .args(["--log-level", "warn"])
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let channel: Channel = loop {
        if let Ok(c) = plugin_runtime::connect_unix(&socket).await {
            break c;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let mut c = KeyManagementServiceClient::new(channel.clone());
    while c
        .status(StatusRequest {})
        .await
        .unwrap()
        .into_inner()
        .healthz
        != "ok"
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!(
        "KMS plugin against {backend}, concurrency {CONCURRENCY}, one connection (as the apiserver)"
    );
    println!(
        "idle RSS after start: {:.1} MiB",
        rss_kib(plugin.0.id()) as f64 / 1024.0
    );

    let seal = |c: &mut KeyManagementServiceClient<Channel>, i: usize| {
        let mut c = c.clone();
        async move {
            c.encrypt(EncryptRequest {
                plaintext: (i as u32).to_le_bytes().repeat(8),
                uid: format!("e{i}"),
            })
            .await
            .unwrap()
            .into_inner()
        }
    };
    let one: EncryptResponse = seal(&mut c, 0).await;

    // warm-up
    let ch = channel.clone();
    let one_c = one.clone();
    drive(calls(2_000), move |_| {
        let mut c = KeyManagementServiceClient::new(ch.clone());
        let r = DecryptRequest {
            ciphertext: one_c.ciphertext.clone(),
            uid: "w".into(),
            key_id: one_c.key_id.clone(),
            annotations: one_c.annotations.clone(),
        };
        async move {
            c.decrypt(r).await.unwrap();
        }
    })
    .await;

    let ch = channel.clone();
    let (rate, lat) = drive(calls(40_000), move |i| {
        let mut c = KeyManagementServiceClient::new(ch.clone());
        async move {
            c.encrypt(EncryptRequest {
                plaintext: (i as u32).to_le_bytes().repeat(8),
                uid: "e".into(),
            })
            .await
            .unwrap();
        }
    })
    .await;
    report("Encrypt (32-byte seeds)", rate, &lat);

    let ch = channel.clone();
    let one_c = one.clone();
    let (rate, lat) = drive(calls(40_000), move |_| {
        let mut c = KeyManagementServiceClient::new(ch.clone());
        let r = DecryptRequest {
            ciphertext: one_c.ciphertext.clone(),
            uid: "d".into(),
            key_id: one_c.key_id.clone(),
            annotations: one_c.annotations.clone(),
        };
        async move {
            c.decrypt(r).await.unwrap();
        }
    })
    .await;
    report("Decrypt", rate, &lat);

    // an apiserver restart: one Decrypt per distinct stored seed
    let distinct = calls(10_000);
    let mut seeds = Vec::with_capacity(distinct);
    for i in 0..distinct {
        seeds.push(seal(&mut c, i).await);
    }
    let seeds = Arc::new(seeds);
    let ch = channel.clone();
    let s2 = seeds.clone();
    let started = Instant::now();
    let (rate, lat) = drive(calls(10_000), move |i| {
        let mut c = KeyManagementServiceClient::new(ch.clone());
        let e = &s2[i];
        let r = DecryptRequest {
            ciphertext: e.ciphertext.clone(),
            uid: format!("r{i}"),
            key_id: e.key_id.clone(),
            annotations: e.annotations.clone(),
        };
        async move {
            c.decrypt(r).await.unwrap();
        }
    })
    .await;
    println!(
        "{distinct} Decrypts of distinct seeds: {:.3} s",
        started.elapsed().as_secs_f64()
    );
    report("  of which", rate, &lat);
    println!(
        "RSS after the load: {:.1} MiB",
        rss_kib(plugin.0.id()) as f64 / 1024.0
    );

    // the upstream design: one Barbican payload fetch per operation
    let b = barbican.clone();
    let s = secret.clone();
    let (fetch_rate, lat) = drive(calls(2_000), move |_| {
        let (b, s) = (b.clone(), s.clone());
        async move {
            b.get_secret_payload(&s).await.unwrap();
        }
    })
    .await;
    report(
        "Barbican payload fetch (upstream per-op cost)",
        fetch_rate,
        &lat,
    );
    println!(
        "speed-up of Decrypt over fetch-per-operation: {:.0}x",
        rate.max(1.0) / fetch_rate
    );
}
