//! The capability lists the drivers advertise, from the RPC types they
//! serve.

use proto::csi::v1 as csi;
use proto::csi::v1::controller_service_capability::rpc::Type as ControllerRpc;
use proto::csi::v1::group_controller_service_capability::rpc::Type as GroupRpc;
use proto::csi::v1::node_service_capability::rpc::Type as NodeRpc;

pub fn controller(rpcs: &[ControllerRpc]) -> Vec<csi::ControllerServiceCapability> {
    rpcs.iter()
        .map(|t| csi::ControllerServiceCapability {
            r#type: Some(csi::controller_service_capability::Type::Rpc(
                csi::controller_service_capability::Rpc { r#type: *t as i32 },
            )),
        })
        .collect()
}

pub fn node(rpcs: &[NodeRpc]) -> Vec<csi::NodeServiceCapability> {
    rpcs.iter()
        .map(|t| csi::NodeServiceCapability {
            r#type: Some(csi::node_service_capability::Type::Rpc(
                csi::node_service_capability::Rpc { r#type: *t as i32 },
            )),
        })
        .collect()
}

pub fn group_controller(rpcs: &[GroupRpc]) -> Vec<csi::GroupControllerServiceCapability> {
    rpcs.iter()
        .map(|t| csi::GroupControllerServiceCapability {
            r#type: Some(csi::group_controller_service_capability::Type::Rpc(
                csi::group_controller_service_capability::Rpc { r#type: *t as i32 },
            )),
        })
        .collect()
}
