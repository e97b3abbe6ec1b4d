//! Users and their keys on MongoDB. A user created when users had one key
//! kept its hash in `users.api_key_hash`: start-up moves it to `api_keys`.

use async_trait::async_trait;
use bson::{Document, doc};
use chrono::{DateTime, Utc};
use futures::TryStreamExt;

use super::{MongoStore, errors::classify};
use crate::{
    meta::{
        ApiKeyRecord, FIRST_KEY_NAME, KeyRepo, MetaError, MetaResult, TokenRecord, UserRecord,
        UserRepo,
        retry::{TxnRetryPolicy, with_txn_retry},
    },
    vocab::{ApiKeyHash, KeyId, UserId},
};

/// Where a user of the old shape kept their one key's hash.
const LEGACY_KEY_FIELD: &str = "api_key_hash";

impl MongoStore {
    /// Moves every user's key of the old shape into `api_keys`, named
    /// [`FIRST_KEY_NAME`] and dated as its user; how many. Each move is one
    /// transaction that unsets the field it moves, so a start after a crash
    /// and instances starting at once move each key exactly once.
    pub(super) async fn migrate_single_keys(&self) -> MetaResult<usize> {
        let legacy: Vec<Document> = self
            .db
            .collection::<Document>("users")
            .find(doc! {LEGACY_KEY_FIELD: {"$exists": true}})
            .projection(doc! {LEGACY_KEY_FIELD: 1, "created_at": 1})
            .await
            .map_err(classify)?
            .try_collect()
            .await
            .map_err(classify)?;
        let mut moved = 0;
        for user in legacy {
            let (Ok(Ok(user_id)), Ok(hash)) = (
                user.get_str("_id").map(str::parse::<UserId>),
                user.get_str(LEGACY_KEY_FIELD),
            ) else {
                continue;
            };
            let key = ApiKeyRecord {
                id: KeyId::new(),
                user_id,
                name: FIRST_KEY_NAME.into(),
                hash: ApiKeyHash::from_hex(hash.to_string()),
                created_at: user
                    .get_datetime("created_at")
                    .map_or_else(|_| crate::meta::now(), |t| t.to_chrono()),
            };
            let policy = TxnRetryPolicy::default();
            if with_txn_retry(&policy, || self.move_single_key(&key))
                .await?
                .value
            {
                moved += 1;
            }
        }
        Ok(moved)
    }

    /// The user, without the file list: authentication needs neither the
    /// list nor its size on the wire.
    async fn user_without_files(&self, id: &UserId) -> MetaResult<Option<UserRecord>> {
        self.users()
            .find_one(doc! {"_id": id})
            .projection(doc! {"file_ids": 0})
            .await
            .map_err(classify)
    }

    /// Moves one key, unless another start moved it first (`false`).
    async fn move_single_key(&self, key: &ApiKeyRecord) -> MetaResult<bool> {
        let mut s = self.txns.begin(None).await?;
        let result = async {
            let unset = self
                .users()
                .update_one(
                    doc! {"_id": &key.user_id, LEGACY_KEY_FIELD: &key.hash},
                    doc! {"$unset": {LEGACY_KEY_FIELD: ""}},
                )
                .session(&mut s)
                .await
                .map_err(classify)?;
            if unset.matched_count == 0 {
                return Ok(false);
            }
            self.keys()
                .insert_one(key)
                .session(&mut s)
                .await
                .map_err(classify)?;
            Ok(true)
        }
        .await;
        self.txns.finish(s, None, result).await
    }
}

#[async_trait]
impl UserRepo for MongoStore {
    async fn insert_user(&self, user: &UserRecord, key: &ApiKeyRecord) -> MetaResult<()> {
        let mut s = self.txns.begin(None).await?;
        let result = async {
            self.users()
                .insert_one(user)
                .session(&mut s)
                .await
                .map_err(classify)?;
            self.keys()
                .insert_one(key)
                .session(&mut s)
                .await
                .map_err(classify)?;
            Ok(())
        }
        .await;
        self.txns.finish(s, None, result).await
    }

    async fn user(&self, id: &UserId) -> MetaResult<Option<UserRecord>> {
        self.users()
            .find_one(doc! {"_id": id})
            .await
            .map_err(classify)
    }

