//! A PATCH: append the body at the stored offset. The part writer stores
//! whole parts as they fill (a few in flight, as a plain upload's do); what
//! is left when the body ends becomes the new tail. The state advances only
//! after every byte of the PATCH is stored, by a conditional write on the
//! offset; a PATCH whose checksum does not match advances nothing (its
//! parts are overwritten by the next PATCH or dropped by the abort). Memory:
//! one part being filled plus the parts in flight, whatever the file size.

use bytes::Bytes;
use futures::StreamExt;
use sha2_state::Digest;
use tokio_util::sync::CancellationToken;

use super::{Checksum, Patched, Result, ResumableError, ResumableService, hash, release};
use crate::{
    blob::{
        BodyError, ByteStream, bounded,
        resumable::{Appended, WriteAt, append},
    },
    domain::DomainError,
    lock::LockGuard,
    meta::{ResumableRecord, UserRecord},
    vocab::FileId,
};

impl ResumableService {
    /// Appends `body` to upload `id` of `user`, which the client says is at `offset`.
    pub async fn patch(
        &self,
        user: &UserRecord,
        id: &FileId,
        offset: u64,
        checksum: Option<Checksum>,
        body: ByteStream<'static>,
    ) -> Result<Patched> {
        self.find(user, id).await?;
        let guard = self.lock(id).await?;
        let result = async {
            let upload = self.find(user, id).await?;
            if upload.offset as u64 != offset {
                return Err(ResumableError::OffsetMismatch(upload.offset as u64));
            }
            // An upload whose bytes are all stored may have committed (its
            // intent gone with it): finishing it tells. The intent waits
            // as long as the upload this PATCH renews.
            let until = Some(self.expires_at());
            if !upload.all_stored() && !self.cleanup.touch_intent(id, until).await? {
                return Err(DomainError::UploadExpired.into());
            }
            let slot = self.admission.reserve(user)?;
            let lost = guard.as_ref().map(LockGuard::lost);
            let r = tokio::select! {
                r = self.append(user, upload, checksum, body, lost) => r,
                never = self.admission.keep_alive(id) => match never {},
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
        lost: Option<CancellationToken>,
    ) -> Result<Patched> {
        let before = upload.clone();
        let mut check = checksum.as_ref().map(Checksum::hasher);
        let mut hasher = hash::restore(&upload.sha256_state)?;
        let appended = {
            let left = (upload.length - upload.offset) as u64;
            let idle = self.limits.body_idle_timeout;
            let hashed = bounded(body, idle, left).map(|chunk| {
                let chunk = chunk?;
                hasher.update(&chunk);
                if let Some(c) = check.as_mut() {
                    c.update(&chunk);
                }
                Ok(chunk)
            });
            let at = WriteAt {
                key: &upload.key,
                handle: &upload.handle,
                part_size: upload.part_size as usize,
                parts: upload.parts.len(),
                offset: upload.offset as u64,
            };
            // The lease lost while the body streams (this process stalled
            // past it, the lock backend lost it): another request may hold
            // the upload now, so this one stops, as a plain upload does,
            // and nothing of it is recorded.
            let appended = append(self.parts.clone(), at, hashed.boxed());
            match &lost {
                Some(lost) => tokio::select! {
                    r = appended => r?,
                    _ = lost.cancelled() => return Err(DomainError::LockLost.into()),
                },
                None => appended.await?,
            }
        };
        if lost.as_ref().is_some_and(CancellationToken::is_cancelled) {
            return Err(DomainError::LockLost.into());
        }
        let Appended {
            tags,
            tail,
            read,
            cut,
        } = appended;
        if let Some(BodyError::TooLarge(_)) = cut {
            // Nothing of it counts.
            return Err(
                DomainError::InvalidRequest("the body goes past Upload-Length".into()).into(),
            );
        }
        if let Some(c) = &checksum {
            if let Some(cut) = cut {
                // Half a body cannot be checked: none of it counts.
                return Err(cut.into());
            }
            if !check.is_some_and(|h| c.matches(h)) {
                return Err(ResumableError::ChecksumMismatch);
            }
        }
        let mut upload = upload;
        upload.offset += read as i64;
        upload.parts.extend(tags);
        if before.all_stored() {
            // A final PATCH failed after storing every byte: only the
            // commit is left, and this PATCH (with an empty body) retries it.
            return self.finish(user, upload).await;
        }
        let old_tail = before.tail_start() as u64;
        let old_tail =
            (before.offset as u64 > old_tail).then_some((old_tail, before.offset as u64));
        if upload.all_stored() {
            return self
                .store_last(user, upload, before.offset, tail, hasher, old_tail)
                .await;
        }
        upload.expires_at = self.expires_at();
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
                return Err(ResumableError::OffsetMismatch(before.offset as u64));
            }
            return match cut {
                Some(cut) => Err(cut.into()),
                None => Ok(Patched::Partial(upload)),
            };
        }
        let tail_start = upload.tail_start() as u64;
        if !tail.is_empty() {
            self.parts
                .put_tail(&upload.key, &upload.handle, tail_start, tail)
                .await?;
        }
        upload.sha256_state = hash::save(&hasher);
        if !self.advance(&upload, before.offset).await? {
            return Err(ResumableError::OffsetMismatch(before.offset as u64));
        }
        if let Some((start, end)) = old_tail {
            // The new state no longer points at it; a failure leaves it to
            // the sweeper (a tail no record names) or the abort.
            let _ = self
                .parts
                .delete_tail(&upload.key, &upload.handle, start, end)
                .await;
        }
        match cut {
            // The client is gone; what it sent is kept for its HEAD.
            Some(cut) => Err(cut.into()),
            None => Ok(Patched::Partial(upload)),
        }
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
    ) -> Result<Patched> {
        if !last.is_empty() {
            let number = upload.parts.len() as i32 + 1;
            let start = upload.tail_start() as u64;
            let tag = self
                .parts
                .put_part(&upload.key, &upload.handle, number, start, last)
                .await?;
            upload.parts.push(tag);
        }
        upload.sha256_state = hash::save(&hasher);
        upload.expires_at = self.expires_at();
        if !self.advance(&upload, before_offset).await? {
            return Err(ResumableError::OffsetMismatch(before_offset as u64));
        }
        if let Some((start, end)) = old_tail
            && let Err(e) = self
                .parts
                .delete_tail(&upload.key, &upload.handle, start, end)
                .await
        {
            tracing::warn!(upload = %upload.id, error = %e, "could not drop a finished upload's tail");
        }
        self.finish(user, upload).await
    }

