//! Files in the embedded store.

use std::collections::HashMap;

use async_trait::async_trait;
use serde_json::Value;

use super::{
    EmbeddedStore, apply_fence,
    containers::set_member,
    events::emit,
    file_key, owned_page, owner_index, resumable,
    txn::{Txn, other},
    user_key,
};
use crate::{
    meta::{
        CommitOutcome, CommitUpload, DeletedFile, EventDraft, Fence, FileRecord, FileRepo,
        IdempotencyRecord, IntentRecord, MetaError, MetaResult, OpenLimits, OrphanRecord,
        PermissionRecord, UserRecord, group,
    },
    vocab::{FileId, Filename, IdempotencyKey, UserId},
};

/// Deletes the owner's file inside `tx` (see [`FileRepo::delete_file`]);
/// `emit`: with its `file.deleted` event (a user's deletion removes their
/// files without one).
pub(super) fn delete_file_in(
    tx: &mut Txn,
    owner: UserId,
    id: FileId,
    (fence, emit_deleted): (Option<&Fence>, bool),
) -> MetaResult<Option<DeletedFile>> {
    let Some(file) = tx
        .get::<FileRecord>(&file_key(&id))?
        .filter(|f| f.owner_id == owner)
    else {
        return Ok(None);
    };
    let ukey = user_key(&owner);
    let mut user: UserRecord = tx.get(&ukey)?.ok_or(MetaError::NotFound)?;
    apply_fence(&mut user, fence)?;
    user.file_count -= 1;
    user.used_bytes -= file.size;
    if emit_deleted {
        emit(tx, &mut user, vec![EventDraft::file_deleted(&file)])?;
    }
    tx.put(&ukey, &user)?;
    let sessions = file.sessions.iter().map(ToString::to_string);
    let agents = file.agents.iter().map(ToString::to_string);
    let attached: [(&str, Vec<String>); 2] = [
        ("sessions", sessions.collect()),
        ("agents", agents.collect()),
    ];
    for (collection, ids) in &attached {
        for cid in ids {
            let key = format!("{collection}/{cid}");
            if let Some(mut doc) = tx.get::<Value>(&key)? {
                set_member(&mut doc, "file_ids", &id.to_string(), false);
                tx.put(&key, &doc)?;
            }
        }
    }
    tx.delete(&file_key(&id));
    tx.delete(&format!("{}{}", owner_index("files", owner), id));
    tx.delete(&format!("permissions/{id}:{owner}"));
    // The key that created the file is free again.
    if let Some(key_id) = tx.get::<String>(&key_of_file(&id))? {
        tx.delete(&format!("idempotency/{key_id}"));
        tx.delete(&key_of_file(&id));
    }
    let orphan = OrphanRecord::pending_for(&file);
    tx.insert(&format!("orphans/{}", orphan.id), &orphan)?;
    Ok(Some(DeletedFile {
        file,
        orphan_id: orphan.id,
    }))
}

#[async_trait]
impl FileRepo for EmbeddedStore {
    async fn commit_upload(&self, commit: &CommitUpload) -> MetaResult<CommitOutcome> {
        let c = commit.clone();
        self.transaction(move |tx| {
            let file = &c.file;
            if let Some(k) = &c.idempotency {
                let id = IdempotencyRecord::id_for(&file.owner_id, &k.key);
                let ikey = format!("idempotency/{id}");
                if let Some(first) = tx.get::<IdempotencyRecord>(&ikey)? {
                    return Ok(CommitOutcome::Replayed(Box::new(first)));
                }
                tx.put(&key_of_file(&file.id), &id)?;
                tx.put(
                    &ikey,
                    &IdempotencyRecord {
                        id,
                        file: file.clone(),
                        fingerprint: k.fingerprint.clone(),
                        created_at: crate::meta::now(),
                    },
                )?;
            }
            let ukey = user_key(&file.owner_id);
            let mut user: UserRecord = tx.get(&ukey)?.ok_or(MetaError::NotFound)?;
            apply_fence(&mut user, c.fence.as_ref())?;
            if c.resumable {
                // The file's bytes take the place of its upload's reservation.
                resumable::release(tx, &mut user, &file.id, c.state.as_deref())?;
            }
            // The user's own quota, else the default the commit carries.
            OpenLimits::check_quota(c.quota_bytes, &user, file.size)?;
            user.used_bytes += file.size;
            user.file_count += 1;
            emit(tx, &mut user, vec![EventDraft::file_created(file)])?;
            tx.put(&ukey, &user)?;
            insert_file(tx, file)?;
            Ok(CommitOutcome::Committed)
        })
        .await
    }

