//! `hypervisor-agent`: watches the volume attachments of the given servers
//! in a real OpenStack whose Nova uses the fake virt driver (which attaches
//! nothing), and materialises every attached volume as a loop device linked
//! as `<by-id-dir>/virtio-<id[:20]>`, the way a KVM guest sees it: created
//! on attach, grown on extend, removed on detach; the data stays until the
//! volume is deleted. Everything is removed again on SIGTERM/SIGINT.
//! Needs root.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use openstack_client::cinder::BlockStorage;
use openstack_client::config::{CloudConf, ConfigEnv};
use openstack_client::nova::Compute;
use openstack_client::{Session, SessionOptions};
use openstack_emulator::hypervisor::Hypervisor;
use plugin_runtime::LogArgs;

#[derive(Parser, Debug)]
#[command(
    version,
    about = "Loop devices for the volumes attached to the test cloud's servers"
)]
struct Args {
    /// cloud.conf with credentials that can read the servers and volumes.
    #[arg(long)]
    cloud_config: PathBuf,
    #[arg(long, default_value = "")]
    cloud: String,
    /// Servers whose attachments to materialise in --by-id-dir (and the
    /// --also-link-in directories).
    #[arg(long = "server", required = true)]
    servers: Vec<String>,
    #[arg(long)]
    by_id_dir: PathBuf,
    /// Further directories to link the devices in as well (the guest's
    /// /dev/disk/by-id, for node plugins in containers).
    #[arg(long = "also-link-in")]
    also_link_in: Vec<PathBuf>,
    /// A file of `<server-id> <by-id-dir>` lines, re-read on every pass:
    /// further servers (the cluster tier's nodes), each seeing only its own
    /// disks in its own directory, as each guest does. Missing means none.
    #[arg(long)]
    node_servers: Option<PathBuf>,
    #[arg(long)]
    image_dir: PathBuf,
    #[arg(long, default_value_t = 300)]
    interval_ms: u64,
    #[command(flatten)]
    log: LogArgs,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    plugin_runtime::logging::init(&args.log)?;
    let conf = CloudConf::load(
        std::slice::from_ref(&args.cloud_config),
        ConfigEnv::from_process(),
    )?;
    let session = Session::new(conf.cloud(&args.cloud)?, SessionOptions::default())?;
    let primary = Hypervisor::linking_in(
        args.by_id_dir.clone(),
        args.also_link_in.clone(),
        args.image_dir.clone(),
    )
    .context("preparing the directories")?;
    primary.cleanup_all();
    let mut agent = Agent {
        guests: args
            .servers
            .iter()
            .map(|s| (s.clone(), primary.clone()))
            .collect(),
        primary,
        primary_servers: args.servers.iter().cloned().collect(),
        image_dir: args.image_dir.clone(),
        cinder: BlockStorage::new(session.clone()),
        nova: Compute::new(session),
        sizes: BTreeMap::new(),
        read: BTreeMap::new(),
    };
    tracing::info!(servers = ?args.servers, by_id = %args.by_id_dir.display(), "hypervisor agent running");
    let shutdown = plugin_runtime::shutdown_signal();
    tokio::pin!(shutdown);
    loop {
        if let Some(file) = &args.node_servers
            && let Err(e) = agent.follow_node_servers(file)
        {
            tracing::warn!(error = %e, file = %file.display(), "cannot read the node servers; keeping the last ones");
        }
        if let Err(e) = agent.reconcile().await {
            tracing::warn!(error = %e, "reconcile failed; retrying");
        }
        tokio::select! {
            () = &mut shutdown => break,
            () = tokio::time::sleep(Duration::from_millis(args.interval_ms)) => {}
        }
    }
    agent.detach_everything();
    agent.primary.cleanup_all();
    tracing::info!("stopped; every loop device removed");
    Ok(())
}

/// A volume attached to a server.
type Placement = (String, String);

