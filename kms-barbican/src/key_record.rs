//! The plugin's record of the keys it has sealed under: a small root-only
//! file beside its socket, so that a restart after a rotation still
//! decrypts what was written under the keys before it, whatever the flags
//! say. It holds key ids and Barbican secret ids, never key material.
//!
//! The file is written atomically (a new file, synced, renamed over the
//! old one) before the first Encrypt under a key it does not list yet. A
//! file that is not the plugin's own (a link, another owner, writable by
//! group or others), unreadable, or edited by hand (its digest no longer
//! matches its keys) is refused: the plugin then reports unhealthy and
//! never overwrites it, so an operator can see what happened.

use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The largest record read: far more than any key history needs.
const MAX_BYTES: u64 = 1 << 20;
/// The record's format version.
const VERSION: u32 = 1;

#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum KeyRecordError {
    #[error("key record {path}: {why}")]
    Refused { path: String, why: String },
    #[error("key record {path}: cannot write it: {why}")]
    Write { path: String, why: String },
}

/// One key the plugin has sealed under.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordedKey {
    /// The Barbican secret holding the key.
    pub secret: String,
    /// The key id Encrypt returned for it (`<secret>:<fingerprint>`).
    pub key_id: String,
    /// When the plugin first sealed under it (seconds since the epoch).
    pub first_sealed: u64,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RecordFile {
    version: u32,
    keys: Vec<RecordedKey>,
    /// SHA-256 of the keys as written: a hand edit that does not go
    /// through the plugin is noticed.
    digest: String,
}