    async fn commit_uploads(
        &self,
        group: &[CommitUpload],
    ) -> MetaResult<Vec<MetaResult<CommitOutcome>>> {
        let group = group.to_vec();
        self.transaction(move |tx| {
            let Some(owner) = group.first().map(|c| c.file.owner_id) else {
                return Ok(Vec::new());
            };
            let mut recorded = HashMap::new();
            for id in group::idempotency_ids(&group) {
                if let Some(first) = tx.get::<IdempotencyRecord>(&format!("idempotency/{id}"))? {
                    recorded.insert(id, first);
                }
            }
            let ukey = user_key(&owner);
            let mut user: UserRecord = tx.get(&ukey)?.ok_or(MetaError::NotFound)?;
            for f in group::fences(&group)? {
                apply_fence(&mut user, Some(f))?;
            }
            OpenLimits::may_write(&user)?;
            let mut held = HashMap::new();
            for c in group.iter().filter(|c| c.resumable) {
                if let Some(h) = resumable::held(tx, &c.file.id, c.state.as_deref())? {
                    held.insert(c.file.id, h);
                }
            }
            let plan = group::plan(
                &group,
                user.counted_bytes(),
                user.quota_bytes,
                recorded,
                &held,
            );
            user.used_bytes += plan.bytes;
            for id in &plan.resumable {
                resumable::release(tx, &mut user, id, None)?;
            }
            user.file_count += plan.committing.len() as i64;
            // One event per file, numbered in the group's order.
            let created = plan
                .committing
                .iter()
                .map(|c| EventDraft::file_created(&c.file));
            emit(tx, &mut user, created.collect())?;
            tx.put(&ukey, &user)?;
            for record in &plan.keys {
                tx.put(&format!("idempotency/{}", record.id), record)?;
                tx.put(&key_of_file(&record.file.id), &record.id)?;
            }
            for c in &plan.committing {
                insert_file(tx, &c.file)?;
            }
            Ok(plan.outcomes)
        })
        .await
    }

    async fn idempotency_record(
        &self,
        user_id: &UserId,
        key: &IdempotencyKey,
    ) -> MetaResult<Option<IdempotencyRecord>> {
        let key = format!("idempotency/{}", IdempotencyRecord::id_for(user_id, key));
        self.transaction(move |tx| tx.get::<IdempotencyRecord>(&key))
            .await
    }

    async fn file(&self, owner_id: &UserId, file_id: &FileId) -> MetaResult<Option<FileRecord>> {
        let (owner, key) = (*owner_id, file_key(file_id));
        self.transaction(move |tx| Ok(tx.get::<FileRecord>(&key)?.filter(|f| f.owner_id == owner)))
            .await
    }

    async fn list_files(
        &self,
        owner_id: &UserId,
        after: Option<&FileId>,
        limit: usize,
    ) -> MetaResult<Vec<FileRecord>> {
        let (owner, after) = (*owner_id, after.copied());
        self.transaction(move |tx| {
            let after = after.as_ref().map(|a| a as &dyn std::fmt::Display);
            owned_page(tx, "files", &owner, after, limit)
        })
        .await
    }

    async fn delete_file(
        &self,
        owner_id: &UserId,
        file_id: &FileId,
        fence: Option<&Fence>,
    ) -> MetaResult<Option<DeletedFile>> {
        let (owner, id, fence) = (*owner_id, *file_id, fence.cloned());
        self.transaction(move |tx| delete_file_in(tx, owner, id, (fence.as_ref(), true)))
            .await
    }

    async fn rename_file(
        &self,
        owner_id: &UserId,
        file_id: &FileId,
        filename: &Filename,
        fence: Option<&Fence>,
    ) -> MetaResult<Option<FileRecord>> {
        let (owner, fkey) = (*owner_id, file_key(file_id));
        let (filename, fence) = (filename.as_str().to_owned(), fence.cloned());
        self.transaction(move |tx| {
            // As a document, so that whatever else the file holds is kept.
            let mine = |f: &Value| f["owner_id"] == owner.to_string().as_str();
            let Some(mut file) = tx.get::<Value>(&fkey)?.filter(mine) else {
                return Ok(None);
            };
            file["filename"] = Value::from(filename);
            tx.put(&fkey, &file)?;
            let renamed: FileRecord = serde_json::from_value(file).map_err(other)?;
            let ukey = user_key(&owner);
            let mut user: UserRecord = tx.get(&ukey)?.ok_or(MetaError::NotFound)?;
            apply_fence(&mut user, fence.as_ref())?;
            emit(tx, &mut user, vec![EventDraft::file_renamed(&renamed)])?;
            tx.put(&ukey, &user)?;
            Ok(Some(renamed))
        })
        .await
    }

    async fn all_files(&self, after: Option<&FileId>, limit: usize) -> MetaResult<Vec<FileRecord>> {
        let after = after.map(ToString::to_string);
        self.transaction(move |tx| {
            let keys = tx.keys("files/", after.as_deref(), limit)?;
            let mut files = Vec::with_capacity(keys.len());
            for k in keys {
                if let Some(f) = tx.get(&k)? {
                    files.push(f);
                }
            }
            Ok(files)
        })
        .await
    }
}

/// Where the idempotency key that created a file is named, so that its
/// delete can free the key.
fn key_of_file(file_id: &FileId) -> String {
    format!("idempotency_by_file/{file_id}")
}

/// Inserts a committed upload's file, its owner index entry and its owner
/// permission, and deletes its intent (`IntentGone` if it was swept).
fn insert_file(tx: &mut Txn, file: &FileRecord) -> MetaResult<()> {
    tx.insert(&file_key(&file.id), file)
        .map_err(MetaError::met_own_file)?;
    tx.put(
        &format!("{}{}", owner_index("files", file.owner_id), file.id),
        &(),
    )?;
    let perm = PermissionRecord::owner_of(file);
    tx.insert(&format!("permissions/{}", perm.id), &perm)?;
    let intent_key = format!("intents/{}", file.id);
    if tx.get::<IntentRecord>(&intent_key)?.is_none() {
        return Err(MetaError::IntentGone);
    }
    tx.delete(&intent_key);
    Ok(())
}
