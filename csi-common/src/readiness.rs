//! Readiness: a controller is ready once every configured cloud has
//! accepted its credentials, a node once it has read its instance
//! metadata. Both are retried in the background with backoff, so a plugin
//! started before Keystone or the metadata service answers becomes ready
//! on its own.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use openstack_client::Session;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    Starting,
    Ready,
    /// The last attempt failed; it is retried.
    Failing(String),
}

#[derive(Debug, Clone)]
pub struct Readiness {
    state: Arc<Mutex<State>>,
    /// A view that counts a failed attempt as ready (see
    /// [`Readiness::once_tried`]).
    failing_is_ready: bool,
}

impl Default for Readiness {
    fn default() -> Self {
        Self {
            state: Arc::new(Mutex::new(State::Starting)),
            failing_is_ready: false,
        }
    }
}

impl Readiness {
    /// Already ready (nothing to wait for).
    pub fn ready() -> Self {
        Self {
            state: Arc::new(Mutex::new(State::Ready)),
            failing_is_ready: false,
        }
    }

    /// The same part, ready once its first attempt has ended, whether it
    /// succeeded or failed (retries go on behind it). For what a process
    /// may serve without: a plugin that serves what it waits for once
    /// it is there, and answers Unavailable until then.
    pub fn once_tried(&self) -> Self {
        Self {
            state: self.state.clone(),
            failing_is_ready: true,
        }
    }

    pub fn state(&self) -> State {
        let s = self.state.lock().unwrap_or_else(|p| p.into_inner()).clone();
        match s {
            State::Failing(_) if self.failing_is_ready => State::Ready,
            s => s,
        }
    }

    fn set(&self, s: State) {
        *self.state.lock().unwrap_or_else(|p| p.into_inner()) = s;
    }

    /// Authenticates every session, retrying failures with backoff
    /// (0.5 s doubling to 30 s).
    pub fn watch_clouds(&self, sessions: Vec<(String, Session)>) {
        let this = self.clone();
        tokio::spawn(async move {
            let mut delay = Duration::from_millis(500);
            loop {
                let mut failure = None;
                for (name, s) in &sessions {
                    if let Err(e) = s.authenticate().await {
                        let label = if name.is_empty() {
                            "[Global]".to_string()
                        } else {
                            format!("cloud {name:?}")
                        };
                        failure = Some(format!("{label}: {e}"));
                        break;
                    }
                }
                match failure {
                    None => {
                        tracing::info!("every cloud accepted its credentials: ready");
                        this.set(State::Ready);
                        return;
                    }
                    Some(reason) => {
                        tracing::warn!(%reason, retry_in_ms = delay.as_millis() as u64, "cloud not reachable yet");
                        this.set(State::Failing(reason));
                    }
                }
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(30));
            }
        });
    }
}

impl Readiness {
    /// Reads instance metadata (retried with backoff) into `slot`; ready
    /// once it has been read. The node's identity does not change while
    /// the instance lives, so it is read once.
    pub fn watch_metadata(
        &self,
        reader: openstack_client::metadata::MetadataReader,
        slot: std::sync::Arc<std::sync::RwLock<Option<crate::node_ops::NodeIdentity>>>,
    ) {
        let this = self.clone();
        tokio::spawn(async move {
            let mut delay = Duration::from_millis(500);
            loop {
                match reader.read().await {
                    Ok(m) => {
                        tracing::info!(instance = %m.uuid, zone = %m.availability_zone, "instance metadata read: ready");
                        *slot.write().unwrap_or_else(|p| p.into_inner()) =
                            Some(crate::node_ops::NodeIdentity {
                                instance_id: m.uuid,
                                availability_zone: m.availability_zone,
                            });
                        this.set(State::Ready);
                        return;
                    }
                    Err(e) => {
                        let reason = format!("instance metadata: {e}");
                        tracing::warn!(%reason, retry_in_ms = delay.as_millis() as u64, "node identity not known yet");
                        this.set(State::Failing(reason));
                    }
                }
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(30));
            }
        });
    }

    /// Ready when every part is; otherwise the first part's reason.
    pub fn all(parts: &[Readiness]) -> State {
        for p in parts {
            match p.state() {
                State::Ready => continue,
                other => return other,
            }
        }
        State::Ready
    }
}

impl Readiness {
    /// The Identity service's Probe: ready when every part is.
    pub fn probe(parts: Vec<Readiness>) -> plugin_runtime::csi_identity::ProbeFn {
        Arc::new(move || {
            let s = Readiness::all(&parts);
            Box::pin(async move { Ok(matches!(s, State::Ready)) })
        })
    }

    /// `/healthz`: healthy unless a part is failing (starting is healthy:
    /// a liveness probe must not kill a plugin waiting for its cloud).
    pub fn health(parts: Vec<Readiness>) -> plugin_runtime::HealthCheck {
        Arc::new(move || {
            let s = Readiness::all(&parts);
            Box::pin(async move {
                match s {
                    State::Ready | State::Starting => Ok(None),
                    State::Failing(reason) => Err(reason),
                }
            })
        })
    }
}

/// The node's identity slot, filled from instance metadata in the
/// background (see [`Readiness::watch_metadata`]).
pub type IdentitySlot = Arc<std::sync::RwLock<Option<crate::node_ops::NodeIdentity>>>;

impl Readiness {
    /// Starts reading the node's identity (`[Metadata]` search order; the
    /// metadata service at `service_url`); ready once it is known.
    pub fn node_identity(
        metadata: openstack_client::config::MetadataOptions,
        service_url: url::Url,
    ) -> (Readiness, IdentitySlot) {
        let mut reader = openstack_client::metadata::MetadataReader::new(metadata);
        reader.service_url = service_url;
        let slot: IdentitySlot = Arc::new(std::sync::RwLock::new(None));
        let r = Readiness::default();
        r.watch_metadata(reader, slot.clone());
        (r, slot)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_part_once_tried_is_ready_after_its_first_attempt_failed_and_the_part_itself_is_not() {
        let part = Readiness::default();
        let once_tried = part.once_tried();
        assert_eq!(once_tried.state(), State::Starting, "not tried yet");
        part.set(State::Failing("no instance metadata".into()));
        assert_eq!(part.state(), State::Failing("no instance metadata".into()));
        assert_eq!(once_tried.state(), State::Ready);
        assert_eq!(
            Readiness::all(&[Readiness::ready(), once_tried.clone()]),
            State::Ready
        );
        assert_eq!(
            Readiness::all(&[Readiness::default(), once_tried]),
            State::Starting,
            "the other parts still count"
        );
    }
}
