//! Checksums a client asks the server to verify (`Content-Digest`, RFC
//! 9530) and the one it is told back (`Repr-Digest`).

use base64::{Engine, engine::general_purpose::STANDARD};

/// The algorithms checked: RFC 9530's two that are not deprecated.
pub const SUPPORTED: &str = "sha-256, sha-512";

/// The digests a client declared for the bytes it sends.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExpectedDigest {
    pub sha256: Option<Vec<u8>>,
    pub sha512: Option<Vec<u8>>,
}

impl ExpectedDigest {
    /// Parses a `Content-Digest` value: a structured-field dictionary of
    /// `algorithm=:base64:` members. Members of other algorithms are ignored
    /// (RFC 9530 §2) as long as one supported algorithm is present.
    pub fn parse(raw: &str) -> Result<Self, String> {
        let mut out = Self::default();
        for member in raw.split(',').map(str::trim) {
            let (key, value) = member
                .split_once('=')
                .ok_or_else(|| format!("Content-Digest member {member:?} is not key=:base64:"))?;
            // Parameters (`;name=value`) are allowed on a member; none is used.
            let value = value.split(';').next().unwrap_or_default().trim();
            let bytes = value
                .strip_prefix(':')
                .and_then(|v| v.strip_suffix(':'))
                .and_then(|v| STANDARD.decode(v).ok())
                .ok_or_else(|| {
                    format!("Content-Digest value of {key:?} is not a :base64: byte sequence")
                })?;
            let (slot, len) = match key.trim() {
                "sha-256" => (&mut out.sha256, 32),
                "sha-512" => (&mut out.sha512, 64),
                _ => continue,
            };
            if bytes.len() != len {
                return Err(format!(
                    "a {key} digest is {len} bytes, not {}",
                    bytes.len()
                ));
            }
            *slot = Some(bytes);
        }
        if out == Self::default() {
            return Err(format!(
                "Content-Digest names no supported algorithm (supported: {SUPPORTED})"
            ));
        }
        Ok(out)
    }
}

/// `Repr-Digest` / `Content-Digest` for a SHA-256 given in hex.
pub fn sha256_header(sha256_hex: &str) -> Option<String> {
    let bytes = hex::decode(sha256_hex).ok()?;
    Some(format!("sha-256=:{}:", STANDARD.encode(bytes)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_rfc_9530_dictionaries() {
        // RFC 9530 Appendix B's example: sha-256 of {"hello": "world"}.
        let d = ExpectedDigest::parse(
            "sha-256=:X48E9qOokqqrvdts8nOJRJN3OWDUoyWxBf7kbu9DBPE=:, md5=:AAAA:",
        )
        .unwrap();
        assert_eq!(d.sha256.as_ref().map(Vec::len), Some(32));
        assert!(d.sha512.is_none());
        for bad in [
            "md5=:AAAA:",
            "sha-256=X48E9qOokqqrvdts8nOJRJN3OWDUoyWxBf7kbu9DBPE=",
            "sha-256=:AAAA:",
            "sha-256",
            "",
        ] {
            assert!(ExpectedDigest::parse(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            sha256_header("5f8f04f6a3a892aaabbddb6cf273894493773960d4a325b105fee46eef4304f1")
                .unwrap(),
            "sha-256=:X48E9qOokqqrvdts8nOJRJN3OWDUoyWxBf7kbu9DBPE=:"
        );
    }
}
