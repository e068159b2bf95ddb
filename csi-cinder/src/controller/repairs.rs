//! What Cinder says that nobody will ever finish or release, found and
//! repaired before an attach or a detach: an attachment of a server that
//! was deleted (Nova's record of its actions says so: a 404 alone is also
//! what a project member gets for another project's live server, which is
//! never taken for a deleted one), one Cinder calls attached but Nova
//! never made, a
//! reservation older than `--stuck-attachment-secs` that Nova forgot,
//! and a detach that never completed. What only an operator can repair
//! (a reservation Nova still lists, its host never finishing) is refused
//! with an error naming the server, the state and for how long.
//!
//! Seen by operators as `cinder_csi_attachment_repairs_total{kind}`,
//! `cinder_csi_attachments_pending{operation}` and
//! `cinder_csi_attachment_wait_seconds{operation}`.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use csi_common::request::timestamp;
use csi_common::{Context, DriverError, DriverResult};
use openstack_client::cinder::{AttachStatus, BlockStorage, Volume, VolumeStatus};
use openstack_client::nova::Compute;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use super::ControllerService;

/// What was repaired.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Repair {
    /// An attachment of a server Nova no longer has.
    ServerGone,
    /// Cinder called the volume attached to the node; Nova had no record.
    AttachedWithoutNova,
    /// A reservation past the bound that Nova no longer lists.
    StaleReservation,
    /// A detach past the bound, asked again.
    DetachRetried,
}

impl Repair {
    const ALL: [Repair; 4] = [
        Repair::ServerGone,
        Repair::AttachedWithoutNova,
        Repair::StaleReservation,
        Repair::DetachRetried,
    ];

    fn label(self) -> &'static str {
        match self {
            Repair::ServerGone => "server_gone",
            Repair::AttachedWithoutNova => "attached_without_nova",
            Repair::StaleReservation => "stale_reservation",
            Repair::DetachRetried => "detach_retried",
        }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OperationLabel {
    operation: &'static str,
}

/// Cheap to clone: every clone feeds the same series.
#[derive(Debug, Clone)]
pub struct AttachmentMetrics {
    repairs: Family<KindLabel, Counter>,
    pending: Family<OperationLabel, Gauge>,
    waits: Family<OperationLabel, Histogram, fn() -> Histogram>,
}

impl Default for AttachmentMetrics {
    fn default() -> Self {
        fn histogram() -> Histogram {
            // 0.5 s .. ~68 min
            Histogram::new(exponential_buckets(0.5, 2.0, 14))
        }
        Self {
            repairs: Family::default(),
            pending: Family::default(),
            waits: Family::new_with_constructor(histogram),
        }
    }
}

impl AttachmentMetrics {
    pub fn register(&self, registry: &mut Registry) {
        for r in Repair::ALL {
            let _ = self.repairs.get_or_create(&KindLabel { kind: r.label() });
        }
        for operation in ["attach", "detach"] {
            let _ = self.pending.get_or_create(&OperationLabel { operation });
            // an empty family is not served at all: its series from the start
            let _ = self.waits.get_or_create(&OperationLabel { operation });
        }
        registry.register(
            "cinder_csi_attachment_repairs",
            "Attachments repaired, by kind: server_gone, attached_without_nova, stale_reservation, detach_retried",
            self.repairs.clone(),
        );
        registry.register(
            "cinder_csi_attachments_pending",
            "Attaches and detaches waiting on Cinder and Nova now",
            self.pending.clone(),
        );
        registry.register(
            "cinder_csi_attachment_wait_seconds",
            "How long an attach or a detach waited on Cinder and Nova",
            self.waits.clone(),
        );
    }

    fn repaired(&self, r: Repair) {
        self.repairs
            .get_or_create(&KindLabel { kind: r.label() })
            .inc();
    }

