//! `<plugin> orphans`: the report, the adoptions and the deletions an
//! operator asks for. A dry run unless `--delete`; with it, what will be
//! deleted is shown with why each is an orphan, and nothing is deleted
//! when the tool's view of the cluster looks wrong, unless the operator
//! names each resource (`--force-delete`).

use std::time::{Duration, SystemTime};

use serde::Serialize;

use super::reporter::{KubeArgs, ScanError};
use super::{
    ClusterRefs, Inventory, NamedBy, NodeAddresses, Report, Tagged, Unproven, human, unix_now,
};

/// The least `--older-than` that `--delete` takes: a PV may take this
/// long to follow its volume when the provisioner is slow or restarted.
pub const LEAST_AGE_TO_DELETE: Duration = Duration::from_secs(15 * 60);

/// The orphan report's flags both drivers take.
#[derive(Debug, Clone, clap::Args)]
pub struct ReportArgs {
    /// Only what is at least this old is an orphan (its PV may still be
    /// on its way): `90s`, `30m`, `2h`, `7d`. With --delete, at least 15m.
    #[arg(long = "older-than", default_value = "1h", value_parser = parse_duration)]
    pub older_than: Duration,
    /// Delete the orphans found (never one in use, never one not proven
    /// this cluster's), after reading the cluster again. Refused when the
    /// view of the cluster looks wrong, unless each is named with
    /// --force-delete.
    #[arg(long)]
    pub delete: bool,
    /// With --delete: delete only these orphans (ids), even when the view
    /// of the cluster looks wrong. Each must still be an orphan proven
    /// this cluster's.
    #[arg(long = "force-delete", requires = "delete", value_delimiter = ',')]
    pub force_delete: Vec<String>,
    /// Writes this cluster's identity into these resources (ids): ones an
    /// older version made, carrying the cluster id and no identity. Only
    /// for what you know is this cluster's.
    #[arg(long, value_delimiter = ',')]
    pub adopt: Vec<String>,
    /// `text` or `json`.
    #[arg(long, default_value = "text", value_parser = ["text", "json"])]
    pub output: String,
    #[command(flatten)]
    pub kube: KubeArgs,
}

/// `90s`, `30m`, `2h`, `7d`, or plain seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (n, unit) = s
        .find(|c: char| !c.is_ascii_digit())
        .map_or((s, "s"), |i| s.split_at(i));
    let n: u64 = n
        .parse()
        .map_err(|_| format!("{s:?} is not a duration (90s, 30m, 2h, 7d)"))?;
    let secs = match unit {
        "s" => n,
        "m" => n.saturating_mul(60),
        "h" => n.saturating_mul(3600),
        "d" => n.saturating_mul(86400),
        _ => return Err(format!("{s:?} is not a duration (90s, 30m, 2h, 7d)")),
    };
    Ok(Duration::from_secs(secs))
}

