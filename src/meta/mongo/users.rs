//! Users and their keys on MongoDB (a user's keys in `api_keys`, the tokens
//! they mint in `api_tokens`).

use async_trait::async_trait;
use bson::doc;
use chrono::{DateTime, Utc};
use mongodb::{Collection, options::ReturnDocument};
use serde::Serialize;

use super::{
    MongoStore,
    errors::{classify, classify_sent},
    events::EventSeq,
    find_sorted,
};
use crate::{
    meta::{
        ApiKeyRecord, EventDraft, KeyMint, KeyRepo, MetaError, MetaResult, TokenRecord, UserRecord,
        UserRepo,
    },
    vocab::{ApiKeyHash, KeyId, UserId},
};

impl MongoStore {
    /// Inserts `record` into `into` in one transaction with a write to its
    /// owner's user document, refused (`UserDeleting`) once the owner's
    /// deletion began or the owner is gone. Written, not only
    /// read, so that a deletion beginning or finishing meanwhile conflicts
    /// with this transaction instead of missing the record (which would
    /// then outlive its owner).
    pub(super) async fn insert_owned<T>(
        &self,
        owner: &UserId,
        into: &Collection<T>,
        record: &T,
        event: EventDraft,
    ) -> MetaResult<()>
    where
        T: Serialize + Send + Sync,
    {
        self.insert_minted(owner, into, (record, Some(event)), None)
            .await
    }

    /// [`MongoStore::insert_owned`] (its event, if any, numbered by the
    /// write of the owner's document), and in the same transaction: the key
    /// `check.by` of the owner's still exists (`MinterRevoked`; written,
    /// so that its delete committing meanwhile conflicts with this
    /// transaction), and at most `check.max` documents of `into` match
    /// `check.count` once `record` is in (else `check.too_many`). The
    /// owner's document, written first, orders concurrent inserts, so
    /// the count is exact.
    pub(super) async fn insert_minted<T>(
        &self,
        owner: &UserId,
        into: &Collection<T>,
        (record, event): (&T, Option<EventDraft>),
        check: Option<MintCheck<'_>>,
    ) -> MetaResult<()>
    where
        T: Serialize + Send + Sync,
    {
        let mut s = self.txns.begin(None).await?;
        let result = async {
            let n = i64::from(event.is_some());
            let user = self
                .db
                .collection::<EventSeq>("users")
                .find_one_and_update(
                    doc! {"_id": owner, "deleting_since": null},
                    doc! {"$inc": {"owned_seq": 1, "event_seq": n}},
                )
                .projection(doc! {"event_seq": 1})
                .return_document(ReturnDocument::After)
                .session(&mut s)
                .await
                .map_err(classify)?
                .ok_or(MetaError::UserDeleting)?;
            if let Some(id) = check.as_ref().and_then(|c| c.new_key)
                && self
                    .revoked_keys()
                    .find_one(doc! {"_id": id, "user_id": owner})
                    .session(&mut s)
                    .await
                    .map_err(classify)?
                    .is_some()
            {
                // Inserted before, then revoked: this is a resend.
                return Err(MetaError::Duplicate);
            }
            into.insert_one(record)
                .session(&mut s)
                .await
                .map_err(classify)?;
            let drafts = event.into_iter().collect();
            self.insert_events(&mut s, *owner, user.event_seq - n, drafts)
                .await?;
            let Some(check) = check else {
                return Ok(());
            };
            if let Some(by) = check.by {
                let minter = self
                    .keys()
                    .update_one(
                        doc! {"_id": by, "user_id": owner},
                        doc! {"$inc": {"minted": 1}},
                    )
                    .session(&mut s)
                    .await
                    .map_err(classify)?;
                if minter.matched_count == 0 {
                    return Err(MetaError::MinterRevoked);
                }
            }
            if let Some(purge) = check.purge {
                into.delete_many(purge)
                    .session(&mut s)
                    .await
                    .map_err(classify)?;
            }
            let held = into
                .count_documents(check.count)
                .session(&mut s)
                .await
                .map_err(classify)?;
            if held > check.max as u64 {
                return Err(check.too_many);
            }
            Ok(())
        }
        .await;
        self.txns.finish(s, None, result).await
    }
}

/// What [`MongoStore::insert_minted`] checks besides the owner.
pub(super) struct MintCheck<'a> {
    /// The id of the key inserted, if a key: `Duplicate` if it was revoked
    /// (a resend of an insert that applied, then was revoked).
    new_key: Option<&'a KeyId>,
    by: Option<&'a KeyId>,
    /// Deleted first, in the same transaction: a user's expired tokens, so
    /// that what is stored stays within the cap (not only what is live).
    purge: Option<bson::Document>,
    count: bson::Document,
    max: usize,
    too_many: MetaError,
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
        find_sorted(self.users(), filter, doc! {"_id": 1}, limit).await
    }

    async fn set_quota(&self, id: &UserId, quota: Option<i64>) -> MetaResult<Option<UserRecord>> {
        let update = match quota {
            Some(q) => doc! {"$set": {"quota_bytes": q}},
            None => doc! {"$unset": {"quota_bytes": ""}},
        };
        self.users()
            // A user being deleted keeps the quota they had.
            .find_one_and_update(doc! {"_id": id, "deleting_since": null}, update)
            .return_document(mongodb::options::ReturnDocument::After)
            .await
            // Sent and its answer lost: it may have applied (unknown, not 503).
            .map_err(classify_sent)
    }
}

