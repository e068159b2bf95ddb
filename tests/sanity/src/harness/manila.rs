//! `manila-csi-plugin` (controller and node in one process) against a
//! backend:
//!
//! - [`ManilaOnEmulator`]: the in-process emulator's Manila, the node's
//!   clients are stand-ins (see [`super::stand_ins`]). Needs root.
//! - [`ManilaOnRealCloud`]: real Keystone + Manila + Ceph + NFS-Ganesha of
//!   `tests/openstack/cloud.py` (profile `file` or `all`): real ceph-fuse
//!   mounts for CephFS; for NFS the stand-in `mount.nfs` that asks the
//!   real server for the export before it binds (no kernel NFS client
//!   here).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::Arc;
use std::time::{Duration, Instant};

use openstack_client::config::{CloudConf, ConfigEnv};
use openstack_client::manila::SharedFileSystems;
use openstack_client::{Session, SessionOptions};
use openstack_emulator::{Emulator, EmulatorConfig};

use super::stand_ins::{HelperCall, NfsServer, StandIns, kill_with_namespace, mounts_seen_by};
use super::{
    HarnessError, metadata_document, mounts_below, serve_metadata, stderr_to,
    wait_for_plugin_socket,
};

#[derive(Debug, Clone)]
pub struct ManilaOptions {
    pub plugin_binary: PathBuf,
    /// `NFS` or `CEPHFS`.
    pub protocol: String,
    /// Extra plugin flags.
    pub extra_args: Vec<String>,
    /// Where the plugin's stderr goes: None discards it.
    pub log_file: Option<PathBuf>,
    /// The plugin's `RUST_LOG`.
    pub log_level: String,
    /// Give the plugin `--cloud-config` (its own credentials, for calls
    /// without secrets).
    pub cloud_conf: bool,
    /// Run the node in a private mount namespace with the stand-in mount
    /// helpers (root only); without it the node mounts nothing.
    pub stand_ins: bool,
    /// An emulator already running (e.g. a Cinder harness's), instead of
    /// one of its own.
    pub emulator: Option<Arc<Emulator>>,
}

impl ManilaOptions {
    pub fn new(plugin_binary: impl Into<PathBuf>, protocol: &str) -> Self {
        Self {
            plugin_binary: plugin_binary.into(),
            protocol: protocol.to_string(),
            extra_args: Vec::new(),
            log_file: None,
            log_level: "info".into(),
            cloud_conf: true,
            stand_ins: true,
            emulator: None,
        }
    }
}

pub struct ManilaOnEmulator {
    pub emulator: Arc<Emulator>,
    pub dir: tempfile::TempDir,
    pub socket: PathBuf,
    /// The plugin's `--path-root`.
    pub kubelet_dir: PathBuf,
    pub state_dir: PathBuf,
    pub cloud_conf: PathBuf,
    pub node_id: String,
    stand_ins: StandIns,
    plugin: Option<Child>,
    options: ManilaOptions,
}

impl std::fmt::Debug for ManilaOnEmulator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ManilaOnEmulator")
            .field("socket", &self.socket)
            .finish()
    }
}

