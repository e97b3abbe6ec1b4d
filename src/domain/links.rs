//! Signed links: an HMAC-SHA256 over the owner, the file and the expiry
//! lets whoever holds the link download that one file until it expires,
//! without an API key. Nothing is stored per link: a deleted file's links
//! die with it, because the download looks the file up (ids are never reused).

use base64::{Engine, engine::general_purpose::URL_SAFE_NO_PAD};
use chrono::{DateTime, Utc};
use hmac::{Hmac, Mac};
use secrecy::{ExposeSecret, SecretString};
use sha2::Sha256;

use super::DomainError;

/// The longest a link may live: 7 days, as S3 presigned URLs.
pub const MAX_LINK_SECS: u64 = 7 * 24 * 3600;
/// The shortest secret `FILEDOCK_LINK_SECRET` may be (HMAC-SHA256's block
/// strength is reached at 32 bytes).
pub const MIN_SECRET_BYTES: usize = 32;
/// Bound into every signature, so that a signature made for something else
/// with the same secret can never pass for a link.
const CONTEXT: &str = "filedock-link-v1";

/// Makes and checks link signatures with the server's secret.
pub struct LinkSigner {
    /// The keyed MAC, cloned per use (its `Debug` shows no key).
    mac: Hmac<Sha256>,
    /// The secret was made at start-up: links die with the process.
    pub ephemeral: bool,
}

/// A link's parts, as its URL carries them.
pub struct SignedLink<'a> {
    pub owner_id: &'a str,
    pub file_id: &'a str,
    /// Unix seconds, as the URL carries them: only the form [`LinkSigner::sign`]
    /// writes (no sign, no leading zero) is a link.
    pub expires: &'a str,
    /// URL-safe base64 without padding.
    pub signature: &'a str,
}

impl LinkSigner {
    /// A signer on `secret`, or on a random secret when there is none.
    pub fn new(secret: Option<&SecretString>) -> anyhow::Result<Self> {
        let (key, ephemeral) = match secret {
            Some(s) => {
                let key = s.expose_secret().as_bytes().to_vec();
                if key.len() < MIN_SECRET_BYTES {
                    anyhow::bail!(
                        "FILEDOCK_LINK_SECRET must be at least {MIN_SECRET_BYTES} bytes long"
                    );
                }
                (key, false)
            }
            None => (rand::random::<[u8; 32]>().to_vec(), true),
        };
        let mac = Hmac::<Sha256>::new_from_slice(&key)
            .map_err(|e| anyhow::anyhow!("link secret: {e}"))?;
        Ok(Self { mac, ephemeral })
    }

    fn mac_of(&self, owner_id: &str, file_id: &str, expires: i64) -> Hmac<Sha256> {
        let mut mac = self.mac.clone();
        mac.update(format!("{CONTEXT}\n{owner_id}\n{file_id}\n{expires}").as_bytes());
        mac
    }

    /// The signature of a link to `file_id` of `owner_id` expiring at `expires`.
    pub fn sign(&self, owner_id: &str, file_id: &str, expires: DateTime<Utc>) -> String {
        let tag = self
            .mac_of(owner_id, file_id, expires.timestamp())
            .finalize();
        URL_SAFE_NO_PAD.encode(tag.into_bytes())
    }

    /// Checks the signature (in constant time), then the expiry; the
    /// expiry (Unix seconds) if the link holds. Another spelling of the
    /// signed number (`0…`, `+…`) is another link, and not one signed.
    pub fn verify(&self, link: &SignedLink<'_>, now: DateTime<Utc>) -> Result<i64, DomainError> {
        let expires = link
            .expires
            .parse::<i64>()
            .ok()
            .filter(|e| e.to_string() == link.expires)
            .ok_or(DomainError::LinkInvalid)?;
        let tag = URL_SAFE_NO_PAD
            .decode(link.signature)
            .map_err(|_| DomainError::LinkInvalid)?;
        self.mac_of(link.owner_id, link.file_id, expires)
            .verify_slice(&tag)
            .map_err(|_| DomainError::LinkInvalid)?;
        if now.timestamp() >= expires {
            return Err(DomainError::LinkExpired);
        }
        Ok(expires)
    }
}

/// When a link asked for `expires_in` seconds from `now` expires, or why it may not.
pub fn expiry(now: DateTime<Utc>, expires_in: u64) -> Result<DateTime<Utc>, DomainError> {
    if !(1..=MAX_LINK_SECS).contains(&expires_in) {
        return Err(DomainError::InvalidRequest(format!(
            "expires_in must be between 1 and {MAX_LINK_SECS} seconds"
        )));
    }
    // Whole seconds, as the URL carries them.
    let now = DateTime::from_timestamp(now.timestamp(), 0).unwrap_or(now);
    Ok(now + chrono::Duration::seconds(expires_in as i64))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signer() -> LinkSigner {
        LinkSigner::new(Some(&SecretString::from("k".repeat(MIN_SECRET_BYTES)))).unwrap()
    }

    #[test]
    fn a_link_verifies_until_it_expires_and_only_as_signed() {
        let s = signer();
        let now = Utc::now();
        let at = expiry(now, 60).unwrap();
        let sig = s.sign("u1", "f1", at);
        fn link<'a>(
            owner: &'a str,
            file: &'a str,
            expires: &'a str,
            sig: &'a str,
        ) -> SignedLink<'a> {
            SignedLink {
                owner_id: owner,
                file_id: file,
                expires,
                signature: sig,
            }
        }
        let t = at.timestamp().to_string();
        let t = t.as_str();
        assert_eq!(
            s.verify(&link("u1", "f1", t, &sig), now).ok(),
            Some(at.timestamp())
        );
        assert!(matches!(
            s.verify(&link("u1", "f1", t, &sig), at),
            Err(DomainError::LinkExpired)
        ));
        let later = (at.timestamp() + 1).to_string();
        let (zero, plus) = (format!("0{t}"), format!("+{t}"));
        for bad in [
            link("u2", "f1", t, &sig),
            link("u1", "f2", t, &sig),
            link("u1", "f1", &later, &sig),
            link("u1", "f1", &zero, &sig),
            link("u1", "f1", &plus, &sig),
            link("u1", "f1", t, "AAAA"),
            link("u1", "f1", t, "not base64!"),
        ] {
            assert!(matches!(s.verify(&bad, now), Err(DomainError::LinkInvalid)));
        }
    }

    #[test]
    fn short_secrets_and_unbounded_expiries_are_refused() {
        assert!(LinkSigner::new(Some(&SecretString::from("short"))).is_err());
        assert!(LinkSigner::new(None).unwrap().ephemeral);
        assert!(expiry(Utc::now(), 0).is_err());
        assert!(expiry(Utc::now(), MAX_LINK_SECS + 1).is_err());
    }
}
