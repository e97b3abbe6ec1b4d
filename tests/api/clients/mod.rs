//! What clients that misbehave get: broken or stalled bodies, bodies past
//! the limits, hostile connections, requests outside the happy path, hostile
//! names, odd downloads. One file per thing a client misuses; the helpers
//! they share are here.

mod bodies;
mod connections;
mod downloads;
mod limits;
mod names;
mod requests;

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use futures::StreamExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::helpers::*;

/// Sends raw bytes on a fresh connection; returns what came back (maybe nothing).
async fn raw(app: &TestApp, request: &[u8], then_close: bool) -> String {
    let addr = app.base.trim_start_matches("http://").to_owned();
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    conn.write_all(request).await.unwrap();
    if then_close {
        drop(conn);
        return String::new();
    }
    conn.shutdown().await.ok();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), conn.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

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

/// Uploads `body` raw as `filename` with this `Content-Type`.
async fn upload_as(
    app: &TestApp,
    u: &TestUser,
    filename: &str,
    content_type: &[u8],
    body: &'static str,
) -> reqwest::Response {
    app.client
        .post(app.url("/v1/files"))
        .query(&[("filename", filename)])
        .bearer_auth(&u.key)
        .header("content-type", content_type)
        .body(body)
        .send()
        .await
        .unwrap()
}
