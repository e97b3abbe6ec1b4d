//! The feed of every owner's events on MongoDB (see
//! [`EventRepo::sequence_events`]). A change's transaction writes, beside
//! each event, a small `feed_pending` document (the event's id, owner and
//! number). The sequencer's transaction takes a batch of them in
//! (owner_id, seq) order, `$inc`s the `event_feed` document's counter
//! (`last`) by their number, inserts a `feed` document for each place
//! (`{_id: place, event}`) and deletes them. Nothing rewrites an event: on
//! SecantusDB an update of one costs about what four inserts of these
//! small documents do (BENCHMARKS 12). `floor` is the retention's mark.

use std::collections::HashMap;

use bson::{Document, doc};
use chrono::{DateTime, Utc};
use futures::TryStreamExt;
use mongodb::{ClientSession, Collection, options::ReturnDocument};
use serde::{Deserialize, Serialize};

use super::{MongoStore, errors::classify, find_sorted};
use crate::{
    meta::{EventRecord, FEED_STATE, FeedBounds, MetaError, MetaResult},
    vocab::UserId,
};

/// An event not placed in the feed yet.
#[derive(Serialize, Deserialize)]
pub(super) struct Pending {
    #[serde(rename = "_id")]
    pub(super) event: String,
    owner_id: UserId,
    seq: i64,
}

impl Pending {
    pub(super) fn of(event: String, owner_id: UserId, seq: i64) -> Self {
        Self {
            event,
            owner_id,
            seq,
        }
    }
}

/// A place in the feed and the event at it.
#[derive(Serialize, Deserialize)]
pub(super) struct Place {
    #[serde(rename = "_id")]
    pub(super) place: i64,
    pub(super) event: String,
}

/// The `event_feed` document: [`FeedBounds`], and how far the retention
/// walked the feed (places up to `swept` are gone; past `floor` only
/// places whose events a user's deletion removed).
#[derive(Default, Deserialize)]
struct FeedState {
    #[serde(default)]
    last: i64,
    #[serde(default)]
    floor: i64,
    #[serde(default)]
    swept: i64,
}

/// The `event_feed` document's `layout` once the feed is kept in `feed`
/// and `feed_pending` (set by the migration; before it, nothing places).
pub(super) const LAYOUT: i32 = 2;

impl MongoStore {
    fn feed_state(&self) -> Collection<FeedBounds> {
        self.db.collection(FEED_STATE)
    }

    pub(super) fn pending(&self) -> Collection<Pending> {
        self.db.collection("feed_pending")
    }

    pub(super) fn places(&self) -> Collection<Place> {
        self.db.collection("feed")
    }

    /// Marks `events`, inserted in `s`, as waiting for their place.
    pub(super) async fn pend(
        &self,
        s: &mut ClientSession,
        events: &[EventRecord],
    ) -> MetaResult<()> {
        let pending: Vec<Pending> = (events.iter())
            .map(|e| Pending::of(e.id.clone(), e.owner_id, e.seq))
            .collect();
        self.pending()
            .insert_many(&pending)
            .session(&mut *s)
            .await
            .map_err(classify)?;
        Ok(())
    }

