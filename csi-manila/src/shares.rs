//! What the controller and the node both know about shares: which ones
//! this driver provisioned, how a share is found from a volume's
//! attributes, which export location a node mounts, and how an export
//! path splits into server (or monitors) and path.

use std::time::Instant;

use csi_common::request::is_uuid;
use csi_common::waits::wait_until;
use csi_common::{Context, DriverError, DriverResult};
use openstack_client::common::Poll;
use openstack_client::manila::{
    AccessRule, AccessRuleState, ExportLocation, Share, ShareStatus, SharedFileSystems,
};

use crate::errors::failure_from_messages;
use crate::parameters::NodeParameters;
use crate::runtime_config::Cidr;
use crate::share_protocol::ShareProtocol;

/// Upstream's description of the shares it provisions: DeleteVolume
/// deletes only shares that carry it (ours, and upstream's before a
/// migration), never one a static PV merely points at.
pub const DESCRIPTION: &str = "provisioned-by=manila.csi.openstack.org";
/// The description of the snapshot a clone is made from (deleted once the
/// clone is made).
pub const CLONE_SNAPSHOT_DESCRIPTION: &str = "temporary snapshot of a clone";
/// Share metadata keys.
pub const CLUSTER_KEY: &str = "manila.csi.openstack.org/cluster";
/// Beside the cluster id: the cluster's identity (its kube-system uid),
/// which the orphan tool needs before it deletes anything (ours).
pub const IDENTITY_KEY: &str = "manila.csi.openstack.org/cluster-uid";
/// The source share of a clone (its snapshot is a temporary one).
pub const CLONE_OF_KEY: &str = "manila.csi.openstack.org/clone-of";
/// The size (GiB) a share made from a snapshot is grown to once created.
/// It is created at the snapshot's size and then extended: some backends
/// (Manila's CephFS driver in Manila 23) clone the snapshot and never
/// apply a larger size, so the share would say 2 GiB and hold 1; an
/// extend runs a real resize on every backend.
pub const GROW_TO_KEY: &str = "manila.csi.openstack.org/grow-to-gib";

/// The name of the temporary snapshot a clone named `name` is made from.
pub fn clone_snapshot_name(name: &str) -> String {
    format!("{name}-clone-source")
}

/// The access rule metadata naming the snapshot a backed volume reads.
pub const BACKING_SNAPSHOT_KEY: &str = "manila.csi.openstack.org/backing-snapshot";

/// Whether a rule is a backed volume's (of any snapshot), and not on its
/// way out.
pub fn backs_a_volume(r: &AccessRule) -> bool {
    r.metadata.contains_key(BACKING_SNAPSHOT_KEY)
        && !matches!(
            r.state,
            AccessRuleState::QueuedToDeny | AccessRuleState::Denying
        )
}

/// The readers of a snapshot among a share's rules: their cephx ids.
pub fn readers_of<'a>(rules: &'a [AccessRule], snapshot_id: Option<&str>) -> Vec<&'a str> {
    rules
        .iter()
        .filter(|r| backs_a_volume(r))
        .filter(|r| {
            snapshot_id
                .is_none_or(|s| r.metadata.get(BACKING_SNAPSHOT_KEY).map(String::as_str) == Some(s))
        })
        .map(|r| r.access_to.as_str())
        .collect()
}

/// Whether this driver (or upstream's) provisioned the share.
pub fn provisioned_here(s: &Share) -> bool {
    s.description.as_deref() == Some(DESCRIPTION)
}

pub fn is_gone(s: &ShareStatus) -> bool {
    matches!(s, ShareStatus::Deleting) || s.as_str() == "deleted"
}

/// A share for a volume: by the `shareID` or `shareName` attribute
/// (static PVs), else the volume id itself (provisioned volumes).
pub async fn resolve_share(
    manila: &SharedFileSystems,
    volume_id: &str,
    params: &NodeParameters,
) -> DriverResult<Share> {
    if let Some(name) = &params.share_name {
        let mut found = manila
            .list_shares_named(name)
            .await
            .context(format!("looking up share {name}"))?;
        return match found.len() {
            0 => Err(DriverError::NotFound(format!("no share is named {name}"))),
            1 => Ok(found.remove(0)),
            n => Err(DriverError::FailedPrecondition(format!(
                "{n} shares are named {name}; name the one to use with shareID"
            ))),
        };
    }
    let id = params.share_id.as_deref().unwrap_or(volume_id);
    if !is_uuid(id) {
        return Err(DriverError::NotFound(format!(
            "share {id} does not exist (share ids are UUIDs)"
        )));
    }
    manila.get_share(id).await.context(format!("share {id}"))
}

