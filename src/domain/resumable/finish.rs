//! Finishing an upload whose bytes are all stored: complete the blob, decide
//! its type, commit the file. Nothing of it is undone when the commit is
//! refused (a quota, a lock wait that ran out, an outage) or its outcome is
//! unknown: the state stays, at the end offset, and the next PATCH or HEAD
//! at that offset finishes it. Only a refusal that no retry can change (a
//! type outside the allow-list, an upload the sweeper took) ends it. A
//! committed upload's state stays, marked so, until it expires: its `HEAD`
//! and a PATCH at the end answer "complete" with the file's id.

use bytes::Bytes;

use super::{Patched, Result, ResumableError, ResumableService, hash, release};
use crate::{
    blob::{BlobError, ByteStream},
    domain::{
        DomainError, Filename, SizeCategory, media,
        upload::{Commit, Hold, OnDrop, Refusal, StoredBlob},
    },
    meta::{FileRecord, IntentRecord, ResumableRecord, StateAdvance, UserRecord},
    vocab::FileId,
};

/// What the request that stored an upload's last bytes knows, which spares
/// finishing it reads and requests of its own.
#[derive(Default)]
pub(super) struct Fresh {
    /// The upload's first bytes (up to [`media::SNIFF_BYTES`]), when this
    /// request read them: its type is decided from them.
    pub head: Option<Bytes>,
    /// The upload's intent, as this request renewed it.
    pub intent: Option<IntentRecord>,
    /// This request moved the state to the end from short of it (and the
    /// expiry with it), and still holds the upload's lease: no commit of
    /// the upload can have run before.
    pub advanced: bool,
    /// The tail the state named before the last part is deleted (or there
    /// was none): what else is in staging (a tail an earlier PATCH failed
    /// to delete, or stored and then lost a race with) no state needs, and
    /// the sweeper's staging pass removes it.
    pub staging_clear: bool,
    /// The state as stored, when this request stored the last bytes and
    /// did not record them: the commit's transaction records them if it
    /// is still so ([`StateAdvance`]); after a commit that did not apply,
    /// this request records them.
    pub unrecorded: Option<Box<ResumableRecord>>,
}

/// How an upload came to be done.
enum Ended {
    /// This request's commit applied; its transaction marked the state
    /// committed. `staging_clear`: nothing is left in staging that a state
    /// names ([`Fresh`]); `renewed`: this request stored the state's expiry
    /// as it stored the last bytes.
    Committed { staging_clear: bool, renewed: bool },
    /// Its file was found committed (an earlier commit's answer was lost,
    /// or another request's), or the commit replayed a first one.
    Found,
}

/// A PATCH body with no bytes.
fn empty_body() -> ByteStream<'static> {
    Box::pin(futures::stream::empty())
}

impl ResumableService {
    /// The upload for `HEAD`: one whose bytes are all stored but whose file
    /// is not committed yet (its final PATCH failed) is finished first, so
    /// that `Upload-Offset` reaches `Upload-Length` only for a committed file.
    /// A PATCH in flight is asked to let go first ([`Self::lock`]).
    pub async fn head(&self, user: &UserRecord, id: &FileId) -> Result<ResumableRecord> {
        let upload = self.find(user, id).await?;
        if upload.committed {
            return self.committed(user, upload).await.map(Patched::into_upload);
        }
        // Under the lock: a PATCH in flight is asked to store what it has
        // and let go, so that the offset is the one to resume from.
        let guard = match self.lock(id, super::HEAD_TAKE_OVER_WAIT).await {
            Ok(guard) => guard,
            // Still held: the stored offset is the answer (a PATCH from it
            // learns whether the holder moved it).
            Err(ResumableError::Locked) if !upload.all_stored() => {
                return self.find(user, id).await;
            }
            Err(e) => return Err(e),
        };
        let result = async {
            let upload = self.find(user, id).await?;
            if upload.committed {
                return self.committed(user, upload).await.map(Patched::into_upload);
            }
            if !upload.all_stored() {
                return Ok(upload);
            }
            // A deferred length declared at the offset: the tail becomes
            // the last part first (an empty append does that).
            let finished = async move {
                match upload.last_part_stored() {
                    true => self.finish(user, upload).await,
                    false => {
                        self.append(user, upload, None, empty_body(), None, None)
                            .await
                    }
                }
            };
            tokio::select! {
                r = finished => r.map(Patched::into_upload),
                never = self.admission.keep_alive(&user.id, id) => match never {},
            }
        }
        .await;
        release(guard).await;
        result
    }

    /// Completes the blob (once: completing again is harmless) and commits
    /// the file, under the upload's lock.
    pub(super) async fn finish(
        &self,
        user: &UserRecord,
        upload: ResumableRecord,
    ) -> Result<Patched> {
        self.finish_fresh(user, upload, Fresh::default()).await
    }

