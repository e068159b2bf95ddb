//! The envelope under fuzzer-chosen input, with oracles that fail when
//! authentication breaks:
//! - a plaintext sealed under a key opens to exactly itself;
//! - no single-bit change of that ciphertext, no truncation and no
//!   extension opens at all;
//! - the same key bytes under another key id refuse it (the id is bound);
//! - arbitrary Decrypt input, in either format, never panics.

#![no_main]

use kms_barbican::envelope::{EnvelopeError, Kek};
use libfuzzer_sys::fuzz_target;
use ring::rand::SystemRandom;

const KEY: [u8; 32] = [7u8; 32];

fuzz_target!(|data: &[u8]| {
    let kek = Kek::new("6f1c7d0e-0000-4000-8000-000000000001", &KEY).expect("a 32-byte key");
    let _ = kek.open(data);
    let _ = kek.open_legacy(data);

    let sealed = match kek.seal(&SystemRandom::new(), data) {
        Ok(ct) => ct,
        Err(EnvelopeError::EmptyPlaintext | EnvelopeError::PlaintextTooLong(_)) => return,
        Err(e) => panic!("sealing {} bytes failed: {e}", data.len()),
    };
    let opened = kek.open(&sealed).expect("a sealed plaintext opens");
    assert_eq!(
        opened.as_slice(),
        data,
        "the round trip changed the plaintext"
    );

    for i in 0..sealed.len() {
        let mut changed = sealed.clone();
        changed[i] ^= 1 << (data[i % data.len()] % 8);
        assert!(
            kek.open(&changed).is_err(),
            "byte {i} of {} changed and it still opened",
            sealed.len()
        );
    }
    assert!(
        kek.open(&sealed[..sealed.len() - 1]).is_err(),
        "a truncated ciphertext opened"
    );
    let mut longer = sealed.clone();
    longer.push(data[0]);
    assert!(kek.open(&longer).is_err(), "an extended ciphertext opened");

    let other_id = Kek::new("6f1c7d0e-0000-4000-8000-000000000002", &KEY).expect("a 32-byte key");
    assert!(
        other_id.open(&sealed).is_err(),
        "another key id opened it: the id is not bound"
    );
});
