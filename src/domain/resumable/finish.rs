//! Finishing an upload whose bytes are all stored: complete the blob, decide
//! its type, commit the file. Nothing of it is undone when the commit is
//! refused (a quota, a lock wait that ran out, an outage) or its outcome is
//! unknown: the state stays, at the end offset, and the next PATCH or HEAD
//! at that offset finishes it. Only a refusal that no retry can change (a
//! type outside the allow-list, an upload the sweeper took) ends it.

use super::{Patched, Result, ResumableService, hash, release};
use crate::{
    blob::ByteStream,
    domain::{
        DomainError, Filename, SizeCategory, media,
        upload::{Commit, Hold, OnDrop, Refusal, StoredBlob},
    },
    meta::{FileRecord, IntentRecord, ResumableRecord, UserRecord},
    vocab::FileId,
};

/// A PATCH body with no bytes.
fn empty_body() -> ByteStream<'static> {
    Box::pin(futures::stream::empty())
}

impl ResumableService {
    /// The upload for `HEAD`: one whose bytes are all stored but whose file
    /// is not committed yet (its final PATCH failed) is finished first, so
    /// that `Upload-Offset` reaches `Upload-Length` only for a committed file.
    pub async fn head(&self, user: &UserRecord, id: &FileId) -> Result<ResumableRecord> {
        let upload = self.find(user, id).await?;
        if !upload.all_stored() {
            return Ok(upload);
        }
        let guard = self.lock(id).await?;
        let result = async {
            let upload = self.find(user, id).await?;
            if !upload.all_stored() {
                return Ok(upload);
            }
            // A deferred length declared at the offset: the tail becomes
            // the last part first (an empty append does that).
            let finished = async move {
                match upload.last_part_stored() {
                    true => self.finish(user, upload).await,
                    false => self.append(user, upload, None, empty_body()).await,
                }
            };
            tokio::select! {
                r = finished => r.map(Patched::into_upload),
                never = self.admission.keep_alive(id) => match never {},
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
        mut upload: ResumableRecord,
    ) -> Result<Patched> {
        // Committed before: that commit's answer was lost, or its state's delete failed.
        if let Some(file) = self.files.file(&user.id, &upload.id).await? {
            return Ok(self.done(upload, file).await);
        }
        // Only an upload whose bytes are all stored is finished: its length is known.
        let len = upload.known_length().unwrap_or(upload.offset as u64);
        if !upload.completed {
            self.parts
                .complete(&upload.key, &upload.handle, &upload.parts, len)
                .await?;
            upload.completed = true;
            if let Err(e) = self
                .resumables
                .advance_resumable(&upload, upload.offset)
                .await
            {
                tracing::warn!(upload = %upload.id, error = %e, "could not record the completion; the next try completes again");
            }
        }
        let Some(intent) = self.cleanup.intent(&upload.id).await? else {
            // Swept (expired): the sweeper has its blob.
            self.forget(&upload).await;
            return Err(DomainError::UploadExpired.into());
        };
        // As a plain upload's: detected when the client named no real type,
        // and checked against the allow-list.
        let (allowed, idle) = (&self.limits.allowed_types, self.limits.body_idle_timeout);
        let declared = &upload.content_type;
        let stored_type =
            media::stored_type(&*self.blobs, &intent.key, declared, len, allowed, idle);
        let content_type = match stored_type.await {
            Ok(t) => t,
            Err(e @ DomainError::UnsupportedMediaType(_)) => {
                if let Err(d) = self.discard(&upload, intent).await {
                    tracing::warn!(upload = %upload.id, error = %d, "a refused upload is left to expire");
                }
                return Err(e.into());
            }
            Err(e) => return Err(e.into()),
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
        };
        // The state names the blob: whatever the commit's answer, it stays
        // for the next try, and only a refusal no retry changes ends it.
        let mut staged = self.committer.staged(intent, OnDrop::Keep);
        let committed = self
            .committer
            .commit(&mut staged, Hold::none(category), stored);
        match committed.await {
            Commit::Committed(file) => Ok(self.done(upload, file).await),
            Commit::Refused(Refusal::KeyUsed { first, .. }) => {
                Ok(self.done(upload, first.file).await)
            }
            Commit::Refused(Refusal::Error(e)) => {
                // An earlier commit whose answer was lost may have applied.
                if let Ok(Some(file)) = self.files.file(&user.id, &upload.id).await {
                    return Ok(self.done(upload, file).await);
                }
                if matches!(e, DomainError::UploadExpired) {
                    self.forget(&upload).await;
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

    /// The upload is over: its blob is the file's; what is left in staging
    /// (a tail whose delete failed) and its state go.
    async fn done(&self, upload: ResumableRecord, file: FileRecord) -> Patched {
        if let Err(e) = self.parts.clear_staging(&upload.key, &upload.handle).await {
            tracing::warn!(upload = %upload.id, error = %e, "could not clear a finished upload's staging");
        }
        self.forget(&upload).await;
        Patched::Done {
            upload,
            file: Box::new(file),
        }
    }

    /// Drops the state (a failure leaves it to expire: its HEAD and PATCH
    /// find the file committed).
    async fn forget(&self, upload: &ResumableRecord) {
        if let Err(e) = self.resumables.delete_resumable(&upload.id).await {
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
        self.resumables.delete_resumable(&upload.id).await?;
        Ok(())
    }
}
