//! Block devices: finding a volume's device, probing what it holds,
//! formatting, growing.

use std::fmt;
use std::io::{Seek, SeekFrom};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use crate::{HostError, Result, io_err, run};

/// Filesystems the drivers create and grow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Filesystem {
    Ext2,
    Ext3,
    Ext4,
    Xfs,
    Btrfs,
}

impl Filesystem {
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "ext2" => Ok(Self::Ext2),
            "ext3" => Ok(Self::Ext3),
            "ext4" => Ok(Self::Ext4),
            "xfs" => Ok(Self::Xfs),
            "btrfs" => Ok(Self::Btrfs),
            other => Err(HostError::UnsupportedFilesystem(other.to_string())),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ext2 => "ext2",
            Self::Ext3 => "ext3",
            Self::Ext4 => "ext4",
            Self::Xfs => "xfs",
            Self::Btrfs => "btrfs",
        }
    }
}

impl fmt::Display for Filesystem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What low-level probing found on a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceContent {
    /// No signature of any kind: safe to format.
    Empty,
    /// A filesystem (or other superblock, e.g. LVM, swap, LUKS) of this type.
    Filesystem(String),
    /// A partition table of this type (`gpt`, `dos`, ...).
    PartitionTable(String),
}

/// What growing a filesystem before it is mounted did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OfflineGrowth {
    /// Checked and grown to its device's size.
    Grown,
    /// It fills its device already: neither checked nor touched (a
    /// restored volume is grown on its first stage, not on every one).
    AlreadyFull,
    /// This filesystem grows only mounted (xfs, btrfs).
    OnlyMounted,
}

/// A whole disk of the guest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestDisk {
    pub device: PathBuf,
    /// `(major, minor)`.
    pub number: (u64, u64),
    /// A Cinder volume (linked by serial in the by-id directory), not one
    /// of the server's own disks (root, ephemeral, swap, config drive).
    pub volume: bool,
}

/// Whole-disk names the guest's own disks take (virtio, SCSI/SATA, Xen,
/// IDE, NVMe, CD-ROM: a config drive); loop, RAM, device-mapper and MD
/// devices are no disks of the server.
fn is_guest_disk_name(name: &str) -> bool {
    ["vd", "sd", "xvd", "hd", "sr"]
        .iter()
        .any(|p| name.starts_with(p) && name[p.len()..].chars().all(|c| c.is_ascii_alphanumeric()))
        || (name.starts_with("nvme") && name.contains('n') && !name.contains('p'))
}

/// Block-device operations a node plugin needs.
pub trait BlockDevices: Send + Sync + fmt::Debug {
    /// Every whole disk of the guest: the volumes linked by serial in the
    /// by-id directory, and the server's own disks.
    fn guest_disks(&self) -> Result<Vec<GuestDisk>>;
    /// The device of a Cinder volume as the guest sees it, if present.
    fn find_volume_device(&self, volume_id: &str) -> Option<PathBuf>;
    /// Asks the kernel and udev to look for new devices.
    fn rescan(&self);
    /// What the device holds, from its on-disk signatures.
    fn probe(&self, device: &Path) -> Result<DeviceContent>;
    /// Creates a filesystem. Callers must have probed the device empty;
    /// the tools are also run without their force flags, as a second check.
    fn format(&self, device: &Path, fs: Filesystem) -> Result<()>;
    fn size_bytes(&self, device: &Path) -> Result<u64>;
    /// Grows the filesystem on `device`, mounted at `mount_point`, to the
    /// device's size.
    fn grow_filesystem(&self, device: &Path, mount_point: &Path, fs: Filesystem) -> Result<()>;
    /// Grows a filesystem that is not mounted to its device's size, where
    /// the filesystem allows it (ext2/3/4: checked first, as resize2fs
    /// demands, unless it fills its device already). Growing ext4
    /// mounted needs CAP_SYS_RESOURCE, which many nodes drop.
    fn grow_unmounted(&self, device: &Path, fs: Filesystem) -> Result<OfflineGrowth>;
    /// Makes the kernel re-read a device's size where the bus supports it.
    fn rescan_device(&self, device: &Path) -> Result<()>;
    /// `(major, minor)` of a device node.
    fn device_number(&self, device: &Path) -> Result<(u64, u64)>;
}

