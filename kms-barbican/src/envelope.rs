//! The ciphertext format, the `key_id` and the legacy format.
//!
//! A ciphertext is `0x01 ‖ nonce (12 bytes) ‖ AES-256-GCM(seed) ‖ tag (16)`.
//! The authenticated data binds the format version and the `key_id`, so a
//! ciphertext presented with another `key_id` or format fails to open.
//!
//! A `key_id` is `<Barbican secret UUID>:<fingerprint>`, the fingerprint
//! being 16 hex digits of HMAC-SHA256 keyed with the key-encryption key: a
//! changed payload under the same secret is a new `key_id`, and the key
//! itself cannot be recovered from it.
//!
//! The upstream Go plugin's format (AES-256-CBC, a 16-byte IV prefix,
//! PKCS#7, `key_id` = the bare secret UUID) is accepted by Decrypt so that
//! operators can switch plugins without re-encrypting; it is never
//! produced.

use aes::cipher::{BlockDecryptMut, KeyIvInit, block_padding::Pkcs7};
use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::rand::{SecureRandom, SystemRandom};
use zeroize::Zeroizing;

/// Byte that starts every ciphertext of this format.
pub const FORMAT_V1: u8 = 1;
/// Annotation naming the format; its value is [`FORMAT_V1_NAME`].
pub const FORMAT_ANNOTATION: &str = "format.barbican-kms.openstack.org";
pub const FORMAT_V1_NAME: &[u8] = b"aes-256-gcm/v1";
pub const KEY_LEN: usize = 32;
const TAG_LEN: usize = 16;
/// The apiserver rejects ciphertexts over 1024 bytes.
pub const MAX_CIPHERTEXT: usize = 1024;
pub const MAX_PLAINTEXT: usize = MAX_CIPHERTEXT - 1 - NONCE_LEN - TAG_LEN;
/// The shortest ciphertext either format produces (one byte sealed).
pub const MIN_CIPHERTEXT: usize = 1 + NONCE_LEN + TAG_LEN + 1;
pub const MAX_KEY_ID: usize = 1024;

#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum EnvelopeError {
    #[error("plaintext is empty")]
    EmptyPlaintext,
    #[error("plaintext of {0} bytes is over the {MAX_PLAINTEXT} bytes this format allows")]
    PlaintextTooLong(usize),
    #[error("ciphertext of {0} bytes is shorter than any this plugin produces")]
    CiphertextTooShort(usize),
    #[error("ciphertext of {0} bytes is over {MAX_CIPHERTEXT} bytes")]
    CiphertextTooLong(usize),
    #[error("ciphertext format {0:#04x} is unknown")]
    UnknownFormat(u8),
    #[error(
        "ciphertext does not authenticate under key {key_id} (tampered, or sealed with another key)"
    )]
    Unauthentic { key_id: String },
    /// Every way a legacy (AES-CBC, unauthenticated) ciphertext fails to
    /// open gives this one answer: telling a bad padding from a bad
    /// length would be a padding oracle.
    #[error(
        "legacy ciphertext does not decrypt under this key (malformed, tampered or sealed with another key)"
    )]
    LegacyUndecryptable,
    #[error("the key-encryption key is {0} bytes, not {KEY_LEN}")]
    KeyLength(usize),
    #[error("no randomness available")]
    Random,
}

/// A key-encryption key and the `key_id` derived from it. The raw bytes
/// sit in their own heap allocation, locked into RAM where the process may
/// (`mlock`: root or CAP_IPC_LOCK) and wiped on drop.
pub struct Kek {
    secret_id: String,
    key_id: String,
    raw: Box<Zeroizing<[u8; KEY_LEN]>>,
    locked: bool,
    aead: LessSafeKey,
}

