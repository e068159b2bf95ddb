//! The README's configuration reference against the code: each binary's
//! flags as its `--help` lists them, the cloud.conf keys the parser reads,
//! and the class parameters each driver reads. A flag, key or parameter
//! added, removed or renamed on either side fails here.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;

use csi_manila::ShareProtocol;
use openstack_client::config::{CloudConf, ConfigEnv, KNOWN_KEYS};

fn readme() -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md")).unwrap()
}

/// The rows of the first table under the heading that starts with
/// `heading`: each row's cells, without backticks.
fn table(heading: &str) -> Vec<Vec<String>> {
    let text = readme();
    let mut lines = text.lines().skip_while(|l| !l.starts_with(heading));
    assert!(lines.next().is_some(), "README has no heading {heading:?}");
    lines
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2) // header and separator
        .map(|l| {
            l.trim_matches('|')
                .split(" | ")
                .map(|c| c.trim().trim_matches('`').to_string())
                .collect()
        })
        .collect()
}

/// Long flags a binary's `--help` lists.
fn help_flags(binary: &Path) -> BTreeSet<String> {
    let out = Command::new(binary).arg("--help").output().unwrap();
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let l = l.trim_start();
            let l = l
                .strip_prefix("-h, ")
                .or_else(|| l.strip_prefix("-V, "))
                .unwrap_or(l);
            let flag = l.strip_prefix("--")?;
            let name: String = flag
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect();
            Some(format!("--{name}"))
        })
        .collect()
}

fn binaries() -> PathBuf {
    csi_sanity::harness::workspace_binaries().unwrap()
}

#[test]
fn every_flag_of_every_binary_is_in_the_readme_and_no_other() {
    let bins = binaries();
    for name in [
        "cinder-csi-plugin",
        "manila-csi-plugin",
        "barbican-kms-plugin",
        "suite-walk",
    ] {
        let documented: BTreeSet<String> = table(&format!("### Flags of `{name}`"))
            .into_iter()
            .map(|r| r[0].clone())
            .collect();
        let served = help_flags(&bins.join(name));
        assert_eq!(
            documented, served,
            "README flags of {name} (left) differ from its --help (right)"
        );
    }
}

/// A value the parser accepts for `key`.
fn sample(key: &str) -> &'static str {
    match key {
        "tls-insecure"
        | "use-clouds"
        | "rescan-on-resize"
        | "ignore-volume-az"
        | "ignore-volume-microversion" => "false",
        "os-endpoint-type" => "public",
        "node-volume-attach-limit" => "25",
        "request-timeout" => "5s",
        "search-order" => "configDrive,metadataService",
        "auth-url" => "https://keystone.example.com:5000/v3",
        _ => "x",
    }
}

#[test]
fn the_cloud_conf_table_is_what_the_parser_reads() {
    let rows = table("### cloud.conf");
    let documented: BTreeSet<(String, String)> =
        rows.iter().map(|r| (r[0].clone(), r[1].clone())).collect();
    let known: BTreeSet<(String, String)> = KNOWN_KEYS
        .iter()
        .flat_map(|(s, keys)| keys.iter().map(|k| (s.to_string(), k.to_string())))
        .collect();
    assert_eq!(
        documented, known,
        "README cloud.conf keys (left) differ from the parser's (right)"
    );
    // and the parser takes each as written there, without a warning
    let parse = |section: &str, key: &str, value: &str| {
        CloudConf::from_texts(
            &[(
                PathBuf::from("cloud.conf"),
                format!("[{section}]\n{key} = {value}\n"),
            )],
            ConfigEnv::default(),
        )
        .unwrap_or_else(|e| panic!("[{section}] {key}: {e}"))
        .warnings
    };
    for (section, key) in &documented {
        let warnings = parse(section, key, sample(key));
        assert!(warnings.is_empty(), "[{section}] {key}: {warnings:?}");
    }
    assert!(
        !parse("Global", "auth-ulr", "x").is_empty(),
        "a misspelt key is noticed"
    );
}

fn rows_of(heading: &str, class: &str) -> Vec<(String, String)> {
    table(heading)
        .into_iter()
        .filter(|r| r[0] == class)
        .map(|r| (r[1].clone(), r[2].clone()))
        .collect()
}

fn one(key: &str, value: &str) -> HashMap<String, String> {
    HashMap::from([(key.to_string(), value.to_string())])
}

fn names(rows: &[(String, String)]) -> BTreeSet<String> {
    rows.iter().map(|(k, _)| k.clone()).collect()
}

