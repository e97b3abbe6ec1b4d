//! A PATCH: append the body at the stored offset. Whole parts go to the
//! blob store as they fill (a few in flight, as a plain upload's do); what
//! is left when the body ends becomes the new tail. The state advances only
//! after every byte of the PATCH is stored, by a conditional write on the
//! offset; a PATCH whose checksum does not match advances nothing (its
//! parts are overwritten by the next PATCH or dropped by the abort). Memory:
//! one part being filled plus the parts in flight, whatever the file size.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use sha2_state::Digest;
use tokio::task::JoinSet;

use super::{
    Checksum, ResumableService,
    hash::{self, BodyHasher},
    release,
};
use crate::{
    blob::{BlobError, BodyError, ByteStream, resumable::ResumableBlobs},
    domain::DomainError,
    meta::{FileRecord, ResumableRecord, UserRecord},
};

/// What a PATCH (or a HEAD that finished the upload) did.
pub enum Patched {
    /// Stored up to this offset; more is to come.
    Partial(ResumableRecord),
    /// The last bytes: the file is committed.
    Done {
        upload: ResumableRecord,
        file: Box<FileRecord>,
    },
}

/// What the body brought.
struct Received {
    upload: ResumableRecord,
    /// The part being filled: the bytes after the last whole part.
    tail: BytesMut,
    hasher: sha2_state::Sha256,
    /// Why the body ended early (the client went away), if it did.
    cut: Option<BodyError>,
}

/// A part upload's answer: its index and its tag.
type PartResult = (usize, Result<String, BlobError>);

/// Parts in flight per PATCH when the blob store does not say.
const DEFAULT_PART_CONCURRENCY: usize = 4;

impl ResumableService {
    /// Appends `body` to upload `id` of `user`, which the client says is at `offset`.
    pub async fn patch(
        &self,
        user: &UserRecord,
        id: &str,
        offset: u64,
        checksum: Option<Checksum>,
        body: ByteStream<'static>,
    ) -> Result<Patched, DomainError> {
        self.find(user, id).await?;
        let guard = self.lock(id).await?;
        let result = async {
            let upload = self.find(user, id).await?;
            if upload.offset as u64 != offset {
                return Err(DomainError::OffsetMismatch(upload.offset as u64));
            }
            // An upload whose bytes are all stored may have committed (its
            // intent gone with it): finishing it tells.
            if !upload.all_stored() && !self.cleanup.touch_intent(id).await? {
                return Err(DomainError::UploadExpired);
            }
            let slot = self.uploads.reserve(user)?;
            let r = tokio::select! {
                r = self.append(user, upload, checksum, body) => r,
                never = self.uploads.keep_alive(id) => match never {},
            };
            drop(slot);
            r
        }
        .await;
        release(guard).await;
        result
    }

    async fn append(
        &self,
        user: &UserRecord,
        upload: ResumableRecord,
        checksum: Option<Checksum>,
        body: ByteStream<'static>,
    ) -> Result<Patched, DomainError> {
        let before = upload.clone();
        let mut check = checksum.as_ref().map(Checksum::hasher);
        let received = self.receive(upload, body, check.as_mut()).await?;
        if let Some(c) = &checksum {
            if let Some(cut) = received.cut {
                // Half a body cannot be checked: none of it counts.
                return Err(cut.into());
            }
            if !check.is_some_and(|h| c.matches(h)) {
                return Err(DomainError::ChecksumMismatch);
            }
        }
        let Received {
            mut upload,
            tail,
            hasher,
            cut,
        } = received;
        if before.all_stored() {
            // A final PATCH failed after storing every byte: only the
            // commit is left, and this PATCH (with an empty body) retries it.
            return self.finish(user, upload).await;
        }
        let old_tail = before.tail_start() as u64;
        let old_tail =
            (before.offset as u64 > old_tail).then_some((old_tail, before.offset as u64));
        if upload.all_stored() {
            let last = tail.freeze();
            return self
                .store_last(user, upload, before.offset, last, hasher, old_tail)
                .await;
        }
        upload.expires_at = crate::meta::now() + self.expiry();
        if upload.offset == before.offset {
            // Nothing arrived (an empty PATCH, or one cut before its first
            // byte): the stored tail is the one the state names. Writing it
            // again under that name and then dropping the old one would drop
            // it, so only the expiry is renewed.
            if !self
                .resumables
                .advance_resumable(&upload, before.offset)
                .await?
            {
                return Err(DomainError::OffsetMismatch(before.offset as u64));
            }
            return match cut {
                Some(cut) => Err(cut.into()),
                None => Ok(Patched::Partial(upload)),
            };
        }
        let tail_start = upload.tail_start() as u64;
        if !tail.is_empty() {
            let tail = tail.freeze();
            self.blobs
                .put_tail(&upload.key, &upload.handle, tail_start, tail)
                .await?;
        }
        upload.sha256_state = hash::save(&hasher);
        if !self
            .resumables
            .advance_resumable(&upload, before.offset)
            .await?
        {
            return Err(DomainError::OffsetMismatch(before.offset as u64));
        }
        if let Some((start, end)) = old_tail {
            // The new state no longer points at it; a failure leaves it to the abort.
            let _ = self
                .blobs
                .delete_tail(&upload.key, &upload.handle, start, end)
                .await;
        }
        match cut {
            // The client is gone; what it sent is kept for its HEAD.
            Some(cut) => Err(cut.into()),
            None => Ok(Patched::Partial(upload)),
        }
    }

