//! Command-line flags, compatible with the upstream plugin's.

use std::net::SocketAddr;
use std::path::PathBuf;

use plugin_runtime::{Endpoint, LogArgs};

#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "cinder-csi-plugin",
    version,
    about = "CSI driver for OpenStack Cinder block volumes",
    long_about = "CSI driver for OpenStack Cinder block volumes.\n\n\
        It serves the CSI Identity service always, the Controller service unless \
        --provide-controller-service=false (with the GroupController service for volume group \
        snapshots), and the Node service unless --provide-node-service=false. Not served: \
        GetCapacity (Cinder's pool capacity is admin-only) and PUBLISH_READONLY (Cinder's \
        read-only flag is volume-wide; a read-only NodePublishVolume is honoured on the node).\n\n\
        With --pvc-annotations, a new volume's claim places it: its annotations \
        cinder.csi.openstack.org/affinity and cinder.csi.openstack.org/anti-affinity name \
        volumes (by name or id, comma-separated, at most 16 each) whose Cinder backend the \
        volume must share, or must not (Cinder's scheduler hints same_host and \
        different_host; the cloud's Cinder must enable SameBackendFilter and \
        DifferentBackendFilter, which its default scheduler filters leave out).\n\n\
        The attach limit, [BlockStorage] node-volume-attach-limit (default 25), counts every disk \
        of a server, its own included: the controller attaches no volume past it (even where Nova \
        sets no limit), and the node reports it to Kubernetes less the disks Kubernetes does not \
        manage. Give the controller and the nodes the same number."
)]
pub struct Options {
    /// CSI endpoint, e.g. unix:///csi/csi.sock.
    #[arg(long, env = "CSI_ENDPOINT")]
    pub endpoint: Endpoint,
    /// cloud.conf files, merged in order (later wins). Required for the
    /// controller service.
    #[arg(long = "cloud-config", env = "CLOUD_CONFIG", value_delimiter = ',')]
    pub cloud_config: Vec<PathBuf>,
    /// Clouds (`[Global "name"]` sections) to serve; "" is `[Global]`.
    #[arg(long = "cloud-name", default_values_t = vec![String::new()])]
    pub cloud_name: Vec<String>,
    /// Report availability-zone topology.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub with_topology: bool,
    /// Extra topology segments for NodeGetInfo, key=value.
    #[arg(long = "additional-topology", value_parser = parse_key_value)]
    pub additional_topology: Vec<(String, String)>,
    /// Cluster id written into volume metadata.
    #[arg(long, default_value = "")]
    pub cluster: String,
    /// Serve /metrics and /healthz on this address (`:8080`, as upstream
    /// writes it, means every interface).
    #[arg(long, value_parser = plugin_runtime::parse_listen_address)]
    pub http_endpoint: Option<SocketAddr>,
    /// Node: serve `/pre-stop` (the node-driver-registrar's preStop hook,
    /// which waits while a drained node still holds the driver's volumes)
    /// on this loopback address only, e.g. `127.0.0.1:9849`: kubelet asks
    /// it from the node, and nobody else may (each ask reads the API).
    #[arg(long, value_parser = plugin_runtime::parse_loopback_address)]
    pub pre_stop_endpoint: Option<SocketAddr>,
    /// Node: where udev links block devices by serial.
    #[arg(long, default_value = "/dev/disk/by-id")]
    pub by_id_dir: PathBuf,
    /// Node: the OpenStack metadata service (instance id and zone), used
    /// when `[Metadata] search-order` names metadataService.
    #[arg(long, default_value = "http://169.254.169.254/")]
    pub metadata_url: url::Url,
    /// Node: how long NodeStageVolume waits for the device of a volume
    /// that was just attached, in seconds.
    #[arg(long, default_value_t = 30)]
    pub device_wait_secs: u64,
    /// A volume `reserved`, `attaching` or `detaching` this long (Cinder's
    /// `updated_at`) is repaired by the next ControllerPublish or
    /// ControllerUnpublish: a reservation Nova forgot is deleted and the
    /// attach tried again, a detach is asked again. At least 1: with 0
    /// every attach or detach under way would be taken for stuck.
    #[arg(long, default_value_t = 120, value_parser = clap::value_parser!(u64).range(1..))]
    pub stuck_attachment_secs: u64,
    /// CSI driver name.
    #[arg(long, default_value = crate::DEFAULT_DRIVER_NAME)]
    pub driver_name: String,
    #[command(flatten)]
    pub services: csi_common::plugin::ServiceFlags,
    #[command(flatten)]
    pub claim_annotations: csi_common::claim_annotations::ClaimAnnotationsFlag,
    /// Controller: the orphan report (volumes and snapshots tagged with
    /// --cluster that no PV or VolumeSnapshotContent names).
    #[command(flatten)]
    pub orphans: csi_common::orphans::ServeArgs,
    #[command(flatten)]
    pub log: LogArgs,
}

