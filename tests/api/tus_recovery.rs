//! Resumable uploads that lose nothing when a PATCH goes wrong (issue 20):
//! an empty PATCH, or one cut before its first byte, keeps what was stored;
//! a final PATCH whose commit is refused (quota, a lock wait that runs out)
//! or whose blob completion answer is lost leaves the upload resumable, and
//! the next PATCH or HEAD at the end offset finishes it. On the embedded
//! adapters and (`FILEDOCK_TEST_BACKEND=real`) on MongoDB, S3 and Redis.

use std::{
    sync::{Arc, atomic::Ordering},
    time::Duration,
};

use bytes::Bytes;
use filedock::{
    domain::UserId, domain::sweeper::Outcome, http::AppState, lock::LockKey, ports::Ports,
};
use futures::StreamExt;
use reqwest::StatusCode;

use crate::{
    helpers::*,
    support::faulty_blobs::LosesCompleteAnswer,
    tus::{content, create, data, head, patch, patch_body, staging_left},
    tus_limits::counts,
};

/// A figure of `/v1/me`'s `usage` (`used_bytes`, `reserved_bytes`, `uploads_in_flight`).
pub(crate) async fn usage(app: &TestApp, user: &TestUser, figure: &str) -> i64 {
    let (_, me) = app.json("GET", "/v1/me", user, None).await;
    me["usage"][figure].as_i64().unwrap()
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

/// An open upload's length is reserved (issue 20, item 6): a plain upload
/// cannot take its bytes, so its final PATCH is never refused for the quota.
#[tokio::test]
async fn a_final_patch_is_not_refused_for_the_quota_its_reservation_holds() {
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
    let plain = app.upload_raw(&user, "plain.bin", vec![9u8; 150]).await;
    assert_eq!(
        error_code(plain).await,
        (StatusCode::INSUFFICIENT_STORAGE, "quota_exceeded".into())
    );
    assert_eq!(usage(&app, &user, "reserved_bytes").await, 200);

    let res = patch(&app, &user, &id, 100, &bytes[100..]).await;
    assert_eq!(res.status(), StatusCode::NO_CONTENT, "the final PATCH");
    assert_eq!(res.headers()["upload-offset"], "200");
    assert!(content(&app, &user, &id).await == bytes, "the bytes differ");
    assert_eq!(usage(&app, &user, "used_bytes").await, 200);
    assert_eq!(usage(&app, &user, "reserved_bytes").await, 0);
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

#[tokio::test]
async fn a_completion_whose_answer_was_lost_is_finished_by_the_next_patch() {
    let settings = test_settings();
    let mut ports = Ports::connect(&settings).await.unwrap();
    let losing = Arc::new(LosesCompleteAnswer {
        lose: true.into(),
        ..LosesCompleteAnswer::wrapping(ports.resumable.clone())
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

/// An app whose lock waits run out after 1 s.
pub(crate) async fn spawn_with_short_lock_wait() -> TestApp {
    let mut settings = test_settings();
    settings.lock.wait_timeout = Duration::from_secs(1);
    spawn_app_with(settings).await
}

/// The final PATCH of upload `id` (`bytes`, all of it) while another
/// upload of the user's holds the commit's lock: refused (`429`), every
/// byte stored.
pub(crate) async fn patch_while_commit_lock_held(
    app: &TestApp,
    user: &TestUser,
    id: &str,
    bytes: &[u8],
) -> reqwest::Response {
    let held = crate::tus_reserve::hold_commit_lock(app, user).await;
    let res = patch(app, user, id, 0, bytes).await;
    held.release().await;
    res
}

#[tokio::test]
async fn a_terminated_upload_whose_commit_was_refused_leaves_nothing() {
    let app = spawn_with_short_lock_wait().await;
    let user = app.create_user("refused-terminated").await;
    let id = create(&app, &user, 100).await;
    let res = patch_while_commit_lock_held(&app, &user, &id, &data(100)).await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);

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
    // Its completed object went too.
    assert_eq!(assert_bucket_matches_metadata(&app.state).await, 0);
    assert_eq!(app.intents().await, 0);
    assert_eq!(staging_left(&app).await, 0, "staging left behind");
}

#[tokio::test]
async fn an_upload_whose_commit_was_refused_expires_whole() {
    let app = spawn_with_short_lock_wait().await;
    let user = app.create_user("refused-expired").await;
    let id = create(&app, &user, 100).await;
    let res = patch_while_commit_lock_held(&app, &user, &id, &data(100)).await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(app.blob_keys(&user).await.len(), 1, "the completed object");

    // Expire it, as if no PATCH had come for FILEDOCK_TUS_EXPIRY_SECS.
    let meta = &app.state.ports.meta;
    let mut upload = meta
        .resumable_by_id_alone(&id.parse().unwrap())
        .await
        .unwrap()
        .unwrap();
    assert!(upload.completed);
    upload.expires_at = filedock::meta::now() - chrono::Duration::seconds(1);
    assert!(
        meta.advance_resumable(&upload, upload.progress())
            .await
            .unwrap()
    );
    let Outcome::Swept(report) = app.state.sweeper.try_run_once().await.unwrap() else {
        panic!("busy")
    };
    assert_eq!((report.resumables_expired, report.orphans_deleted), (1, 1));
    assert!(
        meta.resumable_by_id_alone(&id.parse().unwrap())
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(app.blob_keys(&user).await.len(), 0, "the object went too");
    assert_eq!(app.intents().await, 0);
    assert_eq!(staging_left(&app).await, 0, "staging left behind");
}

/// With the lock backend down (development: no lock at all), two PATCHes
/// from one offset race. The one still streaming when the other finished
/// the upload writes to a blob write that is complete: it is answered as a
/// PATCH from a stale offset (409, or 404 once the upload is gone), never
/// 500, and the upload makes one file of the winner's bytes. On S3 a small
/// upload is one object, which the loser finds holding its own bytes (they
/// are the same): its commit finds the file committed, and it is answered
/// complete (204), never `504` for meeting the winner's file.
#[tokio::test]
async fn a_patch_that_loses_a_race_without_a_lock_is_answered_where_the_upload_is() {
    let mut settings = test_settings();
    settings.redis_url = Some(format!("redis://127.0.0.1:{}/", free_port()).into());
    let app = spawn_app_with(settings).await;
    let user = app.create_user("lockless-race").await;
    let bytes = data(200);
    let id = create(&app, &user, 200).await;
    // The loser: its first byte, then the rest once the winner is done.
    let (go, wait) = tokio::sync::oneshot::channel::<()>();
    let (first, rest) = (bytes[..1].to_vec(), bytes[1..].to_vec());
    let slow = futures::stream::once(async move { Ok::<_, std::io::Error>(first) }).chain(
        futures::stream::once(async move {
            let _ = wait.await;
            Ok(rest)
        }),
    );
    let loser = {
        let (app, user, id) = (&app, &user, id.clone());
        async move {
            let body = reqwest::Body::wrap_stream(slow);
            patch_body(app, user, &id, 0, body, None).await.unwrap()
        }
    };
    let winner = async {
        // The loser passed the offset check and is reading its body.
        let started = std::time::Instant::now();
        while usage(&app, &user, "uploads_in_flight").await == 0 {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "the slow PATCH never started"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let res = patch(&app, &user, &id, 0, &bytes).await;
        assert_eq!(res.status(), StatusCode::NO_CONTENT);
        go.send(()).unwrap();
    };
    let (lost, ()) = tokio::join!(loser, winner);
    let status = lost.status();
    let expected = match real_backends() {
        true => matches!(status, StatusCode::NO_CONTENT),
        false => matches!(status, StatusCode::CONFLICT | StatusCode::NOT_FOUND),
    };
    assert!(expected, "{status}: {}", lost.text().await.unwrap());
    assert_eq!(app.list_ids(&user).await, vec![id.clone()]);
    assert!(content(&app, &user, &id).await == bytes);
}

/// An upload whose bytes are all stored but whose completion failed, and
/// whose intent the sweeper took meanwhile (as its stale-intent scan does
/// with an upload idle past its intent's life): its HEAD does not complete
/// the blob write into an object nobody owns, and answers `upload_expired`.
#[tokio::test]
async fn an_upload_swept_before_its_completion_is_not_completed_into_a_stray() {
    let settings = test_settings();
    let mut ports = Ports::connect(&settings).await.unwrap();
    let refusing = Arc::new(LosesCompleteAnswer {
        refuse: true.into(),
        ..LosesCompleteAnswer::wrapping(ports.resumable.clone())
    });
    ports.resumable = refusing.clone();
    let app = spawn_app_with_state(AppState::with_ports(settings, ports).unwrap()).await;
    let user = app.create_user("swept-first").await;
    let id = create(&app, &user, 200).await;
    let res = patch(&app, &user, &id, 0, &data(200)).await;
    assert_eq!(
        res.status(),
        StatusCode::SERVICE_UNAVAILABLE,
        "the refused completion"
    );
    assert!(
        !refusing.refuse.load(Ordering::SeqCst),
        "the completion was tried"
    );
    let file_id = id.parse().unwrap();
    let meta = &app.state.ports.meta;
    let owner = user.user_id();
    let orphan = meta.abandon_intent(&owner, &file_id, None).await.unwrap();
    assert!(orphan.is_some(), "the sweeper took the intent");
    assert!(matches!(
        app.state.sweeper.try_run_once().await.unwrap(),
        Outcome::Swept(_)
    ));

    let res = app
        .client
        .head(app.url(&format!("/v1/uploads/{id}")))
        .bearer_auth(&user.key)
        .header("tus-resumable", crate::tus::TUS)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::CONFLICT, "upload_expired");
    assert!(
        app.blob_keys(&user).await.is_empty(),
        "an object nobody owns"
    );
    assert_eq!(head(&app, &user, &id).await.0, StatusCode::NOT_FOUND);
}

/// An expired upload whose abort fails (the blob store away) is aborted by
/// the next pass: its record is not dropped while its write is named
/// nowhere else (a multipart upload S3 keeps, and bills, until a lifecycle
/// rule, if any, removes it).
#[tokio::test]
async fn an_expired_upload_whose_abort_failed_is_aborted_by_the_next_pass() {
    let settings = test_settings();
    let mut ports = Ports::connect(&settings).await.unwrap();
    let blobs = Arc::new(LosesCompleteAnswer {
        refuse_abort: true.into(),
        ..LosesCompleteAnswer::wrapping(ports.resumable.clone())
    });
    ports.resumable = blobs.clone();
    let app = spawn_app_with_state(AppState::with_ports(settings, ports).unwrap()).await;
    let user = app.create_user("abort-fails").await;
    let id = create(&app, &user, 200).await;
    assert_eq!(
        patch(&app, &user, &id, 0, &data(100)).await.status(),
        StatusCode::NO_CONTENT
    );
    assert_eq!(counts(&app, &user).await, (0, 200, 1));
    let (meta, file_id) = (&app.state.ports.meta, id.parse().unwrap());
    let first = crate::tus_reserve::expire_and_sweep(&app, &id).await;
    assert!(
        !blobs.refuse_abort.load(Ordering::SeqCst),
        "the abort was tried"
    );
    assert_eq!(
        (first.failures, blobs.aborted.load(Ordering::SeqCst)),
        (1, 0),
        "{first:?}"
    );
    // The claim gave its reservation back; the record put back holds none.
    assert_eq!(counts(&app, &user).await, (0, 0, 0));
    let Outcome::Swept(second) = app.state.sweeper.try_run_once().await.unwrap() else {
        panic!("busy")
    };
    assert_eq!(
        blobs.aborted.load(Ordering::SeqCst),
        1,
        "aborted again: {second:?}"
    );
    assert!(
        meta.resumable_by_id_alone(&file_id)
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(counts(&app, &user).await, (0, 0, 0), "given back once");
    assert_eq!(app.intents().await, 0);
    assert_eq!(staging_left(&app).await, 0, "staging left behind");
}

/// An upload the sweeper takes while it is being finished (between the
/// blob's completion and the reading of its first bytes for its type) is
/// answered `upload_expired`, not 500, and leaves nothing.
#[tokio::test]
async fn an_upload_swept_while_it_is_finished_is_answered_expired() {
    let settings = test_settings();
    let mut ports = Ports::connect(&settings).await.unwrap();
    let blobs = Arc::new(LosesCompleteAnswer {
        swept_after_complete: Some((ports.meta.clone(), ports.blobs.clone())).into(),
        ..LosesCompleteAnswer::wrapping(ports.resumable.clone())
    });
    ports.resumable = blobs.clone();
    let app = spawn_app_with_state(AppState::with_ports(settings, ports).unwrap()).await;
    let user = app.create_user("swept-while-finished").await;
    let id = create(&app, &user, 200).await;
    let res = patch(&app, &user, &id, 0, &data(200)).await;
    assert!(
        blobs.swept_after_complete.lock().unwrap().is_none(),
        "swept"
    );
    assert_eq!(
        error_code(res).await,
        (StatusCode::CONFLICT, "upload_expired".into())
    );
    assert!(app.blob_keys(&user).await.is_empty());
    assert!(app.list_ids(&user).await.is_empty());
    assert_eq!(head(&app, &user, &id).await.0, StatusCode::NOT_FOUND);
}
