//! Lock-release requests (issue 20, item 4): a PATCH whose client went
//! silent mid-body (no FIN, no RST: a phone that changed networks) holds
//! the upload's lock; a `HEAD` or PATCH on the upload asks it, on whichever
//! instance it runs, to store what arrived and let go, and proceeds at
//! once instead of answering 423 until the body's idle timeout. On the
//! embedded adapters and (`FILEDOCK_TEST_BACKEND=real`) on MongoDB, S3 and
//! Redis, with a second instance for the cross-instance case.

use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::channel::mpsc;
use reqwest::StatusCode;

use crate::{
    helpers::*,
    tus::{OCTETS, TUS, content, create, data, head, patch, staging_left},
};

/// What the silent client sends before it goes quiet: whole parts of
/// either blob store and a tail.
const SENT: usize = (5 << 20) + 12_345;
const LEN: usize = 12 << 20;
/// Long enough for the server to have read what was sent.
const SETTLE: Duration = Duration::from_secs(1);
/// A take-over is a release request and the holder storing its tail: well
/// under tus-js-client's 9 s of default retries.
const TAKE_OVER_WITHIN: Duration = Duration::from_secs(5);

/// The client's end of a PATCH body it sends piece by piece.
pub(crate) type Pieces = mpsc::UnboundedSender<Result<Bytes, std::io::Error>>;

/// A PATCH of `len` bytes from `offset` whose body is what the sender is
/// given, when it is given; it ends when the sender is dropped.
pub(crate) fn streamed_patch(
    app: &TestApp,
    user: &TestUser,
    id: &str,
    (offset, len): (usize, usize),
) -> (
    Pieces,
    tokio::task::JoinHandle<reqwest::Result<reqwest::Response>>,
) {
    let (tx, rx) = mpsc::unbounded();
    let req = app
        .client
        .patch(app.url(&format!("/v1/uploads/{id}")))
        .bearer_auth(&user.key)
        .header("tus-resumable", TUS)
        .header("content-type", OCTETS)
        .header("upload-offset", offset.to_string())
        .header("content-length", len.to_string())
        .body(reqwest::Body::wrap_stream(rx));
    (tx, tokio::spawn(req.send()))
}

/// A PATCH from offset 0 that sends `bytes[..SENT]` and then nothing, its
/// connection left open: the sender keeps it silent until dropped.
fn silent_patch(
    app: &TestApp,
    user: &TestUser,
    id: &str,
    bytes: &[u8],
) -> (
    Pieces,
    tokio::task::JoinHandle<reqwest::Result<reqwest::Response>>,
) {
    let (tx, sent) = streamed_patch(app, user, id, (0, LEN));
    tx.unbounded_send(Ok(Bytes::copy_from_slice(&bytes[..SENT])))
        .unwrap();
    (tx, sent)
}

/// The stopped PATCH's answer, if its client still reads: 423.
async fn stopped_answer(
    stuck: tokio::task::JoinHandle<reqwest::Result<reqwest::Response>>,
) -> Option<StatusCode> {
    let answer = tokio::time::timeout(Duration::from_secs(5), stuck).await;
    answer.ok()?.unwrap().ok().map(|r| r.status())
}

#[tokio::test]
async fn a_head_stops_a_silent_patch_which_stores_what_arrived() {
    let app = spawn_app().await;
    let user = app.create_user("silent-head").await;
    let bytes = data(LEN);
    let id = create(&app, &user, LEN).await;
    let (tx, stuck) = silent_patch(&app, &user, &id, &bytes);
    tokio::time::sleep(SETTLE).await;

    let started = Instant::now();
    let (status, offset) = head(&app, &user, &id).await;
    let took = started.elapsed();
    eprintln!("take-over by HEAD: {took:?}");
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        offset,
        Some(SENT),
        "HEAD gives what the silent PATCH stored"
    );
    assert!(took < TAKE_OVER_WITHIN, "the take-over took {took:?}");
    let res = patch(&app, &user, &id, SENT, &bytes[SENT..]).await;
    assert_eq!(res.status(), StatusCode::NO_CONTENT, "the resumed PATCH");

    drop(tx);
    if let Some(s) = stopped_answer(stuck).await {
        assert_eq!(s, StatusCode::LOCKED, "the stopped PATCH's answer");
    }
    assert!(content(&app, &user, &id).await == bytes, "the bytes differ");
    assert_eq!(app.list_ids(&user).await, [id], "one file");
    assert_eq!(assert_bucket_matches_metadata(&app.state).await, 1);
    assert_eq!(staging_left(&app).await, 0, "staging left behind");
}

