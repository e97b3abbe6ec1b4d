//! [`Announced`]: a repository that writes events (the files', and the
//! sessions' and agents' in `containers.rs`, the keys' in `keys.rs`) as
//! the services see it,
//! ringing the events' bell after each change that wrote an event
//! committed (or may have: an unknown outcome rings too, and a reader that
//! finds nothing new waits on), and counting the events written.

use std::sync::Arc;

use async_trait::async_trait;

use crate::{
    meta::{
        CommitOutcome, CommitUpload, DeletedFile, EventBell, Fence, FileRecord, FileRepo,
        IdempotencyRecord, MetaError, MetaResult,
    },
    metrics::Metrics,
    vocab::{FileId, Filename, IdempotencyKey, UserId},
};

pub struct Announced<R: ?Sized> {
    pub(super) inner: Arc<R>,
    bell: Arc<dyn EventBell>,
    metrics: Arc<Metrics>,
}

impl<R: ?Sized> Announced<R> {
    pub fn new(inner: Arc<R>, bell: Arc<dyn EventBell>, metrics: Arc<Metrics>) -> Self {
        Self {
            inner,
            bell,
            metrics,
        }
    }

    /// Counts `written` events.
    pub(super) fn metrics_written(&self, written: u64) {
        self.metrics.events_written.inc_by(written);
    }

    /// Rings for `owner` when `written` events committed or `unknown`.
    pub(super) async fn announce(&self, owner: &UserId, written: u64, unknown: bool) {
        self.metrics_written(written);
        if written > 0 || unknown {
            self.bell.ring(owner).await;
        }
    }
}

pub(super) fn unknown<T>(r: &MetaResult<T>) -> bool {
    matches!(r, Err(MetaError::OutcomeUnknown(_)))
}

#[async_trait]
impl FileRepo for Announced<dyn FileRepo> {
    async fn commit_upload(&self, commit: &CommitUpload) -> MetaResult<CommitOutcome> {
        let r = self.inner.commit_upload(commit).await;
        let written = u64::from(matches!(r, Ok(CommitOutcome::Committed)));
        self.announce(&commit.file.owner_id, written, unknown(&r))
            .await;
        r
    }

    async fn idempotency_record(
        &self,
        user_id: &UserId,
        key: &IdempotencyKey,
    ) -> MetaResult<Option<IdempotencyRecord>> {
        self.inner.idempotency_record(user_id, key).await
    }

    async fn commit_uploads(
        &self,
        group: &[CommitUpload],
    ) -> MetaResult<Vec<MetaResult<CommitOutcome>>> {
        let r = self.inner.commit_uploads(group).await;
        if let Some(first) = group.first() {
            let written = match &r {
                Ok(outcomes) => outcomes
                    .iter()
                    .filter(|o| matches!(o, Ok(CommitOutcome::Committed)))
                    .count() as u64,
                Err(_) => 0,
            };
            self.announce(&first.file.owner_id, written, unknown(&r))
                .await;
        }
        r
    }

    async fn file(&self, owner_id: &UserId, file_id: &FileId) -> MetaResult<Option<FileRecord>> {
        self.inner.file(owner_id, file_id).await
    }

    async fn list_files(
        &self,
        owner_id: &UserId,
        after: Option<&FileId>,
        limit: usize,
    ) -> MetaResult<Vec<FileRecord>> {
        self.inner.list_files(owner_id, after, limit).await
    }

    async fn delete_file(
        &self,
        owner_id: &UserId,
        file_id: &FileId,
        fence: Option<&Fence>,
    ) -> MetaResult<Option<DeletedFile>> {
        let r = self.inner.delete_file(owner_id, file_id, fence).await;
        let written = u64::from(matches!(r, Ok(Some(_))));
        self.announce(owner_id, written, unknown(&r)).await;
        r
    }

    async fn rename_file(
        &self,
        owner_id: &UserId,
        file_id: &FileId,
        filename: &Filename,
        fence: Option<&Fence>,
    ) -> MetaResult<Option<FileRecord>> {
        let r = self
            .inner
            .rename_file(owner_id, file_id, filename, fence)
            .await;
        let written = u64::from(matches!(r, Ok(Some(_))));
        self.announce(owner_id, written, unknown(&r)).await;
        r
    }

    async fn all_files(&self, after: Option<&FileId>, limit: usize) -> MetaResult<Vec<FileRecord>> {
        self.inner.all_files(after, limit).await
    }
}
