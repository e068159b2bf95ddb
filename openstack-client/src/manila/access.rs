//! Access rules: granted to a share (`ip`, `cephx`, ...), listed, read
//! one by one and revoked.

use super::*;

status_enum!(
    /// Access rule states.
    AccessRuleState {
        QueuedToApply => "queued_to_apply",
        Applying => "applying",
        Active => "active",
        Error => "error",
        QueuedToDeny => "queued_to_deny",
        Denying => "denying",
    }
);

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct AccessRule {
    pub id: String,
    pub access_type: String,
    pub access_to: String,
    pub access_level: String,
    #[serde(default = "unknown_state")]
    pub state: AccessRuleState,
    /// The cephx secret; present once a `cephx` rule is active.
    #[serde(default)]
    pub access_key: Option<String>,
    /// The share the rule belongs to (the share-access-rules API says;
    /// a share's own list does not).
    #[serde(default)]
    pub share_id: Option<String>,
    /// What the grant set (microversion 2.45+; empty before).
    #[serde(default, deserialize_with = "null_as_default")]
    pub metadata: BTreeMap<String, String>,
}

fn unknown_state() -> AccessRuleState {
    AccessRuleState::Other("unknown".into())
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrantAccess {
    /// `ip`, `cephx`, `user`, `cert`
    pub access_type: String,
    pub access_to: String,
    /// `rw` or `ro`
    pub access_level: String,
}

impl SharedFileSystems {
    pub async fn grant_access(&self, share_id: &str, grant: &GrantAccess) -> Result<AccessRule> {
        self.grant_access_with_metadata(share_id, grant, &BTreeMap::new())
            .await
    }

    /// A grant that records `metadata` on the rule (what it is for),
    /// readable by whoever lists the share's rules. Needs microversion
    /// 2.45: an older server could not keep it, and is refused here.
    pub async fn grant_access_with_metadata(
        &self,
        share_id: &str,
        grant: &GrantAccess,
        metadata: &BTreeMap<String, String>,
    ) -> Result<AccessRule> {
        #[derive(Deserialize)]
        struct E {
            access: AccessRule,
        }
        let mut body = json!({ "allow_access": {
            "access_type": grant.access_type, "access_to": grant.access_to, "access_level": grant.access_level
        }});
        if !metadata.is_empty() {
            let v = self.microversion().await?;
            if v < MV_ACCESS_RULES_API {
                return Err(Error::Unsupported {
                    operation: "access_grant",
                    message: format!(
                        "access rule metadata needs Manila microversion {MV_ACCESS_RULES_API}; the server speaks {v}"
                    ),
                });
            }
            body["allow_access"]["metadata"] = json!(metadata);
        }
        Ok(self
            .action(share_id, "access_grant", body)
            .await?
            .json::<E>()?
            .access)
    }

    pub async fn revoke_access(&self, share_id: &str, access_id: &str) -> Result<()> {
        self.action(
            share_id,
            "access_revoke",
            json!({ "deny_access": { "access_id": access_id } }),
        )
        .await
        .map(|_| ())
    }

    pub async fn list_access_rules(&self, share_id: &str) -> Result<Vec<AccessRule>> {
        #[derive(Deserialize)]
        struct L {
            access_list: Vec<AccessRule>,
        }
        if self.microversion().await? >= MV_ACCESS_RULES_API {
            let req = self
                .req(Method::GET, "share-access-rules", "access_list")
                .await?
                .query("share_id", share_id);
            Ok(self.session.send(req).await?.json::<L>()?.access_list)
        } else {
            Ok(self
                .action(share_id, "access_list", json!({ "access_list": null }))
                .await?
                .json::<L>()?
                .access_list)
        }
    }

    /// One access rule by id alone, whichever share of the project's it
    /// is on (its `share_id` says): microversion 2.45+, else Unsupported.
    /// The caller proves the rule is what it expects before acting on it.
    pub async fn access_rule(&self, access_id: &str) -> Result<AccessRule> {
        let v = self.microversion().await?;
        if v < MV_ACCESS_RULES_API {
            return Err(Error::Unsupported {
                operation: "access_get",
                message: format!(
                    "reading an access rule by id needs Manila microversion {MV_ACCESS_RULES_API}; the server speaks {v}"
                ),
            });
        }
        #[derive(Deserialize)]
        struct E {
            access: AccessRule,
        }
        let req = self
            .req(
                Method::GET,
                format!("share-access-rules/{}", seg(access_id)),
                "access_get",
            )
            .await?;
        Ok(self.session.send(req).await?.json::<E>()?.access)
    }

    /// One access rule by id (microversion 2.45+), else from the share's
    /// list.
    pub async fn get_access_rule(&self, share_id: &str, access_id: &str) -> Result<AccessRule> {
        if self.microversion().await? >= MV_ACCESS_RULES_API {
            let rule = self.access_rule(access_id).await?;
            // the API answers for any rule the project can see: one of
            // another share (and its cephx key) is not this share's
            if rule.share_id.as_deref() != Some(share_id) {
                return Err(Error::NotFound(crate::error::ApiError {
                    operation: "access_get",
                    status: None,
                    request_id: None,
                    message: format!("access rule {access_id} is not a rule of share {share_id}"),
                }));
            }
            return Ok(rule);
        }
        self.list_access_rules(share_id)
            .await?
            .into_iter()
            .find(|r| r.id == access_id)
            .ok_or_else(|| {
                Error::NotFound(crate::error::ApiError {
                    operation: "access_get",
                    status: Some(404),
                    request_id: None,
                    message: format!("access rule {access_id} not found on share {share_id}"),
                })
            })
    }
}