/// Locks the page(s) of `buf` into RAM so the key cannot reach swap.
#[allow(unsafe_code)]
fn lock_in_memory(buf: &[u8; KEY_LEN]) -> bool {
    let Some(ptr) = std::ptr::NonNull::new(buf.as_ptr() as *mut std::ffi::c_void) else {
        return false;
    };
    // SAFETY: `ptr` and the length describe `buf`, a live allocation owned
    // by the `Kek` that calls this; mlock only changes the paging of those
    // pages and neither reads nor writes them.
    unsafe { nix::sys::mman::mlock(ptr, KEY_LEN) }.is_ok()
}

#[allow(unsafe_code)]
fn unlock(buf: &[u8; KEY_LEN]) {
    if let Some(ptr) = std::ptr::NonNull::new(buf.as_ptr() as *mut std::ffi::c_void) {
        // SAFETY: as in `lock_in_memory`; called once, from `Kek::drop`,
        // while the buffer is still allocated.
        let _ = unsafe { nix::sys::mman::munlock(ptr, KEY_LEN) };
    }
}

impl Drop for Kek {
    fn drop(&mut self) {
        use zeroize::Zeroize;
        self.raw.zeroize();
        if self.locked {
            unlock(&self.raw);
        }
    }
}

impl std::fmt::Debug for Kek {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kek")
            .field("key_id", &self.key_id)
            .field("key", &"<redacted>")
            .finish()
    }
}

/// The fingerprint part of a `key_id`.
pub fn fingerprint(key: &[u8]) -> String {
    let tag = ring::hmac::sign(
        &ring::hmac::Key::new(ring::hmac::HMAC_SHA256, key),
        b"barbican-kms/key-id/v1",
    );
    tag.as_ref()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

impl Kek {
    /// `key` is the payload of Barbican secret `secret_id`.
    pub fn new(secret_id: &str, key: &[u8]) -> Result<Self, EnvelopeError> {
        if key.len() != KEY_LEN {
            return Err(EnvelopeError::KeyLength(key.len()));
        }
        let mut raw = Box::new(Zeroizing::new([0u8; KEY_LEN]));
        let locked = lock_in_memory(&raw);
        raw.copy_from_slice(key);
        let unbound =
            UnboundKey::new(&AES_256_GCM, key).map_err(|_| EnvelopeError::KeyLength(key.len()))?;
        Ok(Self {
            secret_id: secret_id.to_string(),
            key_id: format!("{secret_id}:{}", fingerprint(key)),
            raw,
            locked,
            aead: LessSafeKey::new(unbound),
        })
    }

    pub fn key_id(&self) -> &str {
        &self.key_id
    }

    /// Whether the key bytes are locked into RAM.
    pub fn is_locked(&self) -> bool {
        self.locked
    }

    pub fn secret_id(&self) -> &str {
        &self.secret_id
    }

    fn aad(&self) -> Vec<u8> {
        let mut aad = Vec::with_capacity(32 + self.key_id.len());
        aad.extend_from_slice(b"barbican-kms:v1:");
        aad.extend_from_slice(self.key_id.as_bytes());
        aad
    }

    pub fn seal(&self, rng: &SystemRandom, plaintext: &[u8]) -> Result<Vec<u8>, EnvelopeError> {
        if plaintext.is_empty() {
            return Err(EnvelopeError::EmptyPlaintext);
        }
        if plaintext.len() > MAX_PLAINTEXT {
            return Err(EnvelopeError::PlaintextTooLong(plaintext.len()));
        }
        let mut nonce = [0u8; NONCE_LEN];
        rng.fill(&mut nonce).map_err(|_| EnvelopeError::Random)?;
        let mut out = Vec::with_capacity(1 + NONCE_LEN + plaintext.len() + TAG_LEN);
        out.push(FORMAT_V1);
        out.extend_from_slice(&nonce);
        out.extend_from_slice(plaintext);
        let tag = self
            .aead
            .seal_in_place_separate_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(self.aad()),
                &mut out[1 + NONCE_LEN..],
            )
            .map_err(|_| EnvelopeError::Random)?;
        out.extend_from_slice(tag.as_ref());
        Ok(out)
    }

    pub fn open(&self, ciphertext: &[u8]) -> Result<Zeroizing<Vec<u8>>, EnvelopeError> {
        if ciphertext.len() > MAX_CIPHERTEXT {
            return Err(EnvelopeError::CiphertextTooLong(ciphertext.len()));
        }
        if ciphertext.len() < 1 + NONCE_LEN + TAG_LEN + 1 {
            return Err(EnvelopeError::CiphertextTooShort(ciphertext.len()));
        }
        if ciphertext[0] != FORMAT_V1 {
            return Err(EnvelopeError::UnknownFormat(ciphertext[0]));
        }
        let mut nonce = [0u8; NONCE_LEN];
        nonce.copy_from_slice(&ciphertext[1..1 + NONCE_LEN]);
        let mut buf = Zeroizing::new(ciphertext[1 + NONCE_LEN..].to_vec());
        let len = self
            .aead
            .open_in_place(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(self.aad()),
                &mut buf,
            )
            .map_err(|_| EnvelopeError::Unauthentic {
                key_id: self.key_id.clone(),
            })?
            .len();
        buf.truncate(len);
        Ok(buf)
    }

    /// Opens a ciphertext of the upstream Go plugin (AES-256-CBC, IV
    /// prefix, PKCS#7).
    pub fn open_legacy(&self, ciphertext: &[u8]) -> Result<Zeroizing<Vec<u8>>, EnvelopeError> {
        const BLOCK: usize = 16;
        if ciphertext.len() < 2 * BLOCK
            || !ciphertext.len().is_multiple_of(BLOCK)
            || ciphertext.len() > MAX_CIPHERTEXT
        {
            return Err(EnvelopeError::LegacyUndecryptable);
        }
        let (iv, body) = ciphertext.split_at(BLOCK);
        let mut buf = Zeroizing::new(body.to_vec());
        let decryptor =
            cbc::Decryptor::<aes::Aes256>::new_from_slices(self.raw.as_ref().as_slice(), iv)
                .map_err(|_| EnvelopeError::KeyLength(self.raw.len()))?;
        let len = decryptor
            .decrypt_padded_mut::<Pkcs7>(&mut buf)
            .map_err(|_| EnvelopeError::LegacyUndecryptable)?
            .len();
        buf.truncate(len);
        Ok(buf)
    }
}

