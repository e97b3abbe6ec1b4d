//! The upload flow: intent → (lock, if scope = upload) → stream the blob
//! while hashing → (lock, if scope = commit) → one retried transaction →
//! release. On any failure the blob is deleted (or recorded as an orphan).

mod group;
mod idempotency;
mod intents;
mod quota;
mod settle;
mod slots;

use std::{sync::Arc, time::Instant};

use bytes::Bytes;
use futures::{Stream, StreamExt};
use sha2::{Digest, Sha256, Sha512};

pub(crate) use self::settle::CommitError;
use self::slots::InFlight;
pub use self::{
    group::CommitGroups,
    intents::IntentBatches,
    quota::Usage,
    slots::{InFlightKeys, KeyClaim, UploadSlot, UploadSlots},
};
use super::{
    DomainError, FileId, Filename, SizeCategory, UserId,
    commit::{UserCommitError, user_commit},
    digest::ExpectedDigest,
    media,
};
use crate::{
    blob::{BlobStore, BodyError, ByteStream},
    config::{LockScope, Settings},
    lock::{Held, LockKey, Locks},
    meta::retry::Transactions,
    meta::{
        CleanupRepo, CommitOutcome, CommitUpload, Fence, FileRecord, FileRepo, IdempotencyKey,
        IntentRecord, MetaError, UserRecord, UserRepo,
    },
    metrics::{Metrics, OutcomeLabel},
};

/// The upload flow and the ports it uses.
pub struct UploadService {
    pub(crate) files: Arc<dyn FileRepo>,
    /// The user's usage as the store has it, when the cached one would refuse.
    pub(crate) users: Arc<dyn UserRepo>,
    /// The upload's intent, and the orphan of a blob it could not delete.
    pub(crate) cleanup: Arc<dyn CleanupRepo>,
    pub(crate) blobs: Arc<dyn BlobStore>,
    pub(crate) locks: Arc<Locks>,
    pub(crate) txns: Transactions,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) settings: Arc<Settings>,
    pub(crate) upload_slots: UploadSlots,
    pub(crate) idempotency_keys: InFlightKeys,
    /// Group commit (`upload_group_commit`): the committers of this instance.
    pub(crate) groups: Arc<CommitGroups>,
    /// With group commit, intents of uploads that start together are
    /// written together.
    pub(crate) intents: Arc<IntentBatches>,
}

/// A blob stored at its intent's key, ready to commit.
pub(crate) struct StoredBlob {
    pub filename: Filename,
    pub content_type: String,
    pub size: u64,
    pub sha256: String,
    pub category: SizeCategory,
    pub idempotency_key: Option<String>,
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
    pub idempotency_key: Option<String>,
    /// The digest the client declared (`Content-Digest`): the upload fails
    /// with nothing stored if the bytes do not match.
    pub expected_digest: Option<ExpectedDigest>,
}

/// What an upload produced.
pub struct Uploaded {
    pub file: FileRecord,
    /// The result of an earlier request with the same idempotency key.
    pub replayed: bool,
}

impl UploadService {
    /// One of `user`'s in-flight upload slots, or `TooManyUploads` if this
    /// instance has `max_uploads_per_user` of theirs already. Taken before a
    /// byte of the body is read and held until the upload has its answer.
    pub fn reserve(&self, user: &UserRecord) -> Result<UploadSlot<'_>, DomainError> {
        let max = self.settings.max_uploads_per_user;
        self.upload_slots.take(&user.id, max).ok_or_else(|| {
            let refused = DomainError::TooManyUploads(max);
            self.count_outcome(refused.code());
            refused
        })
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
        self.count_outcome(outcome);
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

    fn count_outcome(&self, outcome: &str) {
        self.metrics
            .uploads
            .get_or_create(&OutcomeLabel {
                outcome: outcome.into(),
            })
            .inc();
    }

    async fn run(
        &self,
        user: &UserRecord,
        mut new: NewUpload<'_>,
    ) -> Result<Uploaded, DomainError> {
        let settings = &self.settings;
        let max = settings.max_upload_bytes;
        if new.declared_len.is_some_and(|n| n > max) {
            return Err(DomainError::PayloadTooLarge(max));
        }
        // Before the intent: a refused type leaves nothing behind. Before the
        // idempotency check too: a replay is fingerprinted with the type the
        // first request was stored with.
        let (content_type, body) = media::resolve(
            &new.content_type,
            new.body,
            &settings.allowed_types,
            settings.body_idle_timeout,
        )
        .await?;
        (new.content_type, new.body) = (content_type, body);
        let mut _claim = None;
        if let Some(key) = new.idempotency_key.clone() {
            match self.claim_key(user, &key).await? {
                Ok(claim) => _claim = Some(claim),
                Err(first) => return self.replay(first, new).await,
            }
        }
        self.check_declared_quota(user, new.declared_len).await?;

        let user_id = UserId::parse(&user.id)
            .ok_or_else(|| DomainError::internal(anyhow::anyhow!("bad user id")))?;
        let category = SizeCategory::from_declared_len(new.declared_len);
        let lock_key = LockKey::user_upload(&user_id, category.as_str());
        let file_id = FileId::new();
        let intent = IntentRecord {
            id: file_id.to_string(),
            user_id: user.id.clone(),
            bucket: self.blobs.bucket().to_owned(),
            key: format!("files/{user_id}/{file_id}"),
            created_at: crate::meta::now(),
            refreshed_at: None,
        };
        // The intent comes first: whatever happens next, the sweeper can find
        // the blob. It is kept alive until the upload has its answer, so that
        // only dead uploads are taken for abandoned ones, however long a live
        // one streams or waits for its lock.
        match settings.upload_group_commit {
            true => self.intents.put(intent.clone()).await?,
            false => self.cleanup.put_intent(&intent).await?,
        }
        crate::crash_point("after_intent");
        tokio::select! {
            r = self.after_intent(user, new, &intent, user_id, category, lock_key) => r,
            never = self.keep_alive(&intent.id) => match never {},
        }
    }

