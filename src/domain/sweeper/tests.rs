//! The sweeper's expiry of resumable uploads on the embedded adapters: it
//! acts on the record as it is under the upload's lock, not as it was
//! listed, and one expiry that fails stops no other step of the pass.

use std::{sync::Arc, time::Duration};

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::{Outcome, SweepReport, Sweeper};
use crate::{
    config::SweepSettings,
    domain::{
        resumable::{NewResumable, Patched},
        test_kit::{Kit, body},
    },
    meta::{
        Claim, CleanupRepo, IntentRecord, MetaResult, OpenLimits, Progress, Reserve,
        ResumableRecord, ResumableRepo, UserRecord, embedded::EmbeddedStore,
    },
    metrics::Metrics,
    vocab::{FileId, Filename, UserId, WriteHandle},
};

/// The store, but its list of expired uploads is stale: every upload is in
/// it, as expired, as a listing read just before a PATCH renewed them is.
struct StaleListing(Arc<EmbeddedStore>);

#[async_trait]
impl ResumableRepo for StaleListing {
    async fn insert_resumables(
        &self,
        uploads: &[(IntentRecord, ResumableRecord)],
        limits: &OpenLimits,
    ) -> MetaResult<()> {
        self.0.insert_resumables(uploads, limits).await
    }

    async fn reserve_deferred(
        &self,
        owner: &UserId,
        id: &FileId,
        what: Reserve,
        quota: Option<u64>,
    ) -> MetaResult<Option<ResumableRecord>> {
        self.0.reserve_deferred(owner, id, what, quota).await
    }

    async fn restore_resumable(&self, upload: &ResumableRecord) -> MetaResult<()> {
        self.0.restore_resumable(upload).await
    }

    async fn resumable(&self, owner: &UserId, id: &FileId) -> MetaResult<Option<ResumableRecord>> {
        self.0.resumable(owner, id).await
    }

    async fn resumable_by_id_alone(&self, id: &FileId) -> MetaResult<Option<ResumableRecord>> {
        self.0.resumable_by_id_alone(id).await
    }

    async fn advance_resumable(&self, upload: &ResumableRecord, at: Progress) -> MetaResult<bool> {
        self.0.advance_resumable(upload, at).await
    }

    async fn delete_resumable(&self, owner: &UserId, id: &FileId) -> MetaResult<()> {
        self.0.delete_resumable(owner, id).await
    }

    async fn delete_resumable_if_expires(
        &self,
        owner: &UserId,
        id: &FileId,
        expires_at: DateTime<Utc>,
        tell: bool,
    ) -> MetaResult<Claim> {
        self.0
            .delete_resumable_if_expires(owner, id, expires_at, tell)
            .await
    }

    async fn expired_resumables(
        &self,
        _before: DateTime<Utc>,
        limit: usize,
    ) -> MetaResult<Vec<ResumableRecord>> {
        let all = crate::meta::now() + chrono::Duration::days(3650);
        let mut listed = self.0.expired_resumables(all, limit).await?;
        for upload in &mut listed {
            upload.expires_at = crate::meta::now() - chrono::Duration::seconds(1);
        }
        Ok(listed)
    }
}

/// A sweeper on the kit's adapters, every intent stale at once.
fn sweeper(kit: &Kit, resumables: Arc<dyn ResumableRepo>) -> Sweeper {
    Sweeper {
        meta: kit.meta.clone(),
        blobs: kit.blobs.clone(),
        resumables,
        resumable_blobs: kit.blobs.clone(),
        keys: kit.meta.clone(),
        locks: kit.locks.clone(),
        metrics: Arc::new(Metrics::default()),
        settings: SweepSettings {
            interval: Duration::ZERO,
            intent_grace: Duration::ZERO,
            retry_interval: Duration::ZERO,
            max_retries: 3,
            event_retention: Duration::from_secs(3600),
        },
        deletions: kit.meta.clone(),
        events: kit.meta.clone(),
        bell: Arc::new(crate::meta::Bells::default()),
        sequencer: Arc::default(),
        deletion_settle: Duration::ZERO,
    }
}

