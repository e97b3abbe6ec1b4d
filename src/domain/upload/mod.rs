//! Uploads: the plain upload flow ([`UploadService`]: intent → bytes →
//! commit), and what it shares with resumable uploads: the admission gate
//! (`admission.rs`: slots, quota, keep-alive) and the commit
//! (`committer.rs`: locks, fence, group commit; `staged.rs`, `settle.rs`:
//! what becomes of a blob that did not commit).
//!
//! A plain upload: its intent first; the category lock (lock scope
//! `upload`); the body streamed to the blob store while it is hashed and
//! counted; the commit (lock scope `commit`: the category lock now). A
//! refused commit undoes the upload (blob deleted, or recorded as an
//! orphan); one whose answer was lost is settled.

mod admission;
mod committer;
mod group;
mod idempotency;
mod intents;
mod path;
mod precommit;
mod scope;
mod settle;
mod slots;
mod staged;
#[cfg(test)]
mod tests;

use std::{sync::Arc, time::Instant};

use bytes::Bytes;
use futures::StreamExt;
use sha2::{Digest, Sha256, Sha512};

pub use self::{
    admission::{Admission, Usage},
    committer::{Commit, Committer, Refusal, StoredBlob},
    idempotency::Idempotency,
    precommit::{Asking, PrecommitHook},
    scope::Hold,
    slots::{KeyClaim, UploadSlot},
    staged::{OnDrop, Staged},
};
use self::{idempotency::same_request, slots::InFlight};
use super::{DomainError, Filename, SizeCategory, digest::ExpectedDigest, media};
use crate::{
    blob::{BlobStore, BodyError, ByteStream, PutHint, bounded},
    config::{AllowedTypes, Settings},
    lock::LockGuard,
    meta::{FileRecord, UserRecord},
    metrics::Metrics,
    vocab::IdempotencyKey,
};

/// The plain upload flow and what it uses.
pub struct UploadService {
    admission: Arc<Admission>,
    committer: Arc<Committer>,
    blobs: Arc<dyn BlobStore>,
    idempotency: Idempotency,
    metrics: Arc<Metrics>,
    limits: Limits,
}

/// What an upload body is held to.
struct Limits {
    max_upload_bytes: u64,
    body_idle_timeout: std::time::Duration,
    allowed_types: AllowedTypes,
}

/// An upload as the HTTP layer hands it over.
pub struct NewUpload<'a> {
    pub filename: Filename,
    /// As the client declared it: a placeholder type is replaced by the one
    /// detected from the first bytes ([`media::resolve`]).
    pub content_type: String,
    /// The length the client declared, which picks the lock category.
    pub declared_len: Option<u64>,
    pub body: ByteStream<'a>,
    pub idempotency_key: Option<IdempotencyKey>,
    /// The digest the client declared (`Content-Digest`): the upload fails
    /// with nothing stored if the bytes do not match.
    pub expected_digest: Option<ExpectedDigest>,
}

/// What an upload produced.
#[derive(Debug)]
pub struct Uploaded {
    pub file: FileRecord,
    /// The result of an earlier request with the same idempotency key.
    pub replayed: bool,
}

impl UploadService {
    pub fn new(
        admission: Arc<Admission>,
        committer: Arc<Committer>,
        blobs: Arc<dyn BlobStore>,
        idempotency: Idempotency,
        metrics: Arc<Metrics>,
        settings: &Settings,
    ) -> Self {
        Self {
            admission,
            committer,
            blobs,
            idempotency,
            metrics,
            limits: Limits {
                max_upload_bytes: settings.max_upload_bytes,
                body_idle_timeout: settings.body_idle_timeout,
                allowed_types: settings.allowed_types.clone(),
            },
        }
    }

