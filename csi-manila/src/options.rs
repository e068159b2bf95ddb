//! Command-line flags: upstream's, so that its manifests start unchanged,
//! plus what a plugin that mounts shares itself needs.

use std::net::SocketAddr;
use std::path::PathBuf;

use plugin_runtime::{Endpoint, LogArgs};

use crate::share_protocol::ShareProtocol;

#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "manila-csi-plugin",
    version,
    about = "CSI driver for OpenStack Manila shared file systems (NFS, CephFS)",
    long_about = "CSI driver for OpenStack Manila shared file systems (NFS, CephFS).\n\n\
It serves the CSI Identity service always, the Controller service unless \
--provide-controller-service=false, and the Node service unless \
--provide-node-service=false; the node mounts shares itself (ceph-fuse, \
mount -t ceph, mount -t nfs): no partner CSI plugin is used, and \
--fwdendpoint is accepted but ignored. ListVolumes, ControllerGetVolume and \
GetCapacity carry no secrets: they are served only with --cloud-config.\n\n\
With --pvc-annotations, a new share's claim is read: one whose annotations ask for a \
placement (manila.csi.openstack.org/affinity, manila.csi.openstack.org/anti-affinity, \
manila.csi.openstack.org/group-id) is refused with FailedPrecondition, naming them: \
this driver does not make that placement (Manila's scheduler hints and share groups), \
and a share placed without it would break what the claim asks."
)]
pub struct Options {
    /// CSI endpoint, e.g. unix:///csi/csi.sock.
    #[arg(long, env = "CSI_ENDPOINT", default_value = "unix://tmp/csi.sock")]
    pub endpoint: Endpoint,
    /// CSI driver name (upstream's chart uses nfs.manila.csi.openstack.org or
    /// cephfs.manila.csi.openstack.org).
    #[arg(long = "drivername", default_value = crate::DEFAULT_DRIVER_NAME)]
    pub driver_name: String,
    /// The one protocol this instance serves.
    #[arg(long = "share-protocol-selector", value_enum)]
    pub share_protocol: ShareProtocol,
    /// Accepted for upstream's manifests and ignored: this plugin mounts
    /// shares itself and forwards nothing.
    #[arg(long = "fwdendpoint")]
    pub forward_endpoint: Option<String>,
    /// Report availability-zone topology (key
    /// topology.manila.csi.openstack.org/zone).
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub with_topology: bool,
    /// JSON runtime configuration, re-read when it changes:
    /// {"nfs": {"matchExportLocationAddress": "CIDR", "defaultShareClient": "CIDR,..."}}.
    #[arg(long)]
    pub runtime_config_file: Option<PathBuf>,
    /// Cluster id written into share metadata (manila.csi.openstack.org/cluster).
    #[arg(long = "cluster-id", default_value = "")]
    pub cluster_id: String,
    /// Serve /metrics and /healthz on this address (`:8080` means every
    /// interface).
    #[arg(long, value_parser = plugin_runtime::parse_listen_address)]
    pub http_endpoint: Option<SocketAddr>,
    /// Node: serve `/pre-stop` (the node-driver-registrar's preStop hook,
    /// which waits while a drained node still holds the driver's volumes)
    /// on this loopback address only, e.g. `127.0.0.1:9849`: kubelet asks
    /// it from the node, and nobody else may (each ask reads the API).
    #[arg(long, value_parser = plugin_runtime::parse_loopback_address)]
    pub pre_stop_endpoint: Option<SocketAddr>,
    /// cloud.conf files (as the Cinder plugin's): the plugin's own
    /// credentials, used when a call carries no secrets, and `[Metadata]`.
    #[arg(long = "cloud-config", env = "CLOUD_CONFIG", value_delimiter = ',')]
    pub cloud_config: Vec<PathBuf>,
    /// NFS clients (IP or CIDR, comma-separated) granted access to a new
    /// share when its StorageClass names none in nfs-shareClient. Without
    /// it (or the runtime configuration's nfs.defaultShareClient) such a
    /// share is refused: nothing is opened to the world by default.
    #[arg(long = "default-nfs-share-client")]
    pub default_nfs_share_client: Option<String>,
    /// A directory files named by a request's Secret (os-cloudsFile,
    /// os-certAuthorityPath, os-clientCertPath, os-clientKeyPath) may be
    /// read from, besides /etc/openstack, /etc/cacert and
    /// ~/.config/openstack (repeatable). Nothing else on the plugin's disk
    /// is readable through a Secret.
    #[arg(long = "secret-file-dir")]
    pub secret_file_dir: Vec<PathBuf>,
    /// Node: where staged shares' records, ceph.conf and keyrings are kept
    /// (root only). Default: /var/lib/kubelet/plugins/<drivername>/state.
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    /// Node: the OpenStack metadata service (instance id and zone), used
    /// when `[Metadata] search-order` names metadataService.
    #[arg(long, default_value = "http://169.254.169.254/")]
    pub metadata_url: url::Url,
    /// Node (CephFS): run each ceph-fuse daemon in a pod of its own on this
    /// node, from this plugin's image, so that a restart, upgrade or
    /// out-of-memory kill of the plugin never breaks a mounted share.
    /// Needs the Kubernetes API (the pod's service account, allowed to
    /// manage pods in its namespace), --node-name and POD_NAME.
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub mount_pods: bool,
    /// Node: the image of mount pods (default: this plugin's own, read
    /// from its pod, POD_NAME).
    #[arg(long)]
    pub mount_pod_image: Option<String>,
    /// Node: the memory limit of each mount pod (ceph-fuse's caches).
    #[arg(long, default_value = "512Mi")]
    pub mount_pod_memory_limit: String,
    /// Node: this node's name in Kubernetes (mount pods run on it).
    #[arg(long, env = "NODE_NAME")]
    pub node_name: Option<String>,
    #[command(flatten)]
    pub services: csi_common::plugin::ServiceFlags,
    #[command(flatten)]
    pub claim_annotations: csi_common::claim_annotations::ClaimAnnotationsFlag,
    /// Controller: the orphan report (shares of this protocol tagged with
    /// --cluster-id, and their snapshots, that no PV or
    /// VolumeSnapshotContent names; with the [Global] credentials of
    /// --cloud-config).
    #[command(flatten)]
    pub orphans: csi_common::orphans::ServeArgs,
    #[command(flatten)]
    pub log: LogArgs,
}

