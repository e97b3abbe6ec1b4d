//! The upload flow: intent → (lock, if scope = upload) → stream the blob
//! while hashing → (lock, if scope = commit) → one retried transaction →
//! release. On any failure the blob is deleted (or recorded as an orphan).

use std::{
    io,
    time::{Duration, Instant},
};

use bytes::Bytes;
use futures::StreamExt;
use sha2::{Digest, Sha256};

use super::{FileId, Filename, SizeCategory, UserId};
use crate::{
    blob::ByteStream,
    config::LockScope,
    error::ApiError,
    lock::{LockGuard, LockKey},
    meta::{
        CommitOutcome, CommitUpload, Fence, FileRecord, IntentRecord, MetaError, OrphanRecord,
        OrphanStatus, UserRecord,
    },
    metrics::OutcomeLabel,
    retry::{Retried, with_txn_retry},
    startup::AppState,
};

/// An upload as the HTTP layer hands it over.
pub struct NewUpload<'a> {
    pub filename: Filename,
    pub content_type: String,
    /// The length the client declared, which picks the lock category.
    pub declared_len: Option<u64>,
    pub body: ByteStream<'a>,
    pub idempotency_key: Option<String>,
}

/// What an upload produced.
pub struct Uploaded {
    pub file: FileRecord,
    /// The result of an earlier request with the same idempotency key.
    pub replayed: bool,
}

/// The body grew past the limit.
#[derive(Debug, thiserror::Error)]
#[error("the body is larger than {0} bytes")]
struct TooLarge(u64);

/// Maps a failed body stream to the client's error.
pub fn body_error(e: io::Error) -> ApiError {
    if let Some(idle) = e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<IdleBody>())
    {
        return ApiError::RequestTimeout(idle.to_string());
    }
    match e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<TooLarge>())
    {
        Some(TooLarge(limit)) => ApiError::PayloadTooLarge(*limit),
        None => match e
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<InvalidBody>())
        {
            Some(InvalidBody(why)) => ApiError::InvalidRequest(why.clone()),
            None => ApiError::InvalidRequest(format!("the request body could not be read: {e}")),
        },
    }
}

/// The client sent nothing for the idle timeout.
#[derive(Debug, thiserror::Error)]
#[error("the client sent nothing for {0:?}")]
struct IdleBody(std::time::Duration);

/// A body that is malformed (e.g. a bad multipart structure).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct InvalidBody(pub String);

pub async fn upload(
    state: &AppState,
    user: &UserRecord,
    new: NewUpload<'_>,
) -> Result<Uploaded, ApiError> {
    let started = Instant::now();
    let result = run(state, user, new).await;
    let outcome = match &result {
        Ok(u) if u.replayed => "replayed",
        Ok(_) => "committed",
        Err(e) => e.code(),
    };
    state
        .metrics
        .uploads
        .get_or_create(&OutcomeLabel {
            outcome: outcome.into(),
        })
        .inc();
    if let Ok(u) = &result
        && !u.replayed
    {
        state.metrics.upload_bytes.inc_by(u.file.size as u64);
        state
            .metrics
            .upload_duration
            .observe(started.elapsed().as_secs_f64());
    }
    result
}

