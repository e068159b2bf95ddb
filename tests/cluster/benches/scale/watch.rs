//! Kubernetes' side of the scale bench, watched: each change of a kind as
//! the apiserver reports it.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use cluster_tests::Cluster;

use super::TIMEOUT;

/// What the apiserver reports of `kind` (in `ns`; cluster-scoped kinds
/// ignore it), each change as it comes with the time since `started`: one
/// long-lived `kubectl get --watch` per kind. Polling with a kubectl
/// process four times a second per kind took a large share of this
/// machine's two cores away from the cluster it measured, while the
/// direct client's polls cost next to nothing.
pub(super) struct Watch {
    pub(super) events: tokio::sync::mpsc::UnboundedReceiver<Change>,
    child: std::process::Child,
}

/// One change of a watched object.
pub(super) struct Change {
    pub(super) at: Duration,
    pub(super) deleted: bool,
    pub(super) object: serde_json::Value,
}

impl Watch {
    pub(super) fn start(c: &Cluster, kind: &str, ns: &str, started: Instant) -> Self {
        let mut child = std::process::Command::new("kubectl")
            .arg(format!("--kubeconfig={}", c.kubeconfig.display()))
            .args([
                "get",
                kind,
                "-n",
                ns,
                "--watch",
                "--output-watch-events",
                "-o",
                "json",
            ])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, events) = tokio::sync::mpsc::unbounded_channel();
        // kubectl writes one JSON event after another
        std::thread::spawn(move || {
            for event in serde_json::Deserializer::from_reader(std::io::BufReader::new(stdout))
                .into_iter::<serde_json::Value>()
                .map_while(Result::ok)
            {
                let change = Change {
                    at: started.elapsed(),
                    deleted: event["type"] == "DELETED",
                    object: event["object"].clone(),
                };
                if tx.send(change).is_err() {
                    break;
                }
            }
        });
        Self { events, child }
    }

    /// The next change, or None once `deadline` passed.
    pub(super) async fn next(&mut self, deadline: Instant) -> Option<Change> {
        let left = deadline.saturating_duration_since(Instant::now());
        tokio::time::timeout(left, self.events.recv())
            .await
            .ok()
            .flatten()
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(super) fn name_of(o: &serde_json::Value) -> String {
    o["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// The time since `started` at which each of `n` objects of `kind` in
/// `ns` was first seen `ready`, by name (as the apiserver reported it).
pub(super) async fn ready_times(
    c: &Cluster,
    kind: &str,
    ns: &str,
    n: usize,
    started: Instant,
    ready: impl Fn(&serde_json::Value) -> bool,
) -> BTreeMap<String, Duration> {
    let mut watch = Watch::start(c, kind, ns, started);
    let deadline = started + TIMEOUT;
    let mut seen: BTreeMap<String, Duration> = BTreeMap::new();
    while seen.len() < n {
        let Some(change) = watch.next(deadline).await else {
            panic!("{} of {n} {kind} ready", seen.len());
        };
        if !change.deleted && ready(&change.object) {
            seen.entry(name_of(&change.object)).or_insert(change.at);
        }
    }
    seen
}
