//! Where a plugin listens: `unix:///path`, `unix://relative` (upstream
//! reads it as `/relative`) or a plain path.

use std::fmt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::str::FromStr;

use tokio::net::UnixListener;

#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    #[error("endpoint is empty")]
    Empty,
    #[error("endpoint {0:?}: only unix sockets are supported (unix:///path or a path)")]
    UnsupportedScheme(String),
    #[error("refusing to replace {}: it exists and is not a socket", .0.display())]
    NotASocket(PathBuf),
    #[error("refusing to take over {}: a process is serving on it (another instance of this plugin?)", .0.display())]
    InUse(PathBuf),
    #[error("{what} {}: {source}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
}

/// A Unix socket path a plugin serves on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    path: PathBuf,
}

impl Endpoint {
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unix://{}", self.path.display())
    }
}

impl FromStr for Endpoint {
    type Err = EndpointError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        if s.is_empty() {
            return Err(EndpointError::Empty);
        }
        let path = if let Some(rest) = s.strip_prefix("unix://") {
            if rest.is_empty() {
                return Err(EndpointError::Empty);
            }
            // `unix://csi/csi.sock` means `/csi/csi.sock` for the upstream plugins
            if rest.starts_with('/') {
                PathBuf::from(rest)
            } else {
                PathBuf::from(format!("/{rest}"))
            }
        } else if let Some(rest) = s.strip_prefix("unix:") {
            PathBuf::from(rest)
        } else if s.contains("://") {
            return Err(EndpointError::UnsupportedScheme(s.to_string()));
        } else {
            PathBuf::from(s)
        };
        Ok(Self { path })
    }
}

/// Binds the socket with `mode` permissions from the first moment: the
/// parent directory is created if missing, a stale socket is replaced (any
/// other file is left alone and is an error), and the socket is bound under
/// a temporary name, given its mode, then renamed into place.
pub fn bind(endpoint: &Endpoint, mode: u32) -> Result<(UnixListener, SocketFile), EndpointError> {
    let path = endpoint.path();
    let io = |what: &'static str, p: &Path| {
        let p = p.to_path_buf();
        move |source| EndpointError::Io {
            what,
            path: p,
            source,
        }
    };
    let parent = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).map_err(io("cannot create the socket directory", parent))?;
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {
            // a socket something answers on is live: replacing it would
            // cut its clients off from it without a word
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(EndpointError::InUse(path.to_path_buf()));
            }
            std::fs::remove_file(path).map_err(io("cannot remove the stale socket", path))?;
            tracing::info!(socket = %path.display(), "removed a stale socket");
        }
        Ok(_) => return Err(EndpointError::NotASocket(path.to_path_buf())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(EndpointError::Io {
                what: "cannot inspect",
                path: path.to_path_buf(),
                source: e,
            });
        }
    }
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_else(|| "plugin.sock".into());
    let temp = parent.join(format!(".{file_name}.{}.tmp", std::process::id()));
    let _ = std::fs::remove_file(&temp);
    let listener = UnixListener::bind(&temp).map_err(io("cannot bind", &temp))?;
    let result = std::fs::set_permissions(&temp, std::fs::Permissions::from_mode(mode))
        .map_err(io("cannot set the mode of", &temp))
        .and_then(|()| std::fs::symlink_metadata(&temp).map_err(io("cannot inspect", &temp)))
        .and_then(|meta| {
            std::fs::rename(&temp, path)
                .map_err(io("cannot move the socket into place at", path))
                .map(|()| SocketFile {
                    path: path.to_path_buf(),
                    dev: meta.dev(),
                    ino: meta.ino(),
                })
        });
    match result {
        Ok(file) => Ok((listener, file)),
        Err(e) => {
            let _ = std::fs::remove_file(&temp);
            Err(e)
        }
    }
}

/// The socket file a plugin bound: its path and the inode it made there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SocketFile {
    path: PathBuf,
    dev: u64,
    ino: u64,
}

impl SocketFile {
    /// Removes the socket if the path still holds the one this plugin
    /// made. A successor (the next release, or upstream's plugin on a
    /// rollback, under another DaemonSet) replaces a socket it finds at
    /// the path as it starts, while this one still drains: removing the
    /// path then would cut kubelet off from the driver on this node until
    /// the successor restarts.
    pub fn remove_if_ours(&self) {
        match std::fs::symlink_metadata(&self.path) {
            Ok(m) if m.file_type().is_socket() && (m.dev(), m.ino()) == (self.dev, self.ino) => {
                if let Err(e) = std::fs::remove_file(&self.path) {
                    tracing::warn!(socket = %self.path.display(), error = %e, "cannot remove the socket");
                }
            }
            Ok(_) => {
                tracing::info!(socket = %self.path.display(), "the socket at the endpoint is another server's now: left in place");
            }
            Err(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_live_socket_is_refused_a_stale_one_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let e: Endpoint = dir.path().join("p.sock").to_str().unwrap().parse().unwrap();
        let live = bind(&e, 0o600).unwrap();
        assert!(matches!(bind(&e, 0o600), Err(EndpointError::InUse(_))));
        drop(live);
        // nothing listens any more: the leftover file is replaced
        let again = bind(&e, 0o600).unwrap();
        drop(again);
    }

    #[test]
    fn parses_endpoint_forms() {
        let p = |s: &str| s.parse::<Endpoint>().map(|e| e.path().to_path_buf());
        assert_eq!(
            p("unix:///csi/csi.sock").unwrap(),
            PathBuf::from("/csi/csi.sock")
        );
        assert_eq!(
            p("unix://csi/csi.sock").unwrap(),
            PathBuf::from("/csi/csi.sock")
        );
        assert_eq!(
            p("/var/lib/kms/kms.sock").unwrap(),
            PathBuf::from("/var/lib/kms/kms.sock")
        );
        assert_eq!(p("unix:/x.sock").unwrap(), PathBuf::from("/x.sock"));
        assert!(matches!(
            p("tcp://127.0.0.1:10000"),
            Err(EndpointError::UnsupportedScheme(_))
        ));
        assert!(matches!(p(""), Err(EndpointError::Empty)));
        assert!(matches!(p("unix://"), Err(EndpointError::Empty)));
    }
}
