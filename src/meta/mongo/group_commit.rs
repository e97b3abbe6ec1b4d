//! Group commits on MongoDB (see [`crate::meta::FileRepo::commit_uploads`] and
//! [`crate::meta::FileRepo::commit_upload_groups`]): each group's user document written
//! once (twice where the quota leaves some out), and the files, events,
//! permissions, idempotency records and intents of all the groups in one
//! command each.

use std::collections::HashMap;

use bson::{Document, doc};
use mongodb::{ClientSession, options::ReturnDocument};

use super::{MongoStore, errors::classify, files::UserQuota, txn::add_fences};
use crate::{
    meta::{
        CommitUpload, EventDraft, IdempotencyRecord, MetaError, MetaResult, Outcomes,
        PermissionRecord, events, group,
    },
    vocab::{FileId, UserId},
};

/// A group commit's plan, its user's document written.
struct Planned<'a> {
    owner: UserId,
    plan: group::GroupPlan<'a>,
    /// The number of its owner's event before its first.
    first_event: i64,
}

/// What a group's plan adds to its user's counters (a `$inc`).
fn counters_of(plan: &group::GroupPlan<'_>) -> Document {
    let n = plan.committing.len() as i64;
    doc! {
        "used_bytes": plan.bytes,
        "file_count": n,
        "reserved_bytes": -plan.freed_bytes,
        "open_uploads": -plan.freed_open,
        "event_seq": n,
    }
}

impl MongoStore {
    /// A group commit (see [`crate::meta::FileRepo::commit_uploads`]): the user's
    /// document written once (twice where the quota leaves some out), files,
    /// permissions, idempotency records and intents in one `insert_many` /
    /// `delete_many` each.
    pub(super) async fn commit_uploads_in(
        &self,
        s: &mut ClientSession,
        group: &[CommitUpload],
    ) -> MetaResult<Outcomes> {
        let Some(planned) = self.plan_group_in(s, group).await? else {
            return Ok(Vec::new());
        };
        self.write_groups_in(s, std::slice::from_ref(&planned))
            .await?;
        Ok(planned.plan.outcomes)
    }

    /// Several users' group commits (see [`crate::meta::FileRepo::commit_upload_groups`]):
    /// each user's document written as one group's is, and
    /// then the files, events, permissions, idempotency records and intents
    /// of all the groups in one `insert_many` / `delete_many` each.
    pub(super) async fn commit_upload_groups_in(
        &self,
        s: &mut ClientSession,
        groups: &[Vec<CommitUpload>],
    ) -> MetaResult<Vec<Outcomes>> {
        let mut planned = Vec::with_capacity(groups.len());
        for group in groups {
            planned.extend(self.plan_group_in(s, group).await?);
        }
        self.write_groups_in(s, &planned).await?;
        let mut outcomes = planned.into_iter().map(|p| p.plan.outcomes);
        // An empty group plans nothing and has no outcome to give.
        Ok(groups
            .iter()
            .map(|g| match g.is_empty() {
                true => Vec::new(),
                false => outcomes.next().unwrap_or_default(),
            })
            .collect())
    }

