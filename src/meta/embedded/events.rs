//! Events in the embedded store: `events/{owner}/{seq:020}`, so that an
//! owner's events are one key range in sequence order.

use async_trait::async_trait;

use super::{EmbeddedStore, txn::Txn};
use crate::{
    meta::{EventDraft, EventRecord, EventRepo, MetaResult, UserRecord, events},
    vocab::UserId,
};

/// Where `owner`'s events are kept.
pub(super) fn events_of(owner: &UserId) -> String {
    format!("events/{owner}/")
}

fn event_key(owner: &UserId, seq: i64) -> String {
    format!("{}{seq:020}", events_of(owner))
}

/// Numbers `drafts` after `user`'s last event and writes them in `tx`; the
/// caller writes `user` (its `event_seq` moved on) in the same transaction.
pub(super) fn emit(tx: &mut Txn, user: &mut UserRecord, drafts: Vec<EventDraft>) -> MetaResult<()> {
    let n = drafts.len() as i64;
    for event in events::number(user.id, user.event_seq, drafts) {
        tx.insert(&event_key(&event.owner_id, event.seq), &event)?;
    }
    user.event_seq += n;
    Ok(())
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
}