    /// [`Self::finish`], sparing what `fresh` says is known.
    pub(super) async fn finish_fresh(
        &self,
        user: &UserRecord,
        mut upload: ResumableRecord,
        mut fresh: Fresh,
    ) -> Result<Patched> {
        if upload.committed {
            return self.committed(user, upload).await;
        }
        // Committed before: that commit's answer was lost, or its record's
        // update failed. Not when this request just moved the state to the
        // end: no commit runs before that.
        if !fresh.advanced
            && let Some(file) = self.files.file(&user.id, &upload.id).await?
        {
            return Ok(self.done(upload, file, Ended::Found).await);
        }
        // Before the blob is completed: an upload the sweeper took (its
        // intent now an orphan, whose blob it deleted or will) must not be
        // completed into an object nobody owns.
        // The intent this request renewed, if it did (a commit after the
        // sweeper took it since is refused: the intent is gone).
        let intent = match fresh.intent.take() {
            Some(intent) => Some(intent),
            None => self.cleanup.intent(&upload.user_id, &upload.id).await?,
        };
        let Some(intent) = intent else {
            return self.taken(user, upload).await;
        };
        // Only an upload whose bytes are all stored is finished: its length is known.
        let len = upload.known_length().unwrap_or(upload.offset as u64);
        let completed_now = !upload.completed;
        if completed_now {
            self.parts
                .complete(&upload.key, &upload.handle, &upload.parts, len)
                .await?;
            upload.completed = true;
        }
        let unrecorded = fresh.unrecorded.clone();
        let finished = self
            .commit_completed(user, upload.clone(), intent, len, fresh)
            .await;
        if let (Some(before), Err(_)) = (unrecorded, &finished) {
            return self.record_after(user, &upload, &before, finished).await;
        }
        // A commit that applied records the completion with its mark
        // (`done`); one that did not records it here, so that the next try
        // does not complete again (and the sweeper knows the object is whole).
        if completed_now && finished.is_err() {
            let recorded = self
                .resumables
                .advance_resumable(&upload, upload.progress());
            if let Err(e) = recorded.await {
                tracing::warn!(upload = %upload.id, error = %e, "could not record the completion; the next try completes again");
            }
        }
        finished
    }

    /// After a commit that did not apply (`failed`), records the bytes it
    /// would have (from `before`), so that the next try sends them no more:
    /// then, or if even that write fails (the bytes sent again are found
    /// stored), the commit's error stands; if the upload moved on since
    /// (another request wrote it), the client learns where it is now.
    async fn record_after(
        &self,
        user: &UserRecord,
        upload: &ResumableRecord,
        before: &ResumableRecord,
        failed: Result<Patched>,
    ) -> Result<Patched> {
        // Ended (its type refused, by the hook too, or swept): nothing is
        // left to record.
        if let Err(ResumableError::Domain(
            DomainError::UploadExpired
            | DomainError::UnsupportedMediaType(_)
            | DomainError::RejectedByHook(_),
        )) = &failed
        {
            return failed;
        }
        let unknown = matches!(
            &failed,
            Err(ResumableError::Domain(DomainError::OutcomeUnknown(_)))
        );
        match self.advance(upload, before.progress()).await {
            // Not recorded: sent again, the bytes are found stored.
            Ok(true) | Err(_) => failed,
            // It may have applied: the client's HEAD tells.
            Ok(false) if unknown => failed,
            Ok(false) => match self.resumables.resumable(&upload.user_id, &upload.id).await {
                // Recorded by the commit's own transaction (a group's that
                // refused this upload, past the quota, and committed others).
                Ok(Some(now)) if now.same_bytes(upload) && !now.committed => failed,
                // Boxed: finishing again from there is a recursion.
                _ => Box::pin(self.lost_last(user, before, upload, None)).await,
            },
        }
    }

