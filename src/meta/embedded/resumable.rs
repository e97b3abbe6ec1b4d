//! Resumable uploads in the embedded store. An upload's reservation (its
//! open slot and reserved bytes on the user) changes in the transaction
//! that changes its record.

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::{EmbeddedStore, events::emit, txn::Txn, user_key};
use crate::{
    meta::{
        Claim, EventDraft, IntentRecord, MetaError, MetaResult, OpenLimits, Progress, Reserve,
        ResumableRecord, ResumableRepo, StateAdvance, UserRecord, group::Held,
        resumable::uncounted,
    },
    vocab::{FileId, UserId},
};

fn resumable_key(id: &FileId) -> String {
    format!("resumables/{id}")
}

/// `upload`, if it is `owner`'s (another user's is not found, as MongoDB's
/// filter on both finds none).
fn owned(upload: Option<ResumableRecord>, owner: &UserId) -> Option<ResumableRecord> {
    upload.filter(|u| &u.user_id == owner)
}

fn stored_user(tx: &mut Txn, id: &UserId) -> MetaResult<UserRecord> {
    tx.get(&user_key(id))?.ok_or(MetaError::NotFound)
}

/// Gives back what upload `id` holds of `user`'s counters as its file
/// commits, in `tx`, and marks its record committed (and completed): a
/// client that missed the commit's answer learns it from the record. The
/// bytes given back. With `state`, its bytes are recorded first
/// ([`MetaError::Moved`] if it moved on).
pub(super) fn release(
    tx: &mut Txn,
    user: &mut UserRecord,
    id: &FileId,
    state: Option<&StateAdvance>,
) -> MetaResult<i64> {
    if let Some(state) = state
        && write_state(tx, state)?.is_none()
    {
        return Err(MetaError::Moved);
    }
    let key = resumable_key(id);
    let Some(mut upload) = tx.get::<ResumableRecord>(&key)? else {
        return Ok(0);
    };
    let freed = upload.reserved;
    user.reserved_bytes -= freed;
    if upload.open {
        user.open_uploads -= 1;
    }
    (upload.reserved, upload.open) = (0, false);
    (upload.committed, upload.completed) = (true, true);
    tx.put(&key, &upload)?;
    Ok(freed)
}

/// What upload `id` holds of its user's counters, as `tx` sees it; with
/// `state`, its bytes recorded in `tx` too (`None` if it moved on).
pub(super) fn held(
    tx: &mut Txn,
    id: &FileId,
    state: Option<&StateAdvance>,
) -> MetaResult<Option<Held>> {
    let stored = match state {
        Some(state) => match write_state(tx, state)? {
            Some(stored) => Some(stored),
            None => return Ok(None),
        },
        None => tx.get::<ResumableRecord>(&resumable_key(id))?,
    };
    Ok(Some(stored.map_or_else(Held::default, |u| Held {
        reserved: u.reserved,
        open: u.open,
    })))
}

/// Writes `state` over its stored record (all but the counted fields) if
/// that is where `state` expects it, in `tx`: the record as it was, `None`
/// if it moved on or is gone (`advance_resumable`'s condition).
fn write_state(tx: &mut Txn, state: &StateAdvance) -> MetaResult<Option<ResumableRecord>> {
    let r = &state.record;
    let key = resumable_key(&r.id);
    let Some(stored) = tx.get::<ResumableRecord>(&key)? else {
        return Ok(None);
    };
    if stored.user_id != r.user_id
        || stored.progress() != state.from
        || stored.length.is_some_and(|l| l < r.offset)
    {
        return Ok(None);
    }
    let kept = ResumableRecord {
        length: stored.length,
        reserved: stored.reserved,
        open: stored.open,
        ..r.clone()
    };
    tx.put(&key, &kept)?;
    Ok(Some(stored))
}

/// Deletes upload `id` if `claim` holds for it, giving back what it held
/// of its user's counters, in `tx`: whether it was deleted. An expired
/// one's claim (`expired`) writes its `upload.expired` (see
/// [`EventDraft::expiry_told_by`]).
fn delete_counted(
    tx: &mut Txn,
    id: &FileId,
    claim: impl Fn(&ResumableRecord) -> bool,
    expired: bool,
) -> MetaResult<Claim> {
    let key = resumable_key(id);
    let Some(upload) = tx.get::<ResumableRecord>(&key)? else {
        return Ok(Claim::Missed);
    };
    if !claim(&upload) {
        return Ok(Claim::Missed);
    }
    let mut told = false;
    if (upload.open || upload.reserved != 0)
        && let Some(mut user) = tx.get::<UserRecord>(&user_key(&upload.user_id))?
    {
        release(tx, &mut user, id, None)?;
        // A user being deleted has told it last (`user.deleted`).
        if expired && EventDraft::expiry_told_by(&upload) && user.deleting_since.is_none() {
            emit(tx, &mut user, vec![EventDraft::upload_expired(&upload)])?;
            told = true;
        }
        tx.put(&user_key(&user.id), &user)?;
    }
    tx.delete(&key);
    Ok(Claim::Claimed { told })
}

