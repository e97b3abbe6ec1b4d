//! Events in the embedded store: `events/{owner}/{seq:020}`, so that an
//! owner's events are one key range in sequence order, and beside each an
//! entry `event_times/{time_ms:015}/{owner}/{seq:020}`, so that the oldest
//! (the retention's) are one key range too. The feed of every owner's
//! events: `feed_pending/{owner}/{seq:020}` for each event not placed in it
//! yet (each owner's in order), `feed/{position:020}` naming the event at
//! each place, and [`FEED_STATE`] its bounds.

use std::collections::HashMap;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::{EmbeddedStore, txn::Txn, user_key, webhooks::expire_dead_letters};
use crate::{
    meta::{
        EventDraft, EventRecord, EventRepo, EventType, FEED_STATE, FeedBounds, FeedPage, MetaError,
        MetaResult, OwnerPage, UserRecord, events,
    },
    vocab::UserId,
};

const TIMES: &str = "event_times/";
const PENDING: &str = "feed_pending/";
const FEED: &str = "feed/";

/// Where `owner`'s events are kept.
pub(super) fn events_of(owner: &UserId) -> String {
    format!("events/{owner}/")
}

fn event_key(owner: &UserId, seq: i64) -> String {
    format!("{}{seq:020}", events_of(owner))
}

fn time_key(e: &EventRecord) -> String {
    format!(
        "{TIMES}{:015}/{}/{:020}",
        e.time.timestamp_millis().max(0),
        e.owner_id,
        e.seq
    )
}

fn pending_key(e: &EventRecord) -> String {
    format!("{PENDING}{}/{:020}", e.owner_id, e.seq)
}

fn feed_key(position: i64) -> String {
    format!("{FEED}{position:020}")
}

/// Writes `e` with the entries that find it (by owner, time and feed).
fn index(tx: &mut Txn, e: &EventRecord) -> MetaResult<()> {
    tx.insert(&event_key(&e.owner_id, e.seq), e)?;
    tx.put(&time_key(e), &())?;
    match e.feed {
        Some(p) => tx.put(&feed_key(p), &event_key(&e.owner_id, e.seq)),
        None => tx.put(&pending_key(e), &()),
    }
}

/// Gives `e`, not placed in the feed, its entry that has the sequencer
/// place it, unless it has one; whether it had none.
pub(super) fn pend(tx: &mut Txn, e: &EventRecord) -> MetaResult<bool> {
    let key = pending_key(e);
    if tx.get::<()>(&key)?.is_some() {
        return Ok(false);
    }
    tx.put(&key, &())?;
    Ok(true)
}

/// Deletes `e` (stored under `key`) and the entries that find it.
fn unindex(tx: &mut Txn, key: &str, e: &EventRecord) {
    tx.delete(&time_key(e));
    match e.feed {
        Some(p) => tx.delete(&feed_key(p)),
        None => tx.delete(&pending_key(e)),
    }
    tx.delete(key);
}

/// `owner`'s events numbered above `after`, at most `limit`.
fn owner_events(
    tx: &mut Txn,
    owner: &UserId,
    after: i64,
    limit: usize,
) -> MetaResult<Vec<EventRecord>> {
    let after = format!("{:020}", after.max(0));
    let keys = tx.keys(&events_of(owner), Some(&after), limit)?;
    let mut out = Vec::with_capacity(keys.len());
    for k in keys {
        if let Some(e) = tx.get(&k)? {
            out.push(e);
        }
    }
    Ok(out)
}

/// The events placed after `after` up to `upto`, at most `limit`.
fn feed_window(tx: &mut Txn, after: i64, upto: i64, limit: usize) -> MetaResult<Vec<EventRecord>> {
    let (from, end) = (format!("{:020}", after.max(0)), feed_key(upto));
    let mut events = Vec::new();
    for k in tx.keys(FEED, Some(&from), limit)? {
        if k > end {
            break;
        }
        if let Some(key) = tx.get::<String>(&k)?
            && let Some(e) = tx.get::<EventRecord>(&key)?
        {
            events.push(e);
        }
    }
    Ok(events)
}