    /// Counts a wait as pending until the guard drops, then records how
    /// long it took.
    pub fn waiting(&self, operation: &'static str) -> PendingWait {
        let label = OperationLabel { operation };
        self.pending.get_or_create(&label).inc();
        PendingWait {
            metrics: self.clone(),
            label,
            since: Instant::now(),
        }
    }
}

#[derive(Debug)]
pub struct PendingWait {
    metrics: AttachmentMetrics,
    label: OperationLabel,
    since: Instant,
}

impl Drop for PendingWait {
    fn drop(&mut self) {
        self.metrics.pending.get_or_create(&self.label).dec();
        self.metrics
            .waits
            .get_or_create(&self.label)
            .observe(self.since.elapsed().as_secs_f64());
    }
}

/// How long the volume has been in its status (Cinder's `updated_at`),
/// by Cinder's own clock (the `Date` of the answer it came in): a node's
/// clock off from Cinder's would otherwise repair a live attach or detach
/// (behind) or never repair a stuck one (ahead). The local clock only
/// where Cinder did not say. None when Cinder does not say when.
fn in_status_for(v: &Volume) -> Option<Duration> {
    let t = timestamp(v.updated_at.as_deref())?;
    let since = UNIX_EPOCH + Duration::from_secs(u64::try_from(t.seconds).ok()?);
    let now = v.read_at.unwrap_or_else(SystemTime::now);
    Some(now.duration_since(since).unwrap_or_default())
}

/// What Nova shows these credentials of a server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ServerPresence {
    /// Nova answers it.
    Present,
    /// Deleted: Nova's own record of its actions (which it keeps for
    /// deleted servers, for their project) ends in a delete.
    Gone,
    /// Nova answers 404 and shows no action of it: another project's
    /// server (Nova answers a project member so for a live server), or one
    /// deleted and since archived. Nothing proves it gone, so nothing that
    /// holds it is released: a live server keeps its disk.
    NotVisible,
}

async fn server_presence(compute: &Compute, server: &str) -> DriverResult<ServerPresence> {
    match compute.get_server(server).await {
        Ok(_) => return Ok(ServerPresence::Present),
        Err(e) if e.is_not_found() => {}
        Err(e) => return Err(e).context(format!("server {server}")),
    }
    match compute.list_instance_actions(server).await {
        Ok(actions) if actions.iter().any(|a| a.action == "delete") => Ok(ServerPresence::Gone),
        Ok(_) => Ok(ServerPresence::NotVisible),
        Err(e) if e.is_not_found() => Ok(ServerPresence::NotVisible),
        Err(e) => Err(e).context(format!("actions of server {server}")),
    }
}

/// What Nova says of the volume on a server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NovaRecord {
    Lists,
    DoesNotList,
    ServerGone,
    ServerNotVisible,
}

async fn nova_record(compute: &Compute, server: &str, volume: &str) -> DriverResult<NovaRecord> {
    match compute.list_volume_attachments(server).await {
        Ok(atts) if atts.iter().any(|a| a.volume_id == volume) => Ok(NovaRecord::Lists),
        Ok(_) => Ok(NovaRecord::DoesNotList),
        Err(e) if e.is_not_found() => Ok(match server_presence(compute, server).await? {
            // found on a second look: as if Nova had listed it (nothing
            // is released on an answer that changed under us)
            ServerPresence::Present => NovaRecord::Lists,
            ServerPresence::Gone => NovaRecord::ServerGone,
            ServerPresence::NotVisible => NovaRecord::ServerNotVisible,
        }),
        Err(e) => Err(e).context(format!("volume attachments of server {server}")),
    }
}

/// Why nothing is released for a server these credentials cannot see.
fn not_visible(volume: &str, server: &str, attachment: &str, what: &str) -> DriverError {
    DriverError::FailedPrecondition(format!(
        "volume {volume} {what} server {server} (Cinder attachment {attachment}), which Nova does not show these credentials: another project's server, or one deleted and archived since. It may be live and writing, so it is left as it is: an operator who knows the server is gone deletes the attachment (openstack volume attachment delete {attachment}), else detaches it from that server"
    ))
}

impl ControllerService {
    fn stuck(&self, v: &Volume) -> Option<Duration> {
        in_status_for(v).filter(|age| *age >= self.opts.stuck_after)
    }

    fn repaired(&self, r: Repair, volume: &str, server: &str, what: &str) {
        tracing::warn!(volume_id = volume, server, repair = r.label(), "{what}");
        self.metrics.repaired(r);
    }