#[async_trait]
impl ResumableRepo for EmbeddedStore {
    async fn insert_resumables(
        &self,
        uploads: &[(IntentRecord, ResumableRecord)],
        limits: &OpenLimits,
    ) -> MetaResult<()> {
        let (uploads, limits) = (uploads.to_vec(), *limits);
        self.transaction(move |tx| {
            let Some((_, first)) = uploads.first() else {
                return Ok(());
            };
            let mut user = stored_user(tx, &first.user_id)?;
            for (intent, upload) in &uploads {
                limits.check(&user, upload.reserved)?;
                user.reserved_bytes += upload.reserved;
                user.open_uploads += 1;
                tx.insert(&format!("intents/{}", intent.id), intent)?;
                let counted = ResumableRecord {
                    open: true,
                    ..upload.clone()
                };
                tx.insert(&resumable_key(&counted.id), &counted)?;
            }
            tx.put(&user_key(&user.id), &user)
        })
        .await
    }

    async fn reserve_deferred(
        &self,
        owner: &UserId,
        id: &FileId,
        what: Reserve,
        quota: Option<u64>,
    ) -> MetaResult<Option<ResumableRecord>> {
        let (owner, key) = (*owner, resumable_key(id));
        self.transaction(move |tx| {
            let Some(upload) = owned(tx.get::<ResumableRecord>(&key)?, &owner) else {
                return Ok(None);
            };
            let Some((next, more)) = what.apply(&upload) else {
                return Ok(Some(upload));
            };
            let mut user = stored_user(tx, &upload.user_id)?;
            OpenLimits::check_quota(quota, &user, more)?;
            user.reserved_bytes += more;
            tx.put(&user_key(&user.id), &user)?;
            tx.put(&key, &next)?;
            Ok(Some(next))
        })
        .await
    }

    async fn resumable(&self, owner: &UserId, id: &FileId) -> MetaResult<Option<ResumableRecord>> {
        let (owner, key) = (*owner, resumable_key(id));
        self.transaction(move |tx| Ok(owned(tx.get::<ResumableRecord>(&key)?, &owner)))
            .await
    }

    async fn resumable_by_id_alone(&self, id: &FileId) -> MetaResult<Option<ResumableRecord>> {
        let key = resumable_key(id);
        self.transaction(move |tx| tx.get::<ResumableRecord>(&key))
            .await
    }

    async fn advance_resumable(
        &self,
        upload: &ResumableRecord,
        expected: Progress,
    ) -> MetaResult<bool> {
        let state = StateAdvance {
            record: upload.clone(),
            from: expected,
        };
        let advanced = self
            .transaction(move |tx| Ok(write_state(tx, &state)?.is_some()))
            .await;
        match advanced {
            // Another PATCH committed the same record first.
            Err(MetaError::WriteConflict) => Ok(false),
            r => r,
        }
    }

    async fn delete_resumable(&self, owner: &UserId, id: &FileId) -> MetaResult<()> {
        let (owner, id) = (*owner, *id);
        self.transaction(move |tx| delete_counted(tx, &id, |r| r.user_id == owner, false))
            .await
            .map(|_| ())
    }

    async fn delete_resumable_if_expires(
        &self,
        owner: &UserId,
        id: &FileId,
        expires_at: DateTime<Utc>,
        tell: bool,
    ) -> MetaResult<Claim> {
        let (owner, id) = (*owner, *id);
        let claim = move |r: &ResumableRecord| r.user_id == owner && r.expires_at == expires_at;
        let deleted = self
            .transaction(move |tx| delete_counted(tx, &id, claim, tell))
            .await;
        match deleted {
            // A PATCH wrote it at the same moment: it renewed it.
            Err(MetaError::WriteConflict) => Ok(Claim::Missed),
            r => r,
        }
    }

    async fn restore_resumable(&self, upload: &ResumableRecord) -> MetaResult<()> {
        let upload = uncounted(upload);
        self.transaction(move |tx| tx.insert(&resumable_key(&upload.id), &upload))
            .await
    }

    async fn expired_resumables(
        &self,
        before: DateTime<Utc>,
        limit: usize,
    ) -> MetaResult<Vec<ResumableRecord>> {
        self.transaction(move |tx| {
            let mut out = Vec::new();
            for k in tx.keys("resumables/", None, usize::MAX)? {
                if let Some(r) = tx.get::<ResumableRecord>(&k)?
                    && r.expires_at < before
                {
                    out.push(r);
                }
            }
            out.sort_by_key(|r: &ResumableRecord| r.expires_at);
            out.truncate(limit);
            Ok(out)
        })
        .await
    }
}