impl ManilaOnEmulator {
    pub async fn start(options: ManilaOptions) -> Result<Self, HarnessError> {
        let dir = tempfile::Builder::new().prefix("manila-csi-").tempdir()?;
        let kubelet_dir = dir.path().join("kubelet");
        std::fs::create_dir_all(&kubelet_dir)?;
        let stand_ins = StandIns::create(dir.path(), NfsServer::Local)?;
        let emulator = match &options.emulator {
            Some(shared) => shared.clone(),
            None => Arc::new(
                Emulator::start(EmulatorConfig {
                    availability_zones: vec!["nova".into(), "zone-b".into()],
                    ..Default::default()
                })
                .await
                .map_err(|e| HarnessError::Emulator(e.to_string()))?,
            ),
        };
        let node_id = emulator
            .control()
            .create_server("admin", "share-node-1", "nova")
            .ok_or_else(|| HarnessError::Emulator("no admin project".into()))?;
        emulator
            .control()
            .set_metadata_instance(Some(node_id.clone()));
        // the plugin's own credentials are the member's, in the project
        // its StorageClass secrets name
        let cloud_conf = dir.path().join("cloud.conf");
        std::fs::write(
            &cloud_conf,
            format!(
                "[Global]\nauth-url = \"{}\"\nusername = \"demo\"\npassword = \"demo-secret\"\n\
                 user-domain-name = \"Default\"\ntenant-name = \"demo\"\ntenant-domain-name = \"Default\"\n\
                 region = \"RegionOne\"\n\n[Metadata]\nsearch-order = metadataService\n",
                emulator.auth_url()
            ),
        )?;
        std::fs::write(
            dir.path().join("metadata-only.conf"),
            "[Metadata]\nsearch-order = metadataService\n",
        )?;
        let socket = dir.path().join("csi/csi.sock");
        let state_dir = dir.path().join("state");
        let mut h = Self {
            emulator,
            socket,
            kubelet_dir,
            state_dir,
            cloud_conf,
            node_id,
            stand_ins,
            plugin: None,
            options,
            dir,
        };
        h.start_plugin().await?;
        Ok(h)
    }

    /// The plugin's flags.
    pub fn plugin_args(&self) -> Vec<String> {
        let mut args = vec![
            format!("--endpoint=unix://{}", self.socket.display()),
            format!("--share-protocol-selector={}", self.options.protocol),
            format!(
                "--drivername={}.manila.csi.openstack.org",
                self.options.protocol.to_lowercase()
            ),
            format!("--metadata-url={}", self.emulator.url()),
            format!("--path-root={}", self.kubelet_dir.display()),
            format!("--state-dir={}", self.state_dir.display()),
            "--cluster-id=sanity".into(),
            "--with-topology".into(),
        ];
        if self.options.cloud_conf {
            args.push(format!("--cloud-config={}", self.cloud_conf.display()));
        } else {
            // no credentials of its own: only [Metadata], for the node
            args.push(format!(
                "--cloud-config={}",
                self.dir.path().join("metadata-only.conf").display()
            ));
        }
        args.extend(self.options.extra_args.iter().cloned());
        args
    }

    async fn start_plugin(&mut self) -> Result<(), HarnessError> {
        let _ = std::fs::remove_file(&self.socket);
        let mut cmd = if self.options.stand_ins {
            self.stand_ins.command(&self.options.plugin_binary)
        } else {
            let mut c = Command::new(&self.options.plugin_binary);
            self.stand_ins.put_first_in_path(&mut c);
            c
        };
        let child = cmd
            .args(self.plugin_args())
            .env("RUST_LOG", &self.options.log_level)
            .stderr(stderr_to(self.options.log_file.as_deref())?)
            .spawn()?;
        let plugin = self.plugin.insert(child);
        wait_for_plugin_socket(plugin, &self.socket).await
    }

    pub fn plugin_pid(&self) -> Option<u32> {
        self.plugin.as_ref().map(Child::id)
    }

    /// A path as the plugin sees it (inside its mount namespace).
    pub fn seen(&self, path: &Path) -> PathBuf {
        match self.plugin_pid() {
            Some(pid) => PathBuf::from(format!("/proc/{pid}/root"))
                .join(path.strip_prefix("/").unwrap_or(path)),
            None => path.to_path_buf(),
        }
    }

    /// What is mounted at `path` in the plugin's namespace.
    pub fn mounts_at(&self, path: &Path) -> Vec<host_ops::MountEntry> {
        let Some(pid) = self.plugin_pid() else {
            return Vec::new();
        };
        let text = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap_or_default();
        host_ops::mountinfo::parse(&text)
            .into_iter()
            .filter(|m| m.mount_point == path)
            .collect()
    }

    /// Every mount below the harness directory in the plugin's namespace.
    pub fn mounts_below_dir(&self) -> Vec<PathBuf> {
        mounts_seen_by(self.plugin_pid(), self.dir.path())
    }

    /// The stand-in helpers' calls so far.
    pub fn helper_calls(&self) -> Vec<HelperCall> {
        self.stand_ins.calls()
    }