fn digest(keys: &[RecordedKey]) -> String {
    let canonical = serde_json::to_vec(keys).unwrap_or_default();
    ring::digest::digest(&ring::digest::SHA256, &canonical)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

pub(crate) fn is_uuid(s: &str) -> bool {
    s.len() == 36
        && s.char_indices().all(|(i, c)| {
            if matches!(i, 8 | 13 | 18 | 23) {
                c == '-'
            } else {
                c.is_ascii_hexdigit()
            }
        })
}

/// Where the record lives.
#[derive(Debug, Clone)]
pub struct KeyRecord {
    path: PathBuf,
}

impl KeyRecord {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self { path: path.into() }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn refused(&self, why: impl Into<String>) -> KeyRecordError {
        KeyRecordError::Refused {
            path: self.path.display().to_string(),
            why: why.into(),
        }
    }

    /// The keys recorded; none when there is no record yet.
    pub fn load(&self) -> Result<Vec<RecordedKey>, KeyRecordError> {
        use std::io::Read;
        // opened without following a link, and judged by what was opened
        // (not by a look at the path that a rename could change meanwhile);
        // non-blocking, so that a FIFO put there cannot hang the plugin
        let f = match std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
            .open(&self.path)
        {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) if e.raw_os_error() == Some(nix::libc::ELOOP) => {
                return Err(self.refused("not a regular file (a link)"));
            }
            Err(e) => return Err(self.refused(format!("unreadable: {e}"))),
        };
        let meta = f
            .metadata()
            .map_err(|e| self.refused(format!("unreadable: {e}")))?;
        if !meta.file_type().is_file() {
            return Err(self.refused("not a regular file (a link or a directory)"));
        }
        if meta.uid() != nix::unistd::geteuid().as_raw() {
            return Err(self.refused(format!("owned by uid {}, not by the plugin's", meta.uid())));
        }
        if meta.mode() & 0o022 != 0 {
            return Err(self.refused(format!(
                "mode {:o}: group or others may write it",
                meta.mode() & 0o777
            )));
        }
        if meta.len() > MAX_BYTES {
            return Err(self.refused(format!("{} bytes, more than a record holds", meta.len())));
        }
        let mut text = Vec::new();
        f.take(MAX_BYTES + 1)
            .read_to_end(&mut text)
            .map_err(|e| self.refused(format!("unreadable: {e}")))?;
        if text.len() as u64 > MAX_BYTES {
            return Err(self.refused("it grew past what a record holds while it was read"));
        }
        let file: RecordFile = serde_json::from_slice(&text)
            .map_err(|e| self.refused(format!("not a key record: {e}")))?;
        if file.version != VERSION {
            return Err(self.refused(format!("format version {} is unknown", file.version)));
        }
        if file.digest != digest(&file.keys) {
            return Err(self.refused(
                "its digest does not match its keys: edited by hand? (retire keys with [KeyManager] retired-key-ids)",
            ));
        }
        let mut seen = std::collections::BTreeSet::new();
        for k in &file.keys {
            let well_formed = is_uuid(&k.secret)
                && k.key_id
                    .strip_prefix(k.secret.as_str())
                    .and_then(|rest| rest.strip_prefix(':'))
                    .is_some_and(|fp| fp.len() == 16 && fp.bytes().all(|b| b.is_ascii_hexdigit()));
            if !well_formed {
                return Err(self.refused(format!("key {:?} is malformed", k.key_id)));
            }
            if !seen.insert(k.key_id.as_str()) {
                return Err(self.refused(format!("key {} is listed twice", k.key_id)));
            }
        }
        Ok(file.keys)
    }

    /// Where the plugin's record does not exist yet, the keys of the
    /// record at `legacy` (checked as its own is), written to its own:
    /// what a plugin recorded before records were named after their
    /// socket. Answers how many keys were taken over.
    pub fn adopt(&self, legacy: &Path) -> Result<usize, KeyRecordError> {
        if std::fs::symlink_metadata(&self.path).is_ok() {
            return Ok(0);
        }
        let keys = KeyRecord::new(legacy).load()?;
        if keys.is_empty() {
            return Ok(0);
        }
        self.save(&keys)?;
        Ok(keys.len())
    }

    /// Replaces the record with `keys`: a new root-only file, synced, then
    /// renamed over the old one (and the directory synced), so that a
    /// crash leaves the old record or the new one, never a torn one.
    pub fn save(&self, keys: &[RecordedKey]) -> Result<(), KeyRecordError> {
        let fail = |why: String| KeyRecordError::Write {
            path: self.path.display().to_string(),
            why,
        };
        let file = RecordFile {
            version: VERSION,
            keys: keys.to_vec(),
            digest: digest(keys),
        };
        let text = serde_json::to_vec_pretty(&file).map_err(|e| fail(e.to_string()))?;
        let dir = self
            .path
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        // a name of this process's own: two plugins sharing the directory
        // (a KMS migration) never write through one temporary file
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let tmp = dir.join(format!(
            ".{}.{}-{nanos}.tmp",
            self.path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            std::process::id()
        ));
        let written = (|| {
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(nix::libc::O_NOFOLLOW)
                .open(&tmp)
                .map_err(|e| format!("creating {}: {e}", tmp.display()))?;
            // a umask cannot widen 0600, but an inherited ACL default might
            f.set_permissions(std::fs::Permissions::from_mode(0o600))
                .map_err(|e| e.to_string())?;
            f.write_all(&text)
                .and_then(|()| f.sync_all())
                .map_err(|e| e.to_string())?;
            drop(f);
            std::fs::rename(&tmp, &self.path).map_err(|e| e.to_string())
        })();
        if let Err(why) = written {
            let _ = std::fs::remove_file(&tmp);
            return Err(fail(why));
        }
        // the rename is durable only once the directory is: until then a
        // crash may bring the old record back, so a failure here is one
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| fail(format!("syncing {}: {e}", dir.display())))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u8) -> RecordedKey {
        let secret = format!("{n:08x}-1111-4111-8111-111111111111");
        RecordedKey {
            key_id: format!("{secret}:00112233445566{n:02x}"),
            secret,
            first_sealed: 1_700_000_000 + u64::from(n),
        }
    }

    #[test]
    fn a_record_round_trips_root_only_and_refuses_what_is_not_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let r = KeyRecord::new(dir.path().join("keys.json"));
        assert_eq!(r.load().unwrap(), Vec::new(), "no record yet: no keys");
        r.save(&[key(1), key(2)]).unwrap();
        assert_eq!(r.load().unwrap(), vec![key(1), key(2)]);
        let mode = std::fs::metadata(r.path()).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let text = std::fs::read_to_string(r.path()).unwrap();
        assert!(!text.contains("payload") && text.contains(&key(1).key_id));

        // a hand edit: a key added without the digest
        let edited = text.replace(&key(2).secret, &key(3).secret);
        std::fs::write(r.path(), &edited).unwrap();
        let e = r.load().unwrap_err().to_string();
        assert!(e.contains("digest"), "{e}");

        // writable by others
        r.save(&[key(1)]).unwrap();
        std::fs::set_permissions(r.path(), std::fs::Permissions::from_mode(0o666)).unwrap();
        let e = r.load().unwrap_err().to_string();
        assert!(e.contains("group or others"), "{e}");

        // a link, even to a good record
        std::fs::set_permissions(r.path(), std::fs::Permissions::from_mode(0o600)).unwrap();
        let link = KeyRecord::new(dir.path().join("link.json"));
        std::os::unix::fs::symlink(r.path(), link.path()).unwrap();
        assert!(
            link.load()
                .unwrap_err()
                .to_string()
                .contains("regular file")
        );

        // not JSON at all, and a malformed key id with a matching digest
        std::fs::write(r.path(), b"garbage").unwrap();
        assert!(
            r.load()
                .unwrap_err()
                .to_string()
                .contains("not a key record")
        );
        let mut bad = key(4);
        bad.key_id = format!("{}:zz", bad.secret);
        let file = RecordFile {
            version: VERSION,
            digest: digest(std::slice::from_ref(&bad)),
            keys: vec![bad],
        };
        std::fs::write(r.path(), serde_json::to_vec(&file).unwrap()).unwrap();
        assert!(r.load().unwrap_err().to_string().contains("malformed"));
    }
}
