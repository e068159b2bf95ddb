//! The plugin's lifecycle: read the configuration, build the services the
//! flags ask for, serve until SIGTERM. Mounts outlive the plugin.

use std::collections::BTreeMap;
use std::sync::Arc;

use csi_common::credentials::Credentials;
use csi_common::readiness::Readiness;
use openstack_client::config::ConfigEnv;
use openstack_client::manila::SharedFileSystems;
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
use crate::controller::{ControllerOptions, ControllerService};
use crate::daemons::FuseDaemons;
use crate::mount_pods::{MountPodOptions, MountPods};
use crate::node::{NodeOptions, NodeService};
use crate::orphans::{KINDS, ManilaInventory};
use crate::parameters::parse_share_clients;
use crate::runtime_config::RuntimeConfigFile;
use crate::stage_record::StateDir;

/// Serves until SIGTERM or SIGINT.
pub async fn run(opts: Options) -> Result<(), PluginError> {
    opts.validate().map_err(PluginError::Flags)?;
    if opts.forward_endpoint.is_some() {
        tracing::warn!(
            "--fwdendpoint is ignored: this plugin mounts shares itself, no partner node plugin is used"
        );
    }
    for what in opts.not_served() {
        tracing::warn!(%what, "not served by this instance");
    }
    let mut server = PluginServer::new(opts.endpoint.clone()).http_endpoint(opts.http_endpoint);
    // the node needs only [Metadata] (and [BlockStorage]): its cloud.conf
    // is optional
    let conf = csi_common::plugin::load_cloud_conf(&opts.cloud_config)?;
    let metrics = ApiMetrics::default();
    metrics.register(&mut server.registry().lock().unwrap_or_else(|p| p.into_inner()));
    let session_options = SessionOptions {
        metrics: Some(metrics),
        ..Default::default()
    };
    let mut own = BTreeMap::new();
    if !opts.cloud_config.is_empty() {
        for name in conf.cloud_names() {
            own.insert(
                name.clone(),
                Session::new(conf.cloud(&name)?, session_options.clone())?,
            );
        }
    }
    let sessions: Vec<(String, Session)> =
        own.iter().map(|(n, s)| (n.clone(), s.clone())).collect();
    // the controller's own credentials ([Global]), for the orphan report
    let orphans_session = own.get("").or_else(|| own.values().next()).cloned();
    if !sessions.is_empty() {
        csi_common::plugin::reload_credentials_on_change(
            &conf,
            &opts.cloud_config,
            sessions.clone(),
            &server.registry(),
        );
    }
    let mut env = ConfigEnv::from_process();
    env.secret_file_dirs
        .extend(opts.secret_file_dir.iter().cloned());
    let credentials = Arc::new(Credentials::new(
        own,
        session_options,
        env,
        Arc::new(SharedFileSystems::new),
    ));
    let runtime = Arc::new(RuntimeConfigFile::new(opts.runtime_config_file.clone()));

    let mut parts = Vec::new();
    let mut routes = tonic::service::Routes::default();
    let mut capabilities = Vec::new();
    if opts.services.provide_controller_service {
        let r = Readiness::default();
        if sessions.is_empty() {
            // credentials arrive with each call
            parts.push(Readiness::ready());
        } else {
            r.watch_clouds(sessions);
            parts.push(r);
        }
        let controller = ControllerService::new(
            credentials.clone(),
            runtime.clone(),
            ControllerOptions {
                protocol: opts.share_protocol,
                cluster_id: opts.cluster_id.clone(),
                with_topology: opts.with_topology,
                default_nfs_share_clients: opts
                    .default_nfs_share_client
                    .as_deref()
                    .map(parse_share_clients)
                    .transpose()
                    .map_err(PluginError::Flags)?
                    .unwrap_or_default(),
                identity: csi_common::orphans::ClusterIdentity::resolve(
                    &opts.cluster_id,
                    &opts.orphans.kube,
                ),
                claims: csi_common::claim_annotations::ClaimAnnotations::from_flags(
                    &opts.claim_annotations,
                    &opts.orphans.kube,
                )?,
            },
        );
        routes = routes
            .add_service(GroupControllerServer::new(controller.clone()))
            .add_service(ControllerServer::new(controller));
        let inventory = orphans_session.map(|session| ManilaInventory {
            manila: SharedFileSystems::new(session),
            cluster: opts.cluster_id.clone(),
            protocol: opts.share_protocol,
        });
        csi_common::orphans::start(
            inventory,
            &opts.cluster_id,
            &opts.driver_name,
            &opts.orphans,
            &server.registry(),
            "manila_csi",
            KINDS,
        );
        capabilities.push(service_capability(ServiceType::ControllerService));
        capabilities.push(service_capability(ServiceType::GroupControllerService));
        capabilities.push(expansion_capability(ExpansionType::Online));
    }
    if opts.services.provide_node_service {
        let (r, identity) =
            Readiness::node_identity(conf.metadata.clone(), opts.metadata_url.clone());
        // as Cinder's: upstream's manifests run the controller pod with
        // both services, where the instance metadata may be out of reach
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
        // shares have no attach limit: registered is enough
        csi_common::startup_taint::spawn(&opts.driver_name, false);
        let state = StateDir::new(opts.state_dir());
        state.ensure()?;
        let daemons = if opts.mount_pods {
            FuseDaemons::Pods(Arc::new(mount_pods(&opts).await?))
        } else {
            FuseDaemons::InPlugin
        };
        let service = NodeService::new(
            identity,
            credentials.clone(),
            runtime.clone(),
            state,
            daemons,
            Arc::new(host_ops::LinuxMounter),
            NodeOptions {
                protocol: opts.share_protocol,
                with_topology: opts.with_topology,
                path_roots: opts.services.path_roots(),
            },
        );
        routes = routes.add_service(NodeServer::new(service.clone()));
        // the shares staged before this start: FUSE mounts whose daemon
        // went with the previous plugin are mounted again
        tokio::spawn(async move { service.repair().await });
    }
    if opts.with_topology {
        capabilities.push(service_capability(
            ServiceType::VolumeAccessibilityConstraints,
        ));
    }

    tracing::info!(protocol = %opts.share_protocol, driver = %opts.driver_name, "starting");
    // at the end every mount stays: a restarted plugin finds them again
    csi_common::plugin::serve_with_identity(server, routes, &opts.driver_name, capabilities, parts)
        .await
        .map_err(PluginError::from)
}