    /// The staging and target paths a kubelet would use for `volume_id`
    /// (`pod` tells pods apart).
    pub fn paths(&self, volume_id: &str, pod: &str) -> (PathBuf, PathBuf) {
        (
            self.kubelet_dir.join(format!(
                "plugins/kubernetes.io/csi/pv/{volume_id}/globalmount"
            )),
            self.kubelet_dir.join(format!(
                "pods/{pod}/volumes/kubernetes.io~csi/{volume_id}/mount"
            )),
        )
    }

    /// Manila as the member (whose secrets the calls carry) sees it.
    pub fn member_manila(&self) -> Result<SharedFileSystems, HarnessError> {
        let cloud = |e: openstack_client::config::ConfigError| HarnessError::Cloud(e.to_string());
        let conf = CloudConf::from_texts(
            &[("cloud.conf".into(), self.emulator.cloud_conf())],
            ConfigEnv::default(),
        )
        .map_err(cloud)?;
        let session = Session::new(
            conf.cloud("member").map_err(cloud)?,
            SessionOptions::default(),
        )
        .map_err(|e| HarnessError::Cloud(e.to_string()))?;
        Ok(SharedFileSystems::new(session))
    }

    /// Upstream-style secrets with the emulator's member credentials.
    pub fn member_secrets(&self) -> HashMap<String, String> {
        [
            ("os-authURL", self.emulator.auth_url()),
            ("os-region", "RegionOne".to_string()),
            ("os-userName", "demo".to_string()),
            ("os-password", "demo-secret".to_string()),
            ("os-projectName", "demo".to_string()),
            ("os-domainName", "Default".to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    /// Stops the plugin with SIGTERM (a graceful shutdown) and waits.
    pub fn terminate_plugin(&mut self) -> Option<std::process::ExitStatus> {
        let mut c = self.plugin.take()?;
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(c.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        c.wait().ok()
    }

    /// Starts the plugin again (after [`Self::terminate_plugin`] or a kill).
    pub async fn restart_plugin(&mut self) -> Result<(), HarnessError> {
        self.stop_plugin();
        self.start_plugin().await
    }

    /// Kills the plugin and everything left in its mount namespace.
    fn stop_plugin(&mut self) {
        if let Some(c) = self.plugin.take() {
            kill_with_namespace(c);
        }
    }
}

impl Drop for ManilaOnEmulator {
    fn drop(&mut self) {
        self.stop_plugin();
        // without stand-ins the plugin shared our namespace
        for _ in 0..4 {
            let left = mounts_below(self.dir.path());
            if left.is_empty() {
                break;
            }
            for m in left {
                let _ = nix::mount::umount2(&m, nix::mount::MntFlags::MNT_DETACH);
            }
        }
    }
}

/// `manila-csi-plugin` against the real test cloud (profile `file` or
/// `all`): real Keystone, Manila, Ceph and NFS-Ganesha; real ceph-fuse
/// mounts, and for NFS the stand-in `mount.nfs` of
/// [`NfsServer::Real`] in a mount namespace of the plugin's own. The
/// plugin has no cloud.conf credentials unless asked: calls carry the
/// member's secrets, as upstream's StorageClasses do.
pub struct ManilaOnRealCloud {
    pub dir: tempfile::TempDir,
    pub socket: PathBuf,
    pub kubelet_dir: PathBuf,
    pub state_dir: PathBuf,
    pub cloud_dir: PathBuf,
    pub secrets: HashMap<String, String>,
    args: Vec<String>,
    binary: PathBuf,
    log_file: Option<PathBuf>,
    plugin: Option<Child>,
    metadata: tokio::task::JoinHandle<()>,
    /// NFS only: there is no kernel NFS client here.
    stand_ins: Option<StandIns>,
}

impl std::fmt::Debug for ManilaOnRealCloud {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ManilaOnRealCloud")
            .field("socket", &self.socket)
            .finish()
    }
}

/// `key = "value"` lines of a cloud.conf section, unquoted.
fn conf_values(text: &str) -> HashMap<String, String> {
    text.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().trim_matches('"').to_string()))
        .collect()
}

impl ManilaOnRealCloud {
    /// `cloud_dir` is the test cloud's state directory (`.openstack-cloud`).
    /// With `own_credentials` the plugin also gets the member's cloud.conf
    /// (calls without secrets: ListVolumes, ControllerGetVolume).
    pub async fn start(
        plugin_binary: &Path,
        cloud_dir: &Path,
        protocol: &str,
        own_credentials: bool,
        extra_args: &[String],
        log_file: Option<PathBuf>,
    ) -> Result<Self, HarnessError> {
        let member = conf_values(&std::fs::read_to_string(
            cloud_dir.join("cloud-member.conf"),
        )?);
        let get = |k: &str| member.get(k).cloned().unwrap_or_default();
        let secrets: HashMap<String, String> = [
            ("os-authURL", get("auth-url")),
            ("os-region", get("region")),
            ("os-userName", get("username")),
            ("os-password", get("password")),
            ("os-projectName", get("tenant-name")),
            ("os-domainName", get("user-domain-name")),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        let dir = tempfile::Builder::new()
            .prefix("manila-csi-real-")
            .tempdir()?;
        let kubelet_dir = dir.path().join("kubelet");
        std::fs::create_dir_all(&kubelet_dir)?;
        let (metadata, url) = serve_metadata(metadata_document(
            "00000000-0000-4000-8000-00000000c3f5",
            "nova",
        ))
        .await?;
        let socket = dir.path().join("csi.sock");
        let state_dir = dir.path().join("state");
        let conf = dir.path().join("cloud.conf");
        let own = if own_credentials {
            std::fs::read_to_string(cloud_dir.join("cloud-member.conf"))?
        } else {
            String::new()
        };
        std::fs::write(
            &conf,
            format!("{own}\n[Metadata]\nsearch-order = metadataService\n"),
        )?;
        let mut args = vec![
            format!("--endpoint=unix://{}", socket.display()),
            format!("--share-protocol-selector={protocol}"),
            format!(
                "--drivername={}.manila.csi.openstack.org",
                protocol.to_lowercase()
            ),
            format!("--metadata-url={url}"),
            format!("--path-root={}", kubelet_dir.display()),
            format!("--state-dir={}", state_dir.display()),
            format!("--cloud-config={}", conf.display()),
            "--cluster-id=sanity-real".into(),
        ];
        args.extend(extra_args.iter().cloned());
        let stand_ins = if protocol.eq_ignore_ascii_case("NFS") {
            Some(StandIns::create(dir.path(), NfsServer::Real)?)
        } else {
            None
        };
        let mut h = Self {
            stand_ins,
            dir,
            socket,
            kubelet_dir,
            state_dir,
            cloud_dir: cloud_dir.to_path_buf(),
            secrets,
            args,
            binary: plugin_binary.to_path_buf(),
            log_file,
            plugin: None,
            metadata,
        };
        h.start_plugin().await?;
        Ok(h)
    }

    async fn start_plugin(&mut self) -> Result<(), HarnessError> {
        let _ = std::fs::remove_file(&self.socket);
        let mut cmd = match &self.stand_ins {
            Some(s) => s.command(&self.binary),
            None => Command::new(&self.binary),
        };
        let child = cmd
            .args(&self.args)
            .env("RUST_LOG", "info")
            .stderr(stderr_to(self.log_file.as_deref())?)
            .spawn()?;
        let plugin = self.plugin.insert(child);
        wait_for_plugin_socket(plugin, &self.socket).await
    }

    pub fn plugin_pid(&self) -> Option<u32> {
        self.plugin.as_ref().map(Child::id)
    }

    /// SIGTERM and wait: the plugin's graceful shutdown.
    pub fn terminate_plugin(&mut self) -> Option<std::process::ExitStatus> {
        let mut c = self.plugin.take()?;
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(c.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        c.wait().ok()
    }

    pub async fn restart_plugin(&mut self) -> Result<(), HarnessError> {
        if let Some(c) = self.plugin.take() {
            kill_with_namespace(c);
        }
        self.start_plugin().await
    }

    /// Every mount below the harness directory in the plugin's namespace
    /// (its own with the NFS stand-ins).
    pub fn mounts_below_dir(&self) -> Vec<PathBuf> {
        mounts_seen_by(self.plugin_pid(), self.dir.path())
    }

    /// Manila as the member (whose secrets the calls carry) sees it.
    pub fn member_manila(&self) -> Result<SharedFileSystems, HarnessError> {
        let cloud = |e: openstack_client::config::ConfigError| HarnessError::Cloud(e.to_string());
        let conf = CloudConf::from_texts(
            &[(
                "cloud-member.conf".into(),
                std::fs::read_to_string(self.cloud_dir.join("cloud-member.conf"))?,
            )],
            ConfigEnv::default(),
        )
        .map_err(cloud)?;
        let session = Session::new(conf.cloud("").map_err(cloud)?, SessionOptions::default())
            .map_err(|e| HarnessError::Cloud(e.to_string()))?;
        Ok(SharedFileSystems::new(session))
    }

    /// The stand-in `mount.nfs` calls so far (NFS only).
    pub fn helper_calls(&self) -> Vec<HelperCall> {
        self.stand_ins
            .as_ref()
            .map(StandIns::calls)
            .unwrap_or_default()
    }

    /// The staging and target paths a kubelet would use.
    pub fn paths(&self, volume_id: &str, pod: &str) -> (PathBuf, PathBuf) {
        (
            self.kubelet_dir.join(format!(
                "plugins/kubernetes.io/csi/pv/{volume_id}/globalmount"
            )),
            self.kubelet_dir.join(format!(
                "pods/{pod}/volumes/kubernetes.io~csi/{volume_id}/mount"
            )),
        )
    }
}

impl Drop for ManilaOnRealCloud {
    fn drop(&mut self) {
        if let Some(c) = self.plugin.take() {
            kill_with_namespace(c);
        }
        self.metadata.abort();
        // a ceph-fuse mount whose daemon lives on: end the daemon first
        // (a mount of a stopped cluster would hang its unmount)
        for entry in std::fs::read_dir(self.state_dir.join("volumes"))
            .into_iter()
            .flatten()
            .flatten()
        {
            // (only while that pid is still a ceph-fuse: pids are reused)
            if let Some(pid) = std::fs::read_to_string(entry.path().join("ceph-fuse.pid"))
                .ok()
                .and_then(|p| p.trim().parse::<i32>().ok())
                .filter(|pid| {
                    std::fs::read(format!("/proc/{pid}/cmdline"))
                        .is_ok_and(|c| c.windows(9).any(|w| w == b"ceph-fuse"))
                })
            {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
        let until = Instant::now() + Duration::from_secs(5);
        while Instant::now() < until {
            let left = mounts_below(self.dir.path());
            if left.is_empty() {
                break;
            }
            for m in left {
                let _ = nix::mount::umount2(&m, nix::mount::MntFlags::MNT_DETACH);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// A new share group for shares of `share_type` (by name), available: what
/// an operator makes once for a StorageClass's `groupID`.
pub async fn share_group_for(
    manila: &SharedFileSystems,
    name: &str,
    share_type: &str,
) -> Result<String, HarnessError> {
    let cloud = |e: openstack_client::Error| HarnessError::Cloud(e.to_string());
    let types = manila.list_share_types().await.map_err(cloud)?;
    let t = types
        .iter()
        .find(|t| t.name == share_type)
        .ok_or_else(|| HarnessError::Cloud(format!("no share type {share_type}")))?;
    let g = manila
        .create_share_group(&openstack_client::manila::CreateShareGroup {
            name: name.into(),
            share_types: vec![t.id.clone()],
            ..Default::default()
        })
        .await
        .map_err(cloud)?;
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let now = manila.get_share_group(&g.id).await.map_err(cloud)?;
        match now.status {
            openstack_client::manila::ShareGroupStatus::Available => return Ok(g.id),
            ref s if s.is_error() || Instant::now() > until => {
                return Err(HarnessError::Cloud(format!("share group {} is {s}", g.id)));
            }
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}
