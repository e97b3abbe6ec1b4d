//! A user's deletion on MongoDB (see [`DeletionRepo`]).

use async_trait::async_trait;
use bson::{Document, doc};

use super::{MongoStore, errors::classify, events::purged_of, find_sorted};
use crate::{
    meta::{
        DeletionRepo, EventDraft, IntentRecord, MetaResult, OrphanRecord, ResumableRecord,
        UserRecord, now,
    },
    vocab::{FileId, UserId},
};

impl MongoStore {
    /// Up to `limit` documents of `collection` matching `filter`, in id order.
    async fn first_of<T>(
        &self,
        collection: &str,
        filter: Document,
        limit: usize,
    ) -> MetaResult<Vec<T>>
    where
        T: serde::de::DeserializeOwned + Send + Sync,
    {
        let sort = doc! {"_id": 1};
        find_sorted(self.db.collection::<T>(collection), filter, sort, limit).await
    }
}

#[async_trait]
impl DeletionRepo for MongoStore {
    async fn begin_user_deletion(&self, id: &UserId) -> MetaResult<Option<UserRecord>> {
        let mut s = self.txns.begin(None).await?;
        let result = async {
            let Some(mut user) = self
                .users()
                .find_one(doc! {"_id": id})
                .session(&mut s)
                .await
                .map_err(classify)?
            else {
                return Ok(None);
            };
            // A deletion begun before keeps its mark.
            if user.deleting_since.is_none() {
                let since = now();
                self.users()
                    .update_one(
                        doc! {"_id": id},
                        doc! {"$set": {"deleting_since": bson::DateTime::from_chrono(since)}},
                    )
                    .session(&mut s)
                    .await
                    .map_err(classify)?;
                user.deleting_since = Some(since);
                // Told once, numbered after their last event; kept by the
                // purge of the rest.
                self.emit(&mut s, id, vec![EventDraft::user_deleted(id)])
                    .await?;
            }
            let marked = Some(user);
            if marked.is_some() {
                for collection in ["api_keys", "api_tokens"] {
                    self.db
                        .collection::<Document>(collection)
                        .delete_many(doc! {"user_id": id})
                        .session(&mut s)
                        .await
                        .map_err(classify)?;
                }
            }
            Ok(marked)
        }
        .await;
        self.txns.finish(s, None, result).await
    }

    async fn users_being_deleted(&self, limit: usize) -> MetaResult<Vec<UserRecord>> {
        self.first_of("users", doc! {"deleting_since": {"$ne": null}}, limit)
            .await
    }

    async fn user_resumables(&self, id: &UserId, limit: usize) -> MetaResult<Vec<ResumableRecord>> {
        self.first_of("resumable_uploads", doc! {"user_id": id}, limit)
            .await
    }

    async fn user_intents(&self, id: &UserId, limit: usize) -> MetaResult<Vec<IntentRecord>> {
        self.first_of("upload_intents", doc! {"user_id": id}, limit)
            .await
    }

    async fn purge_containers(&self, id: &UserId, limit: usize) -> MetaResult<usize> {
        let mut purged = self.purge_events(id, limit).await?;
        purged += self.purge_dead_letters(id, limit).await?;
        for collection in ["sessions", "agents"] {
            let ids: Vec<Document> = self
                .first_of(collection, doc! {"owner_id": id}, limit)
                .await?;
            let ids: Vec<_> = ids.iter().filter_map(|d| d.get("_id").cloned()).collect();
            if ids.is_empty() {
                continue;
            }
            let deleted = self
                .db
                .collection::<Document>(collection)
                .delete_many(doc! {"_id": {"$in": ids}, "owner_id": id})
                .await
                .map_err(classify)?;
            purged += deleted.deleted_count as usize;
        }
        Ok(purged)
    }

    async fn purge_files(&self, id: &UserId, limit: usize) -> MetaResult<Vec<OrphanRecord>> {
        let files: Vec<Document> = self.first_of("files", doc! {"owner_id": id}, limit).await?;
        let ids: Vec<FileId> = files
            .iter()
            .filter_map(|f| f.get_str("_id").ok().and_then(FileId::parse))
            .collect();
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut s = self.txns.begin(None).await?;
        let result = async {
            let mut orphans = Vec::with_capacity(ids.len());
            for file_id in &ids {
                if let Some(deleted) = self
                    .delete_file_in(&mut s, id, file_id, (None, false))
                    .await?
                {
                    orphans.push(OrphanRecord {
                        id: deleted.orphan_id,
                        ..OrphanRecord::pending_for(&deleted.file)
                    });
                }
            }
            Ok(orphans)
        }
        .await;
        self.txns.finish(s, None, result).await
    }

    async fn finish_user_deletion(&self, id: &UserId) -> MetaResult<bool> {
        let mut s = self.txns.begin(None).await?;
        let result = async {
            for (collection, filter) in [
                ("files", doc! {"owner_id": id}),
                ("sessions", doc! {"owner_id": id}),
                ("agents", doc! {"owner_id": id}),
                ("events", purged_of(id)),
                ("upload_intents", doc! {"user_id": id}),
                ("resumable_uploads", doc! {"user_id": id}),
            ] {
                let left = self
                    .db
                    .collection::<Document>(collection)
                    .find_one(filter)
                    .session(&mut s)
                    .await
                    .map_err(classify)?;
                if left.is_some() {
                    return Ok(false);
                }
            }
            let gone = self
                .users()
                .delete_one(doc! {"_id": id, "deleting_since": {"$ne": null}})
                .session(&mut s)
                .await
                .map_err(classify)?;
            if gone.deleted_count == 0 {
                return Ok(false);
            }
            let leftovers = [
                ("api_keys", doc! {"user_id": id}),
                ("api_tokens", doc! {"user_id": id}),
                // The ids of their keys revoked within the hour: no insert
                // of theirs can come back now (the user is gone).
                ("revoked_keys", doc! {"user_id": id}),
                // (Their permissions went with each file: a user holds
                // only their own, `PermissionRecord::owner_of`.)
                // Their idempotency keys (each one's `_id` is `{user}:{key}`,
                // and the file it made is theirs).
                // By the `_id` range (its index), and the shard key.
                (
                    "idempotency",
                    doc! {
                        "_id": {"$gte": format!("{id}:"), "$lt": format!("{id};")},
                        "file.owner_id": id,
                    },
                ),
                // Their orphan records, whatever their status: every blob
                // under their prefixes is gone by now (the pass swept them).
                (
                    "orphan_minio_objects",
                    doc! {"key": {"$regex": format!("^(tus/)?files/{id}/")}},
                ),
            ];
            for (collection, filter) in leftovers {
                self.db
                    .collection::<Document>(collection)
                    .delete_many(filter)
                    .session(&mut s)
                    .await
                    .map_err(classify)?;
            }
            Ok(true)
        }
        .await;
        self.txns.finish(s, None, result).await
    }
}