    /// Decides the completed upload's type and commits its file.
    async fn commit_completed(
        &self,
        user: &UserRecord,
        upload: ResumableRecord,
        intent: IntentRecord,
        len: u64,
        fresh: Fresh,
    ) -> Result<Patched> {
        // As a plain upload's: detected when the client named no real type,
        // and checked against the allow-list.
        let (allowed, idle) = (&self.limits.allowed_types, self.limits.body_idle_timeout);
        let declared = &upload.content_type;
        let stored_type = media::stored_type(
            &*self.blobs,
            &intent.key,
            declared,
            len,
            allowed,
            idle,
            fresh.head,
        );
        let content_type = match stored_type.await {
            Ok(t) => t,
            Err(e @ DomainError::UnsupportedMediaType(_)) => {
                if let Err(d) = self.discard(&upload, intent).await {
                    tracing::warn!(upload = %upload.id, error = %d, "a refused upload is left to expire");
                }
                return Err(e.into());
            }
            // The sweeper may have taken it meanwhile (and its blob).
            Err(e) => match self.cleanup.intent(&upload.user_id, &upload.id).await? {
                None => return self.taken(user, upload).await,
                Some(_) => return Err(e.into()),
            },
        };
        let category = SizeCategory::from_declared_len(Some(len));
        let hasher = hash::restore(&upload.sha256_state)?;
        let stored = StoredBlob {
            filename: Filename::parse(&upload.filename).map_err(DomainError::InvalidRequest)?,
            content_type,
            size: len,
            sha256: hash::finish(hasher),
            category,
            idempotency_key: None,
            resumable: true,
            state: fresh.unrecorded.map(|before| {
                Box::new(StateAdvance {
                    record: upload.clone(),
                    from: before.progress(),
                })
            }),
        };
        // The pre-commit hook's no ends the upload as a refused type does
        // (its bytes, state and intent go); its silence under `reject`
        // leaves it for the next try (a HEAD or a PATCH at the end).
        let asked = self.committer.ask_hook(&user.id, upload.id, &stored);
        match asked.await {
            Ok(()) => {}
            Err(e @ DomainError::RejectedByHook(_)) => {
                return self.refused(user, upload, &intent, e).await;
            }
            Err(e) => return Err(e.into()),
        }
        // The state names the blob: whatever the commit's answer, it stays
        // for the next try, and only a refusal no retry changes ends it.
        let mut staged = self.committer.staged(intent, OnDrop::Keep);
        let committed = self
            .committer
            .commit(&mut staged, Hold::none(category), stored);
        match committed.await {
            Commit::Committed(file) => Ok(self
                .done(
                    upload,
                    file,
                    Ended::Committed {
                        staging_clear: fresh.staging_clear,
                        renewed: fresh.advanced,
                    },
                )
                .await),
            Commit::Refused(Refusal::KeyUsed { first, .. }) => {
                Ok(self.done(upload, first.file, Ended::Found).await)
            }
            Commit::Refused(Refusal::Error(e)) => {
                // An earlier commit whose answer was lost may have applied.
                let file = match self.files.file(&user.id, &upload.id).await {
                    Ok(file) => file,
                    // Not knowing whether another request committed it,
                    // nothing is dropped: its object may be a file's.
                    Err(_) => {
                        let at = format!("/v1/uploads/{}", upload.id);
                        return Err(DomainError::OutcomeUnknown(Some(at)).into());
                    }
                };
                if let Some(file) = file {
                    return Ok(self.done(upload, file, Ended::Found).await);
                }
                if matches!(e, DomainError::UploadExpired) {
                    // Swept while finishing: the sweeper may have deleted
                    // the blob before it was completed, so the object goes
                    // here too (nobody owns it: no intent, no file).
                    self.drop_unowned(&upload).await;
                }
                Err(e.into())
            }
            // The state stays: the next HEAD or PATCH at the end reads the
            // file (it applied) or commits again (it did not: the intent the
            // commit deletes, and the file's id, let only one apply).
            Commit::Unknown(_) => {
                Err(DomainError::OutcomeUnknown(Some(format!("/v1/uploads/{}", upload.id))).into())
            }
        }
    }

    /// The pre-commit hook refused `upload`: ended for good, its intent
    /// abandoned first (no commit can apply after, whatever happens next;
    /// the hook may have taken long enough for this request's lease to
    /// pass to another), then its write, object and state dropped. Its
    /// intent found gone, another request committed it (the file stands:
    /// done) or the sweeper took it; not abandoned (the store away), the
    /// upload stays as it was for the next try, which asks again.
    async fn refused(
        &self,
        user: &UserRecord,
        upload: ResumableRecord,
        intent: &IntentRecord,
        refusal: DomainError,
    ) -> Result<Patched> {
        match self.committer.refuse(intent).await? {
            true => {
                self.drop_unowned(&upload).await;
                Err(refusal.into())
            }
            false => self.taken(user, upload).await,
        }
    }

    /// An upload whose file is committed: done, while the file is there (a
    /// retried final PATCH, or the `HEAD` of a client whose final PATCH
    /// lost its answer); gone once the user deleted the file.
    async fn committed(&self, user: &UserRecord, upload: ResumableRecord) -> Result<Patched> {
        match self.files.file(&user.id, &upload.id).await? {
            Some(file) => Ok(Patched::Done {
                upload,
                file: Box::new(file),
            }),
            None => {
                self.forget(&upload).await;
                Err(DomainError::NotFound.into())
            }
        }
    }