/// The mount pods' settings: this pod's namespace and image, from the
/// Kubernetes API.
async fn mount_pods(opts: &Options) -> Result<MountPods, PluginError> {
    let kube = kube_api::Client::in_cluster()
        .map_err(|e| PluginError::Flags(format!("--mount-pods: {e}")))?;
    let namespace = kube_api::Client::own_namespace()
        .map_err(|e| PluginError::Flags(format!("--mount-pods: {e}")))?;
    let (image, image_pull_policy) = match &opts.mount_pod_image {
        Some(i) => (i.clone(), None),
        None => {
            let pod = std::env::var("POD_NAME").map_err(|_| {
                PluginError::Flags(
                    "--mount-pods: POD_NAME is not set (downward API), so the plugin's image is unknown: set it or --mount-pod-image".into(),
                )
            })?;
            MountPods::own_image(&kube, &namespace, &pod)
                .await
                .map_err(|e| PluginError::Flags(format!("--mount-pods: {e}")))?
        }
    };
    let node_name = opts.node_name.clone().unwrap_or_default();
    let options = MountPodOptions {
        node_name,
        namespace,
        image,
        image_pull_policy,
        kubelet_dir: opts.mount_pod_kubelet_dir().unwrap_or_default(),
        driver_name: opts.driver_name.clone(),
        memory_limit: opts.mount_pod_memory_limit.clone(),
    };
    tracing::info!(image = %options.image, node = %options.node_name, namespace = %options.namespace, "ceph-fuse daemons run in mount pods");
    Ok(MountPods::new(kube, options))
}
