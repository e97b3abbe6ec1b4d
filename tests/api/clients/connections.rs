//! Connections a hostile client holds (issue 16, item 3): ones that send
//! nothing or never finish their head, enormous headers, cleartext HTTP/2,
//! and more connections than the server serves.

use std::time::{Duration, Instant};

use filedock::config::Settings;
use reqwest::StatusCode;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

use crate::helpers::*;

/// How long a test waits for the server to close a connection whose
/// header timeout is 1 s before calling it held open (a guard, not a measure).
const CLOSE_GUARD: Duration = Duration::from_secs(20);

/// How long a connection past the bound goes unanswered before the test
/// takes it as not served (a served `/healthz` answers in milliseconds).
const UNSERVED_FOR: Duration = Duration::from_millis(500);

/// The HTTP/2 client preface and an empty SETTINGS frame (RFC 9113 §3.4).
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0";

/// The frame type of SETTINGS (RFC 9113 §6.5).
const H2_SETTINGS: u8 = 0x4;

const HEALTHZ: &[u8] = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";

async fn connect(app: &TestApp) -> TcpStream {
    TcpStream::connect(app.base.trim_start_matches("http://"))
        .await
        .unwrap()
}

/// Reads until the server closes the connection; `None` if it was still
/// open after [`CLOSE_GUARD`].
async fn until_closed(conn: &mut TcpStream) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    match tokio::time::timeout(CLOSE_GUARD, conn.read_to_end(&mut out)).await {
        Ok(_) => Some(out), // EOF or a reset: closed either way
        Err(_) => None,
    }
}

/// Reads one HTTP/1.1 response (head and `Content-Length` body).
async fn response(conn: &mut TcpStream) -> String {
    let mut buf = Vec::new();
    loop {
        let mut chunk = [0u8; 4096];
        let n = conn.read(&mut chunk).await.unwrap();
        assert!(n > 0, "the connection closed mid-response");
        buf.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&buf).into_owned();
        if let Some(head_end) = text.find("\r\n\r\n") {
            let len: usize = text[..head_end]
                .lines()
                .find_map(|l| {
                    let (name, value) = l.split_once(':')?;
                    name.eq_ignore_ascii_case("content-length")
                        .then(|| value.trim().parse().unwrap())
                })
                .unwrap_or(0);
            if buf.len() >= head_end + 4 + len {
                return text;
            }
        }
    }
}

fn short_header_timeout() -> Settings {
    let mut s = test_settings();
    s.header_timeout = Duration::from_secs(1);
    s
}

#[tokio::test]
async fn a_connection_that_sends_nothing_is_closed_after_the_header_timeout() {
    let app = spawn_app_with(short_header_timeout()).await;
    let mut silent = connect(&app).await;
    let rest = until_closed(&mut silent).await;
    assert!(
        rest.is_some(),
        "a connection that sent nothing was still open after {CLOSE_GUARD:?} (header timeout 1 s)"
    );

    // Idle again after a request: closed as well.
    let mut kept = connect(&app).await;
    kept.write_all(HEALTHZ).await.unwrap();
    assert!(response(&mut kept).await.starts_with("HTTP/1.1 200"));
    assert!(
        until_closed(&mut kept).await.is_some(),
        "an idle keep-alive connection was still open after {CLOSE_GUARD:?}"
    );
}

/// A client that opens a connection and never finishes its request head
/// (slowloris) is disconnected after the header timeout; others are served
/// meanwhile.
#[tokio::test]
async fn a_client_that_never_finishes_its_headers_is_disconnected() {
    let mut settings = test_settings();
    settings.header_timeout = Duration::from_secs(1);
    let app = spawn_app_with(settings).await;
    let addr = app.base.trim_start_matches("http://").to_owned();
    let mut slow = tokio::net::TcpStream::connect(addr).await.unwrap();
    slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        .await
        .unwrap();
    let healthy = app.client.get(app.url("/healthz")).send().await.unwrap();
    assert_eq!(healthy.status(), StatusCode::OK, "others are served");
    let started = Instant::now();
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(10), slow.read_to_end(&mut rest)).await;
    assert!(
        closed.is_ok(),
        "the connection was still open after 10 s (header timeout 1 s)"
    );
    assert!(
        !String::from_utf8_lossy(&rest).contains("200 OK"),
        "an unfinished request was not served"
    );
    eprintln!("closed after {:?}", started.elapsed());
}

