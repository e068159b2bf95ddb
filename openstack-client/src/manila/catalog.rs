//! What the cloud offers and allows: share types, back-end pools, the
//! project's limits and quotas, and Manila's user messages about a
//! resource.

use super::*;

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ShareType {
    pub id: String,
    pub name: String,
    #[serde(default, deserialize_with = "string_map")]
    pub extra_specs: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct UserMessage {
    pub id: String,
    #[serde(default)]
    pub resource_id: Option<String>,
    #[serde(default)]
    pub action_id: Option<String>,
    #[serde(default)]
    pub detail_id: Option<String>,
    pub user_message: String,
    #[serde(default)]
    pub message_level: Option<String>,
    #[serde(default)]
    pub created_at: Option<String>,
}

/// A backend pool as the scheduler sees it (admin only by default).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Pool {
    pub name: String,
    #[serde(default)]
    pub capabilities: PoolCapabilities,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct PoolCapabilities {
    /// GiB; Manila reports `"unknown"` or `"infinite"` for some backends.
    #[serde(default)]
    pub free_capacity_gb: Option<Value>,
    #[serde(default)]
    pub share_backend_name: Option<String>,
    #[serde(default)]
    pub storage_protocol: Option<String>,
}

impl PoolCapabilities {
    /// Free GiB when the pool says a number.
    pub fn free_gib(&self) -> Option<f64> {
        match self.free_capacity_gb.as_ref()? {
            Value::Number(n) => n.as_f64(),
            Value::String(s) => s.parse().ok(),
            _ => None,
        }
    }
}

/// The project's share quota as `GET /limits` reports it: `None` where
/// unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ShareLimits {
    pub max_gib: Option<u64>,
    pub used_gib: u64,
}

impl SharedFileSystems {
    pub async fn list_share_types(&self) -> Result<Vec<ShareType>> {
        #[derive(Deserialize)]
        struct L {
            share_types: Vec<ShareType>,
        }
        let req = self.req(Method::GET, "types", "share_type_list").await?;
        Ok(self.session.send(req).await?.json::<L>()?.share_types)
    }

    /// Backend pools with their capabilities (`scheduler-stats/pools/detail`;
    /// Manila's default policy lets only admins read them).
    pub async fn list_pools(&self) -> Result<Vec<Pool>> {
        #[derive(Deserialize)]
        struct L {
            pools: Vec<Pool>,
        }
        // Manila takes unknown query parameters for pool filters, so the
        // detail view is a path, not `?detail=true`
        let req = self
            .req(Method::GET, "scheduler-stats/pools/detail", "pool_list")
            .await?;
        Ok(self.session.send(req).await?.json::<L>()?.pools)
    }

    /// The project's share gigabytes quota and use.
    pub async fn share_limits(&self) -> Result<ShareLimits> {
        #[derive(Deserialize)]
        struct Abs {
            #[serde(rename = "maxTotalShareGigabytes", default)]
            max: Option<i64>,
            #[serde(rename = "totalShareGigabytesUsed", default)]
            used: Option<i64>,
        }
        #[derive(Deserialize)]
        struct Limits {
            absolute: Abs,
        }
        #[derive(Deserialize)]
        struct L {
            limits: Limits,
        }
        let req = self.req(Method::GET, "limits", "limits_get").await?;
        let a = self.session.send(req).await?.json::<L>()?.limits.absolute;
        Ok(ShareLimits {
            max_gib: a.max.filter(|m| *m >= 0).map(|m| m as u64),
            used_gib: a.used.unwrap_or(0).max(0) as u64,
        })
    }

    /// The quotas of `project_id` (`shares`, `gigabytes`,
    /// `share_group_snapshots`, …; -1 is unlimited). Its own project's for
    /// a member, any project's for an admin.
    pub async fn project_quotas(&self, project_id: &str) -> Result<BTreeMap<String, i64>> {
        let req = self
            .req(
                Method::GET,
                format!("quota-sets/{}", seg(project_id)),
                "quota_set_show",
            )
            .await?;
        Ok(quota_set(self.session.send(req).await?.json::<Value>()?))
    }

    /// Admin only: sets quotas of `project_id` (the keys of
    /// `project_quotas`; -1 is unlimited). Manila refuses a limit below what
    /// the project uses already. Answers the quotas as they now are.
    pub async fn set_project_quotas(
        &self,
        project_id: &str,
        quotas: &BTreeMap<String, i64>,
    ) -> Result<BTreeMap<String, i64>> {
        let req = self
            .req(
                Method::PUT,
                format!("quota-sets/{}", seg(project_id)),
                "quota_set_update",
            )
            .await?
            .json(json!({ "quota_set": quotas }));
        Ok(quota_set(self.session.send(req).await?.json::<Value>()?))
    }

    /// User messages about a resource, newest first: they say why a share
    /// went to `error`.
    pub async fn list_user_messages(&self, resource_id: &str) -> Result<Vec<UserMessage>> {
        #[derive(Deserialize)]
        struct L {
            messages: Vec<UserMessage>,
        }
        let req = self
            .req(Method::GET, "messages", "message_list")
            .await?
            .query("resource_id", resource_id)
            .query("sort_key", "created_at")
            .query("sort_dir", "desc");
        Ok(self.session.send(req).await?.json::<L>()?.messages)
    }
}

/// A `{"quota_set": {...}}` answer's limits (its `id` and any other
/// non-number left out).
fn quota_set(v: Value) -> BTreeMap<String, i64> {
    v.get("quota_set")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_i64()?)))
                .collect()
        })
        .unwrap_or_default()
}
