//! What the CSI drivers (`csi-cinder`, `csi-manila`) share, so that the
//! same rule is written once:
//!
//! - [`errors`]: the driver error enum and its one mapping to gRPC codes;
//! - [`request`]: deadlines from `grpc-timeout`, required fields, sizes,
//!   capabilities, timestamps;
//! - [`locks`]: per-key serialisation that de-duplicates in-flight calls;
//! - [`paging`]: `max_entries` and the tokens of ListVolumes/ListSnapshots;
//! - [`credentials`]: CSI secrets → a cached Keystone session;
//! - [`node_ops`]: request paths confined to `--path-root`, binds and
//!   unmounts, topology labels;
//! - [`readiness`]: when Probe says ready;
//! - [`waits`]: deadline-bounded waits for OpenStack resources;
//! - [`serve_rpc!`]: one span per RPC named after it, carrying the id it
//!   works on, and the error converted once.

pub mod credentials;
pub mod errors;
pub mod locks;
pub mod node_ops;
pub mod paging;
pub mod readiness;
pub mod request;
pub mod waits;

pub use errors::{Context, DriverError, DriverResult};
pub use locks::KeyedLocks;

/// Runs a handler `async fn method(&self, request, deadline) ->
/// DriverResult<Response>` in a span named after the RPC that carries
/// the id or name the call works on (never the request itself: it may
/// hold secrets), and converts its error to a `Status` once.
///
/// Field names must not be `name` (the span's own name in JSON logs).
#[macro_export]
macro_rules! serve_rpc {
    ($self:ident, $req:ident, $rpc:literal, $field:ident = $id:expr, $method:ident) => {{
        let deadline = $crate::request::deadline_from($req.metadata());
        let r = $req.into_inner();
        let span = ::tracing::info_span!($rpc, $field = %$id(&r));
        ::tracing::Instrument::instrument($self.$method(r, deadline), span)
            .await
            .map(::tonic::Response::new)
            .map_err(::tonic::Status::from)
    }};
}
