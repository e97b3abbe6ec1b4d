//! Signed links: an HMAC-SHA256 over the owner, the file, the key that made
//! the link and the expiry lets whoever holds the link download that one
//! file until it expires, without an API key. Nothing is stored per link: a
//! deleted file's links die with it, because the download looks the file up
//! (ids are never reused), and a revoked key's links with the key, because
//! the download asks whether it is alive (as S3's presigned URLs stop
//! working when their access key is deactivated).

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
/// with the same secret can never pass for a link. A link without a key
/// (made before links carried one) is signed under v1, one with a key under
/// v2: a v1 signature can never pass with a key added, nor a v2 one with
/// its key removed.
const CONTEXT_V1: &str = "filedock-link-v1";
const CONTEXT_V2: &str = "filedock-link-v2";
/// A read URL of an upload's stored bytes before its commit, for the
/// pre-commit hook: never a download link, nor one of those a read URL.
const CONTEXT_STAGED: &str = "filedock-precommit-v1";

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
    /// The id of the key that made the link (or minted the token that did);
    /// `None` for a link made before links carried one.
    pub key_id: Option<&'a str>,
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

    fn mac_of(
        &self,
        owner_id: &str,
        file_id: &str,
        key_id: Option<&str>,
        expires: i64,
    ) -> Hmac<Sha256> {
        let mut mac = self.mac.clone();
        let signed = match key_id {
            None => format!("{CONTEXT_V1}\n{owner_id}\n{file_id}\n{expires}"),
            Some(key) => format!("{CONTEXT_V2}\n{owner_id}\n{file_id}\n{key}\n{expires}"),
        };
        mac.update(signed.as_bytes());
        mac
    }

    /// The signature of a link to `file_id` of `owner_id`, made with the key
    /// `key_id` (`None`: a v1 link, as made before links carried their key;
    /// the server makes none now), expiring at `expires`.
    pub fn sign(
        &self,
        owner_id: &str,
        file_id: &str,
        key_id: Option<&str>,
        expires: DateTime<Utc>,
    ) -> String {
        let tag = self
            .mac_of(owner_id, file_id, key_id, expires.timestamp())
            .finalize();
        URL_SAFE_NO_PAD.encode(tag.into_bytes())
    }

    /// The signature of a read URL of `owner_id`'s upload `file_id`'s
    /// stored bytes, before its commit, expiring at `expires`.
    pub fn sign_staged(&self, owner_id: &str, file_id: &str, expires: DateTime<Utc>) -> String {
        let tag = self
            .staged_mac(owner_id, file_id, expires.timestamp())
            .finalize();
        URL_SAFE_NO_PAD.encode(tag.into_bytes())
    }

    /// As [`Self::verify`], for a read URL [`Self::sign_staged`] made
    /// (`link.key_id` is not part of it).
    pub fn verify_staged(
        &self,
        link: &SignedLink<'_>,
        now: DateTime<Utc>,
    ) -> Result<i64, DomainError> {
        let expires = signed_number(link.expires)?;
        let tag = URL_SAFE_NO_PAD
            .decode(link.signature)
            .map_err(|_| DomainError::LinkInvalid)?;
        self.staged_mac(link.owner_id, link.file_id, expires)
            .verify_slice(&tag)
            .map_err(|_| DomainError::LinkInvalid)?;
        if now.timestamp() >= expires {
            return Err(DomainError::LinkExpired);
        }
        Ok(expires)
    }

    fn staged_mac(&self, owner_id: &str, file_id: &str, expires: i64) -> Hmac<Sha256> {
        let mut mac = self.mac.clone();
        mac.update(format!("{CONTEXT_STAGED}\n{owner_id}\n{file_id}\n{expires}").as_bytes());
        mac
    }

    /// Checks the signature (in constant time), then the expiry; the
    /// expiry (Unix seconds) if the link holds. Another spelling of the
    /// signed number (`0…`, `+…`) is another link, and not one signed.
    pub fn verify(&self, link: &SignedLink<'_>, now: DateTime<Utc>) -> Result<i64, DomainError> {
        let expires = signed_number(link.expires)?;
        let tag = URL_SAFE_NO_PAD
            .decode(link.signature)
            .map_err(|_| DomainError::LinkInvalid)?;
        self.mac_of(link.owner_id, link.file_id, link.key_id, expires)
            .verify_slice(&tag)
            .map_err(|_| DomainError::LinkInvalid)?;
        if now.timestamp() >= expires {
            return Err(DomainError::LinkExpired);
        }
        Ok(expires)
    }
}

