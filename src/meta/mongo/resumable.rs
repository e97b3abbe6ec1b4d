//! Resumable uploads on MongoDB. An upload's reservation (its open slot
//! and reserved bytes on the user document) changes in the transaction
//! that changes its record; the quota and the cap are checked on the user
//! document as that transaction's update found it (`count_in`), so that
//! racing creations cannot pass them (one of two racing writes conflicts).

use async_trait::async_trait;
use bson::{Document, doc};
use chrono::{DateTime, Utc};
use mongodb::{ClientSession, options::ReturnDocument};

use super::{MongoStore, errors::classify, events::EventSeq, find_sorted};
use crate::{
    meta::{
        Claim, EventDraft, IntentRecord, MetaError, MetaResult, OpenLimits, Progress, Reserve,
        ResumableRecord, ResumableRepo, StateAdvance, group::Held, resumable::uncounted,
    },
    vocab::{FileId, UserId},
};

/// The fields only the counting writes change (see [`ResumableRecord::reserved`]).
const COUNTED_FIELDS: [&str; 3] = ["length", "reserved", "open"];

/// The condition of [`ResumableRepo::advance_resumable`]'s one write: of
/// two requests from the same progress, one matches. Every condition is a
/// field's own (none is a top-level operator such as `$or`), so that
/// SecantusDB finds the document by its `_id`; with one at the top it scans
/// every upload kept, and a PATCH costs more the more uploads there were.
fn advance_filter(owner: &UserId, id: &FileId, expected: Progress, offset: i64) -> Document {
    let committed = match expected.committed {
        true => bson::Bson::Boolean(true),
        false => doc! {"$ne": true}.into(),
    };
    doc! {
        "_id": id,
        "user_id": owner,
        "offset": expected.offset,
        "parts": {"$size": expected.parts as i64},
        "committed": committed,
        // Unknown, or not below the offset.
        "length": {"$not": {"$lt": offset}},
    }
}

impl MongoStore {
    /// What `owner`'s upload `id` holds of their counters, as `s` sees it;
    /// with `state`, its bytes recorded in `s` too, in the same round trip:
    /// `None` if it moved on since (see [`StateAdvance`]).
    pub(super) async fn held_in(
        &self,
        s: &mut ClientSession,
        owner: &UserId,
        id: &FileId,
        state: Option<&StateAdvance>,
    ) -> MetaResult<Option<Held>> {
        let Some(state) = state else {
            let filter = doc! {"_id": id, "user_id": owner};
            let upload = self.resumables().find_one(filter).session(&mut *s).await;
            return Ok(Some(held_by(upload.map_err(classify)?)));
        };
        let (filter, set) = state_write(state)?;
        let before = self
            .resumables()
            .find_one_and_update(filter, doc! {"$set": set})
            .return_document(ReturnDocument::Before)
            .session(&mut *s)
            .await
            .map_err(classify)?;
        Ok(before.map(|b| held_by(Some(b))))
    }

    /// Marks `owner`'s upload `id` committed as its file commits, its
    /// reservation given back (and, with `state`, its bytes recorded;
    /// [`MetaError::Moved`] if it moved on since), in `s`: what it held
    /// (the caller takes that off the user document in the same
    /// transaction). One round trip for all.
    pub(super) async fn release_in(
        &self,
        s: &mut ClientSession,
        owner: &UserId,
        id: &FileId,
        state: Option<&StateAdvance>,
    ) -> MetaResult<Held> {
        let (filter, mut set) = match state {
            Some(state) => state_write(state)?,
            None => (doc! {"_id": id, "user_id": owner}, Document::new()),
        };
        set.extend(committed_fields());
        let before = self
            .resumables()
            .find_one_and_update(filter, doc! {"$set": set})
            .return_document(ReturnDocument::Before)
            .session(&mut *s)
            .await
            .map_err(classify)?;
        if before.is_none() && state.is_some() {
            return Err(MetaError::Moved);
        }
        Ok(held_by(before))
    }

