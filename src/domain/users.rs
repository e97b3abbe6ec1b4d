//! Users and API keys. Keys are random 256-bit secrets shown once; only
//! their SHA-256 is stored (a fast hash suits high-entropy keys and lets
//! the store look a key up by its hash).

use rand::RngCore;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use std::sync::Arc;

use super::{DomainError, UserId};
use crate::{
    meta::{UserRecord, UserRepo},
    vocab::ApiKeyHash,
};

/// Users and their keys, and the ports that takes.
pub struct UserService {
    meta: Arc<dyn UserRepo>,
    auth_cache: AuthCache,
}

impl UserService {
    pub fn new(meta: Arc<dyn UserRepo>, auth_cache: AuthCache) -> Self {
        Self { meta, auth_cache }
    }

    /// Creates a user; returns the record and the API key (shown once).
    pub async fn create_user(&self, name: &str) -> Result<(UserRecord, String), DomainError> {
        create_user(self.meta.as_ref(), name).await
    }

    /// The user a bearer key belongs to (see [`authenticate`]).
    pub async fn authenticate(&self, presented: &str) -> Result<UserRecord, DomainError> {
        authenticate(self.meta.as_ref(), &self.auth_cache, presented).await
    }
}

/// SHA-256 of a presented key, hex.
pub fn hash_key(key: &str) -> ApiKeyHash {
    ApiKeyHash::from_hex(hex::encode(Sha256::digest(key.as_bytes())))
}

/// A new API key: `fdk_` + 64 hex digits.
pub fn new_api_key() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    format!("fdk_{}", hex::encode(bytes))
}

/// Compares two secrets in constant time (by their digests, so lengths leak nothing).
pub fn secrets_match(presented: &str, expected: &str) -> bool {
    Sha256::digest(presented.as_bytes())
        .ct_eq(&Sha256::digest(expected.as_bytes()))
        .into()
}

fn parse_name(raw: &str) -> Result<String, DomainError> {
    let name =
        crate::vocab::ids::clean_name(raw.trim(), "name").map_err(DomainError::InvalidRequest)?;
    if name.is_empty() || name.chars().count() > 100 {
        return Err(DomainError::InvalidRequest(
            "name must be 1 to 100 characters".into(),
        ));
    }
    Ok(name)
}

/// Creates a user; returns the record and the API key (shown once).
pub async fn create_user(
    meta: &dyn UserRepo,
    name: &str,
) -> Result<(UserRecord, String), DomainError> {
    let key = new_api_key();
    let user = UserRecord {
        id: UserId::new(),
        name: parse_name(name)?,
        api_key_hash: hash_key(&key),
        file_count: 0,
        used_bytes: 0,
        reserved_bytes: 0,
        open_uploads: 0,
        upload_fence: Default::default(),
        created_at: crate::meta::now(),
    };
    meta.insert_user(&user).await?;
    Ok((user, key))
}

/// The user a bearer key belongs to. Users found are remembered for the
/// cache's time to live, so a request costs no metadata round trip to
/// authenticate; the record's `used_bytes` may be that old (an upload
/// confirms a quota refusal against the store, and the commit checks the
/// quota again).
pub async fn authenticate(
    meta: &dyn UserRepo,
    cache: &AuthCache,
    presented: &str,
) -> Result<UserRecord, DomainError> {
    let hash = hash_key(presented);
    if let Some(user) = cache.get(&hash) {
        return Ok(user);
    }
    let user = meta
        .user_by_key_hash(&hash)
        .await?
        .ok_or(DomainError::Unauthenticated)?;
    // The lookup matched by hash already; compare again in constant time so
    // no store's index behaviour decides authentication.
    let stored = user.api_key_hash.as_str().as_bytes();
    if bool::from(stored.ct_eq(hash.as_str().as_bytes())) {
        cache.insert(hash, user.clone());
        Ok(user)
    } else {
        Err(DomainError::Unauthenticated)
    }
}

/// Authenticated users by key hash, for a short time.
pub type AuthCache = moka::sync::Cache<ApiKeyHash, UserRecord>;

pub fn auth_cache(ttl: std::time::Duration) -> AuthCache {
    let capacity = if ttl.is_zero() { 0 } else { 100_000 };
    moka::sync::Cache::builder()
        .max_capacity(capacity)
        .time_to_live(ttl.max(std::time::Duration::from_millis(1)))
        .build()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_random_and_hashes_stable() {
        let (a, b) = (new_api_key(), new_api_key());
        assert_ne!(a, b);
        assert_eq!(a.len(), 68);
        assert_eq!(hash_key(&a), hash_key(&a));
        assert_ne!(hash_key(&a).as_str(), a);
        assert!(secrets_match(&a, &a));
        assert!(!secrets_match(&a, &b));
        assert!(!secrets_match("", &b));
    }
}
