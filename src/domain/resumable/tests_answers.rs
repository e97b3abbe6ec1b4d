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

use super::{NewResumable, Patched, ResumableError};
use crate::{
    domain::{
        DomainError,
        test_kit::{Kit, body, stalled},
    },
    meta::{
        Claim, IntentRecord, MetaError, MetaResult, OpenLimits, Progress, Reserve, ResumableRecord,
        ResumableRepo, UserRecord,
    },
    vocab::{FileId, Filename, LockKey, UserId},
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
