//! What the CSI drivers (`csi-cinder`, `csi-manila`) share, so that the
//! same rule is written once:
//!
//! - [`errors`]: the driver error enum and its one mapping to gRPC codes;
//! - [`request`]: deadlines from `grpc-timeout`, required fields, sizes,
//!   capabilities, timestamps;
//! - [`locks`]: per-key serialisation that de-duplicates in-flight calls;
//! - [`paging`]: `max_entries` and the tokens of ListVolumes/ListSnapshots;
//! - [`parameters`]: the keys the sidecars add about claims and snapshots;
//! - [`credentials`]: CSI secrets → a cached Keystone session;
//! - [`node_ops`]: request paths confined to `--path-root`, binds and
//!   unmounts, topology labels;
//! - [`orphans`]: what the cluster made in the cloud and no PV or
//!   snapshot content names any more, reported and deleted on demand;
//! - [`readiness`]: when Probe says ready;
//! - [`plugin`]: flags both binaries check alike, and why a plugin stops;
//! - [`startup_taint`]: the node's `<driver>/agent-not-ready` taint,
//!   removed once kubelet registered the driver;
//! - [`waits`]: deadline-bounded waits for OpenStack resources;
//! - [`serve_rpc!`], [`csi_service!`]: one span per RPC named after it,
//!   carrying the id it works on, and the error converted once; the tonic
//!   trait impl written from a table.

pub mod advertise;
pub mod claim_annotations;
pub mod credentials;
pub mod errors;
pub mod locks;
pub mod node_ops;
pub mod orphans;
pub mod paging;
pub mod parameters;
pub mod plugin;
pub mod pre_stop;
pub mod readiness;
pub mod registration;
pub mod request;
pub mod startup_taint;
pub mod twins;
pub mod waits;

pub use errors::{Context, DriverError, DriverResult};
pub use locks::KeyedLocks;

#[doc(hidden)]
pub use proto as __proto;
#[doc(hidden)]
pub use tonic as __tonic;
#[doc(hidden)]
/// A span field from a request, escaped and bounded (see
/// [`plugin_runtime::logging::caller_field`]).
#[doc(hidden)]
pub fn __caller_field(v: &impl std::fmt::Display) -> String {
    plugin_runtime::logging::caller_field(&v.to_string())
}
pub use tokio as __tokio;
pub use tracing as __tracing;

/// Whether an RPC changes something (in the cloud or on the node), by its
/// name: every read is a Get, a List or a Validate.
pub fn changes_something(rpc: &str) -> bool {
    !["Get", "List", "Validate"]
        .iter()
        .any(|read| rpc.contains(read))
}

/// Runs a handler `async fn method(&self, request, deadline) ->
/// DriverResult<Response>` in a span named after the RPC that carries
/// the id or name the call works on (never the request itself: it may
/// hold secrets), and converts its error to a `Status` once.
///
/// The handler runs as a task of its own, to its end or its deadline,
/// whether or not the caller still waits: a caller that gives up (a
/// sidecar's timeout) does not stop it between two cloud calls, and the
/// volume's lock it holds is released only once it is done, so that the
/// next call on that volume sees everything it did (a detach whose answer
/// was still on its way can never land after a newer attach).
///
/// Field names must not be `name` (the span's own name in JSON logs).
#[macro_export]
macro_rules! serve_rpc {
    ($self:ident, $req:ident, $rpc:literal, $field:ident = $id:expr, $method:ident) => {{
        let deadline = $crate::request::deadline_from($req.metadata());
        let started = ::std::time::Instant::now();
        let r = $req.into_inner();
        let span = $crate::__tracing::info_span!(
            $rpc,
            $field = %$crate::__caller_field(&$id(&r))
        );
        let service = ::std::clone::Clone::clone($self);
        let handler = async move { service.$method(r, deadline).await };
        let result = $crate::__tokio::spawn($crate::__tracing::Instrument::instrument(
            handler,
            span.clone(),
        ))
        .await
        .unwrap_or_else(|e| {
            Err($crate::DriverError::Internal(format!(
                "the handler of {} failed: {e}",
                $rpc
            )))
        });
        // the refusal or failure is logged in the call's span, with its id;
        // a change done is logged with its time (a move's timeline is
        // drawn from these lines), a read only at debug (a CO repeats
        // them every few seconds)
        span.in_scope(|| {
            if result.is_ok() {
                let duration_ms = started.elapsed().as_secs_f64() * 1000.0;
                if $crate::changes_something($rpc) {
                    $crate::__tracing::info!(duration_ms, "answered OK");
                } else {
                    $crate::__tracing::debug!(duration_ms, "answered OK");
                }
            }
            result
                .map($crate::__tonic::Response::new)
                .map_err($crate::__tonic::Status::from)
        })
    }};
}

