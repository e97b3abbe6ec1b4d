//! The feed of every owner's events on MongoDB (see
//! [`EventRepo::sequence_events`]): an event's `feed` field, given as a
//! sequencing transaction moves it from the outbox into `events`, and the
//! `event_feed` document's counter (`last`) and retention mark (`floor`).

use std::collections::BTreeSet;

use bson::{Bson, Document, doc};
use mongodb::{ClientSession, Collection, options::ReturnDocument};

use super::{MongoStore, errors::classify, events::EVENTS, find_sorted_in};
use crate::meta::{EventRecord, FEED_STATE, FeedBounds, FeedPage, MetaError, MetaResult};

/// The events in `events` not placed yet: only the version before the
/// outbox (or `FILEDOCK_EVENT_OUTBOX=false`) writes them there.
fn unplaced() -> Document {
    doc! {"feed": null}
}

/// The events of the outbox (`moved`) and the unplaced ones of `events`,
/// each read whole up to `limit` and sorted by owner and number: merged in
/// that order (each flagged whether it is the outbox's), the first `limit`.
/// A read that came back full may have left out its events past its last,
/// but those sort after all `limit` it returned: none is passed over by
/// an owner's later event. (Owners sort as MongoDB sorts their ids: a
/// UUID's hyphenated lower-case hex sorts as its bytes.)
fn merged(
    moved: Vec<EventRecord>,
    unplaced: Vec<EventRecord>,
    limit: usize,
) -> Vec<(bool, EventRecord)> {
    let mut all: Vec<(bool, EventRecord)> = (moved.into_iter().map(|e| (true, e)))
        .chain(unplaced.into_iter().map(|e| (false, e)))
        .collect();
    all.sort_by_key(|(_, e)| (e.owner_id, e.seq));
    all.truncate(limit);
    all
}

impl MongoStore {
    fn feed_state(&self) -> Collection<FeedBounds> {
        self.db.collection(FEED_STATE)
    }

    /// See [`EventRepo::sequence_events`](crate::meta::EventRepo::sequence_events).
    /// The events waiting are in the outbox: they are inserted into
    /// `events` with their places and deleted from the outbox, one command
    /// each for the whole batch (SecantusDB spends about a millisecond per
    /// statement that updates a document, a fraction of that per document
    /// inserted or deleted: BENCHMARKS 12). Events that the version before
    /// the outbox wrote into `events` unplaced (an instance not upgraded
    /// yet, or one that died before placing) are placed where they are,
    /// an update each, merged into the batch by owner and number.
    pub(super) async fn sequence_events_in_txn(&self, limit: usize) -> MetaResult<usize> {
        // Nothing to place (most wakes of an idle instance): a read or
        // two, no transaction.
        if self.nothing_waiting().await? {
            return Ok(0);
        }
        let mut s = self.txns.begin(None).await?;
        let result = async {
            let by_owner = doc! {"owner_id": 1, "seq": 1};
            let moved = find_sorted_in(&mut s, self.outbox(), doc! {}, by_owner, limit).await?;
            let sort = doc! {"feed": 1, "owner_id": 1, "seq": 1};
            let unplaced = find_sorted_in(&mut s, self.events(), unplaced(), sort, limit).await?;
            let all = merged(moved, unplaced, limit);
            let n = all.len();
            if n == 0 {
                return Ok(0);
            }
            let state = self
                .feed_state()
                .find_one_and_update(doc! {"_id": FEED_STATE}, doc! {"$inc": {"last": n as i64}})
                .upsert(true)
                .return_document(ReturnDocument::After)
                .session(&mut s)
                .await
                .map_err(classify)?
                .unwrap_or_default();
            let (mut placed, mut ids, mut owners) = (Vec::new(), Vec::new(), BTreeSet::new());
            for ((from_outbox, mut event), position) in
                all.into_iter().zip(state.last - n as i64 + 1..)
            {
                if from_outbox {
                    ids.push(event.id.clone());
                    owners.insert(event.owner_id);
                    event.feed = Some(position);
                    placed.push(event);
                    continue;
                }
                // By its owner too: on a sharded cluster, the one shard
                // that holds the owner's events.
                self.events()
                    .update_one(
                        doc! {"_id": &event.id, "owner_id": event.owner_id, "feed": null},
                        doc! {"$set": {"feed": position}},
                    )
                    .session(&mut s)
                    .await
                    .map_err(classify)?;
            }
            if !placed.is_empty() {
                self.events()
                    .insert_many(&placed)
                    .session(&mut s)
                    .await
                    .map_err(classify)?;
                // By their owners too: the shards that hold them.
                let owners: Vec<Bson> = owners.into_iter().map(Bson::from).collect();
                let gone = self
                    .outbox()
                    .delete_many(doc! {"owner_id": {"$in": owners}, "_id": {"$in": ids}})
                    .session(&mut s)
                    .await
                    .map_err(classify)?;
                // Each was read in this transaction: another that removed
                // one would have conflicted with it.
                if gone.deleted_count != placed.len() as u64 {
                    return Err(MetaError::WriteConflict);
                }
            }
            Ok(n)
        }
        .await;
        self.txns.finish(s, None, result).await
    }