    /// A group's reads and its writes of the user document: what it commits
    /// (`None` for an empty group). Its other writes are
    /// [`Self::write_groups_in`]'s.
    async fn plan_group_in<'a>(
        &self,
        s: &mut ClientSession,
        group: &'a [CommitUpload],
    ) -> MetaResult<Option<Planned<'a>>> {
        let Some(owner) = group.first().map(|c| c.file.owner_id) else {
            return Ok(None);
        };
        let fences = group::fences(group)?;
        let key_ids = group::idempotency_ids(group);
        let mut recorded = HashMap::new();
        if !key_ids.is_empty() {
            let mut found = self
                .idempotency()
                .find(doc! {"_id": {"$in": &key_ids}, "file.owner_id": owner})
                .session(&mut *s)
                .await
                .map_err(classify)?;
            while let Some(r) = found.next(&mut *s).await {
                let r = r.map_err(classify)?;
                recorded.insert(r.id.clone(), r);
            }
        }
        let mut held = HashMap::new();
        for c in group.iter().filter(|c| c.resumable) {
            let (id, state) = (c.file.id, c.state.as_deref());
            if let Some(h) = self.held_in(s, &owner, &id, state).await? {
                held.insert(id, h);
            }
        }
        // The user document is written first as if every upload fitted,
        // and its answer says what counted before: one round trip, not a
        // read and a write. Where the quota leaves some out, a second write
        // takes their share back (in this transaction: nobody sees the guess).
        let guess = group::plan_unlimited(group, recorded.clone(), &held);
        if guess.committing.is_empty() {
            // Nothing to commit (replays, moved states): nothing to write.
            return Ok(Some(Planned {
                owner,
                plan: guess,
                first_event: 0,
            }));
        }
        let mut filter = doc! {"_id": owner, "deleting_since": null};
        let mut update = doc! {"$inc": counters_of(&guess)};
        add_fences(&mut filter, &mut update, "upload_fence", &fences);
        let Some(user) = self.update_counts_in(s, filter, update).await? else {
            let mut why = self.why_user_unmatched(s, &owner, None).await;
            for f in &fences {
                let stale = self.why_user_unmatched(s, &owner, Some(f)).await;
                if matches!(stale, MetaError::StaleFence) {
                    why = stale;
                    break;
                }
            }
            return Err(why);
        };
        let before = user.counted() - (guess.bytes - guess.freed_bytes);
        let plan = group::plan(group, before, user.quota_bytes, recorded, &held);
        let mut last_event = user.event_seq;
        // The quota may leave some out, and then a later upload may take an
        // earlier one's place (one with the same key, see `group::plan`):
        // whatever the counts, the counters decide.
        if counters_of(&plan) != counters_of(&guess) {
            let mut back = counters_of(&plan);
            for (field, guessed) in counters_of(&guess) {
                let (now, guessed) = (back.get_i64(&field).unwrap_or(0), guessed.as_i64());
                back.insert(field, now - guessed.unwrap_or(0));
            }
            let corrected = self.update_counts_in(s, doc! {"_id": owner}, doc! {"$inc": back});
            last_event = corrected.await?.ok_or(MetaError::NotFound)?.event_seq;
        }
        self.mark_released_in(s, &owner, &plan.resumable).await?;
        Ok(Some(Planned {
            owner,
            first_event: last_event - plan.committing.len() as i64,
            plan,
        }))
    }

    /// Applies `update` to the user document `filter` finds, in `s`: the
    /// document as it leaves it (`None`: none matched).
    pub(super) async fn update_counts_in(
        &self,
        s: &mut ClientSession,
        filter: Document,
        update: Document,
    ) -> MetaResult<Option<UserQuota>> {
        self.db
            .collection::<UserQuota>("users")
            .find_one_and_update(filter, update)
            .projection(UserQuota::projection())
            .return_document(ReturnDocument::After)
            .session(&mut *s)
            .await
            .map_err(classify)
    }

    /// The writes of `planned` groups after their users' (see
    /// [`Self::plan_group_in`]), all in one command per collection.
    async fn write_groups_in(
        &self,
        s: &mut ClientSession,
        planned: &[Planned<'_>],
    ) -> MetaResult<()> {
        let committing = || planned.iter().flat_map(|p| p.plan.committing.iter());
        if committing().next().is_none() {
            return Ok(());
        }
        self.files()
            .insert_many(committing().map(|c| &c.file))
            .session(&mut *s)
            .await
            .map_err(|e| match planned {
                [_] => classify(e).met_own_file(),
                // Whose earlier attempt's file is there is not known here:
                // `Duplicate` fails them all, and the one it is learns it
                // committing alone.
                _ => classify(e),
            })?;
        // One event per file, numbered in its group's order.
        let created = planned.iter().flat_map(|p| {
            let drafts = p.plan.committing.iter();
            let drafts = drafts.map(|c| EventDraft::file_created(&c.file));
            events::number(p.owner, p.first_event, drafts.collect())
        });
        self.events()
            .insert_many(created.collect::<Vec<_>>())
            .session(&mut *s)
            .await
            .map_err(classify)?;
        self.permissions()
            .insert_many(committing().map(|c| PermissionRecord::owner_of(&c.file)))
            .session(&mut *s)
            .await
            .map_err(classify)?;
        let keys: Vec<&IdempotencyRecord> = planned.iter().flat_map(|p| &p.plan.keys).collect();
        if !keys.is_empty() {
            self.idempotency()
                .insert_many(keys)
                .session(&mut *s)
                .await
                .map_err(classify)?;
        }
        let ids: Vec<FileId> = committing().map(|c| c.file.id).collect();
        let owners: Vec<UserId> = planned.iter().map(|p| p.owner).collect();
        let removed = self
            .intents()
            .delete_many(doc! {"_id": {"$in": &ids}, "user_id": {"$in": &owners}})
            .session(&mut *s)
            .await
            .map_err(classify)?;
        if removed.deleted_count != ids.len() as u64 {
            return Err(MetaError::IntentGone);
        }
        Ok(())
    }
}
