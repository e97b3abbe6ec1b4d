//! Users and their keys in the embedded store: `keys/{hash}` holds a key's
//! record, `user_keys/{user}/{key id}` its hash (the user's list); a
//! token's record is `tokens/{hash}`, indexed under its key by `key_tokens/`.
//! (A store written when a user had one key is moved to this shape when
//! opened: see `migrate.rs`.)

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::{EmbeddedStore, events::emit_for, txn::Txn, user_key};
use crate::{
    meta::{
        ApiKeyRecord, EventDraft, KeyMint, KeyRepo, MetaError, MetaResult, OpenLimits, TokenRecord,
        UserRecord, UserRepo,
    },
    vocab::{ApiKeyHash, KeyId, UserId},
};

fn hash_key(hash: &ApiKeyHash) -> String {
    format!("keys/{}", hash.as_str())
}

fn user_keys(user: &UserId) -> String {
    format!("user_keys/{user}/")
}

fn token_key(hash: &ApiKeyHash) -> String {
    format!("tokens/{}", hash.as_str())
}

/// The index of a key's tokens: `key_tokens/{key id}/{token hash}`.
fn key_tokens(key: &KeyId) -> String {
    format!("key_tokens/{key}/")
}

/// The index of a user's tokens by expiry:
/// `user_tokens/{user}/{expiry, ms, 20 digits}/{token hash}`, so that a
/// mint counts the live ones without reading the expired ones.
fn user_tokens(user: &UserId) -> String {
    format!("user_tokens/{user}/")
}

fn expiry_ms(at: DateTime<Utc>) -> String {
    format!("{:020}", at.timestamp_millis().max(0))
}

fn user_token_index(t: &TokenRecord) -> String {
    let (user, at) = (user_tokens(&t.user_id), expiry_ms(t.expires_at));
    format!("{user}{at}/{}", t.hash.as_str())
}

/// `revoked_keys/{key id}` → when: the keys revoked within
/// [`crate::meta::REVOKED_KEPT`], so that the resend of a key's insert
/// whose answer was lost cannot bring back a key revoked meanwhile.
fn revoked_key(id: &KeyId) -> String {
    format!("revoked_keys/{id}")
}

/// Deletes a token and its index entries inside `tx`.
pub(super) fn drop_token(tx: &mut Txn, t: &TokenRecord) {
    tx.delete(&token_key(&t.hash));
    tx.delete(&format!("{}{}", key_tokens(&t.key_id), t.hash.as_str()));
    tx.delete(&user_token_index(t));
}

pub(super) fn put_key(tx: &mut Txn, key: &ApiKeyRecord) -> MetaResult<()> {
    tx.insert(&hash_key(&key.hash), key)?;
    tx.put(&format!("{}{}", user_keys(&key.user_id), key.id), &key.hash)
}

/// Refuses a record of `owner`'s (`UserDeleting`) once their deletion
/// began or if they are gone. The user is written back, so that a deletion
/// beginning or finishing meanwhile conflicts with the transaction instead
/// of missing the record it inserts.
pub(super) fn owner_may_write(tx: &mut Txn, owner: &UserId) -> MetaResult<()> {
    let ukey = user_key(owner);
    let user: UserRecord = tx.get(&ukey)?.ok_or(MetaError::UserDeleting)?;
    OpenLimits::may_write(&user)?;
    tx.put(&ukey, &user)
}

/// Checks that `owner`'s key `minter` still exists, and writes it back, so
/// that its revocation committing meanwhile conflicts with this
/// transaction instead of missing what it inserts.
fn minter_alive(tx: &mut Txn, owner: &UserId, minter: &KeyId) -> MetaResult<()> {
    let index = format!("{}{minter}", user_keys(owner));
    let hash: ApiKeyHash = tx.get(&index)?.ok_or(MetaError::MinterRevoked)?;
    let key: ApiKeyRecord = tx.get(&hash_key(&hash))?.ok_or(MetaError::MinterRevoked)?;
    tx.put(&hash_key(&hash), &key)
}