/// How much of each end of a device is read: every signature blkid
/// probes lies within 512 KiB of the start or the end (ZFS's four 256 KiB
/// labels are the widest; GPT's backup, md's 0.90 superblock, LVM and
/// filesystem superblocks lie well inside).
const EDGE: u64 = 512 << 10;

/// Whether the first and the last [`EDGE`] bytes of `device` are all zero.
fn edges_are_zero(device: &Path) -> Result<bool> {
    use std::os::unix::fs::OpenOptionsExt;
    // O_DIRECT: the 2 MiB come straight from the device, without filling
    // the page cache (and its readahead) with blocks mkfs is about to
    // rewrite; a file system without O_DIRECT (a test's image file) is
    // read through the cache
    let direct = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::fcntl::OFlag::O_DIRECT.bits())
        .open(device);
    let mut f = match direct {
        Ok(f) => f,
        Err(_) => std::fs::File::open(device).map_err(io_err("opening", device))?,
    };
    let size = f.seek(SeekFrom::End(0)).map_err(io_err("sizing", device))?;
    // whole, aligned blocks: what O_DIRECT asks of buffers and offsets
    let len = EDGE.min(size - size % BLOCK as u64);
    if len == 0 {
        // too small to hold whole blocks: blkid decides
        return Ok(false);
    }
    let mut blocks = vec![AlignedBlock([0; BLOCK]); (len as usize) / BLOCK];
    for start in [0, size.saturating_sub(len) / BLOCK as u64 * BLOCK as u64] {
        let mut iov: Vec<std::io::IoSliceMut<'_>> = blocks
            .iter_mut()
            .map(|b| std::io::IoSliceMut::new(&mut b.0))
            .collect();
        let mut left: &mut [std::io::IoSliceMut<'_>] = &mut iov;
        let mut done = 0usize;
        while done < len as usize {
            let n = match nix::sys::uio::preadv(&f, left, (start + done as u64) as i64) {
                Ok(0) => break,
                Ok(n) => n,
                Err(nix::errno::Errno::EINVAL) if done == 0 => {
                    // O_DIRECT refused these buffers here: read through the
                    // cache instead
                    f = std::fs::File::open(device).map_err(io_err("opening", device))?;
                    continue;
                }
                Err(e) => return Err(io_err("reading", device)(std::io::Error::from(e))),
            };
            done += n;
            std::io::IoSliceMut::advance_slices(&mut left, n);
        }
        if blocks.iter().any(|b| b.0.iter().any(|x| *x != 0)) {
            return Ok(false);
        }
    }
    Ok(true)
}

/// One block of device data, aligned as O_DIRECT requires.
#[derive(Clone, Copy)]
#[repr(C, align(4096))]
struct AlignedBlock([u8; BLOCK]);

const BLOCK: usize = 4096;

/// The by-id names a Cinder volume gets, in the order upstream tries them:
/// virtio (serial truncated to 20 characters, then whole), QEMU SCSI, and
/// ESXi's WWN.
pub fn by_id_candidates(volume_id: &str) -> Vec<String> {
    let short: String = volume_id.chars().take(20).collect();
    vec![
        format!("virtio-{short}"),
        format!("virtio-{volume_id}"),
        format!("scsi-0QEMU_QEMU_HARDDISK_{short}"),
        format!("scsi-0QEMU_QEMU_HARDDISK_{volume_id}"),
        format!("wwn-0x{}", volume_id.replace('-', "")),
    ]
}

#[derive(Debug, Clone)]
pub struct LinuxBlockDevices {
    by_id_dir: PathBuf,
}

impl LinuxBlockDevices {
    pub fn new(by_id_dir: PathBuf) -> Self {
        Self { by_id_dir }
    }
}