struct Agent {
    /// links in the primary directories; also the one that owns the images
    primary: Hypervisor,
    primary_servers: BTreeSet<String>,
    image_dir: PathBuf,
    /// server id → the hypervisor linking its devices where its guest looks
    guests: BTreeMap<String, Hypervisor>,
    cinder: BlockStorage,
    nova: Compute,
    /// (server, volume) → size in GiB of what is materialised
    sizes: BTreeMap<Placement, u64>,
    /// (server, volume) → what Cinder said of an attachment Nova lists
    read: BTreeMap<Placement, Read>,
}

/// How long what Cinder said of an attached volume stands before it is read
/// again: reading each one on every pass made this agent the test cloud's
/// busiest client (a hundred GETs a second with two dozen volumes attached).
const REREAD_AFTER: Duration = Duration::from_secs(2);

/// What Cinder said of an attachment, and when.
struct Read {
    at: Instant,
    /// `None`: the server's root disk, never materialised
    size: Option<u64>,
}

/// `<server-id> <by-id-dir>` per line; blank lines and `#` comments skipped.
fn parse_node_servers(text: &str) -> anyhow::Result<BTreeMap<String, PathBuf>> {
    let mut out = BTreeMap::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut words = line.split_whitespace();
        let (Some(server), Some(dir), None) = (words.next(), words.next(), words.next()) else {
            anyhow::bail!("line {}: want `<server-id> <by-id-dir>`", n + 1);
        };
        let dir = PathBuf::from(dir);
        anyhow::ensure!(
            dir.is_absolute(),
            "line {}: {} is not absolute",
            n + 1,
            dir.display()
        );
        out.insert(server.to_string(), dir);
    }
    Ok(out)
}

impl Agent {
    /// Adds the servers the file names and drops those it no longer names
    /// (their devices detached: the node is gone).
    fn follow_node_servers(&mut self, file: &std::path::Path) -> anyhow::Result<()> {
        let wanted = match std::fs::read_to_string(file) {
            Ok(text) => parse_node_servers(&text)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
            Err(e) => return Err(e.into()),
        };
        let dropped: Vec<String> = self
            .guests
            .keys()
            .filter(|s| !self.primary_servers.contains(*s) && !wanted.contains_key(*s))
            .cloned()
            .collect();
        for server in dropped {
            self.detach_all_of(&server);
            self.guests.remove(&server);
            tracing::info!(server = %server, "node server dropped");
        }
        for (server, dir) in wanted {
            if self.guests.contains_key(&server) || self.primary_servers.contains(&server) {
                continue;
            }
            let hv = Hypervisor::new(dir.clone(), self.image_dir.clone())
                .with_context(|| format!("preparing {}", dir.display()))?;
            tracing::info!(server = %server, by_id = %dir.display(), "node server added");
            self.guests.insert(server, hv);
        }
        Ok(())
    }

    fn detach_all_of(&mut self, server: &str) {
        let Some(hv) = self.guests.get(server) else {
            return;
        };
        let placed: Vec<Placement> = self
            .sizes
            .keys()
            .filter(|(s, _)| s == server)
            .cloned()
            .collect();
        for key in placed {
            hv.detach(&key.1);
            self.sizes.remove(&key);
        }
    }

    fn detach_everything(&mut self) {
        let servers: Vec<String> = self.guests.keys().cloned().collect();
        for server in servers {
            self.detach_all_of(&server);
        }
    }

