//! A PATCH answers what happened (issue 20): a state update whose answer is
//! lost is read back (applied → the new offset; unreadable → outcome
//! unknown, never a failure), and a PATCH whose lease is lost stops, as a
//! plain upload does, recording nothing.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use bytes::Bytes;

use super::{NewResumable, Patched, ResumableError};
use crate::{
    blob::{
        BlobError,
        budget::MemoryBudget,
        resumable::{ResumableBlobs, Staged},
    },
    domain::{
        DomainError,
        test_kit::{Kit, body, stalled},
    },
    meta::{
        Claim, FileRepo, IntentRecord, MetaError, MetaResult, OpenLimits, Progress, Reserve,
        ResumableRecord, ResumableRepo, UserRecord,
    },
    vocab::{BlobKey, FileId, Filename, LockKey, UserId, WriteHandle},
};

/// The kit's store, but its next state update is carried out and answered
/// with an error, as when the answer is lost on the way back; with
/// `blind`, the reads after it fail too.
struct LosesAdvanceAnswer {
    inner: Arc<dyn ResumableRepo>,
    lose: AtomicBool,
    blind: bool,
    lost: AtomicBool,
}

impl LosesAdvanceAnswer {
    fn new(kit: &Kit, blind: bool) -> Arc<Self> {
        Arc::new(Self {
            inner: kit.meta.clone(),
            lose: true.into(),
            blind,
            lost: false.into(),
        })
    }
}

fn unavailable() -> MetaError {
    MetaError::Unavailable("the answer was lost".into())
}

#[async_trait]
impl ResumableRepo for LosesAdvanceAnswer {
    async fn insert_resumables(
        &self,
        uploads: &[(IntentRecord, ResumableRecord)],
        limits: &OpenLimits,
    ) -> MetaResult<()> {
        self.inner.insert_resumables(uploads, limits).await
    }

    async fn reserve_deferred(
        &self,
        owner: &UserId,
        id: &FileId,
        what: Reserve,
        quota: Option<u64>,
    ) -> MetaResult<Option<ResumableRecord>> {
        self.inner.reserve_deferred(owner, id, what, quota).await
    }

    async fn restore_resumable(&self, upload: &ResumableRecord) -> MetaResult<()> {
        self.inner.restore_resumable(upload).await
    }

    async fn resumable(&self, owner: &UserId, id: &FileId) -> MetaResult<Option<ResumableRecord>> {
        if self.blind && self.lost.load(Ordering::SeqCst) {
            return Err(unavailable());
        }
        self.inner.resumable(owner, id).await
    }

    async fn resumable_by_id_alone(&self, id: &FileId) -> MetaResult<Option<ResumableRecord>> {
        self.inner.resumable_by_id_alone(id).await
    }

    async fn advance_resumable(&self, upload: &ResumableRecord, at: Progress) -> MetaResult<bool> {
        let advanced = self.inner.advance_resumable(upload, at).await?;
        if self.lose.swap(false, Ordering::SeqCst) {
            self.lost.store(true, Ordering::SeqCst);
            return Err(unavailable());
        }
        Ok(advanced)
    }

    async fn delete_resumable(&self, owner: &UserId, id: &FileId) -> MetaResult<()> {
        self.inner.delete_resumable(owner, id).await
    }

    async fn delete_resumable_if_expires(
        &self,
        owner: &UserId,
        id: &FileId,
        expires_at: DateTime<Utc>,
        tell: bool,
    ) -> MetaResult<Claim> {
        self.inner
            .delete_resumable_if_expires(owner, id, expires_at, tell)
            .await
    }

    async fn expired_resumables(
        &self,
        before: DateTime<Utc>,
        limit: usize,
    ) -> MetaResult<Vec<ResumableRecord>> {
        self.inner.expired_resumables(before, limit).await
    }
}

fn new_upload(length: u64) -> NewResumable {
    NewResumable {
        length: Some(length),
        filename: Filename::parse("r.bin").unwrap(),
        content_type: "text/plain".into(),
        metadata: String::new(),
    }
}

async fn stored_offset(kit: &Kit, id: &FileId) -> i64 {
    kit.meta
        .resumable_by_id_alone(id)
        .await
        .unwrap()
        .unwrap()
        .offset
}

#[tokio::test]
async fn a_state_update_whose_answer_is_lost_but_applied_is_answered_as_applied() {
    let kit = Kit::new(|_| {}).await;
    let user: UserRecord = kit.user("lost-answer").await;
    let service = kit.resumables_on(LosesAdvanceAnswer::new(&kit, false));
    let up = service.create(&user, new_upload(11)).await.unwrap();
    let first = service
        .patch(&user, &up.id, 0, None, None, body(&[b"hello"]))
        .await;
    let Ok(Patched::Partial(at)) = first else {
        panic!("the offset moved, and the answer says so: {first:?}")
    };
    assert_eq!((at.offset, stored_offset(&kit, &up.id).await), (5, 5));
    let last = service
        .patch(&user, &up.id, 5, None, None, body(&[b" world"]))
        .await;
    let Ok(Patched::Done { file, .. }) = last else {
        panic!("{last:?}")
    };
    assert_eq!(kit.read(&file.key).await, b"hello world");
}