#[cfg(test)]
mod tests {
    use aes::cipher::BlockEncryptMut;
    use proptest::prelude::*;

    use super::*;

    fn kek(byte: u8) -> Kek {
        Kek::new("6f1c7d0e-0000-4000-8000-000000000001", &[byte; 32]).unwrap()
    }

    #[test]
    fn round_trip_and_key_id() {
        let rng = SystemRandom::new();
        let k = kek(7);
        let ct = k.seal(&rng, b"0123456789abcdef0123456789abcdef").unwrap();
        assert_eq!(ct.len(), 1 + 12 + 32 + 16);
        assert_eq!(&*k.open(&ct).unwrap(), b"0123456789abcdef0123456789abcdef");
        assert!(
            k.key_id()
                .starts_with("6f1c7d0e-0000-4000-8000-000000000001:")
        );
        assert_eq!(k.key_id().len(), 36 + 1 + 16);
        // a changed payload is a new key_id
        assert_ne!(kek(8).key_id(), k.key_id());
        // nonces differ per call
        assert_ne!(k.seal(&rng, b"x").unwrap(), k.seal(&rng, b"x").unwrap());
    }

    #[test]
    fn every_bit_flip_and_truncation_is_rejected() {
        let rng = SystemRandom::new();
        let k = kek(1);
        let ct = k.seal(&rng, &[9u8; 32]).unwrap();
        for i in 0..ct.len() {
            for bit in 0..8 {
                let mut t = ct.clone();
                t[i] ^= 1 << bit;
                assert!(
                    k.open(&t).is_err(),
                    "flip of bit {bit} in byte {i} was accepted"
                );
            }
        }
        for n in 0..ct.len() {
            assert!(
                k.open(&ct[..n]).is_err(),
                "truncation to {n} bytes was accepted"
            );
        }
        // another key, or the same ciphertext under another key_id, fails
        assert!(matches!(
            kek(2).open(&ct),
            Err(EnvelopeError::Unauthentic { .. })
        ));
        let other_id = Kek::new("00000000-0000-4000-8000-000000000009", &[1u8; 32]).unwrap();
        assert!(
            other_id.open(&ct).is_err(),
            "the key_id is bound into the ciphertext"
        );
    }

