//! The `ResumableBlobs` port: a blob written in numbered parts over many
//! requests (tus), which appears whole only when completed. S3 maps it onto
//! a multipart upload; the local-file store onto a staging file.
//!
//! The bytes after the last whole part (fewer than a part) are the *tail*.
//! It is kept in the blob store beside the upload (S3: a staging object
//! `tus/{key}/tail-{start}-{end}`; local files: in the staging file itself),
//! so that any instance can continue the upload and no instance holds more
//! than a part of it in memory. A tail is named by its range: writing a new
//! one never overwrites the one the stored state points at.

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use chrono::{DateTime, Utc};

use super::{
    BlobError, BodyError, ByteStream,
    parts::{self, PartSink, Parts, PartsFrom, Short},
};
use crate::vocab::{BlobKey, FileId, WriteHandle};

#[async_trait]
pub trait ResumableBlobs: Send + Sync {
    /// The size of every part but the last.
    fn part_size(&self) -> usize;

    /// How many parts one append stores at once.
    fn part_concurrency(&self) -> usize;

    /// Starts a resumable write to `key`; returns its handle (the S3 upload id).
    async fn start(&self, key: &BlobKey) -> Result<WriteHandle, BlobError>;

    /// Stores part `number` (1-based), which begins at byte `offset`;
    /// returns its tag (the S3 ETag). Storing a number again replaces it.
    async fn put_part(
        &self,
        key: &BlobKey,
        handle: &WriteHandle,
        number: i32,
        offset: u64,
        part: Bytes,
    ) -> Result<String, BlobError>;

    /// Stores the tail `start..start + tail.len()`.
    async fn put_tail(
        &self,
        key: &BlobKey,
        handle: &WriteHandle,
        start: u64,
        tail: Bytes,
    ) -> Result<(), BlobError>;

    /// Reads the tail `start..end` back.
    async fn get_tail(
        &self,
        key: &BlobKey,
        handle: &WriteHandle,
        start: u64,
        end: u64,
    ) -> Result<Bytes, BlobError>;

    /// Drops the tail `start..end` (a newer one replaced it); a missing one is fine.
    async fn delete_tail(
        &self,
        key: &BlobKey,
        handle: &WriteHandle,
        start: u64,
        end: u64,
    ) -> Result<(), BlobError>;

    /// Makes the object at `key` (`len` bytes) from the parts with these
    /// tags, in order. Completing a write that already completed succeeds
    /// (its first answer may have been lost): the object is there, whole.
    async fn complete(
        &self,
        key: &BlobKey,
        handle: &WriteHandle,
        tags: &[String],
        len: u64,
    ) -> Result<(), BlobError>;

    /// Drops the parts and tails; aborting a finished or missing write
    /// succeeds (and leaves a finished write's object alone).
    async fn abort(&self, key: &BlobKey, handle: &WriteHandle) -> Result<(), BlobError>;

    /// Drops what a finished write left in staging (tails whose delete
    /// failed); its object stays.
    async fn clear_staging(&self, key: &BlobKey, handle: &WriteHandle) -> Result<(), BlobError>;

    /// What staging holds that was last written before `before`: what a
    /// dead upload, a failed tail delete or a PATCH that failed after
    /// storing its tail left there, among what live uploads still need.
    /// The sweeper tells them apart and removes the first with
    /// [`Self::remove_staged`].
    async fn staged(&self, before: DateTime<Utc>) -> Result<Vec<Staged>, BlobError>;

    /// Removes one thing [`Self::staged`] listed; a missing one is fine.
    async fn remove_staged(&self, staged: &Staged) -> Result<(), BlobError>;
}

/// One thing in staging, as [`ResumableBlobs::staged`] lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Staged {
    /// A tail object (a [`BlobKey::Tail`]) of the resumable upload to a file's key (S3).
    Tail(BlobKey),
    /// The staging of a resumable write (the local store's staging file);
    /// `upload` is `None` when its name does not tell (made before names did).
    Write {
        upload: Option<FileId>,
        handle: WriteHandle,
    },
    /// A plain write's temporary file (the local store), by its name.
    Temp(String),
}

/// Where a resumable write stands: its key and handle, the part size it was
/// started with, the whole parts it has, and how many bytes (the tail after
/// those parts included).
#[derive(Clone, Copy)]
pub struct WriteAt<'a> {
    pub key: &'a BlobKey,
    pub handle: &'a WriteHandle,
    pub part_size: usize,
    pub parts: usize,
    pub offset: u64,
}

impl WriteAt<'_> {
    /// Where the tail starts: after the whole parts.
    fn tail_start(&self) -> u64 {
        (self.parts * self.part_size) as u64
    }
}

/// What [`append`] stored.
pub struct Appended {
    /// The tags of the whole parts it stored, in order, after those before.
    pub tags: Vec<String>,
    /// What is left after the last whole part (the old tail's bytes
    /// included), shorter than a part: the new tail, not stored yet.
    pub tail: Bytes,
    /// Bytes read from the body.
    pub read: u64,
    /// Why the body stopped early, if it did: what arrived before it
    /// stopped is in `tags` and `tail`.
    pub cut: Option<BodyError>,
}

/// Continues the write `at` with `body`: the stored tail is read back and
/// continued, each part that fills is stored as it fills (by the part
/// writer, a few in flight), and what is left is handed back. Memory: the
/// part being filled plus the parts in flight, whatever the upload's size.
pub async fn append(
    blobs: Arc<dyn ResumableBlobs>,
    at: WriteAt<'_>,
    body: ByteStream<'_>,
) -> Result<Appended, BlobError> {
    let tail_start = at.tail_start();
    let carried = match at.offset > tail_start {
        true => {
            blobs
                .get_tail(at.key, at.handle, tail_start, at.offset)
                .await?
        }
        false => Bytes::new(),
    };
    let mut parts = Parts::new(carried, body, at.part_size);
    let sink = Arc::new(WriteSink {
        blobs: blobs.clone(),
        key: *at.key,
        handle: at.handle.clone(),
    });
    let from = PartsFrom {
        number: at.parts as i32 + 1,
        offset: tail_start,
    };
    let concurrency = blobs.part_concurrency();
    let sent = parts::send(&mut parts, None, sink, from, concurrency, Short::Keep).await?;
    Ok(Appended {
        tags: sent.tags,
        tail: sent.rest,
        read: parts.read(),
        cut: parts.cut(),
    })
}

/// The parts of one resumable write, as the part writer sends them.
struct WriteSink {
    blobs: Arc<dyn ResumableBlobs>,
    key: BlobKey,
    handle: WriteHandle,
}

#[async_trait]
impl PartSink for WriteSink {
    async fn put_part(&self, number: i32, offset: u64, part: Bytes) -> Result<String, BlobError> {
        self.blobs
            .put_part(&self.key, &self.handle, number, offset, part)
            .await
    }
}
