//! A server's attach slots (`[BlockStorage] node-volume-attach-limit`).
//! What a server holds is counted from one listing of it (its own disks
//! and its volume attachments in Nova) shared by every publish that was
//! waiting when it started, or begun less than [`LISTING_REUSED_FOR`]
//! ago, plus the attaches this controller asked for that a listing may not
//! show yet. A slot is taken under a lock held for no network call:
//! publishes to one server list it once per burst and attach side by side,
//! and two of them never both take a last slot. A listing reused can only
//! count too much (a detach since), never too little of what this
//! controller did: a publish it would refuse lists the server afresh first.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use csi_common::{Context, DriverError, DriverResult};
use openstack_client::nova::Compute;

/// At most this many servers are kept track of; idle ones are forgotten
/// first (a caller naming servers that do not exist grows nothing).
const MAX_SERVERS: usize = 10_000;

/// How long a listing of a server serves later publishes. The attach-
/// detach controller sends an attach wave's publishes over a few seconds;
/// each found the last listing done and listed the server again (15
/// listings, two Nova calls each, for 24 publishes onto three servers,
/// each 1.2 s at a busy Nova API in the scale bench's wave).
const LISTING_REUSED_FOR: Duration = Duration::from_secs(5);

/// One listing of a server.
#[derive(Debug, Clone)]
struct Listing {
    started: Instant,
    volumes: HashSet<String>,
    local_disks: u32,
}

#[derive(Debug, Default)]
struct Ledger {
    /// The newest listing.
    listing: Option<Listing>,
    /// Listings begun, and done; one is in flight when they differ, begun
    /// at `in_flight_started`.
    listings_begun: u64,
    listings_done: u64,
    in_flight_started: Option<Instant>,
    /// The attaches this controller asked Nova for here: None while the
    /// request is on its way, else when it ended (a listing that started
    /// later shows it, if it was done).
    requested: HashMap<String, Option<Instant>>,
}

#[derive(Debug, Default)]
struct ServerSlots {
    ledger: Mutex<Ledger>,
    /// One listing of the server at a time: those who waited on it use it.
    listing: tokio::sync::Mutex<()>,
}

impl ServerSlots {
    fn ledger(&self) -> MutexGuard<'_, Ledger> {
        self.ledger.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[derive(Debug, Clone, Default)]
pub struct AttachSlots {
    servers: Arc<Mutex<HashMap<String, Arc<ServerSlots>>>>,
}

/// A slot taken for an attach: [`Slot::requested`] once the attach was
/// asked for (or may have been: an answer lost); dropped otherwise, it is
/// given back.
#[derive(Debug)]
pub struct Slot {
    server: Arc<ServerSlots>,
    volume: String,
    requested: bool,
    /// What the ledger held for the volume before (an earlier call's
    /// attach, asked for and not listed yet): restored when this slot is
    /// given back.
    before: Option<Option<Instant>>,
}

impl Slot {
    /// The attach was asked for: the slot stays taken until a listing
    /// that started after now shows what Nova did.
    pub fn requested(mut self) {
        self.server
            .ledger()
            .requested
            .insert(self.volume.clone(), Some(Instant::now()));
        self.requested = true;
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if !self.requested {
            let mut ledger = self.server.ledger();
            match self.before.take() {
                Some(before) => {
                    ledger.requested.insert(self.volume.clone(), before);
                }
                None => {
                    ledger.requested.remove(&self.volume);
                }
            }
        }
    }
}

impl AttachSlots {
    fn server(&self, server: &str) -> Arc<ServerSlots> {
        let mut servers = self.servers.lock().unwrap_or_else(|p| p.into_inner());
        if servers.len() >= MAX_SERVERS && !servers.contains_key(server) {
            servers.retain(|_, s| Arc::strong_count(s) > 1 || !s.ledger().requested.is_empty());
        }
        servers.entry(server.to_string()).or_default().clone()
    }

    /// A slot on `server` for `volume`, if what the server holds (its own
    /// disks, its attachments, the attaches asked for here) leaves one
    /// below `limit`; ResourceExhausted otherwise.
    pub async fn take(
        &self,
        compute: &Compute,
        server: &str,
        volume: &str,
        limit: i64,
    ) -> DriverResult<Slot> {
        let slots = self.server(server);
        let asked = Instant::now();
        Self::list(&slots, compute, server, None).await?;
        match Self::count(&slots, server, volume, limit) {
            Err(DriverError::ResourceExhausted(_)) if !Self::listed_since(&slots, asked) => {
                // a reused listing may still show what was detached since:
                // refused only on what the server holds now
                Self::list(&slots, compute, server, Some(asked)).await?;
                Self::count(&slots, server, volume, limit)
            }
            counted => counted,
        }
    }

    /// Lists `server` unless a listing is in flight or recent, or this
    /// controller asked Nova to attach `volume` there since the last one
    /// (the external attacher asks again once its cache shows the attach:
    /// that publish needs no slot): a publish runs it beside its read of
    /// the volume, so that an attach that needs a slot does not wait for
    /// one call after the other. A failure is left for
    /// [`AttachSlots::take`], which lists again and says why.
    pub async fn prefetch(&self, compute: &Compute, server: &str, volume: &str) {
        if self.asked_here(server, volume) {
            return;
        }
        let slots = self.server(server);
        let _ = Self::list(&slots, compute, server, None).await;
    }