#[async_trait]
impl KeyRepo for MongoStore {
    async fn insert_key(&self, key: &ApiKeyRecord, mint: KeyMint<'_>) -> MetaResult<()> {
        let check = MintCheck {
            new_key: Some(&key.id),
            by: mint.by,
            purge: None,
            count: doc! {"user_id": &key.user_id},
            max: mint.max,
            too_many: MetaError::TooManyKeys(mint.max),
        };
        let minted = EventDraft::key(&key.id, &key.name, false);
        (self.insert_minted(&key.user_id, &self.keys(), (key, Some(minted)), Some(check))).await
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
        let user = UserRepo::user(self, &key.user_id).await?;
        Ok(user.map(|u| (key, u)))
    }

    async fn key(&self, user: &UserId, id: &KeyId) -> MetaResult<Option<ApiKeyRecord>> {
        self.keys()
            .find_one(doc! {"_id": id, "user_id": user})
            .await
            .map_err(classify)
    }

    async fn keys(
        &self,
        user: &UserId,
        after: Option<&KeyId>,
        limit: usize,
    ) -> MetaResult<Vec<ApiKeyRecord>> {
        let filter = match after {
            Some(a) => doc! {"user_id": user, "_id": {"$gt": a}},
            None => doc! {"user_id": user},
        };
        find_sorted(self.keys(), filter, doc! {"_id": 1}, limit).await
    }

    async fn delete_key(&self, user: &UserId, id: &KeyId) -> MetaResult<bool> {
        // One transaction: the key, its tokens, and its id kept (so that a
        // resend of its insert whose answer was lost cannot store it again).
        // Plain writes here met a mint's transaction left open by a killed
        // process and were retried by the server (SecantusDB) without end;
        // in a transaction a conflict comes back, and is retried (or
        // answered 409) by the caller.
        let at = bson::DateTime::from_chrono(crate::meta::now());
        let mut s = self.txns.begin(None).await?;
        let result = async {
            // Read by id, then deleted by hash: keys are sharded by hash (a
            // key is found by it before its user is known), and a sharded
            // cluster sends a single delete to one shard only by its shard
            // key (before MongoDB 7.1 a `findAndModify` without it is
            // refused). The read goes to every shard; revoking is rare.
            let found = self
                .keys()
                .find_one(doc! {"_id": id, "user_id": user})
                .session(&mut s)
                .await
                .map_err(classify)?;
            let Some(deleted) = found else {
                return Ok(false);
            };
            let gone = self
                .keys()
                .delete_one(doc! {"hash": &deleted.hash, "_id": id})
                .session(&mut s)
                .await
                .map_err(classify)?;
            if gone.deleted_count == 0 {
                return Ok(false);
            }
            self.revoked_keys()
                .update_one(
                    doc! {"_id": id, "user_id": user},
                    doc! {"$setOnInsert": {"at": at}},
                )
                .upsert(true)
                .session(&mut s)
                .await
                .map_err(classify)?;
            self.tokens()
                .delete_many(doc! {"key_id": id})
                .session(&mut s)
                .await
                .map_err(classify)?;
            let revoked = EventDraft::key(id, &deleted.name, true);
            self.emit(&mut s, user, vec![revoked]).await?;
            Ok(true)
        }
        .await;
        self.txns.finish(s, None, result).await
    }

    async fn insert_token(&self, token: &TokenRecord, max_live: usize) -> MetaResult<()> {
        // The user's expired tokens go first: what is stored is then what
        // is live, at most the cap (a key's revocation and a user's
        // deletion delete them in one transaction, kept small by this).
        let now = bson::DateTime::from_chrono(crate::meta::now());
        let check = MintCheck {
            new_key: None,
            by: Some(&token.key_id),
            purge: Some(doc! {"user_id": &token.user_id, "expires_at": {"$lte": now}}),
            count: doc! {"user_id": &token.user_id},
            max: max_live,
            too_many: MetaError::TooManyTokens(max_live),
        };
        (self.insert_minted(&token.user_id, &self.tokens(), (token, None), Some(check))).await
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
        let user = UserRepo::user(self, &token.user_id).await?;
        Ok(user.map(|u| (token, u)))
    }

    async fn delete_expired_tokens(&self, before: DateTime<Utc>) -> MetaResult<u64> {
        let kept_from = bson::DateTime::from_chrono(before - crate::meta::REVOKED_KEPT);
        self.revoked_keys()
            .delete_many(doc! {"at": {"$lt": kept_from}})
            .await
            .map_err(classify)?;
        // In a transaction: a mint's, left open by a killed process, may
        // hold some of these (it deletes its user's expired tokens); a plain
        // delete would wait on it (SecantusDB: without end), a transaction
        // meets the conflict and the next pass tries again.
        let mut s = self.txns.begin(None).await?;
        let result = async {
            let deleted = self
                .tokens()
                .delete_many(doc! {"expires_at": {"$lt": bson::DateTime::from_chrono(before)}})
                .session(&mut s)
                .await
                .map_err(classify)?;
            Ok(deleted.deleted_count)
        }
        .await;
        self.txns.finish(s, None, result).await
    }
}