    /// An upload whose intent is gone: its commit (which deletes the intent
    /// too) applied since the file was read (another request's, the lock
    /// lost or degraded), or the sweeper took it (expired, or its user being
    /// deleted: the intent's orphan covers the object's key, but not the
    /// blob store's write, which the state alone names).
    async fn taken(&self, user: &UserRecord, upload: ResumableRecord) -> Result<Patched> {
        if let Some(file) = self.files.file(&user.id, &upload.id).await? {
            return Ok(self.done(upload, file, Ended::Found).await);
        }
        self.drop_unowned(&upload).await;
        Err(DomainError::UploadExpired.into())
    }

    /// Ends an upload nobody will own (no file, no intent): its blob store
    /// write (aborted, or its staging cleared once completed) and the
    /// object under its key (the intent's orphan may have been deleted
    /// before the completion made it), then its state. A write that cannot
    /// be dropped keeps the state, which names it, for the sweeper to abort
    /// when it expires (or the user's deletion).
    async fn drop_unowned(&self, upload: &ResumableRecord) {
        if let Err(e) = self.drop_write(upload).await {
            tracing::warn!(upload = %upload.id, error = %e, "could not drop an unowned upload's write; the sweeper aborts it");
            return;
        }
        self.forget(upload).await;
    }

    pub(super) async fn drop_write(
        &self,
        upload: &ResumableRecord,
    ) -> std::result::Result<(), BlobError> {
        let (key, handle) = (&upload.key, &upload.handle);
        match upload.completed {
            true => self.parts.clear_staging(key, handle).await?,
            false => self.parts.abort(key, handle).await?,
        }
        match self.blobs.delete(key).await {
            Ok(()) | Err(BlobError::NotFound) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// The upload is over: its blob is the file's; what is left in staging
    /// (a tail whose delete failed) goes, unless this request's commit says
    /// there is none (what a failed PATCH left there the sweeper removes);
    /// the state is marked committed (and completed) and kept until it
    /// expires, so that a client that missed this answer learns from
    /// `HEAD` (or a PATCH at the end) that it is complete. A commit of this
    /// request marked it in its own transaction: then only an expiry too
    /// near is renewed.
    async fn done(&self, mut upload: ResumableRecord, file: FileRecord, ended: Ended) -> Patched {
        if !matches!(
            ended,
            Ended::Committed {
                staging_clear: true,
                ..
            }
        ) && let Err(e) = self.parts.clear_staging(&upload.key, &upload.handle).await
        {
            tracing::warn!(upload = %upload.id, error = %e, "could not clear a finished upload's staging");
        }
        let marked = matches!(ended, Ended::Committed { .. });
        if marked {
            (upload.committed, upload.completed, upload.open) = (true, true, false);
            upload.reserved = 0;
        }
        let before = upload.progress();
        upload.committed = true;
        // Answerable for a whole expiry from now: a client that missed this
        // answer asks HEAD, and must not find it expired (and upload again).
        // Stored by this request with the last bytes: renewed again only
        // when less than half of it is left.
        let renewed = self.expires_at();
        let half = self.limits.expiry / 2;
        let stored = matches!(ended, Ended::Committed { renewed: true, .. });
        if stored && upload.expires_at > renewed - half {
            return Patched::Done {
                upload,
                file: Box::new(file),
            };
        }
        upload.expires_at = upload.expires_at.max(renewed);
        match self.resumables.advance_resumable(&upload, before).await {
            Ok(true) => {}
            // Gone (expired meanwhile), or marked by another request.
            Ok(false) => {}
            // Its HEAD and PATCH still find the file committed.
            Err(e) => {
                tracing::warn!(upload = %upload.id, error = %e, "could not mark a finished upload committed")
            }
        }
        Patched::Done {
            upload,
            file: Box::new(file),
        }
    }

    /// Drops the state (a failure leaves it to expire).
    async fn forget(&self, upload: &ResumableRecord) {
        if let Err(e) = self.drop_state(&upload.user_id, &upload.id).await {
            tracing::warn!(upload = %upload.id, error = %e, "could not drop a finished upload's state");
        }
    }

    /// Ends an upload whose file can never commit: the blob store's write,
    /// the completed object (or its orphan) and the intent, then the state.
    /// If the write cannot be aborted, the state stays for the sweeper,
    /// which aborts it when it expires.
    pub(super) async fn discard(
        &self,
        upload: &ResumableRecord,
        intent: IntentRecord,
    ) -> Result<()> {
        let (key, handle) = (&upload.key, &upload.handle);
        match upload.completed {
            true => self.parts.clear_staging(key, handle).await?,
            false => self.parts.abort(key, handle).await?,
        }
        self.committer.staged(intent, OnDrop::Keep).undo().await;
        self.drop_state(&upload.user_id, &upload.id).await?;
        Ok(())
    }
}
