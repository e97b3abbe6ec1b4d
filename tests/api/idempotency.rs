//! `Idempotency-Key` per the IETF draft (issue 16, items 4 and 5): a key
//! stands for one request (its body, filename and content type); another
//! request with it gets 422, one sent while the first is in flight 409, and
//! deleting the file frees the key.

use std::time::{Duration, Instant};

use futures::channel::mpsc;
use reqwest::StatusCode;
use serde_json::Value;

use crate::helpers::*;

const KEY: &str = "order-7";

/// `POST /v1/files?filename=` with the key, a content type and `body`.
async fn keyed(
    app: &TestApp,
    u: &TestUser,
    filename: &str,
    content_type: &str,
    body: impl Into<reqwest::Body>,
) -> reqwest::Response {
    app.client
        .post(app.url("/v1/files"))
        .query(&[("filename", filename)])
        .bearer_auth(&u.key)
        .header("idempotency-key", KEY)
        .header("content-type", content_type)
        .body(body)
        .send()
        .await
        .unwrap()
}

async fn id_of(res: reqwest::Response) -> String {
    let body: Value = res.json().await.unwrap();
    body["id"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn a_key_reused_for_another_request_gets_422_and_stores_nothing() {
    let app = spawn_app().await;
    let u = app.create_user("fingerprint").await;
    let first = keyed(&app, &u, "a.txt", "text/plain", "body A").await;
    assert_eq!(first.status(), StatusCode::CREATED);
    let id = id_of(first).await;

    for (what, name, ctype, body) in [
        ("another body", "a.txt", "text/plain", "body B"),
        ("another filename", "b.txt", "text/plain", "body A"),
        ("another content type", "a.txt", "text/csv", "body A"),
    ] {
        let res = keyed(&app, &u, name, ctype, body).await;
        assert_eq!(
            error_code(res).await,
            (
                StatusCode::UNPROCESSABLE_ENTITY,
                "idempotency_key_mismatch".into()
            ),
            "{what}"
        );
    }
    let same = keyed(&app, &u, "a.txt", "text/plain", "body A").await;
    assert_eq!(same.status(), StatusCode::CREATED);
    assert_eq!(same.headers()["idempotent-replayed"], "true");
    assert_eq!(id_of(same).await, id, "the same request replays");
    assert_eq!(
        app.list_ids(&u).await,
        std::slice::from_ref(&id),
        "one file"
    );
    assert_eq!(app.blob_keys(&u).await.len(), 1, "one blob");
    let text = app.download(&u, &id).await.text().await.unwrap();
    assert_eq!(text, "body A", "the first body stayed");
}

#[tokio::test]
async fn a_key_in_flight_gets_409_then_replays() {
    let app = spawn_app().await;
    let u = app.create_user("in-flight").await;
    let (tx, rx) = mpsc::unbounded::<Result<Vec<u8>, std::io::Error>>();
    tx.unbounded_send(Ok(b"slow ".to_vec())).unwrap();
    let first = tokio::spawn({
        let (client, url, key) = (app.client.clone(), app.url("/v1/files"), u.key.clone());
        async move {
            client
                .post(url)
                .query(&[("filename", "slow.txt")])
                .bearer_auth(key)
                .header("idempotency-key", KEY)
                .header("content-type", "text/plain")
                .body(reqwest::Body::wrap_stream(rx))
                .send()
                .await
                .unwrap()
        }
    });
    // The first upload is streaming once its intent is written.
    let deadline = Instant::now() + Duration::from_secs(10);
    while app.intents().await == 0 {
        assert!(Instant::now() < deadline, "the first upload never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let res = keyed(&app, &u, "slow.txt", "text/plain", "slow body").await;
    assert!(res.headers().contains_key("retry-after"));
    assert_eq!(
        error_code(res).await,
        (StatusCode::CONFLICT, "idempotency_key_in_flight".into())
    );

    tx.unbounded_send(Ok(b"body".to_vec())).unwrap();
    drop(tx);
    let first = first.await.unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    let id = id_of(first).await;
    let again = keyed(&app, &u, "slow.txt", "text/plain", "slow body").await;
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(id_of(again).await, id);
    assert_eq!(app.list_ids(&u).await, [id], "one file");
}

#[tokio::test]
async fn deleting_the_file_frees_its_key() {
    let app = spawn_app().await;
    let u = app.create_user("freed").await;
    let first = id_of(keyed(&app, &u, "k.txt", "text/plain", "kept").await).await;
    let res = app
        .client
        .delete(app.url(&format!("/v1/files/{first}")))
        .bearer_auth(&u.key)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::NO_CONTENT);

    let again = keyed(&app, &u, "k.txt", "text/plain", "kept").await;
    assert_eq!(again.status(), StatusCode::CREATED);
    assert!(
        !again.headers().contains_key("idempotent-replayed"),
        "uploaded anew, not replayed"
    );
    let second = id_of(again).await;
    assert_ne!(second, first, "a new file");
    assert_eq!(app.download(&u, &second).await.status(), StatusCode::OK);
    assert_eq!(app.list_ids(&u).await, std::slice::from_ref(&second));
    // The key now stands for the new file.
    let replay = keyed(&app, &u, "k.txt", "text/plain", "kept").await;
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(id_of(replay).await, second);
}

/// A retry of an upload whose type was detected from its bytes (sent as
/// `application/octet-stream`) is the same request: replayed, not 422.
#[tokio::test]
async fn a_retry_of_an_upload_with_a_detected_type_is_replayed() {
    // The 8-byte PNG signature and an IHDR chunk start: `infer` knows it.
    const PNG_START: &[u8] = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR";
    let app = spawn_app().await;
    let u = app.create_user("detected").await;
    let first = keyed(&app, &u, "p.png", "application/octet-stream", PNG_START).await;
    assert_eq!(first.status(), StatusCode::CREATED);
    let first: Value = first.json().await.unwrap();
    assert_eq!(first["content_type"], "image/png");
    let retry = keyed(&app, &u, "p.png", "application/octet-stream", PNG_START).await;
    assert_eq!(
        retry.status(),
        StatusCode::CREATED,
        "{}",
        retry.text().await.unwrap()
    );
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(id_of(retry).await, first["id"].as_str().unwrap());
}
