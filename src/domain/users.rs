//! Users and their API keys. A user holds any number of keys; each is a
//! random 256-bit secret shown once, stored only as its SHA-256 (a fast hash
//! suits high-entropy keys and lets the store look a key up by its hash),
//! under an id that lists and revocations name.

use std::sync::Arc;

use rand::RngCore;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

pub use super::auth::hash_key;
use super::{
    DomainError, UserId,
    auth::{Caller, authenticate},
    auth_cache::AuthCache,
    commit::{UserCommitError, user_commit},
    page::{Page, PageRequest},
    settle::OwnedInserts,
};
use crate::{
    lock::LockError,
    meta::{
        ApiKeyRecord, DeletionRepo, FIRST_KEY_NAME, KeyMint, KeyRepo, UserRecord, UserRepo,
        group::effective_quota,
    },
    vocab::KeyId,
};

/// The longest name a user or a key may have, in characters.
const MAX_NAME_CHARS: usize = 100;

/// Users and their keys, and the ports that takes.
pub struct UserService {
    users: Arc<dyn UserRepo>,
    /// A user's deletion begins here; the sweeper carries it on.
    deletions: Arc<dyn DeletionRepo>,
    keys: Arc<dyn KeyRepo>,
    auth_cache: AuthCache<Caller>,
    /// `FILEDOCK_USER_QUOTA_BYTES`: the quota of a user without their own.
    default_quota: Option<u64>,
    /// `FILEDOCK_MAX_KEYS_PER_USER`.
    max_keys: usize,
    /// A quota change, a deletion's mark and a new key take the user's
    /// commit lock, as every upload commit does, and their transactions are
    /// retried as theirs are (a new key is also sent again while its
    /// outcome is unknown).
    inserts: OwnedInserts,
}

/// A key just made: its record and its secret (shown once, never stored).
pub struct NewKey {
    pub record: ApiKeyRecord,
    pub secret: String,
}

impl UserService {
    pub fn new(
        (users, deletions): (Arc<dyn UserRepo>, Arc<dyn DeletionRepo>),
        keys: Arc<dyn KeyRepo>,
        auth_cache: AuthCache<Caller>,
        (default_quota, max_keys): (Option<u64>, usize),
        inserts: OwnedInserts,
    ) -> Self {
        Self {
            users,
            deletions,
            keys,
            auth_cache,
            default_quota,
            max_keys,
            inserts,
        }
    }

    /// Creates a user and their first key.
    pub async fn create_user(&self, name: &str) -> Result<(UserRecord, NewKey), DomainError> {
        create_user(self.users.as_ref(), name).await
    }

    /// The user, if there is one with this id.
    pub async fn user(&self, id: &UserId) -> Result<UserRecord, DomainError> {
        self.users.user(id).await?.ok_or(DomainError::NotFound)
    }

    /// Begins deleting the user (again, if it began before: the mark
    /// stays): marks them and deletes their keys and tokens in one
    /// transaction, and forgets this instance's authentications, so that
    /// their next request here is refused (elsewhere, once the auth cache
    /// forgets them). The sweeper deletes the rest, pass by pass. The
    /// user as marked.
    pub async fn begin_deletion(&self, id: &UserId) -> Result<UserRecord, DomainError> {
        // Under the user's commit lock, as a quota change: ordered with
        // their commits, not starved by them into write conflicts.
        let marked = user_commit(
            &self.inserts.locks,
            &self.inserts.turns,
            &self.inserts.txns,
            id,
            "begin_user_deletion",
            || self.deletions.begin_user_deletion(id),
        )
        .await;
        // Even if its answer was lost: it may have applied.
        self.auth_cache.forget_all();
        marked?.value.ok_or(DomainError::NotFound)
    }

    /// A page of every user, oldest first (without their file lists).
    pub async fn users(&self, page: &PageRequest) -> Result<Page<UserRecord>, DomainError> {
        page.fetch(
            |after, n| async move { self.users.list_users(after.as_ref(), n).await },
            |u: &UserRecord| u.id,
        )
        .await
    }

    /// The quota that holds for `user`: their own, else the default.
    pub fn quota_of(&self, user: &UserRecord) -> Option<u64> {
        effective_quota(user.quota_bytes, self.default_quota)
    }

    /// Sets `id`'s own quota (`None`: the default again) and answers the
    /// user as written. Every upload commit decides the quota in its
    /// transaction, so none commits past it once this returns; this
    /// instance forgets the callers it remembers (their quota with them),
    /// others within the auth cache's lifetime (until then their early
    /// checks may use the old one; the commit decides).
    pub async fn set_quota(
        &self,
        id: &UserId,
        quota: Option<u64>,
    ) -> Result<UserRecord, DomainError> {
        let quota = quota
            .map(|q| {
                i64::try_from(q).map_err(|_| {
                    DomainError::InvalidRequest(format!("quota_bytes must be at most {}", i64::MAX))
                })
            })
            .transpose()?;
        // Under the user's commit lock: ordered with their commits, not
        // racing them into write conflicts.
        let set = user_commit(
            &self.inserts.locks,
            &self.inserts.turns,
            &self.inserts.txns,
            id,
            "set_quota",
            || self.users.set_quota(id, quota),
        )
        .await;
        // Even if its answer was lost: it may have applied.
        self.auth_cache.forget_all();
        set?.value.ok_or(DomainError::NotFound)
    }

