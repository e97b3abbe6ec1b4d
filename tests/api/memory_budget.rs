//! The upload memory budget's bounds on one client (issue 27, review): a
//! user's uploads hold at most the user's share, so one user's trickling
//! uploads leave room for another's; a wait for memory ends after
//! `FILEDOCK_UPLOAD_MEMORY_WAIT_SECS` with 503 `memory_busy`, leaving
//! nothing (a tus PATCH keeps what was stored before); a PATCH waiting for
//! memory lets go of its upload when another request asks; a small upload
//! reserves its length, not a whole part. On the embedded adapters and
//! (`FILEDOCK_TEST_BACKEND=real`) on MongoDB, S3 and Redis.

use std::time::{Duration, Instant};

use bytes::Bytes;
use reqwest::StatusCode;

use crate::{
    helpers::*,
    tus::{content, create, data, head, patch},
    tus_release::{Pieces, streamed_patch},
};

/// One part of the embedded store (and the smallest budget); S3's parts
/// here are 5 MiB.
const PART: u64 = 8 << 20;
/// Larger than a part: a PATCH of it reserves a whole part.
const LEN: usize = 12 << 20;
/// What a trickling client sends before it goes quiet.
const TRICKLE: usize = 1024;
/// Long enough for a refused wait; short enough for a test.
const WAIT_SECS: f64 = 2.0;

type Answer = tokio::task::JoinHandle<reqwest::Result<reqwest::Response>>;

async fn app_with(budget: u64, share: f64, wait_secs: f64) -> TestApp {
    let mut s = test_settings();
    s.upload_memory_bytes = budget;
    s.upload_memory_user_share = share;
    s.upload_memory_wait = Duration::from_secs_f64(wait_secs);
    spawn_app_with(s).await
}

/// A tus upload of `LEN` bytes whose PATCH sends `TRICKLE` bytes and then
/// nothing, holding a part of the budget; it ends when the sender is dropped.
async fn trickling(app: &TestApp, user: &TestUser) -> (Pieces, Answer) {
    let id = create(app, user, LEN).await;
    let (tx, answer) = streamed_patch(app, user, &id, (0, LEN));
    tx.unbounded_send(Ok(Bytes::from(vec![7u8; TRICKLE])))
        .unwrap();
    (tx, answer)
}

