//! Stand-ins for the node's NFS and CephFS clients (this machine has no
//! NFS or CephFS kernel client): the plugin runs in a private mount
//! namespace where `/usr/sbin` carries stand-in `mount.nfs` and
//! `mount.ceph` helpers and `PATH` a stand-in `ceph-fuse`. Each records
//! its exact arguments and bind-mounts a local directory per export, so
//! mount(8) is exercised for real up to the helper, and two publishers of
//! one share see the same files.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};

use super::HarnessError;

const LOCAL_MOUNT_HELPER: &str = r#"#!/bin/bash
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

/// The real test cloud's `mount.nfs`: before it binds the stand-in
/// directory it asks the NFS server (NFS-Ganesha behind Manila) for the
/// export through libnfs, from this machine's own address, so a wrong
/// export path or a client no access rule admits fails the mount as the
/// kernel's would (NFSv4.0: what libnfs speaks).
const REAL_NFS_MOUNT_HELPER: &str = r#"#!/bin/bash
set -eu
src=$1; tgt=$2; shift 2
opts=""
while [ $# -gt 0 ]; do case "$1" in -o) opts=$2; shift 2;; *) shift;; esac; done
server=${src%%:/*}; path=/${src#*:/}
if ! out=$(timeout 30 nfs-ls "nfs://$server$path?version=4" 2>&1 >/dev/null); then
  echo "mount.nfs: access denied by server while mounting $src: $out" >&2; exit 32
fi
echo "nfs|$src|$tgt|$opts" >> "@LOG@"
dir="@EXPORTS@/$(printf %s "$src" | tr -c 'A-Za-z0-9._-' _)"
mkdir -p "$dir"
mount --bind "$dir" "$tgt"
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

/// What stands behind the stand-in `mount.nfs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NfsServer {
    /// Nothing: every export is a local directory (the emulator's tier).
    Local,
    /// A real NFS server asked through libnfs before the bind.
    Real,
}

/// The stand-in helpers of one harness, under its directory.
#[derive(Debug)]
pub struct StandIns {
    helpers: PathBuf,
    log: PathBuf,
}

fn write_script(path: &Path, text: &str) -> Result<(), HarnessError> {
    std::fs::write(path, text)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))?;
    Ok(())
}

impl StandIns {
    pub fn create(dir: &Path, nfs: NfsServer) -> Result<Self, HarnessError> {
        let helpers = dir.join("helpers");
        let exports = dir.join("exports");
        for d in [&helpers, &exports] {
            std::fs::create_dir_all(d)?;
        }
        let log = dir.join("helper-calls.log");
        std::fs::write(&log, "")?;
        let fill = |t: &str| {
            t.replace("@LOG@", &log.to_string_lossy())
                .replace("@EXPORTS@", &exports.to_string_lossy())
        };
        let nfs_helper = match nfs {
            NfsServer::Local => LOCAL_MOUNT_HELPER,
            NfsServer::Real => REAL_NFS_MOUNT_HELPER,
        };
        write_script(&helpers.join("mount.nfs"), &fill(nfs_helper))?;
        write_script(&helpers.join("mount.ceph"), &fill(LOCAL_MOUNT_HELPER))?;
        write_script(&helpers.join("ceph-fuse"), &fill(CEPH_FUSE))?;
        Ok(Self { helpers, log })
    }

    /// `binary` in a private mount namespace whose `/usr/sbin` carries the
    /// helpers (only there; every mount made there dies with it), with
    /// the helpers first in `PATH`.
    pub fn command(&self, binary: &Path) -> Command {
        let mut c = Command::new("unshare");
        c.args(["--mount", "--propagation", "private", "--", "/bin/sh", "-c"])
            .arg(format!(
                "mount -t overlay overlay -o lowerdir={}:/usr/sbin /usr/sbin && exec \"$0\" \"$@\"",
                self.helpers.display()
            ))
            .arg(binary);
        self.put_first_in_path(&mut c);
        c
    }

    pub fn put_first_in_path(&self, c: &mut Command) {
        c.env(
            "PATH",
            format!(
                "{}:{}",
                self.helpers.display(),
                std::env::var("PATH").unwrap_or_default()
            ),
        );
    }

    /// The helpers' calls so far.
    pub fn calls(&self) -> Vec<HelperCall> {
        std::fs::read_to_string(&self.log)
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
}

/// A mount namespace as the kernel names it: the device and inode of
/// its `/proc/<pid>/ns/mnt`.
type NamespaceId = (u64, u64);

fn namespace_of(pid: &str) -> Option<NamespaceId> {
    std::fs::metadata(format!("/proc/{pid}/ns/mnt"))
        .ok()
        .map(|m| (m.dev(), m.ino()))
}

/// Processes whose mount namespace is `ns`.
fn processes_in(ns: NamespaceId) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| namespace_of(&pid.to_string()) == Some(ns))
        .collect()
}

/// Kills `child` and, when it ran in a mount namespace of its own,
/// everything left in that namespace (stand-in daemons).
pub fn kill_with_namespace(child: Child) {
    kill_with_namespace_and(child, || {});
}

/// [`kill_with_namespace`], running `meanwhile` once the child is reaped
/// and before the processes left in its namespace are looked for: where
/// another test's plugin may start.
fn kill_with_namespace_and(mut child: Child, meanwhile: impl FnOnce()) {
    // The open namespace keeps its number to itself until the end: the
    // kernel gives a freed namespace's inode number to the next namespace
    // made, so a number read before the child died could name another
    // test's plugin, started meanwhile, which was then killed (a CI run's
    // "the plugin exited (signal: 9) before opening its socket").
    let held = std::fs::File::open(format!("/proc/{}/ns/mnt", child.id())).ok();
    let ns = held
        .as_ref()
        .and_then(|f| f.metadata().ok())
        .map(|m| (m.dev(), m.ino()));
    let _ = child.kill();
    let _ = child.wait();
    meanwhile();
    if let Some(ns) = ns.filter(|n| Some(*n) != namespace_of("self")) {
        for pid in processes_in(ns) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
    drop(held);
}

/// The mounts below `dir` in the mount namespace of process `pid`.
pub fn mounts_seen_by(pid: Option<u32>, dir: &Path) -> Vec<PathBuf> {
    let Some(pid) = pid else {
        return Vec::new();
    };
    let text = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap_or_default();
    host_ops::mountinfo::parse(&text)
        .into_iter()
        .map(|m| m.mount_point)
        .filter(|p| p.starts_with(dir))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    /// `sleep` in a mount namespace of its own, once it is there.
    fn in_a_namespace_of_its_own() -> Child {
        let child = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sleep", "60"])
            .spawn()
            .expect("unshare starts");
        let deadline = Instant::now() + Duration::from_secs(10);
        while namespace_of(&child.id().to_string()) == namespace_of("self") {
            assert!(Instant::now() < deadline, "unshare made no namespace");
            std::thread::sleep(Duration::from_millis(5));
        }
        child
    }

    #[test]
    fn a_namespace_made_after_the_plugin_died_is_not_taken_for_its_own() {
        if !nix::unistd::Uid::effective().is_root() {
            return;
        }
        // each round: a plugin killed, another test's plugin started in
        // the namespace number the first one freed (the kernel reuses it)
        for _ in 0..5 {
            let mut started = None;
            kill_with_namespace_and(in_a_namespace_of_its_own(), || {
                started = Some(in_a_namespace_of_its_own());
            });
            let Some(mut other) = started else {
                panic!("the other plugin was not started");
            };
            // (a SIGKILL sent is not yet a process dead)
            std::thread::sleep(Duration::from_millis(200));
            let status = other.try_wait().expect("its status");
            let _ = other.kill();
            let _ = other.wait();
            assert_eq!(
                status, None,
                "the plugin started meanwhile was killed with the first one's namespace"
            );
        }
    }
}
