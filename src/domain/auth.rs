//! Authentication: who a bearer secret belongs to, remembered for a short
//! time. The time to live (`FILEDOCK_AUTH_CACHE_SECS`) is also the bound on
//! a revocation: an instance that remembers a key keeps accepting it until
//! its entry expires, and the next request after that looks it up again.

use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use chrono::{DateTime, Utc};

use super::DomainError;
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

/// The most authentications an instance remembers.
const AUTH_CACHE_CAPACITY: u64 = 100_000;

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

/// Authenticated callers by the hash of their secret, for a short time:
/// each until the cache's time to live after its lookup began (not after
/// it was cached, which a stalled lookup could put long after a key's
/// revocation).
pub type AuthCache = moka::sync::Cache<ApiKeyHash, (Caller, Instant)>;

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

/// The caller a bearer key or token belongs to. Callers found are
/// remembered for the cache's time to live, so a request costs no metadata
/// round trip to authenticate; a token's expiry is checked on every request.
/// A user being deleted is refused.
pub async fn authenticate(
    keys: &dyn KeyRepo,
    cache: &AuthCache,
    presented: &str,
) -> Result<Caller, DomainError> {
    let hash = hash_key(presented);
    let now = crate::meta::now();
    let looked_up = Instant::now();
    if let Some((caller, until)) = cache.get(&hash)
        && looked_up < until
    {
        if caller.grant.expired(now) {
            cache.invalidate(&hash);
            return Err(DomainError::Unauthenticated);
        }
        return Ok(caller);
    }
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
    if let Some(ttl) = cache.policy().time_to_live()
        && cache.policy().max_capacity() != Some(0)
    {
        cache.insert(hash, (caller.clone(), looked_up + ttl));
    }
    Ok(caller)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use async_trait::async_trait;
    use chrono::{DateTime, Utc};

    use super::*;
    use crate::{
        domain::{test_kit::Kit, users::create_user},
        meta::{ApiKeyRecord, MetaResult, TokenRecord, UserRecord, embedded::EmbeddedStore},
        vocab::{KeyId, UserId},
    };

    /// The store's keys, but a key's lookup stalls after it has read the
    /// key (a pause, a slow link) before it answers; `read` is told when
    /// it has read.
    struct Stalled(Arc<EmbeddedStore>, Duration, tokio::sync::Notify);

    #[async_trait]
    impl KeyRepo for Stalled {
        async fn insert_key(&self, key: &ApiKeyRecord) -> MetaResult<()> {
            self.0.insert_key(key).await
        }
        async fn key_by_hash(
            &self,
            hash: &ApiKeyHash,
        ) -> MetaResult<Option<(ApiKeyRecord, UserRecord)>> {
            let read = self.0.key_by_hash(hash).await;
            self.2.notify_one();
            tokio::time::sleep(self.1).await;
            read
        }
        async fn key(&self, user: &UserId, id: &KeyId) -> MetaResult<Option<ApiKeyRecord>> {
            self.0.key(user, id).await
        }
        async fn keys(&self, user: &UserId) -> MetaResult<Vec<ApiKeyRecord>> {
            self.0.keys(user).await
        }
        async fn delete_key(&self, user: &UserId, id: &KeyId) -> MetaResult<bool> {
            self.0.delete_key(user, id).await
        }
        async fn insert_token(&self, token: &TokenRecord) -> MetaResult<()> {
            self.0.insert_token(token).await
        }
        async fn token_by_hash(
            &self,
            hash: &ApiKeyHash,
        ) -> MetaResult<Option<(TokenRecord, UserRecord)>> {
            self.0.token_by_hash(hash).await
        }
        async fn delete_expired_tokens(&self, before: DateTime<Utc>) -> MetaResult<u64> {
            self.0.delete_expired_tokens(before).await
        }
    }

    /// A key revoked while its lookup stalled (read before, answered
    /// after) is refused once the cache's lifetime has passed since the
    /// lookup began, not remembered for a lifetime from its answer.
    #[tokio::test]
    async fn a_stalled_lookup_does_not_stretch_the_caches_lifetime() {
        const TTL: Duration = Duration::from_millis(200);
        let kit = Kit::new(|_| {}).await;
        let (user, key) = create_user(kit.meta.as_ref(), "ann").await.unwrap();
        let stalled = Stalled(kit.meta.clone(), TTL + TTL / 2, Default::default());
        let cache = auth_cache(TTL);
        let first = authenticate(&stalled, &cache, &key.secret);
        let revoke = async {
            stalled.2.notified().await;
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
}
