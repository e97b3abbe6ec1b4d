//! Resumable uploads (tus 1.0): create, report the offset, append
//! (`patch.rs`), terminate. The bytes go to the blob store's resumable path
//! in parts; the state (offset, part tags, hash state, expiry) is in the
//! metadata store, so any instance continues any upload. The last PATCH
//! commits through [`UploadService::commit_stored`], exactly as a plain
//! upload does (category lock, fence, quota, idempotency, intent).

mod finish;
mod hash;
mod patch;

use std::sync::Arc;

pub use self::hash::{CHECKSUM_ALGORITHMS, Checksum};
pub use self::patch::Patched;
use super::{DomainError, FileId, Filename, UserId, upload::UploadService};
use crate::{
    blob::resumable::ResumableBlobs,
    lock::{LockGuard, LockKey, Locks, TryLock},
    meta::{CleanupRepo, IntentRecord, ResumableRecord, ResumableRepo, UserRecord},
};

/// The resumable-upload flow and the ports it uses.
pub struct ResumableService {
    pub(crate) uploads: Arc<UploadService>,
    pub(crate) resumables: Arc<dyn ResumableRepo>,
    pub(crate) cleanup: Arc<dyn CleanupRepo>,
    pub(crate) blobs: Arc<dyn ResumableBlobs>,
    pub(crate) locks: Arc<Locks>,
}

/// A resumable upload as the HTTP layer hands it over (`POST`).
pub struct NewResumable {
    pub length: u64,
    pub filename: Filename,
    pub content_type: String,
    /// The raw `Upload-Metadata`, echoed by `HEAD`.
    pub metadata: String,
}

impl ResumableService {
    /// Creates the upload: its intent first (so that the sweeper can find
    /// it), then the blob store's write, then the state.
    pub async fn create(
        &self,
        user: &UserRecord,
        new: NewResumable,
    ) -> Result<ResumableRecord, DomainError> {
        let settings = &self.uploads.settings;
        if new.length > settings.max_upload_bytes {
            return Err(DomainError::PayloadTooLarge(settings.max_upload_bytes));
        }
        self.uploads
            .check_declared_quota(user, Some(new.length))
            .await?;
        let user_id = UserId::parse(&user.id)
            .ok_or_else(|| DomainError::internal(anyhow::anyhow!("bad user id")))?;
        let file_id = FileId::new();
        let now = crate::meta::now();
        let intent = IntentRecord {
            id: file_id.to_string(),
            user_id: user.id.clone(),
            bucket: self.uploads.blobs.bucket().to_owned(),
            key: format!("files/{user_id}/{file_id}"),
            created_at: now,
            refreshed_at: None,
        };
        self.cleanup.put_intent(&intent).await?;
        // A crash from here until the state is stored leaves an empty
        // multipart upload that nothing names (S3's lifecycle rule for
        // incomplete uploads is the backstop); the intent is swept.
        let handle = match self.blobs.start(&intent.key).await {
            Ok(h) => h,
            Err(e) => {
                let _ = self.cleanup.delete_intent(&intent.id).await;
                return Err(e.into());
            }
        };
        let record = ResumableRecord {
            id: intent.id.clone(),
            user_id: user.id.clone(),
            key: intent.key.clone(),
            handle,
            length: new.length as i64,
            offset: 0,
            part_size: self.blobs.part_size() as i64,
            parts: Vec::new(),
            sha256_state: hash::fresh_state(),
            completed: false,
            filename: new.filename.as_str().to_owned(),
            content_type: new.content_type,
            metadata: new.metadata,
            created_at: now,
            expires_at: now + self.expiry(),
        };
        if let Err(e) = self.resumables.insert_resumable(&record).await {
            let _ = self.blobs.abort(&record.key, &record.handle).await;
            let _ = self.cleanup.delete_intent(&intent.id).await;
            return Err(e.into());
        }
        Ok(record)
    }

    /// The upload, if `user` owns it and it has not expired.
    pub async fn find(&self, user: &UserRecord, id: &str) -> Result<ResumableRecord, DomainError> {
        match self.resumables.resumable(id).await? {
            Some(r) if r.user_id == user.id && r.expires_at > crate::meta::now() => Ok(r),
            _ => Err(DomainError::NotFound),
        }
    }

    /// Ends the upload: the blob store's write, its intent and its state go
    /// (and the completed object of one whose commit failed).
    pub async fn terminate(&self, user: &UserRecord, id: &str) -> Result<(), DomainError> {
        self.find(user, id).await?;
        let guard = self.lock(id).await?;
        let result = async {
            // Read again under the lock: a last PATCH may have finished it.
            let record = self.find(user, id).await?;
            if !record.all_stored() {
                self.blobs.abort(&record.key, &record.handle).await?;
                self.cleanup.delete_intent(id).await?;
                self.resumables.delete_resumable(id).await?;
                return Ok(());
            }
            // Every byte stored, the commit failed (or is unknown): a file
            // committed since is the user's now; else the object goes too.
            if self.uploads.files.file(&user.id, id).await?.is_some() {
                self.resumables.delete_resumable(id).await?;
                return Err(DomainError::NotFound);
            }
            match self.cleanup.intent(id).await? {
                Some(intent) => self.discard(&record, &intent).await?,
                // Swept: the sweeper has the blob.
                None => self.resumables.delete_resumable(id).await?,
            }
            Ok(())
        }
        .await;
        release(guard).await;
        result
    }

    /// The upload's lock, without waiting: a second writer gets `UploadLocked`.
    async fn lock(&self, id: &str) -> Result<Option<LockGuard>, DomainError> {
        match self.locks.try_acquire(&LockKey::resumable(id)).await? {
            TryLock::Held(g) => Ok(Some(g)),
            // Development without the lock backend: the conditional update
            // on the offset still lets only one of two PATCHes count.
            TryLock::Degraded => Ok(None),
            TryLock::Busy => Err(DomainError::UploadLocked),
        }
    }

    fn expiry(&self) -> chrono::Duration {
        chrono::Duration::from_std(self.uploads.settings.tus_expiry)
            .unwrap_or_else(|_| chrono::Duration::days(1))
    }
}

async fn release(guard: Option<LockGuard>) {
    if let Some(g) = guard {
        g.release().await;
    }
}
