//! Arbitrary bytes as one or two cloud.conf files: parsing, merging and
//! resolving every cloud must never panic.

#![no_main]

use std::path::PathBuf;

use libfuzzer_sys::fuzz_target;
use openstack_client::config::{CloudConf, ConfigEnv};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    // split at a form feed to exercise merging of several files
    let files: Vec<(PathBuf, String)> = text
        .split('\u{c}')
        .enumerate()
        .map(|(i, t)| (PathBuf::from(format!("f{i}.conf")), t.to_string()))
        .collect();
    if let Ok(conf) = CloudConf::from_texts(&files, ConfigEnv::default()) {
        for name in conf.cloud_names() {
            let _ = conf.cloud(&name);
        }
        for w in &conf.warnings {
            let _ = w.to_string();
        }
    }
});
