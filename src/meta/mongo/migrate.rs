//! Start-up migrations on MongoDB: each rewrites documents of an older shape
//! and finds none on the current one, so it runs at every start. Users of
//! the shape before issue 22 carried a `file_ids` array; before issue 25
//! their one key's hash in `users.api_key_hash`.

use bson::{Document, doc};
use futures::TryStreamExt;

use super::{MongoStore, Res, errors::classify};
use crate::{
    meta::{
        ApiKeyRecord, FIRST_KEY_NAME, MetaResult,
        retry::{TxnRetryPolicy, with_txn_retry},
    },
    vocab::{ApiKeyHash, KeyId, UserId},
};

/// Where a user of the old shape kept their one key's hash.
const LEGACY_KEY_FIELD: &str = "api_key_hash";

impl MongoStore {
    /// Runs every migration; what each changed is logged.
    pub(super) async fn migrate(&self) -> MetaResult<()> {
        let users = self.count_user_files().await.map_err(classify)?;
        if users > 0 {
            tracing::info!(users, "migrated users' file_ids arrays to file_count");
        }
        let moved = self.migrate_single_keys().await?;
        if moved > 0 {
            tracing::info!(moved, "moved users' single keys into api keys");
        }
        Ok(())
    }

    /// Replaces a user's `file_ids` array (the shape before issue 22) with
    /// `file_count`, counted from the `files` collection (the truth, even
    /// for a document an older instance wrote both fields to); returns how
    /// many users it rewrote. Each user is rewritten only while it still has
    /// the array, so a second run, or two instances starting together, count
    /// no user twice. Instances of the older shape must be stopped first: one
    /// still committing would push to the array after its count.
    async fn count_user_files(&self) -> Res<usize> {
        let users = self.db.collection::<Document>("users");
        let mut old = users
            .find(doc! {"file_ids": {"$exists": true}})
            .projection(doc! {"_id": 1})
            .await?;
        let mut rewritten = 0;
        while let Some(user) = old.try_next().await? {
            let Some(id) = user.get("_id").cloned() else {
                continue;
            };
            let count = self
                .db
                .collection::<Document>("files")
                .count_documents(doc! {"owner_id": &id})
                .await? as i64;
            let done = users
                .update_one(
                    doc! {"_id": id, "file_ids": {"$exists": true}},
                    doc! {"$set": {"file_count": count}, "$unset": {"file_ids": ""}},
                )
                .await?;
            rewritten += done.modified_count as usize;
        }
        Ok(rewritten)
    }

    /// Moves every user's key of the old shape into `api_keys`, named
    /// [`FIRST_KEY_NAME`] and dated as its user; how many. Each move is one
    /// transaction that unsets the field it moves, so a start after a crash
    /// and instances starting at once move each key exactly once.
    async fn migrate_single_keys(&self) -> MetaResult<usize> {
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
