//! Events in the embedded store: `events/{owner}/{seq:020}`, so that an
//! owner's events are one key range in sequence order, and beside each an
//! entry `event_times/{time_ms:015}/{owner}/{seq:020}`, so that the oldest
//! (the retention's) are one key range too.

use std::collections::HashMap;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::{EmbeddedStore, txn::Txn, user_key};
use crate::{
    meta::{EventDraft, EventRecord, EventRepo, MetaError, MetaResult, UserRecord, events},
    vocab::UserId,
};

const TIMES: &str = "event_times/";

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

/// Numbers `drafts` after `user`'s last event and writes them in `tx`; the
/// caller writes `user` (its `event_seq` moved on) in the same transaction.
pub(super) fn emit(tx: &mut Txn, user: &mut UserRecord, drafts: Vec<EventDraft>) -> MetaResult<()> {
    let n = drafts.len() as i64;
    for event in events::number(user.id, user.event_seq, drafts) {
        tx.insert(&event_key(&event.owner_id, event.seq), &event)?;
        tx.put(&time_key(&event), &())?;
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

/// Deletes `owner`'s events numbered up to `upto`; how many.
fn drop_first(tx: &mut Txn, owner: &UserId, upto: i64) -> MetaResult<usize> {
    let prefix = events_of(owner);
    let (mut gone, mut after) = (0, None::<String>);
    loop {
        let keys = tx.keys(&prefix, after.as_deref(), 1000)?;
        let Some(last) = keys.last() else {
            return Ok(gone);
        };
        after = Some(last[prefix.len()..].to_owned());
        for k in &keys {
            let Some(e) = tx.get::<EventRecord>(k)? else {
                continue;
            };
            if e.seq > upto {
                return Ok(gone);
            }
            tx.delete(&time_key(&e));
            tx.delete(k);
            gone += 1;
        }
    }
}

/// Deletes up to `limit` of `owner`'s first events (a user's deletion);
/// how many.
pub(super) fn purge_events(tx: &mut Txn, owner: &UserId, limit: usize) -> MetaResult<usize> {
    let keys = tx.keys(&events_of(owner), None, limit)?;
    for k in &keys {
        if let Some(e) = tx.get::<EventRecord>(k)? {
            tx.delete(&time_key(&e));
        }
        tx.delete(k);
    }
    Ok(keys.len())
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
        self.transaction(move |tx| {
            let after = format!("{:020}", after.max(0));
            let keys = tx.keys(&events_of(&owner), Some(&after), limit)?;
            let mut out = Vec::with_capacity(keys.len());
            for k in keys {
                if let Some(e) = tx.get(&k)? {
                    out.push(e);
                }
            }
            Ok(out)
        })
        .await
    }

    async fn last_event_seq(&self, owner: &UserId) -> MetaResult<i64> {
        let key = user_key(owner);
        self.transaction(move |tx| Ok(tx.get::<UserRecord>(&key)?.map_or(0, |u| u.event_seq)))
            .await
    }

    async fn expire_events(&self, before: DateTime<Utc>, limit: usize) -> MetaResult<usize> {
        let before = format!("{:015}", before.timestamp_millis().max(0));
        self.transaction(move |tx| {
            // Each owner's events up to the highest number among the old
            // ones go: a prefix (see `EventRepo::expire_events`).
            let mut upto: HashMap<UserId, i64> = HashMap::new();
            for k in tx.keys(TIMES, None, limit)? {
                // `{time_ms}/{owner}/{seq}`, oldest first.
                let mut parts = k[TIMES.len()..].split('/');
                let (Some(time), Some(owner), Some(seq)) =
                    (parts.next(), parts.next(), parts.next())
                else {
                    continue;
                };
                if time >= before.as_str() {
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
        })
        .await
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
}
