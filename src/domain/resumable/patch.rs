//! A PATCH: append the body at the stored offset. The part writer stores
//! whole parts as they fill (a few in flight, as a plain upload's do); what
//! is left when the body ends becomes the new tail. The state advances only
//! after every byte of the PATCH is stored, by a conditional write on the
//! offset; a PATCH whose checksum does not match advances nothing (its
//! parts are overwritten by the next PATCH or dropped by the abort). Memory:
//! one part being filled plus the parts in flight, whatever the file size.

use std::sync::Arc;

use bytes::Bytes;
use futures::{FutureExt, StreamExt};
use sha2_state::Digest;
use tokio_util::sync::CancellationToken;

use super::{
    Checksum, Patched, Result, ResumableError, ResumableService,
    finish::Fresh,
    hash, release,
    stop::{Stopped, UserLeaving, let_go, until_released},
};
use crate::{
    blob::{
        BlobError, BodyError, ByteStream, bounded,
        resumable::{Appended, WriteAt, append},
    },
    domain::{DomainError, media::SNIFF_BYTES},
    lock::{Asked, LockGuard, LockKey, ReleaseListener},
    meta::{IntentRecord, MetaError, Progress, ResumableRecord, UserRecord},
    vocab::FileId,
};

/// A cut body's error: `Released` when another request's ask cut it.
fn cut_error(cut: BodyError, released: bool) -> ResumableError {
    match released {
        true => ResumableError::Released,
        false => cut.into(),
    }
}

impl ResumableService {
    /// Appends `body` to upload `id` of `user`, which the client says is
    /// at `offset`; `length` is the PATCH's `Upload-Length` (which
    /// declares a deferred one).
    #[allow(clippy::too_many_arguments)]
    pub async fn patch(
        &self,
        user: &UserRecord,
        id: &FileId,
        offset: u64,
        length: Option<u64>,
        checksum: Option<Checksum>,
        body: ByteStream<'static>,
    ) -> Result<Patched> {
        self.find(user, id).await?;
        let guard = self.lock(id, super::TAKE_OVER_WAIT).await?;
        // Another request's ask to let go (a client resuming after its link
        // died silently) ends the body here as a cut would; the deletion
        // of its user, asking too, ends the PATCH (`stop.rs`).
        let listener = match &guard {
            Some(_) => Some(self.locks.listen_for_release(&LockKey::resumable(id)).await),
            None => None,
        };
        let asked = listener.as_ref().map(ReleaseListener::requests);
        let result = async {
            let upload = self.find(user, id).await?;
            if upload.offset as u64 != offset {
                return Err(ResumableError::OffsetMismatch(upload.offset as u64));
            }
            let slot = self.admission.reserve(user)?;
            // Declared once the checks that need no body have passed: a
            // declaration stands whatever the body does next (tus: the
            // length, once set, never changes).
            let upload = match length {
                Some(length) => self.declare(upload, length).await?,
                None => upload,
            };
            let lost = guard.as_ref().map(LockGuard::lost);
            let r = tokio::select! {
                r = self.append(user, upload, checksum, body, lost, asked) => r,
                never = self.admission.keep_alive(&user.id, id) => match never {},
            };
            drop(slot);
            r
        }
        .await;
        drop(listener);
        release(guard).await;
        result
    }

    /// A PATCH that found the upload moved on under it: a blob write of
    /// its (before it advanced the state) that the store refused, not for
    /// being away (`error`), or a state update whose condition no longer
    /// held (`None`). Another request from the same progress may have won
    /// the race (with the lock backend down nothing keeps two out; with the
    /// lease lost, another request held the upload), or the sweeper expired
    /// it. The state tells, against `read` (what this PATCH started from):
    /// gone, not found; not moved, the store's error stands; unreadable,
    /// the metadata store's unavailability; moved to the
    /// end from where this PATCH was (another request stored the last part
    /// from the staged tail), finished, as this request would have; else
    /// the client is answered where it is now.
    pub(super) async fn lost_race(
        &self,
        user: &UserRecord,
        read: &ResumableRecord,
        error: Option<BlobError>,
    ) -> Result<Patched> {
        // A store's failure, or another request's bytes where this one
        // wrote (a small upload's one object): the state tells which stands.
        let error = match error.map(DomainError::from) {
            Some(e @ (DomainError::Internal(_) | DomainError::WriteConflict)) => Some(e),
            Some(e) => return Err(e.into()),
            None => None,
        };
        let now = match (
            self.resumables.resumable(&read.user_id, &read.id).await,
            error,
        ) {
            (Ok(Some(now)), Some(e))
                if now.progress() == read.progress() && now.same_bytes(read) =>
            {
                return Err(e.into());
            }
            (Ok(Some(now)), _) => now,
            (Ok(None), _) => return Err(DomainError::NotFound.into()),
            // Where the upload is cannot be read: the store's unavailability
            // is the answer (this PATCH recorded nothing), not the blob
            // store's refusal, which the state would have explained.
            (Err(e), _) => return Err(DomainError::from(e).into()),
        };
        tracing::info!(upload = %read.id, "a PATCH lost a race to another request on its upload");
        if now.last_part_stored() && (now.offset, now.length) == (read.offset, read.length) {
            return self.finish(user, now).await;
        }
        Err(ResumableError::OffsetMismatch(now.offset as u64))
    }

