//! The plugin's lifecycle: read the configuration, build the services the
//! flags ask for, serve until SIGTERM.

use std::sync::Arc;
use std::time::Duration;

use csi_common::claim_annotations::ClaimAnnotations;
use csi_common::orphans::ClusterIdentity;
use csi_common::readiness::Readiness;
use openstack_client::cinder::BlockStorage;
use openstack_client::nova::Compute;
use openstack_client::{ApiMetrics, Session, SessionOptions};
use plugin_runtime::PluginServer;
use plugin_runtime::csi_identity::{expansion_capability, service_capability};
use proto::csi::v1::controller_server::ControllerServer;
use proto::csi::v1::group_controller_server::GroupControllerServer;
use proto::csi::v1::node_server::NodeServer;
use proto::csi::v1::plugin_capability::service::Type as ServiceType;
use proto::csi::v1::plugin_capability::volume_expansion::Type as ExpansionType;

pub use csi_common::plugin::PluginError;

use crate::Options;
use crate::controller::{Cloud, ControllerOptions, ControllerService};
use crate::node::{NodeOptions, NodeService, attach_limit};
use crate::orphans::{CinderInventory, KINDS};

/// Serves until SIGTERM or SIGINT.
pub async fn run(opts: Options) -> Result<(), PluginError> {
    opts.validate().map_err(PluginError::Flags)?;
    for what in opts.not_served() {
        tracing::info!(%what, "not served by this instance");
    }
    let mut server = PluginServer::new(opts.endpoint.clone()).http_endpoint(opts.http_endpoint);

    // the node needs only [Metadata] (and [BlockStorage]): its cloud.conf
    // is optional
    let conf = csi_common::plugin::load_cloud_conf(&opts.cloud_config)?;
    let secrets = conf.secret_keys();
    if !opts.services.provide_controller_service && !secrets.is_empty() {
        // a node's pod is the likeliest to be broken into: what it holds
        // should open nothing
        tracing::warn!(
            keys = %secrets.join(", "),
            "this node plugin calls no OpenStack API, yet its cloud.conf holds credentials: \
             give the node plugins a cloud.conf without them (deploy/: the Secret \
             cloud-config-node; the chart: secret.nodeName, or secret.create)"
        );
    }

    let mut parts = Vec::new();
    let mut routes = tonic::service::Routes::default();
    let mut capabilities = Vec::new();
    if opts.services.provide_controller_service {
        let metrics = ApiMetrics::default();
        metrics.register(&mut server.registry().lock().unwrap_or_else(|p| p.into_inner()));
        let mut sessions = Vec::new();
        let mut clouds = Vec::new();
        for name in &opts.cloud_name {
            let session = Session::new(
                conf.cloud(name)?,
                SessionOptions {
                    metrics: Some(metrics.clone()),
                    ..Default::default()
                },
            )?;
            let mut block = BlockStorage::new(session.clone());
            if conf.block_storage.ignore_volume_microversion {
                block = block.without_microversions();
            }
            clouds.push(Cloud {
                name: name.clone(),
                block,
                compute: Compute::new(session.clone()),
            });
            sessions.push((name.clone(), session));
        }
        csi_common::plugin::reload_credentials_on_change(
            &conf,
            &opts.cloud_config,
            sessions.clone(),
            &server.registry(),
        );
        let r = Readiness::default();
        r.watch_clouds(sessions);
        parts.push(r);
        let clouds_for_orphans: Vec<BlockStorage> =
            clouds.iter().map(|c| c.block.clone()).collect();
        let controller = ControllerService::new(
            clouds,
            ControllerOptions {
                cluster: opts.cluster.clone(),
                with_topology: opts.with_topology,
                ignore_volume_az: conf.block_storage.ignore_volume_az,
                attach_limit: attach_limit(conf.block_storage.node_volume_attach_limit),
                stuck_after: Duration::from_secs(opts.stuck_attachment_secs),
                identity: ClusterIdentity::resolve(&opts.cluster, &opts.orphans.kube),
                claims: ClaimAnnotations::from_flags(&opts.claim_annotations, &opts.orphans.kube)?,
            },
        );
        controller
            .attachment_metrics()
            .register(&mut server.registry().lock().unwrap_or_else(|p| p.into_inner()));
        // the first cloud's: where the volumes of a one-cloud cluster are
        let inventory = clouds_for_orphans.first().map(|block| CinderInventory {
            block: block.clone(),
            cluster: opts.cluster.clone(),
        });
        csi_common::orphans::start(
            inventory,
            &opts.cluster,
            &opts.driver_name,
            &opts.orphans,
            &server.registry(),
            "cinder_csi",
            KINDS,
        );
        routes = routes
            .add_service(GroupControllerServer::new(controller.clone()))
            .add_service(ControllerServer::new(controller));
        capabilities.push(service_capability(ServiceType::ControllerService));
        capabilities.push(service_capability(ServiceType::GroupControllerService));
        if opts.with_topology {
            capabilities.push(service_capability(
                ServiceType::VolumeAccessibilityConstraints,
            ));
        }
    }
    if opts.services.provide_node_service {
        let (r, identity) =
            Readiness::node_identity(conf.metadata.clone(), opts.metadata_url.clone());
        // A process that serves the controller too waits only for the
        // first reading of the instance metadata, not for its success:
        // upstream's manifests run their controller pod with both
        // services (no `--provide-node-service=false`), on a host whose
        // metadata that pod may not reach, and csi-provisioner waits for
        // Probe before it provisions anything. Its node service answers
        // NodeGetInfo once the identity is known, Unavailable until then
        // (kubelet calls no node service of a controller pod).
        parts.push(if opts.services.provide_controller_service {
            r.once_tried()
        } else {
            r
        });
        if let Some(root) = opts.services.path_roots().first() {
            server = csi_common::pre_stop::serve_on(
                server,
                &opts.driver_name,
                root,
                opts.pre_stop_endpoint,
            );
        }
        // the node's attach limit is part of what the scheduler must know
        // before the taint goes
        let limit = attach_limit(conf.block_storage.node_volume_attach_limit);
        csi_common::startup_taint::spawn(&opts.driver_name, limit > 0);
        let node = NodeService::new(
            identity,
            Arc::new(host_ops::LinuxMounter),
            Arc::new(host_ops::LinuxBlockDevices::new(opts.by_id_dir.clone())),
            NodeOptions {
                with_topology: opts.with_topology,
                additional_topology: opts.additional_topology.clone(),
                attach_limit: limit,
                path_roots: opts.services.path_roots(),
                device_wait: Duration::from_secs(opts.device_wait_secs),
                rescan_on_resize: conf.block_storage.rescan_on_resize,
            },
        );
        routes = routes.add_service(NodeServer::new(node));
        if !opts.services.provide_controller_service && opts.with_topology {
            capabilities.push(service_capability(
                ServiceType::VolumeAccessibilityConstraints,
            ));
        }
    }
    capabilities.push(expansion_capability(ExpansionType::Online));
    capabilities.push(expansion_capability(ExpansionType::Offline));

    csi_common::plugin::serve_with_identity(server, routes, &opts.driver_name, capabilities, parts)
        .await?;
    Ok(())
}
