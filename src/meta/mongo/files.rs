//! Files on MongoDB: the upload commit and the delete, each one transaction.

use std::collections::HashMap;

use async_trait::async_trait;
use bson::{Bson, Document, doc};
use mongodb::{ClientSession, options::ReturnDocument};

use super::{
    MongoStore,
    batch::Writes,
    errors::classify,
    events::EventSeq,
    find_sorted, owned_after,
    txn::{add_fence, add_fences},
};
use crate::{
    meta::{
        CommitOutcome, CommitUpload, DeletedFile, EventDraft, Fence, FileRecord, FileRepo,
        IdempotencyRecord, MetaError, MetaResult, OrphanRecord, PermissionRecord, group,
    },
    vocab::{FileId, Filename, IdempotencyKey, UserId},
};

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
        // The writes after the user document's, sent together (`batch.rs`).
        let mut writes = Writes::default();
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
            writes.insert(&self.idempotency(), &record)?;
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
        writes.insert_file(&self.files(), file)?;
        let created = EventDraft::file_created(file);
        self.add_events(
            &mut writes,
            file.owner_id,
            user.event_seq - 1,
            vec![created],
        )?;
        writes.insert(&self.permissions(), &PermissionRecord::owner_of(file))?;
        let intent = doc! {"_id": &file.id, "user_id": file.owner_id};
        writes.delete_many(&self.intents(), intent);
        if self.send(s, writes).await? == 0 {
            return Err(MetaError::IntentGone);
        }
        Ok(CommitOutcome::Committed)
    }

    /// A group commit (see [`FileRepo::commit_uploads`]): the user's
    /// document is read (for the quota) and written once, files,
    /// permissions, idempotency records and intents in one `insert_many` /
    /// `delete_many` each.
    async fn commit_uploads_in(
        &self,
        s: &mut ClientSession,
        group: &[CommitUpload],
    ) -> MetaResult<Vec<MetaResult<CommitOutcome>>> {
        let Some(owner) = group.first().map(|c| &c.file.owner_id) else {
            return Ok(Vec::new());
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
        let user = self.quota_of(s, owner).await?;
        let mut held = HashMap::new();
        for c in group.iter().filter(|c| c.resumable) {
            let (id, state) = (c.file.id, c.state.as_deref());
            if let Some(h) = self.held_in(s, owner, &id, state).await? {
                held.insert(id, h);
            }
        }
        let plan = group::plan(group, user.counted(), user.quota_bytes, recorded, &held);
        if plan.committing.is_empty() {
            return Ok(plan.outcomes);
        }
        let ids: Vec<FileId> = plan.committing.iter().map(|c| c.file.id).collect();
        // The quota read above is in this transaction's snapshot: a write of
        // the user document since then makes this update a write conflict.
        let mut filter = doc! {"_id": owner, "deleting_since": null};
        self.mark_released_in(s, owner, &plan.resumable).await?;
        let mut update = doc! {
            "$inc": {
                "used_bytes": plan.bytes,
                "file_count": ids.len() as i64,
                "reserved_bytes": -plan.freed_bytes,
                "open_uploads": -plan.freed_open,
                "event_seq": ids.len() as i64,
            },
        };
        add_fences(&mut filter, &mut update, "upload_fence", &fences);
        let updated = self
            .db
            .collection::<UserQuota>("users")
            .find_one_and_update(filter, update)
            .projection(UserQuota::projection())
            .return_document(ReturnDocument::After)
            .session(&mut *s)
            .await
            .map_err(classify)?;
        let Some(updated) = updated else {
            let mut why = self.why_user_unmatched(s, owner, None).await;
            for f in &fences {
                let stale = self.why_user_unmatched(s, owner, Some(f)).await;
                if matches!(stale, MetaError::StaleFence) {
                    why = stale;
                    break;
                }
            }
            return Err(why);
        };
        // The writes after the user document's, sent together (`batch.rs`).
        let mut writes = Writes::default();
        for c in &plan.committing {
            writes.insert_file(&self.files(), &c.file)?;
        }
        // One event per file, numbered in the group's order.
        let created = plan
            .committing
            .iter()
            .map(|c| EventDraft::file_created(&c.file));
        let first = updated.event_seq - ids.len() as i64;
        self.add_events(&mut writes, *owner, first, created.collect())?;
        for c in &plan.committing {
            writes.insert(&self.permissions(), &PermissionRecord::owner_of(&c.file))?;
        }
        for key in &plan.keys {
            writes.insert(&self.idempotency(), key)?;
        }
        let intents = doc! {"_id": {"$in": &ids}, "user_id": owner};
        writes.delete_many(&self.intents(), intents);
        if self.send(s, writes).await? != ids.len() as u64 {
            return Err(MetaError::IntentGone);
        }
        Ok(plan.outcomes)
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

    /// What a group commit decides the quota on, read in the transaction.
    async fn quota_of(&self, s: &mut ClientSession, id: &UserId) -> MetaResult<UserQuota> {
        self.db
            .collection::<UserQuota>("users")
            .find_one(doc! {"_id": id})
            .projection(UserQuota::projection())
            .session(&mut *s)
            .await
            .map_err(classify)?
            .ok_or(MetaError::NotFound)
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