/// Why `<plugin> orphans` failed.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    #[error("{0}")]
    Flags(String),
    #[error(transparent)]
    Plugin(#[from] crate::plugin::PluginError),
    #[error(transparent)]
    Client(#[from] openstack_client::Error),
    #[error(transparent)]
    Scan(#[from] ScanError),
    #[error(transparent)]
    Log(#[from] plugin_runtime::logging::LogError),
}

impl From<openstack_client::config::ConfigError> for CommandError {
    fn from(e: openstack_client::config::ConfigError) -> Self {
        Self::Plugin(e.into())
    }
}

impl From<kube_api::KubeError> for CommandError {
    fn from(e: kube_api::KubeError) -> Self {
        Self::Scan(e.into())
    }
}

/// What `<plugin> orphans` did, for its output.
#[derive(Debug, Default, Serialize)]
pub struct CommandOutcome {
    pub cluster: String,
    pub driver: String,
    pub older_than_secs: u64,
    pub report: Report,
    /// With --adopt: what now carries the cluster's identity.
    pub adopted: Vec<String>,
    /// With --delete: why deleting on this view was refused.
    pub refused: Vec<String>,
    /// With --delete: what was deleted, and what was kept and why.
    pub deleted: Vec<String>,
    pub kept: Vec<String>,
}

/// `<plugin> orphans`: the report, and the adoptions and deletions asked
/// for.
pub async fn run_command<I: Inventory>(
    inventory: &I,
    cluster: &str,
    driver: &str,
    args: &ReportArgs,
) -> Result<CommandOutcome, CommandError> {
    if args.delete && args.older_than < LEAST_AGE_TO_DELETE {
        return Err(CommandError::Flags(format!(
            "--delete takes --older-than of at least {} (a PV may take that long to follow its volume); {} asked",
            human(LEAST_AGE_TO_DELETE.as_secs()),
            human(args.older_than.as_secs())
        )));
    }
    let kube = args.kube.client()?;
    let refs = ClusterRefs::of(&kube, driver)
        .await
        .map_err(ScanError::from)?;
    let mut out = CommandOutcome {
        cluster: cluster.to_string(),
        driver: driver.to_string(),
        older_than_secs: args.older_than.as_secs(),
        ..Default::default()
    };
    if !args.adopt.is_empty() {
        adopt(inventory, &refs, &args.adopt, &mut out).await?;
    }
    let tagged = inventory.tagged().await.map_err(ScanError::from)?;
    let mut report = Report::new(tagged, &refs, args.older_than, SystemTime::now());
    let nodes = node_addresses(inventory, &kube).await?;
    hold(inventory, &mut report, &nodes).await?;
    if args.delete {
        let chosen: Vec<&Tagged> = if args.force_delete.is_empty() {
            out.refused = report.doubts();
            if out.refused.is_empty() {
                report.orphans.iter().collect()
            } else {
                Vec::new()
            }
        } else {
            for id in &args.force_delete {
                if !report.orphans.iter().any(|o| &o.id == id) {
                    out.kept.push(format!(
                        "{id}: not an orphan proven this cluster's (see above)"
                    ));
                }
            }
            report
                .orphans
                .iter()
                .filter(|o| args.force_delete.contains(&o.id))
                .collect()
        };
        if !chosen.is_empty() {
            delete(inventory, driver, &kube, &refs, chosen, &mut out).await?;
        }
    }
    out.report = report;
    Ok(out)
}

/// The addresses of the cluster's nodes, when the inventory asks for
/// them (none otherwise: the tool then never lists Nodes).
async fn node_addresses<I: Inventory>(
    inventory: &I,
    kube: &kube_api::Client,
) -> Result<NodeAddresses, CommandError> {
    if !inventory.reads_node_addresses() {
        return Ok(NodeAddresses::new());
    }
    Ok(kube.node_addresses().await.map_err(ScanError::from)?)
}

/// Moves the orphans the cloud says the cluster's nodes use into
/// `held`. A read that fails fails the command: nothing is decided on
/// what could not be read.
async fn hold<I: Inventory>(
    inventory: &I,
    report: &mut Report,
    nodes: &NodeAddresses,
) -> Result<(), CommandError> {
    let mut orphans = Vec::with_capacity(report.orphans.len());
    for t in std::mem::take(&mut report.orphans) {
        match inventory.held(&t, nodes).await.map_err(ScanError::from)? {
            Some(why) => report.held.push(Unproven { resource: t, why }),
            None => orphans.push(t),
        }
    }
    report.orphans = orphans;
    Ok(())
}

/// Writes the cluster's identity into the resources named, each only if
/// it carries the cluster id and no identity.
async fn adopt<I: Inventory>(
    inventory: &I,
    refs: &ClusterRefs,
    ids: &[String],
    out: &mut CommandOutcome,
) -> Result<(), CommandError> {
    let tagged = inventory.tagged().await.map_err(ScanError::from)?;
    for id in ids {
        let Some(t) = tagged.iter().find(|t| &t.id == id) else {
            out.kept.push(format!(
                "{id}: not adopted: nothing carrying the cluster id has that id"
            ));
            continue;
        };
        let what = format!("{} {} ({:?})", t.kind, t.id, t.name);
        if t.named_by == NamedBy::SnapshotContent {
            out.kept.push(format!(
                "{what}: not adopted: a snapshot carries its volume's or share's identity; adopt that"
            ));
        } else if let Some(has) = &t.identity {
            out.kept.push(format!(
                "{what}: not adopted: it already carries an identity ({has})"
            ));
        } else {
            match inventory.adopt(t, &refs.identity).await {
                Ok(()) => {
                    tracing::info!(kind = t.kind, id = %t.id, identity = %refs.identity, "adopted");
                    out.adopted.push(what);
                }
                Err(e) => out.kept.push(format!("{what}: not adopted: {e}")),
            }
        }
    }
    Ok(())
}

/// Deletes the orphans chosen, snapshots first, each only if the cluster
/// read again (the same cluster) still names nothing of it.
async fn delete<I: Inventory>(
    inventory: &I,
    driver: &str,
    kube: &kube_api::Client,
    refs: &ClusterRefs,
    mut chosen: Vec<&Tagged>,
    out: &mut CommandOutcome,
) -> Result<(), CommandError> {
    // the cluster again, just before: a PV made meanwhile wins
    let again = ClusterRefs::of(kube, driver)
        .await
        .map_err(ScanError::from)?;
    if again.identity != refs.identity {
        out.refused.push(format!(
            "the apiserver answered as another cluster on the second reading ({} then {})",
            refs.identity, again.identity
        ));
        return Ok(());
    }
    let nodes = node_addresses(inventory, kube).await?;
    // snapshots first: a volume with snapshots cannot go
    chosen.sort_by_key(|t| t.named_by != NamedBy::SnapshotContent);
    for t in chosen {
        let what = format!("{} {} ({:?})", t.kind, t.id, t.name);
        if again.names(t) {
            out.kept.push(format!("{what}: named by the cluster now"));
        } else if let Some(why) = &t.keep {
            out.kept.push(format!("{what}: {why}"));
        } else if let Some(why) = inventory.held(t, &nodes).await.unwrap_or_else(|e| {
            Some(format!(
                "whether its nodes use it could not be read again: {e}"
            ))
        }) {
            out.kept.push(format!("{what}: {why}"));
        } else {
            match inventory.delete(t, &refs.identity).await {
                Ok(()) => {
                    tracing::info!(kind = t.kind, id = %t.id, name = %t.name, "orphan deleted");
                    out.deleted.push(what);
                }
                Err(e) => out.kept.push(format!("{what}: {e}")),
            }
        }
    }
    Ok(())
}

/// What a driver's `orphans` prints, and whether it failed (a refused
/// deletion fails the command, after printing the report).
#[derive(Debug)]
pub struct Printed {
    pub text: String,
    pub failure: Option<String>,
}

impl CommandOutcome {
    /// As `--output` asks, and the failure to exit with.
    pub fn printed(&self, output: &str) -> Printed {
        Printed {
            text: self.render(output),
            failure: (!self.refused.is_empty()).then(|| {
                format!(
                    "--delete refused, nothing deleted: {} (name each orphan to delete with --force-delete if this view is right)",
                    self.refused.join("; ")
                )
            }),
        }
    }

    /// As `--output` asks: `json`, or the text an operator reads.
    pub fn render(&self, output: &str) -> String {
        if output == "json" {
            serde_json::to_string_pretty(self).unwrap_or_default() + "\n"
        } else {
            self.text()
        }
    }

    /// The text an operator reads.
    pub fn text(&self) -> String {
        let r = &self.report;
        let mut s = format!(
            "cluster {:?} (identity {}), driver {}: {} PV(s); {} tagged, {} in use, {} used by its nodes, {} orphan(s) older than {}, {} younger not counted, {} not proven this cluster's\n",
            self.cluster,
            r.identity,
            self.driver,
            r.persistent_volumes,
            r.tagged,
            r.named,
            r.held.len(),
            r.orphans.len(),
            human(self.older_than_secs),
            r.young.len(),
            r.unproven.len(),
        );
        let now = unix_now();
        for a in &self.adopted {
            s.push_str(&format!("adopted {a}\n"));
        }
        for o in &r.orphans {
            let age = o
                .created
                .map(|c| format!("{} old", human(now.saturating_sub(c))))
                .unwrap_or_default();
            let named = match o.named_by {
                NamedBy::PersistentVolume => "no PersistentVolume",
                NamedBy::SnapshotContent => "no VolumeSnapshotContent",
            };
            s.push_str(&format!(
                "orphan {:<8} {}  {:?}  {}  {age}{}\n    why: carries this cluster's id and identity, {named} of {} names it, {age} (older than {})\n",
                o.kind,
                o.id,
                o.name,
                o.status,
                o.keep
                    .as_ref()
                    .map(|k| format!("  (kept: {k})"))
                    .unwrap_or_default(),
                self.driver,
                human(self.older_than_secs),
            ));
        }
        for h in &r.held {
            s.push_str(&format!(
                "in use   {:<8} {}  {:?}  {}: never deleted: {}\n",
                h.resource.kind, h.resource.id, h.resource.name, h.resource.status, h.why
            ));
        }
        for u in &r.unproven {
            s.push_str(&format!(
                "not proven {:<8} {}  {:?}  {}: never deleted: {}\n",
                u.resource.kind, u.resource.id, u.resource.name, u.resource.status, u.why
            ));
        }
        for d in &self.refused {
            s.push_str(&format!("refused: {d}\n"));
        }
        for d in &self.deleted {
            s.push_str(&format!("deleted {d}\n"));
        }
        for k in &self.kept {
            s.push_str(&format!("kept {k}\n"));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("30m"), Ok(Duration::from_secs(1800)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(604800)));
        assert_eq!(parse_duration("15"), Ok(Duration::from_secs(15)));
        assert!(parse_duration("1w").is_err());
        assert!(parse_duration("-1s").is_err());
        assert!(parse_duration("").is_err());
    }
}