    pub(super) async fn append(
        &self,
        user: &UserRecord,
        upload: ResumableRecord,
        checksum: Option<Checksum>,
        body: ByteStream<'static>,
        lost: Option<CancellationToken>,
        asked: Option<Asked>,
    ) -> Result<Patched> {
        let stopped = Arc::new(Stopped::default());
        let let_go = asked.as_ref().map(let_go);
        let body = until_released(body, asked, self.leaving(user), stopped.clone());
        let owner = user.id.to_string();
        let before = upload.clone();
        let mut check = checksum.as_ref().map(Checksum::hasher);
        let mut hasher = hash::restore(&upload.sha256_state)?;
        // The file's first bytes, when this PATCH brings them: its type is
        // decided from them if it finishes the upload.
        let mut head = (upload.offset == 0).then(Vec::new);
        let limit = self.body_limit(user, &upload).await?;
        let appended = {
            let idle = self.limits.body_idle_timeout;
            let hashed = bounded(body, idle, limit.bytes).map(|chunk| {
                let chunk = chunk?;
                hasher.update(&chunk);
                if let Some(c) = check.as_mut() {
                    c.update(&chunk);
                }
                if let Some(h) = head.as_mut().filter(|h| h.len() < SNIFF_BYTES) {
                    h.extend_from_slice(&chunk[..chunk.len().min(SNIFF_BYTES - h.len())]);
                }
                Ok(chunk)
            });
            let at = WriteAt {
                key: &upload.key,
                handle: &upload.handle,
                part_size: upload.part_size as usize,
                parts: upload.parts.len(),
                offset: upload.offset as u64,
                left: Some(limit.bytes),
                user: Some(&owner),
                let_go: let_go.as_ref(),
            };
            // The lease lost while the body streams (this process stalled
            // past it, the lock backend lost it): another request may hold
            // the upload now, so this one stops, as a plain upload does,
            // and nothing of it is recorded.
            let appended = append(self.parts.clone(), at, hashed.boxed());
            let appended = match &lost {
                Some(lost) => tokio::select! {
                    r = appended => r,
                    _ = lost.cancelled() => return Err(DomainError::LockLost.into()),
                },
                None => appended.await,
            };
            match appended {
                Ok(appended) => appended,
                Err(e) => return self.lost_race(user, &upload, Some(e)).await,
            }
        };
        if lost.as_ref().is_some_and(CancellationToken::is_cancelled) {
            return Err(DomainError::LockLost.into());
        }
        if stopped.user_leaving() {
            // Bytes of a user being deleted: nothing of them is recorded
            // (the parts stored go with the write the deletion aborts once
            // this PATCH lets go), and the answer is a deleted user's.
            return Err(DomainError::from(MetaError::UserDeleting).into());
        }
        // `_held`: the tail's memory stays reserved until it is stored.
        let Appended {
            tags,
            tail,
            held: _held,
            read,
            cut,
        } = appended;
        // Cut by another request's ask, not by the client.
        let released =
            matches!(cut, Some(BodyError::LetGo)) || (cut.is_some() && stopped.released());
        if let Some(BodyError::TooLarge(_)) = cut {
            // Nothing of it counts.
            return Err(limit.past.into());
        }
        if let Some(c) = &checksum {
            if let Some(cut) = cut {
                // Half a body cannot be checked: none of it counts.
                return Err(cut_error(cut, released));
            }
            if !check.is_some_and(|h| c.matches(h)) {
                return Err(ResumableError::ChecksumMismatch);
            }
        }
        let mut upload = upload;
        upload.offset += read as i64;
        upload.parts.extend(tags);
        if before.last_part_stored() {
            // A final PATCH failed after storing every byte: only the
            // commit is left, and this PATCH (with an empty body) retries it.
            return self.finish(user, upload).await;
        }
        let intent = self.renew(&mut upload).await?;
        let old_tail = before.tail_start() as u64;
        let old_tail =
            (before.offset as u64 > old_tail).then_some((old_tail, before.offset as u64));
        if upload.all_stored() {
            let fresh = Fresh {
                head: head.map(Bytes::from),
                intent,
                ..Fresh::default()
            };
            let known = (hasher, fresh, lost.as_ref());
            return self
                .store_last(user, upload, &before, tail, known, old_tail)
                .await;
        }
        if upload.offset == before.offset {
            // Nothing arrived (an empty PATCH, or one cut before its first
            // byte): the stored tail is the one the state names. Writing it
            // again under that name and then dropping the old one would drop
            // it, so only the expiry is renewed.
            if !self.advance(&upload, before.progress()).await? {
                return self.lost_race(user, &before, None).await;
            }
            return match cut {
                Some(cut) => Err(cut_error(cut, released)),
                None => Ok(Patched::Partial(upload)),
            };
        }
        // A deferred length: what this PATCH stored is reserved first
        // (refused past the quota, and then nothing of it is recorded).
        let mut upload = self.reserve_stored(upload).await?;
        let tail_start = upload.tail_start() as u64;
        if !tail.is_empty() {
            let put = self
                .parts
                .put_tail(&upload.key, &upload.handle, tail_start, tail);
            if let Err(e) = put.await {
                return self.lost_race(user, &before, Some(e)).await;
            }
        }
        upload.sha256_state = hash::save(&hasher);
        if !self.advance(&upload, before.progress()).await? {
            return self.lost_race(user, &before, None).await;
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
            Some(cut) => Err(cut_error(cut, released)),
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
        before: &ResumableRecord,
        last: Bytes,
        (hasher, fresh, lost): (sha2_state::Sha256, Fresh, Option<&CancellationToken>),
        old_tail: Option<(u64, u64)>,
    ) -> Result<Patched> {
        let start = upload.tail_start() as u64;
        // A deferred length declared at the offset (an empty body): the
        // last bytes are the staged tail, read back to become the last part.
        let mut _held = None;
        let last = match last.is_empty() && (upload.offset as u64) > start {
            true => {
                let end = upload.offset as u64;
                let claim = self.parts.budget().claim(Some(&user.id.to_string()));
                let held = claim.reserve(end - start).await;
                _held = Some(held.map_err(|r| DomainError::from(BodyError::from(r)))?);
                let tail = self.parts.get_tail(&upload.key, &upload.handle, start, end);
                match tail.await {
                    Ok(tail) => tail,
                    Err(e) => return self.lost_race(user, before, Some(e)).await,
                }
            }
            false => last,
        };
        // Stored as one object by this PATCH alone, from the first byte:
        // the commit records the state ([`Fresh::unrecorded`]), and until
        // it does, sending the same bytes again finds them stored.
        let whole =
            self.parts.stores_whole(&upload.handle) && old_tail.is_none() && !last.is_empty();
        if !last.is_empty() {
            let number = upload.parts.len() as i32 + 1;
            let put = self
                .parts
                .put_part(&upload.key, &upload.handle, number, start, last);
            let tag = match put.await {
                Ok(tag) => tag,
                // A write that failed may have landed all the same.
                Err(e) => return self.lost_last(user, before, &upload, Some(e)).await,
            };
            upload.parts.push(tag);
        }
        upload.sha256_state = hash::save(&hasher);
        if whole && !lost.is_some_and(CancellationToken::is_cancelled) {
            let intent = fresh
                .intent
                .unwrap_or_else(|| self.committer.intent_of(&upload));
            let fresh = Fresh {
                intent: Some(intent),
                advanced: true,
                staging_clear: true,
                unrecorded: Some(Box::new(before.clone())),
                ..fresh
            };
            return self.finish_fresh(user, upload, fresh).await;
        }
        if !self.advance(&upload, before.progress()).await? {
            return self.lost_last(user, before, &upload, None).await;
        }
        let mut staging_clear = true;
        if let Some((start, end)) = old_tail
            && let Err(e) = self
                .parts
                .delete_tail(&upload.key, &upload.handle, start, end)
                .await
        {
            tracing::warn!(upload = %upload.id, error = %e, "could not drop a finished upload's tail");
            staging_clear = false;
        }
        // With its lease lost (this process stalled past it), another
        // request may have finished the upload meanwhile: what this one
        // knew is read again.
        let fresh = match lost.is_some_and(CancellationToken::is_cancelled) {
            true => Fresh::default(),
            false => Fresh {
                advanced: true,
                staging_clear,
                ..fresh
            },
        };
        self.finish_fresh(user, upload, fresh).await
    }

    /// Renews `upload`'s expiry as a PATCH is about to record its bytes,
    /// once less than half of it is left (a young upload's PATCH writes
    /// neither its expiry nor its intent): its intent first, to the same
    /// instant, so that the intent never lapses (and is swept) while the
    /// state it stands for lives. The intent, if renewed.
    async fn renew(&self, upload: &mut ResumableRecord) -> Result<Option<IntentRecord>> {
        let until = self.expires_at();
        if upload.expires_at >= until - self.limits.expiry / 2 {
            return Ok(None);
        }
        let touched = self
            .cleanup
            .touch_intent(&upload.user_id, &upload.id, Some(until));
        match touched.await? {
            Some(intent) => {
                upload.expires_at = until;
                Ok(Some(intent))
            }
            None => Err(DomainError::UploadExpired.into()),
        }
    }

    /// [`Self::lost_race`] for the PATCH that stored `upload`'s last part.
    /// If the upload went meanwhile (swept, or ended by its client), so
    /// does that part: on S3 a small upload's only part is its object,
    /// which nobody can own now (no intent and no file, read in that order:
    /// a commit deletes the one and inserts the other at once); else its
    /// write is dropped as the sweeper would.
    pub(super) async fn lost_last(
        &self,
        user: &UserRecord,
        before: &ResumableRecord,
        upload: &ResumableRecord,
        error: Option<BlobError>,
    ) -> Result<Patched> {
        let lost = self.lost_race(user, before, error).await;
        if let Err(ResumableError::Domain(DomainError::NotFound)) = &lost
            && let Ok(None) = self.cleanup.intent(&user.id, &upload.id).await
            && let Ok(None) = self.files.file(&user.id, &upload.id).await
            && let Err(e) = self.drop_write(upload).await
        {
            tracing::warn!(upload = %upload.id, error = %e, "could not drop a gone upload's last part");
        }
        lost
    }

    /// Whether `user` is being deleted, read when another request asks for
    /// the upload (a deletion pass does): then the PATCH stops at once.
    fn leaving(&self, user: &UserRecord) -> UserLeaving {
        let (admission, user) = (self.admission.clone(), user.id);
        Arc::new(move || {
            let admission = admission.clone();
            async move { admission.user_leaving(&user).await }.boxed()
        })
    }

    /// Advances the state to `upload` if it is still at `expected`
    /// ([`ResumableRepo::advance_resumable`]), its answer settled: a write
    /// whose answer was lost is read back, so that an offset that moved is
    /// answered as moved and one that did not as a failure that changed
    /// nothing; if even the read fails, the outcome is unknown (504, the
    /// client's HEAD tells).
    ///
    /// [`ResumableRepo::advance_resumable`]: crate::meta::ResumableRepo::advance_resumable
    pub(super) async fn advance(
        &self,
        upload: &ResumableRecord,
        expected: Progress,
    ) -> Result<bool> {
        let error = match self.resumables.advance_resumable(upload, expected).await {
            Ok(advanced) => return Ok(advanced),
            Err(e) => e,
        };
        tracing::warn!(upload = %upload.id, error = %error, "the state's update went unanswered; reading it back");
        match self.resumables.resumable(&upload.user_id, &upload.id).await {
            // Committed since by another request (a HEAD finishing it) is
            // still this write, applied: a commit is a later state of the
            // same bytes.
            // Unless committed since: then the commit moved it, and the
            // caller finishes from what it reads (`lost_race`), not from
            // what it knew before.
            Ok(Some(now)) if now.same_bytes(upload) && !now.committed => Ok(true),
            Ok(Some(now)) if now.progress() == expected => Err(error.into()),
            // Another request moved it, or it is gone.
            Ok(_) => Ok(false),
            Err(_) => {
                Err(DomainError::OutcomeUnknown(Some(format!("/v1/uploads/{}", upload.id))).into())
            }
        }
    }
}