/// Waits (at most 10 s) until `metric` is at least `value`.
async fn until_metric(app: &TestApp, metric: &str, value: f64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while app.metric(metric, "").await < value {
        assert!(Instant::now() < deadline, "{metric} never reached {value}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Ends the trickling PATCHes (their clients go away mid-body) and waits
/// until the server has given back all their memory.
async fn end(app: &TestApp, held: Vec<(Pieces, Answer)>) {
    let (senders, answers): (Vec<_>, Vec<_>) = held.into_iter().unzip();
    drop(senders);
    for a in answers {
        let _ = a.await.unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while app.metric("filedock_upload_memory_used_bytes", "").await > 0.0 {
        assert!(Instant::now() < deadline, "the memory was never given back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn one_users_trickling_uploads_leave_room_for_another_user() {
    // Four parts; one user may hold two of them (three of S3's).
    let app = app_with(4 * PART, 0.5, WAIT_SECS).await;
    let (a, b) = (
        app.create_user("trickler").await,
        app.create_user("other").await,
    );
    // Without a share of their own, seven trickling PATCHes would hold the
    // whole budget (7 × 5 MiB of 32 on S3) and leave less than a part.
    let mut held = Vec::new();
    for _ in 0..7 {
        held.push(trickling(&app, &a).await);
    }
    until_metric(&app, "filedock_upload_memory_waiters", 1.0).await;

    let bytes = data(LEN);
    let id = create(&app, &b, LEN).await;
    // Without the share, it would wait for a part and be refused.
    let res = patch(&app, &b, &id, 0, &bytes).await;
    let (status, code) = error_code(res).await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{code}");
    assert!(content(&app, &b, &id).await == bytes, "the bytes differ");

    // The trickler's PATCHes past its share waited and were refused.
    until_metric(&app, "filedock_upload_memory_busy_total", 4.0).await;
    end(&app, held).await;
    assert_eq!(app.metric("filedock_upload_memory_waiters", "").await, 0.0);
}

#[tokio::test]
async fn a_wait_for_memory_past_its_limit_answers_503_and_leaves_nothing() {
    let app = app_with(PART, 1.0, WAIT_SECS).await;
    let (a, b) = (
        app.create_user("holder").await,
        app.create_user("waiter").await,
    );
    let bytes = data(LEN);
    // Stored before the budget is spent: a tail of B's upload.
    let id = create(&app, &b, LEN).await;
    let first = (1 << 20) + 5;
    let res = patch(&app, &b, &id, 0, &bytes[..first]).await;
    assert_eq!(res.status(), StatusCode::NO_CONTENT);

    let held = vec![trickling(&app, &a).await];
    until_metric(&app, "filedock_upload_memory_used_bytes", 1.0).await;
    let res = patch(&app, &b, &id, first, &bytes[first..]).await;
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(res.headers().contains_key("retry-after"));
    assert_eq!(error_code(res).await.1, "memory_busy");
    assert_eq!(
        head(&app, &b, &id).await,
        (StatusCode::OK, Some(first)),
        "what was stored before stays"
    );

    // A plain upload: S3 buffers its parts; local files stream to disk.
    let intents = app.intents().await;
    let res = app.upload_raw(&b, "plain.bin", bytes.clone()).await;
    match real_backends() {
        true => {
            let (status, code) = error_code(res).await;
            assert_eq!(
                (status, code.as_str()),
                (StatusCode::SERVICE_UNAVAILABLE, "memory_busy")
            );
            assert!(app.list_ids(&b).await.is_empty(), "no file");
            assert_eq!(app.blob_keys(&b).await, Vec::<String>::new(), "no blob");
            assert_eq!(
                app.intents().await,
                intents,
                "no intent (the tus uploads' stay)"
            );
        }
        false => assert_eq!(res.status(), StatusCode::CREATED),
    }
    assert!(app.metric("filedock_upload_memory_busy_total", "").await >= 1.0);

    end(&app, held).await;
    let res = patch(&app, &b, &id, first, &bytes[first..]).await;
    assert_eq!(res.status(), StatusCode::NO_CONTENT, "the retry");
    assert!(content(&app, &b, &id).await == bytes, "the bytes differ");
}

#[tokio::test]
async fn a_patch_waiting_for_memory_lets_go_when_another_request_asks() {
    // A long wait: only the release request can end it in time.
    let app = app_with(PART, 1.0, 60.0).await;
    let (a, b) = (
        app.create_user("holder").await,
        app.create_user("asker").await,
    );
    let held = vec![trickling(&app, &a).await];
    until_metric(&app, "filedock_upload_memory_used_bytes", 1.0).await;
    let id = create(&app, &b, LEN).await;
    let (tx, waiting) = streamed_patch(&app, &b, &id, (0, LEN));
    tx.unbounded_send(Ok(Bytes::from(vec![1u8; TRICKLE])))
        .unwrap();
    until_metric(&app, "filedock_upload_memory_waiters", 1.0).await;

    let started = Instant::now();
    let (status, offset) = head(&app, &b, &id).await;
    let took = started.elapsed();
    assert_eq!(
        (status, offset),
        (StatusCode::OK, Some(0)),
        "nothing stored"
    );
    assert!(took < Duration::from_secs(5), "the take-over took {took:?}");
    assert_eq!(app.metric("filedock_upload_memory_waiters", "").await, 0.0);
    // Its answer (given before the HEAD's), if its client still reads.
    drop(tx);
    let answer = tokio::time::timeout(Duration::from_secs(5), waiting).await;
    if let Ok(Ok(res)) = answer.expect("the waiting PATCH answered") {
        assert_eq!(res.status(), StatusCode::LOCKED, "it let go");
    }

    end(&app, held).await;
    let bytes = data(LEN);
    let res = patch(&app, &b, &id, 0, &bytes).await;
    assert_eq!(res.status(), StatusCode::NO_CONTENT, "the resumed upload");
    assert!(content(&app, &b, &id).await == bytes, "the bytes differ");
}

#[tokio::test]
async fn a_small_upload_reserves_its_length_not_a_part() {
    let app = spawn_app().await;
    let user = app.create_user("small").await;
    let small = 100 << 10;
    let res = app.upload_raw(&user, "raw.bin", data(small)).await;
    assert_eq!(res.status(), StatusCode::CREATED);
    let res = app.upload_multipart(&user, "form.bin", data(small)).await;
    assert_eq!(res.status(), StatusCode::CREATED);
    let id = create(&app, &user, small).await;
    let res = patch(&app, &user, &id, 0, &data(small)).await;
    assert_eq!(res.status(), StatusCode::NO_CONTENT);

    // Each reserved at most its request's length (the form's boundaries
    // and headers included), rounded to the budget's 1 KiB units.
    let peak = app.metric("filedock_upload_memory_peak_bytes", "").await as u64;
    assert!(peak <= small as u64 + 1024, "peak {peak}, a part is {PART}");
    assert!(
        peak >= small as u64,
        "the PATCH reserved its length: {peak}"
    );
    assert_eq!(
        app.metric("filedock_upload_memory_used_bytes", "").await,
        0.0
    );
}
