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
    /// Servers whose attachments to materialise.
    #[arg(long = "server", required = true)]
    servers: Vec<String>,
    #[arg(long)]
    by_id_dir: PathBuf,
    /// Further directories to link the devices in as well (the guest's
    /// /dev/disk/by-id, for node plugins in containers).
    #[arg(long = "also-link-in")]
    also_link_in: Vec<PathBuf>,
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
    let hv = Hypervisor::linking_in(
        args.by_id_dir.clone(),
        args.also_link_in.clone(),
        args.image_dir.clone(),
    )
    .context("preparing the directories")?;
    hv.cleanup_all();
    let mut agent = Agent {
        hv,
        cinder: BlockStorage::new(session.clone()),
        nova: Compute::new(session),
        sizes: BTreeMap::new(),
    };
    tracing::info!(servers = ?args.servers, by_id = %args.by_id_dir.display(), "hypervisor agent running");
    let shutdown = plugin_runtime::shutdown_signal();
    tokio::pin!(shutdown);
    loop {
        if let Err(e) = agent.reconcile(&args.servers).await {
            tracing::warn!(error = %e, "reconcile failed; retrying");
        }
        tokio::select! {
            () = &mut shutdown => break,
            () = tokio::time::sleep(Duration::from_millis(args.interval_ms)) => {}
        }
    }
    agent.hv.cleanup_all();
    tracing::info!("stopped; every loop device removed");
    Ok(())
}

struct Agent {
    hv: Hypervisor,
    cinder: BlockStorage,
    nova: Compute,
    /// volume id → size in GiB of what is materialised
    sizes: BTreeMap<String, u64>,
}

impl Agent {
    async fn reconcile(&mut self, servers: &[String]) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        let (cinder, nova) = (
            self.cinder.with_deadline(deadline),
            self.nova.with_deadline(deadline),
        );
        let mut desired: BTreeMap<String, u64> = BTreeMap::new();
        for server in servers {
            for att in nova.list_volume_attachments(server).await? {
                let v = match cinder.get_volume(&att.volume_id).await {
                    Ok(v) => v,
                    Err(e) if e.is_not_found() => continue,
                    Err(e) => return Err(e.into()),
                };
                // the server's root disk is no test device
                if v.bootable {
                    continue;
                }
                // attached for Cinder: an attachment to this server exists
                // (it stays until a detach completes)
                if v.attached_servers().any(|s| s == server) {
                    desired.insert(v.id.clone(), v.size);
                }
            }
        }
        let current: BTreeSet<String> = self.sizes.keys().cloned().collect();
        for (id, size) in &desired {
            match self.sizes.get(id) {
                None => {
                    let link = self
                        .blocking({
                            let (hv, id, size) = (self.hv.clone(), id.clone(), *size);
                            move || hv.attach(&id, size)
                        })
                        .await?;
                    tracing::info!(volume = %id, link = %link.display(), size_gib = size, "attached");
                    self.sizes.insert(id.clone(), *size);
                }
                Some(old) if old != size => {
                    self.blocking({
                        let (hv, id, size) = (self.hv.clone(), id.clone(), *size);
                        move || hv.resize(&id, size)
                    })
                    .await?;
                    tracing::info!(volume = %id, from = old, to = size, "resized");
                    self.sizes.insert(id.clone(), *size);
                }
                Some(_) => {}
            }
        }
        for id in current.iter().filter(|id| !desired.contains_key(*id)) {
            let gone = matches!(cinder.get_volume(id).await, Err(e) if e.is_not_found());
            let (hv, vid) = (self.hv.clone(), id.clone());
            self.blocking(move || {
                if gone {
                    hv.forget_volume(&vid);
                } else {
                    hv.detach(&vid);
                }
                Ok::<_, openstack_emulator::hypervisor::HypervisorError>(())
            })
            .await?;
            tracing::info!(volume = %id, deleted = gone, "detached");
            self.sizes.remove(id);
        }
        Ok(())
    }

    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> Result<T, openstack_emulator::hypervisor::HypervisorError> + Send + 'static,
    ) -> anyhow::Result<T> {
        Ok(tokio::task::spawn_blocking(f).await??)
    }
}
