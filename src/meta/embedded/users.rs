//! Users and their keys in the embedded store: `keys/{hash}` holds a key's
//! record, `user_keys/{user}/{key id}` its hash (the user's list).

use async_trait::async_trait;

use super::{EmbeddedStore, txn::Txn, user_key};
use crate::{
    meta::{ApiKeyRecord, KeyRepo, MetaError, MetaResult, UserRecord, UserRepo},
    vocab::{ApiKeyHash, KeyId, UserId},
};

fn hash_key(hash: &ApiKeyHash) -> String {
    format!("keys/{}", hash.as_str())
}

fn user_keys(user: &UserId) -> String {
    format!("user_keys/{user}/")
}

fn put_key(tx: &mut Txn, key: &ApiKeyRecord) -> MetaResult<()> {
    tx.insert(&hash_key(&key.hash), key)?;
    tx.put(&format!("{}{}", user_keys(&key.user_id), key.id), &key.hash)
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
}

#[async_trait]
impl KeyRepo for EmbeddedStore {
    async fn insert_key(&self, key: &ApiKeyRecord) -> MetaResult<()> {
        let key = key.clone();
        self.transaction(move |tx| {
            let ukey = user_key(&key.user_id);
            let user: UserRecord = tx
                .get(&ukey)?
                .filter(|u: &UserRecord| u.deleting_since.is_none())
                .ok_or(MetaError::NotFound)?;
            // Written, so that a deletion beginning meanwhile conflicts.
            tx.put(&ukey, &user)?;
            put_key(tx, &key)
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
            let user: Option<UserRecord> = tx.get(&user_key(&key.user_id))?;
            Ok(user.map(|mut u| {
                u.file_ids.clear();
                (key, u)
            }))
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

    async fn keys(&self, user: &UserId) -> MetaResult<Vec<ApiKeyRecord>> {
        let prefix = user_keys(user);
        self.transaction(move |tx| {
            let mut keys = Vec::new();
            for index in tx.keys(&prefix, None, usize::MAX)? {
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
        let index = format!("{}{id}", user_keys(user));
        self.transaction(move |tx| {
            let Some(hash) = tx.get::<ApiKeyHash>(&index)? else {
                return Ok(false);
            };
            tx.delete(&index);
            tx.delete(&hash_key(&hash));
            Ok(true)
        })
        .await
    }
}
