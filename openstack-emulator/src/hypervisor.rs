//! Plays the hypervisor for node-side tests: an attached volume becomes a
//! loop device over a sparse file, linked as `virtio-<id[:20]>` under a
//! by-id directory, the way a KVM guest sees a Cinder volume. The backing
//! file keeps the volume's data across detach and re-attach, and is removed
//! when the volume is deleted.
//!
//! Needs root (loop devices). Everything it creates is removed at shutdown
//! and, after a crash, at the next start.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};

const GIB: u64 = 1 << 30;

#[derive(Debug, thiserror::Error)]
pub enum HypervisorError {
    #[error("{what}: {source}")]
    Io { what: String, source: io::Error },
    #[error("{command} failed: {stderr}")]
    Command { command: String, stderr: String },
}

#[derive(Debug)]
struct Inner {
    by_id_dir: PathBuf,
    /// Further directories linked alike (a guest's /dev/disk/by-id, seen
    /// by node plugins in containers).
    also_linked_in: Vec<PathBuf>,
    image_dir: PathBuf,
    /// volume id → loop device
    attached: Mutex<HashMap<String, PathBuf>>,
}

#[derive(Debug, Clone)]
pub struct Hypervisor {
    inner: Arc<Inner>,
}

/// The by-id name a KVM guest gives a Cinder volume.
pub fn by_id_name(volume_id: &str) -> String {
    let short: String = volume_id.chars().take(20).collect();
    format!("virtio-{short}")
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> HypervisorError {
    let what = what.into();
    move |source| HypervisorError::Io { what, source }
}

fn run(cmd: &str, args: &[&str]) -> Result<String, HypervisorError> {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .map_err(io_err(format!("running {cmd}")))?;
    if !out.status.success() {
        return Err(HypervisorError::Command {
            command: format!("{cmd} {}", args.join(" ")),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

impl Hypervisor {
    pub fn new(by_id_dir: PathBuf, image_dir: PathBuf) -> io::Result<Self> {
        Self::linking_in(by_id_dir, Vec::new(), image_dir)
    }

    /// Links every attached volume in `by_id_dir` and in each of
    /// `also_linked_in`.
    pub fn linking_in(
        by_id_dir: PathBuf,
        also_linked_in: Vec<PathBuf>,
        image_dir: PathBuf,
    ) -> io::Result<Self> {
        std::fs::create_dir_all(&by_id_dir)?;
        for d in &also_linked_in {
            std::fs::create_dir_all(d)?;
        }
        std::fs::create_dir_all(&image_dir)?;
        let image_dir = image_dir.canonicalize()?;
        Ok(Self {
            inner: Arc::new(Inner {
                by_id_dir,
                also_linked_in,
                image_dir,
                attached: Mutex::new(HashMap::new()),
            }),
        })
    }

    pub fn by_id_dir(&self) -> &Path {
        &self.inner.by_id_dir
    }

    fn link_dirs(&self) -> impl Iterator<Item = &PathBuf> {
        std::iter::once(&self.inner.by_id_dir).chain(&self.inner.also_linked_in)
    }

    fn image(&self, volume_id: &str) -> PathBuf {
        // volume ids are UUIDs the emulator made; keep the name safe anyway
        let safe: String = volume_id
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
            .collect();
        self.inner.image_dir.join(format!("{safe}.img"))
    }

    fn attached(&self) -> std::sync::MutexGuard<'_, HashMap<String, PathBuf>> {
        self.inner
            .attached
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Makes the volume visible as a block device; returns the by-id link.
    pub fn attach(&self, volume_id: &str, size_gib: u64) -> Result<PathBuf, HypervisorError> {
        let link = self.inner.by_id_dir.join(by_id_name(volume_id));
        if self.attached().contains_key(volume_id) {
            return Ok(link);
        }
        let image = self.image(volume_id);
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&image)
            .map_err(io_err(format!("creating {}", image.display())))?;
        let want = size_gib * GIB;
        if file.metadata().map(|m| m.len()).unwrap_or(0) < want {
            file.set_len(want)
                .map_err(io_err(format!("sizing {}", image.display())))?;
        }
        drop(file);
        let image_str = image.to_string_lossy().to_string();
        let dev = PathBuf::from(run("losetup", &["--find", "--show", &image_str])?);
        for dir in self.link_dirs() {
            let l = dir.join(by_id_name(volume_id));
            let _ = std::fs::remove_file(&l);
            if let Err(e) = std::os::unix::fs::symlink(&dev, &l) {
                for d in self.link_dirs() {
                    let _ = std::fs::remove_file(d.join(by_id_name(volume_id)));
                }
                let _ = run("losetup", &["-d", &dev.to_string_lossy()]);
                return Err(HypervisorError::Io {
                    what: format!("linking {}", l.display()),
                    source: e,
                });
            }
        }
        tracing::info!(volume = volume_id, device = %dev.display(), link = %link.display(), "attached");
        self.attached().insert(volume_id.to_string(), dev);
        Ok(link)
    }

    /// Removes the block device and its link; the data stays.
    pub fn detach(&self, volume_id: &str) {
        let dev = self.attached().remove(volume_id);
        for dir in self.link_dirs() {
            let _ = std::fs::remove_file(dir.join(by_id_name(volume_id)));
        }
        if let Some(dev) = dev {
            if let Err(e) = run("losetup", &["-d", &dev.to_string_lossy()]) {
                tracing::warn!(volume = volume_id, error = %e, "could not detach loop device");
            }
            tracing::info!(volume = volume_id, device = %dev.display(), "detached");
        }
    }

    /// Grows the backing file and tells the loop device.
    pub fn resize(&self, volume_id: &str, size_gib: u64) -> Result<(), HypervisorError> {
        let image = self.image(volume_id);
        if !image.exists() {
            return Ok(());
        }
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(&image)
            .map_err(io_err(format!("opening {}", image.display())))?;
        file.set_len(size_gib * GIB)
            .map_err(io_err(format!("growing {}", image.display())))?;
        let dev = self.attached().get(volume_id).cloned();
        if let Some(dev) = dev {
            run("losetup", &["-c", &dev.to_string_lossy()])?;
        }
        Ok(())
    }

    /// Copies a volume's data (sparse) to a new image: snapshots keep what
    /// the volume held when taken, and volumes made from a snapshot or a
    /// clone start with their source's data, as Cinder's backends do.
    /// A source that was never attached has no data to copy.
    pub fn copy_data(&self, from: &str, to: &str) -> Result<(), HypervisorError> {
        let src = self.image(from);
        if !src.exists() {
            return Ok(());
        }
        let dst = self.image(to);
        run(
            "cp",
            &[
                "--sparse=always",
                &src.to_string_lossy(),
                &dst.to_string_lossy(),
            ],
        )?;
        Ok(())
    }

    /// Key of a snapshot's data for [`Hypervisor::copy_data`].
    pub fn snapshot_key(snapshot_id: &str) -> String {
        format!("snap-{snapshot_id}")
    }

    /// Drops a snapshot's data.
    pub fn forget_snapshot(&self, snapshot_id: &str) {
        self.forget_data(&Self::snapshot_key(snapshot_id));
    }

    /// Drops the data kept under `key` (a snapshot's, a backup's).
    pub fn forget_data(&self, key: &str) {
        let _ = std::fs::remove_file(self.image(key));
    }

    /// The volume was deleted: drop its device and its data.
    pub fn forget_volume(&self, volume_id: &str) {
        self.detach(volume_id);
        let _ = std::fs::remove_file(self.image(volume_id));
    }

    /// Detaches every loop device backed by our image directory, removes
    /// their links and the backing files. A link to another's loop device
    /// (a second hypervisor linking in the same directory, as the cluster
    /// tier's agent and a bench's emulator do) is left alone.
    pub fn cleanup_all(&self) {
        let ids: Vec<String> = self.attached().keys().cloned().collect();
        for id in ids {
            self.detach(&id);
        }
        // leftovers of a crashed run: loop devices whose backing file lives
        // in our image directory, and the links to them (removed first:
        // once detached, a device's number may be taken by another)
        let backing_of = |device: &str| -> Option<String> {
            let name = device.strip_prefix("/dev/")?;
            let backing = std::fs::read_to_string(
                Path::new("/sys/block").join(name).join("loop/backing_file"),
            )
            .ok()?;
            Some(backing.trim().trim_end_matches(" (deleted)").to_string())
        };
        let ours = |backing: &str| Path::new(backing).starts_with(&self.inner.image_dir);
        for entries in self.link_dirs().filter_map(|d| std::fs::read_dir(d).ok()) {
            for e in entries.flatten() {
                let p = e.path();
                if !e.file_name().to_string_lossy().starts_with("virtio-") {
                    continue;
                }
                let Ok(target) = std::fs::read_link(&p) else {
                    continue;
                };
                let target = target.to_string_lossy().to_string();
                if !target.starts_with("/dev/loop") {
                    continue;
                }
                // ours, or a link to a loop device backed by nothing at
                // all (stale for whoever made it)
                if backing_of(&target).is_none_or(|b| ours(&b)) {
                    let _ = std::fs::remove_file(&p);
                }
            }
        }
        if let Ok(entries) = std::fs::read_dir("/sys/block") {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().to_string();
                if !name.starts_with("loop") {
                    continue;
                }
                if backing_of(&format!("/dev/{name}")).is_some_and(|b| !b.is_empty() && ours(&b)) {
                    let _ = run("losetup", &["-d", &format!("/dev/{name}")]);
                }
            }
        }
        if let Ok(entries) = std::fs::read_dir(&self.inner.image_dir) {
            for e in entries.flatten() {
                if e.file_name().to_string_lossy().ends_with(".img") {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
    }
}
