//! `manila-csi-plugin` (controller and node in one process) against a
//! backend:
//!
//! - [`ManilaOnEmulator`]: the in-process emulator's Manila. This machine
//!   has no NFS or CephFS kernel client, so the plugin runs in a private
//!   mount namespace where `/usr/sbin` carries stand-in `mount.nfs` and
//!   `mount.ceph` helpers and `PATH` a stand-in `ceph-fuse`: each records
//!   its exact arguments and bind-mounts a local directory per export, so
//!   mount(8) is exercised for real up to the helper, and two publishers
//!   of one share see the same files. Needs root.
//! - [`ManilaOnRealCloud`]: real Keystone + Manila + Ceph of
//!   `tests/openstack/cloud.py` (profile `file` or `all`), real ceph-fuse
//!   mounts.

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::Arc;
use std::time::{Duration, Instant};

use openstack_emulator::{Emulator, EmulatorConfig};

use super::{
    HarnessError, metadata_document, mounts_below, serve_metadata, stderr_to, wait_for_socket,
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

const MOUNT_HELPER: &str = r#"#!/bin/bash
# stand-in for mount.<type> (this machine has no NFS/CephFS client): records
# its arguments, then binds a local directory standing for the export
set -eu
type=${0##*/mount.}
src=$1; tgt=$2; shift 2
opts=""
while [ $# -gt 0 ]; do case "$1" in -o) opts=$2; shift 2;; *) shift;; esac; done
if [ "$type" = ceph ]; then
  sf=$(echo "$opts" | tr , '\n' | sed -n 's/^secretfile=//p')
  if [ -z "$sf" ] || [ "$(stat -c %a "$sf")" != 600 ] || [ ! -s "$sf" ]; then
    echo "mount.ceph: secretfile missing, empty or not mode 600" >&2; exit 32
  fi
  src_key=$(echo "$src" | sed 's/^\(.*\):\(\/.*\)$/\1:\2/')
else
  src_key=$src
fi
# 127.0.0.9 stands for a server that no longer answers (an export that
# moved away)
case "$src" in 127.0.0.9:*) echo "mount.$type: $src: no route to host" >&2; exit 32;; esac
echo "$type|$src|$tgt|$opts" >> "@LOG@"
dir="@EXPORTS@/$(printf %s "$src_key" | tr -c 'A-Za-z0-9._-' _)"
mkdir -p "$dir"
mount --bind "$dir" "$tgt"
"#;

const CEPH_FUSE: &str = r#"#!/bin/bash
# stand-in for ceph-fuse: checks its keyring is private and not on the
# command line, records its arguments, binds a local directory standing for
# the CephFS path, and leaves a "daemon" that lives as long as its mount
set -eu
conf= id= keyring= root= fs= mnt= opts=
while [ $# -gt 0 ]; do
  case "$1" in
    --conf) conf=$2; shift 2;;
    --id) id=$2; shift 2;;
    --keyring) keyring=$2; shift 2;;
    -r) root=$2; shift 2;;
    --client_fs=*) fs=${1#--client_fs=}; shift;;
    -o) opts=$2; shift 2;;
    -*) echo "ceph-fuse: unknown option $1" >&2; exit 2;;
    *) mnt=$1; shift;;
  esac
done
if [ "$(stat -c %a "$keyring")" != 600 ] || ! grep -q "^\[client\.$id\]" "$keyring" || ! grep -q "key = ." "$keyring"; then
  echo "ceph-fuse: keyring $keyring unusable" >&2; exit 1
fi
mons=$(sed -n 's/^mon_host = //p' "$conf")
pidfile=$(sed -n 's/^pid_file = //p' "$conf")
echo "ceph-fuse|$mons:$root|$mnt|id=$id,fs=$fs,opts=$opts" >> "@LOG@"
dir="@EXPORTS@/$(printf %s "$mons:$root" | tr -c 'A-Za-z0-9._-' _)"
mkdir -p "$dir"
mount --bind "$dir" "$mnt"
setsid bash -c 'while mountpoint -q "$1"; do sleep 0.1; done' _ "$mnt" </dev/null >/dev/null 2>&1 &
echo $! > "$pidfile"
"#;

/// One call of a stand-in helper.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HelperCall {
    /// `nfs`, `ceph` (mount(8) helpers) or `ceph-fuse`.
    pub program: String,
    pub source: String,
    pub target: String,
    pub options: String,
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
    helpers: PathBuf,
    helper_log: PathBuf,
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

fn write_script(path: &Path, text: &str) -> Result<(), HarnessError> {
    std::fs::write(path, text)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))?;
    Ok(())
}