/// Checks that a share can be mounted by this instance.
pub fn check_mountable(share: &Share, protocol: ShareProtocol) -> DriverResult<()> {
    if !share.share_proto.eq_ignore_ascii_case(protocol.as_manila()) {
        return Err(DriverError::InvalidArgument(format!(
            "share {} is {}, but this plugin instance serves {protocol}",
            share.id, share.share_proto
        )));
    }
    match &share.status {
        ShareStatus::Available | ShareStatus::Extending | ShareStatus::Shrinking => Ok(()),
        ShareStatus::Creating | ShareStatus::CreatingFromSnapshot => Err(DriverError::Unavailable(
            format!("share {} is still {}", share.id, share.status),
        )),
        s => Err(DriverError::FailedPrecondition(format!(
            "share {} is {s}; it cannot be mounted",
            share.id
        ))),
    }
}

/// The access rule a node mounts with: one of `ids`, of the protocol's
/// type, active (and, for cephx, with its key).
pub async fn usable_rule(
    manila: &SharedFileSystems,
    share_id: &str,
    ids: &[String],
    protocol: ShareProtocol,
) -> DriverResult<AccessRule> {
    let rules = if ids.is_empty() {
        manila
            .list_access_rules(share_id)
            .await
            .context(format!("access rules of share {share_id}"))?
    } else {
        let mut v = Vec::new();
        for id in ids {
            match manila.get_access_rule(share_id, id).await {
                Ok(r) => v.push(r),
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e).context(format!("access rule {id}")),
            }
        }
        v
    };
    rules
        .into_iter()
        .find(|r| {
            r.access_type.eq_ignore_ascii_case(protocol.access_type())
                && r.state == AccessRuleState::Active
                && (protocol != ShareProtocol::Cephfs
                    || r.access_key.as_deref().is_some_and(|k| !k.is_empty()))
        })
        .ok_or_else(|| {
            DriverError::FailedPrecondition(format!(
                "share {share_id} has no active {} access rule{}",
                protocol.access_type(),
                if ids.is_empty() {
                    String::new()
                } else {
                    format!(" among {ids:?}")
                }
            ))
        })
}

/// Where a node mounts from: with `matching` (the runtime configuration's
/// `nfs.matchExportLocationAddress`), the first location on that network;
/// else the preferred one; else the first. Admin-only paths never.
pub fn choose_export(
    locations: &[ExportLocation],
    matching: Option<&Cidr>,
) -> DriverResult<ExportLocation> {
    let usable: Vec<&ExportLocation> = locations.iter().filter(|l| !l.is_admin_only).collect();
    if let Some(net) = matching {
        return usable
            .iter()
            .find(|l| {
                split_export(&l.path)
                    .ok()
                    .and_then(|(host, _)| host_ip(host))
                    .is_some_and(|ip| net.contains(ip))
            })
            .map(|l| (*l).clone())
            .ok_or_else(|| {
                DriverError::FailedPrecondition(format!(
                    "no export location is in {}/{} (nfs.matchExportLocationAddress): {:?}",
                    net.addr,
                    net.prefix,
                    usable.iter().map(|l| l.path.as_str()).collect::<Vec<_>>()
                ))
            });
    }
    usable
        .iter()
        .find(|l| l.preferred)
        .or_else(|| usable.first())
        .map(|l| (*l).clone())
        .ok_or_else(|| DriverError::FailedPrecondition("the share has no export location".into()))
}

fn host_ip(host: &str) -> Option<std::net::IpAddr> {
    host.trim_start_matches('[')
        .trim_end_matches(']')
        .parse()
        .ok()
}

/// `server:/path` (NFS) or `mon1:6789,mon2:6789:/path` (CephFS) → the part
/// before the path, and the path.
pub fn split_export(path: &str) -> DriverResult<(&str, &str)> {
    match path.find(":/") {
        Some(i) if i > 0 => Ok((&path[..i], &path[i + 1..])),
        _ => Err(DriverError::FailedPrecondition(format!(
            "export location {path:?} is not server:/path"
        ))),
    }
}

/// What Manila says, quoted for an error and cut short: it may be long
/// or hold anything.
fn quoted(v: &str) -> String {
    let cut: String = v.chars().take(120).collect();
    format!("{cut:?}")
}

fn unusable(what: &str, v: &str, why: &str) -> DriverError {
    DriverError::FailedPrecondition(format!(
        "Manila answered {what} {} that this plugin will not hand to mount(8) or a Ceph file: {why}",
        quoted(v)
    ))
}

/// Checks an export location before it reaches mount(8), a ceph.conf or a
/// mount option: `server:/path` (NFS) or `mon:port,...:/path` (CephFS),
/// a server of host-name or address characters only (so never an
/// option), a path with no control character, space or comma.
pub fn check_export(path: &str) -> DriverResult<()> {
    let (server, dir) = split_export(path)?;
    let server_ok = !server.is_empty()
        && !server.starts_with('-')
        && server.chars().all(|c| {
            c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '[' | ']' | ',' | '_')
        });
    if !server_ok {
        return Err(unusable(
            "the export location",
            path,
            "its server part is not a host name, an address or a list of monitors",
        ));
    }
    if dir
        .chars()
        .any(|c| c.is_control() || c.is_whitespace() || c == ',')
    {
        return Err(unusable(
            "the export location",
            path,
            "its path holds a control character, a space or a comma",
        ));
    }
    Ok(())
}

