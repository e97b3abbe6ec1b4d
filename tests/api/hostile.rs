//! Hostile clients (issue 16): multipart heads that never end or stall, and
//! the in-flight cap counted from a body's first byte.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use futures::StreamExt;
use reqwest::StatusCode;

use crate::helpers::*;

/// How far a paced body got: bytes handed to the client, and whether all were.
#[derive(Clone, Default)]
struct Progress {
    sent: Arc<AtomicUsize>,
    done: Arc<AtomicBool>,
}

impl Progress {
    fn sent(&self) -> usize {
        self.sent.load(Ordering::SeqCst)
    }

    fn done(&self) -> bool {
        self.done.load(Ordering::SeqCst)
    }
}

/// A chunked body: `prefix`, then `total` bytes of `fill` in `chunk`-byte
/// chunks, `pause` apart. Slow enough that an answer given before the body
/// ends is seen as such.
fn paced(
    prefix: &[u8],
    fill: u8,
    total: usize,
    chunk: usize,
    pause: Duration,
) -> (reqwest::Body, Progress) {
    let progress = Progress::default();
    let p = progress.clone();
    let prefix = futures::stream::iter([Ok::<_, std::io::Error>(prefix.to_vec())]);
    let rest = futures::stream::iter(0..total.div_ceil(chunk)).then(move |i| {
        let p = p.clone();
        async move {
            tokio::time::sleep(pause).await;
            let len = chunk.min(total - i * chunk);
            if p.sent.fetch_add(len, Ordering::SeqCst) + len == total {
                p.done.store(true, Ordering::SeqCst);
            }
            Ok(vec![fill; len])
        }
    });
    (reqwest::Body::wrap_stream(prefix.chain(rest)), progress)
}

/// A chunked body that sends `prefix` and then nothing for `stall`.
fn stalling(prefix: &[u8], stall: Duration) -> reqwest::Body {
    let prefix = futures::stream::iter([Ok::<_, std::io::Error>(prefix.to_vec())]);
    let never = futures::stream::once(async move {
        tokio::time::sleep(stall).await;
        Ok(Vec::new())
    });
    reqwest::Body::wrap_stream(prefix.chain(never))
}

const FILE_PART_HEAD: &[u8] =
    b"--BND\r\nContent-Disposition: form-data; name=\"file\"; filename=\"m.bin\"\r\nX-Pad: ";

async fn post_multipart(app: &TestApp, user: &TestUser, body: reqwest::Body) -> reqwest::Response {
    app.client
        .post(app.url("/v1/files"))
        .bearer_auth(&user.key)
        .header("content-type", "multipart/form-data; boundary=BND")
        .body(body)
        .send()
        .await
        .unwrap()
}

/// Nothing stored beyond `files` committed files: no other blob, no intent.
async fn only_files_left(app: &TestApp, user: &TestUser, files: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while app.intents().await > 0 {
        assert!(Instant::now() < deadline, "an intent was left behind");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(app.list_ids(user).await.len(), files, "files listed");
    assert_eq!(app.blob_keys(user).await.len(), files, "blobs stored");
}

/// A part header (or a preamble) that never ends is refused once it passes a
/// few KiB, while the client is still sending it, not when the body ends.
#[tokio::test]
async fn a_multipart_head_that_never_ends_is_refused_at_once() {
    let app = spawn_app().await;
    let u = app.create_user("endless-head").await;
    // 4 MiB of padding over at least 1.3 s; the limit is a few KiB.
    let total = 4 << 20;
    for (what, prefix) in [
        ("part header", FILE_PART_HEAD),
        ("preamble", b"no boundary here: ".as_slice()),
    ] {
        let (body, progress) = paced(prefix, b'a', total, 16 << 10, Duration::from_millis(5));
        let started = Instant::now();
        let res = post_multipart(&app, &u, body).await;
        let (sent, done) = (progress.sent(), progress.done());
        assert_eq!(
            error_code(res).await,
            (StatusCode::BAD_REQUEST, "invalid_request".into()),
            "{what}"
        );
        assert!(
            !done,
            "{what}: answered only after the whole {total}-byte body ({:?})",
            started.elapsed()
        );
        eprintln!(
            "{what}: 400 after {sent} bytes sent, {:?}",
            started.elapsed()
        );
    }
    only_files_left(&app, &u, 0).await;
    // A part header of ordinary size still works.
    let res = app
        .upload_multipart(&u, "fine.txt", b"hello".to_vec())
        .await;
    assert_eq!(res.status(), StatusCode::CREATED);
}

/// A multipart body that stalls inside a part header gets 408 after the
/// body idle timeout, like a body that stalls in the file's bytes.
#[tokio::test]
async fn a_multipart_body_stalled_in_a_part_head_gets_408() {
    let mut settings = test_settings();
    settings.body_idle_timeout = Duration::from_millis(500);
    let app = spawn_app_with(settings).await;
    let u = app.create_user("stalled-head").await;
    let started = Instant::now();
    let res = post_multipart(&app, &u, stalling(FILE_PART_HEAD, Duration::from_secs(6))).await;
    let took = started.elapsed();
    assert_eq!(
        error_code(res).await,
        (StatusCode::REQUEST_TIMEOUT, "request_timeout".into())
    );
    assert!(
        took < Duration::from_secs(4),
        "answered after {took:?}, not within the idle timeout (0.5 s) while the client stalled (6 s)"
    );
    only_files_left(&app, &u, 0).await;
}

/// The per-user cap on uploads in flight counts an upload from its body's
/// first byte: one still sending its part header holds a slot.
#[tokio::test]
async fn an_upload_holds_its_slot_while_its_part_head_arrives() {
    let mut settings = test_settings();
    settings.max_uploads_per_user = 1;
    settings.body_idle_timeout = Duration::from_secs(3);
    let app = spawn_app_with(settings).await;
    let u = app.create_user("slot-head").await;
    let stalled = {
        let (app_client, url, key) = (app.client.clone(), app.url("/v1/files"), u.key.clone());
        tokio::spawn(async move {
            app_client
                .post(url)
                .bearer_auth(key)
                .header("content-type", "multipart/form-data; boundary=BND")
                .body(stalling(FILE_PART_HEAD, Duration::from_secs(10)))
                .send()
                .await
                .unwrap()
                .status()
        })
    };
    // Let the stalled request reach the server first (until it has, a second
    // upload may still pass, and is counted).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut passed = 0;
    let refused = loop {
        assert!(
            !stalled.is_finished(),
            "the stalled upload was answered early"
        );
        let res = app.upload_raw(&u, "second.bin", vec![1; 10]).await;
        match res.status() {
            StatusCode::TOO_MANY_REQUESTS => break res,
            StatusCode::CREATED => passed += 1,
            s => panic!("unexpected {s}"),
        }
        assert!(
            Instant::now() < deadline,
            "{passed} uploads passed beside one stalled in its part header (cap 1)"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(error_code(refused).await.1, "too_many_uploads");
    assert_eq!(
        stalled.await.unwrap(),
        StatusCode::REQUEST_TIMEOUT,
        "the stalled upload times out"
    );
    let res = app.upload_raw(&u, "after.bin", vec![1; 10]).await;
    assert_eq!(res.status(), StatusCode::CREATED, "its slot came back");
    only_files_left(&app, &u, passed + 1).await;
}