#[tokio::test]
async fn enormous_headers_are_refused_and_the_server_stays_up() {
    let app = spawn_app().await;
    // A 1 MiB header, sent while the answer is read: the server answers 431
    // once the head passes its limit, without waiting for the rest.
    let (mut rx, mut tx) = connect(&app).await.into_split();
    let writer = tokio::spawn(async move {
        let _ = tx
            .write_all(b"GET /v1/files HTTP/1.1\r\nHost: x\r\nX-Huge: ")
            .await;
        let chunk = vec![b'x'; 16 << 10];
        for _ in 0..64 {
            if tx.write_all(&chunk).await.is_err() {
                return; // the server has stopped reading
            }
        }
        let _ = tx.write_all(b"\r\n\r\n").await;
    });
    let mut answer = Vec::new();
    let read = tokio::time::timeout(CLOSE_GUARD, rx.read_to_end(&mut answer)).await;
    let _ = writer.await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(read.is_ok(), "no answer within {CLOSE_GUARD:?}");
    assert!(
        answer.starts_with("HTTP/1.1 431"),
        "a 1 MiB header got {:.80}",
        answer
    );
    assert_eq!(
        app.client
            .get(app.url("/healthz"))
            .send()
            .await
            .unwrap()
            .status(),
        StatusCode::OK
    );
}

#[tokio::test]
async fn cleartext_http2_is_refused_unless_enabled() {
    let app = spawn_app_with(short_header_timeout()).await;
    let mut h2 = connect(&app).await;
    h2.write_all(H2_PREFACE).await.unwrap();
    let answer = until_closed(&mut h2)
        .await
        .expect("the connection was closed");
    assert!(
        answer.is_empty() || answer.starts_with(b"HTTP/1.1 "),
        "an HTTP/2 preface got an HTTP/2 answer: {:?}",
        &answer[..answer.len().min(16)]
    );

    let mut settings = short_header_timeout();
    settings.h2c = true;
    let app = spawn_app_with(settings).await;
    let mut h2 = connect(&app).await;
    h2.write_all(H2_PREFACE).await.unwrap();
    let mut frame_head = [0u8; 9];
    h2.read_exact(&mut frame_head).await.unwrap();
    assert_eq!(frame_head[3], H2_SETTINGS, "h2c on: the server's SETTINGS");
    // An HTTP/2 connection that opens no stream is closed too.
    assert!(
        until_closed(&mut h2).await.is_some(),
        "an idle HTTP/2 connection was still open after {CLOSE_GUARD:?} (header timeout 1 s)"
    );
}

#[tokio::test]
async fn connections_past_the_bound_wait_until_one_closes() {
    let mut settings = test_settings();
    settings.max_connections = 1;
    let app = spawn_app_with(settings).await;
    let mut first = connect(&app).await;
    first.write_all(HEALTHZ).await.unwrap();
    assert!(response(&mut first).await.starts_with("HTTP/1.1 200"));

    // The kernel completes the handshake; the server does not take it up.
    let mut second = connect(&app).await;
    second.write_all(HEALTHZ).await.unwrap();
    // The first connection is served again after the second asked…
    first.write_all(HEALTHZ).await.unwrap();
    assert!(response(&mut first).await.starts_with("HTTP/1.1 200"));
    // …and the second still has no answer, though a served one would have
    // had it within milliseconds, and the server counted only the first's.
    let mut probe = [0u8; 1];
    let unanswered = tokio::time::timeout(UNSERVED_FOR, second.read(&mut probe)).await;
    assert!(
        unanswered.is_err(),
        "a connection past the bound was served alongside the first: {unanswered:?}"
    );
    // (Asked on the first connection: a new one would wait in the backlog.)
    first
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let metrics = response(&mut first).await;
    let served = metric_in(
        &metrics,
        "filedock_http_requests_total",
        "route=\"/healthz\"",
    );
    assert_eq!(
        served, 2.0,
        "only the first connection's requests were served"
    );

    drop(first);
    assert!(
        response(&mut second).await.starts_with("HTTP/1.1 200"),
        "served once the first closed"
    );
}
