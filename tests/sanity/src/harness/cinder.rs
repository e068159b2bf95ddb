//! `cinder-csi-plugin` (controller and node in one process) against an
//! in-process OpenStack emulator that plays the hypervisor: attached
//! volumes become real loop devices under a private by-id directory, so
//! staging formats and mounts for real. Needs root.
//!
//! Dropping the harness stops the plugin, unmounts everything below its
//! directory and detaches every loop device, also when a test panics.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::Arc;

use openstack_emulator::{Emulator, EmulatorConfig, HypervisorConfig};

use super::{
    HarnessError, metadata_document, mounts_below, serve_metadata, stderr_to,
    wait_for_plugin_socket,
};

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
    /// Nova's `[compute] max_disk_devices_to_attach` for the node's server
    /// (the root disk included); None: unlimited, Nova's default.
    pub nova_max_disk_devices: Option<i64>,
    /// The plugin's credentials and its node's project: the admin's when
    /// true; by default a member of project `demo`, as production runs
    /// (an application credential has a member's rights: Nova answers 404
    /// for another project's servers, Cinder's pools are hidden).
    pub admin: bool,
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
            nova_max_disk_devices: None,
            admin: false,
        }
    }
}

pub struct CinderOnEmulator {
    /// Shared, so that other plugins can be started against the same
    /// cloud (see [`super::ManilaOptions::emulator`]).
    pub emulator: Arc<Emulator>,
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
                also_link_in: Vec::new(),
                image_dir: dir.path().join("images"),
            }),
            ..Default::default()
        })
        .await
        .map_err(|e| HarnessError::Emulator(e.to_string()))?;
        let emulator = Arc::new(emulator);
        let zone = options
            .availability_zones
            .first()
            .cloned()
            .unwrap_or_else(|| "nova".into());
        // the server the node plugin runs on is this machine: as many
        // disks of its own as it has (the plugin counts them against the
        // attach limit, the controller through Nova)
        let own_disks = own_disks_of_this_machine();
        let project = if options.admin { "admin" } else { "demo" };
        let node_id = emulator
            .control()
            .create_server_with_disks(project, "node-1", &zone, own_disks)
            .ok_or_else(|| HarnessError::Emulator(format!("no project {project}")))?;
        emulator
            .control()
            .set_metadata_instance(Some(node_id.clone()));
        if let Some(max) = options.nova_max_disk_devices {
            emulator.control().set_max_disk_devices(max);
        }
        // mounted as kubelet mounts a Secret: a symlink into a directory
        // that an update replaces (see `update_cloud_conf`)
        let secret_dir = dir.path().join("cloud-config");
        std::fs::create_dir_all(&secret_dir)?;
        let cloud_conf = secret_dir.join("cloud.conf");
        std::os::unix::fs::symlink("..data/cloud.conf", &cloud_conf)?;
        super::swap_secret_file(
            &secret_dir,
            "cloud.conf",
            &format!(
                "{}\n[Metadata]\nsearch-order = metadataService\n\n{}",
                if options.admin {
                    emulator.cloud_conf()
                } else {
                    emulator.member_cloud_conf()
                },
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

    /// The project the plugin's credentials and its node's server are in
    /// (`demo`, or `admin` with [`HarnessOptions::admin`]): other nodes'
    /// servers go there too.
    pub fn project(&self) -> &'static str {
        if self.options.admin { "admin" } else { "demo" }
    }

    /// The plugin's cloud.conf as it reads now.
    pub fn cloud_conf_text(&self) -> Result<String, HarnessError> {
        Ok(std::fs::read_to_string(&self.cloud_conf)?)
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
        let child = Command::new(&self.options.plugin_binary)
            .args(self.plugin_args())
            .env("RUST_LOG", "info")
            .stderr(stderr_to(self.options.log_file.as_deref())?)
            .spawn()?;
        let plugin = self.plugin.insert(child);
        wait_for_plugin_socket(plugin, &self.socket).await
    }

    /// Rewrites the plugin's cloud.conf as kubelet updates a mounted
    /// Secret: a new directory, and the `..data` symlink swapped to it.
    pub fn update_cloud_conf(&self, text: &str) -> Result<(), HarnessError> {
        let dir = self
            .cloud_conf
            .parent()
            .ok_or_else(|| HarnessError::Emulator("cloud.conf has no directory".into()))?;
        super::swap_secret_file(dir, "cloud.conf", text)
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
    secret_dir: PathBuf,
    conf_tail: String,
    /// Nova enforces the node's attach limit (the cloud records its disk
    /// limit).
    pub attach_limit_enforced: bool,
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

impl CinderOnRealCloud {
    /// `cloud_dir` is the test cloud's state directory (`.openstack-cloud`).
    pub async fn start(
        plugin_binary: &Path,
        cloud_dir: &Path,
        log_file: Option<PathBuf>,
    ) -> Result<Self, HarnessError> {
        let global = std::fs::read_to_string(cloud_dir.join("cloud-member.conf"))?;
        Self::start_with_credentials(plugin_binary, cloud_dir, &global, log_file).await
    }

    /// With `global` (a `[Global]` section) as the plugin's credentials.
    pub async fn start_with_credentials(
        plugin_binary: &Path,
        cloud_dir: &Path,
        global: &str,
        log_file: Option<PathBuf>,
    ) -> Result<Self, HarnessError> {
        Self::start_with(plugin_binary, cloud_dir, global, &[], log_file).await
    }

    /// With `global` as its credentials and `extra_args` on its command line.
    pub async fn start_with(
        plugin_binary: &Path,
        cloud_dir: &Path,
        global: &str,
        extra_args: &[&str],
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
        let zone = std::fs::read_to_string(cloud_dir.join("test-server-zone"))?
            .trim()
            .to_string();
        let (metadata, url) = serve_metadata(metadata_document(&node_id, &zone)).await?;
        // the server takes as many disks as Nova lets it (its root
        // included): the controller and the node count them alike
        let attach_limit = std::fs::read_to_string(cloud_dir.join("max-disk-devices"))
            .ok()
            .and_then(|t| t.trim().parse::<u32>().ok())
            .map(|max| format!("[BlockStorage]\nnode-volume-attach-limit = {max}\n"))
            .unwrap_or_default();
        let conf_tail = format!("\n[Metadata]\nsearch-order = metadataService\n\n{attach_limit}");
        // mounted as kubelet mounts a Secret (see `update_credentials`)
        let secret_dir = dir.path().join("cloud-config");
        std::fs::create_dir_all(&secret_dir)?;
        let conf = secret_dir.join("cloud.conf");
        std::os::unix::fs::symlink("..data/cloud.conf", &conf)?;
        super::swap_secret_file(&secret_dir, "cloud.conf", &format!("{global}{conf_tail}"))?;
        let socket = dir.path().join("csi.sock");
        let child = Command::new(plugin_binary)
            .args([
                format!("--endpoint=unix://{}", socket.display()),
                format!("--cloud-config={}", conf.display()),
                format!("--by-id-dir={}", cloud_dir.join("by-id").display()),
                format!("--metadata-url={url}"),
                format!("--path-root={}", kubelet_dir.display()),
                "--cluster=sanity-real".into(),
            ])
            .args(extra_args)
            .env("RUST_LOG", "info")
            .stderr(stderr_to(log_file.as_deref())?)
            .spawn()?;
        let mut h = Self {
            attach_limit_enforced: !attach_limit.is_empty(),
            secret_dir,
            conf_tail,
            dir,
            socket,
            kubelet_dir,
            node_id,
            plugin: Some(child),
            metadata,
        };
        if let Some(plugin) = h.plugin.as_mut() {
            wait_for_plugin_socket(plugin, &h.socket).await?;
        }
        Ok(h)
    }
}

impl CinderOnRealCloud {
    /// New `[Global]` credentials, written as kubelet updates a Secret.
    pub fn update_credentials(&self, global: &str) -> Result<(), HarnessError> {
        super::swap_secret_file(
            &self.secret_dir,
            "cloud.conf",
            &format!("{global}{}", self.conf_tail),
        )
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

/// This machine's whole disks that are not volumes (its root and the
/// like), as the node plugin counts them.
pub fn own_disks_of_this_machine() -> u32 {
    let nowhere = std::env::temp_dir().join("no-by-id-links");
    host_ops::BlockDevices::guest_disks(&host_ops::LinuxBlockDevices::new(nowhere))
        .map(|d| d.iter().filter(|d| !d.volume).count() as u32)
        .unwrap_or(1)
}