fn feed_state(tx: &mut Txn) -> MetaResult<FeedBounds> {
    Ok(tx.get(FEED_STATE)?.unwrap_or_default())
}

/// Numbers `drafts` after `user`'s last event and writes them in `tx`; the
/// caller writes `user` (its `event_seq` moved on) in the same transaction.
pub(super) fn emit(tx: &mut Txn, user: &mut UserRecord, drafts: Vec<EventDraft>) -> MetaResult<()> {
    let n = drafts.len() as i64;
    for event in events::number(user.id, user.event_seq, drafts) {
        index(tx, &event)?;
    }
    user.event_seq += n;
    Ok(())
}

/// [`emit`] for `owner`, reading and writing their user document; how many
/// (`NotFound` if the owner is gone and there is one to write).
pub(super) fn emit_for(tx: &mut Txn, owner: &UserId, drafts: Vec<EventDraft>) -> MetaResult<usize> {
    let n = drafts.len();
    if n == 0 {
        return Ok(0);
    }
    let key = user_key(owner);
    let mut user: UserRecord = tx.get(&key)?.ok_or(MetaError::NotFound)?;
    emit(tx, &mut user, drafts)?;
    tx.put(&key, &user)?;
    Ok(n)
}

/// Deletes `owner`'s events numbered up to `upto` (the feed's floor raised
/// to the highest place among them); how many.
fn drop_first(tx: &mut Txn, owner: &UserId, upto: i64) -> MetaResult<usize> {
    let prefix = events_of(owner);
    let (mut gone, mut after, mut floor) = (0, None::<String>, 0);
    'pages: loop {
        let keys = tx.keys(&prefix, after.as_deref(), 1000)?;
        let Some(last) = keys.last() else {
            break;
        };
        after = Some(last[prefix.len()..].to_owned());
        for k in &keys {
            let Some(e) = tx.get::<EventRecord>(k)? else {
                continue;
            };
            // Only events placed in the feed go (as on MongoDB): a prefix.
            if e.seq > upto || e.feed.is_none() {
                break 'pages;
            }
            floor = floor.max(e.feed.unwrap_or(0));
            unindex(tx, k, &e);
            gone += 1;
        }
    }
    let mut state = feed_state(tx)?;
    if floor > state.floor {
        state.floor = floor;
        tx.put(FEED_STATE, &state)?;
    }
    Ok(gone)
}

/// Whether a user's deletion removes `e`: all their events but the one
/// that tells it.
pub(super) fn purged(e: &EventRecord) -> bool {
    e.kind != EventType::UserDeleted.as_str()
}

/// Deletes up to `limit` of `owner`'s first events (a user's deletion),
/// all but their `user.deleted`, once placed in the feed (the sequencer
/// places the others soon: the next pass takes them); how many.
pub(super) fn purge_events(tx: &mut Txn, owner: &UserId, limit: usize) -> MetaResult<usize> {
    let mut gone = 0;
    for k in tx.keys(&events_of(owner), None, limit)? {
        if let Some(e) = tx.get::<EventRecord>(&k)?
            && purged(&e)
            && e.feed.is_some()
        {
            unindex(tx, &k, &e);
            gone += 1;
        }
    }
    Ok(gone)
}