/// A CSI service's tonic trait impl from a table: each RPC names its
/// request and response types (in `proto::csi::v1`), its span name, the
/// span field and how it is read from the request, and the handler
/// (`async fn(&self, request, deadline) -> DriverResult<response>`);
/// RPCs the driver does not serve answer Unimplemented with a reason;
/// anything else is written out after `verbatim`.
///
/// ```text
/// csi_common::csi_service! {
///     impl Node => NodeService {
///         rpc node_stage_volume(NodeStageVolumeRequest) -> NodeStageVolumeResponse
///             = "NodeStageVolume", volume_id = |r| r.volume_id.clone() => stage;
///         unimplemented node_expand_volume(NodeExpandVolumeRequest)
///             -> NodeExpandVolumeResponse = "no node expansion";
///         verbatim { async fn node_get_info(...) ... }
///     }
/// }
/// ```
#[macro_export]
macro_rules! csi_service {
    (
        impl $trait:path => $ty:ty {
            $(
                rpc $method:ident($req:ident) -> $resp:ident
                    = $rpc:literal, $span:ident = |$r:ident| $field:expr => $handler:ident;
            )*
            $(
                unimplemented $umethod:ident($ureq:ident) -> $uresp:ident = $why:literal;
            )*
            $( verbatim { $($extra:tt)* } )?
        }
    ) => {
        #[$crate::__tonic::async_trait]
        impl $trait for $ty {
            $(
                async fn $method(
                    &self,
                    req: $crate::__tonic::Request<$crate::__proto::csi::v1::$req>,
                ) -> ::std::result::Result<
                    $crate::__tonic::Response<$crate::__proto::csi::v1::$resp>,
                    $crate::__tonic::Status,
                > {
                    $crate::serve_rpc!(
                        self,
                        req,
                        $rpc,
                        $span = |$r: &$crate::__proto::csi::v1::$req| $field,
                        $handler
                    )
                }
            )*
            $(
                async fn $umethod(
                    &self,
                    _req: $crate::__tonic::Request<$crate::__proto::csi::v1::$ureq>,
                ) -> ::std::result::Result<
                    $crate::__tonic::Response<$crate::__proto::csi::v1::$uresp>,
                    $crate::__tonic::Status,
                > {
                    Err($crate::__tonic::Status::unimplemented($why))
                }
            )*
            $( $($extra)* )?
        }
    };
}

/// The Node service both drivers serve: stage, unstage, publish,
/// unpublish and stats by the handlers of those names, capabilities and
/// NodeGetInfo from `Self::capabilities()` and `self.node_info()`; the
/// braces say what NodeExpandVolume is (an `rpc` or `unimplemented`
/// entry of [`csi_service!`]).
#[macro_export]
macro_rules! csi_node_service {
    ($ty:ty { $($expand:tt)* }) => {
        $crate::csi_service! {
            impl $crate::__proto::csi::v1::node_server::Node => $ty {
                rpc node_stage_volume(NodeStageVolumeRequest) -> NodeStageVolumeResponse
                    = "NodeStageVolume", volume_id = |r| r.volume_id.clone() => stage;
                rpc node_unstage_volume(NodeUnstageVolumeRequest) -> NodeUnstageVolumeResponse
                    = "NodeUnstageVolume", volume_id = |r| r.volume_id.clone() => unstage;
                rpc node_publish_volume(NodePublishVolumeRequest) -> NodePublishVolumeResponse
                    = "NodePublishVolume", volume_id = |r| r.volume_id.clone() => publish;
                rpc node_unpublish_volume(NodeUnpublishVolumeRequest) -> NodeUnpublishVolumeResponse
                    = "NodeUnpublishVolume", volume_id = |r| r.volume_id.clone() => unpublish;
                rpc node_get_volume_stats(NodeGetVolumeStatsRequest) -> NodeGetVolumeStatsResponse
                    = "NodeGetVolumeStats", volume_id = |r| r.volume_id.clone() => stats;
                $($expand)*
                verbatim {
                    async fn node_get_capabilities(
                        &self,
                        _req: $crate::__tonic::Request<$crate::__proto::csi::v1::NodeGetCapabilitiesRequest>,
                    ) -> ::std::result::Result<
                        $crate::__tonic::Response<$crate::__proto::csi::v1::NodeGetCapabilitiesResponse>,
                        $crate::__tonic::Status,
                    > {
                        Ok($crate::__tonic::Response::new(
                            $crate::__proto::csi::v1::NodeGetCapabilitiesResponse {
                                capabilities: Self::capabilities(),
                            },
                        ))
                    }
                    async fn node_get_info(
                        &self,
                        _req: $crate::__tonic::Request<$crate::__proto::csi::v1::NodeGetInfoRequest>,
                    ) -> ::std::result::Result<
                        $crate::__tonic::Response<$crate::__proto::csi::v1::NodeGetInfoResponse>,
                        $crate::__tonic::Status,
                    > {
                        self.node_info()
                            .await
                            .map($crate::__tonic::Response::new)
                            .map_err($crate::__tonic::Status::from)
                    }
                }
            }
        }
    };
}