/// Deletes `user`'s tokens expired at `now` and answers how many are left
/// (all live): what is stored stays within the cap, so that a key's
/// revocation and a user's deletion, which delete them in one
/// transaction, stay small. (A token minted before the expiry index was
/// kept is not counted; it expires within `FILEDOCK_TOKEN_MAX_SECS`.)
fn live_tokens(tx: &mut Txn, user: &UserId, now: DateTime<Utc>) -> MetaResult<usize> {
    let (prefix, now) = (user_tokens(user), expiry_ms(now));
    let mut live = 0;
    for index in tx.keys(&prefix, None, usize::MAX)? {
        let rest = &index[prefix.len()..];
        let Some((at, hash)) = rest.split_once('/') else {
            continue;
        };
        if at > now.as_str() {
            live += 1;
            continue;
        }
        match tx.get::<TokenRecord>(&format!("tokens/{hash}"))? {
            Some(t) => drop_token(tx, &t),
            None => tx.delete(&index),
        }
    }
    Ok(live)
}

#[async_trait]
impl UserRepo for EmbeddedStore {
    async fn insert_user(&self, user: &UserRecord, key: &ApiKeyRecord) -> MetaResult<()> {
        let (user, key) = (user.clone(), key.clone());
        self.transaction(move |tx| {
            tx.insert(&user_key(&user.id), &user)?;
            put_key(tx, &key)
        })
        .await
    }

    async fn user(&self, id: &UserId) -> MetaResult<Option<UserRecord>> {
        let key = user_key(id);
        self.transaction(move |tx| tx.get(&key)).await
    }

    async fn list_users(
        &self,
        after: Option<&UserId>,
        limit: usize,
    ) -> MetaResult<Vec<UserRecord>> {
        let after = after.map(ToString::to_string);
        self.transaction(move |tx| {
            let mut users = Vec::new();
            for k in tx.keys("users/", after.as_deref(), limit)? {
                users.extend(tx.get::<UserRecord>(&k)?);
            }
            Ok(users)
        })
        .await
    }

    async fn set_quota(&self, id: &UserId, quota: Option<i64>) -> MetaResult<Option<UserRecord>> {
        let key = user_key(id);
        self.transaction(move |tx| {
            // A user being deleted keeps the quota they had.
            let Some(mut user) = tx
                .get::<UserRecord>(&key)?
                .filter(|u| u.deleting_since.is_none())
            else {
                return Ok(None);
            };
            user.quota_bytes = quota;
            tx.put(&key, &user)?;
            Ok(Some(user))
        })
        .await
    }
}

#[async_trait]
impl KeyRepo for EmbeddedStore {
    async fn insert_key(&self, key: &ApiKeyRecord, mint: KeyMint<'_>) -> MetaResult<()> {
        let (key, by, max) = (key.clone(), mint.by.copied(), mint.max);
        self.transaction(move |tx| {
            owner_may_write(tx, &key.user_id)?;
            let index = format!("{}{}", user_keys(&key.user_id), key.id);
            // Stored, or stored and revoked since: a resend.
            if tx.get::<ApiKeyHash>(&index)?.is_some()
                || tx.get::<DateTime<Utc>>(&revoked_key(&key.id))?.is_some()
            {
                return Err(MetaError::Duplicate);
            }
            if let Some(by) = &by {
                minter_alive(tx, &key.user_id, by)?;
            }
            // The user document written above orders concurrent inserts:
            // the snapshot's count is the count.
            if tx.keys(&user_keys(&key.user_id), None, max)?.len() >= max {
                return Err(MetaError::TooManyKeys(max));
            }
            put_key(tx, &key)?;
            let minted = EventDraft::key(&key.id, &key.name, false);
            emit_for(tx, &key.user_id, vec![minted]).map(drop)
        })
        .await
    }

    async fn key_by_hash(
        &self,
        hash: &ApiKeyHash,
    ) -> MetaResult<Option<(ApiKeyRecord, UserRecord)>> {
        let hkey = hash_key(hash);
        self.transaction(move |tx| {
            let Some(key) = tx.get::<ApiKeyRecord>(&hkey)? else {
                return Ok(None);
            };
            let user = tx.get::<UserRecord>(&user_key(&key.user_id))?;
            Ok(user.map(|u| (key, u)))
        })
        .await
    }

    async fn key(&self, user: &UserId, id: &KeyId) -> MetaResult<Option<ApiKeyRecord>> {
        let index = format!("{}{id}", user_keys(user));
        self.transaction(move |tx| match tx.get::<ApiKeyHash>(&index)? {
            Some(hash) => tx.get(&hash_key(&hash)),
            None => Ok(None),
        })
        .await
    }

