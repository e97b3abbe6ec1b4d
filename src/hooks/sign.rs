//! Standard Webhooks' signature: HMAC-SHA256 of `{id}.{timestamp}.{body}`
//! under the secret's bytes (`whsec_` + their base64), sent as `v1,` + its
//! base64.

use base64::{Engine, engine::general_purpose::STANDARD};
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The fewest bytes a secret may hold (Standard Webhooks asks 24 to 64).
const MIN_SECRET_BYTES: usize = 24;

#[derive(Clone)]
pub struct Signer {
    key: Vec<u8>,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Signer(<secret>)")
    }
}

impl Signer {
    /// From a `whsec_…` secret. The error never repeats the secret.
    pub fn from_secret(secret: &str) -> Result<Self, String> {
        let Some(encoded) = secret.strip_prefix("whsec_") else {
            return Err("must start with whsec_ (then the key's bytes in base64)".into());
        };
        let key = STANDARD
            .decode(encoded)
            .map_err(|_| "the part after whsec_ is not base64".to_owned())?;
        if key.len() < MIN_SECRET_BYTES {
            return Err(format!(
                "the key must hold at least {MIN_SECRET_BYTES} bytes (it holds {}); make one with: echo whsec_$(head -c 32 /dev/urandom | base64)",
                key.len()
            ));
        }
        Ok(Self { key })
    }

    /// The `webhook-signature` header of message `id` sent at `timestamp`.
    pub fn sign(&self, id: &str, timestamp: i64, body: &[u8]) -> String {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.key).expect("HMAC takes any key length");
        mac.update(id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The example of Standard Webhooks' own test suite (its Python and
    /// JavaScript libraries check the same vector).
    #[test]
    fn signs_as_the_specification_s_test_vector() {
        let signer = Signer::from_secret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let body = br#"{"test": 2432232314}"#;
        assert_eq!(
            signer.sign("msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
    }

    #[test]
    fn refuses_secrets_without_prefix_or_too_short() {
        assert!(Signer::from_secret("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").is_err());
        assert!(Signer::from_secret("whsec_not*base64").is_err());
        assert!(Signer::from_secret("whsec_c2hvcnQ=").is_err());
    }
}