/// Removes the events written before `before` (`{time_ms:015}`), at most
/// `limit` of them found: each owner's up to the highest number among the
/// old ones, a prefix (see `EventRepo::expire_events`); how many.
fn expire(tx: &mut Txn, before: &str, limit: usize) -> MetaResult<usize> {
    let mut upto: HashMap<UserId, i64> = HashMap::new();
    for k in tx.keys(TIMES, None, limit)? {
        // `{time_ms}/{owner}/{seq}`, oldest first.
        let mut parts = k[TIMES.len()..].split('/');
        let (Some(time), Some(owner), Some(seq)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        if time >= before {
            break;
        }
        if let (Some(owner), Ok(seq)) = (UserId::parse(owner), seq.parse::<i64>()) {
            let max = upto.entry(owner).or_insert(seq);
            *max = (*max).max(seq);
        }
    }
    let mut gone = 0;
    for (owner, upto) in upto {
        gone += drop_first(tx, &owner, upto)?;
    }
    Ok(gone)
}

#[async_trait]
impl EventRepo for EmbeddedStore {
    async fn events(
        &self,
        owner: &UserId,
        after: i64,
        limit: usize,
    ) -> MetaResult<Vec<EventRecord>> {
        let owner = *owner;
        self.transaction(move |tx| owner_events(tx, &owner, after, limit))
            .await
    }

    async fn owner_page(&self, owner: &UserId, after: i64, limit: usize) -> MetaResult<OwnerPage> {
        let owner = *owner;
        self.transaction(move |tx| {
            let last = tx
                .get::<UserRecord>(&user_key(&owner))?
                .map_or(0, |u| u.event_seq);
            let events = owner_events(tx, &owner, after, limit)?;
            Ok(OwnerPage { last, events })
        })
        .await
    }

    async fn expire_events(&self, before: DateTime<Utc>, limit: usize) -> MetaResult<usize> {
        let time = format!("{:015}", before.timestamp_millis().max(0));
        // It writes the feed's floor, which a sequencer placing events at
        // the same moment writes too: the loser of that race runs again.
        let mut conflicts = 0;
        loop {
            let time = time.clone();
            let expired = self.transaction(move |tx| {
                let events = expire(tx, &time, limit)?;
                // Their copies in dead letters go with them.
                Ok(events + expire_dead_letters(tx, before, limit)?)
            });
            match expired.await {
                Err(MetaError::WriteConflict) if conflicts < 5 => conflicts += 1,
                r => return r,
            }
        }
    }

    async fn oldest_event(&self) -> MetaResult<Option<DateTime<Utc>>> {
        self.transaction(move |tx| {
            let first = tx.keys(TIMES, None, 1)?;
            let ms = first
                .first()
                .and_then(|k| k[TIMES.len()..].split('/').next())
                .and_then(|t| t.parse::<i64>().ok());
            Ok(ms.and_then(DateTime::from_timestamp_millis))
        })
        .await
    }

    async fn sequence_events(&self, limit: usize) -> MetaResult<usize> {
        self.transaction(move |tx| {
            // `{owner}/{seq}`: each owner's in sequence order.
            let pending = tx.keys(PENDING, None, limit)?;
            if pending.is_empty() {
                return Ok(0);
            }
            let (mut state, mut placed) = (feed_state(tx)?, 0);
            for k in &pending {
                tx.delete(k);
                let Some((owner, seq)) = k[PENDING.len()..].split_once('/') else {
                    continue;
                };
                let (Some(owner), Ok(seq)) = (UserId::parse(owner), seq.parse::<i64>()) else {
                    continue;
                };
                let key = event_key(&owner, seq);
                let Some(mut e) = tx.get::<EventRecord>(&key)? else {
                    continue;
                };
                state.last += 1;
                e.feed = Some(state.last);
                tx.put(&key, &e)?;
                tx.put(&feed_key(state.last), &key)?;
                placed += 1;
            }
            tx.put(FEED_STATE, &state)?;
            Ok(placed)
        })
        .await
    }

    async fn feed(&self, after: i64, width: i64, limit: usize) -> MetaResult<FeedPage> {
        self.transaction(move |tx| {
            let bounds = feed_state(tx)?;
            let (mut from, mut width) = (after, width.max(1));
            loop {
                let upto = FeedPage::upto(bounds, from, width);
                let events = feed_window(tx, from, upto, limit)?;
                if !events.is_empty() || upto >= bounds.last {
                    return Ok(FeedPage {
                        bounds,
                        upto,
                        events,
                    });
                }
                (from, width) = (upto, width.saturating_mul(2));
            }
        })
        .await
    }
}
