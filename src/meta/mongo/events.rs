//! Events on MongoDB: written by the changes' own transactions (`files.rs`),
//! read here in an owner's sequence order (the `(owner_id, seq)` index).

use async_trait::async_trait;
use bson::doc;
use mongodb::{
    Collection,
    options::{CollectionOptions, ReadConcern},
};

use super::{MongoStore, errors::classify, find_sorted};
use crate::{
    meta::{EventRecord, EventRepo, MetaResult},
    vocab::UserId,
};

impl MongoStore {
    pub(super) fn events(&self) -> Collection<EventRecord> {
        self.db.collection("events")
    }

    /// Deletes up to `limit` of `owner`'s first events (a user's deletion);
    /// how many.
    pub(super) async fn purge_events(&self, owner: &UserId, limit: usize) -> MetaResult<usize> {
        let first = find_sorted(
            self.events(),
            doc! {"owner_id": owner},
            doc! {"seq": 1},
            limit,
        )
        .await?;
        let Some(last) = first.last() else {
            return Ok(0);
        };
        let gone = self
            .events()
            .delete_many(doc! {"owner_id": owner, "seq": {"$lte": last.seq}})
            .await
            .map_err(classify)?;
        Ok(gone.deleted_count as usize)
    }
}

#[async_trait]
impl EventRepo for MongoStore {
    async fn events(
        &self,
        owner: &UserId,
        after: i64,
        limit: usize,
    ) -> MetaResult<Vec<EventRecord>> {
        let filter = doc! {"owner_id": owner, "seq": {"$gt": after}};
        // Only what a majority holds: an event a failover could roll back
        // (and its number then given to another change) is never shown.
        let majority = CollectionOptions::builder()
            .read_concern(ReadConcern::majority())
            .build();
        let events = self.db.collection_with_options("events", majority);
        find_sorted(events, filter, doc! {"seq": 1}, limit).await
    }
}