async fn run(
    state: &AppState,
    user: &UserRecord,
    new: NewUpload<'_>,
) -> Result<Uploaded, ApiError> {
    let settings = &state.settings;
    let _slot = state
        .upload_slots
        .take(&user.id, settings.max_uploads_per_user)
        .ok_or(ApiError::TooManyUploads(settings.max_uploads_per_user))?;
    let max = settings.max_upload_bytes;
    if new.declared_len.is_some_and(|n| n > max) {
        return Err(ApiError::PayloadTooLarge(max));
    }
    if let Some(key) = &new.idempotency_key
        && let Some(file) = state.meta.idempotent_file(&user.id, key).await?
    {
        return Ok(Uploaded {
            file,
            replayed: true,
        });
    }
    if let (Some(quota), Some(len)) = (settings.user_quota_bytes, new.declared_len)
        && user.used_bytes as u64 + len > quota
    {
        return Err(ApiError::QuotaExceeded);
    }

    let user_id = UserId::parse(&user.id)
        .ok_or_else(|| ApiError::internal(anyhow::anyhow!("bad user id")))?;
    let category = SizeCategory::from_declared_len(new.declared_len);
    let lock_key = LockKey::user_upload(&user_id, category);
    let file_id = FileId::new();
    let intent = IntentRecord {
        id: file_id.to_string(),
        user_id: user.id.clone(),
        bucket: state.blobs.bucket().to_owned(),
        key: format!("files/{user_id}/{file_id}"),
        created_at: crate::meta::now(),
        refreshed_at: None,
    };
    // The intent comes first: whatever happens next, the sweeper can find the blob.
    state.meta.put_intent(&intent).await?;
    crate::crash_point("after_intent");

    let mut guard = match settings.lock.scope {
        LockScope::Upload => match state.locks.acquire(&lock_key).await {
            Ok(g) => g,
            Err(e) => {
                forget_intent(state, &intent).await;
                return Err(e.into());
            }
        },
        LockScope::Commit => None,
    };

    let _in_flight = InFlight::new(state);
    let stored = store_blob(state, &intent, new.body, max, guard.as_ref()).await;
    let (size, sha256) = match stored {
        Ok(v) => {
            crate::crash_point("after_blob");
            v
        }
        Err(e) => {
            release(guard).await;
            compensate(state, &intent).await;
            return Err(e);
        }
    };

    if guard.is_none() && settings.lock.scope == LockScope::Commit {
        guard = match state.locks.acquire(&lock_key).await {
            Ok(g) => g,
            Err(e) => {
                compensate(state, &intent).await;
                return Err(e.into());
            }
        };
    }

    let file = FileRecord {
        id: intent.id.clone(),
        owner_id: user.id.clone(),
        filename: new.filename.as_str().to_owned(),
        content_type: new.content_type,
        size: size as i64,
        sha256,
        category: category.as_str().to_owned(),
        bucket: intent.bucket.clone(),
        key: intent.key.clone(),
        created_at: crate::meta::now(),
        sessions: Vec::new(),
        agents: Vec::new(),
    };
    let commit = CommitUpload {
        file,
        fence: guard.as_ref().map(|g| Fence {
            slot: category.as_str().into(),
            token: g.fence() as i64,
            pinned: false,
        }),
        quota_bytes: settings.user_quota_bytes,
        idempotency_key: new.idempotency_key,
    };
    crate::crash_point("before_commit");
    let committed = match user_commit(state, &user_id, || state.meta.commit_upload(&commit)).await {
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
    match committed {
        Ok(r) => {
            state.metrics.observe_txn("commit_upload", r.retries);
            match r.value {
                CommitOutcome::Committed => Ok(Uploaded {
                    file: commit.file,
                    replayed: false,
                }),
                CommitOutcome::Replayed(first) => {
                    compensate(state, &intent).await;
                    Ok(Uploaded {
                        file: *first,
                        replayed: true,
                    })
                }
            }
        }
        Err(CommitError::OutcomeUnknown) => {
            settle_unknown_commit(state, &intent, commit.file).await
        }
        Err(CommitError::Failed(e)) => {
            if matches!(e, ApiError::WriteConflict) {
                state
                    .metrics
                    .observe_txn("commit_upload", state.txn_retry.max_attempts - 1);
            }
            compensate(state, &intent).await;
            Err(e)
        }
    }
}

/// Why a commit did not answer `Ok`.
enum CommitError {
    /// It did not happen: undo the upload.
    Failed(ApiError),
    /// It may have happened: the blob must stay until that is settled.
    OutcomeUnknown,
}

/// How long an upload whose commit answer was lost keeps trying to settle
/// it before answering `outcome_unknown` (the sweeper settles it later).
const SETTLE_FOR: Duration = Duration::from_secs(20);
/// The first and the longest pause between tries to settle.
const SETTLE_PAUSE: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(2));

