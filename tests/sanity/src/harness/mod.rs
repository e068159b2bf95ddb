//! Harnesses that start a driver binary against a backend for the
//! conformance suite and the drivers' own tests: [`cinder`] (the emulator
//! playing the hypervisor with loop devices, or the real test cloud) and
//! [`manila`] (the emulator with stand-in mount helpers, or the real test
//! cloud with its Ceph); [`crash`]: a plugin killed between two cloud calls;
//! [`kube`]: a stand-in apiserver listing PVs and snapshot contents.
//!
//! Dropping a harness stops its plugin and takes down everything mounted
//! below its directory, also when a test panics.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub mod calls;
pub mod cinder;
pub mod crash;
pub mod kube;
pub mod manila;
pub mod stand_ins;

pub use cinder::{CinderOnEmulator, CinderOnRealCloud, HarnessOptions};
pub use manila::{ManilaOnEmulator, ManilaOnRealCloud, ManilaOptions, share_group_for};
pub use stand_ins::{HelperCall, NfsServer};

#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    #[error("emulator: {0}")]
    Emulator(String),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("the plugin never opened {0}")]
    NoSocket(PathBuf),
    #[error("the test cloud's credentials: {0}")]
    Cloud(String),
    /// What a program run by a test printed could not be read.
    #[error("{0}")]
    Output(String),
}

/// Waits (up to 20 s) until the plugin's log file holds `needle` at
/// least `times` times: a test waits on what the plugin did, not on a
/// guess of how long it takes.
pub async fn wait_until_logged(log: &Path, needle: &str, times: usize) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if text.matches(needle).count() >= times {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "{} never logged {needle:?} {times} times:\n{text}",
                log.display()
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The ids `list` answers once one is left (two replicas' race settled,
/// the loser's deletion under way): polled every 50 ms, for at most 5 s;
/// what it answered last.
pub async fn left_once_settled<F, Fut>(mut list: F) -> Vec<String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Vec<String>>,
{
    let mut left = Vec::new();
    for _ in 0..100 {
        left = list().await;
        if left.len() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    left
}

/// Waits (up to 20 s) until the plugin's Probe answers ready.
pub async fn wait_until_ready(socket: &Path) -> Result<(), String> {
    let ch = plugin_runtime::connect_unix(socket)
        .await
        .map_err(|e| e.to_string())?;
    let mut id = proto::csi::v1::identity_client::IdentityClient::new(ch);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let r = id
            .probe(proto::csi::v1::ProbeRequest {})
            .await
            .map_err(|s| s.to_string())?;
        if r.into_inner().ready == Some(true) {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("{} never became ready", socket.display()));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Every mount point at or below `dir`, deepest first.
pub fn mounts_below(dir: &Path) -> Vec<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut v: Vec<PathBuf> = host_ops::mountinfo::parse(&text)
        .into_iter()
        .map(|m| m.mount_point)
        .filter(|p| p.starts_with(dir))
        .collect();
    v.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    v.dedup();
    v
}

/// Answers every HTTP request with `body` (a guest's metadata service).
pub async fn serve_metadata(
    body: String,
) -> Result<(tokio::task::JoinHandle<()>, String), HarnessError> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/", listener.local_addr()?);
    let task = tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let body = body.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                let resp = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = s.write_all(resp.as_bytes()).await;
            });
        }
    });
    Ok((task, url))
}

/// The real test cloud's state directory (`tests/openstack/cloud.py`):
/// `OPENSTACK_TEST_CLOUD_DIR`, else `.openstack-cloud` in the repository.
/// Panics unless `OPENSTACK_TEST_BACKEND=real`: a test of the real cloud
/// never runs against whatever happens to be there by accident.
pub fn real_cloud_dir() -> PathBuf {
    assert_eq!(
        std::env::var("OPENSTACK_TEST_BACKEND").as_deref(),
        Ok("real"),
        "these tests run against the real test cloud: set OPENSTACK_TEST_BACKEND=real"
    );
    std::env::var_os("OPENSTACK_TEST_CLOUD_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../.openstack-cloud"
            ))
        })
}

