//! Files on MongoDB: the upload commit and the delete, each one transaction.

use super::*;

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
                .find_one(doc! {"_id": &id})
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
        let mut filter = doc! {"_id": &file.owner_id};
        if let Some(quota) = c.quota_bytes {
            filter.insert("used_bytes", doc! {"$lte": quota as i64 - file.size});
        }
        let mut update = doc! {"$push": {"file_ids": &file.id}, "$inc": {"used_bytes": file.size}};
        add_fence(&mut filter, &mut update, "upload_fence", c.fence.as_ref());
        let updated = self
            .users()
            .update_one(filter, update)
            .session(&mut *s)
            .await
            .map_err(classify)?;
        if updated.matched_count == 0 {
            return Err(self
                .why_user_unmatched(s, &file.owner_id, c.fence.as_ref())
                .await);
        }
        self.files()
            .insert_one(file)
            .session(&mut *s)
            .await
            .map_err(classify)?;
        let perm = PermissionRecord {
            id: format!("{}:{}", file.id, file.owner_id),
            file_id: file.id.clone(),
            user_id: file.owner_id.clone(),
            role: "owner".into(),
        };
        self.permissions()
            .insert_one(&perm)
            .session(&mut *s)
            .await
            .map_err(classify)?;
        let removed = self
            .intents()
            .delete_one(doc! {"_id": &file.id})
            .session(&mut *s)
            .await
            .map_err(classify)?;
        if removed.deleted_count == 0 {
            return Err(MetaError::IntentGone);
        }
        Ok(CommitOutcome::Committed)
    }

    /// Why a conditional update of the user document matched nothing.
    async fn why_user_unmatched(
        &self,
        s: &mut ClientSession,
        user_id: &str,
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
                _ => MetaError::QuotaExceeded,
            },
            Err(e) => classify(e),
        }
    }

    async fn delete_file_in(
        &self,
        s: &mut ClientSession,
        owner: &str,
        id: &str,
        fence: Option<&Fence>,
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
        let mut filter = doc! {"_id": owner};
        let mut update = doc! {"$pull": {"file_ids": id}, "$inc": {"used_bytes": -file.size}};
        add_fence(&mut filter, &mut update, "upload_fence", fence);
        let updated = self
            .users()
            .update_one(filter, update)
            .session(&mut *s)
            .await
            .map_err(classify)?;
        if updated.matched_count == 0 {
            return Err(self.why_user_unmatched(s, owner, fence).await);
        }
        for (collection, ids) in [("sessions", &file.sessions), ("agents", &file.agents)] {
            if !ids.is_empty() {
                self.db
                    .collection::<Document>(collection)
                    .update_many(doc! {"_id": {"$in": ids}}, doc! {"$pull": {"file_ids": id}})
                    .session(&mut *s)
                    .await
                    .map_err(classify)?;
            }
        }
        self.files()
            .delete_one(doc! {"_id": id})
            .session(&mut *s)
            .await
            .map_err(classify)?;
        self.permissions()
            .delete_many(doc! {"file_id": id})
            .session(&mut *s)
            .await
            .map_err(classify)?;
        // The key that created the file is free again.
        self.idempotency()
            .delete_many(doc! {"file._id": id})
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
        owner: &str,
        id: &str,
        filename: &str,
        fence: Option<&Fence>,
    ) -> MetaResult<Option<FileRecord>> {
        if fence.is_some() {
            let (mut filter, mut update) = (doc! {"_id": owner}, Document::new());
            add_fence(&mut filter, &mut update, "upload_fence", fence);
            let updated = self
                .users()
                .update_one(filter, update)
                .session(&mut *s)
                .await
                .map_err(classify)?;
            if updated.matched_count == 0 {
                return Err(self.why_user_unmatched(s, owner, fence).await);
            }
        }
        let owned = doc! {"_id": id, "owner_id": owner};
        let updated = self
            .files()
            .update_one(owned.clone(), doc! {"$set": {"filename": filename}})
            .session(&mut *s)
            .await
            .map_err(classify)?;
        if updated.matched_count == 0 {
            return Ok(None);
        }
        self.files()
            .find_one(owned)
            .session(&mut *s)
            .await
            .map_err(classify)
    }
}

#[async_trait]
impl FileRepo for MongoStore {
    async fn commit_upload(&self, commit: &CommitUpload) -> MetaResult<CommitOutcome> {
        let mut s = self.begin(commit.fence.as_ref()).await?;
        let result = self.commit_upload_in(&mut s, commit).await;
        self.finish(s, commit.fence.as_ref(), result).await
    }

    async fn idempotency_record(
        &self,
        user_id: &str,
        key: &str,
    ) -> MetaResult<Option<IdempotencyRecord>> {
        let id = IdempotencyRecord::id_for(user_id, key);
        self.idempotency()
            .find_one(doc! {"_id": id})
            .await
            .map_err(classify)
    }

    async fn file(&self, owner_id: &str, file_id: &str) -> MetaResult<Option<FileRecord>> {
        self.files()
            .find_one(doc! {"_id": file_id, "owner_id": owner_id})
            .await
            .map_err(classify)
    }

    async fn list_files(
        &self,
        owner_id: &str,
        after: Option<&str>,
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
        owner_id: &str,
        file_id: &str,
        fence: Option<&Fence>,
    ) -> MetaResult<Option<DeletedFile>> {
        let mut s = self.begin(fence).await?;
        let result = self.delete_file_in(&mut s, owner_id, file_id, fence).await;
        self.finish(s, fence, result).await
    }

    async fn rename_file(
        &self,
        owner_id: &str,
        file_id: &str,
        filename: &str,
        fence: Option<&Fence>,
    ) -> MetaResult<Option<FileRecord>> {
        let mut s = self.begin(fence).await?;
        let result = self
            .rename_file_in(&mut s, owner_id, file_id, filename, fence)
            .await;
        self.finish(s, fence, result).await
    }

    async fn all_files(&self, after: Option<&str>, limit: usize) -> MetaResult<Vec<FileRecord>> {
        let filter = match after {
            Some(a) => doc! {"_id": {"$gt": a}},
            None => doc! {},
        };
        find_sorted(self.files(), filter, doc! {"_id": 1}, limit).await
    }
}
