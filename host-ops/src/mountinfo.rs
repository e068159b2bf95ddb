//! `/proc/self/mountinfo`, the kernel's own account of what is mounted
//! where (unlike `/etc/mtab`, it names the device by major:minor and
//! shows bind mounts with their root inside the source).

use std::path::{Path, PathBuf};

use crate::{Result, io_err};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    pub mount_point: PathBuf,
    /// `(major, minor)` of the mounted device.
    pub device: (u64, u64),
    /// Path inside the source filesystem that is mounted here ("/" for a
    /// whole filesystem; a file's path for a bind-mounted device node).
    pub root: PathBuf,
    pub fs_type: String,
    pub source: String,
    /// Per-mount options (`rw`, `ro`, `nosuid`, ...).
    pub mount_options: Vec<String>,
}

impl MountEntry {
    pub fn read_only(&self) -> bool {
        self.mount_options.iter().any(|o| o == "ro")
    }

    /// The block device this filesystem lives on, by number: mountinfo's
    /// own for most, but btrfs reports an anonymous device (major 0), so
    /// then the device node named as the mount's source.
    pub fn block_device(&self) -> Option<(u64, u64)> {
        if self.device.0 != 0 {
            return Some(self.device);
        }
        use std::os::unix::fs::{FileTypeExt, MetadataExt};
        if !self.source.starts_with("/dev/") {
            return None;
        }
        let m = std::fs::metadata(&self.source).ok()?;
        if !m.file_type().is_block_device() {
            return None;
        }
        let rdev = m.rdev();
        Some((nix::sys::stat::major(rdev), nix::sys::stat::minor(rdev)))
    }
}

/// Undoes the kernel's octal escaping of spaces, tabs, newlines and
/// backslashes in mountinfo fields.
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && bytes[i + 1..i + 4]
                .iter()
                .all(|b| (b'0'..=b'7').contains(b))
        {
            let v = (bytes[i + 1] - b'0') as u32 * 64
                + (bytes[i + 2] - b'0') as u32 * 8
                + (bytes[i + 3] - b'0') as u32;
            out.push(v as u8);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Parses mountinfo text; malformed lines are skipped.
pub fn parse(text: &str) -> Vec<MountEntry> {
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<MountEntry> {
    // id parent major:minor root mount_point options [optional...] - fstype source super_options
    let (left, right) = line.split_once(" - ")?;
    let l: Vec<&str> = left.split(' ').collect();
    if l.len() < 6 {
        return None;
    }
    let (maj, min) = l[2].split_once(':')?;
    let r: Vec<&str> = right.split(' ').collect();
    if r.len() < 2 {
        return None;
    }
    Some(MountEntry {
        mount_point: PathBuf::from(unescape(l[4])),
        device: (maj.parse().ok()?, min.parse().ok()?),
        root: PathBuf::from(unescape(l[3])),
        fs_type: r[0].to_string(),
        source: unescape(r[1]),
        mount_options: l[5].split(',').map(str::to_string).collect(),
    })
}

/// Every mount whose mount point is `path` (bottom first, so the last one
/// is what a lookup of `path` sees).
pub fn mounts_at(path: &Path) -> Result<Vec<MountEntry>> {
    let text = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(io_err("reading", "/proc/self/mountinfo"))?;
    Ok(parse(&text)
        .into_iter()
        .filter(|m| m.mount_point == path)
        .collect())
}

/// Every mount whose mount point lies below `root` (not `root` itself).
pub fn mounts_below(root: &Path) -> Result<Vec<MountEntry>> {
    let text = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(io_err("reading", "/proc/self/mountinfo"))?;
    Ok(parse(&text)
        .into_iter()
        .filter(|m| m.mount_point != root && m.mount_point.starts_with(root))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_lines_with_optional_fields_and_escapes() {
        let text = "\
36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue
100 30 7:3 / /var/lib/kubelet/with\\040space rw,relatime shared:5 - ext4 /dev/loop3 rw
101 30 0:5 /loop3 /var/lib/kubelet/block ro,nosuid - devtmpfs udev rw,size=10k
garbage line
";
        let m = parse(text);
        assert_eq!(m.len(), 3);
        assert_eq!(m[0].device, (98, 0));
        assert_eq!(m[0].root, PathBuf::from("/mnt1"));
        assert_eq!(
            m[1].mount_point,
            PathBuf::from("/var/lib/kubelet/with space")
        );
        assert_eq!(m[1].fs_type, "ext4");
        assert!(!m[1].read_only());
        assert!(m[2].read_only());
        assert_eq!(m[2].root, PathBuf::from("/loop3"));
    }

    #[test]
    fn unescape_leaves_plain_backslashes() {
        assert_eq!(unescape("a\\b"), "a\\b");
        assert_eq!(unescape("a\\134b"), "a\\b");
        assert_eq!(unescape("end\\04"), "end\\04");
    }
}
