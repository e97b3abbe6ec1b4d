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
use futures::StreamExt;

use super::{
    BlobError, BodyError, ByteStream,
    budget::{LetGo, MemoryBudget, Reservation},
    parts::{self, Part, PartSink, Parts, PartsFrom, Short},
};
use crate::vocab::{BlobKey, FileId, WriteHandle};

#[async_trait]
pub trait ResumableBlobs: Send + Sync {
    /// The size of every part but the last.
    fn part_size(&self) -> usize;

    /// How many parts one append stores at once.
    fn part_concurrency(&self) -> usize;

    /// The budget every part buffer and loaded tail is reserved from.
    fn budget(&self) -> Arc<MemoryBudget>;

    /// Starts a resumable write to `key` of `length` bytes (`None`: not
    /// known yet); returns its handle (the S3 upload id). A store may write
    /// a known length shorter than a part as one object, at part 1's
    /// [`Self::put_part`] (S3: a `PutObject` that never overwrites); then
    /// [`Self::abort`] leaves that object, as it leaves a completed
    /// write's, to the upload's intent (its orphan deletes it).
    async fn start(&self, key: &BlobKey, length: Option<u64>) -> Result<WriteHandle, BlobError>;

    /// Whether `handle`'s write is that one object, stored whole by part
    /// 1's [`Self::put_part`]: completing it sends nothing, and storing the
    /// same bytes again finds them stored.
    fn stores_whole(&self, _handle: &WriteHandle) -> bool {
        false
    }

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
    /// The most bytes the body may bring (`Upload-Length` − offset), when known.
    pub left: Option<u64>,
    /// Whose upload it is: its memory comes from this user's share.
    pub user: Option<&'a str>,
    /// Stops a wait for memory (another request asks for the upload).
    pub let_go: Option<&'a LetGo>,
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
    /// included), shorter than a part: the new tail, not stored yet. Empty
    /// when nothing was read (the stored tail was not loaded then).
    pub tail: Bytes,
    /// The budget `tail` holds: keep it until the tail is stored.
    pub held: Reservation,
    /// Bytes read from the body.
    pub read: u64,
    /// Why the body stopped early, if it did: what arrived before it
    /// stopped is in `tags` and `tail`.
    pub cut: Option<BodyError>,
}

/// Continues the write `at` with `body`: once its first bytes arrive, the
/// stored tail is read back (into memory reserved from the budget, waiting
/// for it if need be) and continued, each part that fills is stored as it
/// fills (by the part writer, a few in flight), and what is left is handed
/// back. A body that brings nothing loads nothing; one whose first wait for
/// memory is refused stores nothing (`cut` says why). Memory: the part being
/// filled plus the parts in flight, whatever the upload's size.
pub async fn append(
    blobs: Arc<dyn ResumableBlobs>,
    at: WriteAt<'_>,
    mut body: ByteStream<'_>,
) -> Result<Appended, BlobError> {
    let first = loop {
        match body.next().await {
            Some(Ok(c)) if c.is_empty() => {}
            Some(Ok(c)) => break c,
            None => return Ok(Appended::nothing(None)),
            Some(Err(e)) => return Ok(Appended::nothing(Some(e))),
        }
    };
    let tail_start = at.tail_start();
    let tail_len = at.offset.saturating_sub(tail_start);
    let left = at.left.map(|l| l + tail_len);
    // The first part, and the tail's own copy until it is copied into it.
    let first_part = left.map_or(at.part_size as u64, |l| l.min(at.part_size as u64));
    let claim = blobs.budget().claim(at.user).let_go_on(at.let_go.cloned());
    // Refused: the first chunk is dropped unstored (nothing of the body
    // counts), and the upload stays where it was.
    let held = match claim.reserve(first_part + tail_len).await {
        Ok(held) => held,
        Err(refused) => return Ok(Appended::nothing(Some(refused.into()))),
    };
    let carried = match tail_len > 0 {
        true => {
            blobs
                .get_tail(at.key, at.handle, tail_start, at.offset)
                .await?
        }
        false => Bytes::new(),
    };
    let body = futures::stream::once(async move { Ok(first) })
        .chain(body)
        .boxed();
    let mut parts = Parts::new(carried, body, at.part_size, claim)
        .at_most(left)
        .reserved(held);
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
    let Part { bytes: tail, held } = sent.rest;
    Ok(Appended {
        tags: sent.tags,
        tail,
        held,
        read: parts.read(),
        cut: parts.cut(),
    })
}

impl Appended {
    /// A body that brought nothing (`cut`: why it stopped).
    fn nothing(cut: Option<BodyError>) -> Self {
        Self {
            tags: Vec::new(),
            tail: Bytes::new(),
            held: Reservation::none(),
            read: 0,
            cut,
        }
    }
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
