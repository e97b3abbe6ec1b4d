//! The feed of every owner's events on MongoDB (see
//! [`EventRepo::sequence_events`]): an event's `feed` field, unset until a
//! sequencing transaction sets it, and the `event_feed` document's counter
//! (`last`) and retention mark (`floor`).

use bson::{Document, doc};
use mongodb::{ClientSession, Collection, options::ReturnDocument};

use super::{MongoStore, batch::Writes, errors::classify, find_sorted_in};
use crate::meta::{FEED_STATE, FeedBounds, FeedPage, MetaResult};

impl MongoStore {
    fn feed_state(&self) -> Collection<FeedBounds> {
        self.db.collection(FEED_STATE)
    }

    /// See [`EventRepo::sequence_events`](crate::meta::EventRepo::sequence_events).
    pub(super) async fn sequence_events_in_txn(&self, limit: usize) -> MetaResult<usize> {
        // Nothing to place (most wakes of an idle instance): one read, no
        // transaction.
        let waiting = self
            .db
            .collection::<Document>("events")
            .find_one(doc! {"feed": null})
            .projection(doc! {"_id": 1})
            .await
            .map_err(classify)?;
        if waiting.is_none() {
            return Ok(0);
        }
        let mut s = self.txns.begin(None).await?;
        let result = async {
            let mut found = self
                .db
                .collection::<Document>("events")
                .find(doc! {"feed": null})
                .sort(doc! {"feed": 1, "owner_id": 1, "seq": 1})
                .projection(doc! {"_id": 1, "owner_id": 1})
                .limit(i64::try_from(limit).unwrap_or(i64::MAX))
                .session(&mut s)
                .await
                .map_err(classify)?;
            let mut pending = Vec::new();
            while let Some(event) = found.next(&mut s).await {
                pending.push(event.map_err(classify)?);
            }
            let n = pending.len() as i64;
            if n == 0 {
                return Ok(0);
            }
            let state = self
                .feed_state()
                .find_one_and_update(doc! {"_id": FEED_STATE}, doc! {"$inc": {"last": n}})
                .upsert(true)
                .return_document(ReturnDocument::After)
                .session(&mut s)
                .await
                .map_err(classify)?
                .unwrap_or_default();
            // One update each, in one `bulkWrite` where the server takes
            // it (`batch.rs`): no cheaper for SecantusDB (BENCHMARKS 12),
            // one round trip for filedock (BENCHMARKS 13, ninth cut).
            // Each by its owner too: on a sharded cluster, the one shard
            // that holds the owner's events.
            let mut writes = Writes::default();
            for (event, position) in pending.iter().zip(state.last - n + 1..) {
                let id = event.get("_id").cloned().unwrap_or_default();
                let owner = event.get("owner_id").cloned().unwrap_or_default();
                writes.update_one(
                    &self.events(),
                    doc! {"_id": id, "owner_id": owner, "feed": null},
                    doc! {"$set": {"feed": position}},
                );
            }
            self.send(&mut s, writes).await?;
            Ok(pending.len())
        }
        .await;
        self.txns.finish(s, None, result).await
    }

    /// See [`EventRepo::feed`](crate::meta::EventRepo::feed). Every read
    /// in one snapshot: read one after the other, the bounds could show a
    /// sequencing transaction that the events' read (another shard, on a
    /// sharded cluster) does not show yet, and the reader would pass an
    /// event it never saw. (SecantusDB accepts the snapshot but does not
    /// hold its reads to one: the floor read last covers the retention
    /// there; a single node has no shards to disagree.)
    pub(super) async fn feed_page(
        &self,
        after: i64,
        width: i64,
        limit: usize,
    ) -> MetaResult<FeedPage> {
        let mut s = self.snapshot().await?;
        let mut bounds = self.bounds_in(&mut s).await?;
        let events = self.in_snapshot("events");
        let (mut from, mut width) = (after, width.max(1));
        let (upto, page) = loop {
            let upto = FeedPage::upto(bounds, from, width);
            let page = match upto > from {
                true => {
                    let filter = doc! {"feed": {"$gt": from, "$lte": upto}};
                    find_sorted_in(&mut s, events.clone(), filter, doc! {"feed": 1}, limit).await?
                }
                false => Vec::new(),
            };
            if !page.is_empty() || upto >= bounds.last {
                break (upto, page);
            }
            (from, width) = (upto, width.saturating_mul(2));
        };
        let again = self.bounds_in(&mut s).await?;
        bounds.floor = bounds.floor.max(again.floor);
        Ok(FeedPage {
            bounds,
            upto,
            events: page,
        })
    }

    /// The feed's bounds, read in session `s` (a snapshot's).
    async fn bounds_in(&self, s: &mut ClientSession) -> MetaResult<FeedBounds> {
        let state = self
            .in_snapshot::<FeedBounds>(FEED_STATE)
            .find_one(doc! {"_id": FEED_STATE})
            .projection(doc! {"last": 1, "floor": 1})
            .session(s)
            .await
            .map_err(classify)?;
        Ok(state.unwrap_or_default())
    }

    /// Marks the feed up to `position` as removed by the retention (before
    /// it removes them: a reader never misses one without being told). In a
    /// transaction: a plain write that meets a sequencing transaction's
    /// would wait for it on SecantusDB (for up to its lifetime, were its
    /// instance killed); this one fails, and the next pass tries again.
    pub(super) async fn raise_feed_floor(&self, position: i64) -> MetaResult<()> {
        let mut s = self.txns.begin(None).await?;
        let result = self
            .feed_state()
            .update_one(doc! {"_id": FEED_STATE}, doc! {"$max": {"floor": position}})
            .upsert(true)
            .session(&mut s)
            .await
            .map(|_| ())
            .map_err(classify);
        self.txns.finish(s, None, result).await
    }
}
