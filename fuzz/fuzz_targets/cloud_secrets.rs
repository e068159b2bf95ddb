//! A Secret's `os-*` keys, as anyone who can write a Secret writes them,
//! resolved into credentials. Oracles: no panic; the password and the
//! application credential's secret appear in no error and in no Debug
//! output of what was resolved (they reach neither a log nor a gRPC
//! status). Keys that name files (`os-useClouds`, `os-cloudsFile`,
//! `*Path`) are left out here: what a Secret may make the plugin read is
//! the hardening issue's oracle.

#![no_main]

use std::collections::BTreeMap;

use libfuzzer_sys::fuzz_target;
use openstack_client::config::{ConfigEnv, secrets};

const MARK: &str = "\u{1}SECRET\u{1}";

fuzz_target!(|input: (Vec<(u8, String)>, String)| {
    let (pairs, secret) = input;
    let mut map = BTreeMap::new();
    for (key, value) in pairs {
        let key = secrets::SECRET_KEYS[usize::from(key) % secrets::SECRET_KEYS.len()];
        if key == "os-useClouds" || key == "os-cloudsFile" || key.ends_with("Path") {
            continue;
        }
        map.insert(key.to_string(), value);
    }
    let secret = format!("{MARK}{secret}");
    for key in [
        "os-password",
        "os-applicationCredentialSecret",
        "os-trusteePassword",
    ] {
        if map.contains_key(key) {
            map.insert(key.to_string(), secret.clone());
        }
    }
    let _ = secrets::has_credentials(&map);
    let _ = secrets::unknown_keys(&map);
    let shown = match secrets::cloud_from_secrets(&map, &ConfigEnv::default()) {
        Ok(cloud) => format!("{cloud:?}"),
        Err(e) => format!("{e} {e:?}"),
    };
    assert!(!shown.contains(MARK), "a secret shown: {shown}");
});
