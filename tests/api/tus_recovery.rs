//! Resumable uploads that lose nothing when a PATCH goes wrong (issue 20):
//! an empty PATCH, or one cut before its first byte, keeps what was stored;
//! a final PATCH whose commit is refused (quota, a lock wait that runs out)
//! or whose blob completion answer is lost leaves the upload resumable, and
//! the next PATCH or HEAD at the end offset finishes it. On the embedded
//! adapters and (`FILEDOCK_TEST_BACKEND=real`) on MongoDB, S3 and Redis.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use async_trait::async_trait;
use bytes::Bytes;
use chrono::{DateTime, Utc};
use filedock::{
    blob::{
        BlobError,
        resumable::{ResumableBlobs, Staged},
    },
    domain::UserId,
    domain::sweeper::Outcome,
    http::AppState,
    lock::LockKey,
    ports::Ports,
    vocab::{BlobKey, WriteHandle},
};
use reqwest::StatusCode;

use crate::{
    helpers::*,
    tus::{content, create, data, head, patch, patch_body, staging_left},
};

/// `/v1/me`'s `used_bytes`.
async fn used_bytes(app: &TestApp, user: &TestUser) -> i64 {
    let me: serde_json::Value = app
        .client
        .get(app.url("/v1/me"))
        .bearer_auth(&user.key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    me["usage"]["used_bytes"].as_i64().unwrap()
}

#[tokio::test]
async fn an_empty_patch_and_one_cut_before_its_first_byte_keep_what_was_stored() {
    let app = spawn_app().await;
    let user = app.create_user("empty-patch").await;
    let bytes = data(200);
    let id = create(&app, &user, 200).await;
    let res = patch(&app, &user, &id, 0, &bytes[..100]).await;
    assert_eq!(res.status(), StatusCode::NO_CONTENT);

    // The bytes after the last whole part (all 100 here) are the stored
    // tail: an empty PATCH must neither replace it by itself nor drop it.
    let res = patch(&app, &user, &id, 100, &[]).await;
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    assert_eq!(head(&app, &user, &id).await, (StatusCode::OK, Some(100)));
    // A client that goes away before its first byte does the same.
    let cut = futures::stream::iter([Err::<Bytes, _>(std::io::Error::other("cut"))]);
    let _ = patch_body(&app, &user, &id, 100, reqwest::Body::wrap_stream(cut), None).await;
    assert_eq!(
        head(&app, &user, &id).await,
        (StatusCode::OK, Some(100)),
        "what was stored before the cut PATCH is kept"
    );

    let last = loop {
        let res = patch(&app, &user, &id, 100, &bytes[100..]).await;
        // The cut PATCH may still hold the upload's lock for a moment.
        if res.status() != StatusCode::LOCKED {
            break res;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(last.status(), StatusCode::NO_CONTENT, "the last PATCH");
    assert!(content(&app, &user, &id).await == bytes, "the bytes differ");
    assert_eq!(assert_bucket_matches_metadata(&app.state).await, 1);
    assert_eq!(staging_left(&app).await, 0, "staging left behind");
}

#[tokio::test]
async fn a_final_patch_past_the_quota_keeps_the_upload_and_a_later_one_finishes_it() {
    let mut settings = test_settings();
    settings.user_quota_bytes = Some(300);
    // The quota is checked against the store, not a cached usage.
    settings.auth_cache_ttl = Duration::ZERO;
    let app = spawn_app_with(settings).await;
    let user = app.create_user("final-quota").await;
    let bytes = data(200);
    // Each fits the quota alone; together they do not.
    let id = create(&app, &user, 200).await;
    let res = patch(&app, &user, &id, 0, &bytes[..100]).await;
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    let plain = app.upload_json(&user, "plain.bin", vec![9u8; 150]).await;

    let res = patch(&app, &user, &id, 100, &bytes[100..]).await;
    assert_eq!(
        error_code(res).await,
        (StatusCode::INSUFFICIENT_STORAGE, "quota_exceeded".into())
    );
    // Not gone: all its bytes are stored and only the commit is left, which
    // a PATCH at the end offset (and a HEAD) tries again.
    let res = patch(&app, &user, &id, 200, &[]).await;
    assert_eq!(res.status(), StatusCode::INSUFFICIENT_STORAGE);
    assert_eq!(
        head(&app, &user, &id).await.0,
        StatusCode::INSUFFICIENT_STORAGE
    );
    assert_eq!(
        used_bytes(&app, &user).await,
        150,
        "nothing of it committed"
    );

    let del = app
        .client
        .delete(app.url(&format!("/v1/files/{}", plain["id"].as_str().unwrap())))
        .bearer_auth(&user.key)
        .send()
        .await
        .unwrap();
    assert_eq!(del.status(), StatusCode::NO_CONTENT);
    let res = patch(&app, &user, &id, 200, &[]).await;
    assert_eq!(
        res.status(),
        StatusCode::NO_CONTENT,
        "the retried final PATCH"
    );
    assert_eq!(res.headers()["upload-offset"], "200");
    assert!(content(&app, &user, &id).await == bytes, "the bytes differ");
    assert_eq!(used_bytes(&app, &user).await, 200);
    assert_eq!(assert_bucket_matches_metadata(&app.state).await, 1);
    assert_eq!(staging_left(&app).await, 0, "staging left behind");
}

#[tokio::test]
async fn a_final_patch_whose_lock_wait_runs_out_keeps_the_upload_and_head_finishes_it() {
    let mut settings = test_settings();
    settings.lock.wait_timeout = Duration::from_secs(1);
    let app = spawn_app_with(settings).await;
    let user = app.create_user("final-lock").await;
    let bytes = data(200);
    let id = create(&app, &user, 200).await;
    let res = patch(&app, &user, &id, 0, &bytes[..100]).await;
    assert_eq!(res.status(), StatusCode::NO_CONTENT);

    // Another upload of the user's, in the same size category, holds its lock.
    let uid = UserId::parse(&user.id).unwrap();
    let held = app
        .state
        .ports
        .locks
        .acquire(&LockKey::user_upload(&uid, "small"))
        .await
        .unwrap();
    let res = patch(&app, &user, &id, 100, &bytes[100..]).await;
    assert_eq!(
        error_code(res).await,
        (StatusCode::TOO_MANY_REQUESTS, "lock_timeout".into())
    );
    held.release().await;

    assert_eq!(head(&app, &user, &id).await, (StatusCode::OK, Some(200)));
    assert!(content(&app, &user, &id).await == bytes, "the bytes differ");
    assert_eq!(assert_bucket_matches_metadata(&app.state).await, 1);
    assert_eq!(staging_left(&app).await, 0, "staging left behind");
}

/// The blob store's resumable writes, whose next completion is carried out
/// but answered with an error, as when its answer is lost on the way back.
struct LosesCompleteAnswer {
    inner: Arc<dyn ResumableBlobs>,
    lose: AtomicBool,
}

#[async_trait]
impl ResumableBlobs for LosesCompleteAnswer {
    fn part_size(&self) -> usize {
        self.inner.part_size()
    }

    fn part_concurrency(&self) -> usize {
        self.inner.part_concurrency()
    }

    async fn start(&self, key: &BlobKey) -> Result<WriteHandle, BlobError> {
        self.inner.start(key).await
    }

    async fn put_part(
        &self,
        key: &BlobKey,
        handle: &WriteHandle,
        number: i32,
        offset: u64,
        part: Bytes,
    ) -> Result<String, BlobError> {
        self.inner.put_part(key, handle, number, offset, part).await
    }

    async fn put_tail(
        &self,
        key: &BlobKey,
        handle: &WriteHandle,
        start: u64,
        tail: Bytes,
    ) -> Result<(), BlobError> {
        self.inner.put_tail(key, handle, start, tail).await
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
        self.inner.complete(key, handle, tags, len).await?;
        match self.lose.swap(false, Ordering::SeqCst) {
            true => Err(BlobError::Unavailable("the answer was lost".into())),
            false => Ok(()),
        }
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

#[tokio::test]
async fn a_completion_whose_answer_was_lost_is_finished_by_the_next_patch() {
    let settings = test_settings();
    let mut ports = Ports::connect(&settings).await.unwrap();
    let losing = Arc::new(LosesCompleteAnswer {
        inner: ports.resumable.clone(),
        lose: true.into(),
    });
    ports.resumable = losing.clone();
    let app = spawn_app_with_state(AppState::with_ports(settings, ports).unwrap()).await;
    let user = app.create_user("lost-complete").await;
    // Several parts on either blob store, and a last one shorter.
    let len = (17 << 20) + 3;
    let bytes = data(len);
    let id = create(&app, &user, len).await;
    let res = patch(&app, &user, &id, 0, &bytes[..9 << 20]).await;
    assert_eq!(res.status(), StatusCode::NO_CONTENT);

    let res = patch(&app, &user, &id, 9 << 20, &bytes[9 << 20..]).await;
    assert_eq!(
        res.status(),
        StatusCode::SERVICE_UNAVAILABLE,
        "the lost answer"
    );
    assert!(!losing.lose.load(Ordering::SeqCst), "the completion ran");

    let res = patch(&app, &user, &id, len, &[]).await;
    assert_eq!(res.status(), StatusCode::NO_CONTENT, "the PATCH at the end");
    assert!(content(&app, &user, &id).await == bytes, "the bytes differ");
    assert_eq!(assert_bucket_matches_metadata(&app.state).await, 1);
    assert_eq!(staging_left(&app).await, 0, "staging left behind");
}

#[tokio::test]
async fn a_terminated_upload_whose_commit_was_refused_leaves_nothing() {
    let mut settings = test_settings();
    settings.user_quota_bytes = Some(100);
    settings.auth_cache_ttl = Duration::ZERO;
    let app = spawn_app_with(settings).await;
    let user = app.create_user("refused-terminated").await;
    let id = create(&app, &user, 100).await;
    let _fill = app.upload_json(&user, "fill.bin", vec![1u8; 50]).await;
    let res = patch(&app, &user, &id, 0, &data(100)).await;
    assert_eq!(res.status(), StatusCode::INSUFFICIENT_STORAGE);

    let res = app
        .client
        .delete(app.url(&format!("/v1/uploads/{id}")))
        .bearer_auth(&user.key)
        .header("tus-resumable", crate::tus::TUS)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    assert_eq!(head(&app, &user, &id).await.0, StatusCode::NOT_FOUND);
    // Only the plain upload's blob is left; its completed object went too.
    assert_eq!(assert_bucket_matches_metadata(&app.state).await, 1);
    assert_eq!(app.intents().await, 0);
    assert_eq!(staging_left(&app).await, 0, "staging left behind");
}

#[tokio::test]
async fn an_upload_whose_commit_was_refused_expires_whole() {
    let mut settings = test_settings();
    settings.user_quota_bytes = Some(100);
    settings.auth_cache_ttl = Duration::ZERO;
    let app = spawn_app_with(settings).await;
    let user = app.create_user("refused-expired").await;
    let id = create(&app, &user, 100).await;
    let _fill = app.upload_json(&user, "fill.bin", vec![1u8; 50]).await;
    let res = patch(&app, &user, &id, 0, &data(100)).await;
    assert_eq!(res.status(), StatusCode::INSUFFICIENT_STORAGE);
    assert_eq!(app.blob_keys(&user).await.len(), 2, "the completed object");

    // Expire it, as if no PATCH had come for FILEDOCK_TUS_EXPIRY_SECS.
    let meta = &app.state.ports.meta;
    let mut upload = meta.resumable(&id.parse().unwrap()).await.unwrap().unwrap();
    assert!(upload.completed);
    upload.expires_at = filedock::meta::now() - chrono::Duration::seconds(1);
    assert!(
        meta.advance_resumable(&upload, upload.offset)
            .await
            .unwrap()
    );
    let Outcome::Swept(report) = app.state.sweeper.try_run_once().await.unwrap() else {
        panic!("busy")
    };
    assert_eq!((report.resumables_expired, report.orphans_deleted), (1, 1));
    assert!(
        meta.resumable(&id.parse().unwrap())
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(app.blob_keys(&user).await.len(), 1, "the object went too");
    assert_eq!(app.intents().await, 0);
    assert_eq!(staging_left(&app).await, 0, "staging left behind");
}
