//! Resumable uploads on MongoDB.

use async_trait::async_trait;
use bson::doc;
use chrono::{DateTime, Utc};

use super::{MongoStore, errors::classify, find_sorted};
use crate::{
    meta::{MetaResult, ResumableRecord, ResumableRepo},
    vocab::FileId,
};

#[async_trait]
impl ResumableRepo for MongoStore {
    async fn insert_resumable(&self, upload: &ResumableRecord) -> MetaResult<()> {
        self.resumables()
            .insert_one(upload)
            .await
            .map(|_| ())
            .map_err(classify)
    }

    async fn resumable(&self, id: &FileId) -> MetaResult<Option<ResumableRecord>> {
        self.resumables()
            .find_one(doc! {"_id": id})
            .await
            .map_err(classify)
    }

    async fn advance_resumable(
        &self,
        upload: &ResumableRecord,
        expected_offset: i64,
    ) -> MetaResult<bool> {
        // One conditional write: of two PATCHes from the same offset, one matches.
        let replaced = self
            .resumables()
            .replace_one(doc! {"_id": &upload.id, "offset": expected_offset}, upload)
            .await
            .map_err(classify)?;
        Ok(replaced.matched_count > 0)
    }

    async fn delete_resumable(&self, id: &FileId) -> MetaResult<()> {
        self.resumables()
            .delete_one(doc! {"_id": id})
            .await
            .map(|_| ())
            .map_err(classify)
    }

    async fn delete_resumable_if_expires(
        &self,
        id: &FileId,
        expires_at: DateTime<Utc>,
    ) -> MetaResult<bool> {
        let expires_at = bson::DateTime::from_chrono(expires_at);
        let deleted = self
            .resumables()
            .delete_one(doc! {"_id": id, "expires_at": expires_at})
            .await
            .map_err(classify)?;
        Ok(deleted.deleted_count > 0)
    }

    async fn expired_resumables(
        &self,
        before: DateTime<Utc>,
        limit: usize,
    ) -> MetaResult<Vec<ResumableRecord>> {
        let before = bson::DateTime::from_chrono(before);
        find_sorted(
            self.resumables(),
            doc! {"expires_at": {"$lt": before}},
            doc! {"expires_at": 1},
            limit,
        )
        .await
    }
}
