//! Access rules, safe by default: NFS shares are opened only to the
//! clients a StorageClass names (`nfs-shareClient`) or the operator's
//! default (never to the world unless `0.0.0.0/0` is written); a CephFS
//! share gets one `cephx` rule for its client id. CreateVolume returns
//! once every rule is `active` (and a cephx rule has its key);
//! DeleteVolume revokes them first, so that a cephx user is deauthorized
//! and its key no longer mounts. A share whose every capability is a
//! reader's gets `ro` rules: the server, not only the node, refuses writes.

use std::time::Instant;

use csi_common::waits::wait_until;
use csi_common::{Context, DriverError, DriverResult};
use openstack_client::common::Poll;
use openstack_client::manila::{
    AccessRule, AccessRuleState, GrantAccess, Share, SharedFileSystems,
};

use super::ControllerService;
use crate::parameters::{ShareParameters, parse_share_clients};
use crate::share_protocol::ShareProtocol;

/// `10.0.0.1` and `10.0.0.1/32` name the same client.
fn same_client(a: &str, b: &str) -> bool {
    let norm = |s: &str| {
        s.strip_suffix("/32")
            .or_else(|| s.strip_suffix("/128"))
            .unwrap_or(s)
            .to_ascii_lowercase()
    };
    norm(a) == norm(b)
}

fn being_denied(r: &AccessRule) -> bool {
    matches!(
        r.state,
        AccessRuleState::QueuedToDeny | AccessRuleState::Denying
    )
}

impl ControllerService {
    /// Who a new NFS share is opened to: the StorageClass's clients, else
    /// the runtime configuration's default, else the flag's; none is a
    /// refusal before anything is created.
    pub(super) fn nfs_clients(&self, params: &ShareParameters) -> DriverResult<Vec<String>> {
        if !params.nfs_share_clients.is_empty() {
            return Ok(params.nfs_share_clients.clone());
        }
        if let Some(d) = self.runtime.current().nfs.default_share_client {
            return parse_share_clients(&d).map_err(|e| {
                DriverError::FailedPrecondition(format!(
                    "runtime configuration nfs.defaultShareClient: {e}"
                ))
            });
        }
        if !self.opts.default_nfs_share_clients.is_empty() {
            return Ok(self.opts.default_nfs_share_clients.clone());
        }
        Err(DriverError::InvalidArgument(
            "no NFS client to grant access to: set the StorageClass parameter nfs-shareClient \
             (IPs or CIDRs, comma-separated; 0.0.0.0/0 opens the share to every host), or give \
             the plugin --default-nfs-share-client or the runtime configuration's \
             nfs.defaultShareClient"
                .into(),
        ))
    }

    /// The rules a share of this instance's protocol gets: `ro` for a
    /// share that is only ever read, `rw` otherwise.
    pub(super) fn wanted_rules(
        &self,
        share_name: &str,
        params: &ShareParameters,
        read_only: bool,
    ) -> DriverResult<Vec<GrantAccess>> {
        let access_level = if read_only { "ro" } else { "rw" };
        Ok(match self.opts.protocol {
            ShareProtocol::Nfs => self
                .nfs_clients(params)?
                .into_iter()
                .map(|to| GrantAccess {
                    access_type: "ip".into(),
                    access_to: to,
                    access_level: access_level.into(),
                })
                .collect(),
            ShareProtocol::Cephfs => vec![GrantAccess {
                access_type: "cephx".into(),
                access_to: params
                    .cephfs_client_id
                    .clone()
                    .unwrap_or_else(|| share_name.to_string()),
                access_level: access_level.into(),
            }],
        })
    }