async fn pass(sweeper: &Sweeper) -> SweepReport {
    match sweeper.try_run_once().await.unwrap() {
        Outcome::Swept(report) => report,
        Outcome::Busy => panic!("busy"),
    }
}

async fn create(kit: &Kit, user: &UserRecord, length: u64) -> ResumableRecord {
    let new = NewResumable {
        length: Some(length),
        filename: Filename::parse("r.bin").unwrap(),
        content_type: "text/plain".into(),
        metadata: String::new(),
    };
    kit.resumables.create(user, new).await.unwrap()
}

/// Makes the upload (and its intent) expired, as if no PATCH had come for its expiry.
async fn expire_now(kit: &Kit, id: &FileId) -> ResumableRecord {
    let mut upload = kit.meta.resumable_by_id_alone(id).await.unwrap().unwrap();
    upload.expires_at = crate::meta::now() - chrono::Duration::seconds(1);
    let touched = (kit.meta).touch_intent(&upload.user_id, id, Some(upload.expires_at));
    assert!(touched.await.unwrap().is_some());
    assert!(
        kit.meta
            .advance_resumable(&upload, upload.progress())
            .await
            .unwrap()
    );
    upload
}

#[tokio::test]
async fn an_upload_renewed_after_the_listing_is_not_expired() {
    let kit = Kit::new(|_| {}).await;
    let user = kit.user("renewed").await;
    let up = create(&kit, &user, 11).await;
    let first = kit
        .resumables
        .patch(&user, &up.id, 0, None, None, body(&[b"hello"]))
        .await;
    assert!(matches!(first, Ok(Patched::Partial(_))));

    let stale = sweeper(&kit, Arc::new(StaleListing(kit.meta.clone())));
    let report = pass(&stale).await;
    assert_eq!(report.resumables_expired, 0, "{report:?}");
    assert_eq!(report.intents_abandoned, 0, "{report:?}");

    let last = kit
        .resumables
        .patch(&user, &up.id, 5, None, None, body(&[b" world"]))
        .await;
    let Ok(Patched::Done { file, .. }) = last else {
        panic!("the renewed upload goes on: {last:?}")
    };
    assert_eq!(kit.read(&file.key).await, b"hello world");
}

#[tokio::test]
async fn one_expiry_that_fails_stops_no_other_step_of_the_pass() {
    let kit = Kit::new(|_| {}).await;
    let user = kit.user("failing").await;
    let broken = create(&kit, &user, 10).await;
    let fine = create(&kit, &user, 10).await;
    // The first to expire cannot be aborted (its handle names no staging file).
    let mut upload = expire_now(&kit, &broken.id).await;
    upload.expires_at -= chrono::Duration::seconds(10);
    upload.handle = WriteHandle::new("not/a/handle");
    assert!(
        kit.meta
            .advance_resumable(&upload, upload.progress())
            .await
            .unwrap()
    );
    expire_now(&kit, &fine.id).await;
    // A plain upload that died.
    let dead = IntentRecord::new(user.id, FileId::new(), "local");
    kit.meta.put_intent(&dead).await.unwrap();
    // The scan takes intents last seen strictly before the pass began (the
    // grace is zero): let the clock pass the touches above.
    tokio::time::sleep(Duration::from_millis(5)).await;

    let report = pass(&sweeper(&kit, kit.meta.clone())).await;
    assert_eq!(report.failures, 1, "{report:?}");
    // Both claimed; only the fine one's write could be aborted.
    assert_eq!(report.resumables_expired, 1, "{report:?}");
    // The fine one's, the dead plain upload's, and the broken one's (past
    // its time, no record now) in the stale-intent scan after.
    assert_eq!(report.intents_abandoned, 3, "{report:?}");
    assert_eq!(kit.intents().await, 0);
    assert!(
        kit.meta
            .resumable(&fine.user_id, &fine.id)
            .await
            .unwrap()
            .is_none()
    );
    // The broken one's staging file, which no record names now.
    assert_eq!(report.staging_removed, 1, "{report:?}");
    let staging = std::fs::read_dir(kit.dir().join("blobs.tmp")).unwrap();
    assert_eq!(staging.count(), 0, "staging left");
}
