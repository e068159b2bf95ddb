//! The driver's errors: the shared [`DriverError`] and its one mapping to
//! gRPC codes, plus what only Cinder and Nova answers mean.

pub use csi_common::errors::{Context, DriverError, DriverResult};

/// Nova's refusal to attach past its per-server device limit (`[compute]
/// max_disk_devices_to_attach`, a 403 `TooManyDiskDevices`): the node is
/// full, which the CSI spec answers ResourceExhausted ("max volumes
/// attached to node"), not PermissionDenied.
pub fn attach_error(e: openstack_client::Error, volume_id: &str, node: &str) -> DriverError {
    match e {
        openstack_client::Error::Forbidden(ref api)
            if api
                .message
                .contains("maximum allowed number of disk devices") =>
        {
            DriverError::ResourceExhausted(format!(
                "node {node} cannot take volume {volume_id}: {}",
                api.message
            ))
        }
        e => DriverError::Cloud {
            context: format!("attaching volume {volume_id} to {node}"),
            source: Box::new(e),
        },
    }
}