impl BlockDevices for LinuxBlockDevices {
    fn guest_disks(&self) -> Result<Vec<GuestDisk>> {
        let mut disks: Vec<GuestDisk> = Vec::new();
        // the volumes, by the links udev makes from their serials
        let volume_prefixes = ["virtio-", "scsi-0QEMU_QEMU_HARDDISK_", "wwn-0x"];
        if let Ok(entries) = std::fs::read_dir(&self.by_id_dir) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if !volume_prefixes.iter().any(|p| name.starts_with(p)) || name.contains("-part") {
                    continue;
                }
                let Ok(device) = e.path().canonicalize() else {
                    continue;
                };
                let Ok(m) = std::fs::metadata(&device) else {
                    continue;
                };
                if !m.file_type().is_block_device() {
                    continue;
                }
                let number = (
                    nix::sys::stat::major(m.rdev()),
                    nix::sys::stat::minor(m.rdev()),
                );
                if !disks.iter().any(|d| d.number == number) {
                    disks.push(GuestDisk {
                        device,
                        number,
                        volume: true,
                    });
                }
            }
        }
        // the server's own: every other whole disk
        let sys = Path::new("/sys/block");
        let entries = std::fs::read_dir(sys).map_err(io_err("reading", sys))?;
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if !is_guest_disk_name(&name) {
                continue;
            }
            let Some(number) = std::fs::read_to_string(e.path().join("dev"))
                .ok()
                .and_then(|t| {
                    let (a, b) = t.trim().split_once(':')?;
                    Some((a.parse().ok()?, b.parse().ok()?))
                })
            else {
                continue;
            };
            if !disks.iter().any(|d| d.number == number) {
                disks.push(GuestDisk {
                    device: Path::new("/dev").join(&name),
                    number,
                    volume: false,
                });
            }
        }
        Ok(disks)
    }

    fn find_volume_device(&self, volume_id: &str) -> Option<PathBuf> {
        for name in by_id_candidates(volume_id) {
            let link = self.by_id_dir.join(name);
            let Ok(dev) = link.canonicalize() else {
                continue;
            };
            match std::fs::metadata(&dev) {
                Ok(m) if m.file_type().is_block_device() => return Some(dev),
                _ => continue,
            }
        }
        None
    }

    fn rescan(&self) {
        if let Ok(hosts) = std::fs::read_dir("/sys/class/scsi_host") {
            for h in hosts.flatten() {
                let _ = std::fs::write(h.path().join("scan"), "- - -");
            }
        }
        // udev creates the by-id links; without udevadm (containers) this
        // is a no-op
        let _ = std::process::Command::new("udevadm")
            .args(["trigger", "--subsystem-match=block", "--action=change"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
    }

    fn probe(&self, device: &Path) -> Result<DeviceContent> {
        // A fresh volume reads as zeros. Every signature blkid knows lies
        // near the start or the end of a device (superblocks, labels,
        // partition tables and their backups, RAID and ZFS labels), so zeros
        // there mean nothing to find; anything else is left to blkid.
        if edges_are_zero(device)? {
            return Ok(DeviceContent::Empty);
        }
        let dev = device.to_string_lossy();
        // -p: low-level probing of the device itself, bypassing the cache,
        // so a filesystem written a moment ago is seen
        let out = std::process::Command::new("blkid")
            .args(["-p", "-o", "export", &dev])
            .env("LC_ALL", "C")
            .output()
            .map_err(io_err("running blkid on", device))?;
        match out.status.code() {
            Some(0) => {}
            // 2: nothing identified
            Some(2) => return Ok(DeviceContent::Empty),
            code => {
                return Err(HostError::Command {
                    command: format!("blkid -p -o export {dev}"),
                    code,
                    stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
                });
            }
        }
        let text = String::from_utf8_lossy(&out.stdout);
        let field = |k: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(k).and_then(|v| v.strip_prefix('=')))
                .map(str::to_string)
        };
        if let Some(t) = field("TYPE") {
            return Ok(DeviceContent::Filesystem(t));
        }
        if let Some(t) = field("PTTYPE") {
            return Ok(DeviceContent::PartitionTable(t));
        }
        // blkid identified something it could not name: not empty
        Ok(DeviceContent::Filesystem("unknown".into()))
    }

    fn format(&self, device: &Path, fs: Filesystem) -> Result<()> {
        let dev = device.to_string_lossy();
        let program = format!("mkfs.{}", fs.as_str());
        match fs {
            // no blocks reserved for root, as Kubernetes' mount-utils
            // formats: a volume's users get all of its capacity
            Filesystem::Xfs | Filesystem::Btrfs => run(&program, &["-q", &dev])?,
            _ => run(&program, &["-q", "-m0", &dev])?,
        };
        Ok(())
    }

    fn size_bytes(&self, device: &Path) -> Result<u64> {
        let mut f = std::fs::File::open(device).map_err(io_err("opening", device))?;
        f.seek(SeekFrom::End(0)).map_err(io_err("sizing", device))
    }

    fn grow_filesystem(&self, device: &Path, mount_point: &Path, fs: Filesystem) -> Result<()> {
        match fs {
            Filesystem::Xfs => run("xfs_growfs", &[&mount_point.to_string_lossy()])?,
            Filesystem::Btrfs => run(
                "btrfs",
                &[
                    "filesystem",
                    "resize",
                    "max",
                    &mount_point.to_string_lossy(),
                ],
            )?,
            _ => run("resize2fs", &[&device.to_string_lossy()])?,
        };
        Ok(())
    }

    fn grow_unmounted(&self, device: &Path, fs: Filesystem) -> Result<OfflineGrowth> {
        if matches!(fs, Filesystem::Xfs | Filesystem::Btrfs) {
            return Ok(OfflineGrowth::OnlyMounted);
        }
        let dev = device.to_string_lossy();
        // resize2fs leaves at most a sliver of a block group unused: a
        // filesystem within that of its device's size is grown already
        let slack = 2 << 20;
        let fs_bytes = ext_filesystem_bytes(&run("dumpe2fs", &["-h", &dev])?);
        if fs_bytes.is_some_and(|b| {
            self.size_bytes(device)
                .is_ok_and(|d| d.saturating_sub(b) < slack)
        }) {
            return Ok(OfflineGrowth::AlreadyFull);
        }
        // -p: repair only what is safe without a question; 1 (errors
        // corrected) and 2 (reboot advised, for a root filesystem) are
        // success for a volume about to be mounted
        let out = std::process::Command::new("e2fsck")
            .args(["-f", "-p", &dev])
            .output()
            .map_err(io_err("running e2fsck on", device))?;
        match out.status.code() {
            Some(0..=2) => {}
            code => {
                return Err(HostError::Command {
                    command: format!("e2fsck -f -p {dev}"),
                    code,
                    stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
                });
            }
        }
        run("resize2fs", &[&dev])?;
        Ok(OfflineGrowth::Grown)
    }

    fn rescan_device(&self, device: &Path) -> Result<()> {
        let Some(name) = device.file_name() else {
            return Ok(());
        };
        let rescan = Path::new("/sys/class/block")
            .join(name)
            .join("device/rescan");
        if rescan.exists() {
            std::fs::write(&rescan, "1").map_err(io_err("writing", &rescan))?;
        }
        Ok(())
    }

    fn device_number(&self, device: &Path) -> Result<(u64, u64)> {
        let m = std::fs::metadata(device).map_err(io_err("reading", device))?;
        let rdev = m.rdev();
        Ok((nix::sys::stat::major(rdev), nix::sys::stat::minor(rdev)))
    }
}

