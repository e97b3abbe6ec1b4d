//! Resumable uploads (tus 1.0): create, report the offset, append
//! (`patch.rs`), finish (`finish.rs`), terminate. The bytes go to the blob
//! store's resumable write through the one part writer
//! ([`crate::blob::resumable::append`]); the state (offset, part tags, hash
//! state, expiry) is in the metadata store, so any instance continues any
//! upload. The last bytes commit through the [`Committer`], exactly as a
//! plain upload does (category lock, fence, quota, intent), and what a
//! refused or unknown commit leaves is kept for the next PATCH or HEAD.

mod finish;
mod hash;
mod patch;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_answers;

use std::sync::Arc;

pub use self::hash::{CHECKSUM_ALGORITHMS, Checksum};
use super::{
    DomainError, Filename,
    upload::{Admission, Committer},
};
use crate::{
    blob::{BlobError, BlobStore, BodyError, resumable::ResumableBlobs},
    config::{AllowedTypes, Settings},
    lock::{LockError, LockGuard, Locks, TryLock},
    meta::{
        CleanupRepo, FileRecord, FileRepo, MetaError, ResumableRecord, ResumableRepo, UserRecord,
    },
    vocab::{FileId, LockKey},
};

/// The resumable-upload flow and the ports it uses. It shares the commit
/// ([`Committer`]) and the admission gate ([`Admission`]: slot, quota,
/// keep-alive) with plain uploads, and nothing else.
pub struct ResumableService {
    committer: Arc<Committer>,
    admission: Arc<Admission>,
    resumables: Arc<dyn ResumableRepo>,
    cleanup: Arc<dyn CleanupRepo>,
    /// Whether a finished upload's file is committed.
    files: Arc<dyn FileRepo>,
    /// A completed upload's first bytes, to decide its type.
    blobs: Arc<dyn BlobStore>,
    /// The resumable writes.
    parts: Arc<dyn ResumableBlobs>,
    locks: Arc<Locks>,
    limits: Limits,
}

/// What a resumable upload is held to.
struct Limits {
    max_upload_bytes: u64,
    expiry: chrono::Duration,
    body_idle_timeout: std::time::Duration,
    allowed_types: AllowedTypes,
}

/// A resumable upload as the HTTP layer hands it over (`POST`).
pub struct NewResumable {
    pub length: u64,
    pub filename: Filename,
    pub content_type: String,
    /// The raw `Upload-Metadata`, echoed by `HEAD`.
    pub metadata: String,
}

/// What a PATCH (or a HEAD that finished the upload) did.
#[derive(Debug)]
pub enum Patched {
    /// Stored up to this offset; more is to come.
    Partial(ResumableRecord),
    /// The last bytes: the file is committed.
    Done {
        upload: ResumableRecord,
        file: Box<FileRecord>,
    },
}

impl Patched {
    /// The upload's state as the answer shows it.
    pub fn into_upload(self) -> ResumableRecord {
        match self {
            Patched::Partial(upload) | Patched::Done { upload, .. } => upload,
        }
    }
}

/// Why a resumable-upload call failed: what only tus knows (the HTTP tus
/// module maps these), or any other domain error.
#[derive(Debug, thiserror::Error)]
pub enum ResumableError {
    /// A PATCH from another offset than the stored one.
    #[error("the upload is at offset {0}; send from there")]
    OffsetMismatch(u64),
    /// Another request is writing to this upload right now.
    #[error("another request is writing to this upload; try again")]
    Locked,
    /// The body does not match the checksum the client sent; nothing of it was kept.
    #[error("the body does not match its Upload-Checksum; nothing of it was kept")]
    ChecksumMismatch,
    #[error(transparent)]
    Domain(#[from] DomainError),
}

macro_rules! via_domain {
    ($($from:ty),*) => {$(
        impl From<$from> for ResumableError {
            fn from(e: $from) -> Self {
                Self::Domain(e.into())
            }
        }
    )*};
}

via_domain!(MetaError, BlobError, BodyError, LockError);

type Result<T, E = ResumableError> = std::result::Result<T, E>;

impl ResumableService {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        committer: Arc<Committer>,
        admission: Arc<Admission>,
        resumables: Arc<dyn ResumableRepo>,
        cleanup: Arc<dyn CleanupRepo>,
        files: Arc<dyn FileRepo>,
        blobs: Arc<dyn BlobStore>,
        parts: Arc<dyn ResumableBlobs>,
        locks: Arc<Locks>,
        settings: &Settings,
    ) -> Self {
        Self {
            committer,
            admission,
            resumables,
            cleanup,
            files,
            blobs,
            parts,
            locks,
            limits: Limits {
                max_upload_bytes: settings.max_upload_bytes,
                expiry: chrono::Duration::from_std(settings.tus_expiry)
                    .unwrap_or_else(|_| chrono::Duration::days(1)),
                body_idle_timeout: settings.body_idle_timeout,
                allowed_types: settings.allowed_types.clone(),
            },
        }
    }

