//! Reading, listing, renaming and deleting files.

use std::{future::Future, sync::Arc};

use super::{
    DomainError, FileId, Filename, UserId,
    commit::{UserCommitError, user_commit},
    page::{Page, PageRequest},
};
use crate::{
    blob::{BlobStore, ByteRange, ByteStream, PresignedHeaders},
    lock::{LockKey, Locks},
    meta::retry::Transactions,
    meta::{
        CleanupRepo, Fence, FileRecord, FileRepo, MetaError, OrphanStatus, UserRecord, UserTurns,
    },
};

/// Reading, listing, renaming and deleting files, and the ports that takes.
pub struct FileService {
    pub(crate) files: Arc<dyn FileRepo>,
    /// Where a deleted file's blob waits as an orphan until it is gone.
    pub(crate) cleanup: Arc<dyn CleanupRepo>,
    pub(crate) blobs: Arc<dyn BlobStore>,
    pub(crate) locks: Arc<Locks>,
    /// The users' turns in this instance: a delete or a rename writes the
    /// owner's record (its event's number), as their commits do.
    pub(crate) turns: Arc<UserTurns>,
    pub(crate) txns: Transactions,
}

impl FileService {
    /// The caller's file, or `NotFound` (also for other users' files).
    pub async fn find(&self, user: &UserRecord, id: &FileId) -> Result<FileRecord, DomainError> {
        self.find_owned(&user.id, id).await
    }

    /// The file `id` of the user `owner_id`, or `NotFound` (also once it is
    /// deleted: a signed link dies with its file).
    pub async fn find_owned(
        &self,
        owner_id: &UserId,
        id: &FileId,
    ) -> Result<FileRecord, DomainError> {
        self.files
            .file(owner_id, id)
            .await?
            .ok_or(DomainError::NotFound)
    }

    /// A page of the caller's files in creation order.
    pub async fn list(
        &self,
        user: &UserRecord,
        page: &PageRequest,
    ) -> Result<Page<FileRecord>, DomainError> {
        page.fetch(
            |after, n| async move { self.files.list_files(&user.id, after.as_ref(), n).await },
            |f: &FileRecord| f.id,
        )
        .await
    }

    /// Streams the file's bytes, or `range` of them.
    pub async fn content(
        &self,
        file: &FileRecord,
        range: Option<ByteRange>,
    ) -> Result<ByteStream<'static>, DomainError> {
        Ok(self.blobs.get(&file.key, range).await?)
    }

    /// A URL that downloads the file straight from the blob store for
    /// `ttl`, with these response headers; `None` where the store cannot
    /// make one.
    pub async fn presigned(
        &self,
        file: &FileRecord,
        ttl: std::time::Duration,
        headers: &PresignedHeaders,
    ) -> Result<Option<String>, DomainError> {
        Ok(self.blobs.presigned_get(&file.key, ttl, headers).await?)
    }

    /// Renames the caller's file; the name follows the rule of an
    /// uploaded file's name ([`Filename::parse`]). Ordered with the owner's
    /// other writes as a delete is ([`Self::write_file`]): racing a delete,
    /// it applies before it or finds no file (`NotFound`), never after it.
    pub async fn rename(
        &self,
        user: &UserRecord,
        id: &FileId,
        name: &str,
    ) -> Result<FileRecord, DomainError> {
        let name = &Filename::parse(name).map_err(DomainError::InvalidRequest)?;
        let file = &self.find(user, id).await?;
        self.write_file(user, file, "rename_file", |fence| async move {
            self.files
                .rename_file(&user.id, &file.id, name, fence.as_ref())
                .await
        })
        .await?
        // Deleted concurrently by another request: same answer as never found.
        .ok_or(DomainError::NotFound)
    }

    /// Deletes the file: the metadata goes in one transaction
    /// ([`Self::write_file`]), which also queues the blob as a pending
    /// orphan; then the blob goes and the orphan is marked deleted.
    pub async fn delete(&self, user: &UserRecord, id: &FileId) -> Result<(), DomainError> {
        let file = &self.find(user, id).await?;
        let deleted = self
            .write_file(user, file, "delete_file", |fence| async move {
                self.files
                    .delete_file(&user.id, &file.id, fence.as_ref())
                    .await
            })
            .await?;
        // Deleted concurrently by another request: same answer as never found.
        let gone = deleted.ok_or(DomainError::NotFound)?;
        // The metadata is gone, so the delete has happened whatever follows:
        // the blob goes now, or the pending orphan written with the delete
        // keeps it on the sweeper's list.
        let cleaned = match self.blobs.delete(&gone.file.key).await {
            Ok(()) => self
                .cleanup
                .mark_orphan(&gone.orphan_id, OrphanStatus::Deleted, None)
                .await
                .map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        if let Err(e) = cleaned {
            tracing::warn!(key = %file.key, error = %e, "blob clean-up after a delete left for the sweeper");
        }
        Ok(())
    }

    /// Runs `txn`, a write of `file`'s metadata, the way every such write
    /// runs: under the owner's upload lock for the file's category (ordered
    /// with the owner's uploads and deletes there), then the user's commit
    /// lock and the transaction retry, with the lock's fencing token. A
    /// transaction whose answer was lost may have applied: the file is
    /// named to read.
    async fn write_file<T, F, Fut>(
        &self,
        user: &UserRecord,
        file: &FileRecord,
        op: &str,
        txn: F,
    ) -> Result<T, DomainError>
    where
        F: Fn(Option<Fence>) -> Fut,
        Fut: Future<Output = Result<T, MetaError>>,
    {
        let (user_id, category) = (&user.id, file.category);
        let lock = LockKey::user_upload(user_id, category);
        let written = self
            .locks
            .with_lock(&lock, async |held| {
                let fence = Fence::of_lock(held.fence(), category.as_str());
                user_commit(&self.locks, &self.turns, &self.txns, user_id, op, || {
                    txn(fence.clone())
                })
                .await
            })
            .await;
        written.map(|r| r.value).map_err(|e| match e {
            UserCommitError::Meta(MetaError::OutcomeUnknown(_)) => {
                DomainError::OutcomeUnknown(Some(format!("/v1/files/{}", file.id)))
            }
            e => e.into(),
        })
    }
}
