use std::sync::Arc;

use clap::Parser;
use csi_manila::Options;
use plugin_runtime::PluginServer;
use plugin_runtime::csi_identity::IdentityService;
use proto::csi::v1::identity_server::IdentityServer;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let opts = Options::parse();
    plugin_runtime::logging::init(&opts.log)?;
    opts.validate().map_err(anyhow::Error::msg)?;
    tracing::info!(protocol = ?opts.share_protocol, driver = %opts.driver_name, "starting");
    // Manila credentials arrive with each request (CSI secrets), so there
    // is nothing to wait for at start-up. No capability is advertised: the
    // Controller and Node services are not built yet.
    let identity = IdentityService::new(
        opts.driver_name.clone(),
        env!("CARGO_PKG_VERSION").to_string(),
        Vec::new(),
        Arc::new(|| Box::pin(async { Ok(true) })),
    );
    let routes = tonic::service::Routes::new(IdentityServer::new(identity));
    PluginServer::new(opts.endpoint.clone())
        .http_endpoint(opts.http_endpoint)
        .serve(routes, plugin_runtime::shutdown_signal())
        .await?;
    Ok(())
}