    /// Creates the upload: its intent first (so that the sweeper can find
    /// it), then the blob store's write, then the state.
    pub async fn create(&self, user: &UserRecord, new: NewResumable) -> Result<ResumableRecord> {
        let max = self.limits.max_upload_bytes;
        if new.length > max {
            return Err(DomainError::PayloadTooLarge(max).into());
        }
        self.admission
            .check_declared_quota(user, Some(new.length))
            .await?;
        let mut intent = self.committer.new_intent(user.id);
        // It waits for the client between PATCHes until the upload expires.
        intent.alive_until = Some(intent.created_at + self.limits.expiry);
        self.cleanup.put_intent(&intent).await?;
        // A crash from here until the state is stored leaves an empty
        // multipart upload that nothing names (S3's lifecycle rule for
        // incomplete uploads is the backstop); the intent is swept.
        let handle = match self.parts.start(&intent.key).await {
            Ok(h) => h,
            Err(e) => {
                let _ = self.cleanup.delete_intent(&intent.id).await;
                return Err(e.into());
            }
        };
        let now = intent.created_at;
        let record = ResumableRecord {
            id: intent.id,
            user_id: user.id,
            key: intent.key,
            handle,
            length: new.length as i64,
            offset: 0,
            part_size: self.parts.part_size() as i64,
            parts: Vec::new(),
            sha256_state: hash::fresh_state(),
            completed: false,
            filename: new.filename.as_str().to_owned(),
            content_type: new.content_type,
            metadata: new.metadata,
            created_at: now,
            expires_at: now + self.limits.expiry,
        };
        if let Err(e) = self.resumables.insert_resumable(&record).await {
            let _ = self.parts.abort(&record.key, &record.handle).await;
            let _ = self.cleanup.delete_intent(&intent.id).await;
            return Err(e.into());
        }
        Ok(record)
    }

    /// The upload, if `user` owns it and it has not expired.
    pub async fn find(&self, user: &UserRecord, id: &FileId) -> Result<ResumableRecord> {
        match self.resumables.resumable(id).await? {
            Some(r) if r.user_id == user.id && r.expires_at > crate::meta::now() => Ok(r),
            _ => Err(DomainError::NotFound.into()),
        }
    }

    /// Ends the upload: the blob store's write, its intent and its state go
    /// (and the completed object of one whose commit failed).
    pub async fn terminate(&self, user: &UserRecord, id: &FileId) -> Result<()> {
        self.find(user, id).await?;
        let guard = self.lock(id).await?;
        let result = async {
            // Read again under the lock: a last PATCH may have finished it.
            let record = self.find(user, id).await?;
            if !record.all_stored() {
                self.parts.abort(&record.key, &record.handle).await?;
                self.cleanup.delete_intent(id).await?;
                self.resumables.delete_resumable(id).await?;
                return Ok(());
            }
            // Every byte stored, the commit failed (or is unknown): a file
            // committed since is the user's now; else the object goes too.
            if self.files.file(&user.id, id).await?.is_some() {
                self.resumables.delete_resumable(id).await?;
                return Err(DomainError::NotFound.into());
            }
            match self.cleanup.intent(id).await? {
                Some(intent) => self.discard(&record, intent).await?,
                // Swept: the sweeper has the blob.
                None => self.resumables.delete_resumable(id).await?,
            }
            Ok(())
        }
        .await;
        release(guard).await;
        result
    }

    /// The upload's lock, without waiting: a second writer gets `Locked`.
    async fn lock(&self, id: &FileId) -> Result<Option<LockGuard>> {
        match self.locks.try_acquire(&LockKey::resumable(id)).await? {
            TryLock::Held(g) => Ok(Some(g)),
            // Development without the lock backend: the conditional update
            // on the offset still lets only one of two PATCHes count.
            TryLock::Degraded => Ok(None),
            TryLock::Busy => Err(ResumableError::Locked),
        }
    }

    /// When an upload renewed now expires.
    fn expires_at(&self) -> chrono::DateTime<chrono::Utc> {
        crate::meta::now() + self.limits.expiry
    }
}

async fn release(guard: Option<LockGuard>) {
    if let Some(g) = guard {
        g.release().await;
    }
}