    /// Grants what is missing and waits until every wanted rule is
    /// active; returns their ids. A rule Manila failed (`error`) is
    /// revoked and granted anew.
    /// `fresh`: the share was created by this call, so it has no rules yet
    /// and none is looked up first.
    pub(super) async fn ensure_access(
        &self,
        manila: &SharedFileSystems,
        share: &Share,
        wanted: &[GrantAccess],
        fresh: bool,
        deadline: Instant,
    ) -> DriverResult<Vec<String>> {
        let id = share.id.as_str();
        let matches = |r: &AccessRule, g: &GrantAccess| {
            r.access_type.eq_ignore_ascii_case(&g.access_type)
                && same_client(&r.access_to, &g.access_to)
        };
        let rules = if fresh {
            Vec::new()
        } else {
            manila
                .list_access_rules(id)
                .await
                .context(format!("access rules of share {id}"))?
        };
        for g in wanted {
            let existing = rules.iter().find(|r| matches(r, g));
            if let Some(r) = existing {
                if r.state == AccessRuleState::Error {
                    tracing::warn!(share_id = id, rule = %r.id, to = %g.access_to, "access rule failed in Manila; granting it anew");
                    self.revoke_and_wait(manila, id, &r.id, deadline).await?;
                } else if being_denied(r) {
                    self.wait_rule_gone(manila, id, &r.id, deadline).await?;
                } else {
                    continue;
                }
            }
            match manila.grant_access(id, g).await {
                Ok(r) => {
                    tracing::info!(share_id = id, rule = %r.id, kind = %g.access_type, to = %g.access_to, "access granted")
                }
                Err(openstack_client::Error::BadRequest(e)) => {
                    // granted meanwhile by another call (a retry, another
                    // replica): Manila refuses the same rule twice
                    let now = manila
                        .list_access_rules(id)
                        .await
                        .context(format!("access rules of share {id}"))?;
                    if now.iter().any(|r| matches(r, g)) {
                        tracing::info!(share_id = id, kind = %g.access_type, to = %g.access_to, "access granted already, by another call");
                        continue;
                    }
                    return Err(DriverError::InvalidArgument(format!(
                        "Manila refused access {}:{} to share {id}: {}",
                        g.access_type, g.access_to, e.message
                    )));
                }
                Err(e) => {
                    return Err(e).context(format!(
                        "granting {}:{} on share {id}",
                        g.access_type, g.access_to
                    ));
                }
            }
        }
        let needs_key = self.opts.protocol == ShareProtocol::Cephfs;
        let ids = wait_until(
            "access_wait",
            deadline,
            |s| format!("access rules of share {id} are still {s}"),
            || async {
                let rules = manila.list_access_rules(id).await?;
                let mut ids = Vec::new();
                let mut pending = Vec::new();
                for g in wanted {
                    match rules.iter().find(|r| matches(r, g)) {
                        Some(r) if r.state == AccessRuleState::Error => {
                            return Ok(Poll::Ready(Err(format!(
                                "Manila could not apply access rule {} ({}:{})",
                                r.id, g.access_type, g.access_to
                            ))));
                        }
                        Some(r)
                            if r.state == AccessRuleState::Active
                                && (!needs_key
                                    || r.access_key.as_deref().is_some_and(|k| !k.is_empty())) =>
                        {
                            ids.push(r.id.clone())
                        }
                        Some(r) => {
                            pending.push(format!("{}:{} {}", g.access_type, g.access_to, r.state))
                        }
                        None => pending.push(format!("{}:{} missing", g.access_type, g.access_to)),
                    }
                }
                Ok(if pending.is_empty() {
                    Poll::Ready(Ok(ids))
                } else {
                    Poll::Pending(pending.join(", "))
                })
            },
        )
        .await?;
        ids.map_err(DriverError::Internal)
    }

    async fn wait_rule_gone(
        &self,
        manila: &SharedFileSystems,
        share_id: &str,
        rule_id: &str,
        deadline: Instant,
    ) -> DriverResult<()> {
        csi_common::waits::wait_gone(
            "access_revoke",
            deadline,
            &format!("access rule {rule_id}"),
            || manila.get_access_rule(share_id, rule_id),
            |r| r.state.to_string(),
        )
        .await
    }

    async fn revoke_and_wait(
        &self,
        manila: &SharedFileSystems,
        share_id: &str,
        rule_id: &str,
        deadline: Instant,
    ) -> DriverResult<()> {
        match manila.revoke_access(share_id, rule_id).await {
            Ok(()) => {}
            Err(e) if e.is_not_found() => return Ok(()),
            Err(e) => return Err(e).context(format!("revoking access rule {rule_id}")),
        }
        self.wait_rule_gone(manila, share_id, rule_id, deadline)
            .await
    }

    /// Revokes every rule of a share and waits until they are gone: a
    /// cephx user is deauthorized and its clients evicted before the share
    /// goes.
    pub(super) async fn revoke_all(
        &self,
        manila: &SharedFileSystems,
        share_id: &str,
        deadline: Instant,
    ) -> DriverResult<()> {
        let rules = match manila.list_access_rules(share_id).await {
            Ok(r) => r,
            Err(e) if e.is_not_found() => return Ok(()),
            Err(e) => return Err(e).context(format!("access rules of share {share_id}")),
        };
        for r in &rules {
            if being_denied(r) {
                continue;
            }
            match manila.revoke_access(share_id, &r.id).await {
                Ok(()) => {
                    tracing::info!(share_id, rule = %r.id, kind = %r.access_type, "access revoked")
                }
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e).context(format!("revoking access rule {}", r.id)),
            }
        }
        for r in &rules {
            self.wait_rule_gone(manila, share_id, &r.id, deadline)
                .await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clients_compare_with_and_without_host_prefix() {
        assert!(same_client("10.0.0.1", "10.0.0.1/32"));
        assert!(same_client("fd00::1/128", "FD00::1"));
        assert!(!same_client("10.0.0.0/24", "10.0.0.0"));
    }
}
