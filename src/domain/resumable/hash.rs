//! Hashes for resumable uploads: the file's SHA-256, carried from PATCH to
//! PATCH as a serialized state, and the tus `Upload-Checksum` of one PATCH.

use base64::Engine;
use sha2_state::{
    Digest, Sha256,
    digest::{array::Array, common::hazmat::SerializableState},
};

use crate::domain::DomainError;

/// The state of a SHA-256 that has seen no bytes, serialized.
pub(super) fn fresh_state() -> String {
    save(&Sha256::new())
}

pub(super) fn save(hasher: &Sha256) -> String {
    hex::encode(hasher.serialize().as_slice())
}

pub(super) fn restore(state: &str) -> Result<Sha256, DomainError> {
    let bad = || DomainError::internal(anyhow::anyhow!("a stored SHA-256 state is corrupt"));
    let bytes = hex::decode(state).map_err(|_| bad())?;
    let array = Array::try_from(bytes.as_slice()).map_err(|_| bad())?;
    Sha256::deserialize(&array).map_err(|_| bad())
}

pub(super) fn finish(hasher: Sha256) -> String {
    hex::encode(hasher.finalize())
}

/// A PATCH body's expected checksum (`Upload-Checksum: <algorithm> <base64>`).
#[derive(Clone, Debug)]
pub struct Checksum {
    algorithm: Algorithm,
    expected: Vec<u8>,
}

#[derive(Clone, Copy, Debug)]
enum Algorithm {
    Sha1,
    Sha256,
}

/// The algorithms `Tus-Checksum-Algorithm` lists.
pub const CHECKSUM_ALGORITHMS: &str = "sha1,sha256";

impl Checksum {
    /// Parses an `Upload-Checksum` header value.
    pub fn parse(header: &str) -> Result<Self, String> {
        let (name, value) = header
            .trim()
            .split_once(' ')
            .ok_or("Upload-Checksum must be \"<algorithm> <base64>\"")?;
        let (algorithm, len) = match name {
            "sha1" => (Algorithm::Sha1, 20),
            "sha256" => (Algorithm::Sha256, 32),
            other => {
                return Err(format!(
                    "Upload-Checksum algorithm {other:?} is not supported (supported: {CHECKSUM_ALGORITHMS})"
                ));
            }
        };
        let expected = base64::engine::general_purpose::STANDARD
            .decode(value.trim())
            .map_err(|_| "Upload-Checksum: the checksum is not valid base64")?;
        if expected.len() != len {
            return Err(format!(
                "Upload-Checksum: a {name} checksum has {len} bytes"
            ));
        }
        Ok(Self {
            algorithm,
            expected,
        })
    }

    pub(super) fn hasher(&self) -> BodyHasher {
        match self.algorithm {
            Algorithm::Sha1 => BodyHasher::Sha1(sha1::Sha1::new()),
            Algorithm::Sha256 => BodyHasher::Sha256(Sha256::new()),
        }
    }

    pub(super) fn matches(&self, hasher: BodyHasher) -> bool {
        let got: Vec<u8> = match hasher {
            BodyHasher::Sha1(h) => h.finalize().to_vec(),
            BodyHasher::Sha256(h) => h.finalize().to_vec(),
        };
        got == self.expected
    }
}

/// The running checksum of one PATCH body.
pub(super) enum BodyHasher {
    Sha1(sha1::Sha1),
    Sha256(Sha256),
}

impl BodyHasher {
    pub(super) fn update(&mut self, bytes: &[u8]) {
        match self {
            Self::Sha1(h) => h.update(bytes),
            Self::Sha256(h) => h.update(bytes),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_restored_state_hashes_on_as_if_never_stopped() {
        let mut h = Sha256::new();
        h.update(b"hello, ");
        let mut restored = restore(&save(&h)).unwrap();
        restored.update(b"world");
        assert_eq!(
            finish(restored),
            hex::encode(Sha256::digest(b"hello, world"))
        );
    }

    #[test]
    fn checksums_parse_and_compare() {
        let b64 = base64::engine::general_purpose::STANDARD;
        let c =
            Checksum::parse(&format!("sha1 {}", b64.encode(sha1::Sha1::digest(b"abc")))).unwrap();
        let mut h = c.hasher();
        h.update(b"abc");
        assert!(c.matches(h));
        let mut h = c.hasher();
        h.update(b"abd");
        assert!(!c.matches(h));
        assert!(Checksum::parse("md5 AAAA").is_err());
        assert!(Checksum::parse("sha256 not-base64!").is_err());
    }
}