    /// Marks `owner`'s uploads committed as their files commit, their
    /// reservations given back, in `s` (the caller takes those off the
    /// user document in the same transaction): a client that missed the
    /// commit's answer learns it from the record.
    pub(super) async fn mark_released_in(
        &self,
        s: &mut ClientSession,
        owner: &UserId,
        ids: &[FileId],
    ) -> MetaResult<()> {
        if ids.is_empty() {
            return Ok(());
        }
        let filter = doc! {"_id": {"$in": ids}, "user_id": owner};
        self.resumables()
            .update_many(filter, committed_mark())
            .session(&mut *s)
            .await
            .map(|_| ())
            .map_err(classify)
    }

    /// Why a counting update of `user`'s document (by `_id`, while not
    /// being deleted) matched nothing: gone, or being deleted.
    async fn why_not_counted(&self, s: &mut ClientSession, user: &UserId) -> MetaError {
        match self
            .users()
            .find_one(doc! {"_id": user})
            .session(&mut *s)
            .await
        {
            Ok(None) => MetaError::NotFound,
            Ok(Some(u)) => OpenLimits::may_write(&u)
                .err()
                .unwrap_or(MetaError::WriteConflict),
            Err(e) => classify(e),
        }
    }

    /// Counts `opening` more open uploads and `reserving` more reserved
    /// bytes on `user`, in `s`, if they fit `limits`: the user document is
    /// updated by its `_id` alone (a filter with an operator at its top, such
    /// as `$expr`, makes SecantusDB scan the collection for it) and the
    /// limits are checked on the document as it was; past them, the error
    /// aborts the transaction and its update with it (so it runs only in
    /// one: both callers begin it).
    async fn count_in(
        &self,
        s: &mut ClientSession,
        user: &UserId,
        limits: &OpenLimits,
        (opening, reserving): (i64, i64),
    ) -> MetaResult<()> {
        // A user being deleted opens no upload (`deleting_since` unset).
        let filter = doc! {"_id": user, "deleting_since": null};
        let update = doc! {"$inc": {"reserved_bytes": reserving, "open_uploads": opening}};
        let before = self
            .users()
            .find_one_and_update(filter, update)
            .return_document(ReturnDocument::Before)
            .session(&mut *s)
            .await
            .map_err(classify)?;
        let Some(mut u) = before else {
            return Err(self.why_not_counted(s, user).await);
        };
        // As if all but the last of those opening were open:
        // `OpenLimits::check` asks whether one more may open.
        u.open_uploads += (opening - 1).max(0);
        limits.check(&u, reserving)
    }

    async fn insert_resumables_in(
        &self,
        s: &mut ClientSession,
        uploads: &[(IntentRecord, ResumableRecord)],
        limits: &OpenLimits,
    ) -> MetaResult<()> {
        let Some((_, first)) = uploads.first() else {
            return Ok(());
        };
        let user = first.user_id;
        let count = uploads.len() as i64;
        let reserved: i64 = uploads.iter().map(|(_, u)| u.reserved).sum();
        self.count_in(s, &user, limits, (count, reserved)).await?;
        self.intents()
            .insert_many(uploads.iter().map(|(intent, _)| intent))
            .session(&mut *s)
            .await
            .map_err(classify)?;
        let counted = uploads.iter().map(|(_, u)| ResumableRecord {
            open: true,
            ..u.clone()
        });
        self.resumables()
            .insert_many(counted)
            .session(&mut *s)
            .await
            .map(|_| ())
            .map_err(classify)
    }

