//! `openstack-emulator`: runs the emulator until SIGTERM/SIGINT.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use openstack_emulator::{Delays, Emulator, EmulatorConfig, HypervisorConfig};

#[derive(Parser, Debug)]
#[command(
    version,
    about = "A stateful OpenStack emulator for tests and demos (never a production backend)"
)]
struct Args {
    /// Address to listen on; port 0 picks a free port (printed when ready).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    #[arg(long, default_value = "RegionOne")]
    region: String,
    /// Availability zones, comma separated; the first is the default.
    #[arg(long, value_delimiter = ',', default_value = "nova")]
    availability_zones: Vec<String>,
    /// Refuse attaching a volume to a server of another zone, as Nova's
    /// `[cinder] cross_az_attach = False` does.
    #[arg(long)]
    no_cross_az_attach: bool,
    #[arg(long, default_value_t = 3600)]
    token_lifetime_secs: u64,
    /// Duration of every transient state (creating, attaching, ...), in ms.
    #[arg(long)]
    transition_delay_ms: Option<u64>,
    /// Simulate the hypervisor: attached volumes become loop devices linked
    /// under this directory (needs root).
    #[arg(long, requires = "hypervisor_image_dir")]
    hypervisor_by_id_dir: Option<PathBuf>,
    /// Where the hypervisor keeps the volumes' sparse backing files.
    #[arg(long)]
    hypervisor_image_dir: Option<PathBuf>,
    /// Write an upstream-style cloud.conf pointing at this emulator.
    #[arg(long)]
    write_cloud_conf: Option<PathBuf>,
    /// Write a clouds.yaml pointing at this emulator.
    #[arg(long)]
    write_clouds_yaml: Option<PathBuf>,
    /// Log format: text or json.
    #[arg(long, default_value = "text")]
    log_format: String,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let terminal = std::io::IsTerminal::is_terminal(&std::io::stderr());
    match args.log_format.as_str() {
        "json" => builder.with_ansi(false).json().init(),
        "text" => builder.with_ansi(terminal).init(),
        other => anyhow::bail!("--log-format must be text or json, not {other:?}"),
    }
    let mut delays = Delays::default();
    if let Some(ms) = args.transition_delay_ms {
        delays = Delays::uniform(ms);
    }
    let hypervisor = match (args.hypervisor_by_id_dir, args.hypervisor_image_dir) {
        (Some(by_id_dir), Some(image_dir)) => Some(HypervisorConfig {
            by_id_dir,
            also_link_in: Vec::new(),
            image_dir,
        }),
        _ => None,
    };
    let emulator = Emulator::start(EmulatorConfig {
        listen: args.listen,
        region: args.region,
        availability_zones: args.availability_zones,
        cross_az_attach: !args.no_cross_az_attach,
        token_lifetime: Duration::from_secs(args.token_lifetime_secs),
        delays,
        hypervisor,
    })
    .await
    .context("starting the emulator")?;
    if let Some(p) = &args.write_cloud_conf {
        std::fs::write(p, emulator.cloud_conf())
            .with_context(|| format!("writing {}", p.display()))?;
    }
    if let Some(p) = &args.write_clouds_yaml {
        std::fs::write(p, emulator.clouds_yaml())
            .with_context(|| format!("writing {}", p.display()))?;
    }
    // the one line scripts wait for
    #[allow(clippy::print_stdout)]
    {
        println!("openstack-emulator listening on {}", emulator.url());
    }
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    tracing::info!("shutting down");
    emulator.shutdown().await;
    Ok(())
}
