//! Authentication: who a bearer secret belongs to, remembered for a short
//! time. The time to live (`FILEDOCK_AUTH_CACHE_SECS`) is also the bound on
//! a revocation: an instance that remembers a key keeps accepting it until
//! its entry expires, and the next request after that looks it up again.

use std::time::Duration;

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::DomainError;
use crate::{
    meta::{KeyRepo, UserRecord},
    vocab::{ApiKeyHash, KeyId},
};

/// SHA-256 of a presented secret (a key or a token), hex.
pub fn hash_key(key: &str) -> ApiKeyHash {
    ApiKeyHash::from_hex(hex::encode(Sha256::digest(key.as_bytes())))
}

/// The most authentications an instance remembers.
const AUTH_CACHE_CAPACITY: u64 = 100_000;

/// Who made a request: the user, and the key they presented.
#[derive(Clone, Debug)]
pub struct Caller {
    /// As it was when the key was looked up (at most the cache's time to
    /// live ago): `used_bytes` may be that old (an upload confirms a quota
    /// refusal against the store, and the commit checks the quota again).
    pub user: UserRecord,
    pub key_id: KeyId,
}

impl Caller {
    /// Who the caller is in the audit log: their user and key ids.
    pub fn actor(&self) -> String {
        format!("user:{}/key:{}", self.user.id, self.key_id)
    }
}

/// Authenticated callers by the hash of their secret, for a short time.
pub type AuthCache = moka::sync::Cache<ApiKeyHash, Caller>;

pub fn auth_cache(ttl: Duration) -> AuthCache {
    let capacity = if ttl.is_zero() {
        0
    } else {
        AUTH_CACHE_CAPACITY
    };
    moka::sync::Cache::builder()
        .max_capacity(capacity)
        .time_to_live(ttl.max(Duration::from_millis(1)))
        .build()
}

/// The caller a bearer key belongs to. Callers found are remembered for
/// the cache's time to live, so a request costs no metadata round trip to
/// authenticate. A user being deleted is refused at once.
pub async fn authenticate(
    keys: &dyn KeyRepo,
    cache: &AuthCache,
    presented: &str,
) -> Result<Caller, DomainError> {
    let hash = hash_key(presented);
    if let Some(caller) = cache.get(&hash) {
        return Ok(caller);
    }
    let (key, user) = keys
        .key_by_hash(&hash)
        .await?
        .ok_or(DomainError::Unauthenticated)?;
    // The lookup matched by hash already; compare again in constant time so
    // no store's index behaviour decides authentication.
    if !bool::from(key.hash.as_str().as_bytes().ct_eq(hash.as_str().as_bytes()))
        || user.deleting_since.is_some()
    {
        return Err(DomainError::Unauthenticated);
    }
    let caller = Caller {
        user,
        key_id: key.id,
    };
    cache.insert(hash, caller.clone());
    Ok(caller)
}