/// The Controller service both drivers serve: volumes (create, delete,
/// validate, list, get, expand) and snapshots (create, delete, list, get) by
/// the handlers of those names, capabilities from
/// `self.controller_capabilities()`; `rpcs` and `unimplemented` add what
/// differs.
#[macro_export]
macro_rules! csi_controller_service {
    ($ty:ty { rpcs { $($rpcs:tt)* } unimplemented { $($unimplemented:tt)* } }) => {
        $crate::csi_service! {
            impl $crate::__proto::csi::v1::controller_server::Controller => $ty {
                rpc create_volume(CreateVolumeRequest) -> CreateVolumeResponse
                    = "CreateVolume", volume_name = |r| r.name.clone() => create_volume;
                rpc delete_volume(DeleteVolumeRequest) -> DeleteVolumeResponse
                    = "DeleteVolume", volume_id = |r| r.volume_id.clone() => delete_volume;
                rpc validate_volume_capabilities(ValidateVolumeCapabilitiesRequest) -> ValidateVolumeCapabilitiesResponse
                    = "ValidateVolumeCapabilities", volume_id = |r| r.volume_id.clone() => validate;
                rpc list_volumes(ListVolumesRequest) -> ListVolumesResponse
                    = "ListVolumes", token = |r| r.starting_token.clone() => list_volumes;
                rpc controller_get_volume(ControllerGetVolumeRequest) -> ControllerGetVolumeResponse
                    = "ControllerGetVolume", volume_id = |r| r.volume_id.clone() => get_volume;
                rpc controller_expand_volume(ControllerExpandVolumeRequest) -> ControllerExpandVolumeResponse
                    = "ControllerExpandVolume", volume_id = |r| r.volume_id.clone() => expand;
                rpc create_snapshot(CreateSnapshotRequest) -> CreateSnapshotResponse
                    = "CreateSnapshot", snapshot_name = |r| r.name.clone() => create_snapshot;
                rpc delete_snapshot(DeleteSnapshotRequest) -> DeleteSnapshotResponse
                    = "DeleteSnapshot", snapshot_id = |r| r.snapshot_id.clone() => delete_snapshot;
                rpc list_snapshots(ListSnapshotsRequest) -> ListSnapshotsResponse
                    = "ListSnapshots", volume_id = |r| r.source_volume_id.clone() => list_snapshots;
                rpc get_snapshot(GetSnapshotRequest) -> GetSnapshotResponse
                    = "GetSnapshot", snapshot_id = |r| r.snapshot_id.clone() => get_snapshot;
                $($rpcs)*
                $($unimplemented)*
                verbatim {
                    async fn controller_get_capabilities(
                        &self,
                        _req: $crate::__tonic::Request<$crate::__proto::csi::v1::ControllerGetCapabilitiesRequest>,
                    ) -> ::std::result::Result<
                        $crate::__tonic::Response<$crate::__proto::csi::v1::ControllerGetCapabilitiesResponse>,
                        $crate::__tonic::Status,
                    > {
                        Ok($crate::__tonic::Response::new(
                            $crate::__proto::csi::v1::ControllerGetCapabilitiesResponse {
                                capabilities: self.controller_capabilities(),
                            },
                        ))
                    }
                }
            }
        }
    };
}