/// Unix seconds as a link's URL carries them: only the form
/// [`LinkSigner::sign`] writes (no sign, no leading zero) was signed.
fn signed_number(raw: &str) -> Result<i64, DomainError> {
    raw.parse::<i64>()
        .ok()
        .filter(|e| e.to_string() == raw)
        .ok_or(DomainError::LinkInvalid)
}

/// When a link asked for `expires_in` seconds from `now` expires, or why it
/// may not. A link made with a token expires with the token at the latest
/// (`not_after`, the token's expiry), as a presigned URL signed with
/// temporary credentials dies with them: clamped, not refused, since a
/// client cannot know to the second how long its token has left (the answer
/// names the expiry the link got).
pub fn expiry(
    now: DateTime<Utc>,
    expires_in: u64,
    not_after: Option<DateTime<Utc>>,
) -> Result<DateTime<Utc>, DomainError> {
    if !(1..=MAX_LINK_SECS).contains(&expires_in) {
        return Err(DomainError::InvalidRequest(format!(
            "expires_in must be between 1 and {MAX_LINK_SECS} seconds"
        )));
    }
    // Whole seconds, as the URL carries them; a cap rounds down, so the
    // link never outlives it.
    let whole = |t: DateTime<Utc>| DateTime::from_timestamp(t.timestamp(), 0).unwrap_or(t);
    let asked = whole(now) + chrono::Duration::seconds(expires_in as i64);
    match not_after {
        // A token with less than a second left makes no link that works.
        Some(cap) if whole(cap) <= now => Err(DomainError::Unauthenticated),
        Some(cap) => Ok(asked.min(whole(cap))),
        None => Ok(asked),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signer() -> LinkSigner {
        LinkSigner::new(Some(&SecretString::from("k".repeat(MIN_SECRET_BYTES)))).unwrap()
    }

    fn link<'a>(
        owner: &'a str,
        file: &'a str,
        key: Option<&'a str>,
        expires: &'a str,
        sig: &'a str,
    ) -> SignedLink<'a> {
        SignedLink {
            owner_id: owner,
            file_id: file,
            key_id: key,
            expires,
            signature: sig,
        }
    }

    #[test]
    fn a_link_verifies_until_it_expires_and_only_as_signed() {
        let s = signer();
        let now = Utc::now();
        let at = expiry(now, 60, None).unwrap();
        let sig = s.sign("u1", "f1", Some("k1"), at);
        let t = at.timestamp().to_string();
        let t = t.as_str();
        assert_eq!(
            s.verify(&link("u1", "f1", Some("k1"), t, &sig), now).ok(),
            Some(at.timestamp())
        );
        assert!(matches!(
            s.verify(&link("u1", "f1", Some("k1"), t, &sig), at),
            Err(DomainError::LinkExpired)
        ));
        let later = (at.timestamp() + 1).to_string();
        let (zero, plus) = (format!("0{t}"), format!("+{t}"));
        let k = Some("k1");
        for bad in [
            link("u2", "f1", k, t, &sig),
            link("u1", "f2", k, t, &sig),
            link("u1", "f1", k, &later, &sig),
            link("u1", "f1", k, &zero, &sig),
            link("u1", "f1", k, &plus, &sig),
            link("u1", "f1", k, t, "AAAA"),
            link("u1", "f1", k, t, "not base64!"),
            // Another key's id, an empty one, or none (a v1 link's form).
            link("u1", "f1", Some("k2"), t, &sig),
            link("u1", "f1", Some(""), t, &sig),
            link("u1", "f1", None, t, &sig),
        ] {
            assert!(matches!(s.verify(&bad, now), Err(DomainError::LinkInvalid)));
        }
    }

    /// A link made before links carried their key (v1) still verifies
    /// until it expires; a key added to it does not.
    #[test]
    fn a_v1_link_verifies_until_it_expires_and_takes_no_key() {
        let s = signer();
        let now = Utc::now();
        let at = expiry(now, 60, None).unwrap();
        let sig = s.sign("u1", "f1", None, at);
        let t = at.timestamp().to_string();
        assert_eq!(
            s.verify(&link("u1", "f1", None, &t, &sig), now).ok(),
            Some(at.timestamp())
        );
        assert!(matches!(
            s.verify(&link("u1", "f1", None, &t, &sig), at),
            Err(DomainError::LinkExpired)
        ));
        for key in ["k1", ""] {
            assert!(matches!(
                s.verify(&link("u1", "f1", Some(key), &t, &sig), now),
                Err(DomainError::LinkInvalid)
            ));
        }
    }

    /// A token's link expires with the token at the latest, rounded down
    /// to the second the URL carries.
    #[test]
    fn a_tokens_link_never_outlives_the_token() {
        let now = DateTime::from_timestamp(1_000, 250_000_000).unwrap();
        let token_ends = DateTime::from_timestamp(1_060, 900_000_000).unwrap();
        let at = expiry(now, MAX_LINK_SECS, Some(token_ends)).unwrap();
        assert_eq!(at, DateTime::from_timestamp(1_060, 0).unwrap());
        let shorter = expiry(now, 10, Some(token_ends)).unwrap();
        assert_eq!(shorter, DateTime::from_timestamp(1_010, 0).unwrap());
        // The bounds hold whatever the cap.
        assert!(expiry(now, 0, Some(token_ends)).is_err());
        assert!(expiry(now, MAX_LINK_SECS + 1, Some(token_ends)).is_err());
    }

    #[test]
    fn short_secrets_and_unbounded_expiries_are_refused() {
        assert!(LinkSigner::new(Some(&SecretString::from("short"))).is_err());
        assert!(LinkSigner::new(None).unwrap().ephemeral);
        assert!(expiry(Utc::now(), 0, None).is_err());
        assert!(expiry(Utc::now(), MAX_LINK_SECS + 1, None).is_err());
    }

    fn read_url<'a>(expires: &'a str, signature: &'a str) -> SignedLink<'a> {
        SignedLink {
            owner_id: "u",
            file_id: "f",
            key_id: None,
            expires,
            signature,
        }
    }

    /// A read URL for the pre-commit hook verifies as such, and never as a
    /// download link (nor one as a read URL).
    #[test]
    fn a_staged_read_url_is_its_own_kind_of_link() {
        let s = signer();
        let now = Utc::now();
        let expires = now + chrono::Duration::seconds(60);
        let at = expires.timestamp().to_string();
        let sig = s.sign_staged("u", "f", expires);
        assert!(s.verify_staged(&read_url(&at, &sig), now).is_ok());
        assert!(matches!(
            s.verify(&read_url(&at, &sig), now),
            Err(DomainError::LinkInvalid)
        ));
        let download = s.sign("u", "f", None, expires);
        assert!(matches!(
            s.verify_staged(&read_url(&at, &download), now),
            Err(DomainError::LinkInvalid)
        ));
        let later = expires + chrono::Duration::seconds(1);
        assert!(matches!(
            s.verify_staged(&read_url(&at, &sig), later),
            Err(DomainError::LinkExpired)
        ));
    }
}