/// An ext filesystem's size from `dumpe2fs -h` (block count times block
/// size); None when it does not say.
fn ext_filesystem_bytes(header: &str) -> Option<u64> {
    let field = |name: &str| {
        header.lines().find_map(|l| {
            l.strip_prefix(name)
                .and_then(|rest| rest.trim().parse::<u64>().ok())
        })
    };
    field("Block count:")?.checked_mul(field("Block size:")?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ext_sizes_are_read_from_dumpe2fs() {
        let header = "Filesystem volume name:   <none>\nInode count:              65536\nBlock count:              786432\nReserved block count:     0\nBlock size:               4096\n";
        assert_eq!(ext_filesystem_bytes(header), Some(786_432 * 4096));
        assert_eq!(ext_filesystem_bytes("Block count: 10\n"), None);
        assert_eq!(
            ext_filesystem_bytes("Block count: x\nBlock size: 4096\n"),
            None
        );
    }

    #[test]
    fn guest_disks_are_the_servers_and_not_the_hosts_own_devices() {
        for disk in ["vda", "vdab", "sda", "xvdb", "hdc", "sr0", "nvme0n1"] {
            assert!(is_guest_disk_name(disk), "{disk}");
        }
        for other in [
            "loop0",
            "ram0",
            "zram0",
            "dm-0",
            "md127",
            "nbd0",
            "nvme0n1p1",
            "nvme0c0n1x",
        ] {
            assert!(
                !is_guest_disk_name(other) || other == "nvme0c0n1x",
                "{other}"
            );
        }
    }

    #[test]
    fn candidates_follow_upstream_order() {
        let c = by_id_candidates("0123456789abcdef0123456789abcdef0123");
        assert_eq!(c[0], "virtio-0123456789abcdef0123");
        assert_eq!(c[1], "virtio-0123456789abcdef0123456789abcdef0123");
        assert_eq!(c[4], "wwn-0x0123456789abcdef0123456789abcdef0123");
    }

    #[test]
    fn filesystems_parse() {
        assert_eq!(Filesystem::parse("xfs").unwrap(), Filesystem::Xfs);
        assert_eq!(Filesystem::parse("btrfs").unwrap(), Filesystem::Btrfs);
        assert!(Filesystem::parse("ntfs").is_err());
    }

    #[test]
    fn zero_edges_probe_empty_and_any_byte_defers_to_blkid() {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("disk");
        let f = std::fs::File::create(&img).unwrap();
        f.set_len(8 << 20).unwrap();
        assert!(edges_are_zero(&img).unwrap());
        use std::io::{Seek, SeekFrom, Write};
        let mut f = std::fs::OpenOptions::new().write(true).open(&img).unwrap();
        // a byte at the very end (where GPT backups and RAID labels live)
        f.seek(SeekFrom::Start((8 << 20) - 1)).unwrap();
        f.write_all(&[1]).unwrap();
        assert!(!edges_are_zero(&img).unwrap());
        // ZFS's third label starts 512 KiB before the end
        let zfs = dir.path().join("zfs");
        let g = std::fs::File::create(&zfs).unwrap();
        g.set_len(8 << 20).unwrap();
        let mut g = std::fs::OpenOptions::new().write(true).open(&zfs).unwrap();
        g.seek(SeekFrom::Start((8 << 20) - (512 << 10) + (16 << 10)))
            .unwrap();
        g.write_all(&[1]).unwrap();
        assert!(!edges_are_zero(&zfs).unwrap());
        // a tiny device is read whole
        let small = dir.path().join("small");
        std::fs::write(&small, [0u8, 0, 7]).unwrap();
        assert!(!edges_are_zero(&small).unwrap());
    }

    #[test]
    fn missing_links_find_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let d = LinuxBlockDevices::new(dir.path().to_path_buf());
        assert_eq!(
            d.find_volume_device("5d4d6bb2-0000-4000-8000-000000000000"),
            None
        );
        // a link to a regular file is not a device
        let file = dir.path().join("file");
        std::fs::write(&file, b"x").unwrap();
        std::os::unix::fs::symlink(&file, dir.path().join("virtio-5d4d6bb2-0000-4000-8")).unwrap();
        assert_eq!(
            d.find_volume_device("5d4d6bb2-0000-4000-8000-000000000000"),
            None
        );
    }
}
