//! Upload intents and orphans on MongoDB.

use async_trait::async_trait;
use bson::{Document, doc};
use chrono::{DateTime, Utc};

use super::{MongoStore, errors::classify, find_sorted};
use crate::{
    meta::{
        CleanupRepo, IntentRecord, MetaCounts, MetaError, MetaResult, OrphanRecord, OrphanStatus,
    },
    vocab::{BlobKey, FileId, OrphanId, UserId},
};

/// Intents whose upload was last alive before `t` (see [`IntentRecord::alive_at`]).
fn last_alive_before(t: DateTime<Utc>) -> Document {
    let t = bson::DateTime::from_chrono(t);
    doc! {"$and": [
        {"$or": [
            {"refreshed_at": {"$lt": t}},
            {"refreshed_at": null, "created_at": {"$lt": t}},
        ]},
        {"$or": [{"alive_until": null}, {"alive_until": {"$lt": t}}]},
    ]}
}

#[async_trait]
impl CleanupRepo for MongoStore {
    async fn put_intent(&self, intent: &IntentRecord) -> MetaResult<()> {
        self.intents()
            .insert_one(intent)
            .await
            .map(|_| ())
            .map_err(classify)
    }

    async fn put_intents(&self, intents: &[IntentRecord]) -> MetaResult<()> {
        self.intents()
            .insert_many(intents)
            .await
            .map(|_| ())
            .map_err(classify)
    }

    async fn delete_intent(&self, owner: &UserId, file_id: &FileId) -> MetaResult<()> {
        self.intents()
            .delete_one(doc! {"_id": file_id, "user_id": owner})
            .await
            .map(|_| ())
            .map_err(classify)
    }

    async fn intent(&self, owner: &UserId, file_id: &FileId) -> MetaResult<Option<IntentRecord>> {
        self.intents()
            .find_one(doc! {"_id": file_id, "user_id": owner})
            .await
            .map_err(classify)
    }

    async fn intent_by_id_alone(&self, file_id: &FileId) -> MetaResult<Option<IntentRecord>> {
        self.intents()
            .find_one(doc! {"_id": file_id})
            .await
            .map_err(classify)
    }

    async fn intents(&self, before: DateTime<Utc>, limit: usize) -> MetaResult<Vec<IntentRecord>> {
        find_sorted(
            self.intents(),
            last_alive_before(before),
            doc! {"created_at": 1},
            limit,
        )
        .await
    }

    async fn touch_intent(
        &self,
        owner: &UserId,
        file_id: &FileId,
        until: Option<DateTime<Utc>>,
    ) -> MetaResult<Option<IntentRecord>> {
        let now = bson::DateTime::from_chrono(crate::meta::now());
        let mut set = doc! {"refreshed_at": now};
        if let Some(until) = until {
            set.insert("alive_until", bson::DateTime::from_chrono(until));
        }
        self.intents()
            .find_one_and_update(doc! {"_id": file_id, "user_id": owner}, doc! {"$set": set})
            .return_document(mongodb::options::ReturnDocument::After)
            .await
            .map_err(classify)
    }

    async fn abandon_intent(
        &self,
        owner: &UserId,
        file_id: &FileId,
        stale_before: Option<DateTime<Utc>>,
    ) -> MetaResult<Option<OrphanRecord>> {
        let mut filter = stale_before.map_or_else(Document::new, last_alive_before);
        filter.insert("_id", file_id);
        filter.insert("user_id", owner);
        let mut s = self.txns.begin(None).await?;
        let result = async {
            let Some(intent) = self
                .intents()
                .find_one_and_delete(filter)
                .session(&mut s)
                .await
                .map_err(classify)?
            else {
                return Ok(None);
            };
            let orphan = OrphanRecord::pending(
                &intent.bucket,
                &intent.key,
                Some("upload never committed".into()),
            );
            self.orphans()
                .insert_one(&orphan)
                .session(&mut s)
                .await
                .map_err(classify)?;
            Ok(Some(orphan))
        }
        .await;
        self.txns.finish(s, None, result).await
    }

    async fn orphans_due(
        &self,
        max_retries: i32,
        retry_before: DateTime<Utc>,
        limit: usize,
    ) -> MetaResult<Vec<OrphanRecord>> {
        let filter = doc! {
            "status": "pending",
            "retries": {"$lt": max_retries},
            "$or": [
                {"last_retry_at": null},
                {"last_retry_at": {"$lte": bson::DateTime::from_chrono(retry_before)}},
            ],
        };
        find_sorted(self.orphans(), filter, doc! {"created_at": 1}, limit).await
    }

    async fn counts(&self) -> MetaResult<MetaCounts> {
        let orphans = self.orphans();
        let count = |status: &'static str| orphans.count_documents(doc! {"status": status});
        Ok(MetaCounts {
            intents: self
                .intents()
                .count_documents(doc! {})
                .await
                .map_err(classify)?,
            orphans_pending: count("pending").await.map_err(classify)?,
            orphans_deleted: count("deleted").await.map_err(classify)?,
            orphans_failed: count("failed").await.map_err(classify)?,
        })
    }

    async fn record_orphan(&self, orphan: &OrphanRecord) -> MetaResult<()> {
        self.orphans()
            .insert_one(orphan)
            .await
            .map(|_| ())
            .map_err(classify)
    }

    async fn mark_orphan(
        &self,
        id: &OrphanId,
        status: OrphanStatus,
        error: Option<String>,
    ) -> MetaResult<()> {
        let mut orphan = self
            .orphans()
            .find_one(doc! {"_id": id})
            .await
            .map_err(classify)?
            .ok_or(MetaError::NotFound)?;
        orphan.mark(status, error);
        self.orphans()
            .replace_one(doc! {"_id": id}, &orphan)
            .await
            .map(|_| ())
            .map_err(classify)
    }

    async fn orphans(
        &self,
        status: Option<OrphanStatus>,
        limit: usize,
    ) -> MetaResult<Vec<OrphanRecord>> {
        let filter = match status {
            Some(st) => {
                doc! {"status": bson::to_bson(&st).map_err(|e| MetaError::Other(e.to_string()))?}
            }
            None => doc! {},
        };
        find_sorted(self.orphans(), filter, doc! {"created_at": 1}, limit).await
    }

    async fn pending_orphan(&self, key: &BlobKey) -> MetaResult<bool> {
        let filter = doc! {"key": key.to_string(), "status": "pending"};
        let found = self.orphans().find_one(filter).await.map_err(classify)?;
        Ok(found.is_some())
    }
}