/// A Ceph entity or file system name: 1 to 256 letters, digits, '.', '-'
/// and '_' (nothing that ends a config line or a mount option).
fn is_ceph_name(s: &str) -> bool {
    (1..=256).contains(&s.len())
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
}

/// Checks a cephx access rule's user and key before they are written into
/// a keyring and a mount option: a Ceph entity name, and base64.
pub fn check_cephx(client_id: &str, key: &str) -> DriverResult<()> {
    if !is_ceph_name(client_id) {
        return Err(unusable(
            "the cephx user",
            client_id,
            "a Ceph user name has letters, digits, '.', '-' and '_' only",
        ));
    }
    if key.is_empty()
        || key.len() > 1024
        || !key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '/' | '='))
    {
        // the key itself is never quoted
        return Err(DriverError::FailedPrecondition(
            "Manila answered a cephx key that is not base64; it is not written anywhere".into(),
        ));
    }
    Ok(())
}

/// Checks a CephFS file system name from the share's metadata before it
/// becomes a mount option.
pub fn check_fs_name(name: &str) -> DriverResult<()> {
    if !is_ceph_name(name) {
        return Err(unusable(
            "the CephFS file system name",
            name,
            "letters, digits, '.', '-' and '_' only",
        ));
    }
    Ok(())
}

/// Waits for a share to become available (after create, extend). A share
/// that fails is reported with Manila's user message.
pub async fn wait_share_available(
    manila: &SharedFileSystems,
    id: &str,
    deadline: Instant,
    done: impl Fn(&Share) -> bool,
) -> DriverResult<Share> {
    let r = wait_until(
        "share_wait",
        deadline,
        |s| format!("share {id} is still {s}"),
        || async {
            let s = manila.get_share(id).await?;
            Ok(match &s.status {
                ShareStatus::Available if done(&s) => Poll::Ready(Ok(s)),
                st if st.is_error() => Poll::Ready(Err(s)),
                st => Poll::Pending(st.to_string()),
            })
        },
    )
    .await?;
    match r {
        Ok(s) => Ok(s),
        Err(s) => {
            let messages = manila.list_user_messages(id).await.unwrap_or_default();
            Err(failure_from_messages(
                &format!("share {id} ({})", s.status),
                &messages,
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loc(path: &str, preferred: bool, admin: bool) -> ExportLocation {
        ExportLocation {
            id: path.into(),
            path: path.into(),
            preferred,
            is_admin_only: admin,
        }
    }

    #[test]
    fn export_paths_split() {
        assert_eq!(
            split_export("127.0.0.1:/shares/a").unwrap(),
            ("127.0.0.1", "/shares/a")
        );
        assert_eq!(
            split_export("10.0.0.1:6789,10.0.0.2:6789:/volumes/_nogroup/x/y").unwrap(),
            ("10.0.0.1:6789,10.0.0.2:6789", "/volumes/_nogroup/x/y")
        );
        assert_eq!(
            split_export("[fd00::1]:/srv").unwrap(),
            ("[fd00::1]", "/srv")
        );
        assert!(split_export("/no/server").is_err());
        assert!(split_export("server-only").is_err());
    }

    #[test]
    fn what_manila_answers_is_checked() {
        for ok in [
            "127.0.0.1:/shares/a",
            "10.0.0.1:6789,10.0.0.2:6789:/volumes/_nogroup/x/y",
            "[fd00::1]:/srv",
            "nfs.example.com:/exports/share-1",
        ] {
            check_export(ok).unwrap();
        }
        for bad in [
            "-oexec,x:/path",
            "10.0.0.1:6789\nkeyring = /etc/shadow:/v",
            "host:/path with space",
            "host:/a,b",
            "host:/a\u{0}",
            "ho st:/a",
        ] {
            assert!(check_export(bad).is_err(), "{bad:?}");
        }
        check_cephx("pvc-1.csi_user", "AQBv4n1mAAAAABAA7n7b5aXfJ0mD0pZJ1S6L9w==").unwrap();
        for (id, key) in [
            ("a,secretfile=/etc/shadow", "AQ=="),
            ("a\n[client.admin]", "AQ=="),
            ("", "AQ=="),
            ("user", "AQ==\n\tcaps mon = allow *"),
            ("user", ""),
        ] {
            assert!(check_cephx(id, key).is_err(), "{id:?}");
        }
    }

    #[test]
    fn export_choice() {
        let l = vec![
            loc("10.0.0.3:/s", true, true),
            loc("10.0.0.2:/s", false, false),
            loc("192.168.1.2:/s", true, false),
        ];
        assert_eq!(choose_export(&l, None).unwrap().path, "192.168.1.2:/s");
        let net = Cidr::parse("10.0.0.0/24").unwrap();
        assert_eq!(choose_export(&l, Some(&net)).unwrap().path, "10.0.0.2:/s");
        let none = Cidr::parse("172.16.0.0/12").unwrap();
        assert!(choose_export(&l, Some(&none)).is_err());
        assert!(choose_export(&[loc("10.0.0.3:/s", true, true)], None).is_err());
    }
}