    async fn keys(
        &self,
        user: &UserId,
        after: Option<&KeyId>,
        limit: usize,
    ) -> MetaResult<Vec<ApiKeyRecord>> {
        let (prefix, after) = (user_keys(user), after.map(ToString::to_string));
        self.transaction(move |tx| {
            let mut keys = Vec::new();
            for index in tx.keys(&prefix, after.as_deref(), limit)? {
                if let Some(hash) = tx.get::<ApiKeyHash>(&index)?
                    && let Some(key) = tx.get(&hash_key(&hash))?
                {
                    keys.push(key);
                }
            }
            Ok(keys)
        })
        .await
    }

    async fn delete_key(&self, user: &UserId, id: &KeyId) -> MetaResult<bool> {
        let (index, id, user) = (format!("{}{id}", user_keys(user)), *id, *user);
        self.transaction(move |tx| {
            let Some(hash) = tx.get::<ApiKeyHash>(&index)? else {
                return Ok(false);
            };
            let name = (tx.get::<ApiKeyRecord>(&hash_key(&hash))?).map(|k| k.name);
            tx.delete(&index);
            tx.delete(&hash_key(&hash));
            tx.put(&revoked_key(&id), &crate::meta::now())?;
            // Its tokens die with it (authentication checks the key anyway).
            for k in tx.keys(&key_tokens(&id), None, usize::MAX)? {
                let hash = &k[key_tokens(&id).len()..];
                match tx.get::<TokenRecord>(&format!("tokens/{hash}"))? {
                    Some(t) => drop_token(tx, &t),
                    None => tx.delete(&k),
                }
            }
            let revoked = EventDraft::key(&id, name.as_deref().unwrap_or_default(), true);
            emit_for(tx, &user, vec![revoked])?;
            Ok(true)
        })
        .await
    }

    async fn insert_token(&self, token: &TokenRecord, max_live: usize) -> MetaResult<()> {
        let token = token.clone();
        self.transaction(move |tx| {
            owner_may_write(tx, &token.user_id)?;
            if tx.get::<TokenRecord>(&token_key(&token.hash))?.is_some() {
                return Err(MetaError::Duplicate);
            }
            minter_alive(tx, &token.user_id, &token.key_id)?;
            if live_tokens(tx, &token.user_id, crate::meta::now())? >= max_live {
                return Err(MetaError::TooManyTokens(max_live));
            }
            tx.insert(&token_key(&token.hash), &token)?;
            tx.put(&user_token_index(&token), &())?;
            tx.put(
                &format!("{}{}", key_tokens(&token.key_id), token.hash.as_str()),
                &(),
            )
        })
        .await
    }

    async fn token_by_hash(
        &self,
        hash: &ApiKeyHash,
    ) -> MetaResult<Option<(TokenRecord, UserRecord)>> {
        let tkey = token_key(hash);
        self.transaction(move |tx| {
            let Some(token) = tx.get::<TokenRecord>(&tkey)? else {
                return Ok(None);
            };
            let index = format!("{}{}", user_keys(&token.user_id), token.key_id);
            if tx.get::<ApiKeyHash>(&index)?.is_none() {
                return Ok(None);
            }
            let user = tx.get::<UserRecord>(&user_key(&token.user_id))?;
            Ok(user.map(|u| (token, u)))
        })
        .await
    }

    async fn delete_expired_tokens(&self, before: DateTime<Utc>) -> MetaResult<u64> {
        self.transaction(move |tx| {
            for k in tx.keys("revoked_keys/", None, usize::MAX)? {
                if tx
                    .get::<DateTime<Utc>>(&k)?
                    .is_some_and(|at| at < before - crate::meta::REVOKED_KEPT)
                {
                    tx.delete(&k);
                }
            }
            let mut deleted = 0;
            for k in tx.keys("tokens/", None, usize::MAX)? {
                if let Some(t) = tx.get::<TokenRecord>(&k)?
                    && t.expires_at < before
                {
                    drop_token(tx, &t);
                    deleted += 1;
                }
            }
            Ok(deleted)
        })
        .await
    }
}
