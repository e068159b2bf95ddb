//! Service endpoints: versioned from the catalog's URL, the unversioned
//! root, and paths joined below an endpoint without walking out of it.

use url::Url;

use crate::error::{Error, Result};
use crate::service::ServiceType;

/// Makes a catalog URL point at the API version this library speaks:
/// catalogs list Cinder as `.../v3/<project>` or unversioned, Barbican
/// unversioned, Manila as `.../v2[/<project>]`.
pub(super) fn versioned_endpoint(
    service: ServiceType,
    mut url: Url,
    project_id: Option<&str>,
) -> Url {
    let segments: Vec<String> = url
        .path_segments()
        .map(|s| s.map(str::to_string).collect())
        .unwrap_or_default();
    let has = |v: &str| segments.iter().any(|s| s == v);
    let mut extra: Vec<String> = Vec::new();
    match service {
        ServiceType::BlockStorage if !has("v3") => {
            extra.push("v3".into());
            extra.extend(project_id.map(str::to_string));
        }
        ServiceType::Compute if !has("v2.1") && !has("v2") => extra.push("v2.1".into()),
        ServiceType::SharedFileSystem if !has("v2") => {
            extra.push("v2".into());
            extra.extend(project_id.map(str::to_string));
        }
        ServiceType::KeyManager if !has("v1") => extra.push("v1".into()),
        ServiceType::Identity if !has("v3") => extra.push("v3".into()),
        _ => {}
    }
    if !extra.is_empty() {
        let path = format!("{}/{}", url.path().trim_end_matches('/'), extra.join("/"));
        url.set_path(&path);
    }
    url
}

/// The unversioned root of a versioned endpoint (`http://h/share/v2/p` →
/// `http://h/share/`), where the version document is served.
pub(crate) fn unversioned_root(url: &Url) -> Url {
    let mut u = url.clone();
    let segs: Vec<&str> = url.path_segments().map(|s| s.collect()).unwrap_or_default();
    let keep: Vec<&str> = segs
        .iter()
        .take_while(|s| {
            !(s.starts_with('v') && s[1..].chars().next().is_some_and(|c| c.is_ascii_digit()))
        })
        .copied()
        .collect();
    let path = if keep.is_empty() {
        "/".to_string()
    } else {
        format!("/{}/", keep.join("/"))
    };
    u.set_path(&path);
    u.set_query(None);
    u
}

/// The URL of `path` below `base`. Every segment of `path` must name
/// something: an empty one (an empty id) or a dot segment, even
/// percent-encoded (`%2E%2E` is `..` to a URL parser), would turn into a
/// step up or a list of everything. And the result stays below `base`.
pub(super) fn join_url(
    operation: &'static str,
    base: &Url,
    path: &str,
    query: &[(String, String)],
) -> Result<Url> {
    let mut u = base.clone();
    let path = path.trim_start_matches('/');
    let joined = if path.is_empty() {
        base.path().to_string()
    } else {
        for segment in path.split('/') {
            let decoded = segment.to_ascii_lowercase().replace("%2e", ".");
            if segment.is_empty() || decoded == "." || decoded == ".." {
                return Err(Error::InvalidId {
                    operation,
                    id: segment.chars().take(64).collect(),
                });
            }
        }
        format!("{}/{}", base.path().trim_end_matches('/'), path)
    };
    u.set_path(&joined);
    if !u.path().starts_with(base.path().trim_end_matches('/')) {
        return Err(Error::InvalidId {
            operation,
            id: path.chars().take(64).collect(),
        });
    }
    if !query.is_empty() {
        let mut pairs = u.query_pairs_mut();
        for (k, v) in query {
            pairs.append_pair(k, v);
        }
    }
    Ok(u)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_versioning() {
        let u = |s: &str| Url::parse(s).unwrap();
        assert_eq!(
            versioned_endpoint(ServiceType::BlockStorage, u("http://h/volume"), Some("p1"))
                .as_str(),
            "http://h/volume/v3/p1"
        );
        assert_eq!(
            versioned_endpoint(
                ServiceType::BlockStorage,
                u("http://h:8776/v3/p1"),
                Some("p1")
            )
            .as_str(),
            "http://h:8776/v3/p1"
        );
        assert_eq!(
            versioned_endpoint(ServiceType::KeyManager, u("http://h:9311"), None).as_str(),
            "http://h:9311/v1"
        );
        assert_eq!(
            versioned_endpoint(ServiceType::Compute, u("http://h/compute/v2.1"), None).as_str(),
            "http://h/compute/v2.1"
        );
        assert_eq!(
            unversioned_root(&u("http://h/share/v2/p1")).as_str(),
            "http://h/share/"
        );
        assert_eq!(
            unversioned_root(&u("http://h:8786/v2")).as_str(),
            "http://h:8786/"
        );
    }

    #[test]
    fn url_join_and_query() {
        let base = Url::parse("http://h/volume/v3/p").unwrap();
        let q = vec![("name".to_string(), "a b&c".to_string())];
        assert_eq!(
            join_url("t", &base, "volumes/detail", &q).unwrap().as_str(),
            "http://h/volume/v3/p/volumes/detail?name=a+b%26c"
        );
        for walking in [
            "types/..",
            "types/%2E%2E",
            "types/.%2e",
            "types/.",
            "types/%2e",
            "types/",
            "types//extra_specs",
        ] {
            assert!(
                matches!(
                    join_url("t", &base, walking, &[]),
                    Err(Error::InvalidId { .. })
                ),
                "{walking}"
            );
        }
    }
}
