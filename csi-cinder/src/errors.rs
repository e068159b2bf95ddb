//! The driver's errors: the shared [`DriverError`] and its one mapping to
//! gRPC codes, plus what only Cinder and Nova answers mean.

pub use csi_common::errors::{Context, DriverError, DriverResult};