    /// Everything after the intent: lock (scope = upload), blob, lock (scope
    /// = commit), the commit, and undoing or settling what failed.
    async fn after_intent(
        &self,
        user: &UserRecord,
        new: NewUpload<'_>,
        intent: &IntentRecord,
        user_id: UserId,
        category: SizeCategory,
        lock_key: LockKey,
    ) -> Result<Uploaded, DomainError> {
        let (settings, max) = (&self.settings, self.settings.max_upload_bytes);
        let guard = match settings.lock.scope {
            LockScope::Upload => match self.locks.acquire(&lock_key).await {
                Ok(g) => Some(g),
                Err(e) => {
                    self.forget_intent(intent).await;
                    return Err(e.into());
                }
            },
            LockScope::Commit => None,
        };

        let _in_flight = InFlight::new(&self.metrics);
        let lease = guard.as_ref().and_then(Held::guard);
        let expected = new.expected_digest.as_ref();
        let stored = self
            .store_blob(user, intent, new.body, max, lease, expected)
            .await;
        let (size, sha256) = match stored {
            Ok(v) => {
                crate::crash_point("after_blob");
                v
            }
            Err(e) => {
                release(guard).await;
                self.compensate(intent).await;
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
        };
        self.commit_stored(user, intent, stored, guard, user_id, lock_key)
            .await
    }

    /// Commits a blob stored at the intent's key: takes the category lock
    /// (unless `guard` holds it already), commits under its fence in one
    /// retried transaction, releases, and undoes or settles what failed.
    pub(crate) async fn commit_stored(
        &self,
        user: &UserRecord,
        intent: &IntentRecord,
        stored: StoredBlob,
        guard: Option<Held>,
        user_id: UserId,
        lock_key: LockKey,
    ) -> Result<Uploaded, DomainError> {
        let (commit, committed) = self
            .try_commit(user, intent, stored, guard, user_id, lock_key)
            .await;
        match committed {
            Ok(CommitOutcome::Committed) => Ok(Uploaded {
                file: commit.file,
                replayed: false,
            }),
            Ok(CommitOutcome::Replayed(first)) => {
                self.compensate(intent).await;
                let ours = commit.idempotency.as_ref().map(|k| k.fingerprint.as_str());
                if !first.fingerprint.is_empty() && Some(first.fingerprint.as_str()) != ours {
                    return Err(DomainError::IdempotencyKeyMismatch);
                }
                Ok(Uploaded {
                    file: first.file,
                    replayed: true,
                })
            }
            Err(CommitError::OutcomeUnknown) => {
                self.settle_unknown_commit(intent, commit.file).await
            }
            Err(CommitError::Failed(e)) => {
                self.compensate(intent).await;
                Err(e)
            }
        }
    }

    /// The commit alone, with nothing undone or settled whatever its
    /// outcome: takes the category lock (unless `guard` holds it already),
    /// commits under its fence in one retried transaction, and releases.
    /// Answers what it tried to commit, and how that went.
    pub(crate) async fn try_commit(
        &self,
        user: &UserRecord,
        intent: &IntentRecord,
        stored: StoredBlob,
        mut guard: Option<Held>,
        user_id: UserId,
        lock_key: LockKey,
    ) -> (CommitUpload, Result<CommitOutcome, CommitError>) {
        let settings = &self.settings;
        let category = stored.category;
        // With group commit, the committer takes the category lock for the
        // whole group.
        let grouped = settings.upload_group_commit;
        let mut refused = None;
        if guard.is_none() && !grouped {
            match self.locks.acquire(&lock_key).await {
                Ok(g) => guard = Some(g),
                Err(e) => refused = Some(e),
            }
        }

        let idempotency = stored.idempotency_key.map(|key| IdempotencyKey {
            key,
            fingerprint: idempotency::fingerprint(
                &stored.sha256,
                stored.filename.as_str(),
                &stored.content_type,
            ),
        });
        let file = FileRecord {
            id: intent.id.clone(),
            owner_id: user.id.clone(),
            filename: stored.filename.as_str().to_owned(),
            content_type: stored.content_type,
            size: stored.size as i64,
            sha256: stored.sha256,
            category: category.as_str().to_owned(),
            bucket: intent.bucket.clone(),
            key: intent.key.clone(),
            created_at: crate::meta::now(),
            sessions: Vec::new(),
            agents: Vec::new(),
        };
        let commit = CommitUpload {
            file,
            fence: Fence::of_lock(guard.as_ref().and_then(Held::fence), category.as_str()),
            quota_bytes: settings.user_quota_bytes,
            idempotency,
        };
        if let Some(e) = refused {
            return (commit, Err(CommitError::Failed(e.into())));
        }
        crate::crash_point("before_commit");
        let committed = match grouped {
            false => user_commit(&self.locks, &self.txns, &user_id, "commit_upload", || {
                self.metrics.upload_commit_txns.inc();
                self.files.commit_upload(&commit)
            })
            .await
            .map(|r| r.value),
            true => {
                let category = guard.is_none().then_some(category.as_str());
                let answer = self.groups.commit(&user_id, category, commit.clone());
                match answer.await {
                    Some(a) => a,
                    None => {
                        Err(MetaError::OutcomeUnknown("the group committer died".into()).into())
                    }
                }
            }
        };
        let committed = match committed {
            Ok(r) => {
                crate::crash_point("after_commit");
                Ok(r)
            }
            Err(UserCommitError::Meta(MetaError::OutcomeUnknown(_))) => {
                Err(CommitError::OutcomeUnknown)
            }
            Err(e) => Err(CommitError::Failed(e.into())),
        };
        release(guard).await;
        (commit, committed)
    }

    /// Streams the body into the blob store, hashing and counting as it goes;
    /// stops early if the body passes `max` or the user's quota, or the lease
    /// (scope = upload) is lost; fails if the bytes do not have the
    /// `expected` digest (the caller then deletes the blob).
    async fn store_blob(
        &self,
        user: &UserRecord,
        intent: &IntentRecord,
        body: ByteStream<'_>,
        max: u64,
        guard: Option<&crate::lock::LockGuard>,
        expected: Option<&ExpectedDigest>,
    ) -> Result<(u64, String), DomainError> {
        let mut hasher = Sha256::new();
        // Only when the client asked for it: SHA-512 costs as much again.
        let mut sha512 = expected
            .and_then(|e| e.sha512.as_ref())
            .map(|_| Sha512::new());
        let mut size = 0u64;
        let body = bounded(body, self.settings.body_idle_timeout, max);
        let counted = body.map(|chunk: Result<Bytes, BodyError>| {
            let chunk = chunk?;
            size += chunk.len() as u64;
            hasher.update(&chunk);
            if let Some(h) = sha512.as_mut() {
                h.update(&chunk);
            }
            Ok(chunk)
        });
        let put = self
            .blobs
            .put(&intent.key, self.within_quota(user, counted.boxed()));
        let written = match guard {
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

    /// Refreshes the upload's intent until the upload is done, so that the
    /// sweeper takes only dead uploads for abandoned ones.
    pub(crate) async fn keep_alive(&self, file_id: &str) -> std::convert::Infallible {
        let every = self.settings.sweep.intent_grace / INTENT_REFRESHES_PER_GRACE;
        if every.is_zero() {
            // No grace at all (tests, audits): every intent is stale at once.
            return std::future::pending().await;
        }
        loop {
            tokio::time::sleep(every).await;
            match self.cleanup.touch_intent(file_id).await {
                Ok(true) => {}
                // Swept after all (this process stalled): the commit will say so.
                Ok(false) => std::future::pending::<()>().await,
                Err(e) => {
                    tracing::warn!(file_id, error = %e, "could not refresh the upload intent")
                }
            }
        }
    }
}

/// How many times per sweeper grace period a streaming upload refreshes its
/// intent: a few missed refreshes (a store hiccup) do not get it swept.
const INTENT_REFRESHES_PER_GRACE: u32 = 4;

/// `body`, failing with [`BodyError::Idle`] once the client has sent nothing
/// for `idle` (it holds a connection and, scope = upload, a lock) and with
/// [`BodyError::TooLarge`] as soon as it passes `max` bytes.
fn bounded(
    body: ByteStream<'_>,
    idle: std::time::Duration,
    max: u64,
) -> impl Stream<Item = Result<Bytes, BodyError>> + Send + '_ {
    let body = futures::stream::unfold(Some(body), move |body| async move {
        let mut body = body?;
        match tokio::time::timeout(idle, body.next()).await {
            Ok(Some(chunk)) => Some((chunk, Some(body))),
            Ok(None) => None,
            Err(_) => Some((Err(BodyError::Idle(idle)), None)),
        }
    });
    let mut size = 0u64;
    body.map(move |chunk| {
        let chunk = chunk?;
        size += chunk.len() as u64;
        if size > max {
            return Err(BodyError::TooLarge(max));
        }
        Ok(chunk)
    })
}

/// Releases the upload's lock, if it took one.
async fn release(guard: Option<Held>) {
    if let Some(g) = guard {
        g.release().await;
    }
}