/// The commit was sent but its answer was lost: it may have applied. The
/// blob must not be deleted on a guess (that loses an acknowledged file).
/// Abandoning the intent settles it: the commit deletes the intent in its
/// transaction, so either the abandon finds the intent (the commit did not
/// and now never can apply: the blob goes) or it finds none (the commit
/// applied, or an earlier abandon did: the file record tells which). Until
/// the store answers, the intent stays for the sweeper, whose grace rule
/// decides the same way.
async fn settle_unknown_commit(
    state: &AppState,
    intent: &IntentRecord,
    file: FileRecord,
) -> Result<Uploaded, ApiError> {
    let deadline = Instant::now() + SETTLE_FOR;
    let mut pause = SETTLE_PAUSE.0;
    loop {
        match state.meta.abandon_intent(&intent.id, None).await {
            Ok(Some(orphan)) => {
                tracing::warn!(file_id = %intent.id, "commit outcome was unknown; it did not apply");
                delete_abandoned(state, &orphan).await;
                return Err(ApiError::DependencyUnavailable("metadata store"));
            }
            Ok(None) => match state.meta.file(&file.owner_id, &file.id).await {
                Ok(Some(_)) => {
                    tracing::info!(file_id = %intent.id, "commit outcome was unknown; it applied");
                    return Ok(Uploaded {
                        file,
                        replayed: false,
                    });
                }
                Ok(None) => return Err(ApiError::DependencyUnavailable("metadata store")),
                Err(e) => tracing::debug!(error = %e, "reading back an unknown commit"),
            },
            Err(e) => tracing::debug!(error = %e, "settling an unknown commit"),
        }
        if Instant::now() + pause > deadline {
            tracing::warn!(file_id = %intent.id, "commit outcome still unknown; the sweeper will settle it");
            return Err(ApiError::OutcomeUnknown(Some(format!(
                "/v1/files/{}",
                intent.id
            ))));
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(SETTLE_PAUSE.1);
    }
}

/// Runs `txn`, a transaction that writes the user document, under the
/// user's commit lock, retried on WriteConflict. Without the lock, commits of
/// different size categories (different locks, one document) conflict, and a
/// steady stream in one category can starve another's retries past the last
/// attempt: 6 of 8 runs of 100 mixed uploads on the test stack had a
/// `write_conflict` failure.
pub(crate) async fn user_commit<T, F, Fut>(
    state: &AppState,
    user: &UserId,
    txn: F,
) -> Result<Retried<T>, UserCommitError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, MetaError>>,
{
    let guard = state.locks.acquire(&LockKey::user_commit(user)).await?;
    let result = with_txn_retry(&state.txn_retry, txn).await;
    release(guard).await;
    Ok(result?)
}

/// Why [`user_commit`] failed: the lock, or the transaction (whose error the
/// caller may need to tell apart, e.g. an unknown outcome).
#[derive(Debug, thiserror::Error)]
pub(crate) enum UserCommitError {
    #[error(transparent)]
    Lock(#[from] crate::lock::LockError),
    #[error(transparent)]
    Meta(#[from] MetaError),
}

impl From<UserCommitError> for ApiError {
    fn from(e: UserCommitError) -> Self {
        match e {
            UserCommitError::Lock(e) => e.into(),
            UserCommitError::Meta(e) => e.into(),
        }
    }
}

/// Streams the body into the blob store, hashing and counting as it goes,
/// and keeps the intent alive meanwhile; stops early if the body passes
/// `max` or the lease (scope = upload) is lost.
async fn store_blob(
    state: &AppState,
    intent: &IntentRecord,
    body: ByteStream<'_>,
    max: u64,
    guard: Option<&LockGuard>,
) -> Result<(u64, String), ApiError> {
    let mut hasher = Sha256::new();
    let mut size = 0u64;
    // A client that stops sending holds a connection and (scope = upload) a
    // lock: give up on it after the idle timeout.
    let idle = state.settings.body_idle_timeout;
    let body = futures::stream::unfold(Some(body), move |body| async move {
        let mut body = body?;
        match tokio::time::timeout(idle, body.next()).await {
            Ok(Some(chunk)) => Some((chunk, Some(body))),
            Ok(None) => None,
            Err(_) => Some((Err(io::Error::other(IdleBody(idle))), None)),
        }
    });
    let counted = body.map(|chunk: io::Result<Bytes>| {
        let chunk = chunk?;
        size += chunk.len() as u64;
        if size > max {
            return Err(io::Error::other(TooLarge(max)));
        }
        hasher.update(&chunk);
        Ok(chunk)
    });
    let put = async {
        tokio::select! {
            r = state.blobs.put(&intent.key, counted.boxed()) => r,
            never = keep_alive(state, &intent.id) => match never {},
        }
    };
    let written = match guard {
        Some(g) => {
            let lost = g.lost();
            tokio::select! {
                r = put => r?,
                _ = lost.cancelled() => return Err(ApiError::LockLost),
            }
        }
        None => put.await?,
    };
    debug_assert_eq!(written, size);
    Ok((size, hex::encode(hasher.finalize())))
}

/// How many times per sweeper grace period a streaming upload refreshes its
/// intent: a few missed refreshes (a store hiccup) do not get it swept.
const INTENT_REFRESHES_PER_GRACE: u32 = 4;

/// Refreshes the upload's intent while it streams, so that the sweeper
/// takes only dead uploads for abandoned ones, however long a live one takes.
async fn keep_alive(state: &AppState, file_id: &str) -> std::convert::Infallible {
    let every = state.settings.sweep.intent_grace / INTENT_REFRESHES_PER_GRACE;
    if every.is_zero() {
        // No grace at all (tests, audits): every intent is stale at once.
        return std::future::pending().await;
    }
    loop {
        tokio::time::sleep(every).await;
        match state.meta.touch_intent(file_id).await {
            Ok(true) => {}
            // Swept after all (this process stalled): the commit will say so.
            Ok(false) => std::future::pending::<()>().await,
            Err(e) => tracing::warn!(file_id, error = %e, "could not refresh the upload intent"),
        }
    }
}

async fn release(guard: Option<LockGuard>) {
    if let Some(g) = guard {
        g.release().await;
    }
}

/// Undoes a failed upload: delete the blob, then the intent. If the delete
/// fails, the blob is recorded as an orphan for the sweeper.
async fn compensate(state: &AppState, intent: &IntentRecord) {
    if let Err(e) = state.blobs.delete(&intent.key).await {
        tracing::warn!(key = %intent.key, error = %e, "compensating blob delete failed; recording an orphan");
        let orphan = OrphanRecord::pending(&intent.bucket, &intent.key, Some(e.to_string()));
        if let Err(e) = state.meta.record_orphan(&orphan).await {
            // The intent stays behind, so the sweeper still finds the blob.
            tracing::error!(key = %intent.key, error = %e, "could not record orphan; leaving the intent for the sweeper");
            return;
        }
        state.metrics.orphans_recorded.inc();
    }
    forget_intent(state, intent).await;
}

/// Deletes the blob of an upload just abandoned; if that fails, the orphan
/// stays pending and the sweeper retries it.
async fn delete_abandoned(state: &AppState, orphan: &OrphanRecord) {
    let deleted = match state.blobs.delete(&orphan.key).await {
        Ok(()) => {
            state
                .meta
                .mark_orphan(&orphan.id, OrphanStatus::Deleted, None)
                .await
        }
        Err(e) => Err(MetaError::Other(e.to_string())),
    };
    if let Err(e) = deleted {
        tracing::warn!(key = %orphan.key, error = %e, "abandoned upload's blob left for the sweeper");
    }
}

async fn forget_intent(state: &AppState, intent: &IntentRecord) {
    if let Err(e) = state.meta.delete_intent(&intent.id).await {
        tracing::warn!(file_id = %intent.id, error = %e, "could not delete upload intent; the sweeper will");
    }
}

/// Counts an upload in the in-flight gauge while it lives.
struct InFlight<'a>(&'a AppState);

impl<'a> InFlight<'a> {
    fn new(state: &'a AppState) -> Self {
        state.metrics.uploads_in_flight.inc();
        Self(state)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.metrics.uploads_in_flight.dec();
    }
}

/// Uploads in flight per user on this instance.
#[derive(Default)]
pub struct UploadSlots {
    in_flight: std::sync::Mutex<std::collections::HashMap<String, usize>>,
}

impl UploadSlots {
    /// A slot for `user`, or `None` if `max` are taken.
    pub fn take(&self, user: &str, max: usize) -> Option<UploadSlot<'_>> {
        let mut in_flight = self.in_flight.lock().unwrap();
        let n = in_flight.entry(user.to_owned()).or_default();
        if *n >= max {
            return None;
        }
        *n += 1;
        Some(UploadSlot {
            slots: self,
            user: user.to_owned(),
        })
    }
}

/// Gives its slot back when dropped.
pub struct UploadSlot<'a> {
    slots: &'a UploadSlots,
    user: String,
}

impl Drop for UploadSlot<'_> {
    fn drop(&mut self) {
        let mut in_flight = self.slots.in_flight.lock().unwrap();
        if let Some(n) = in_flight.get_mut(&self.user) {
            *n -= 1;
            if *n == 0 {
                in_flight.remove(&self.user);
            }
        }
    }
}