    #[test]
    fn key_bytes_are_locked_when_permitted() {
        let k = kek(9);
        if nix::unistd::geteuid().is_root() {
            assert!(k.is_locked(), "root may mlock");
        }
        assert!(format!("{k:?}").contains("redacted"));
    }

    #[test]
    fn bad_inputs_are_named() {
        let rng = SystemRandom::new();
        let k = kek(3);
        assert_eq!(k.seal(&rng, b""), Err(EnvelopeError::EmptyPlaintext));
        assert_eq!(
            k.seal(&rng, &[0; MAX_PLAINTEXT + 1]),
            Err(EnvelopeError::PlaintextTooLong(MAX_PLAINTEXT + 1))
        );
        assert_eq!(
            k.seal(&rng, &[0; MAX_PLAINTEXT]).unwrap().len(),
            MAX_CIPHERTEXT
        );
        assert_eq!(
            k.open(&[2; 40]).unwrap_err(),
            EnvelopeError::UnknownFormat(2)
        );
        assert!(matches!(
            Kek::new("s", &[0; 16]),
            Err(EnvelopeError::KeyLength(16))
        ));
        assert_eq!(
            k.open(&[1; 2000]).unwrap_err(),
            EnvelopeError::CiphertextTooLong(2000)
        );
    }

    /// What the upstream plugin produced: IV ‖ AES-256-CBC(PKCS#7(seed)).
    pub fn legacy_seal(key: &[u8; 32], iv: &[u8; 16], plaintext: &[u8]) -> Vec<u8> {
        let enc = cbc::Encryptor::<aes::Aes256>::new_from_slices(key, iv).unwrap();
        let body = enc.encrypt_padded_vec_mut::<Pkcs7>(plaintext);
        [iv.as_slice(), &body].concat()
    }

    #[test]
    fn legacy_ciphertexts_open_and_are_validated() {
        let k = kek(5);
        let ct = legacy_seal(&[5u8; 32], &[1u8; 16], &[42u8; 32]);
        assert_eq!(&*k.open_legacy(&ct).unwrap(), &[42u8; 32]);
        assert_eq!(
            k.open_legacy(&ct[..40]).unwrap_err(),
            EnvelopeError::LegacyUndecryptable
        );
        assert_eq!(
            k.open_legacy(&ct[..16]).unwrap_err(),
            EnvelopeError::LegacyUndecryptable
        );
        // the wrong key almost always breaks the padding
        let wrong = kek(6).open_legacy(&ct);
        assert!(wrong.is_err() || wrong.as_deref().map(|p| p.as_slice()) != Ok(&[42u8; 32][..]));
    }

    proptest! {
        #[test]
        fn random_seeds_round_trip(seed in proptest::collection::vec(any::<u8>(), 1..=MAX_PLAINTEXT), key in any::<[u8; 32]>()) {
            let k = Kek::new("11111111-2222-4333-8444-555555555555", &key).unwrap();
            let ct = k.seal(&SystemRandom::new(), &seed).unwrap();
            prop_assert!(ct.len() <= MAX_CIPHERTEXT);
            prop_assert_eq!(&*k.open(&ct).unwrap(), &seed);
        }

        #[test]
        fn arbitrary_ciphertexts_never_panic(ct in proptest::collection::vec(any::<u8>(), 0..1100)) {
            let k = kek(4);
            let _ = k.open(&ct);
            let _ = k.open_legacy(&ct);
        }
    }
}
