//! A tour of the client library: Keystone → Cinder → Nova attach → Manila
//! → Barbican, each step timed, everything it creates removed again.
//!
//! With no arguments it starts an embedded OpenStack emulator. Against a
//! real cloud: `tour --cloud-config cloud.conf [--cloud NAME] [--server ID]`
//! (the attach step needs an existing server and is skipped without one).

#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use openstack_client::barbican::{CreateSecret, KeyManager};
use openstack_client::cinder::{BlockStorage, CreateVolume, VolumeStatus};
use openstack_client::common::{Poll, poll_until};
use openstack_client::config::{CloudConf, ConfigEnv};
use openstack_client::manila::{
    AccessRuleState, CreateShare, GrantAccess, ShareStatus, SharedFileSystems,
};
use openstack_client::nova::Compute;
use openstack_client::{Error, Session, SessionOptions};
use zeroize::Zeroizing;

struct Args {
    cloud_config: Option<PathBuf>,
    cloud: String,
    server: Option<String>,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        cloud_config: None,
        cloud: String::new(),
        server: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--cloud-config" => a.cloud_config = Some(PathBuf::from(value()?)),
            "--cloud" => a.cloud = value()?,
            "--server" => a.server = Some(value()?),
            "-h" | "--help" => {
                return Err(
                    "usage: tour [--cloud-config FILE [--cloud NAME] [--server ID]]".into(),
                );
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(a)
}

fn step(name: &str, started: Instant) {
    println!(
        "  {:<44} {:>8.1} ms",
        name,
        started.elapsed().as_secs_f64() * 1e3
    );
}

fn deadline() -> Instant {
    Instant::now() + Duration::from_secs(120)
}

#[tokio::main]
async fn main() {
    if let Err(e) = run().await {
        eprintln!("tour failed: {e}");
        std::process::exit(1);
    }
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args = parse_args()?;
    let (conf_text, embedded) = match &args.cloud_config {
        Some(p) => (
            std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?,
            None,
        ),
        None => {
            let emu = openstack_emulator::Emulator::start(Default::default()).await?;
            println!("embedded OpenStack emulator at {}", emu.url());
            (emu.cloud_conf(), Some(emu))
        }
    };
    let path = args
        .cloud_config
        .clone()
        .unwrap_or_else(|| PathBuf::from("<emulator>"));
    let conf = CloudConf::from_texts(&[(path, conf_text)], ConfigEnv::from_process())?;
    let session = Session::new(conf.cloud(&args.cloud)?, SessionOptions::default())?;
    let server = match (&args.server, &embedded) {
        (Some(s), _) => Some(s.clone()),
        (None, Some(emu)) => emu.control().create_server("admin", "tour-node", "nova"),
        (None, None) => None,
    };

    let t = Instant::now();
    session.authenticate().await?;
    step("keystone: scoped token + catalog", t);

    let cinder = BlockStorage::new(session.clone());
    let t = Instant::now();
    let vol = cinder
        .create_volume(&CreateVolume {
            name: "tour-volume".into(),
            size_gib: 1,
            ..Default::default()
        })
        .await?;
    wait_volume(&cinder, &vol.id, VolumeStatus::Available).await?;
    step("cinder: create a 1 GiB volume, wait available", t);

    if let Some(server) = &server {
        let nova = Compute::new(session.clone());
        let t = Instant::now();
        nova.attach_volume(server, &vol.id, false).await?;
        wait_volume(&cinder, &vol.id, VolumeStatus::InUse).await?;
        step("nova: attach, wait in-use", t);
        let t = Instant::now();
        cinder.extend_volume(&vol.id, 2, true).await?;
        wait_volume(&cinder, &vol.id, VolumeStatus::InUse).await?;
        step("cinder: online extend to 2 GiB (3.42)", t);
        let t = Instant::now();
        nova.detach_volume(server, &vol.id).await?;
        wait_volume(&cinder, &vol.id, VolumeStatus::Available).await?;
        step("nova: detach, wait available", t);
    } else {
        println!("  (no --server given: attach skipped)");
    }
    let t = Instant::now();
    cinder.delete_volume(&vol.id).await?;
    wait_gone(|| cinder.get_volume(&vol.id)).await?;
    step("cinder: delete, wait gone", t);

    let manila = SharedFileSystems::new(session.clone());
    let t = Instant::now();
    let mv = manila.microversion().await?;
    step(&format!("manila: negotiate microversion ({mv})"), t);
    let t = Instant::now();
    let share = manila
        .create_share(&CreateShare {
            protocol: "NFS".into(),
            size_gib: 1,
            name: "tour-share".into(),
            ..Default::default()
        })
        .await?;
    poll_until(
        "share",
        deadline(),
        Duration::from_millis(50),
        Duration::from_secs(2),
        || async {
            let s = manila.get_share(&share.id).await?;
            if s.status.is_error() {
                let why = manila
                    .list_user_messages(&share.id)
                    .await?
                    .into_iter()
                    .next()
                    .map(|m| m.user_message);
                return Err(Error::ResourceFailed {
                    operation: "share_create",
                    id: share.id.clone(),
                    status: s.status.to_string(),
                    detail: why,
                });
            }
            Ok(if s.status == ShareStatus::Available {
                Poll::Ready(())
            } else {
                Poll::Pending(s.status.to_string())
            })
        },
    )
    .await?;
    step("manila: create an NFS share, wait available", t);
    let t = Instant::now();
    let rule = manila
        .grant_access(
            &share.id,
            &GrantAccess {
                access_type: "ip".into(),
                access_to: "127.0.0.1".into(),
                access_level: "rw".into(),
            },
        )
        .await?;
    poll_until(
        "rule",
        deadline(),
        Duration::from_millis(50),
        Duration::from_secs(2),
        || async {
            let r = manila.get_access_rule(&share.id, &rule.id).await?;
            Ok(if r.state == AccessRuleState::Active {
                Poll::Ready(())
            } else {
                Poll::Pending(r.state.to_string())
            })
        },
    )
    .await?;
    let exports = manila.list_export_locations(&share.id).await?;
    step(
        &format!("manila: access rule active, {} export(s)", exports.len()),
        t,
    );
    manila.revoke_access(&share.id, &rule.id).await?;
    wait_gone(|| manila.get_access_rule(&share.id, &rule.id)).await?;
    manila.delete_share(&share.id).await?;
    wait_gone(|| manila.get_share(&share.id)).await?;

    let barbican = KeyManager::new(session.clone());
    let t = Instant::now();
    let order = barbican
        .create_key_order("tour-kek", "aes", 256, "gcm")
        .await?;
    let secret = barbican.wait_for_order(&order, deadline()).await?;
    let key = barbican.get_secret_payload(&secret).await?;
    step(
        &format!("barbican: order an AES-256 key ({} bytes)", key.len()),
        t,
    );
    let own = barbican
        .create_secret(&CreateSecret {
            name: "tour-secret".into(),
            payload: Some(Zeroizing::new(vec![42; 32])),
            secret_type: "symmetric".into(),
            algorithm: Some("aes".into()),
            bit_length: Some(256),
            mode: None,
        })
        .await?;
    barbican.delete_secret(&own).await?;
    barbican.delete_secret(&secret).await?;
    println!(
        "tour complete; {} Keystone authentication(s)",
        session.authentications()
    );
    if let Some(emu) = embedded {
        emu.shutdown().await;
    }
    Ok(())
}

async fn wait_volume(c: &BlockStorage, id: &str, want: VolumeStatus) -> Result<(), Error> {
    poll_until(
        "volume",
        deadline(),
        Duration::from_millis(50),
        Duration::from_secs(2),
        || async {
            let v = c.get_volume(id).await?;
            if v.status.is_error() {
                return Err(Error::ResourceFailed {
                    operation: "volume_wait",
                    id: id.into(),
                    status: v.status.to_string(),
                    detail: None,
                });
            }
            Ok(if v.status == want {
                Poll::Ready(())
            } else {
                Poll::Pending(v.status.to_string())
            })
        },
    )
    .await
}

async fn wait_gone<T, F, Fut>(get: F) -> Result<(), Error>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<T, Error>>,
{
    poll_until(
        "delete",
        deadline(),
        Duration::from_millis(50),
        Duration::from_secs(2),
        || async {
            match get().await {
                Err(e) if e.is_not_found() => Ok(Poll::Ready(())),
                Err(e) => Err(e),
                Ok(_) => Ok(Poll::Pending("still there".into())),
            }
        },
    )
    .await
}