    /// One of `user`'s in-flight upload slots (see [`Admission::reserve`]).
    pub fn reserve(&self, user: &UserRecord) -> Result<UploadSlot<'_>, DomainError> {
        self.admission.reserve(user)
    }

    /// `user`'s usage (see [`Admission::usage`]).
    pub async fn usage(&self, user: &UserRecord) -> Result<Usage, DomainError> {
        self.admission.usage(user).await
    }

    /// Runs the upload `new` of `user`, who holds `slot` (from [`Self::reserve`]).
    pub async fn upload(
        &self,
        slot: UploadSlot<'_>,
        user: &UserRecord,
        new: NewUpload<'_>,
    ) -> Result<Uploaded, DomainError> {
        debug_assert_eq!(slot.user(), user.id, "a slot is the user's own");
        let started = Instant::now();
        let result = self.run(user, new).await;
        drop(slot);
        let outcome = match &result {
            Ok(u) if u.replayed => "replayed",
            Ok(_) => "committed",
            Err(e) => e.code(),
        };
        self.admission.count_outcome(outcome);
        if let Ok(u) = &result
            && !u.replayed
        {
            self.metrics.upload_bytes.inc_by(u.file.size as u64);
            self.metrics
                .upload_duration
                .observe(started.elapsed().as_secs_f64());
        }
        result
    }

    async fn run(
        &self,
        user: &UserRecord,
        mut new: NewUpload<'_>,
    ) -> Result<Uploaded, DomainError> {
        let (max, idle) = (self.limits.max_upload_bytes, self.limits.body_idle_timeout);
        if new.declared_len.is_some_and(|n| n > max) {
            return Err(DomainError::PayloadTooLarge(max));
        }
        // Before the intent: a refused type leaves nothing behind. Before the
        // idempotency check too: a replay is fingerprinted with the type the
        // first request was stored with.
        let allowed = &self.limits.allowed_types;
        let (content_type, body) =
            media::resolve(&new.content_type, new.body, allowed, idle).await?;
        (new.content_type, new.body) = (content_type, body);
        let mut _claim = None;
        if let Some(key) = &new.idempotency_key {
            match self.idempotency.claim(user, key).await? {
                Ok(claim) => _claim = Some(claim),
                Err(first) => {
                    same_request(
                        &first,
                        &new.filename,
                        &new.content_type,
                        new.body,
                        idle,
                        max,
                    )
                    .await?;
                    return Ok(Uploaded {
                        file: first.file,
                        replayed: true,
                    });
                }
            }
        }
        self.admission
            .check_declared_quota(user, new.declared_len)
            .await?;
        // The intent comes first: whatever happens next, the sweeper can find
        // the blob. It is kept alive until the upload has its answer.
        let intent = self.committer.new_intent(user.id);
        let staged = self.committer.stage(intent, OnDrop::Delete).await?;
        crate::crash_point("after_intent");
        let file_id = staged.file_id();
        tokio::select! {
            r = self.after_intent(user, new, staged) => r,
            never = self.admission.keep_alive(&user.id, &file_id) => match never {},
        }
    }

    /// Everything after the intent: the bytes, the commit, and undoing or
    /// settling what did not commit.
    async fn after_intent(
        &self,
        user: &UserRecord,
        new: NewUpload<'_>,
        mut staged: Staged,
    ) -> Result<Uploaded, DomainError> {
        let category = SizeCategory::from_declared_len(new.declared_len);
        let hold = match self.committer.before_bytes(&user.id, category).await {
            Ok(hold) => hold,
            Err(e) => {
                staged.forget().await;
                return Err(e);
            }
        };
        let _in_flight = InFlight::new(&self.metrics);
        let expected = new.expected_digest.as_ref();
        let stored = self
            .store_blob(
                user,
                &staged,
                (new.body, new.declared_len),
                hold.lease(),
                expected,
            )
            .await;
        let (size, sha256) = match stored {
            Ok(v) => {
                crate::crash_point("after_blob");
                v
            }
            Err(e) => {
                hold.release().await;
                staged.undo().await;
                return Err(e);
            }
        };
        let stored = StoredBlob {
            filename: new.filename,
            content_type: new.content_type,
            size,
            sha256,
            category,
            idempotency_key: new.idempotency_key,
            resumable: false,
            state: None,
        };
        // Refused by the pre-commit hook (or it is away and refuses): the
        // bytes and the intent go, nothing commits.
        let asked = self.committer.ask_hook(&user.id, staged.file_id(), &stored);
        if let Err(e) = asked.await {
            hold.release().await;
            staged.undo().await;
            return Err(e);
        }
        match self.committer.commit(&mut staged, hold, stored).await {
            Commit::Committed(file) => Ok(Uploaded {
                file,
                replayed: false,
            }),
            Commit::Refused(refusal) => {
                staged.undo().await;
                match refusal {
                    // Another request with the key committed while this one streamed.
                    Refusal::KeyUsed { first, same } => match same {
                        true => Ok(Uploaded {
                            file: first.file,
                            replayed: true,
                        }),
                        false => Err(DomainError::IdempotencyKeyMismatch),
                    },
                    Refusal::Error(e) => Err(e),
                }
            }
            Commit::Unknown(file) => {
                let file = self.committer.settle(staged, file).await?;
                Ok(Uploaded {
                    file,
                    replayed: false,
                })
            }
        }
    }

    /// Streams the body into the blob store, hashing and counting as it goes;
    /// stops early if the body passes the size limit or the user's quota,
    /// or the lease (scope = upload) is lost; fails if the bytes do not have
    /// the `expected` digest (the caller then deletes the blob). `body`
    /// comes with its declared length (Content-Length), when known.
    async fn store_blob(
        &self,
        user: &UserRecord,
        staged: &Staged,
        (body, declared_len): (ByteStream<'_>, Option<u64>),
        lease: Option<&LockGuard>,
        expected: Option<&ExpectedDigest>,
    ) -> Result<(u64, String), DomainError> {
        let mut hasher = Sha256::new();
        // Only when the client asked for it: SHA-512 costs as much again.
        let mut sha512 = expected
            .and_then(|e| e.sha512.as_ref())
            .map(|_| Sha512::new());
        let mut size = 0u64;
        let (max, idle) = (self.limits.max_upload_bytes, self.limits.body_idle_timeout);
        let counted = bounded(body, idle, max).map(|chunk: Result<Bytes, BodyError>| {
            let chunk = chunk?;
            size += chunk.len() as u64;
            hasher.update(&chunk);
            if let Some(h) = sha512.as_mut() {
                h.update(&chunk);
            }
            Ok(chunk)
        });
        let key = &staged.intent().key;
        let owner = user.id.to_string();
        let hint = PutHint {
            user: Some(&owner),
            at_most: declared_len,
        };
        let put = self.blobs.put_for(
            key,
            self.admission.within_quota(user, counted.boxed()),
            hint,
        );
        let written = match lease {
            Some(g) => {
                let lost = g.lost();
                tokio::select! {
                    r = put => r?,
                    _ = lost.cancelled() => return Err(DomainError::LockLost),
                }
            }
            None => put.await?,
        };
        debug_assert_eq!(written, size);
        let sha256 = hasher.finalize();
        if let Some(e) = expected {
            if e.sha256.as_deref().is_some_and(|d| d != sha256.as_slice()) {
                return Err(DomainError::DigestMismatch("sha-256"));
            }
            let sha512 = sha512.map(Sha512::finalize);
            if let (Some(want), Some(got)) = (&e.sha512, &sha512)
                && want.as_slice() != got.as_slice()
            {
                return Err(DomainError::DigestMismatch("sha-512"));
            }
        }
        Ok((size, hex::encode(sha256)))
    }
}
