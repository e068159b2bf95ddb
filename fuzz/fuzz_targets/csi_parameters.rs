//! StorageClass parameters, mutable parameters and volume attributes, as
//! a caller writes them, through both drivers' parsers. Oracles: no
//! panic; the same map gives the same answer whatever the order its keys
//! are visited in (two maps built in opposite orders, each with its own
//! random hasher); what is accepted comes from the input.

#![no_main]

use std::collections::HashMap;

use csi_manila::ShareProtocol;
use libfuzzer_sys::fuzz_target;

type Pairs = Vec<(String, String)>;

fn maps(pairs: &Pairs) -> (HashMap<String, String>, HashMap<String, String>) {
    // later pairs win in both, as in a map literal
    let forward: HashMap<_, _> = pairs.iter().cloned().collect();
    let mut backward = HashMap::new();
    for (k, v) in pairs.iter().rev() {
        backward.entry(k.clone()).or_insert_with(|| v.clone());
    }
    (forward, backward)
}

fuzz_target!(|input: (Pairs, Pairs, String)| {
    let (params, mutable, clients) = input;
    let (p1, p2) = maps(&params);
    let (m1, m2) = maps(&mutable);

    use csi_cinder::parameters::{MutableParameters, VolumeParameters};
    let a = VolumeParameters::parse(&p1, &m1).map_err(|e| e.to_string());
    let b = VolumeParameters::parse(&p2, &m2).map_err(|e| e.to_string());
    assert_eq!(
        a.is_ok(),
        b.is_ok(),
        "Cinder: the key order decided: {a:?} / {b:?}"
    );
    if let (Ok(a), Ok(b)) = (&a, &b) {
        assert_eq!(a, b, "Cinder: the key order decided");
        for (k, v) in &a.metadata {
            assert!(
                p1.get(k) == Some(v) || m1.get(k) == Some(v),
                "Cinder: metadata {k:?} made up"
            );
        }
    }
    let a = MutableParameters::parse(&m1).map_err(|e| e.to_string());
    let b = MutableParameters::parse(&m2).map_err(|e| e.to_string());
    assert_eq!(
        a.is_ok(),
        b.is_ok(),
        "Cinder mutable: the key order decided: {a:?} / {b:?}"
    );
    if let (Ok(a), Ok(b)) = (&a, &b) {
        assert_eq!(a, b, "Cinder mutable: the key order decided");
    }

    use csi_manila::parameters::{NodeParameters, ShareParameters, parse_share_clients};
    for protocol in [ShareProtocol::Nfs, ShareProtocol::Cephfs] {
        let a = ShareParameters::parse(&p1, protocol).map_err(|e| e.to_string());
        let b = ShareParameters::parse(&p2, protocol).map_err(|e| e.to_string());
        assert_eq!(
            a.is_ok(),
            b.is_ok(),
            "Manila {protocol:?}: the key order decided: {a:?} / {b:?}"
        );
        if let (Ok(a), Ok(b)) = (&a, &b) {
            assert_eq!(a, b, "Manila {protocol:?}: the key order decided");
        }
    }
    let a = NodeParameters::parse(&p1).map_err(|e| e.to_string());
    let b = NodeParameters::parse(&p2).map_err(|e| e.to_string());
    assert_eq!(
        a.is_ok(),
        b.is_ok(),
        "Manila node: the key order decided: {a:?} / {b:?}"
    );
    if let (Ok(a), Ok(b)) = (&a, &b) {
        assert_eq!(a, b, "Manila node: the key order decided");
    }
    if let Ok(list) = parse_share_clients(&clients) {
        for c in &list {
            assert!(
                !c.is_empty(),
                "an empty share client accepted from {clients:?}"
            );
        }
    }
});
