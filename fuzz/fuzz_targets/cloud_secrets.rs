//! A Secret's `os-*` keys, as anyone who can write a Secret writes them,
//! resolved into credentials. Oracles:
//! - no panic;
//! - the password and the application credential's secret appear in no
//!   error and in no Debug output of what was resolved (they reach neither
//!   a log nor a gRPC status);
//! - nothing outside the allowed directory is read: the keys that name
//!   files (`os-cloudsFile`, `*Path`) get paths inside it, outside it,
//!   through symlinks that leave it, `..`, /proc and /etc (or any string),
//!   and no byte of an outside file (each holds the word "forbidden") shows
//!   in the result or the error; the resolved configuration never keeps a
//!   path for the session to read later.

#![no_main]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use openstack_client::config::{CloudsYamlSearch, ConfigEnv, secrets};

const MARK: &str = "\u{1}SECRET\u{1}";

struct Fixture {
    env: ConfigEnv,
    paths: Vec<String>,
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let root = std::env::temp_dir().join(format!("fuzz-secret-files-{}", std::process::id()));
        let allowed = root.join("allowed");
        let outside = root.join("outside");
        std::fs::create_dir_all(allowed.join("..2026_11_25")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        let clouds = |url: &str, pass: &str| {
            format!(
                "clouds:\n  c:\n    auth:\n      auth_url: {url}\n      username: u\n      password: {pass}\n      project_id: p\n      user_domain_name: Default\n"
            )
        };
        std::fs::write(allowed.join("ca.pem"), "-----BEGIN CERTIFICATE-----\nallowed\n").unwrap();
        std::fs::write(allowed.join("clouds.yaml"), clouds("http://allowed.example/v3", "FILEPASS")).unwrap();
        std::fs::write(allowed.join("..2026_11_25/ca.crt"), "-----BEGIN CERTIFICATE-----\n").unwrap();
        let _ = std::os::unix::fs::symlink("..2026_11_25", allowed.join("..data"));
        let _ = std::os::unix::fs::symlink("..data/ca.crt", allowed.join("ca.crt"));
        std::fs::write(outside.join("secret"), "forbidden content").unwrap();
        std::fs::write(outside.join("clouds.yaml"), clouds("http://forbidden.example/v3", "forbidden")).unwrap();
        let _ = std::os::unix::fs::symlink(outside.join("secret"), allowed.join("link-abs"));
        let _ = std::os::unix::fs::symlink("../outside/clouds.yaml", allowed.join("link-rel"));
        let a = |p: &str| allowed.join(p).display().to_string();
        let o = |p: &str| outside.join(p).display().to_string();
        let paths = vec![
            a("ca.pem"),
            a("clouds.yaml"),
            a("ca.crt"),
            a("link-abs"),
            a("link-rel"),
            a("../outside/secret"),
            a("../outside/clouds.yaml"),
            a("missing"),
            allowed.display().to_string(),
            o("secret"),
            o("clouds.yaml"),
            "/etc/passwd".into(),
            "/proc/self/environ".into(),
            String::new(),
        ];
        Fixture {
            env: ConfigEnv {
                clouds_yaml: CloudsYamlSearch {
                    dirs: vec![allowed.clone()],
                    ..Default::default()
                },
                os_cloud: None,
                secret_file_dirs: vec![PathBuf::from(&allowed)],
            },
            paths,
        }
    })
}

fuzz_target!(|input: (Vec<(u8, String)>, String)| {
    let f = fixture();
    let (pairs, secret) = input;
    let mut map = BTreeMap::new();
    for (key, value) in pairs {
        let key = secrets::SECRET_KEYS[usize::from(key) % secrets::SECRET_KEYS.len()];
        let value = if secrets::FILE_KEYS.contains(&key) {
            // a digit picks one of the fixture's paths, else the string
            // as it came
            match value.bytes().next() {
                Some(b @ b'0'..=b'9') => {
                    let i = usize::from(b - b'0') + 10 * value.len();
                    f.paths[i % f.paths.len()].clone()
                }
                _ => value,
            }
        } else {
            value
        };
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
    let shown = match secrets::cloud_from_secrets(&map, &f.env) {
        Ok(cloud) => {
            assert!(
                cloud.tls.ca_file.is_none()
                    && cloud.tls.cert_file.is_none()
                    && cloud.tls.key_file.is_none(),
                "a path kept for the session to read: {:?}",
                cloud.tls
            );
            format!("{cloud:?}")
        }
        Err(e) => format!("{e} {e:?}"),
    };
    assert!(!shown.contains(MARK), "a secret shown: {shown}");
    assert!(
        !shown.contains("FILEPASS"),
        "a password from a file shown: {shown}"
    );
    // the word is the outside files' mark only when the input did not
    // type it itself (an error may quote a value it refuses)
    let typed = map
        .values()
        .any(|v| v.to_ascii_lowercase().contains("forbidden"));
    assert!(
        typed || !shown.to_ascii_lowercase().contains("forbidden"),
        "a file outside the allowed directory was read: {shown}"
    );
});
