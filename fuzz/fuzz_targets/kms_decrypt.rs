//! Arbitrary Decrypt input (ciphertext, in either format) against a fixed
//! key: opening must never panic, and must never yield plaintext for a
//! ciphertext this key did not seal.

#![no_main]

use kms_barbican::envelope::Kek;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let kek = Kek::new("6f1c7d0e-0000-4000-8000-000000000001", &[7u8; 32]).expect("a 32-byte key");
    if let Ok(pt) = kek.open(data) {
        // authenticity: only a genuine seal opens; the fuzzer cannot forge
        // a GCM tag, so reaching here means the input was a real ciphertext
        assert!(!pt.is_empty());
    }
    let _ = kek.open_legacy(data);
});
