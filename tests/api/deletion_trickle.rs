//! A user's deletion meets a resumable upload whose PATCH trickles a byte
//! every 1.5 s (issue 42, item 5): too lively for a release request to
//! stop it, it held the upload's lock and the user stayed `deleting` for
//! ever. The deletion now asks it to let go; a PATCH of a user being
//! deleted does at once (401), and the deletion ends within a few passes
//! with nothing of the upload left in the blob store: no multipart upload,
//! no staging. On the embedded adapters and (`FILEDOCK_TEST_BACKEND=real`)
//! on MongoDB, S3 and Redis.

use std::time::{Duration, Instant};

use bytes::Bytes;
use filedock::domain::sweeper::Outcome;
use reqwest::StatusCode;

use crate::{
    helpers::*,
    support::readback::multipart_uploads,
    tus::{create, data, patch, staging_left},
    tus_release::streamed_patch,
};

/// A whole part of either blob store's size (5 MiB on S3), and a tail.
const SENT: usize = (5 << 20) + 1000;
/// More than the trickle ever sends: its PATCH never ends by itself.
const LEN: usize = 8 << 20;
const EVERY: Duration = Duration::from_millis(1500);
/// The trickle's own bound, whatever the server does: the test ends.
const MOST_BYTES: usize = 30;
/// Passes a deletion may take: the auth cache (1 s) and the request grace
/// (2 s) are waited out at one pass a second, the upload let go in the first.
const PASSES: usize = 8;

#[tokio::test]
async fn a_trickling_patch_does_not_hold_a_users_deletion_up() {
    let mut settings = test_settings();
    settings.auth_cache_ttl = Duration::from_secs(1);
    let app = spawn_app_with(settings).await;
    let user = app.create_user("trickler").await;
    let bytes = data(LEN);
    let id = create(&app, &user, LEN).await;
    let first = patch(&app, &user, &id, 0, &bytes[..SENT]).await;
    assert_eq!(first.status(), StatusCode::NO_CONTENT);
    let (tx, answer) = streamed_patch(&app, &user, &id, (SENT, LEN - SENT));
    let trickling = tokio::spawn(async move {
        let mut sent = 0;
        while sent < MOST_BYTES && tx.unbounded_send(Ok(Bytes::from_static(b"x"))).is_ok() {
            sent += 1;
            tokio::time::sleep(EVERY).await;
        }
        sent
    });
    // A few bytes have arrived: the PATCH holds the upload.
    tokio::time::sleep(2 * EVERY).await;
    // What the counts below must come down from: the write in progress
    // (S3: a multipart upload holding a part, and the staged tail; local
    // files: the staging file).
    assert_eq!(staging_left(&app).await, 1, "the staging before");
    if let Some(open) = multipart_uploads(&[id.as_str()]) {
        assert_eq!(open, (1, 0), "the multipart upload before");
    }

    let path = format!("/v1/admin/users/{}", user.id);
    let deleted = app
        .client
        .delete(app.url(&path))
        .bearer_auth(ADMIN_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), StatusCode::ACCEPTED);
    let started = Instant::now();
    let answered = tokio::time::timeout(Duration::from_secs(10), answer).await;
    let answered = answered.expect("the PATCH still runs 10 s after the deletion began");
    let status = answered.unwrap().map(|r| r.status());
    eprintln!(
        "the trickling PATCH answered {status:?} after {:?}",
        started.elapsed()
    );
    assert_eq!(
        status.ok(),
        Some(StatusCode::UNAUTHORIZED),
        "its user is being deleted"
    );
    // Passes of our own (the one the DELETE started may still run).
    let mut passes = 0;
    loop {
        match app.state.sweeper.try_run_once().await.unwrap() {
            Outcome::Busy => {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
            Outcome::Swept(_) => passes += 1,
        }
        let gone = app.client.get(app.url(&path)).bearer_auth(ADMIN_KEY);
        let status = gone.send().await.unwrap().status();
        if status == StatusCode::NOT_FOUND {
            break;
        }
        assert_eq!(status, StatusCode::OK);
        assert!(passes < PASSES, "still deleting after {passes} passes");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    eprintln!("deleted after {passes} passes, {:?}", started.elapsed());
    let sent = trickling.await.unwrap();
    assert!(sent < MOST_BYTES, "the trickle was never cut");

    let left = app.blob_keys(&user).await;
    assert!(left.is_empty(), "objects of the user: {left:?}");
    assert_eq!(staging_left(&app).await, 0, "staging left behind");
    if let Some((with_parts, empty)) = multipart_uploads(&[id.as_str()]) {
        assert_eq!((with_parts, empty), (0, 0), "multipart uploads left");
    }
    let stopped = app.stop().await;
    let state = filedock::http::AppState::build(stopped).await.unwrap();
    let uid = user.id.parse().unwrap();
    let meta = &state.ports.meta;
    assert!(meta.user(&uid).await.unwrap().is_none(), "the user record");
    assert!(meta.user_resumables(&uid, 10).await.unwrap().is_empty());
    assert!(meta.user_intents(&uid, 10).await.unwrap().is_empty());
}
