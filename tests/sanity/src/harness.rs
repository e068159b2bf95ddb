//! Starts `cinder-csi-plugin` (controller and node in one process) against
//! an in-process OpenStack emulator that plays the hypervisor: attached
//! volumes become real loop devices under a private by-id directory, so
//! staging formats and mounts for real. Needs root.
//!
//! Dropping the harness stops the plugin, unmounts everything below its
//! directory and detaches every loop device, also when a test panics.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use openstack_emulator::{Emulator, EmulatorConfig, HypervisorConfig};

#[derive(Debug, Clone)]
pub struct HarnessOptions {
    pub plugin_binary: PathBuf,
    /// Extra plugin flags.
    pub extra_args: Vec<String>,
    /// Extra cloud.conf text appended after the emulator's.
    pub extra_cloud_conf: String,
    pub availability_zones: Vec<String>,
    /// Where the plugin's stderr goes: None discards it.
    pub log_file: Option<PathBuf>,
    /// Simulate the hypervisor (loop devices for attachments); controller
    /// benchmarks turn it off.
    pub hypervisor: bool,
}

impl HarnessOptions {
    pub fn new(plugin_binary: impl Into<PathBuf>) -> Self {
        Self {
            plugin_binary: plugin_binary.into(),
            extra_args: Vec::new(),
            extra_cloud_conf: String::new(),
            availability_zones: vec!["nova".into(), "zone-b".into()],
            log_file: None,
            hypervisor: true,
        }
    }
}

pub struct CinderOnEmulator {
    pub emulator: Emulator,
    pub dir: tempfile::TempDir,
    pub socket: PathBuf,
    /// The plugin's `--path-root`: staging and target paths go below it.
    pub kubelet_dir: PathBuf,
    pub by_id_dir: PathBuf,
    pub cloud_conf: PathBuf,
    /// The Nova server this "node" is.
    pub node_id: String,
    plugin: Option<Child>,
    options: HarnessOptions,
}

impl std::fmt::Debug for CinderOnEmulator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CinderOnEmulator")
            .field("socket", &self.socket)
            .field("node_id", &self.node_id)
            .finish()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    #[error("emulator: {0}")]
    Emulator(String),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("the plugin never opened {0}")]
    NoSocket(PathBuf),
}

impl CinderOnEmulator {
    pub async fn start(options: HarnessOptions) -> Result<Self, HarnessError> {
        let dir = tempfile::Builder::new().prefix("cinder-csi-").tempdir()?;
        let by_id_dir = dir.path().join("by-id");
        let kubelet_dir = dir.path().join("kubelet");
        std::fs::create_dir_all(&kubelet_dir)?;
        let emulator = Emulator::start(EmulatorConfig {
            availability_zones: options.availability_zones.clone(),
            hypervisor: options.hypervisor.then(|| HypervisorConfig {
                by_id_dir: by_id_dir.clone(),
                image_dir: dir.path().join("images"),
            }),
            ..Default::default()
        })
        .await
        .map_err(|e| HarnessError::Emulator(e.to_string()))?;
        let zone = options
            .availability_zones
            .first()
            .cloned()
            .unwrap_or_else(|| "nova".into());
        let node_id = emulator
            .control()
            .create_server("admin", "node-1", &zone)
            .ok_or_else(|| HarnessError::Emulator("no admin project".into()))?;
        emulator
            .control()
            .set_metadata_instance(Some(node_id.clone()));
        let cloud_conf = dir.path().join("cloud.conf");
        std::fs::write(
            &cloud_conf,
            format!(
                "{}\n[Metadata]\nsearch-order = metadataService\n\n{}",
                emulator.cloud_conf(),
                options.extra_cloud_conf
            ),
        )?;
        let socket = dir.path().join("csi/csi.sock");
        let mut h = Self {
            emulator,
            dir,
            socket,
            kubelet_dir,
            by_id_dir,
            cloud_conf,
            node_id,
            plugin: None,
            options,
        };
        h.start_plugin().await?;
        Ok(h)
    }

    /// The plugin's command line.
    pub fn plugin_args(&self) -> Vec<String> {
        let mut args = vec![
            format!("--endpoint=unix://{}", self.socket.display()),
            format!("--cloud-config={}", self.cloud_conf.display()),
            format!("--by-id-dir={}", self.by_id_dir.display()),
            format!("--metadata-url={}", self.emulator.url()),
            format!("--path-root={}", self.kubelet_dir.display()),
            "--cluster=sanity".into(),
            "--device-wait-secs=5".into(),
        ];
        args.extend(self.options.extra_args.iter().cloned());
        args
    }