    async fn delete_attachment(&self, block: &BlockStorage, id: &str) -> DriverResult<()> {
        match block.delete_attachment(id).await {
            Ok(()) => Ok(()),
            Err(e) if e.is_not_found() => Ok(()),
            Err(e) => Err(e).context(format!("deleting Cinder attachment {id}")),
        }
    }

    /// Before attaching `v` to `node`: repairs what would keep the attach
    /// from ever succeeding; answers the volume as it is afterwards.
    pub(super) async fn repair_before_attach(
        &self,
        block: &BlockStorage,
        compute: &Compute,
        v: Volume,
        node: &str,
    ) -> DriverResult<Volume> {
        let id = v.id.clone();
        let mut changed = false;
        for a in &v.attachments {
            let (Some(server), Some(att)) = (a.server_id.as_deref(), a.attachment_id.as_deref())
            else {
                continue;
            };
            if server == node {
                // asked of Nova by this controller since the server's last
                // listing: Nova's own (the external attacher asking again
                // once its cache shows the attach, a call per publish saved)
                if self.slots.asked_here(node, &id) {
                    continue;
                }
                // Cinder says attached here: Nova must say so too, or the
                // node would wait for a disk that never comes
                match nova_record(compute, node, &id).await? {
                    NovaRecord::Lists => {}
                    NovaRecord::DoesNotList => {
                        self.delete_attachment(block, att).await?;
                        self.repaired(
                            Repair::AttachedWithoutNova,
                            &id,
                            server,
                            "Cinder called the volume attached to this node, Nova had no record of it: Cinder's attachment deleted, attaching anew",
                        );
                        changed = true;
                    }
                    NovaRecord::ServerGone => {
                        self.delete_attachment(block, att).await?;
                        self.repaired(
                            Repair::ServerGone,
                            &id,
                            server,
                            "the volume was attached to this node's server, which was deleted: Cinder's attachment deleted",
                        );
                        changed = true;
                    }
                    // the attach itself answers what Nova says of the node
                    NovaRecord::ServerNotVisible => {}
                }
                continue;
            }
            match server_presence(compute, server).await? {
                ServerPresence::Present => {}
                ServerPresence::Gone => {
                    self.delete_attachment(block, att).await?;
                    self.repaired(
                        Repair::ServerGone,
                        &id,
                        server,
                        "the volume was attached to a server that was deleted: Cinder's attachment deleted",
                    );
                    changed = true;
                }
                ServerPresence::NotVisible if v.multiattach => {
                    tracing::warn!(
                        volume_id = %id,
                        server,
                        attachment = att,
                        "the volume is also attached to a server Nova does not show these credentials: left as it is"
                    );
                }
                ServerPresence::NotVisible => {
                    return Err(not_visible(&id, server, att, "is attached to"));
                }
            }
        }
        if matches!(v.status, VolumeStatus::Reserved | VolumeStatus::Attaching)
            && let Some(age) = self.stuck(&v)
        {
            changed |= self
                .release_stale_reservations(block, compute, &v, age, None)
                .await?;
        }
        if !changed {
            return Ok(v);
        }
        block.get_volume(&id).await.context(format!("volume {id}"))
    }