    /// See [`EventRepo::sequence_events`](crate::meta::EventRepo::sequence_events).
    pub(super) async fn sequence_events_in_txn(&self, limit: usize) -> MetaResult<usize> {
        // Nothing to place (most wakes of an idle instance): one read, no
        // transaction.
        let waiting = (self.db.collection::<Document>("feed_pending"))
            .find_one(doc! {})
            .projection(doc! {"_id": 1})
            .await
            .map_err(classify)?;
        if waiting.is_none() {
            return Ok(0);
        }
        let mut s = self.txns.begin(None).await?;
        let result = async {
            let found: Vec<Pending> = (self.pending().find(doc! {}))
                .sort(doc! {"owner_id": 1, "seq": 1})
                .limit(i64::try_from(limit).unwrap_or(i64::MAX))
                .session(&mut s)
                .await
                .map_err(classify)?
                .stream(&mut s)
                .try_collect()
                .await
                .map_err(classify)?;
            let n = found.len() as i64;
            if n == 0 {
                return Ok(0);
            }
            // Only once the feed's layout is this one (the migration set
            // it): before, what is waiting is not all known yet.
            let state = self
                .feed_state()
                .find_one_and_update(
                    doc! {"_id": FEED_STATE, "layout": LAYOUT},
                    doc! {"$inc": {"last": n}},
                )
                .return_document(ReturnDocument::After)
                .session(&mut s)
                .await
                .map_err(classify)?;
            let Some(state) = state else {
                return Ok(0);
            };
            let places: Vec<Place> = (found.iter().zip(state.last - n + 1..))
                .map(|(p, place)| Place {
                    place,
                    event: p.event.clone(),
                })
                .collect();
            self.places()
                .insert_many(&places)
                .session(&mut s)
                .await
                .map_err(classify)?;
            let ids: Vec<&str> = found.iter().map(|p| p.event.as_str()).collect();
            let gone = (self.pending().delete_many(doc! {"_id": {"$in": ids}}))
                .session(&mut s)
                .await
                .map_err(classify)?;
            // In the transaction no other could have taken one (it would
            // have conflicted): a short count is a bug.
            if gone.deleted_count != n as u64 {
                return Err(MetaError::Other(format!(
                    "placing {n} events in the feed found {} waiting",
                    gone.deleted_count
                )));
            }
            Ok(found.len())
        }
        .await;
        self.txns.finish(s, None, result).await
    }

    /// The places after `after` up to `upto`, at most `limit`, in order.
    async fn places_between(&self, after: i64, upto: i64, limit: usize) -> MetaResult<Vec<Place>> {
        let filter = doc! {"_id": {"$gt": after, "$lte": upto}};
        find_sorted(self.majority("feed"), filter, doc! {"_id": 1}, limit).await
    }

    /// The events at the places after `after` up to `upto` (at most
    /// `limit`), in feed order; a place whose event is gone (a deleted
    /// user's) is skipped.
    pub(super) async fn feed_between(
        &self,
        after: i64,
        upto: i64,
        limit: usize,
    ) -> MetaResult<Vec<EventRecord>> {
        let places = self.places_between(after, upto, limit).await?;
        if places.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<&str> = places.iter().map(|p| p.event.as_str()).collect();
        let mut events: HashMap<String, EventRecord> = (self.majority::<EventRecord>("events"))
            .find(doc! {"_id": {"$in": ids}})
            .await
            .map_err(classify)?
            .map_ok(|e| (e.id.clone(), e))
            .try_collect()
            .await
            .map_err(classify)?;
        Ok((places.into_iter())
            .filter_map(|p| {
                let mut event = events.remove(&p.event)?;
                event.feed = Some(p.place);
                Some(event)
            })
            .collect())
    }

    /// Removes, from the feed's start, the events older than `before`,
    /// up to `limit` places and to the first younger event; how many. In
    /// feed order, which keeps each owner's: an owner's events go as a
    /// prefix, whatever the instances' clocks said of their times (an
    /// older one behind a younger one waits for it). Only placed events
    /// go: a feed reader never misses one for its being slow to be placed.
    /// The places walked go too; a place whose event is gone (a deleted
    /// user's whose purge stopped halfway) raises no floor.
    pub(super) async fn expire_placed(
        &self,
        before: DateTime<Utc>,
        limit: usize,
    ) -> MetaResult<usize> {
        let state = self.read_feed_state().await?;
        let from = state.floor.max(state.swept);
        let upto = state.last.min(from.saturating_add(limit as i64));
        let places = self.places_between(from, upto, limit).await?;
        let times = self.times_of(&places).await?;
        let before = bson::DateTime::from_chrono(before);
        // The window's places up to the first young event; none: all of it.
        let (mut swept, mut floor, mut old) = (upto, state.floor, Vec::new());
        for p in &places {
            match times.get(&p.event) {
                Some(time) if *time >= before => {
                    swept = p.place - 1;
                    break;
                }
                Some(_) => {
                    old.push(p.event.as_str());
                    floor = p.place;
                }
                None => {}
            }
        }
        if swept <= from {
            return Ok(0);
        }
        // The feed is marked first: a reader from below what goes is told.
        self.raise_feed_marks(floor, swept).await?;
        let gone = (self.events().delete_many(doc! {"_id": {"$in": old}}))
            .await
            .map_err(classify)?;
        (self.places().delete_many(doc! {"_id": {"$lte": swept}}))
            .await
            .map_err(classify)?;
        Ok(gone.deleted_count as usize)
    }

