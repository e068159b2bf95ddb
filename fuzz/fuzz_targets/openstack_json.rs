//! What an OpenStack service (or something posing as one) answers, through
//! the types the clients parse it into, and the message pulled out of an
//! error body. Oracles: no panic, whatever the JSON; a parsed answer is
//! one the same bytes always give; an error message is never empty and
//! never longer than its bound (a cloud cannot flood our logs or gRPC
//! statuses through it).

#![no_main]

use libfuzzer_sys::fuzz_target;
use openstack_client::{barbican, cinder, error, manila, metadata, nova};
use serde::de::DeserializeOwned;

fn parses<T: DeserializeOwned + PartialEq + std::fmt::Debug>(body: &[u8]) -> Option<T> {
    let first = serde_json::from_slice::<T>(body).ok()?;
    let again = serde_json::from_slice::<T>(body).expect("the same bytes parse twice");
    assert_eq!(first, again);
    let _ = format!("{first:?}");
    Some(first)
}

fuzz_target!(|data: &[u8]| {
    let Some((&which, body)) = data.split_first() else {
        return;
    };
    match which % 16 {
        0 => drop(parses::<cinder::Volume>(body)),
        1 => drop(parses::<cinder::Snapshot>(body)),
        2 => drop(parses::<cinder::VolumeType>(body)),
        3 => drop(parses::<cinder::Backup>(body)),
        4 => drop(parses::<cinder::Group>(body)),
        5 => drop(parses::<cinder::GroupSnapshot>(body)),
        6 => {
            if let Some(s) = parses::<nova::Server>(body) {
                assert!(
                    s.local_disks() <= 3,
                    "more local disks than a server has kinds of"
                );
            }
        }
        7 => drop(parses::<nova::ServerVolumeAttachment>(body)),
        8 => drop(parses::<manila::Share>(body)),
        9 => drop(parses::<manila::ExportLocation>(body)),
        10 => drop(parses::<manila::AccessRule>(body)),
        11 => drop(parses::<manila::ShareSnapshot>(body)),
        12 => drop(parses::<manila::UserMessage>(body)),
        13 => drop(parses::<metadata::InstanceMetadata>(body)),
        14 => drop(parses::<barbican::SecretMetadata>(body)),
        _ => {
            let m = error::error_message_from_body(body);
            assert!(!m.is_empty(), "an empty error message");
            assert!(
                m.len() <= 512 + '…'.len_utf8(),
                "an error message of {} bytes",
                m.len()
            );
        }
    }
});
