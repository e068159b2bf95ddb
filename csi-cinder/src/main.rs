use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use csi_cinder::Options;
use csi_cinder::readiness::{Readiness, State};
use openstack_client::config::{CloudConf, ConfigEnv};
use openstack_client::{ApiMetrics, Session, SessionOptions};
use plugin_runtime::PluginServer;
use plugin_runtime::csi_identity::IdentityService;
use proto::csi::v1::identity_server::IdentityServer;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let opts = Options::parse();
    plugin_runtime::logging::init(&opts.log)?;
    opts.validate().map_err(anyhow::Error::msg)?;
    let server = PluginServer::new(opts.endpoint.clone()).http_endpoint(opts.http_endpoint);

    let readiness = if opts.provide_controller_service {
        let conf = CloudConf::load(&opts.cloud_config, ConfigEnv::from_process())
            .context("reading --cloud-config")?;
        let metrics = ApiMetrics::default();
        metrics.register(&mut server.registry().lock().unwrap_or_else(|p| p.into_inner()));
        let mut sessions = Vec::new();
        for name in &opts.cloud_name {
            let cfg = conf
                .cloud(name)
                .with_context(|| format!("cloud {name:?}"))?;
            let session = Session::new(
                cfg,
                SessionOptions {
                    metrics: Some(metrics.clone()),
                    ..Default::default()
                },
            )?;
            sessions.push((name.clone(), session));
        }
        let r = Readiness::default();
        r.watch_clouds(sessions);
        r
    } else {
        Readiness::ready()
    };

    // Capabilities name only services this binary serves: the Controller
    // and Node services (and with them CONTROLLER_SERVICE, topology and
    // expansion) are not built yet, so nothing is advertised.
    let capabilities = Vec::new();

    let probe_state = readiness.clone();
    let identity = IdentityService::new(
        opts.driver_name.clone(),
        env!("CARGO_PKG_VERSION").to_string(),
        capabilities,
        Arc::new(move || {
            let s = probe_state.state();
            Box::pin(async move { Ok(matches!(s, State::Ready)) })
        }),
    );
    let health_state = readiness.clone();
    let server = server.health_check(Arc::new(move || {
        let s = health_state.state();
        Box::pin(async move {
            match s {
                State::Ready | State::Starting => Ok(()),
                State::Failing(reason) => Err(reason),
            }
        })
    }));
    let routes = tonic::service::Routes::new(IdentityServer::new(identity));
    server
        .serve(routes, plugin_runtime::shutdown_signal())
        .await?;
    Ok(())
}