    /// Whether this controller asked Nova to attach `volume` to `server`
    /// (and Nova answered) since the server's newest listing began.
    pub fn asked_here(&self, server: &str, volume: &str) -> bool {
        let servers = self.servers.lock().unwrap_or_else(|p| p.into_inner());
        servers.get(server).is_some_and(|s| {
            let l = s.ledger();
            let since = l.listing.as_ref().map(|x| x.started);
            matches!(l.requested.get(volume), Some(Some(ended)) if since.is_none_or(|t| *ended >= t))
        })
    }

    /// Whether the newest listing began at or after `since`.
    fn listed_since(slots: &ServerSlots, since: Instant) -> bool {
        slots
            .ledger()
            .listing
            .as_ref()
            .is_some_and(|l| l.started >= since)
    }

    /// Brings the server's listing up to date: the one in flight (if it
    /// began at or after `since`, when given), else the newest if it began
    /// less than [`LISTING_REUSED_FOR`] ago (and at or after `since`), else
    /// a new one. Any listing is good for the count: the attaches asked for
    /// since it began are counted from the ledger.
    async fn list(
        slots: &ServerSlots,
        compute: &Compute,
        server: &str,
        since: Option<Instant>,
    ) -> DriverResult<()> {
        let wanted = {
            let l = slots.ledger();
            let recent = l.listing.as_ref().is_some_and(|x| {
                x.started.elapsed() < LISTING_REUSED_FOR
                    && since.is_none_or(|since| x.started >= since)
            });
            let in_flight = l.listings_begun > l.listings_done
                && since.is_none_or(|since| l.in_flight_started.is_some_and(|t| t >= since));
            if in_flight {
                l.listings_begun
            } else if recent {
                l.listings_done
            } else {
                l.listings_begun.max(l.listings_done) + 1
            }
        };
        let _one = slots.listing.lock().await;
        if slots.ledger().listings_done >= wanted {
            return Ok(());
        }
        let started = Instant::now();
        {
            let mut l = slots.ledger();
            l.listings_begun = wanted;
            l.in_flight_started = Some(started);
        }
        // side by side: neither needs the other
        let (found, attachments) = tokio::join!(
            compute.get_server(server),
            compute.list_volume_attachments(server)
        );
        let found = found.context(format!("node {server}"))?;
        let volumes = attachments
            .context(format!("volume attachments of node {server}"))?
            .into_iter()
            .map(|a| a.volume_id)
            .collect();
        let mut l = slots.ledger();
        l.listing = Some(Listing {
            started,
            volumes,
            local_disks: found.local_disks(),
        });
        l.listings_done = wanted;
        Ok(())
    }

    /// Takes a slot by the newest listing and the ledger, or refuses.
    fn count(
        slots: &Arc<ServerSlots>,
        server: &str,
        volume: &str,
        limit: i64,
    ) -> DriverResult<Slot> {
        let mut ledger = slots.ledger();
        let Some(listing) = ledger.listing.clone() else {
            return Err(DriverError::Internal(format!(
                "no listing of node {server}"
            )));
        };
        // what a listing that started after the request ended shows
        // already, or never will
        ledger
            .requested
            .retain(|_, ended| ended.is_none_or(|t| t >= listing.started));
        let held: HashSet<&str> = listing
            .volumes
            .iter()
            .map(String::as_str)
            .chain(ledger.requested.keys().map(String::as_str))
            .filter(|v| *v != volume)
            .collect();
        let attached = held.len() as i64;
        let disks = attached + i64::from(listing.local_disks);
        if disks >= limit {
            return Err(DriverError::ResourceExhausted(format!(
                "node {server} has {disks} disks ({attached} volumes and {} of its own) of the {limit} it takes ([BlockStorage] node-volume-attach-limit): volume {volume} is not attached",
                listing.local_disks
            )));
        }
        let before = ledger.requested.insert(volume.to_string(), None);
        drop(ledger);
        Ok(Slot {
            server: slots.clone(),
            volume: volume.to_string(),
            requested: false,
            before,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(server: &Arc<ServerSlots>, volume: &str) -> Slot {
        let before = server.ledger().requested.insert(volume.into(), None);
        Slot {
            server: server.clone(),
            volume: volume.into(),
            requested: false,
            before,
        }
    }

    #[test]
    fn a_slot_given_back_leaves_what_was_there_before() {
        let server = Arc::new(ServerSlots::default());
        // given back: nothing counted for the volume any more
        drop(slot(&server, "v1"));
        assert!(server.ledger().requested.is_empty());
        // asked for: counted until a later listing shows it
        slot(&server, "v1").requested();
        assert!(matches!(server.ledger().requested.get("v1"), Some(Some(_))));
        // a retry's slot given back keeps the earlier attach counted
        drop(slot(&server, "v1"));
        assert!(
            matches!(server.ledger().requested.get("v1"), Some(Some(_))),
            "the earlier attach, which may have landed, still counts"
        );
    }
}