    async fn reconcile(&mut self) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        let (cinder, nova) = (
            self.cinder.with_deadline(deadline),
            self.nova.with_deadline(deadline),
        );
        let mut desired: BTreeMap<Placement, u64> = BTreeMap::new();
        let now = Instant::now();
        let mut listed: BTreeSet<Placement> = BTreeSet::new();
        for server in self.guests.keys() {
            for att in nova.list_volume_attachments(server).await? {
                let key = (server.clone(), att.volume_id.clone());
                listed.insert(key.clone());
                // what was read a moment ago stands (Nova's list drops a
                // detached volume at once); only a size may change, and
                // the node plugin waits for its device to grow
                if let Some(read) = self.read.get(&key)
                    && now.duration_since(read.at) < REREAD_AFTER
                {
                    if let Some(size) = read.size {
                        desired.insert(key, size);
                    }
                    continue;
                }
                let v = match cinder.get_volume(&att.volume_id).await {
                    Ok(v) => v,
                    Err(e) if e.is_not_found() => continue,
                    Err(e) => return Err(e.into()),
                };
                // the server's root disk is no test device; attached for
                // Cinder: an attachment to this server exists (it stays
                // until a detach completes); until then it is read again
                // on every pass
                let size = if v.bootable {
                    None
                } else if v.attached_servers().any(|s| s == server) {
                    Some(v.size)
                } else {
                    continue;
                };
                self.read.insert(key.clone(), Read { at: now, size });
                if let Some(size) = size {
                    desired.insert(key, size);
                }
            }
        }
        self.read.retain(|k, _| listed.contains(k));
        // detaches first: a volume moving between servers leaves the old
        // guest before it shows up in the new one
        let leaving: Vec<Placement> = self
            .sizes
            .keys()
            .filter(|k| !desired.contains_key(*k))
            .cloned()
            .collect();
        for key in leaving {
            let (server, id) = &key;
            let elsewhere = desired.keys().any(|(_, v)| v == id);
            let gone =
                !elsewhere && matches!(cinder.get_volume(id).await, Err(e) if e.is_not_found());
            let hv = self.guest(server)?;
            let vid = id.clone();
            self.blocking(move || {
                if gone {
                    hv.forget_volume(&vid);
                } else {
                    hv.detach(&vid);
                }
                Ok::<_, openstack_emulator::hypervisor::HypervisorError>(())
            })
            .await?;
            tracing::info!(server = %server, volume = %id, deleted = gone, "detached");
            self.sizes.remove(&key);
        }
        for (key, size) in &desired {
            let (server, id) = key;
            match self.sizes.get(key) {
                None => {
                    let hv = self.guest(server)?;
                    let link = self
                        .blocking({
                            let (id, size) = (id.clone(), *size);
                            move || hv.attach(&id, size)
                        })
                        .await?;
                    tracing::info!(server = %server, volume = %id, link = %link.display(), size_gib = size, "attached");
                    self.sizes.insert(key.clone(), *size);
                }
                Some(old) if old != size => {
                    let hv = self.guest(server)?;
                    self.blocking({
                        let (id, size) = (id.clone(), *size);
                        move || hv.resize(&id, size)
                    })
                    .await?;
                    tracing::info!(server = %server, volume = %id, from = old, to = size, "resized");
                    self.sizes.insert(key.clone(), *size);
                }
                Some(_) => {}
            }
        }
        Ok(())
    }

    fn guest(&self, server: &str) -> anyhow::Result<Hypervisor> {
        self.guests
            .get(server)
            .cloned()
            .with_context(|| format!("server {server} is not followed"))
    }

    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> Result<T, openstack_emulator::hypervisor::HypervisorError> + Send + 'static,
    ) -> anyhow::Result<T> {
        Ok(tokio::task::spawn_blocking(f).await??)
    }
}

#[cfg(test)]
mod tests {
    use super::parse_node_servers;

    #[test]
    fn node_servers_file_is_read_strictly() {
        let got =
            parse_node_servers("# nodes\nabc /x/b/by-id\n\ndef /x/c/by-id\n").unwrap_or_default();
        assert_eq!(got.len(), 2);
        assert_eq!(got["def"].to_str(), Some("/x/c/by-id"));
        assert!(parse_node_servers("abc relative/dir\n").is_err());
        assert!(parse_node_servers("abc /a /b\n").is_err());
        assert!(parse_node_servers("abc\n").is_err());
    }
}
