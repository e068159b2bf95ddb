//! What a driver asked of the cloud, as the emulator recorded it: each
//! call's shape (ids set aside, the query's keys), and whether a list was
//! narrowed. The crowded-project tests of both drivers compare an
//! operation's calls in an empty project and in one full of resources not
//! the driver's own.

use openstack_emulator::CallRecord;

/// A call's shape: method, the path with ids and numbers set aside, and
/// the query's keys (sorted): the same operation on two resources has one.
pub type CallShape = (String, String, Vec<String>);

pub fn shape(c: &CallRecord) -> CallShape {
    let path = c
        .path
        .split('/')
        .map(|seg| {
            if seg.len() >= 16 || (!seg.is_empty() && seg.chars().all(|ch| ch.is_ascii_digit())) {
                "{id}"
            } else {
                seg
            }
        })
        .collect::<Vec<_>>()
        .join("/");
    let mut keys: Vec<String> = c
        .query
        .split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| kv.split('=').next().unwrap_or_default().to_string())
        .collect();
    keys.sort();
    (c.method.clone(), path, keys)
}

/// A GET of a collection (`…/volumes`, `…/shares/detail`, …), as opposed
/// to one resource.
pub fn is_list(c: &CallRecord, collections: &[&str]) -> bool {
    c.method == "GET"
        && collections.iter().any(|col| {
            c.path.ends_with(&format!("/{col}")) || c.path.ends_with(&format!("/{col}/detail"))
        })
}

/// A list narrowed by a name, a metadata filter, the resource or server
/// it is about, or a page's limit: never a walk of the whole project.
pub fn narrowed(c: &CallRecord) -> bool {
    [
        "name=",
        "metadata=",
        "volume_id=",
        "share_id=",
        "instance_id=",
        "limit=",
    ]
    .iter()
    .any(|k| c.query.split('&').any(|kv| kv.starts_with(k)))
}

/// What each operation of a resource's life asked of the cloud.
pub type AskedByOperation = std::collections::BTreeMap<&'static str, Vec<CallShape>>;

/// Every list among `calls` is narrowed (`narrowed`); `when` names the
/// operation in the failure.
pub fn assert_lists_narrowed(
    calls: &[CallRecord],
    is_list: impl Fn(&CallRecord) -> bool,
    when: &str,
) {
    for l in calls.iter().filter(|c| is_list(c)) {
        assert!(
            narrowed(l),
            "{when}: {} {}?{} lists the project's resources unnarrowed",
            l.method,
            l.path,
            l.query
        );
    }
}

/// Each operation made the same calls among `crowd` resources not the
/// driver's own as in an empty project (the same shapes, as many of each;
/// a GET of one resource aside: how often a wait polls its status depends
/// on the clock, not on the project), and ListVolumes's page was one list
/// of `collection` (a path ending so).
pub fn assert_flat(
    alone: &AskedByOperation,
    among_many: &AskedByOperation,
    crowd: usize,
    collection: &str,
) {
    let counted = |calls: &[CallShape]| {
        let mut kept: Vec<CallShape> = calls
            .iter()
            .filter(|(m, p, _)| !(m == "GET" && p.ends_with("/{id}")))
            .cloned()
            .collect();
        kept.sort();
        kept
    };
    for (what, calls) in alone {
        let (empty, crowded) = (counted(calls), counted(&among_many[what]));
        assert_eq!(
            empty, crowded,
            "{what}: the calls in an empty project (left) and among {crowd} resources not its own (right)"
        );
    }
    let lists = among_many["ListVolumes"]
        .iter()
        .filter(|(m, p, _)| m == "GET" && p.ends_with(collection))
        .count();
    assert_eq!(lists, 1, "ListVolumes: {:#?}", among_many["ListVolumes"]);
}