    async fn reserve_deferred_in(
        &self,
        s: &mut ClientSession,
        (owner, id): (&UserId, &FileId),
        what: Reserve,
        quota: Option<u64>,
    ) -> MetaResult<Option<ResumableRecord>> {
        let Some(upload) = self
            .resumables()
            .find_one(doc! {"_id": id, "user_id": owner})
            .session(&mut *s)
            .await
            .map_err(classify)?
        else {
            return Ok(None);
        };
        let Some((next, more)) = what.apply(&upload) else {
            return Ok(Some(upload));
        };
        let limits = OpenLimits {
            quota_bytes: quota,
            max_open: u64::MAX,
        };
        self.count_in(s, &upload.user_id, &limits, (0, more))
            .await?;
        self.resumables()
            .update_one(
                doc! {"_id": id, "user_id": owner},
                doc! {"$set": {"length": next.length, "reserved": next.reserved}},
            )
            .session(&mut *s)
            .await
            .map_err(classify)?;
        Ok(Some(next))
    }

    /// Whether `user`'s deletion has begun (or they are gone): their
    /// `user.deleted` is their last event, so an expiry tells nothing then.
    async fn user_leaving(&self, s: &mut ClientSession, user: &UserId) -> MetaResult<bool> {
        let found = self
            .db
            .collection::<Document>("users")
            .find_one(doc! {"_id": user})
            .projection(doc! {"deleting_since": 1})
            .session(&mut *s)
            .await
            .map_err(classify)?;
        Ok(found
            .is_none_or(|u| matches!(u.get("deleting_since"), Some(d) if d != &bson::Bson::Null)))
    }

    /// Deletes the upload `filter` matches (by `_id` and user, and maybe more) and
    /// gives back what it held of its user's counters, in `s`: whether one
    /// was deleted ([`Claim`]). An expired one's claim (`expired`) writes its
    /// `upload.expired` (see [`EventDraft::expiry_told_by`]), but for a
    /// user leaving.
    async fn delete_resumable_in(
        &self,
        s: &mut ClientSession,
        filter: Document,
        expired: bool,
    ) -> MetaResult<Claim> {
        let Some(upload) = self
            .resumables()
            .find_one(filter.clone())
            .session(&mut *s)
            .await
            .map_err(classify)?
        else {
            return Ok(Claim::Missed);
        };
        let mut told = false;
        // Its user's counters, and its expiry's event numbered on the same
        // document (no event once the user is gone: nothing to number it).
        if upload.open || upload.reserved != 0 {
            let open = i64::from(upload.open);
            let mut inc = doc! {"reserved_bytes": -upload.reserved, "open_uploads": -open};
            let tell = expired
                && EventDraft::expiry_told_by(&upload)
                && !self.user_leaving(s, &upload.user_id).await?;
            if tell {
                inc.insert("event_seq", 1_i64);
            }
            let user = self
                .db
                .collection::<EventSeq>("users")
                .find_one_and_update(doc! {"_id": &upload.user_id}, doc! {"$inc": inc})
                .projection(doc! {"event_seq": 1})
                .return_document(ReturnDocument::After)
                .session(&mut *s)
                .await
                .map_err(classify)?;
            if let (true, Some(user)) = (tell, user) {
                let drafts = vec![EventDraft::upload_expired(&upload)];
                (self.insert_events(s, upload.user_id, user.event_seq - 1, drafts)).await?;
                told = true;
            }
        }
        let deleted = self
            .resumables()
            .delete_one(filter)
            .session(&mut *s)
            .await
            .map_err(classify)?;
        Ok(match deleted.deleted_count {
            0 => Claim::Missed,
            _ => Claim::Claimed { told },
        })
    }
}

#[async_trait]
impl ResumableRepo for MongoStore {
    async fn insert_resumables(
        &self,
        uploads: &[(IntentRecord, ResumableRecord)],
        limits: &OpenLimits,
    ) -> MetaResult<()> {
        let mut s = self.txns.begin(None).await?;
        let result = self.insert_resumables_in(&mut s, uploads, limits).await;
        self.txns.finish(s, None, result).await
    }

    async fn reserve_deferred(
        &self,
        owner: &UserId,
        id: &FileId,
        what: Reserve,
        quota: Option<u64>,
    ) -> MetaResult<Option<ResumableRecord>> {
        let mut s = self.txns.begin(None).await?;
        let result = (self.reserve_deferred_in(&mut s, (owner, id), what, quota)).await;
        self.txns.finish(s, None, result).await
    }