    /// The times of the events at `places`, by id (a gone one is absent).
    async fn times_of(&self, places: &[Place]) -> MetaResult<HashMap<String, bson::DateTime>> {
        let ids: Vec<&str> = places.iter().map(|p| p.event.as_str()).collect();
        (self.db.collection::<Document>("events"))
            .find(doc! {"_id": {"$in": ids}})
            .projection(doc! {"_id": 1, "time": 1})
            .await
            .map_err(classify)?
            .try_filter_map(|d| async move {
                Ok(match (d.get_str("_id"), d.get_datetime("time")) {
                    (Ok(id), Ok(time)) => Some((id.to_owned(), *time)),
                    _ => None,
                })
            })
            .try_collect()
            .await
            .map_err(classify)
    }

    /// The time of the feed's oldest event kept (of the first places;
    /// `None` if it has none kept there).
    pub(super) async fn oldest_placed(&self) -> MetaResult<Option<DateTime<Utc>>> {
        let state = self.read_feed_state().await?;
        let from = state.floor.max(state.swept);
        let upto = state.last.min(from.saturating_add(64));
        let first = self.feed_between(from, upto, 64).await?;
        Ok(first.first().map(|e| e.time))
    }

    /// `owner`'s events not placed yet (a deletion leaves them).
    pub(super) async fn pending_of(&self, owner: &UserId) -> MetaResult<Vec<String>> {
        let pending: Vec<Pending> = (self.pending().find(doc! {"owner_id": owner}))
            .await
            .map_err(classify)?
            .try_collect()
            .await
            .map_err(classify)?;
        Ok(pending.into_iter().map(|p| p.event).collect())
    }

    pub(super) async fn read_feed_bounds(&self) -> MetaResult<FeedBounds> {
        let state = self.read_feed_state().await?;
        Ok(FeedBounds {
            last: state.last,
            floor: state.floor,
        })
    }

    async fn read_feed_state(&self) -> MetaResult<FeedState> {
        let state = self
            .majority::<FeedState>(FEED_STATE)
            .find_one(doc! {"_id": FEED_STATE})
            .projection(doc! {"last": 1, "floor": 1, "swept": 1})
            .await
            .map_err(classify)?;
        Ok(state.unwrap_or_default())
    }

    /// Marks the feed up to `floor` as removed by the retention, and up to
    /// `swept` as walked by it (before it removes them: a reader never
    /// misses one without being told). In a transaction: a plain write
    /// that meets a sequencing transaction's would wait for it on
    /// SecantusDB (for up to its lifetime, were its instance killed); this
    /// one fails, and the next pass tries again.
    async fn raise_feed_marks(&self, floor: i64, swept: i64) -> MetaResult<()> {
        let mut s = self.txns.begin(None).await?;
        let marks = doc! {"$max": {"floor": floor, "swept": swept}};
        let result = self
            .feed_state()
            .update_one(doc! {"_id": FEED_STATE}, marks)
            .upsert(true)
            .session(&mut s)
            .await
            .map(|_| ())
            .map_err(classify);
        self.txns.finish(s, None, result).await
    }
}