    /// Reads the body into parts, storing each whole one as it fills.
    async fn receive(
        &self,
        mut upload: ResumableRecord,
        mut body: ByteStream<'static>,
        mut check: Option<&mut BodyHasher>,
    ) -> Result<Received, DomainError> {
        let part_size = upload.part_size as usize;
        let mut hasher = hash::restore(&upload.sha256_state)?;
        let tail_start = upload.tail_start() as u64;
        let mut tail = BytesMut::with_capacity(part_size);
        if upload.offset as u64 > tail_start {
            let old = self.blobs.get_tail(
                &upload.key,
                &upload.handle,
                tail_start,
                upload.offset as u64,
            );
            tail.extend_from_slice(&old.await?);
        }
        let settings = &self.uploads.settings;
        let concurrency = settings
            .s3
            .as_ref()
            .map_or(DEFAULT_PART_CONCURRENCY, |s| s.part_concurrency.max(1));
        let idle = settings.body_idle_timeout;
        let mut in_flight: JoinSet<PartResult> = JoinSet::new();
        let mut failed: Option<BlobError> = None;
        let mut cut = None;
        loop {
            let mut chunk = match tokio::time::timeout(idle, body.next()).await {
                Ok(Some(Ok(c))) => c,
                Ok(None) => break,
                Ok(Some(Err(e))) => {
                    cut = Some(e);
                    break;
                }
                Err(_) => {
                    cut = Some(BodyError::Idle(idle));
                    break;
                }
            };
            if upload.offset + chunk.len() as i64 > upload.length {
                drain(&mut in_flight, &mut upload.parts).await;
                return Err(DomainError::InvalidRequest(
                    "the body goes past Upload-Length".into(),
                ));
            }
            upload.offset += chunk.len() as i64;
            hasher.update(&chunk);
            if let Some(c) = check.as_deref_mut() {
                c.update(&chunk);
            }
            while !chunk.is_empty() {
                let take = (part_size - tail.len()).min(chunk.len());
                tail.extend_from_slice(&chunk.split_to(take));
                if tail.len() == part_size {
                    let part = std::mem::replace(&mut tail, BytesMut::with_capacity(part_size));
                    let start = upload.tail_start() as u64;
                    let index = upload.parts.len();
                    upload.parts.push(String::new());
                    in_flight.spawn(put_part(
                        self.blobs.clone(),
                        upload.clone(),
                        index,
                        start,
                        part.freeze(),
                    ));
                    while in_flight.len() >= concurrency {
                        joined(in_flight.join_next().await, &mut upload.parts, &mut failed);
                    }
                }
            }
            if failed.is_some() {
                break;
            }
        }
        while let Some(r) = in_flight.join_next().await {
            joined(Some(r), &mut upload.parts, &mut failed);
        }
        if let Some(e) = failed {
            return Err(e.into());
        }
        Ok(Received {
            upload,
            tail,
            hasher,
            cut,
        })
    }

    /// The last bytes: the last part is stored and the state advanced to
    /// the end (so that a commit that fails from here on loses none of
    /// them), the tail the state pointed at dropped, then the file finished.
    async fn store_last(
        &self,
        user: &UserRecord,
        mut upload: ResumableRecord,
        before_offset: i64,
        last: Bytes,
        hasher: sha2_state::Sha256,
        old_tail: Option<(u64, u64)>,
    ) -> Result<Patched, DomainError> {
        if !last.is_empty() {
            let number = upload.parts.len() as i32 + 1;
            let start = upload.tail_start() as u64;
            let tag = self
                .blobs
                .put_part(&upload.key, &upload.handle, number, start, last)
                .await?;
            upload.parts.push(tag);
        }
        upload.sha256_state = hash::save(&hasher);
        upload.expires_at = crate::meta::now() + self.expiry();
        if !self
            .resumables
            .advance_resumable(&upload, before_offset)
            .await?
        {
            return Err(DomainError::OffsetMismatch(before_offset as u64));
        }
        if let Some((start, end)) = old_tail
            && let Err(e) = self
                .blobs
                .delete_tail(&upload.key, &upload.handle, start, end)
                .await
        {
            tracing::warn!(upload = %upload.id, error = %e, "could not drop a finished upload's tail");
        }
        self.finish(user, upload).await
    }
}

async fn put_part(
    blobs: Arc<dyn ResumableBlobs>,
    upload: ResumableRecord,
    index: usize,
    start: u64,
    part: Bytes,
) -> PartResult {
    let number = index as i32 + 1;
    let r = blobs
        .put_part(&upload.key, &upload.handle, number, start, part)
        .await;
    (index, r)
}

fn joined(
    r: Option<Result<PartResult, tokio::task::JoinError>>,
    tags: &mut [String],
    failed: &mut Option<BlobError>,
) {
    let e = match r {
        Some(Ok((index, Ok(tag)))) => {
            tags[index] = tag;
            return;
        }
        Some(Ok((_, Err(e)))) => e,
        Some(Err(e)) => BlobError::Other(format!("part upload task failed: {e}")),
        None => return,
    };
    failed.get_or_insert(e);
}

/// Waits for the parts in flight before giving up, so none lands later.
async fn drain(in_flight: &mut JoinSet<PartResult>, tags: &mut [String]) {
    let mut ignored = None;
    while let Some(r) = in_flight.join_next().await {
        joined(Some(r), tags, &mut ignored);
    }
}