#[tokio::test]
async fn a_state_update_whose_answer_is_lost_and_unreadable_is_an_unknown_outcome() {
    let kit = Kit::new(|_| {}).await;
    let user = kit.user("unknown").await;
    let service = kit.resumables_on(LosesAdvanceAnswer::new(&kit, true));
    let up = service.create(&user, new_upload(11)).await.unwrap();
    let first = service
        .patch(&user, &up.id, 0, None, None, body(&[b"hello"]))
        .await;
    assert!(
        matches!(
            first,
            Err(ResumableError::Domain(DomainError::OutcomeUnknown(Some(_))))
        ),
        "not a failure: the offset moved ({first:?})"
    );
    assert_eq!(stored_offset(&kit, &up.id).await, 5);
}

#[tokio::test]
async fn a_patch_whose_lease_is_lost_stops_and_records_nothing() {
    let kit = Kit::new(|s| s.lock.ttl = Duration::from_millis(300)).await;
    let user = kit.user("lease").await;
    let up = kit.resumables.create(&user, new_upload(10)).await.unwrap();
    let patch = kit
        .resumables
        .patch(&user, &up.id, 0, None, None, stalled(b"abc"));
    let evict = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        kit.memory_locks.evict(LockKey::resumable(&up.id).as_str());
        std::future::pending::<std::convert::Infallible>().await
    };
    let answered = tokio::time::timeout(Duration::from_secs(5), async {
        tokio::select! {
            r = patch => r,
            never = evict => match never {},
        }
    })
    .await;
    let Ok(answer) = answered else {
        panic!("the PATCH went on reading after its lease was lost")
    };
    assert!(
        matches!(answer, Err(ResumableError::Domain(DomainError::LockLost))),
        "{answer:?}"
    );
    assert_eq!(stored_offset(&kit, &up.id).await, 0, "nothing recorded");
}

/// The kit's blobs, but every part and tail write fails with a store's
/// error (as S3 answers `AccessDenied` to a part of a multipart upload
/// that was completed meanwhile), and the state's reads fail from then on
/// (the metadata store went away too).
struct FailingWrites {
    inner: Arc<dyn ResumableBlobs>,
    blind: Arc<LosesAdvanceAnswer>,
}

impl FailingWrites {
    fn fail(&self) -> BlobError {
        self.blind.lost.store(true, Ordering::SeqCst);
        BlobError::Other("AccessDenied".into())
    }
}

#[async_trait]
impl ResumableBlobs for FailingWrites {
    fn part_size(&self) -> usize {
        self.inner.part_size()
    }

    fn part_concurrency(&self) -> usize {
        self.inner.part_concurrency()
    }

    fn budget(&self) -> Arc<MemoryBudget> {
        self.inner.budget()
    }

    async fn start(&self, key: &BlobKey, length: Option<u64>) -> Result<WriteHandle, BlobError> {
        self.inner.start(key, length).await
    }

    async fn put_part(
        &self,
        _: &BlobKey,
        _: &WriteHandle,
        _: i32,
        _: u64,
        _: Bytes,
    ) -> Result<String, BlobError> {
        Err(self.fail())
    }

    async fn put_tail(
        &self,
        _: &BlobKey,
        _: &WriteHandle,
        _: u64,
        _: Bytes,
    ) -> Result<(), BlobError> {
        Err(self.fail())
    }

    async fn get_tail(
        &self,
        key: &BlobKey,
        handle: &WriteHandle,
        start: u64,
        end: u64,
    ) -> Result<Bytes, BlobError> {
        self.inner.get_tail(key, handle, start, end).await
    }

    async fn delete_tail(
        &self,
        key: &BlobKey,
        handle: &WriteHandle,
        start: u64,
        end: u64,
    ) -> Result<(), BlobError> {
        self.inner.delete_tail(key, handle, start, end).await
    }

    async fn complete(
        &self,
        key: &BlobKey,
        handle: &WriteHandle,
        tags: &[String],
        len: u64,
    ) -> Result<(), BlobError> {
        self.inner.complete(key, handle, tags, len).await
    }

    async fn abort(&self, key: &BlobKey, handle: &WriteHandle) -> Result<(), BlobError> {
        self.inner.abort(key, handle).await
    }

    async fn clear_staging(&self, key: &BlobKey, handle: &WriteHandle) -> Result<(), BlobError> {
        self.inner.clear_staging(key, handle).await
    }

