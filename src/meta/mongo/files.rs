//! Files on MongoDB: the upload commit and the delete, each one transaction.

use std::collections::HashMap;

use async_trait::async_trait;
use bson::{Bson, Document, doc};
use mongodb::{ClientSession, options::ReturnDocument};

use super::{
    MongoStore,
    errors::classify,
    events::EventSeq,
    find_sorted, owned_after,
    txn::{add_fence, add_fences},
};
use crate::{
    meta::{
        CommitOutcome, CommitUpload, DeletedFile, EventDraft, Fence, FileRecord, FileRepo,
        IdempotencyRecord, MetaError, MetaResult, OrphanRecord, Outcomes, PermissionRecord, events,
        group,
    },
    vocab::{FileId, Filename, IdempotencyKey, UserId},
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

/// The part of a user document a commit decides on.
#[derive(serde::Deserialize)]
struct UserQuota {
    used_bytes: i64,
    #[serde(default)]
    reserved_bytes: i64,
    #[serde(default)]
    quota_bytes: Option<i64>,
    /// The number of the user's last event.
    #[serde(default)]
    event_seq: i64,
}

impl UserQuota {
    /// What counts against the quota: the bytes stored and the bytes reserved.
    fn counted(&self) -> i64 {
        self.used_bytes + self.reserved_bytes
    }

    /// The fields it reads.
    fn projection() -> Document {
        doc! {"used_bytes": 1, "reserved_bytes": 1, "quota_bytes": 1, "event_seq": 1}
    }
}

impl MongoStore {
    async fn commit_upload_in(
        &self,
        s: &mut ClientSession,
        c: &CommitUpload,
    ) -> MetaResult<CommitOutcome> {
        let file = &c.file;
        if let Some(k) = &c.idempotency {
            let id = IdempotencyRecord::id_for(&file.owner_id, &k.key);
            if let Some(first) = self
                .idempotency()
                .find_one(doc! {"_id": &id, "file.owner_id": file.owner_id})
                .session(&mut *s)
                .await
                .map_err(classify)?
            {
                return Ok(CommitOutcome::Replayed(Box::new(first)));
            }
            let record = IdempotencyRecord {
                id,
                file: file.clone(),
                fingerprint: k.fingerprint.clone(),
                created_at: crate::meta::now(),
            };
            self.idempotency()
                .insert_one(&record)
                .session(&mut *s)
                .await
                .map_err(classify)?;
        }
        let mut inc = doc! {"used_bytes": file.size, "file_count": 1_i64, "event_seq": 1_i64};
        // The file's bytes take the place of its upload's reservation.
        if c.resumable {
            let state = c.state.as_deref();
            let freed = self.release_in(s, &file.owner_id, &file.id, state).await?;
            inc.insert("reserved_bytes", -freed.reserved);
            inc.insert("open_uploads", -i64::from(freed.open));
        }
        // A user being deleted commits nothing (`deleting_since` unset).
        let mut filter = doc! {"_id": &file.owner_id, "deleting_since": null};
        let mut update = doc! {"$inc": inc};
        add_fence(&mut filter, &mut update, "upload_fence", c.fence.as_ref());
        // The quota is decided on the user document as this transaction
        // wrote it (its stored and reserved bytes, the file's in place of
        // its upload's reservation; the user's own quota, else the
        // default): a quota change committed since the transaction began
        // makes this write a write conflict, so no upload commits past a
        // quota lowered meanwhile. Past the quota, the error aborts the
        // transaction and its write.
        let Some(user) = self
            .db
            .collection::<UserQuota>("users")
            .find_one_and_update(filter, update)
            .projection(UserQuota::projection())
            .return_document(ReturnDocument::After)
            .session(&mut *s)
            .await
            .map_err(classify)?
        else {
            return Err(self
                .why_user_unmatched(s, &file.owner_id, c.fence.as_ref())
                .await);
        };
        if group::effective_quota(user.quota_bytes, c.quota_bytes)
            .is_some_and(|q| user.counted().max(0) as u64 > q)
        {
            return Err(MetaError::QuotaExceeded);
        }
        self.files()
            .insert_one(file)
            .session(&mut *s)
            .await
            .map_err(|e| classify(e).met_own_file())?;
        let created = EventDraft::file_created(file);
        self.insert_events(s, file.owner_id, user.event_seq - 1, vec![created])
            .await?;
        self.permissions()
            .insert_one(PermissionRecord::owner_of(file))
            .session(&mut *s)
            .await
            .map_err(classify)?;
        let removed = self
            .intents()
            .delete_one(doc! {"_id": &file.id, "user_id": file.owner_id})
            .session(&mut *s)
            .await
            .map_err(classify)?;
        if removed.deleted_count == 0 {
            return Err(MetaError::IntentGone);
        }
        Ok(CommitOutcome::Committed)
    }

    /// A group commit (see [`FileRepo::commit_uploads`]): the user's
    /// document written once (twice where the quota leaves some out), files,
    /// permissions, idempotency records and intents in one `insert_many` /
    /// `delete_many` each.
    async fn commit_uploads_in(
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

    /// Several users' group commits (see [`FileRepo::commit_upload_groups`]):
    /// each user's document written as one group's is, and
    /// then the files, events, permissions, idempotency records and intents
    /// of all the groups in one `insert_many` / `delete_many` each.
    async fn commit_upload_groups_in(
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
        if plan.committing.len() != guess.committing.len() {
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
    async fn update_counts_in(
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

    /// Applies `update` to the user document under the upload fence (the
    /// fence's token stored with it), with `event` (the change's event) numbered
    /// and inserted after it; a refusal says why.
    async fn update_user_fenced(
        &self,
        s: &mut ClientSession,
        owner: &UserId,
        mut update: Document,
        fence: Option<&Fence>,
        event: Option<EventDraft>,
    ) -> MetaResult<()> {
        let mut filter = doc! {"_id": owner};
        if event.is_some() {
            let inc = update.entry("$inc".to_owned()).or_insert(doc! {}.into());
            if let Bson::Document(inc) = inc {
                inc.insert("event_seq", 1_i64);
            }
        }
        add_fence(&mut filter, &mut update, "upload_fence", fence);
        let updated = self
            .db
            .collection::<EventSeq>("users")
            .find_one_and_update(filter, update)
            .projection(doc! {"event_seq": 1})
            .return_document(ReturnDocument::After)
            .session(&mut *s)
            .await
            .map_err(classify)?;
        let Some(user) = updated else {
            return Err(self.why_user_unmatched(s, owner, fence).await);
        };
        if let Some(event) = event {
            self.insert_events(s, *owner, user.event_seq - 1, vec![event])
                .await?;
        }
        Ok(())
    }

    /// Why a conditional update of the user document matched nothing.
    async fn why_user_unmatched(
        &self,
        s: &mut ClientSession,
        user_id: &UserId,
        fence: Option<&Fence>,
    ) -> MetaError {
        match self
            .users()
            .find_one(doc! {"_id": user_id})
            .session(&mut *s)
            .await
        {
            Ok(None) => MetaError::NotFound,
            Ok(Some(u)) => match fence {
                Some(f) if u.upload_fence.get(&f.slot).is_some_and(|t| *t > f.token) => {
                    MetaError::StaleFence
                }
                _ if u.deleting_since.is_some() => MetaError::UserDeleting,
                _ => MetaError::QuotaExceeded,
            },
            Err(e) => classify(e),
        }
    }

    /// Deletes the owner's file in `s`; `emit`: with its `file.deleted`
    /// event (a user's deletion removes their files without one).
    pub(super) async fn delete_file_in(
        &self,
        s: &mut ClientSession,
        owner: &UserId,
        id: &FileId,
        (fence, emit): (Option<&Fence>, bool),
    ) -> MetaResult<Option<DeletedFile>> {
        let Some(file) = self
            .files()
            .find_one(doc! {"_id": id, "owner_id": owner})
            .session(&mut *s)
            .await
            .map_err(classify)?
        else {
            return Ok(None);
        };
        let update = doc! {"$inc": {"used_bytes": -file.size, "file_count": -1_i64}};
        let event = emit.then(|| EventDraft::file_deleted(&file));
        self.update_user_fenced(s, owner, update, fence, event)
            .await?;
        let attached: [(&str, Bson); 2] = [
            ("sessions", file.sessions.clone().into()),
            ("agents", file.agents.clone().into()),
        ];
        // The containers it is in are its owner's (an attach takes only
        // the owner's files into the owner's containers).
        for (collection, ids) in attached {
            if ids.as_array().is_some_and(|a| !a.is_empty()) {
                let filter = doc! {"_id": {"$in": ids}, "owner_id": owner};
                self.db
                    .collection::<Document>(collection)
                    .update_many(filter, doc! {"$pull": {"file_ids": id}})
                    .session(&mut *s)
                    .await
                    .map_err(classify)?;
            }
        }
        self.files()
            .delete_one(doc! {"_id": id, "owner_id": owner})
            .session(&mut *s)
            .await
            .map_err(classify)?;
        // Its only permission is its owner's (`PermissionRecord::owner_of`).
        self.permissions()
            .delete_many(doc! {"file_id": id, "user_id": owner})
            .session(&mut *s)
            .await
            .map_err(classify)?;
        // The key that created the file is free again.
        self.idempotency()
            .delete_many(doc! {"file._id": id, "file.owner_id": owner})
            .session(&mut *s)
            .await
            .map_err(classify)?;
        let orphan = OrphanRecord::pending_for(&file);
        self.orphans()
            .insert_one(&orphan)
            .session(&mut *s)
            .await
            .map_err(classify)?;
        Ok(Some(DeletedFile {
            file,
            orphan_id: orphan.id,
        }))
    }
}

impl MongoStore {
    async fn rename_file_in(
        &self,
        s: &mut ClientSession,
        owner: &UserId,
        id: &FileId,
        filename: &Filename,
        fence: Option<&Fence>,
    ) -> MetaResult<Option<FileRecord>> {
        let Some(file) = self
            .files()
            .find_one_and_update(
                doc! {"_id": id, "owner_id": owner},
                doc! {"$set": {"filename": filename.as_str()}},
            )
            .return_document(ReturnDocument::After)
            .session(&mut *s)
            .await
            .map_err(classify)?
        else {
            return Ok(None);
        };
        let event = EventDraft::file_renamed(&file);
        self.update_user_fenced(s, owner, Document::new(), fence, Some(event))
            .await?;
        Ok(Some(file))
    }
}

#[async_trait]
impl FileRepo for MongoStore {
    async fn commit_upload(&self, commit: &CommitUpload) -> MetaResult<CommitOutcome> {
        let mut s = self.txns.begin(commit.fence.as_ref()).await?;
        let result = self.commit_upload_in(&mut s, commit).await;
        self.txns.finish(s, commit.fence.as_ref(), result).await
    }

    async fn commit_uploads(
        &self,
        group: &[CommitUpload],
    ) -> MetaResult<Vec<MetaResult<CommitOutcome>>> {
        // Upload fences are never pinned (see `Fence::pinned`).
        let mut s = self.txns.begin(None).await?;
        let result = self.commit_uploads_in(&mut s, group).await;
        self.txns.finish(s, None, result).await
    }

    async fn commit_upload_groups(
        &self,
        groups: &[Vec<CommitUpload>],
    ) -> MetaResult<Vec<Outcomes>> {
        // Upload fences are never pinned (see `Fence::pinned`).
        let mut s = self.txns.begin(None).await?;
        let result = self.commit_upload_groups_in(&mut s, groups).await;
        self.txns.finish(s, None, result).await
    }

    async fn idempotency_record(
        &self,
        user_id: &UserId,
        key: &IdempotencyKey,
    ) -> MetaResult<Option<IdempotencyRecord>> {
        let id = IdempotencyRecord::id_for(user_id, key);
        self.idempotency()
            .find_one(doc! {"_id": id, "file.owner_id": user_id})
            .await
            .map_err(classify)
    }

    async fn file(&self, owner_id: &UserId, file_id: &FileId) -> MetaResult<Option<FileRecord>> {
        self.files()
            .find_one(doc! {"_id": file_id, "owner_id": owner_id})
            .await
            .map_err(classify)
    }

    async fn list_files(
        &self,
        owner_id: &UserId,
        after: Option<&FileId>,
        limit: usize,
    ) -> MetaResult<Vec<FileRecord>> {
        find_sorted(
            self.files(),
            owned_after(owner_id, after),
            doc! {"_id": 1},
            limit,
        )
        .await
    }

    async fn delete_file(
        &self,
        owner_id: &UserId,
        file_id: &FileId,
        fence: Option<&Fence>,
    ) -> MetaResult<Option<DeletedFile>> {
        let mut s = self.txns.begin(fence).await?;
        let result = self
            .delete_file_in(&mut s, owner_id, file_id, (fence, true))
            .await;
        self.txns.finish(s, fence, result).await
    }

    async fn rename_file(
        &self,
        owner_id: &UserId,
        file_id: &FileId,
        filename: &Filename,
        fence: Option<&Fence>,
    ) -> MetaResult<Option<FileRecord>> {
        let mut s = self.txns.begin(fence).await?;
        let result = self
            .rename_file_in(&mut s, owner_id, file_id, filename, fence)
            .await;
        self.txns.finish(s, fence, result).await
    }

    async fn all_files(&self, after: Option<&FileId>, limit: usize) -> MetaResult<Vec<FileRecord>> {
        let filter = match after {
            Some(a) => doc! {"_id": {"$gt": a}},
            None => doc! {},
        };
        find_sorted(self.files(), filter, doc! {"_id": 1}, limit).await
    }
}