#[tokio::test]
async fn a_patch_stops_a_silent_patch_and_learns_the_offset_it_stored() {
    let app = spawn_app().await;
    let user = app.create_user("silent-patch").await;
    let bytes = data(LEN);
    let id = create(&app, &user, LEN).await;
    let (tx, stuck) = silent_patch(&app, &user, &id, &bytes);
    tokio::time::sleep(SETTLE).await;

    // A client that retries without asking first: its PATCH from 0 takes
    // the upload over and is told where it stands.
    let started = Instant::now();
    let res = patch(&app, &user, &id, 0, &bytes).await;
    let took = started.elapsed();
    eprintln!("take-over by PATCH: {took:?}");
    assert_eq!(res.status(), StatusCode::CONFLICT, "not 423");
    assert!(took < TAKE_OVER_WITHIN, "the take-over took {took:?}");
    assert_eq!(head(&app, &user, &id).await, (StatusCode::OK, Some(SENT)));
    let res = patch(&app, &user, &id, SENT, &bytes[SENT..]).await;
    assert_eq!(res.status(), StatusCode::NO_CONTENT);

    drop(tx);
    let _ = stopped_answer(stuck).await;
    assert!(content(&app, &user, &id).await == bytes, "the bytes differ");
    assert_eq!(app.list_ids(&user).await, [id], "one file");
    assert_eq!(assert_bucket_matches_metadata(&app.state).await, 1);
}

/// Two instances on one Redis, MongoDB and S3: the silent PATCH runs on
/// one, the client resumes on the other, whose request reaches the holder
/// through Redis.
#[tokio::test]
async fn a_head_on_another_instance_stops_a_silent_patch() {
    if !real_backends() {
        // One process: the embedded adapters cannot be shared.
        return;
    }
    let settings = test_settings();
    let a = spawn_app_with(settings.clone()).await;
    let b = spawn_app_with(settings).await;
    let user = a.create_user("silent-two").await;
    let bytes = data(LEN);
    let id = create(&a, &user, LEN).await;
    let (tx, stuck) = silent_patch(&a, &user, &id, &bytes);
    tokio::time::sleep(SETTLE).await;

    let started = Instant::now();
    let (status, offset) = head(&b, &user, &id).await;
    let took = started.elapsed();
    eprintln!("take-over across instances: {took:?}");
    assert_eq!((status, offset), (StatusCode::OK, Some(SENT)));
    assert!(took < TAKE_OVER_WITHIN, "the take-over took {took:?}");
    let res = patch(&b, &user, &id, SENT, &bytes[SENT..]).await;
    assert_eq!(res.status(), StatusCode::NO_CONTENT, "the resumed PATCH");

    drop(tx);
    let _ = stopped_answer(stuck).await;
    assert!(content(&a, &user, &id).await == bytes, "the bytes differ");
    assert_eq!(a.list_ids(&user).await, [id], "one file");
    assert_eq!(assert_bucket_matches_metadata(&a.state).await, 1);
}

