//! Authentication: who a bearer secret belongs to, remembered for a short
//! time. The time to live (`FILEDOCK_AUTH_CACHE_SECS`) is also the bound on
//! a revocation: an instance that remembers a key keeps accepting it until
//! its entry expires, and the next request after that looks it up again.

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use chrono::{DateTime, Utc};

use super::{DomainError, auth_cache::AuthCache};
use crate::{
    meta::{KeyRepo, TokenRecord, UserRecord},
    vocab::{AgentId, ApiKeyHash, KeyId, Scope, SessionId},
};

/// SHA-256 of a presented secret (a key or a token), hex.
pub fn hash_key(key: &str) -> ApiKeyHash {
    ApiKeyHash::from_hex(hex::encode(Sha256::digest(key.as_bytes())))
}

/// What every token's secret starts with (a key's is `fdk_`).
pub const TOKEN_PREFIX: &str = "fdt_";

/// Who made a request: the user, and the key they presented.
#[derive(Clone, Debug)]
pub struct Caller {
    /// As it was when the key was looked up (at most the cache's time to
    /// live ago): `used_bytes` may be that old (an upload confirms a quota
    /// refusal against the store, and the commit checks the quota again).
    pub user: UserRecord,
    /// The key presented, or the key that minted the token presented.
    pub key_id: KeyId,
    pub grant: Grant,
}

/// What a caller may do.
#[derive(Clone, Debug)]
pub enum Grant {
    /// An API key: everything its user may.
    Key,
    /// A short-lived token: only what it was minted with.
    Token(TokenGrant),
}

/// A token's rights.
#[derive(Clone, Debug)]
pub struct TokenGrant {
    pub scopes: Vec<Scope>,
    pub session_id: Option<SessionId>,
    pub agent_id: Option<AgentId>,
    pub expires_at: DateTime<Utc>,
}

impl Grant {
    pub fn is_token(&self) -> bool {
        matches!(self, Self::Token(_))
    }

    /// Whether the grant has run out at `now` (a key never does).
    fn expired(&self, now: DateTime<Utc>) -> bool {
        matches!(self, Self::Token(t) if t.expires_at <= now)
    }
}

impl From<&TokenRecord> for TokenGrant {
    fn from(t: &TokenRecord) -> Self {
        Self {
            scopes: t.scopes.clone(),
            session_id: t.session_id,
            agent_id: t.agent_id,
            expires_at: t.expires_at,
        }
    }
}

impl Caller {
    /// Who the caller is in the audit log: their user and key ids.
    pub fn actor(&self) -> String {
        let via = if self.grant.is_token() { "/token" } else { "" };
        format!("user:{}/key:{}{via}", self.user.id, self.key_id)
    }
}

/// The caller a bearer key or token belongs to. Callers found are
/// remembered for the cache's time to live, so a request costs no metadata
/// round trip to authenticate; a token's expiry is checked on every request.
/// A user being deleted is refused.
pub async fn authenticate(
    keys: &dyn KeyRepo,
    cache: &AuthCache<Caller>,
    presented: &str,
) -> Result<Caller, DomainError> {
    let hash = hash_key(presented);
    let now = crate::meta::now();
    if let Some(caller) = cache.caller(&hash) {
        if caller.grant.expired(now) {
            cache.forget_caller(&hash);
            return Err(DomainError::Unauthenticated);
        }
        return Ok(caller);
    }
    let start = cache.lookup_start();
    let (stored, caller) = if presented.starts_with(TOKEN_PREFIX) {
        let (token, user) = keys
            .token_by_hash(&hash)
            .await?
            .ok_or(DomainError::Unauthenticated)?;
        let grant = Grant::Token(TokenGrant::from(&token));
        let caller = Caller {
            user,
            key_id: token.key_id,
            grant,
        };
        (token.hash, caller)
    } else {
        let (key, user) = keys
            .key_by_hash(&hash)
            .await?
            .ok_or(DomainError::Unauthenticated)?;
        let caller = Caller {
            user,
            key_id: key.id,
            grant: Grant::Key,
        };
        (key.hash, caller)
    };
    // The lookup matched by hash already; compare again in constant time so
    // no store's index behaviour decides authentication.
    if !bool::from(stored.as_str().as_bytes().ct_eq(hash.as_str().as_bytes()))
        || caller.user.deleting_since.is_some()
        || caller.grant.expired(now)
    {
        return Err(DomainError::Unauthenticated);
    }
    // Found, so its key existed when the lookup read it (a token's lookup
    // checks its key).
    cache.remember_key_alive(caller.key_id, start);
    cache.remember_caller(hash, caller.clone(), start);
    Ok(caller)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::domain::{test_keys::WatchedKeys, test_kit::Kit, users::create_user};

    /// A key revoked while its lookup stalled (read before, answered
    /// after) is refused once the cache's lifetime has passed since the
    /// lookup began, not remembered for a lifetime from its answer.
    #[tokio::test]
    async fn a_stalled_lookup_does_not_stretch_the_caches_lifetime() {
        const TTL: Duration = Duration::from_millis(200);
        let kit = Kit::new(|_| {}).await;
        let (user, key) = create_user(kit.meta.as_ref(), "ann").await.unwrap();
        let stalled = WatchedKeys::new(kit.meta.clone(), TTL + TTL / 2);
        let cache = AuthCache::new(TTL);
        let first = authenticate(&stalled, &cache, &key.secret);
        let revoke = async {
            stalled.read.notified().await;
            kit.meta.delete_key(&user.id, &key.record.id).await.unwrap()
        };
        let (first, revoked) = tokio::join!(first, revoke);
        assert!(revoked);
        // Read before the revocation: accepted then.
        assert!(first.is_ok(), "{first:?}");
        // Past the lifetime since that lookup began: looked up again.
        let again = authenticate(kit.meta.as_ref(), &cache, &key.secret).await;
        assert!(
            matches!(again, Err(DomainError::Unauthenticated)),
            "{again:?}"
        );
    }

    /// A key revoked on this instance while a lookup of it stalled (read
    /// before the delete, answered after the revocation forgot the cache)
    /// is not remembered by that lookup: the next request looks it up
    /// again and is refused, though the cache's lifetime is long.
    #[tokio::test]
    async fn a_lookup_answering_after_a_revocation_leaves_nothing_remembered() {
        let kit = Kit::new(|_| {}).await;
        let (user, key) = create_user(kit.meta.as_ref(), "bea").await.unwrap();
        let stalled = WatchedKeys::new(kit.meta.clone(), Duration::from_millis(300));
        let cache = AuthCache::new(Duration::from_secs(600));
        let first = authenticate(&stalled, &cache, &key.secret);
        let revoke = async {
            stalled.read.notified().await;
            // What `UserService::revoke_key` does.
            let deleted = kit.meta.delete_key(&user.id, &key.record.id).await.unwrap();
            cache.forget_all();
            deleted
        };
        let (first, revoked) = tokio::join!(first, revoke);
        assert!(revoked);
        assert!(first.is_ok(), "read before the revocation: {first:?}");
        let again = authenticate(kit.meta.as_ref(), &cache, &key.secret).await;
        assert!(
            matches!(again, Err(DomainError::Unauthenticated)),
            "remembered past its revocation: {again:?}"
        );
        assert!(!cache.key_alive(&key.record.id));
    }
}
