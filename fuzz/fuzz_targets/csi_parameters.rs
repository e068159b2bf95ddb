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

/// Both answers alike: both refused, or both the same value.
fn same_answer<T: PartialEq + std::fmt::Debug, E: ToString>(
    what: &str,
    a: Result<T, E>,
    b: Result<T, E>,
) -> Option<T> {
    let (a, b) = (a.map_err(|e| e.to_string()), b.map_err(|e| e.to_string()));
    match (a, b) {
        (Ok(a), Ok(b)) => {
            assert_eq!(a, b, "{what}: the key order decided");
            Some(a)
        }
        (Err(_), Err(_)) => None,
        (a, b) => panic!("{what}: the key order decided: {a:?} / {b:?}"),
    }
}

fuzz_target!(|input: (Pairs, Pairs, String)| {
    let (params, mutable, clients) = input;
    let (p1, p2) = maps(&params);
    let (m1, m2) = maps(&mutable);

    use csi_cinder::parameters::{MutableParameters, VolumeParameters};
    let cinder = same_answer(
        "Cinder",
        VolumeParameters::parse(&p1, &m1),
        VolumeParameters::parse(&p2, &m2),
    );
    for (k, v) in cinder.iter().flat_map(|p| &p.metadata) {
        assert!(
            p1.get(k) == Some(v) || m1.get(k) == Some(v),
            "Cinder: metadata {k:?} made up"
        );
    }
    same_answer(
        "Cinder mutable",
        MutableParameters::parse(&m1),
        MutableParameters::parse(&m2),
    );

    use csi_manila::parameters::{NodeParameters, ShareParameters, parse_share_clients};
    for protocol in [ShareProtocol::Nfs, ShareProtocol::Cephfs] {
        same_answer(
            &format!("Manila {protocol:?}"),
            ShareParameters::parse(&p1, protocol),
            ShareParameters::parse(&p2, protocol),
        );
    }
    same_answer(
        "Manila node",
        NodeParameters::parse(&p1),
        NodeParameters::parse(&p2),
    );
    if let Ok(list) = parse_share_clients(&clients) {
        for c in &list {
            assert!(
                !c.is_empty(),
                "an empty share client accepted from {clients:?}"
            );
        }
    }
});