fn parse_key_value(s: &str) -> Result<(String, String), String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?} is not key=value"))?;
    if k.is_empty() {
        return Err(format!("{s:?} has an empty key"));
    }
    Ok((k.to_string(), v.to_string()))
}

impl Options {
    /// What this instance does not serve, for the start-up log.
    pub fn not_served(&self) -> Vec<String> {
        let mut out = Vec::new();
        if !self.services.provide_controller_service {
            out.push(
                "Controller and GroupController services (--provide-controller-service=false)"
                    .to_string(),
            );
        }
        if !self.services.provide_node_service {
            out.push("Node service (--provide-node-service=false)".to_string());
        }
        out.push("GetCapacity and PUBLISH_READONLY (see --help)".to_string());
        out
    }

    /// Checks that flags fit together.
    pub fn validate(&self) -> Result<(), String> {
        self.services.check(&self.driver_name)?;
        if self.services.provide_controller_service && self.cloud_config.is_empty() {
            return Err(
                "--cloud-config is required when the controller service is provided".into(),
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn the_pre_stop_endpoint_is_a_loopback_address_only() {
        let parse = |a: &str| {
            Options::try_parse_from([
                "cinder-csi-plugin",
                "--endpoint=unix:///csi/csi.sock",
                &format!("--pre-stop-endpoint={a}"),
            ])
            .map(|o| o.pre_stop_endpoint)
        };
        assert_eq!(parse("127.0.0.1:9849").unwrap().unwrap().port(), 9849);
        assert!(parse("[::1]:9849").is_ok());
        for outside in ["0.0.0.0:9849", ":9849", "10.0.0.5:9849", "[::]:9849"] {
            let e = parse(outside).unwrap_err().to_string();
            assert!(
                e.contains("loopback") || e.contains("not an address"),
                "{outside}: {e}"
            );
        }
    }

    #[test]
    fn klogs_verbosity_as_upstreams_charts_pass_it_sets_the_level() {
        for (flag, level) in [("-v=2", "info"), ("--v=4", "debug"), ("-v=6", "trace")] {
            let o = Options::try_parse_from([
                "cinder-csi-plugin",
                "--endpoint=unix://csi/csi.sock",
                flag,
            ])
            .unwrap();
            assert_eq!(o.log.verbosity.map(|_| ()), Some(()), "{flag}");
            if std::env::var_os("RUST_LOG").is_none() {
                assert_eq!(o.log.filter(), level, "{flag}");
            }
        }
        // --log-level wins
        let o = Options::try_parse_from([
            "cinder-csi-plugin",
            "--endpoint=unix://csi/csi.sock",
            "-v=6",
            "--log-level=warn",
        ])
        .unwrap();
        assert_eq!(o.log.filter(), "warn");
    }

    #[test]
    fn upstream_style_flags_parse() {
        let o = Options::try_parse_from([
            "cinder-csi-plugin",
            "--endpoint=unix://csi/csi.sock",
            "--cloud-config=/etc/config/cloud.conf",
            "--http-endpoint=:8080",
            "--additional-topology=topology.kubernetes.io/region=R1",
            "--with-topology=false",
            "--cloud-name=",
            "--cloud-name=region-two",
        ])
        .unwrap();
        assert_eq!(o.http_endpoint.unwrap().port(), 8080);
        assert!(!o.with_topology);
        assert_eq!(o.cloud_name, vec!["".to_string(), "region-two".to_string()]);
        assert!(o.validate().is_ok());
        let bad = Options::try_parse_from([
            "p",
            "--endpoint=/s",
            "--path-root=relative",
            "--provide-controller-service=false",
        ])
        .unwrap();
        assert!(bad.validate().is_err());
    }
}