    /// Makes another key for `user`, asked for by their key `by` (`None`:
    /// the admin). `NotFound` if the user is gone or being deleted (asked
    /// by the admin), `Unauthenticated` if so or if `by` was revoked (even
    /// while this ran: checked in the transaction that inserts, so a
    /// revoked key that another instance still remembers mints nothing),
    /// `TooManyKeys` at `FILEDOCK_MAX_KEYS_PER_USER`.
    pub async fn create_key(
        &self,
        user: &UserId,
        name: &str,
        by: Option<&KeyId>,
    ) -> Result<NewKey, DomainError> {
        let key = new_key(*user, name)?;
        let mint = KeyMint {
            by,
            max: self.max_keys,
        };
        // Its transaction writes the user document, as commits do. A user
        // being deleted (or gone) has no keys to make.
        let made = (self.inserts).insert(user, ("insert_key", None), || {
            self.keys.insert_key(&key.record, mint)
        });
        match made.await {
            Err(DomainError::Unauthenticated) if by.is_none() => Err(DomainError::NotFound),
            other => other.map(|()| key),
        }
    }

    /// A page of the user's keys, oldest first; `NotFound` if there is no
    /// such user.
    pub async fn keys(
        &self,
        user: &UserId,
        page: &PageRequest,
    ) -> Result<Page<ApiKeyRecord>, DomainError> {
        // A user being deleted has none, and takes none: gone (404).
        if self.user(user).await?.deleting_since.is_some() {
            return Err(DomainError::NotFound);
        }
        page.fetch(
            |after: Option<KeyId>, n| async move { self.keys.keys(user, after.as_ref(), n).await },
            |k: &ApiKeyRecord| k.id,
        )
        .await
    }

    /// Revokes the user's key `id` (and every token it minted). This
    /// instance forgets every authentication it remembers at once; other
    /// instances refuse the key once their cache entry expires
    /// (`FILEDOCK_AUTH_CACHE_SECS`).
    pub async fn revoke_key(&self, user: &UserId, id: &KeyId) -> Result<ApiKeyRecord, DomainError> {
        let key = self
            .keys
            .key(user, id)
            .await?
            .ok_or(DomainError::NotFound)?;
        // Under the user's commit lock, as the mints are (each writes the
        // key that mints): a burst of mints with the key cannot starve its
        // revocation into write conflicts. The lock only orders: with the
        // lock backend down (even in production) the transaction runs
        // without it, so a leaked key is revocable during a Redis outage.
        let delete = || self.keys.delete_key(user, id);
        let deleted = match user_commit(
            &self.inserts.locks,
            &self.inserts.turns,
            &self.inserts.txns,
            user,
            "delete_key",
            delete,
        )
        .await
        {
            Err(UserCommitError::Lock(e @ LockError::Unavailable(_))) => {
                tracing::warn!(error = %e, "revoking a key without the user's commit lock");
                self.inserts
                    .turns
                    .run(&self.inserts.txns, "delete_key", user, delete)
                    .await
                    .map_err(Into::into)
            }
            other => other.map_err(DomainError::from),
        };
        // Even if its answer was lost: it may have applied. Revocations are
        // rare: forgetting everything is simpler than finding the entries
        // the key (and its tokens) authenticated.
        self.auth_cache.forget_all();
        if !deleted?.value {
            return Err(DomainError::NotFound);
        }
        Ok(key)
    }

    /// Whether `owner`'s key `id` still exists (a signed link's download
    /// asks). A key this instance authenticated within the auth cache's
    /// lifetime is alive without a round trip; any other is read from the
    /// store and, if there, remembered. So a revocation holds here at once
    /// and elsewhere within `FILEDOCK_AUTH_CACHE_SECS`, as it does for the
    /// key itself.
    pub async fn key_alive(&self, owner: &UserId, id: &KeyId) -> Result<bool, DomainError> {
        if self.auth_cache.key_alive(id) {
            return Ok(true);
        }
        self.key_alive_now(owner, id).await
    }

    /// Whether `owner`'s key `id` exists now: read from the store whatever
    /// this instance remembers (a redirect's presigned URL outlives the
    /// answer, so it must not start from an entry near its end).
    pub async fn key_alive_now(&self, owner: &UserId, id: &KeyId) -> Result<bool, DomainError> {
        let start = self.auth_cache.lookup_start();
        let alive = self.keys.key(owner, id).await?.is_some();
        if alive {
            self.auth_cache.remember_key_alive(*id, start);
        }
        Ok(alive)
    }

