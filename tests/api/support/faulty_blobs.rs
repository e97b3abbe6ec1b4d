//! A resumable blob store wrapper that fails its next call of a kind on
//! request: what the tests of resumable uploads' recovery stand on.

use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering},
};

use async_trait::async_trait;
use bytes::Bytes;
use chrono::{DateTime, Utc};
use filedock::{
    blob::{
        BlobError, BlobStore,
        resumable::{ResumableBlobs, Staged},
    },
    meta::MetadataStore,
    vocab::{BlobKey, WriteHandle},
};

/// The blob store's resumable writes, with one fault armed at a time: the
/// next completion carried out but answered with an error (as when its
/// answer is lost on the way back), or refused, and the like.
pub struct LosesCompleteAnswer {
    pub inner: Arc<dyn ResumableBlobs>,
    /// The next completion is carried out, its answer lost.
    pub lose: AtomicBool,
    /// The next completion fails without being carried out.
    pub refuse: AtomicBool,
    /// The next abort fails without being carried out.
    pub refuse_abort: AtomicBool,
    /// Aborts carried out.
    pub aborted: std::sync::atomic::AtomicUsize,
    /// After the next completion, the sweeper takes the upload (its intent
    /// turned into an orphan, the object deleted), as a stale-intent scan
    /// would while the upload is being finished.
    pub swept_after_complete: std::sync::Mutex<Option<Sweeps>>,
    /// The next part write fails without being carried out.
    pub refuse_part: AtomicBool,
}

impl LosesCompleteAnswer {
    /// `inner`, with no fault armed.
    pub fn wrapping(inner: Arc<dyn ResumableBlobs>) -> Self {
        Self {
            inner,
            lose: false.into(),
            refuse: false.into(),
            refuse_abort: false.into(),
            aborted: 0.into(),
            swept_after_complete: Default::default(),
            refuse_part: false.into(),
        }
    }
}

/// What takes an upload as the sweeper does: its intent and its object.
pub type Sweeps = (Arc<dyn MetadataStore>, Arc<dyn BlobStore>);

#[async_trait]
impl ResumableBlobs for LosesCompleteAnswer {
    fn part_size(&self) -> usize {
        self.inner.part_size()
    }

    fn part_concurrency(&self) -> usize {
        self.inner.part_concurrency()
    }

    fn budget(&self) -> std::sync::Arc<filedock::blob::budget::MemoryBudget> {
        self.inner.budget()
    }

    async fn start(&self, key: &BlobKey, length: Option<u64>) -> Result<WriteHandle, BlobError> {
        self.inner.start(key, length).await
    }

    async fn put_part(
        &self,
        key: &BlobKey,
        handle: &WriteHandle,
        number: i32,
        offset: u64,
        part: Bytes,
    ) -> Result<String, BlobError> {
        if self.refuse_part.swap(false, Ordering::SeqCst) {
            return Err(BlobError::Unavailable("refused".into()));
        }
        self.inner.put_part(key, handle, number, offset, part).await
    }

    async fn put_tail(
        &self,
        key: &BlobKey,
        handle: &WriteHandle,
        start: u64,
        tail: Bytes,
    ) -> Result<(), BlobError> {
        self.inner.put_tail(key, handle, start, tail).await
    }

    async fn get_tail(
        &self,
        key: &BlobKey,
        handle: &WriteHandle,
        start: u64,
        end: u64,
    ) -> Result<Bytes, BlobError> {
        self.inner.get_tail(key, handle, start, end).await
    }

    async fn delete_tail(
        &self,
        key: &BlobKey,
        handle: &WriteHandle,
        start: u64,
        end: u64,
    ) -> Result<(), BlobError> {
        self.inner.delete_tail(key, handle, start, end).await
    }

    async fn complete(
        &self,
        key: &BlobKey,
        handle: &WriteHandle,
        tags: &[String],
        len: u64,
    ) -> Result<(), BlobError> {
        if self.refuse.swap(false, Ordering::SeqCst) {
            return Err(BlobError::Unavailable("refused".into()));
        }
        self.inner.complete(key, handle, tags, len).await?;
        let sweeper = self.swept_after_complete.lock().unwrap().take();
        if let Some((meta, blobs)) = sweeper {
            meta.abandon_intent(&key.user(), &key.file_id(), None)
                .await
                .unwrap()
                .unwrap();
            blobs.delete(key).await.unwrap();
        }
        match self.lose.swap(false, Ordering::SeqCst) {
            true => Err(BlobError::Unavailable("the answer was lost".into())),
            false => Ok(()),
        }
    }

    async fn abort(&self, key: &BlobKey, handle: &WriteHandle) -> Result<(), BlobError> {
        if self.refuse_abort.swap(false, Ordering::SeqCst) {
            return Err(BlobError::Unavailable("refused".into()));
        }
        self.inner.abort(key, handle).await?;
        self.aborted.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    async fn clear_staging(&self, key: &BlobKey, handle: &WriteHandle) -> Result<(), BlobError> {
        self.inner.clear_staging(key, handle).await
    }

    async fn staged(&self, before: DateTime<Utc>) -> Result<Vec<Staged>, BlobError> {
        self.inner.staged(before).await
    }

    async fn remove_staged(&self, staged: &Staged) -> Result<(), BlobError> {
        self.inner.remove_staged(staged).await
    }
}