    /// Whether neither the outbox nor `events` holds an event to place.
    async fn nothing_waiting(&self) -> MetaResult<bool> {
        let id = doc! {"_id": 1};
        let outbox = self.outbox().clone_with_type::<Document>();
        let waiting = outbox.find_one(doc! {}).projection(id.clone());
        if waiting.await.map_err(classify)?.is_some() {
            return Ok(false);
        }
        let events = self.events().clone_with_type::<Document>();
        let waiting = events.find_one(unplaced()).projection(id);
        Ok(waiting.await.map_err(classify)?.is_none())
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
        let events = self.in_snapshot(EVENTS);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocab::UserId;

    fn event(owner: UserId, seq: i64) -> EventRecord {
        EventRecord {
            id: EventRecord::id_for(&owner, seq),
            owner_id: owner,
            seq,
            kind: "file.created".into(),
            subject: String::new(),
            time: chrono::Utc::now(),
            data: Default::default(),
            feed: None,
        }
    }

    /// What [`merged`] keeps: (from the outbox, owner, number).
    fn keys(all: &[(bool, EventRecord)], a: UserId) -> Vec<(bool, char, i64)> {
        let name = |o: UserId| if o == a { 'a' } else { 'b' };
        all.iter()
            .map(|(m, e)| (*m, name(e.owner_id), e.seq))
            .collect()
    }

    #[test]
    fn a_merge_keeps_each_owner_s_order_across_both_reads() {
        let (a, b) = (UserId::new(), UserId::new());
        assert!(a < b, "ids rise with time");
        // Neither read full: all of both, by owner and number.
        let all = merged(
            vec![event(a, 2), event(b, 3)],
            vec![event(a, 1), event(b, 2)],
            10,
        );
        let want = [
            (false, 'a', 1),
            (true, 'a', 2),
            (false, 'b', 2),
            (true, 'b', 3),
        ];
        assert_eq!(keys(&all, a), want);
        // The unplaced read came back full at b's 8: b's 10 from the
        // outbox waits for the next placing (b's 9 was not read).
        let all = merged(
            vec![event(b, 10)],
            vec![event(a, 1), event(a, 2), event(b, 8)],
            3,
        );
        assert_eq!(
            keys(&all, a),
            [(false, 'a', 1), (false, 'a', 2), (false, 'b', 8)]
        );
        // The outbox's read came back full: no unplaced event past its last.
        let all = merged(
            vec![event(a, 3), event(a, 4)],
            vec![event(a, 1), event(a, 5)],
            2,
        );
        assert_eq!(keys(&all, a), [(false, 'a', 1), (true, 'a', 3)]);
    }
}