    async fn list_users(
        &self,
        after: Option<&UserId>,
        limit: usize,
    ) -> MetaResult<Vec<UserRecord>> {
        let filter = match after {
            Some(a) => doc! {"_id": {"$gt": a}},
            None => doc! {},
        };
        self.users()
            .find(filter)
            .projection(doc! {"file_ids": 0})
            .sort(doc! {"_id": 1})
            .limit(i64::try_from(limit).unwrap_or(i64::MAX))
            .await
            .map_err(classify)?
            .try_collect()
            .await
            .map_err(classify)
    }

    async fn set_quota(&self, id: &UserId, quota: Option<i64>) -> MetaResult<Option<UserRecord>> {
        let update = match quota {
            Some(q) => doc! {"$set": {"quota_bytes": q}},
            None => doc! {"$unset": {"quota_bytes": ""}},
        };
        self.users()
            .find_one_and_update(doc! {"_id": id}, update)
            .projection(doc! {"file_ids": 0})
            .return_document(mongodb::options::ReturnDocument::After)
            .await
            .map_err(classify)
    }
}

#[async_trait]
impl KeyRepo for MongoStore {
    async fn insert_key(&self, key: &ApiKeyRecord) -> MetaResult<()> {
        let mut s = self.txns.begin(None).await?;
        let result = async {
            // Written, not only read, so that a deletion beginning at the same
            // time conflicts with this transaction instead of missing the key.
            let user = self
                .users()
                .update_one(
                    doc! {"_id": &key.user_id, "deleting_since": null},
                    doc! {"$inc": {"key_seq": 1}},
                )
                .session(&mut s)
                .await
                .map_err(classify)?;
            if user.matched_count == 0 {
                return Err(MetaError::NotFound);
            }
            self.keys()
                .insert_one(key)
                .session(&mut s)
                .await
                .map_err(classify)?;
            Ok(())
        }
        .await;
        self.txns.finish(s, None, result).await
    }

    async fn key_by_hash(
        &self,
        hash: &ApiKeyHash,
    ) -> MetaResult<Option<(ApiKeyRecord, UserRecord)>> {
        let Some(key) = self
            .keys()
            .find_one(doc! {"hash": hash})
            .await
            .map_err(classify)?
        else {
            return Ok(None);
        };
        let user = self.user_without_files(&key.user_id).await?;
        Ok(user.map(|u| (key, u)))
    }

    async fn key(&self, user: &UserId, id: &KeyId) -> MetaResult<Option<ApiKeyRecord>> {
        self.keys()
            .find_one(doc! {"_id": id, "user_id": user})
            .await
            .map_err(classify)
    }

    async fn keys(&self, user: &UserId) -> MetaResult<Vec<ApiKeyRecord>> {
        self.keys()
            .find(doc! {"user_id": user})
            .sort(doc! {"_id": 1})
            .await
            .map_err(classify)?
            .try_collect()
            .await
            .map_err(classify)
    }

    async fn delete_key(&self, user: &UserId, id: &KeyId) -> MetaResult<bool> {
        let deleted = self
            .keys()
            .delete_one(doc! {"_id": id, "user_id": user})
            .await
            .map_err(classify)?;
        // Its tokens die with it (authentication checks the key anyway).
        self.tokens()
            .delete_many(doc! {"key_id": id})
            .await
            .map_err(classify)?;
        Ok(deleted.deleted_count == 1)
    }

    async fn insert_token(&self, token: &TokenRecord) -> MetaResult<()> {
        self.tokens()
            .insert_one(token)
            .await
            .map(|_| ())
            .map_err(classify)
    }

    async fn token_by_hash(
        &self,
        hash: &ApiKeyHash,
    ) -> MetaResult<Option<(TokenRecord, UserRecord)>> {
        let Some(token) = self
            .tokens()
            .find_one(doc! {"hash": hash})
            .await
            .map_err(classify)?
        else {
            return Ok(None);
        };
        if KeyRepo::key(self, &token.user_id, &token.key_id)
            .await?
            .is_none()
        {
            return Ok(None);
        }
        let user = self.user_without_files(&token.user_id).await?;
        Ok(user.map(|u| (token, u)))
    }

    async fn delete_expired_tokens(&self, before: DateTime<Utc>) -> MetaResult<u64> {
        let deleted = self
            .tokens()
            .delete_many(doc! {"expires_at": {"$lt": bson::DateTime::from_chrono(before)}})
            .await
            .map_err(classify)?;
        Ok(deleted.deleted_count)
    }
}