/// The real test cloud's fault proxy (`cloud.py up` starts it in front
/// of every service; `cloud-<user>-via-proxy.conf` reaches the services
/// through it).
pub fn real_cloud_fault_proxy() -> Result<openstack_emulator::proxy::ProxyControl, HarnessError> {
    let file = real_cloud_dir().join("fault-proxy");
    let text = std::fs::read_to_string(&file)?;
    let admin = text
        .trim()
        .parse()
        .map_err(|e| HarnessError::Cloud(format!("{}: {e}", file.display())))?;
    Ok(openstack_emulator::proxy::ProxyControl { admin })
}

/// An outage of a service of the real test cloud: `cloud.py outage stop
/// SERVICE` (its API stopped) or `start` (started again as it was).
pub async fn real_cloud_outage(action: &str, service: &str) -> Result<(), HarnessError> {
    let script = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../openstack/cloud.py"
    ));
    let out = tokio::process::Command::new("python3")
        .arg(script)
        .args(["outage", action, service])
        .env("OS_TEST_CLOUD_DIR", real_cloud_dir())
        .output()
        .await?;
    if !out.status.success() {
        return Err(HarnessError::Cloud(format!(
            "cloud.py outage {action} {service}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

/// A name of the real cloud no other test run uses:
/// `csi-real-<what>-<pid>-<nanoseconds>`.
pub fn unique_name(what: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    format!("csi-real-{what}-{}-{nanos}", std::process::id())
}

/// Where a test writes a plugin's log `name`: below `TEST_LOG_DIR` when
/// set (scripts/test.sh points it into its work directory, removed with
/// it, kept in target/test-logs after a failed run), else the temporary
/// directory.
pub fn test_log(name: &str) -> PathBuf {
    match std::env::var_os("TEST_LOG_DIR") {
        Some(d) => {
            let d = PathBuf::from(d);
            let _ = std::fs::create_dir_all(&d);
            d.join(name)
        }
        None => std::env::temp_dir().join(name),
    }
}

/// Where a plugin's stderr goes: appended to `log`, else discarded.
pub fn stderr_to(log: Option<&Path>) -> Result<std::process::Stdio, HarnessError> {
    Ok(match log {
        Some(p) => std::process::Stdio::from(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)?,
        ),
        None => std::process::Stdio::null(),
    })
}

/// Waits (up to 20 s) for `plugin` to open its socket; fails at once,
/// with its exit status, when it exits first (its log says why).
pub async fn wait_for_plugin_socket(
    plugin: &mut std::process::Child,
    socket: &Path,
) -> Result<(), HarnessError> {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !socket.exists() {
        if let Some(status) = plugin.try_wait()? {
            return Err(HarnessError::Emulator(format!(
                "the plugin exited ({status}) before opening {}",
                socket.display()
            )));
        }
        if Instant::now() > deadline {
            return Err(HarnessError::NoSocket(socket.to_path_buf()));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// Waits (up to 20 s) for a plugin to open its socket.
pub async fn wait_for_socket(socket: &Path) -> Result<(), HarnessError> {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !socket.exists() {
        if Instant::now() > deadline {
            return Err(HarnessError::NoSocket(socket.to_path_buf()));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// The JSON a guest's metadata service answers for `instance`.
pub fn metadata_document(instance: &str, zone: &str) -> String {
    format!(
        r#"{{"uuid": "{instance}", "name": "test-node", "availability_zone": "{zone}", "devices": []}}"#
    )
}

/// Writes `name` into `dir` the way kubelet's atomic writer updates a
/// mounted Secret: the content goes into a new timestamped directory, and
/// the `..data` symlink is swapped to it in one rename (`dir/name` is a
/// symlink to `..data/name`).
pub fn swap_secret_file(dir: &Path, name: &str, text: &str) -> Result<(), HarnessError> {
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let version = format!("..{}_{seq}", std::process::id());
    let target = dir.join(&version);
    std::fs::create_dir_all(&target)?;
    std::fs::write(target.join(name), text)?;
    let tmp = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(&version, &tmp)?;
    let old = std::fs::read_link(dir.join("..data")).ok();
    std::fs::rename(&tmp, dir.join("..data"))?;
    if let Some(old) = old {
        let _ = std::fs::remove_dir_all(dir.join(old));
    }
    Ok(())
}

/// The directory holding the plugin binaries under test: the one named by
/// `CSI_SANITY_PLUGIN_DIR` when set (`scripts/test.sh` sets it to the
/// build it has just made; or an older release, to show what the suite
/// finds in it), else this workspace's `target/<profile>`, brought up to
/// date the way `cargo test --workspace` builds it: one feature set for
/// every step, so a test never compiles the plugins a second time nor runs
/// a stale one.
pub fn workspace_binaries() -> Result<PathBuf, HarnessError> {
    if let Some(dir) = std::env::var_os("CSI_SANITY_PLUGIN_DIR") {
        return Ok(PathBuf::from(dir));
    }
    let status = std::process::Command::new(env!("CARGO"))
        .args(["test", "--workspace", "--no-run", "--quiet"])
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
        .stdout(std::process::Stdio::null())
        .status()?;
    if !status.success() {
        return Err(HarnessError::Emulator(
            "building the workspace's binaries failed".into(),
        ));
    }
    // target/<profile>/deps/<test program> → target/<profile>
    let exe = std::env::current_exe()?;
    exe.parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .ok_or_else(|| HarnessError::Io(std::io::Error::other("no target directory")))
}

/// A TCP port free on 127.0.0.1 at the time of asking (for a plugin's
/// `--http-endpoint`). Drawn below the kernel's ephemeral range (32768 and
/// up): a port the kernel hands out is also the next outgoing connection's
/// source port, and a test making many connections (to the emulator, to
/// the plugins) took one between the asking and the plugin's listening
/// (the test command's run of 8fcce4a: the plugin exited, its test met
/// "connection refused").
pub fn free_port() -> Result<u16, HarnessError> {
    const LOW: u32 = 20_000;
    const SPAN: u32 = 12_000;
    static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0)
        ^ std::process::id().wrapping_mul(2_654_435_761);
    for _ in 0..64 {
        let step = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let port = LOW + seed.wrapping_add(step.wrapping_mul(7_919)) % SPAN;
        let port = u16::try_from(port).map_err(std::io::Error::other)?;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    Err(std::io::Error::other("no free port in 20000..32000 after 64 tries").into())
}

/// `GET path` on 127.0.0.1:`port` (waiting up to 20 s for something to
/// listen there): the status code and the body.
pub async fn http_get(port: u16, path: &str) -> Result<(u16, String), HarnessError> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut s = loop {
        match tokio::net::TcpStream::connect(("127.0.0.1", port)).await {
            Ok(s) => break s,
            Err(e) if Instant::now() > deadline => return Err(e.into()),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    };
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await?;
    let mut response = String::new();
    s.read_to_string(&mut response).await?;
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("not an HTTP response: {head:?}")))?;
    Ok((code, body.to_string()))
}

/// The value of one series (`name{labels}`, as the page writes it) in a
/// Prometheus text page.
pub fn metric(page: &str, series: &str) -> Option<f64> {
    page.lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// Scrapes `/metrics` on `port` until every series has its value (for up
/// to 20 s); the last page, or what it said of the series meanwhile.
pub async fn wait_for_metrics(port: u16, want: &[(&str, f64)]) -> Result<String, String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let page = http_get(port, "/metrics")
            .await
            .map(|(_, p)| p)
            .map_err(|e| e.to_string())?;
        if want.iter().all(|(s, v)| metric(&page, s) == Some(*v)) {
            return Ok(page);
        }
        if Instant::now() > deadline {
            let seen: Vec<String> = want
                .iter()
                .map(|(s, _)| format!("{s} = {:?}", metric(&page, s)))
                .collect();
            return Err(format!("never {want:?}: {seen:?}"));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