    async fn staged(&self, before: DateTime<Utc>) -> Result<Vec<Staged>, BlobError> {
        self.inner.staged(before).await
    }

    async fn remove_staged(&self, staged: &Staged) -> Result<(), BlobError> {
        self.inner.remove_staged(staged).await
    }
}

/// A PATCH whose bytes the blob store refused while the metadata store is
/// away cannot read where the upload is: it answers that the store is
/// unavailable (503: nothing of it was recorded), not a 500 (the fault
/// suite met one: a part refused `AccessDenied` beside a MongoDB cut).
#[tokio::test]
async fn a_refused_write_with_the_state_unreadable_is_the_store_s_unavailability() {
    let kit = Kit::new(|_| {}).await;
    let user = kit.user("refused-write").await;
    let repo = Arc::new(LosesAdvanceAnswer {
        inner: kit.meta.clone(),
        lose: false.into(),
        blind: true,
        lost: false.into(),
    });
    let parts = Arc::new(FailingWrites {
        inner: kit.blobs.clone(),
        blind: repo.clone(),
    });
    let service = kit.resumables_with(repo, parts);
    let up = service.create(&user, new_upload(11)).await.unwrap();
    let answer = service
        .patch(&user, &up.id, 0, None, None, body(&[b"hello"]))
        .await;
    assert!(
        matches!(
            answer,
            Err(ResumableError::Domain(DomainError::DependencyUnavailable(
                _
            )))
        ),
        "{answer:?}"
    );
    assert_eq!(stored_offset(&kit, &up.id).await, 0, "nothing recorded");
}

/// A pre-commit hook on loopback whose first call waits until `release`
/// is notified and is then refused (422); every later call is let through.
/// `arrived` is notified when the first call comes.
async fn slow_first_hook() -> (String, Arc<tokio::sync::Notify>, Arc<tokio::sync::Notify>) {
    use axum::{extract::State, http::StatusCode};
    type Hook = (
        Arc<std::sync::atomic::AtomicUsize>,
        Arc<tokio::sync::Notify>,
        Arc<tokio::sync::Notify>,
    );
    async fn answer(State((calls, arrived, release)): State<Hook>) -> StatusCode {
        if calls.fetch_add(1, Ordering::SeqCst) > 0 {
            return StatusCode::NO_CONTENT;
        }
        arrived.notify_one();
        release.notified().await;
        StatusCode::UNPROCESSABLE_ENTITY
    }
    let (arrived, release) = (
        Arc::new(tokio::sync::Notify::new()),
        Arc::new(tokio::sync::Notify::new()),
    );
    let state: Hook = (Arc::default(), arrived.clone(), release.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/", listener.local_addr().unwrap());
    let app = axum::Router::new().fallback(answer).with_state(state);
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, arrived, release)
}

/// The hook takes long enough for the last PATCH's lease to pass to a
/// `HEAD`, which finishes the upload (the hook lets that one commit); the
/// hook then refuses the PATCH's own call. The committed file stands (the
/// refusal deletes nothing of it, its intent being gone) and the PATCH is
/// answered with it, not 422.
#[tokio::test]
async fn a_refusal_after_another_request_committed_the_upload_deletes_nothing() {
    let (url, arrived, release) = slow_first_hook().await;
    let kit = Kit::new(move |s| {
        s.lock.ttl = Duration::from_millis(300);
        s.precommit = Some(crate::config::PrecommitSettings {
            url,
            secret: "whsec_a2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2s=".into(),
            timeout: Duration::from_secs(10),
            on_failure: crate::config::HookFailure::Reject,
        });
    })
    .await;
    let user = kit.user("raced").await;
    let up = kit.resumables.create(&user, new_upload(11)).await.unwrap();
    let last = kit
        .resumables
        .patch(&user, &up.id, 0, None, None, body(&[b"hello world"]));
    let other = async {
        arrived.notified().await;
        kit.memory_locks.evict(LockKey::resumable(&up.id).as_str());
        let head = kit.resumables.head(&user, &up.id).await;
        release.notify_one();
        head
    };
    let (last, head) =
        tokio::time::timeout(Duration::from_secs(20), async { tokio::join!(last, other) })
            .await
            .expect("the PATCH and the HEAD answered");
    let head = head.expect("the HEAD finished the upload");
    assert!(head.committed, "{head:?}");
    let file = kit
        .meta
        .file(&user.id, &up.id)
        .await
        .unwrap()
        .expect("committed");
    assert_eq!(
        kit.read(&file.key).await,
        b"hello world",
        "the file's bytes stand"
    );
    assert!(
        matches!(last, Ok(Patched::Done { .. })),
        "answered with the file another request committed: {last:?}"
    );
}