    async fn resumable(&self, owner: &UserId, id: &FileId) -> MetaResult<Option<ResumableRecord>> {
        self.resumables()
            .find_one(doc! {"_id": id, "user_id": owner})
            .await
            .map_err(classify)
    }

    async fn resumable_by_id_alone(&self, id: &FileId) -> MetaResult<Option<ResumableRecord>> {
        self.resumables()
            .find_one(doc! {"_id": id})
            .await
            .map_err(classify)
    }

    async fn advance_resumable(
        &self,
        upload: &ResumableRecord,
        expected: Progress,
    ) -> MetaResult<bool> {
        let fields = recorded_fields(upload)?;
        let updated = self
            .resumables()
            .update_one(
                advance_filter(&upload.user_id, &upload.id, expected, upload.offset),
                doc! {"$set": fields},
            )
            .await
            .map_err(classify)?;
        Ok(updated.matched_count > 0)
    }

    async fn delete_resumable(&self, owner: &UserId, id: &FileId) -> MetaResult<()> {
        let mut s = self.txns.begin(None).await?;
        let result = self
            .delete_resumable_in(&mut s, doc! {"_id": id, "user_id": owner}, false)
            .await;
        self.txns.finish(s, None, result).await.map(|_| ())
    }

    async fn delete_resumable_if_expires(
        &self,
        owner: &UserId,
        id: &FileId,
        expires_at: DateTime<Utc>,
        tell: bool,
    ) -> MetaResult<Claim> {
        let expires_at = bson::DateTime::from_chrono(expires_at);
        let filter = doc! {"_id": id, "user_id": owner, "expires_at": expires_at};
        let mut s = self.txns.begin(None).await?;
        let result = self.delete_resumable_in(&mut s, filter, tell).await;
        match self.txns.finish(s, None, result).await {
            // A PATCH wrote it at the same moment (it renewed it), or the
            // user's counters changed: the next pass claims it again.
            Err(MetaError::WriteConflict) => Ok(Claim::Missed),
            r => r,
        }
    }

    async fn restore_resumable(&self, upload: &ResumableRecord) -> MetaResult<()> {
        self.resumables()
            .insert_one(uncounted(upload))
            .await
            .map(|_| ())
            .map_err(classify)
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

/// A committed upload's record: nothing held, committed, completed.
fn committed_mark() -> Document {
    doc! {"$set": committed_fields()}
}

fn committed_fields() -> Document {
    doc! {"reserved": 0_i64, "open": false, "committed": true, "completed": true}
}

/// The condition and the fields of writing `state` ([`StateAdvance`]).
fn state_write(state: &StateAdvance) -> MetaResult<(Document, Document)> {
    let r = &state.record;
    let filter = advance_filter(&r.user_id, &r.id, state.from, r.offset);
    Ok((filter, recorded_fields(r)?))
}

/// What writing `upload` over its stored record sets: every field but its
/// id and the counted ones, which change only with the user's counters.
fn recorded_fields(upload: &ResumableRecord) -> MetaResult<Document> {
    let mut fields = bson::to_document(upload).map_err(|e| MetaError::Other(e.to_string()))?;
    fields.remove("_id");
    for kept in COUNTED_FIELDS {
        fields.remove(kept);
    }
    Ok(fields)
}

/// What `upload` holds of its user's counters (nothing, if it is gone).
fn held_by(upload: Option<ResumableRecord>) -> Held {
    upload.map_or_else(Held::default, |u| Held {
        reserved: u.reserved,
        open: u.open,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::mongo::txn::top_level_operators;

    #[test]
    fn the_advance_condition_has_no_top_level_operator() {
        let expected = Progress {
            offset: 0,
            parts: 0,
            committed: false,
        };
        let filter = advance_filter(&UserId::new(), &FileId::new(), expected, 1 << 20);
        assert_eq!(top_level_operators(&filter), Vec::<&str>::new());
        assert!(filter.contains_key("_id") && filter.contains_key("user_id"));
    }
}