fn set(keys: &[&str]) -> BTreeSet<String> {
    keys.iter().map(|k| k.to_string()).collect()
}

#[test]
fn the_cinder_class_parameters_are_what_the_driver_reads() {
    use csi_cinder::parameters::*;
    const H: &str = "### Cinder: StorageClass";
    // `metadata.<key>` rows stand for every key of the prefix
    let (sc_md, sc): (Vec<_>, Vec<_>) = rows_of(H, "StorageClass")
        .into_iter()
        .partition(|(k, _)| k.starts_with(CLASS_METADATA_PREFIX));
    assert_eq!(names(&sc), set(STORAGE_CLASS_KEYS));
    for (k, v) in &sc {
        let p = VolumeParameters::parse(&one(k, v), &HashMap::new())
            .unwrap_or_else(|e| panic!("StorageClass {k}={v}: {e:?}"));
        assert!(
            p.ignored.is_empty(),
            "StorageClass {k} is ignored by the driver"
        );
    }
    assert!(!sc_md.is_empty(), "the StorageClass's metadata.<key> row");
    for (k, v) in &sc_md {
        let p = VolumeParameters::parse(&one(k, v), &HashMap::new())
            .unwrap_or_else(|e| panic!("StorageClass {k}={v}: {e:?}"));
        assert_eq!(
            p.class_metadata.len(),
            1,
            "StorageClass {k} sets no metadata"
        );
    }
    let vsc = rows_of(H, "VolumeSnapshotClass");
    assert_eq!(names(&vsc), set(SNAPSHOT_CLASS_KEYS));
    for (k, v) in &vsc {
        let p = SnapshotParameters::parse(&one(k, v))
            .unwrap_or_else(|e| panic!("VolumeSnapshotClass {k}={v}: {e:?}"));
        assert!(
            p.ignored.is_empty(),
            "VolumeSnapshotClass {k} is ignored by the driver"
        );
    }
    let (vac_md, vac): (Vec<_>, Vec<_>) = rows_of(H, "VolumeAttributesClass")
        .into_iter()
        .partition(|(k, _)| k.starts_with(CLASS_METADATA_PREFIX));
    assert_eq!(names(&vac), set(VOLUME_ATTRIBUTES_CLASS_KEYS));
    for (k, v) in &vac {
        MutableParameters::parse(&one(k, v))
            .unwrap_or_else(|e| panic!("VolumeAttributesClass {k}={v}: {e:?}"));
    }
    assert!(
        !vac_md.is_empty(),
        "the VolumeAttributesClass's metadata.<key> row"
    );
    for (k, v) in &vac_md {
        let p = MutableParameters::parse(&one(k, v))
            .unwrap_or_else(|e| panic!("VolumeAttributesClass {k}={v}: {e:?}"));
        assert_eq!(
            p.class_metadata.len(),
            1,
            "VolumeAttributesClass {k} sets no metadata"
        );
    }
    // and an unknown key is ignored, not refused (upstream's classes)
    let p = VolumeParameters::parse(&one("unheard-of", "1"), &HashMap::new()).unwrap();
    assert_eq!(p.ignored, vec!["unheard-of".to_string()]);
}

#[test]
fn the_manila_parameters_are_what_the_driver_reads() {
    use csi_manila::parameters::*;
    const H: &str = "### Manila: StorageClass";
    let sc = rows_of(H, "StorageClass");
    assert_eq!(names(&sc), set(STORAGE_CLASS_KEYS));
    for (k, v) in &sc {
        let protocol = if k.starts_with("nfs-") {
            ShareProtocol::Nfs
        } else {
            ShareProtocol::Cephfs
        };
        let p = ShareParameters::parse(&one(k, v), protocol)
            .unwrap_or_else(|e| panic!("StorageClass {k}={v}: {e:?}"));
        assert!(
            p.ignored.is_empty(),
            "StorageClass {k} is ignored by the driver"
        );
    }
    let attrs = rows_of(H, "PersistentVolume attribute");
    assert_eq!(names(&attrs), set(VOLUME_ATTRIBUTE_KEYS));
    for (k, v) in &attrs {
        NodeParameters::parse(&one(k, v))
            .unwrap_or_else(|e| panic!("volume attribute {k}={v}: {e:?}"));
        // a key the node reads refuses an empty value; one it does not
        // know is passed over
        assert!(
            NodeParameters::parse(&one(k, "")).is_err(),
            "{k} is not read by the node"
        );
    }
    assert!(NodeParameters::parse(&one("unheard-of", "")).is_ok());
}
