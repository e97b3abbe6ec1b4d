//! Events on MongoDB: written by the changes' own transactions (`files.rs`),
//! read here in an owner's sequence order (the `(owner_id, seq)` index) and
//! expired oldest first (the `time` index).

use async_trait::async_trait;
use std::collections::HashMap;

use bson::{Bson, Document, doc};
use chrono::{DateTime, Utc};
use futures::TryStreamExt;
use mongodb::{
    ClientSession, Collection,
    options::{CollectionOptions, ReadConcern, ReturnDocument},
};

use super::{MongoStore, batch::Writes, errors::classify, find_sorted, find_sorted_in};
use crate::{
    meta::{
        EventDraft, EventRecord, EventRepo, EventType, FeedPage, MetaError, MetaResult, OwnerPage,
        events,
    },
    vocab::UserId,
};

/// The part of a user document a change's event is numbered by.
#[derive(serde::Deserialize)]
pub(super) struct EventSeq {
    #[serde(default)]
    pub(super) event_seq: i64,
}

impl MongoStore {
    pub(super) fn events(&self) -> Collection<EventRecord> {
        self.db.collection("events")
    }

    /// Inserts `drafts` as `owner`'s events after number `last_before`.
    pub(super) async fn insert_events(
        &self,
        s: &mut ClientSession,
        owner: UserId,
        last_before: i64,
        drafts: Vec<EventDraft>,
    ) -> MetaResult<()> {
        if drafts.is_empty() {
            return Ok(());
        }
        let numbered = events::number(owner, last_before, drafts);
        self.events()
            .insert_many(&numbered)
            .session(&mut *s)
            .await
            .map_err(classify)?;
        Ok(())
    }

    /// Adds `drafts` to `writes` as `owner`'s events after number
    /// `last_before`.
    pub(super) fn add_events(
        &self,
        writes: &mut Writes,
        owner: UserId,
        last_before: i64,
        drafts: Vec<EventDraft>,
    ) -> MetaResult<()> {
        for event in events::number(owner, last_before, drafts) {
            writes.insert(&self.events(), &event)?;
        }
        Ok(())
    }

    /// Numbers `drafts` as `owner`'s next events (one `$inc` of the user
    /// document's `event_seq`: the write that orders them among the
    /// owner's other changes) and inserts them, in `s`; how many.
    /// `NotFound` if the owner is gone.
    pub(super) async fn emit(
        &self,
        s: &mut ClientSession,
        owner: &UserId,
        drafts: Vec<EventDraft>,
    ) -> MetaResult<usize> {
        let n = drafts.len();
        if n == 0 {
            return Ok(0);
        }
        let numbered = self
            .db
            .collection::<EventSeq>("users")
            .find_one_and_update(doc! {"_id": owner}, doc! {"$inc": {"event_seq": n as i64}})
            .projection(doc! {"event_seq": 1})
            .return_document(ReturnDocument::After)
            .session(&mut *s)
            .await
            .map_err(classify)?;
        let Some(numbered) = numbered else {
            return Err(MetaError::NotFound);
        };
        self.insert_events(s, *owner, numbered.event_seq - n as i64, drafts)
            .await?;
        Ok(n)
    }

    /// `name` read with majority read concern: only what a majority holds,
    /// so that an event a failover could roll back (and its number then
    /// given to another change) is never shown.
    pub(super) fn majority<T: Send + Sync>(&self, name: &str) -> Collection<T> {
        let majority = CollectionOptions::builder()
            .read_concern(ReadConcern::majority())
            .build();
        self.db.collection_with_options(name, majority)
    }

    /// Deletes up to `limit` of `owner`'s first events (a user's deletion),
    /// all but their `user.deleted`, once placed in the feed (the sequencer
    /// places the others soon: the next pass takes them); how many.
    pub(super) async fn purge_events(&self, owner: &UserId, limit: usize) -> MetaResult<usize> {
        let first = find_sorted(
            self.events(),
            placed(purged_of(owner)),
            doc! {"seq": 1},
            limit,
        )
        .await?;
        let Some(last) = first.last() else {
            return Ok(0);
        };
        let mut upto = placed(purged_of(owner));
        upto.insert("seq", doc! {"$lte": last.seq});
        let gone = self.events().delete_many(upto).await.map_err(classify)?;
        Ok(gone.deleted_count as usize)
    }
}