impl Options {
    pub fn validate(&self) -> Result<(), String> {
        for d in &self.secret_file_dir {
            if !d.is_absolute() || d.parent().is_none() {
                return Err(format!(
                    "--secret-file-dir {} must be an absolute directory other than /",
                    d.display()
                ));
            }
        }
        self.services.check(&self.driver_name)?;
        if let Some(p) = &self.runtime_config_file
            && !p.is_file()
        {
            return Err(format!(
                "--runtime-config-file {} does not exist",
                p.display()
            ));
        }
        if let Some(c) = &self.default_nfs_share_client {
            crate::parameters::parse_share_clients(c)
                .map_err(|e| format!("--default-nfs-share-client: {e}"))?;
        }
        if self.mount_pods {
            if self.share_protocol != ShareProtocol::Cephfs {
                return Err(
                    "--mount-pods: only CephFS shares (ceph-fuse) have daemons to run".into(),
                );
            }
            if !self.services.provide_node_service {
                return Err("--mount-pods is for the node service".into());
            }
            if self.node_name.as_deref().unwrap_or("").is_empty() {
                return Err(
                    "--mount-pods needs --node-name (or NODE_NAME from the downward API)".into(),
                );
            }
            if self.mount_pod_kubelet_dir().is_none() {
                return Err(format!(
                    "--mount-pods: the state directory {} must lie below a --path-root (mount pods read it from there)",
                    self.state_dir().display()
                ));
            }
        }
        Ok(())
    }

    /// The --path-root that holds the state directory: mount pods mount it.
    pub fn mount_pod_kubelet_dir(&self) -> Option<PathBuf> {
        let state = self.state_dir();
        self.services
            .path_roots()
            .into_iter()
            .find(|r| state.starts_with(r))
    }

    /// Where the node keeps its records.
    pub fn state_dir(&self) -> PathBuf {
        self.state_dir.clone().unwrap_or_else(|| {
            PathBuf::from("/var/lib/kubelet/plugins")
                .join(&self.driver_name)
                .join("state")
        })
    }

    /// What this instance does not serve, said at start-up.
    pub fn not_served(&self) -> Vec<String> {
        let mut out = Vec::new();
        if !self.services.provide_controller_service {
            out.push("Controller service (--provide-controller-service=false)".to_string());
        } else if self.cloud_config.is_empty() {
            out.push(
                "ListVolumes, ControllerGetVolume and GetCapacity (they carry no secrets; give --cloud-config)"
                    .to_string(),
            );
        }
        if !self.services.provide_node_service {
            out.push("Node service (--provide-node-service=false)".to_string());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn upstream_manifests_flags_parse() {
        // every required flag given: the unknown one alone is refused
        let known = ["manila-csi-plugin", "--share-protocol-selector=NFS"];
        assert!(Options::try_parse_from(known).is_ok());
        let e = Options::try_parse_from([known[0], known[1], "--no-such-flag=1"]).unwrap_err();
        assert_eq!(
            e.kind(),
            clap::error::ErrorKind::UnknownArgument,
            "unknown flags are refused"
        );
        let o = Options::try_parse_from([
            "manila-csi-plugin",
            "--endpoint=unix:///var/lib/kubelet/plugins/nfs.manila.csi.openstack.org/csi.sock",
            "--drivername=nfs.manila.csi.openstack.org",
            "--share-protocol-selector=NFS",
            "--fwdendpoint=unix:///var/lib/kubelet/plugins/csi-nfsplugin/csi.sock",
            "--with-topology",
            "--cluster-id=k8s",
        ])
        .unwrap();
        assert!(o.validate().is_ok());
        assert_eq!(o.share_protocol, ShareProtocol::Nfs);
        assert!(o.with_topology, "a bare Go-style bool flag is true");
        assert_eq!(
            o.state_dir(),
            PathBuf::from("/var/lib/kubelet/plugins/nfs.manila.csi.openstack.org/state")
        );
        let bad = Options::try_parse_from([
            "p",
            "--share-protocol-selector=NFS",
            "--default-nfs-share-client=everyone",
        ])
        .unwrap();
        assert!(bad.validate().is_err());
    }

    #[test]
    fn mount_pods_need_cephfs_a_node_name_and_a_state_dir_they_can_see() {
        let parse = |extra: &[&str]| {
            let mut a = vec!["p", "--share-protocol-selector=CEPHFS", "--mount-pods"];
            a.extend_from_slice(extra);
            Options::try_parse_from(a).unwrap().validate()
        };
        assert!(parse(&["--node-name=n1"]).is_ok());
        assert!(parse(&[]).unwrap_err().contains("--node-name"));
        assert!(
            parse(&["--node-name=n1", "--state-dir=/srv/state"])
                .unwrap_err()
                .contains("below a --path-root")
        );
        let nfs = Options::try_parse_from([
            "p",
            "--share-protocol-selector=NFS",
            "--mount-pods",
            "--node-name=n1",
        ])
        .unwrap();
        assert!(nfs.validate().unwrap_err().contains("CephFS"));
    }
}