    async fn start_plugin(&mut self) -> Result<(), HarnessError> {
        let _ = std::fs::remove_file(&self.socket);
        let stderr = match &self.options.log_file {
            Some(p) => Stdio::from(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(p)?,
            ),
            None => Stdio::null(),
        };
        let child = Command::new(&self.options.plugin_binary)
            .args(self.plugin_args())
            .env("RUST_LOG", "info")
            .stderr(stderr)
            .spawn()?;
        self.plugin = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while !self.socket.exists() {
            if Instant::now() > deadline {
                return Err(HarnessError::NoSocket(self.socket.clone()));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }

    /// The plugin's process id (for memory figures).
    pub fn plugin_pid(&self) -> Option<u32> {
        self.plugin.as_ref().map(Child::id)
    }

    /// Kills the plugin (SIGKILL, as a crash) and starts it again.
    pub async fn restart_plugin(&mut self) -> Result<(), HarnessError> {
        self.stop_plugin();
        self.start_plugin().await
    }

    fn stop_plugin(&mut self) {
        if let Some(mut c) = self.plugin.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The staging and target paths a kubelet would use for `volume_id`.
    pub fn paths(&self, volume_id: &str) -> (PathBuf, PathBuf) {
        (
            self.kubelet_dir.join(format!(
                "plugins/kubernetes.io/csi/pv/{volume_id}/globalmount"
            )),
            self.kubelet_dir.join(format!(
                "pods/pod-1/volumes/kubernetes.io~csi/{volume_id}/mount"
            )),
        )
    }

    /// Secrets selecting no particular cloud.
    pub fn secrets(&self) -> HashMap<String, String> {
        HashMap::new()
    }
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

impl Drop for CinderOnEmulator {
    fn drop(&mut self) {
        self.stop_plugin();
        for _ in 0..4 {
            let left = mounts_below(self.dir.path());
            if left.is_empty() {
                break;
            }
            for m in left {
                let _ = nix::mount::umount2(&m, nix::mount::MntFlags::MNT_DETACH);
            }
        }
        // the emulator's own drop detaches the loop devices
    }
}

/// `cinder-csi-plugin` against the real test cloud of
/// `tests/openstack/cloud.py` (profile `block` or `all`): real Keystone,
/// Cinder and Nova; the cloud's hypervisor agent turns the test server's
/// attachments into loop devices under `<cloud dir>/by-id`. The node's
/// instance metadata (the test server's id and zone) is served here, as a
/// guest's metadata service would.
pub struct CinderOnRealCloud {
    pub dir: tempfile::TempDir,
    pub socket: PathBuf,
    pub kubelet_dir: PathBuf,
    pub node_id: String,
    plugin: Option<Child>,
    metadata: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for CinderOnRealCloud {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CinderOnRealCloud")
            .field("socket", &self.socket)
            .finish()
    }
}

/// Answers every HTTP request with `body` (a guest's metadata service).
async fn serve_metadata(
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

impl CinderOnRealCloud {
    /// `cloud_dir` is the test cloud's state directory (`.openstack-cloud`).
    pub async fn start(
        plugin_binary: &Path,
        cloud_dir: &Path,
        log_file: Option<PathBuf>,
    ) -> Result<Self, HarnessError> {
        let node_id = std::fs::read_to_string(cloud_dir.join("test-server-id"))?
            .trim()
            .to_string();
        let dir = tempfile::Builder::new()
            .prefix("cinder-csi-real-")
            .tempdir()?;
        let kubelet_dir = dir.path().join("kubelet");
        std::fs::create_dir_all(&kubelet_dir)?;
        let body = format!(
            r#"{{"uuid": "{node_id}", "name": "test-server", "availability_zone": "nova", "devices": []}}"#
        );
        let (metadata, url) = serve_metadata(body).await?;
        let conf = dir.path().join("cloud.conf");
        std::fs::write(
            &conf,
            format!(
                "{}\n[Metadata]\nsearch-order = metadataService\n",
                std::fs::read_to_string(cloud_dir.join("cloud-admin.conf"))?
            ),
        )?;
        let socket = dir.path().join("csi.sock");
        let stderr = match &log_file {
            Some(p) => Stdio::from(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(p)?,
            ),
            None => Stdio::null(),
        };
        let child = Command::new(plugin_binary)
            .args([
                format!("--endpoint=unix://{}", socket.display()),
                format!("--cloud-config={}", conf.display()),
                format!("--by-id-dir={}", cloud_dir.join("by-id").display()),
                format!("--metadata-url={url}"),
                format!("--path-root={}", kubelet_dir.display()),
                "--cluster=sanity-real".into(),
            ])
            .env("RUST_LOG", "info")
            .stderr(stderr)
            .spawn()?;
        let h = Self {
            dir,
            socket,
            kubelet_dir,
            node_id,
            plugin: Some(child),
            metadata,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while !h.socket.exists() {
            if Instant::now() > deadline {
                return Err(HarnessError::NoSocket(h.socket.clone()));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(h)
    }
}

impl Drop for CinderOnRealCloud {
    fn drop(&mut self) {
        if let Some(mut c) = self.plugin.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        self.metadata.abort();
        for m in mounts_below(self.dir.path()) {
            let _ = nix::mount::umount2(&m, nix::mount::MntFlags::MNT_DETACH);
        }
    }
}
