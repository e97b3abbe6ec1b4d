//! Hostile clients (issue 16): multipart heads that never end or stall, the
//! in-flight cap counted from a body's first byte, chunked uploads cut off
//! at the quota, and quota refusals confirmed against the store.

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

/// A chunked upload (no `Content-Length`) stops being read as soon as it
/// passes what is left of the quota: 507 while the client is still sending,
/// nothing stored, and on S3 the multipart upload it had begun is aborted.
#[tokio::test]
async fn a_chunked_upload_past_the_quota_is_cut_off_at_once() {
    let mut settings = test_settings();
    settings.user_quota_bytes = Some(8 << 20);
    let app = spawn_app_with(settings).await;
    let u = app.create_user("chunked-quota").await;
    let res = app.upload_raw(&u, "fill.bin", vec![7; 2 << 20]).await;
    assert_eq!(res.status(), StatusCode::CREATED);
    // 48 MiB over at least 1.9 s; 6 MiB are left (more than one S3 part).
    let total = 48 << 20;
    let (body, progress) = paced(&[], 1, total, 256 << 10, Duration::from_millis(10));
    let started = Instant::now();
    let res = upload_stream(&app, &u, body).await;
    let (sent, done) = (progress.sent(), progress.done());
    assert_eq!(
        error_code(res).await,
        (StatusCode::INSUFFICIENT_STORAGE, "quota_exceeded".into())
    );
    assert!(
        !done,
        "answered only after the whole {total}-byte body ({:?})",
        started.elapsed()
    );
    eprintln!("507 after {sent} bytes sent, {:?}", started.elapsed());
    only_files_left(&app, &u, 1).await;
    if real_backends() {
        let aborted = app
            .metric("filedock_s3_multipart_total", "outcome=\"aborted\"")
            .await;
        assert_eq!(aborted, 1.0, "the S3 multipart upload was aborted");
    }
}

/// The same for the size limit: 413 while the client is still sending.
#[tokio::test]
async fn a_chunked_upload_past_the_size_limit_is_cut_off_at_once() {
    let mut settings = test_settings();
    settings.max_upload_bytes = 6 << 20;
    let app = spawn_app_with(settings).await;
    let u = app.create_user("chunked-limit").await;
    let total = 48 << 20;
    let (body, progress) = paced(&[], 1, total, 256 << 10, Duration::from_millis(10));
    let res = upload_stream(&app, &u, body).await;
    let done = progress.done();
    assert_eq!(
        error_code(res).await,
        (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large".into())
    );
    assert!(!done, "answered only after the whole body");
    only_files_left(&app, &u, 0).await;
}

/// The authenticated user (and so their usage) is cached; after they delete
/// files, the cached usage overstates what they use. An upload the cache
/// would refuse is checked against the store first, with or without a
/// `Content-Length`.
#[tokio::test]
async fn a_quota_refusal_from_the_cached_usage_is_confirmed_first() {
    let mut settings = test_settings();
    settings.user_quota_bytes = Some(1 << 20);
    settings.auth_cache_ttl = Duration::from_secs(3);
    let app = spawn_app_with(settings).await;
    let u = app.create_user("stale-usage").await;
    let full = app.upload_json(&u, "full.bin", vec![1; 900 << 10]).await;
    let full = full["id"]
        .as_str()
        .expect("the first upload fits")
        .to_owned();
    // Let the record cached before that upload expire, then cache one that
    // counts it (for 3 s).
    tokio::time::sleep(Duration::from_millis(3200)).await;
    assert_eq!(app.list_ids(&u).await, std::slice::from_ref(&full));
    let delete = |id: String| {
        app.client
            .delete(app.url(&format!("/v1/files/{id}")))
            .bearer_auth(&u.key)
            .send()
    };
    assert_eq!(delete(full).await.unwrap().status(), StatusCode::NO_CONTENT);

    // With a Content-Length: the early check.
    let res = app.upload_raw(&u, "declared.bin", vec![2; 600 << 10]).await;
    assert_eq!(res.status(), StatusCode::CREATED, "declared length");
    let id = res.json::<serde_json::Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(delete(id).await.unwrap().status(), StatusCode::NO_CONTENT);

    // Chunked: the check while the body streams.
    let chunks = futures::stream::iter(0..6).map(|_| Ok::<_, std::io::Error>(vec![3u8; 100 << 10]));
    let res = app
        .client
        .post(app.url("/v1/files?filename=chunked.bin"))
        .bearer_auth(&u.key)
        .body(reqwest::Body::wrap_stream(chunks))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::CREATED, "chunked");

    // A real refusal is still given.
    let res = app.upload_raw(&u, "over.bin", vec![4; 600 << 10]).await;
    assert_eq!(
        error_code(res).await,
        (StatusCode::INSUFFICIENT_STORAGE, "quota_exceeded".into())
    );
    only_files_left(&app, &u, 1).await;
}

/// Uploads a streamed (chunked, no length) body as `big.bin`.
async fn upload_stream(app: &TestApp, u: &TestUser, body: reqwest::Body) -> reqwest::Response {
    app.client
        .post(app.url("/v1/files?filename=big.bin"))
        .bearer_auth(&u.key)
        .body(body)
        .send()
        .await
        .unwrap()
}