/// Processes whose mount namespace is `ns` (the link text of
/// `/proc/<pid>/ns/mnt`).
fn processes_in(ns: &str) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read_link(format!("/proc/{pid}/ns/mnt"))
                .map(|l| l.to_string_lossy() == ns)
                .unwrap_or(false)
        })
        .collect()
}

impl ManilaOnEmulator {
    pub async fn start(options: ManilaOptions) -> Result<Self, HarnessError> {
        let dir = tempfile::Builder::new().prefix("manila-csi-").tempdir()?;
        let kubelet_dir = dir.path().join("kubelet");
        let helpers = dir.path().join("helpers");
        let exports = dir.path().join("exports");
        for d in [&kubelet_dir, &helpers, &exports] {
            std::fs::create_dir_all(d)?;
        }
        let helper_log = dir.path().join("helper-calls.log");
        std::fs::write(&helper_log, "")?;
        let fill = |t: &str| {
            t.replace("@LOG@", &helper_log.to_string_lossy())
                .replace("@EXPORTS@", &exports.to_string_lossy())
        };
        write_script(&helpers.join("mount.nfs"), &fill(MOUNT_HELPER))?;
        write_script(&helpers.join("mount.ceph"), &fill(MOUNT_HELPER))?;
        write_script(&helpers.join("ceph-fuse"), &fill(CEPH_FUSE))?;
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
            helpers,
            helper_log,
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
            // a private mount namespace: the helpers overlay /usr/sbin only
            // there, and every mount made there dies with it
            let mut c = Command::new("unshare");
            c.args(["--mount", "--propagation", "private", "--", "/bin/sh", "-c"])
                .arg(format!(
                    "mount -t overlay overlay -o lowerdir={}:/usr/sbin /usr/sbin && exec \"$0\" \"$@\"",
                    self.helpers.display()
                ))
                .arg(&self.options.plugin_binary);
            c
        } else {
            Command::new(&self.options.plugin_binary)
        };
        let path = format!(
            "{}:{}",
            self.helpers.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let child = cmd
            .args(self.plugin_args())
            .env("RUST_LOG", &self.options.log_level)
            .env("PATH", path)
            .stderr(stderr_to(self.options.log_file.as_deref())?)
            .spawn()?;
        self.plugin = Some(child);
        wait_for_socket(&self.socket).await
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
        let Some(pid) = self.plugin_pid() else {
            return Vec::new();
        };
        let text = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap_or_default();
        host_ops::mountinfo::parse(&text)
            .into_iter()
            .map(|m| m.mount_point)
            .filter(|p| p.starts_with(self.dir.path()))
            .collect()
    }

    /// The stand-in helpers' calls so far.
    pub fn helper_calls(&self) -> Vec<HelperCall> {
        std::fs::read_to_string(&self.helper_log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| {
                let mut f = l.splitn(4, '|');
                Some(HelperCall {
                    program: f.next()?.to_string(),
                    source: f.next()?.to_string(),
                    target: f.next()?.to_string(),
                    options: f.next()?.to_string(),
                })
            })
            .collect()
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
        if let Some(mut c) = self.plugin.take() {
            let ns = std::fs::read_link(format!("/proc/{}/ns/mnt", c.id()))
                .ok()
                .map(|l| l.to_string_lossy().into_owned());
            let host_ns = std::fs::read_link("/proc/self/ns/mnt")
                .ok()
                .map(|l| l.to_string_lossy().into_owned());
            let _ = c.kill();
            let _ = c.wait();
            if let Some(ns) = ns.filter(|n| Some(n) != host_ns.as_ref()) {
                for pid in processes_in(&ns) {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
            }
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
/// `all`): real Keystone, Manila and Ceph, real ceph-fuse mounts. The
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
        let mut h = Self {
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
        let child = Command::new(&self.binary)
            .args(&self.args)
            .env("RUST_LOG", "info")
            .stderr(stderr_to(self.log_file.as_deref())?)
            .spawn()?;
        self.plugin = Some(child);
        wait_for_socket(&self.socket).await
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
        if let Some(mut c) = self.plugin.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        self.start_plugin().await
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
        if let Some(mut c) = self.plugin.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        self.metadata.abort();
        // a ceph-fuse mount whose daemon lives on: end the daemon first
        // (a mount of a stopped cluster would hang its unmount)
        for entry in std::fs::read_dir(self.state_dir.join("volumes"))
            .into_iter()
            .flatten()
            .flatten()
        {
            if let Some(pid) = std::fs::read_to_string(entry.path().join("ceph-fuse.pid"))
                .ok()
                .and_then(|p| p.trim().parse::<i32>().ok())
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
