//! Webhooks' delivery state on MongoDB: `webhook_marks {_id:
//! "{endpoint}:{partition}", position, owners, fence}` and `webhook_dead`
//! (the letters, by id; a user's deletion and the events' retention find
//! theirs by `event.owner_id` and `event.time`, indexed).
//! Every read and write finds its documents by `_id`, and every filter is
//! plain fields (an `_id` beside a field's own condition): SecantusDB looks
//! such a document up by its `_id`, but scans for a top-level operator.

use async_trait::async_trait;
use bson::{Document, doc};
use chrono::{DateTime, Utc};
use futures::TryStreamExt;
use mongodb::Collection;

use super::{MongoStore, errors::classify, find_sorted};
use crate::{
    meta::{DeadLetter, EventType, MetaError, MetaResult, WebhookMark, WebhookRepo},
    vocab::UserId,
};

const MARKS: &str = "webhook_marks";
const DEAD: &str = "webhook_dead";

fn mark_id(endpoint: &str, partition: u32) -> String {
    format!("{endpoint}:{partition}")
}

impl MongoStore {
    fn marks(&self) -> Collection<Document> {
        self.db.collection(MARKS)
    }

    pub(super) fn dead(&self) -> Collection<DeadLetter> {
        self.db.collection(DEAD)
    }

    /// Removes up to `limit` of `owner`'s dead letters (their deletion),
    /// but that of `user.deleted` (see [`DeadLetter::outlives_its_owner`]);
    /// how many.
    pub(super) async fn purge_dead_letters(
        &self,
        owner: &UserId,
        limit: usize,
    ) -> MetaResult<usize> {
        let kept = EventType::UserDeleted.as_str();
        let filter = doc! {"event.owner_id": owner, "event.type": {"$ne": kept}};
        self.remove_dead_where(filter, limit).await
    }

    /// Removes up to `limit` dead letters whose event was written before
    /// `before` (the events' retention); how many.
    pub(super) async fn expire_dead_letters(
        &self,
        before: DateTime<Utc>,
        limit: usize,
    ) -> MetaResult<usize> {
        let filter = doc! {"event.time": {"$lt": bson::DateTime::from_chrono(before)}};
        self.remove_dead_where(filter, limit).await
    }

    /// Up to `limit` of the letters `filter` finds (by an index: a few
    /// ids), then those ids removed.
    async fn remove_dead_where(&self, filter: Document, limit: usize) -> MetaResult<usize> {
        let ids: Vec<Document> = self
            .db
            .collection::<Document>(DEAD)
            .find(filter.clone())
            .projection(doc! {"_id": 1})
            .limit(i64::try_from(limit).unwrap_or(i64::MAX))
            .await
            .map_err(classify)?
            .try_collect()
            .await
            .map_err(classify)?;
        let ids: Vec<_> = ids.iter().filter_map(|d| d.get("_id").cloned()).collect();
        if ids.is_empty() {
            return Ok(0);
        }
        // Those ids, still as the filter found them.
        let mut found = filter;
        found.insert("_id", doc! {"$in": ids});
        let gone = self.dead().delete_many(found).await.map_err(classify)?;
        Ok(gone.deleted_count as usize)
    }
}

#[async_trait]
impl WebhookRepo for MongoStore {
    async fn webhook_mark(&self, endpoint: &str, partition: u32) -> MetaResult<WebhookMark> {
        let mark = self
            .majority::<WebhookMark>(MARKS)
            .find_one(doc! {"_id": mark_id(endpoint, partition)})
            .projection(doc! {"position": 1, "owners": 1})
            .await
            .map_err(classify)?;
        Ok(mark.unwrap_or_default())
    }

    async fn raise_webhook_mark(
        &self,
        endpoint: &str,
        partition: u32,
        fence: u64,
        mark: &WebhookMark,
    ) -> MetaResult<bool> {
        let fence = i64::try_from(fence)
            .map_err(|_| MetaError::Other(format!("fencing token {fence} past BSON's i64")))?;
        let owners =
            bson::to_document(&mark.owners).map_err(|e| MetaError::Other(e.to_string()))?;
        // Ours or a smaller token stored, or none: a field's own condition,
        // so that the document is still found by its `_id`.
        let filter = doc! {"_id": mark_id(endpoint, partition), "fence": {"$not": {"$gt": fence}}};
        let update = doc! {
            "$set": {"fence": fence, "owners": owners},
            "$max": {"position": mark.position},
        };
        let marks = self.marks();
        let raised = marks
            .update_one(filter.clone(), update.clone())
            .upsert(true)
            .await
            .map_err(classify);
        match raised {
            Ok(r) => Ok(r.matched_count > 0 || r.upserted_id.is_some()),
            // The upsert met the document with a greater token (this
            // holder's lease is gone), or another holder's first write raced
            // ours in: the document is there now, and the filter says which.
            Err(MetaError::Duplicate) => {
                let again = marks.update_one(filter, update).await.map_err(classify)?;
                Ok(again.matched_count > 0)
            }
            Err(e) => Err(e),
        }
    }

    /// In one transaction with a write of its owner's record while their
    /// deletion has not begun: the deletion's mark (a write of that record)
    /// and the letter are ordered, so a letter kept is one the purge after
    /// the mark finds, and a crash keeps nothing.
    async fn put_dead_letter(&self, letter: &DeadLetter) -> MetaResult<bool> {
        let mut s = self.txns.begin(None).await?;
        let result = async {
            if !letter.outlives_its_owner() {
                let owner = doc! {"_id": &letter.event.owner_id, "deleting_since": null};
                let at = bson::DateTime::from_chrono(letter.dead_at);
                let touched = self
                    .users()
                    .update_one(owner, doc! {"$set": {"last_dead_letter_at": at}})
                    .session(&mut s)
                    .await
                    .map_err(classify)?;
                if touched.matched_count == 0 {
                    return Ok(false);
                }
            }
            self.dead()
                .replace_one(doc! {"_id": &letter.id}, letter)
                .upsert(true)
                .session(&mut s)
                .await
                .map_err(classify)?;
            Ok(true)
        }
        .await;
        self.txns.finish(s, None, result).await
    }

    async fn dead_letters(&self, after: Option<&str>, limit: usize) -> MetaResult<Vec<DeadLetter>> {
        let filter = match after {
            Some(after) => doc! {"_id": {"$gt": after}},
            None => doc! {},
        };
        find_sorted(self.majority(DEAD), filter, doc! {"_id": 1}, limit).await
    }

    async fn dead_letter(&self, id: &str) -> MetaResult<Option<DeadLetter>> {
        self.majority::<DeadLetter>(DEAD)
            .find_one(doc! {"_id": id})
            .await
            .map_err(classify)
    }

    async fn remove_dead_letter(&self, id: &str) -> MetaResult<bool> {
        let gone = self
            .dead()
            .delete_one(doc! {"_id": id})
            .await
            .map_err(classify)?;
        Ok(gone.deleted_count > 0)
    }

    async fn count_dead_letters(&self) -> MetaResult<u64> {
        // From the collection's metadata: a figure for a gauge, not a scan.
        self.dead()
            .estimated_document_count()
            .await
            .map_err(classify)
    }
}
