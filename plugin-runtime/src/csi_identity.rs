//! The CSI Identity service both CSI drivers serve: name, version,
//! advertised capabilities, and a readiness probe supplied by the driver.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use proto::csi::v1 as csi;
use proto::csi::v1::identity_server::Identity;
use tonic::{Request, Response, Status};

/// Whether the driver is ready: `Ok(true)` ready, `Ok(false)` still
/// starting, `Err` unhealthy (the CO may restart it).
pub type ProbeFn =
    Arc<dyn Fn() -> Pin<Box<dyn Future<Output = Result<bool, Status>> + Send>> + Send + Sync>;

#[derive(Clone)]
pub struct IdentityService {
    name: String,
    vendor_version: String,
    capabilities: Vec<csi::PluginCapability>,
    probe: ProbeFn,
}

impl std::fmt::Debug for IdentityService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdentityService")
            .field("name", &self.name)
            .finish()
    }
}

/// Why a driver name is not acceptable to the CSI spec.
pub fn validate_driver_name(name: &str) -> Result<(), String> {
    let ok_len = !name.is_empty() && name.len() <= 63;
    let ok_chars = name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.');
    let ok_ends = name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric());
    if ok_len && ok_chars && ok_ends {
        Ok(())
    } else {
        Err(format!(
            "driver name {name:?} must be 1-63 characters of [a-zA-Z0-9.-], beginning and ending with an alphanumeric"
        ))
    }
}

pub fn service_capability(t: csi::plugin_capability::service::Type) -> csi::PluginCapability {
    csi::PluginCapability {
        r#type: Some(csi::plugin_capability::Type::Service(
            csi::plugin_capability::Service { r#type: t as i32 },
        )),
    }
}

pub fn expansion_capability(
    t: csi::plugin_capability::volume_expansion::Type,
) -> csi::PluginCapability {
    csi::PluginCapability {
        r#type: Some(csi::plugin_capability::Type::VolumeExpansion(
            csi::plugin_capability::VolumeExpansion { r#type: t as i32 },
        )),
    }
}

impl IdentityService {
    pub fn new(
        name: String,
        vendor_version: String,
        capabilities: Vec<csi::PluginCapability>,
        probe: ProbeFn,
    ) -> Self {
        Self {
            name,
            vendor_version,
            capabilities,
            probe,
        }
    }
}

#[tonic::async_trait]
impl Identity for IdentityService {
    async fn get_plugin_info(
        &self,
        _r: Request<csi::GetPluginInfoRequest>,
    ) -> Result<Response<csi::GetPluginInfoResponse>, Status> {
        Ok(Response::new(csi::GetPluginInfoResponse {
            name: self.name.clone(),
            vendor_version: self.vendor_version.clone(),
            manifest: Default::default(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _r: Request<csi::GetPluginCapabilitiesRequest>,
    ) -> Result<Response<csi::GetPluginCapabilitiesResponse>, Status> {
        Ok(Response::new(csi::GetPluginCapabilitiesResponse {
            capabilities: self.capabilities.clone(),
        }))
    }

    async fn probe(
        &self,
        _r: Request<csi::ProbeRequest>,
    ) -> Result<Response<csi::ProbeResponse>, Status> {
        let ready = (self.probe)().await?;
        Ok(Response::new(csi::ProbeResponse { ready: Some(ready) }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn driver_names() {
        assert!(validate_driver_name("cinder.csi.openstack.org").is_ok());
        assert!(validate_driver_name("nfs.manila.csi.openstack.org").is_ok());
        assert!(validate_driver_name("-bad").is_err());
        assert!(validate_driver_name("bad_name").is_err());
        assert!(validate_driver_name(&"a".repeat(64)).is_err());
        assert!(validate_driver_name("").is_err());
    }
}