/// A PATCH whose client is still sending is not stopped by another
/// request: a HEAD polling its progress is answered the stored offset
/// after a short wait, and the PATCH goes on to the end.
#[tokio::test]
async fn a_head_does_not_stop_a_patch_that_is_still_sending() {
    let app = spawn_app().await;
    let user = app.create_user("live-head").await;
    let bytes = data(LEN);
    let id = create(&app, &user, LEN).await;
    let (tx, live) = streamed_patch(&app, &user, &id, (0, LEN));
    // A piece every 250 ms, quicker than the holder's release idle time.
    const PIECES: usize = 24;
    let piece = LEN.div_ceil(PIECES);
    let sending = {
        let bytes = bytes.clone();
        tokio::spawn(async move {
            for chunk in bytes.chunks(piece) {
                tx.unbounded_send(Ok(Bytes::copy_from_slice(chunk)))
                    .unwrap();
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        })
    };
    tokio::time::sleep(SETTLE).await;
    let (status, offset) = head(&app, &user, &id).await;
    assert_eq!(status, StatusCode::OK);
    assert!(offset.unwrap() < LEN, "the PATCH was still sending");
    sending.await.unwrap();
    let res = live.await.unwrap().unwrap();
    assert_eq!(
        res.status(),
        StatusCode::NO_CONTENT,
        "the live PATCH was not stopped"
    );
    assert!(content(&app, &user, &id).await == bytes, "the bytes differ");
    assert_eq!(app.list_ids(&user).await, vec![id], "one file");
}

/// A release request that gave up (a HEAD answered after its wait) does not
/// stop the PATCH later: a pause of the body after it is no cut.
#[tokio::test]
async fn a_release_request_that_gave_up_does_not_stop_the_patch_later() {
    let app = spawn_app().await;
    let user = app.create_user("late-pause").await;
    let bytes = data(LEN);
    let id = create(&app, &user, LEN).await;
    let (tx, live) = streamed_patch(&app, &user, &id, (0, LEN));
    const PIECES: usize = 32;
    let piece = LEN.div_ceil(PIECES);
    let chunks: Vec<Bytes> = bytes.chunks(piece).map(Bytes::copy_from_slice).collect();
    let (first, rest) = chunks.split_at(PIECES / 2);
    // Flowing while a HEAD asks for the upload and gives up.
    let flowing = async {
        for c in first {
            tx.unbounded_send(Ok(c.clone())).unwrap();
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    };
    let asking = async {
        tokio::time::sleep(SETTLE).await;
        let (status, offset) = head(&app, &user, &id).await;
        assert_eq!(status, StatusCode::OK);
        assert!(offset.unwrap() < LEN);
    };
    tokio::join!(flowing, asking);
    // Then a pause longer than the release idle time, and the rest.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    for c in rest {
        tx.unbounded_send(Ok(c.clone())).unwrap();
    }
    drop(tx);
    let res = live.await.unwrap().unwrap();
    assert_eq!(
        res.status(),
        StatusCode::NO_CONTENT,
        "cut by a request that gave up"
    );
    assert!(content(&app, &user, &id).await == bytes, "the bytes differ");
}

/// A PATCH of another user's upload, while its owner's PATCH streams (the
/// lock held), is answered 404 without asking the holder to let go: the
/// owner's PATCH goes on to the end and commits every byte.
#[tokio::test]
async fn another_user_s_patch_does_not_stop_the_owner_s() {
    let app = spawn_app().await;
    let owner = app.create_user("owner").await;
    let other = app.create_user("other").await;
    let bytes = data(LEN);
    let id = create(&app, &owner, LEN).await;
    let (tx, sending) = silent_patch(&app, &owner, &id, &bytes);
    tokio::time::sleep(SETTLE).await;

    let res = patch(&app, &other, &id, 0, &bytes).await;
    assert_eq!(res.status(), StatusCode::NOT_FOUND);
    let (status, _) = head(&app, &other, &id).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    // Still streaming: the rest arrives and the owner's PATCH finishes it.
    tx.unbounded_send(Ok(Bytes::copy_from_slice(&bytes[SENT..])))
        .unwrap();
    drop(tx);
    let answer = sending.await.unwrap().unwrap();
    assert_eq!(answer.status(), StatusCode::NO_CONTENT, "the owner's PATCH");
    assert!(
        content(&app, &owner, &id).await == bytes,
        "the bytes differ"
    );
    assert_eq!(app.list_ids(&owner).await, [id], "one file");
    assert_eq!(assert_bucket_matches_metadata(&app.state).await, 1);
}