    /// Deletes the volume's reservations (of `only_for`, else of any
    /// server) that Nova no longer lists; a reservation Nova still lists
    /// is refused, naming the server. Answers whether one was deleted.
    async fn release_stale_reservations(
        &self,
        block: &BlockStorage,
        compute: &Compute,
        v: &Volume,
        age: Duration,
        only_for: Option<&str>,
    ) -> DriverResult<bool> {
        let id = &v.id;
        let pending: Vec<_> = block
            .volume_attachments(id)
            .await
            .context(format!("Cinder attachments of volume {id}"))?
            .into_iter()
            .filter(|a| matches!(a.status, AttachStatus::Reserved | AttachStatus::Attaching))
            .filter(|a| only_for.is_none_or(|n| a.instance.as_deref() == Some(n)))
            .collect();
        let mut released = false;
        for a in pending {
            let server = a.instance.clone().unwrap_or_default();
            let record = if server.is_empty() {
                NovaRecord::DoesNotList
            } else {
                nova_record(compute, &server, id).await?
            };
            if record == NovaRecord::ServerNotVisible {
                return Err(not_visible(
                    id,
                    &server,
                    &a.id,
                    &format!("has been {} for {}s for", v.status, age.as_secs()),
                ));
            }
            if record == NovaRecord::Lists {
                return Err(DriverError::FailedPrecondition(format!(
                    "volume {id} has been {} for {}s for server {server} (Cinder attachment {}), and Nova still lists it on that server: its compute host never finished the attach. An operator must remove Nova's record (openstack server remove volume {server} {id}) or restart that host",
                    v.status,
                    age.as_secs(),
                    a.id
                )));
            }
            self.delete_attachment(block, &a.id).await?;
            self.repaired(
                Repair::StaleReservation,
                id,
                &server,
                &format!(
                    "the volume was {} for {}s and Nova no longer lists it: Cinder attachment {} deleted",
                    v.status,
                    age.as_secs(),
                    a.id
                ),
            );
            released = true;
        }
        Ok(released)
    }

    /// After Nova answered a detach with "no such server or attachment":
    /// Cinder's records for the node are all that still hold the volume (a
    /// server gone, or an attachment Nova never made; Nova deletes Cinder's
    /// attachment before its own record when it detaches), and they are
    /// deleted.
    pub(super) async fn release_what_nova_forgot(
        &self,
        block: &BlockStorage,
        compute: &Compute,
        id: &str,
        node: &str,
    ) -> DriverResult<()> {
        let ours: Vec<String> = block
            .volume_attachments(id)
            .await
            .context(format!("Cinder attachments of volume {id}"))?
            .into_iter()
            .filter(|a| a.instance.as_deref() == Some(node))
            .map(|a| a.id)
            .collect();
        if ours.is_empty() {
            return Ok(());
        }
        let (kind, what) = match server_presence(compute, node).await? {
            ServerPresence::Present => (
                Repair::AttachedWithoutNova,
                "Cinder had the volume attached to this server, Nova had no record of it: Cinder's attachment deleted",
            ),
            ServerPresence::Gone => (
                Repair::ServerGone,
                "the server was deleted: its Cinder attachments deleted",
            ),
            ServerPresence::NotVisible => {
                return Err(not_visible(id, node, &ours.join(", "), "is attached to"));
            }
        };
        for att in &ours {
            self.delete_attachment(block, att).await?;
        }
        self.repaired(kind, id, node, what);
        Ok(())
    }

    /// Before detaching `v` from `node`. Answers Some(()) when nothing is
    /// left to detach through Nova (only a stale reservation was there),
    /// None when the detach goes on.
    pub(super) async fn repair_before_detach(
        &self,
        block: &BlockStorage,
        compute: &Compute,
        v: &Volume,
        node: &str,
        attached_here: bool,
    ) -> DriverResult<Option<()>> {
        let id = &v.id;
        if !attached_here {
            if matches!(v.status, VolumeStatus::Reserved | VolumeStatus::Attaching) {
                let pending_here = block
                    .volume_attachments(id)
                    .await
                    .context(format!("Cinder attachments of volume {id}"))?
                    .iter()
                    .any(|a| {
                        a.instance.as_deref() == Some(node)
                            && matches!(a.status, AttachStatus::Reserved | AttachStatus::Attaching)
                    });
                if pending_here {
                    if let Some(age) = self.stuck(v) {
                        self.release_stale_reservations(block, compute, v, age, Some(node))
                            .await?;
                        return Ok(Some(()));
                    }
                    return Err(DriverError::Unavailable(format!(
                        "volume {id} is being attached to {node} ({}): it is detached once that ends",
                        v.status
                    )));
                }
            }
            return Ok(Some(()));
        }
        if v.status == VolumeStatus::Detaching
            && let Some(age) = self.stuck(v)
        {
            block
                .roll_detaching(id)
                .await
                .context(format!("rolling back the detach of volume {id}"))?;
            self.repaired(
                Repair::DetachRetried,
                id,
                node,
                &format!(
                    "the volume was detaching for {}s: the detach is asked again",
                    age.as_secs()
                ),
            );
        }
        Ok(None)
    }
}
