//! `openstack-fault-proxy`: the emulator's faults in front of real
//! OpenStack services (see `openstack_emulator::proxy`), until
//! SIGTERM/SIGINT.

use std::net::SocketAddr;

use anyhow::Context;
use clap::Parser;
use openstack_emulator::proxy::{FaultProxy, Upstream};

#[derive(Parser, Debug)]
#[command(
    version,
    about = "Injects faults between OpenStack clients and real services (tests only)",
    long_about = "Injects faults between OpenStack clients and real services (tests only): each --upstream SERVICE=LISTEN=TARGET proxies one service; Keystone's token answers are rewritten so that their catalog names the proxy. Faults and calls: --admin (POST/DELETE/GET /faults, GET/DELETE /calls), as the emulator's /_admin."
)]
struct Args {
    /// SERVICE=LISTEN=TARGET, e.g. volume=127.0.0.1:25502=127.0.0.1:25002
    /// (SERVICE is the emulator's path prefix: identity, volume, compute,
    /// share, key-manager, placement). Repeatable.
    #[arg(long = "upstream", required = true, value_parser = parse_upstream)]
    upstreams: Vec<Upstream>,
    /// The admin API's address.
    #[arg(long)]
    admin: SocketAddr,
}

fn parse_upstream(s: &str) -> Result<Upstream, String> {
    let mut parts = s.splitn(3, '=');
    let (Some(service), Some(listen), Some(target)) = (parts.next(), parts.next(), parts.next())
    else {
        return Err(format!("{s:?} is not SERVICE=LISTEN=TARGET"));
    };
    Ok(Upstream {
        service: service.to_string(),
        listen: listen.parse().map_err(|e| format!("{listen:?}: {e}"))?,
        target: target.parse().map_err(|e| format!("{target:?}: {e}"))?,
    })
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
    let services: Vec<String> = args
        .upstreams
        .iter()
        .map(|u| format!("{} {} -> {}", u.service, u.listen, u.target))
        .collect();
    let proxy = FaultProxy::start(args.upstreams, args.admin)
        .await
        .context("starting the proxy")?;
    tracing::info!(admin = %proxy.admin, services = ?services, "fault proxy listening");
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    Ok(())
}