/// `owner`'s events numbered above `after`, a page of `limit`. An owner's
/// numbers have no gap above what the retention removed: past a cursor,
/// the page is the range (after, after + limit], and asked as that
/// (SecantusDB reads a whole range before it limits: a page would cost all
/// the owner's events after it). From 0, the first kept is not known: that
/// read costs what the owner keeps.
fn owner_range(owner: &UserId, after: i64, limit: usize) -> Document {
    let seq = match after {
        0 => doc! {"$gt": 0},
        _ => doc! {"$gt": after, "$lte": after.saturating_add(limit as i64)},
    };
    doc! {"owner_id": owner, "seq": seq}
}

/// The events a user's deletion removes: all of `owner`'s but the one that
/// tells it.
pub(super) fn purged_of(owner: &UserId) -> Document {
    doc! {"owner_id": owner, "type": {"$ne": EventType::UserDeleted.as_str()}}
}

/// Only events placed in the feed are removed (by a user's deletion or the
/// retention): what the sequencer writes and what they delete never meet,
/// so neither starves the other (SecantusDB retries a `deleteMany` that
/// meets a transaction's write from scratch), and the feed misses none.
fn placed(mut filter: Document) -> Document {
    filter.insert("feed", doc! {"$ne": null});
    filter
}

#[async_trait]
impl EventRepo for MongoStore {
    async fn events(
        &self,
        owner: &UserId,
        after: i64,
        limit: usize,
    ) -> MetaResult<Vec<EventRecord>> {
        let filter = owner_range(owner, after, limit);
        find_sorted(self.majority("events"), filter, doc! {"seq": 1}, limit).await
    }

    async fn owner_page(&self, owner: &UserId, after: i64, limit: usize) -> MetaResult<OwnerPage> {
        let mut s = self.snapshot().await?;
        let user = self
            .in_snapshot::<EventSeq>("users")
            .find_one(doc! {"_id": owner})
            .projection(doc! {"event_seq": 1})
            .session(&mut s)
            .await
            .map_err(classify)?;
        let filter = owner_range(owner, after, limit);
        let events = self.in_snapshot("events");
        let events = find_sorted_in(&mut s, events, filter, doc! {"seq": 1}, limit).await?;
        let last = user.map_or(0, |u| u.event_seq);
        Ok(OwnerPage { last, events })
    }

    async fn expire_events(&self, before: DateTime<Utc>, limit: usize) -> MetaResult<usize> {
        let old: Vec<Document> = self
            .db
            .collection::<Document>("events")
            .find(placed(
                doc! {"time": {"$lt": bson::DateTime::from_chrono(before)}},
            ))
            .sort(doc! {"time": 1})
            .projection(doc! {"owner_id": 1, "seq": 1, "feed": 1})
            .limit(i64::try_from(limit).unwrap_or(i64::MAX))
            .await
            .map_err(classify)?
            .try_collect()
            .await
            .map_err(classify)?;
        // Each owner's events up to the highest number among them go: a
        // prefix, so that no owner's events lose one in the middle
        // whatever the instances' clocks said of their times.
        let mut upto: HashMap<String, (Bson, i64)> = HashMap::new();
        // The highest place in the feed that goes: that of the highest
        // number of an owner among them (an owner's are placed in order).
        let mut floor = 0;
        for d in old {
            let (Some(owner), Ok(seq)) = (d.get("owner_id"), d.get_i64("seq")) else {
                continue;
            };
            floor = floor.max(d.get_i64("feed").unwrap_or(0));
            let entry = upto
                .entry(owner.to_string())
                .or_insert_with(|| (owner.clone(), seq));
            entry.1 = entry.1.max(seq);
        }
        // The feed is marked first: a reader from below what goes is told.
        if floor > 0 {
            self.raise_feed_floor(floor).await?;
        }
        let mut gone = 0;
        for (owner, seq) in upto.into_values() {
            let deleted = self
                .events()
                .delete_many(placed(doc! {"owner_id": owner, "seq": {"$lte": seq}}))
                .await
                .map_err(classify)?;
            gone += deleted.deleted_count as usize;
        }
        // Their copies in dead letters go with them.
        Ok(gone + self.expire_dead_letters(before, limit).await?)
    }

    async fn oldest_event(&self) -> MetaResult<Option<DateTime<Utc>>> {
        let oldest = find_sorted(self.events(), doc! {}, doc! {"time": 1}, 1).await?;
        Ok(oldest.first().map(|e| e.time))
    }

    async fn sequence_events(&self, limit: usize) -> MetaResult<usize> {
        self.sequence_events_in_txn(limit).await
    }

    async fn feed(&self, after: i64, width: i64, limit: usize) -> MetaResult<FeedPage> {
        self.feed_page(after, width, limit).await
    }
}
