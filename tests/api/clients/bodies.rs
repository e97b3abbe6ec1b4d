//! Upload and JSON bodies that misbehave: shorter or longer than their
//! `Content-Length`, cut off, stalled, multipart heads that never end.
//! Each gets a clear answer, in time, and leaves nothing behind.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::helpers::*;

use super::{FILE_PART_HEAD, only_files_left, paced, post_multipart, raw, stalling};

/// Waits until the server has seen the broken upload fail.
async fn seen_failing(app: &TestApp) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while app
        .metric("filedock_uploads_total", "outcome=\"invalid_request\"")
        .await
        < 1.0
    {
        assert!(
            Instant::now() < deadline,
            "the server never failed the upload"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn upload_head(user: &TestUser, extra: &str) -> String {
    format!(
        "POST /v1/files?filename=raw.bin HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {}\r\n{extra}\r\n",
        user.key
    )
}

#[tokio::test]
async fn a_body_shorter_than_its_content_length_leaves_nothing() {
    let app = spawn_app().await;
    let u = app.create_user("short").await;
    let mut req = upload_head(&u, "content-length: 100000\r\n").into_bytes();
    req.extend_from_slice(&[1u8; 1000]);
    raw(&app, &req, true).await; // the client goes away with 99 000 bytes missing
    seen_failing(&app).await;
    only_files_left(&app, &u, 0).await;
}

#[tokio::test]
async fn a_client_that_disconnects_mid_stream_leaves_nothing() {
    let app = spawn_app().await;
    let u = app.create_user("gone").await;
    let mut req = upload_head(&u, "transfer-encoding: chunked\r\n").into_bytes();
    for _ in 0..4 {
        req.extend_from_slice(b"400\r\n");
        req.extend_from_slice(&[2u8; 1024]);
        req.extend_from_slice(b"\r\n");
    }
    raw(&app, &req, true).await; // no terminating chunk
    seen_failing(&app).await;
    only_files_left(&app, &u, 0).await;
}

#[tokio::test]
async fn a_body_longer_than_its_content_length_stores_only_the_declared_bytes() {
    let app = spawn_app().await;
    let u = app.create_user("long").await;
    let mut req = upload_head(&u, "content-length: 10\r\nconnection: close\r\n").into_bytes();
    req.extend_from_slice(b"0123456789 and then some garbage that is not a request");
    let answer = raw(&app, &req, false).await;
    assert!(answer.starts_with("HTTP/1.1 201"), "{answer}");
    let ids = app.list_ids(&u).await;
    assert_eq!(ids.len(), 1);
    assert_eq!(
        app.download(&u, &ids[0])
            .await
            .bytes()
            .await
            .unwrap()
            .as_ref(),
        b"0123456789"
    );
}

#[tokio::test]
async fn a_client_that_stalls_mid_body_is_given_up_on() {
    let mut settings = test_settings();
    settings.body_idle_timeout = Duration::from_millis(500);
    let app = spawn_app_with(settings).await;
    let u = app.create_user("stall").await;
    use futures::StreamExt;
    let stalling = futures::stream::iter(0..2).then(|i| async move {
        if i == 1 {
            tokio::time::sleep(Duration::from_secs(3)).await;
        }
        Ok::<_, std::io::Error>(vec![1u8; 1000])
    });
    let started = Instant::now();
    let res = app
        .client
        .post(app.url("/v1/files?filename=stall.bin"))
        .bearer_auth(&u.key)
        .body(reqwest::Body::wrap_stream(stalling))
        .send()
        .await
        .unwrap();
    assert_eq!(
        error_code(res).await,
        (StatusCode::REQUEST_TIMEOUT, "request_timeout".into())
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "answered before the client resumed"
    );
    only_files_left(&app, &u, 0).await;
}

/// A JSON body that stops arriving gets 408 after the body timeout, like an
/// upload's, instead of holding the request open.
#[tokio::test]
async fn a_json_body_that_never_arrives_gets_408() {
    let mut settings = test_settings();
    settings.body_idle_timeout = Duration::from_millis(500);
    let app = spawn_app_with(settings).await;
    let u = app.create_user("slow-json").await;
    let addr = app.base.trim_start_matches("http://").to_owned();
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST /v1/agents HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\n\
         Content-Type: application/json\r\nContent-Length: 40\r\n\r\n{{\"name\":",
        u.key
    );
    conn.write_all(head.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), conn.read_to_end(&mut answer)).await;
    assert!(read.is_ok(), "no answer within 10 s (body timeout 0.5 s)");
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("request_timeout"), "{answer}");
    let timeouts = app
        .metric("filedock_http_requests_total", "status=\"408\"")
        .await;
    assert_eq!(timeouts, 1.0, "counted as a 408");
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