    /// Who a bearer secret belongs to (see [`authenticate`]).
    pub async fn authenticate(&self, presented: &str) -> Result<Caller, DomainError> {
        authenticate(self.keys.as_ref(), &self.auth_cache, presented).await
    }

    /// Forgets every remembered authentication on this instance.
    pub fn forget_authentications(&self) {
        self.auth_cache.forget_all();
    }
}

/// A new API key: `fdk_` + 64 hex digits.
pub fn new_api_key() -> String {
    secret_with_prefix("fdk_")
}

/// `prefix` + 64 hex digits of fresh randomness.
pub(super) fn secret_with_prefix(prefix: &str) -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    format!("{prefix}{}", hex::encode(bytes))
}

/// Compares two secrets in constant time (by their digests, so lengths leak nothing).
pub fn secrets_match(presented: &str, expected: &str) -> bool {
    Sha256::digest(presented.as_bytes())
        .ct_eq(&Sha256::digest(expected.as_bytes()))
        .into()
}

pub(super) fn parse_name(raw: &str) -> Result<String, DomainError> {
    let name =
        crate::vocab::ids::clean_name(raw.trim(), "name").map_err(DomainError::InvalidRequest)?;
    if name.is_empty() || name.chars().count() > MAX_NAME_CHARS {
        return Err(DomainError::InvalidRequest(format!(
            "name must be 1 to {MAX_NAME_CHARS} characters"
        )));
    }
    Ok(name)
}

/// A new key of `user` named `name`, not stored yet.
fn new_key(user: UserId, name: &str) -> Result<NewKey, DomainError> {
    let secret = new_api_key();
    let record = ApiKeyRecord {
        id: KeyId::new(),
        user_id: user,
        name: parse_name(name)?,
        hash: hash_key(&secret),
        created_at: crate::meta::now(),
    };
    Ok(NewKey { record, secret })
}

/// Creates a user and their first key ([`FIRST_KEY_NAME`]).
pub async fn create_user(
    meta: &dyn UserRepo,
    name: &str,
) -> Result<(UserRecord, NewKey), DomainError> {
    let user = UserRecord::new(parse_name(name)?);
    let key = new_key(user.id, FIRST_KEY_NAME)?;
    meta.insert_user(&user, &key.record).await?;
    Ok((user, key))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{
        config::Settings,
        domain::{test_keys::WatchedKeys, test_kit::Kit},
        meta::retry::Transactions,
        metrics::Metrics,
    };

    /// A signed link's key check: a key this instance authenticated is
    /// alive without a read; another is read once and then remembered; a
    /// key deleted elsewhere stays alive here until the cache forgets it
    /// (the documented bound), and is dead at once once it does.
    #[tokio::test]
    async fn a_keys_liveness_comes_from_the_auth_cache_when_it_can() {
        let kit = Kit::new(|_| {}).await;
        let defaults = Settings::embedded(std::env::temp_dir());
        let keys = Arc::new(WatchedKeys::new(kit.meta.clone(), Duration::ZERO));
        let users = UserService::new(
            (kit.meta.clone(), kit.meta.clone()),
            keys.clone(),
            AuthCache::new(Duration::from_secs(600)),
            (None, 100),
            OwnedInserts {
                locks: kit.locks.clone(),
                turns: Arc::default(),
                txns: Transactions::new(defaults.txn_retry, Arc::new(Metrics::default())),
                settle_window: defaults.settle_window,
            },
        );
        let reads = || keys.key_reads();
        let (ann, first) = create_user(kit.meta.as_ref(), "ann").await.unwrap();
        let (bob, second) = create_user(kit.meta.as_ref(), "bob").await.unwrap();
        users.authenticate(&first.secret).await.unwrap();
        assert!(users.key_alive(&ann.id, &first.record.id).await.unwrap());
        assert_eq!(reads(), 0, "authenticated here: no read");
        assert!(users.key_alive(&bob.id, &second.record.id).await.unwrap());
        assert!(users.key_alive(&bob.id, &second.record.id).await.unwrap());
        assert_eq!(reads(), 1, "read once, then remembered");
        assert!(!users.key_alive(&ann.id, &KeyId::new()).await.unwrap());
        // Revoked by another instance: alive here until the cache forgets.
        assert!(
            kit.meta
                .delete_key(&bob.id, &second.record.id)
                .await
                .unwrap()
        );
        assert!(users.key_alive(&bob.id, &second.record.id).await.unwrap());
        users.forget_authentications();
        assert!(!users.key_alive(&bob.id, &second.record.id).await.unwrap());
        // Revoked here: dead at once.
        users.revoke_key(&ann.id, &first.record.id).await.unwrap();
        assert!(!users.key_alive(&ann.id, &first.record.id).await.unwrap());
    }

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
