//! A drain (SIGTERM, `crate::http::drain`): the instance turns unready at
//! once and still accepts for `FILEDOCK_DRAIN_READY_GRACE_SECS`; then a tus
//! PATCH in flight stores what arrived and answers 503 `draining`, a long
//! poll answers with what it has, and the server stops well inside
//! `FILEDOCK_DRAIN_SECS`. The client resumes on the next instance.

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use futures::StreamExt;
use reqwest::StatusCode;
use serde_json::Value;

use filedock::testing::upload_raw_at;

use crate::{
    helpers::*,
    tus::{OCTETS, TUS, create, data, head, patch},
};

const CHUNK: usize = 16 << 10;
/// A PATCH body of 600 chunks sent 50 ms apart: 30 s, longer than the drain.
const CHUNKS: usize = 600;

#[tokio::test]
async fn a_drain_turns_unready_first_then_lets_a_patch_go_with_what_arrived() {
    let (ready_grace, drain) = (Duration::from_millis(1500), Duration::from_secs(5));
    let mut settings = test_settings();
    settings.drain_ready_grace = ready_grace;
    settings.drain = drain;
    let app = spawn_app_with(settings).await;
    let u = app.create_user("u").await;
    // Another user's upload while unready (it must not wake `u`'s long poll).
    let v = app.create_user("v").await;
    let session = app.new_session(&v).await;
    let bytes = data(CHUNK * CHUNKS);
    let id = create(&app, &u, bytes.len()).await;

    let sent = Arc::new(AtomicUsize::new(0));
    let counted = sent.clone();
    let chunks: Vec<Vec<u8>> = bytes.chunks(CHUNK).map(<[u8]>::to_vec).collect();
    let body = futures::stream::iter(chunks).then(move |chunk| {
        let counted = counted.clone();
        async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            counted.fetch_add(1, Ordering::SeqCst);
            Ok::<_, std::io::Error>(chunk)
        }
    });
    let patching = app
        .client
        .patch(app.url(&format!("/v1/uploads/{id}")))
        .bearer_auth(&u.key)
        .header("tus-resumable", TUS)
        .header("content-type", OCTETS)
        .header("upload-offset", "0")
        .body(reqwest::Body::wrap_stream(body))
        .send();
    // A long poll past the user's events so far: it would wait its 60 s.
    let (_, end) = app.json("GET", "/v1/events?limit=1000", &u, None).await;
    let after = end["cursor"].as_str().unwrap().to_owned();
    let poll = app
        .client
        .get(app.url(&format!("/v1/events?wait=60&after={after}")))
        .bearer_auth(&u.key)
        .send();
    let (patching, poll) = (tokio::spawn(patching), tokio::spawn(poll));
    while sent.load(Ordering::SeqCst) < 10 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let began = Instant::now();
    app.begin_stop();
    // Unready at once, and still accepting: new connections are served.
    let fresh = || reqwest::Client::builder().build().unwrap();
    let ready = fresh().get(app.url("/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(ready.json::<Value>().await.unwrap()["status"], "draining");
    let alive = fresh().get(app.url("/healthz")).send().await.unwrap();
    assert_eq!(alive.status(), StatusCode::OK);
    let uploaded = upload_raw_at(&fresh(), &app.base, &v.key, "late.txt", b"late".to_vec()).await;
    assert_eq!(
        uploaded.status(),
        StatusCode::CREATED,
        "accepted while unready"
    );
    assert_eq!(
        uploaded.headers()["connection"],
        "close",
        "an unready instance closes each connection after its answer"
    );
    let late: Value = uploaded.json().await.unwrap();
    // A change to a session while draining applies (in queue mode the
    // queue's workers run on until the requests are done).
    let (attached, body) = attach(&fresh(), &app.base, &v.key, &session, &late["id"]).await;
    assert_eq!(attached, StatusCode::OK, "an attach while draining: {body}");
    assert!(
        began.elapsed() < ready_grace,
        "the checks outlasted the grace"
    );

    // Then the long poll answers with what it has, long before its 60 s.
    let polled = poll.await.unwrap().unwrap();
    assert_eq!(polled.status(), StatusCode::OK);
    let polled: Value = polled.json().await.unwrap();
    assert_eq!(polled["events"], serde_json::json!([]), "{polled}");
    assert!(
        began.elapsed() < ready_grace + Duration::from_secs(3),
        "the long poll held the drain: {:?}",
        began.elapsed()
    );
    // The PATCH is cut and says so (unless the client saw its connection
    // close first, as a client still sending may).
    match patching.await.unwrap() {
        Ok(res) => {
            assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
            assert_eq!(res.headers()["retry-after"], "1");
            let body: Value = res.json().await.unwrap();
            assert_eq!(body["error"]["code"], "draining", "{body}");
        }
        Err(e) => eprintln!("the cut PATCH's client saw: {e}"),
    }
    let cut_at = sent.load(Ordering::SeqCst);
    let settings = app.stop().await;
    assert!(
        began.elapsed() < ready_grace + drain,
        "stopped after {:?}",
        began.elapsed()
    );

    // The next instance: what arrived is stored; the rest completes it.
    let app = spawn_app_with(settings).await;
    let (status, offset) = head(&app, &u, &id).await;
    assert_eq!(status, StatusCode::OK);
    let offset = offset.unwrap();
    eprintln!(
        "the drain kept {offset} of the {} bytes sent",
        cut_at * CHUNK
    );
    assert!(
        offset > 0 && offset <= cut_at * CHUNK,
        "stored {offset} of {} sent",
        cut_at * CHUNK
    );
    let res = patch(&app, &u, &id, offset, &bytes[offset..]).await;
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    let got = app.download(&u, &id).await.bytes().await.unwrap();
    assert_eq!(sha256_hex(&got), sha256_hex(&bytes), "the file, whole");
    let late = app.download(&v, late["id"].as_str().unwrap()).await;
    assert_eq!(
        late.status(),
        StatusCode::OK,
        "the upload taken while unready"
    );
}

/// Attaches `file` to `session` as `key`'s user: the status and the body.
async fn attach(
    client: &reqwest::Client,
    base: &str,
    key: &str,
    session: &str,
    file: &Value,
) -> (StatusCode, Value) {
    let res = client
        .post(format!("{base}/v1/sessions/{session}/files"))
        .bearer_auth(key)
        .json(&serde_json::json!({ "file_id": file }))
        .send()
        .await
        .unwrap();
    (res.status(), res.json().await.unwrap_or(Value::Null))
}
