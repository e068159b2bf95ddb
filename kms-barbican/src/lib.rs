//! The Barbican KMS v2 plugin: envelope-encrypts the apiserver's data-key
//! seeds with AES-256-GCM under a key-encryption key held in Barbican,
//! cached in memory and refreshed in the background.

pub mod envelope;
pub mod key_record;
pub mod keyring;
pub mod keystore;
pub mod options;
pub mod plugin;
pub mod service;
