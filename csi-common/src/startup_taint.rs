//! The startup taint `<driver>/agent-not-ready`. An operator registers
//! nodes with it (kubelet's `--register-with-taints`), so that the
//! scheduler sends no pod with a volume of the driver to a node before the
//! driver serves there: without it, a pod lands on a fresh node the moment
//! kubelet is ready, and its volume waits (or fails) until the node plugin
//! has started, and the scheduler counts the node as taking any number of
//! volumes until the driver's attach limit is published.
//!
//! The node plugin removes it, from its own node only, once kubelet has
//! registered the driver there (the node's CSINode lists it) and, for a
//! driver with an attach limit, published the limit (the CSINode entry's
//! `allocatable.count`). Nothing else of the node is touched: one JSON
//! patch that removes only taints of that key, each tested to be where it
//! was read.

use std::time::{Duration, Instant};

/// The suffix of every startup taint's key (the key is the driver's name
/// and this).
pub const TAINT_SUFFIX: &str = "/agent-not-ready";

/// Longest pause between two looks at the node (errors back off to it).
const MAX_PAUSE: Duration = Duration::from_secs(30);
/// How often a condition that stays the same is logged again.
const LOG_EVERY: Duration = Duration::from_secs(60);

/// The startup taint's key for `driver`.
pub fn taint_key(driver: &str) -> String {
    format!("{driver}{TAINT_SUFFIX}")
}

/// What the node plugin did about the taint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The node did not carry it when first read.
    NotTainted,
    /// Removed once the driver was registered, `waited` after the start.
    Removed { waited: Duration },
    /// Gone before the driver was registered: someone else removed it.
    RemovedByOthers,
}

/// Who removes the taint, and when the driver counts as registered.
#[derive(Debug, Clone)]
pub struct StartupTaint {
    pub client: kube_api::Client,
    pub node: String,
    pub driver: String,
    /// The driver reports an attach limit (NodeGetInfo's
    /// `max_volumes_per_node`): wait until kubelet published it too.
    pub wants_allocatable: bool,
    /// The first pause between two looks; errors double it up to 30 s.
    pub poll: Duration,
}

/// Why the driver does not count as registered on the node (of uid
/// `node_uid`) yet.
pub fn not_registered(
    csi_node: Option<&kube_api::CsiNode>,
    node_uid: &str,
    driver: &str,
    wants_allocatable: bool,
) -> Option<String> {
    let Some(csi_node) = csi_node else {
        return Some("kubelet has made no CSINode for the node yet".into());
    };
    // a CSINode left by an earlier node of that name (a replaced machine)
    // lists what that node had registered, not this one
    let owners: Vec<&str> = csi_node
        .metadata
        .owner_references
        .iter()
        .filter(|o| o.kind == "Node")
        .map(|o| o.uid.as_str())
        .collect();
    if !owners.is_empty() && !owners.contains(&node_uid) {
        return Some("the CSINode is an earlier node's of the same name".into());
    }
    let Some(entry) = csi_node.spec.drivers.iter().find(|d| d.name == driver) else {
        return Some(format!(
            "kubelet has not registered {driver} on the node yet"
        ));
    };
    let count = entry.allocatable.as_ref().and_then(|a| a.count);
    if wants_allocatable && count.is_none() {
        return Some(format!(
            "kubelet registered {driver} but has not published its attach limit yet"
        ));
    }
    None
}

/// Logs `what` when it differs from the last logged, or a minute later.
struct Quiet {
    last: Option<(String, Instant)>,
}

impl Quiet {
    fn should_log(&mut self, what: &str) -> bool {
        let again = match &self.last {
            Some((said, at)) => said != what || at.elapsed() >= LOG_EVERY,
            None => true,
        };
        if again {
            self.last = Some((what.to_string(), Instant::now()));
        }
        again
    }
}

impl StartupTaint {
    /// Looks until the taint is gone: removes it once the driver is
    /// registered; rides out API errors (a missing permission is logged
    /// with the apiserver's words, and tried again: a fixed RBAC or
    /// policy takes effect without a restart).
    pub async fn remove_when_registered(&self) -> Outcome {
        let key = taint_key(&self.driver);
        let started = Instant::now();
        let first_pause = self.poll.max(Duration::from_millis(50));
        let mut pause = first_pause;
        let mut quiet = Quiet { last: None };
        let mut first_look = true;
        loop {
            let wait = match self.step(&key).await {
                Ok(Step::Absent) if first_look => return Outcome::NotTainted,
                Ok(Step::Absent) => return Outcome::RemovedByOthers,
                Ok(Step::Removed) => {
                    let waited = started.elapsed();
                    tracing::info!(node = %self.node, taint = %key, ?waited,
                        "driver registered on the node: startup taint removed");
                    return Outcome::Removed { waited };
                }
                // read again soon (a test that keeps failing must not spin)
                Ok(Step::Changed) => first_pause,
                Ok(Step::Waiting(why)) => {
                    if quiet.should_log(&why) {
                        tracing::info!(node = %self.node, taint = %key, reason = %why,
                            "startup taint kept");
                    }
                    pause = first_pause;
                    pause
                }
                Err(e) => {
                    let why = e.to_string();
                    if quiet.should_log(&why) {
                        tracing::warn!(node = %self.node, taint = %key, error = %why,
                            "cannot look at or remove the startup taint; trying again");
                    }
                    pause = (pause * 2).min(MAX_PAUSE);
                    pause
                }
            };
            first_look = false;
            tokio::time::sleep(wait).await;
        }
    }

    async fn step(&self, key: &str) -> kube_api::Result<Step> {
        let Some(node) = self.client.get_node(&self.node).await? else {
            return Ok(Step::Waiting(format!(
                "the API knows no node {:?} yet",
                self.node
            )));
        };
        if !node.spec.taints.iter().any(|t| t.key == key) {
            return Ok(Step::Absent);
        }
        let csi_node = self.client.get_csi_node(&self.node).await?;
        if let Some(why) = not_registered(
            csi_node.as_ref(),
            &node.metadata.uid,
            &self.driver,
            self.wants_allocatable,
        ) {
            return Ok(Step::Waiting(why));
        }
        match self.client.remove_node_taints(&node, key).await {
            Ok(_) => Ok(Step::Removed),
            // the node changed between the read and the patch (a `test`
            // failed, or a conflict): read it again
            Err(e) if matches!(e.status(), Some(409 | 422)) => Ok(Step::Changed),
            Err(e) => Err(e),
        }
    }
}

enum Step {
    Absent,
    Removed,
    Changed,
    Waiting(String),
}

/// Starts the removal in the background when the plugin runs in a pod
/// that can ask the API (NODE_NAME and a service account token);
/// otherwise says why not.
pub fn spawn(driver: &str, wants_allocatable: bool) {
    let Ok(node) = std::env::var("NODE_NAME") else {
        tracing::info!("NODE_NAME is not set: the startup taint is not looked after");
        return;
    };
    let client = match kube_api::Client::in_cluster() {
        Ok(c) => c,
        Err(e) => {
            tracing::info!(error = %e, "no Kubernetes API credentials: the startup taint is not looked after");
            return;
        }
    };
    let job = StartupTaint {
        client,
        node,
        driver: driver.to_string(),
        wants_allocatable,
        poll: Duration::from_secs(1),
    };
    tokio::spawn(async move {
        let outcome = job.remove_when_registered().await;
        tracing::debug!(?outcome, "startup taint looked after");
    });
}