    /// Advances the state to `upload` if it is still at `expected`
    /// ([`ResumableRepo::advance_resumable`]), its answer settled: a write
    /// whose answer was lost is read back, so that an offset that moved is
    /// answered as moved and one that did not as a failure that changed
    /// nothing; if even the read fails, the outcome is unknown (504, the
    /// client's HEAD tells).
    ///
    /// [`ResumableRepo::advance_resumable`]: crate::meta::ResumableRepo::advance_resumable
    async fn advance(&self, upload: &ResumableRecord, expected: i64) -> Result<bool> {
        let error = match self.resumables.advance_resumable(upload, expected).await {
            Ok(advanced) => return Ok(advanced),
            Err(e) => e,
        };
        tracing::warn!(upload = %upload.id, error = %error, "the state's update went unanswered; reading it back");
        match self.resumables.resumable(&upload.id).await {
            Ok(Some(now)) if same_progress(&now, upload) => Ok(true),
            Ok(Some(now)) if now.offset == expected => Err(error.into()),
            // Another request moved it, or it is gone.
            Ok(_) => Ok(false),
            Err(_) => {
                Err(DomainError::OutcomeUnknown(Some(format!("/v1/uploads/{}", upload.id))).into())
            }
        }
    }
}

/// Whether `stored` holds the bytes `sent` records (the same offset, parts
/// and hash state): the write of `sent` applied.
fn same_progress(stored: &ResumableRecord, sent: &ResumableRecord) -> bool {
    (stored.offset, &stored.parts, &stored.sha256_state)
        == (sent.offset, &sent.parts, &sent.sha256_state)
}
