//! CSI conformance checks, in the manner of csi-sanity, against any CSI
//! plugin on a Unix socket. Each check returns the spec violations it
//! found; an empty list is a pass.

use std::path::Path;

pub mod harness;
pub mod logs;
pub mod suite;

pub use suite::{Outcome, Report, Suite, SuiteConfig};

use proto::csi::v1 as csi;
use proto::csi::v1::identity_client::IdentityClient;

/// A spec violation: which check, and what was wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub check: &'static str,
    pub problem: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.check, self.problem)
    }
}

fn violation(check: &'static str, problem: impl Into<String>) -> Violation {
    Violation {
        check,
        problem: problem.into(),
    }
}

/// The Identity service checks: GetPluginInfo (name per the spec's rules,
/// a vendor version), GetPluginCapabilities (known types only), Probe.
pub async fn check_identity(socket: &Path) -> Result<Vec<Violation>, tonic::transport::Error> {
    let mut out = Vec::new();
    let mut id = IdentityClient::new(plugin_runtime::connect_unix(socket).await?);

    match id.get_plugin_info(csi::GetPluginInfoRequest {}).await {
        Ok(r) => {
            let info = r.into_inner();
            if let Err(e) = plugin_runtime::csi_identity::validate_driver_name(&info.name) {
                out.push(violation("GetPluginInfo", e));
            }
            if info.vendor_version.is_empty() {
                out.push(violation("GetPluginInfo", "vendor_version is empty"));
            }
        }
        Err(s) => out.push(violation("GetPluginInfo", format!("failed: {s}"))),
    }

    match id
        .get_plugin_capabilities(csi::GetPluginCapabilitiesRequest {})
        .await
    {
        Ok(r) => {
            use csi::plugin_capability::Type;
            for cap in r.into_inner().capabilities {
                let known = match cap.r#type {
                    Some(Type::Service(s)) => {
                        csi::plugin_capability::service::Type::try_from(s.r#type)
                            .is_ok_and(|t| t != csi::plugin_capability::service::Type::Unknown)
                    }
                    Some(Type::VolumeExpansion(e)) => {
                        csi::plugin_capability::volume_expansion::Type::try_from(e.r#type)
                            .is_ok_and(|t| {
                                t != csi::plugin_capability::volume_expansion::Type::Unknown
                            })
                    }
                    None => false,
                };
                if !known {
                    out.push(violation(
                        "GetPluginCapabilities",
                        format!("unknown or empty capability {cap:?}"),
                    ));
                }
            }
        }
        Err(s) => out.push(violation("GetPluginCapabilities", format!("failed: {s}"))),
    }

    if let Err(s) = id.probe(csi::ProbeRequest {}).await {
        out.push(violation("Probe", format!("failed: {s}")));
    }
    Ok(out)
}
