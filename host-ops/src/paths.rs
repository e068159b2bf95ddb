//! Paths that come from a CSI request are untrusted: they must be absolute,
//! free of `..`, and inside a root the operator allowed (the kubelet's
//! directory), so a request cannot make the plugin mount over or remove
//! arbitrary host paths.

use std::path::{Component, Path, PathBuf};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("{0:?} is not an absolute path")]
    NotAbsolute(String),
    #[error("{0:?} contains \"..\"")]
    ParentComponent(String),
    #[error("{path:?} is outside the allowed roots {roots:?}")]
    OutsideRoots { path: String, roots: Vec<PathBuf> },
    #[error("{0:?} contains a NUL byte")]
    Nul(String),
}

/// Checks a request path and returns it normalised (no `.` components, no
/// trailing slash).
pub fn validate_host_path(path: &str, roots: &[PathBuf]) -> Result<PathBuf, PathError> {
    if path.contains('\0') {
        return Err(PathError::Nul(path.to_string()));
    }
    let p = Path::new(path);
    if !p.is_absolute() {
        return Err(PathError::NotAbsolute(path.to_string()));
    }
    let mut clean = PathBuf::from("/");
    for c in p.components() {
        match c {
            Component::RootDir | Component::CurDir => {}
            Component::ParentDir => return Err(PathError::ParentComponent(path.to_string())),
            Component::Normal(n) => clean.push(n),
            Component::Prefix(_) => return Err(PathError::NotAbsolute(path.to_string())),
        }
    }
    if !roots.is_empty() && !roots.iter().any(|r| clean.starts_with(r) && clean != *r) {
        return Err(PathError::OutsideRoots {
            path: path.to_string(),
            roots: roots.to_vec(),
        });
    }
    Ok(clean)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roots() -> Vec<PathBuf> {
        vec![PathBuf::from("/var/lib/kubelet")]
    }

    #[test]
    fn accepts_paths_under_a_root() {
        assert_eq!(
            validate_host_path("/var/lib/kubelet/pods/x/./mount/", &roots()).unwrap(),
            PathBuf::from("/var/lib/kubelet/pods/x/mount")
        );
    }

    #[test]
    fn refuses_bad_paths() {
        let r = roots();
        assert!(matches!(
            validate_host_path("pods/x", &r),
            Err(PathError::NotAbsolute(_))
        ));
        assert!(matches!(
            validate_host_path("/var/lib/kubelet/../../etc", &r),
            Err(PathError::ParentComponent(_))
        ));
        assert!(matches!(
            validate_host_path("/etc/passwd", &r),
            Err(PathError::OutsideRoots { .. })
        ));
        // the root itself is not a volume path, and a sibling prefix is not inside
        assert!(matches!(
            validate_host_path("/var/lib/kubelet", &r),
            Err(PathError::OutsideRoots { .. })
        ));
        assert!(matches!(
            validate_host_path("/var/lib/kubelet2/x", &r),
            Err(PathError::OutsideRoots { .. })
        ));
        assert!(matches!(
            validate_host_path("/var/lib/kubelet/\0", &r),
            Err(PathError::Nul(_))
        ));
    }
}
