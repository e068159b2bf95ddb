//! The suite's only door to OpenStack.
//!
//! Everything that knows OpenStack's wire format lives here; the drivers
//! see domain types ([`cinder::Volume`], [`manila::Share`], ...) and one
//! error enum ([`Error`]).
//!
//! ```no_run
//! # async fn demo() -> Result<(), openstack_client::Error> {
//! use openstack_client::{config::{CloudConf, ConfigEnv}, Session, SessionOptions, cinder::BlockStorage};
//! let conf = CloudConf::load(&["/etc/kubernetes/cloud.conf".into()], ConfigEnv::from_process())?;
//! let session = Session::new(conf.cloud("")?, SessionOptions::default())?;
//! let volume = BlockStorage::new(session).get_volume("4b0f…").await?;
//! # Ok(()) }
//! ```

pub mod barbican;
pub mod cinder;
pub mod common;
pub mod config;
pub mod error;
pub mod identity;
pub mod manila;
pub mod metadata;
pub mod metrics;
pub mod nova;
pub mod reload;
pub mod secret;
pub mod service;
pub mod session;

pub use error::{ApiError, Error, Result};
pub use metrics::ApiMetrics;
pub use secret::SecretString;
pub use service::{Interface, ServiceType};
pub use session::{RetryPolicy, Session, SessionOptions};
