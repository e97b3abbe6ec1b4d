//! The files API: round trips, auth, isolation, limits, idempotency and
//! durability (concurrent uploads: `same_user.rs`).

use futures::future::join_all;
use reqwest::StatusCode;
use serde_json::Value;

use crate::helpers::*;

#[tokio::test]
async fn round_trips_keep_every_byte_raw_and_multipart() {
    let app = spawn_app().await;
    let alice = app.create_user("alice").await;
    for (i, len) in [0usize, 1024, 20 * 1024 * 1024].into_iter().enumerate() {
        let bytes = pseudo_random_bytes(len, i as u64);
        for multipart in [false, true] {
            let res = if multipart {
                app.upload_multipart(&alice, "notes.txt", bytes.clone())
                    .await
            } else {
                app.upload_raw(&alice, "data.bin", bytes.clone()).await
            };
            assert_eq!(
                res.status(),
                StatusCode::CREATED,
                "len {len} multipart {multipart}"
            );
            let location = res.headers()["location"].to_str().unwrap().to_owned();
            let file: Value = res.json().await.unwrap();
            assert_eq!(
                location,
                format!("/v1/files/{}", file["id"].as_str().unwrap())
            );
            assert_eq!(file["size"], len as u64);
            assert_eq!(file["sha256"], sha256_hex(&bytes));
            let category = if len > 10 << 20 { "medium" } else { "small" };
            assert_eq!(
                file["category"], category,
                "len {len} multipart {multipart}"
            );
            assert_eq!(
                file["filename"],
                if multipart { "notes.txt" } else { "data.bin" }
            );
            assert_eq!(
                file["content_type"],
                if multipart {
                    "text/plain"
                } else {
                    "application/octet-stream"
                }
            );

            let meta: Value = app
                .client
                .get(app.url(&location))
                .bearer_auth(&alice.key)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            assert_eq!(meta, file, "what the upload returned is what is stored");

            let got = app.download(&alice, file["id"].as_str().unwrap()).await;
            assert_eq!(got.status(), StatusCode::OK);
            assert_eq!(
                got.headers()["etag"],
                format!("\"{}\"", sha256_hex(&bytes)).as_str()
            );
            assert_eq!(got.headers()["content-length"], len.to_string().as_str());
            let body = got.bytes().await.unwrap();
            assert_eq!(sha256_hex(&body), sha256_hex(&bytes));
        }
    }
    assert_eq!(app.list_ids(&alice).await.len(), 6);
    assert_eq!(app.intents().await, 0, "committed uploads leave no intent");
}

#[tokio::test]
async fn ranges_and_conditional_downloads() {
    let app = spawn_app().await;
    let u = app.create_user("u").await;
    let bytes = pseudo_random_bytes(1000, 7);
    let file: Value = app.upload_json(&u, "r.bin", bytes.clone()).await;
    let url = app.url(&format!(
        "/v1/files/{}/content",
        file["id"].as_str().unwrap()
    ));
    let res = app
        .client
        .get(&url)
        .bearer_auth(&u.key)
        .header("range", "bytes=100-199")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::PARTIAL_CONTENT);
    assert_eq!(res.headers()["content-range"], "bytes 100-199/1000");
    assert_eq!(res.bytes().await.unwrap().as_ref(), &bytes[100..200]);

    let res = app
        .client
        .get(&url)
        .bearer_auth(&u.key)
        .header("range", "bytes=-10")
        .send()
        .await
        .unwrap();
    assert_eq!(res.bytes().await.unwrap().as_ref(), &bytes[990..]);

    let res = app
        .client
        .get(&url)
        .bearer_auth(&u.key)
        .header("range", "bytes=5000-")
        .send()
        .await
        .unwrap();
    assert_eq!(res.headers()["content-range"], "bytes */1000");
    assert_eq!(
        error_code(res).await,
        (
            StatusCode::RANGE_NOT_SATISFIABLE,
            "range_not_satisfiable".into()
        )
    );

    let etag = format!("\"{}\"", sha256_hex(&bytes));
    let res = app
        .client
        .get(&url)
        .bearer_auth(&u.key)
        .header("if-none-match", &etag)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::NOT_MODIFIED);
    // RFC 9110 §15.4.5: a 304 repeats the Cache-Control a 200 would send.
    assert_eq!(res.headers()["cache-control"], "private");
}

#[tokio::test]
async fn unicode_names_are_kept_and_encoded_in_content_disposition() {
    let app = spawn_app().await;
    let u = app.create_user("u").await;
    let file: Value = app
        .upload_multipart(&u, "résumé 😀.txt", b"hi".to_vec())
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(file["filename"], "résumé 😀.txt");
    let res = app.download(&u, file["id"].as_str().unwrap()).await;
    let cd = res.headers()["content-disposition"].to_str().unwrap();
    assert!(
        cd.contains("filename*=UTF-8''r%C3%A9sum%C3%A9%20%F0%9F%98%80%2Etxt"),
        "{cd}"
    );
}

#[tokio::test]
async fn requests_without_a_valid_key_are_refused() {
    let app = spawn_app().await;
    let res = app.client.get(app.url("/v1/files")).send().await.unwrap();
    let request_id = res.headers()["x-request-id"].to_str().unwrap().to_owned();
    let body: Value = res.json().await.unwrap();
    assert_eq!(body["error"]["code"], "unauthenticated");
    assert_eq!(body["error"]["request_id"], request_id.as_str());

    let res = app
        .client
        .get(app.url("/v1/files"))
        .bearer_auth("fdk_nope")
        .send()
        .await
        .unwrap();
    assert_eq!(
        error_code(res).await,
        (StatusCode::UNAUTHORIZED, "unauthenticated".into())
    );
    // A user's key is not the admin key: a known caller without the right.
    let u = app.create_user("u").await;
    let res = app
        .client
        .post(app.url("/v1/admin/users"))
        .bearer_auth(&u.key)
        .json(&serde_json::json!({"name": "x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(
        error_code(res).await,
        (StatusCode::FORBIDDEN, "forbidden".into())
    );
}

#[tokio::test]
async fn other_users_files_do_not_exist_for_them() {
    let app = spawn_app().await;
    let (alice, bob) = (app.create_user("alice").await, app.create_user("bob").await);
    let file: Value = app
        .upload_json(&alice, "secret.txt", b"mine".to_vec())
        .await;
    let id = file["id"].as_str().unwrap();
    for (method, path) in [
        ("GET", format!("/v1/files/{id}")),
        ("GET", format!("/v1/files/{id}/content")),
        ("DELETE", format!("/v1/files/{id}")),
    ] {
        let res = app
            .client
            .request(method.parse().unwrap(), app.url(&path))
            .bearer_auth(&bob.key)
            .send()
            .await
            .unwrap();
        assert_eq!(
            error_code(res).await,
            (StatusCode::NOT_FOUND, "not_found".into()),
            "{method} {path}"
        );
    }
    assert!(app.list_ids(&bob).await.is_empty());
    assert_eq!(
        app.download(&alice, id)
            .await
            .bytes()
            .await
            .unwrap()
            .as_ref(),
        b"mine"
    );
}

#[tokio::test]
async fn a_body_over_the_limit_is_refused_and_leaves_nothing() {
    let mut settings = test_settings();
    settings.max_upload_bytes = 64 * 1024;
    let app = spawn_app_with(settings).await;
    let u = app.create_user("u").await;
    // Declared too large: refused before a byte is stored.
    let res = app.upload_raw(&u, "big.bin", vec![1; 64 * 1024 + 1]).await;
    assert_eq!(
        error_code(res).await,
        (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large".into())
    );
    // Undeclared (chunked) and too large: stopped while streaming.
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        (0..20).map(|_| Ok(vec![2u8; 8 * 1024])).collect();
    let res = app
        .client
        .post(app.url("/v1/files?filename=stream.bin"))
        .bearer_auth(&u.key)
        .body(reqwest::Body::wrap_stream(futures::stream::iter(chunks)))
        .send()
        .await
        .unwrap();
    assert_eq!(
        error_code(res).await,
        (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large".into())
    );
    // Multipart too large.
    let res = app
        .upload_multipart(&u, "big.txt", vec![3; 70 * 1024])
        .await;
    assert_eq!(res.status(), StatusCode::PAYLOAD_TOO_LARGE);

    assert!(app.list_ids(&u).await.is_empty(), "no metadata");
    assert!(app.blob_keys(&u).await.is_empty(), "no blob");
    assert_eq!(app.intents().await, 0, "no intent");
    // The limit itself is fine.
    assert_eq!(
        app.upload_raw(&u, "ok.bin", vec![1; 64 * 1024])
            .await
            .status(),
        StatusCode::CREATED
    );
}

#[tokio::test]
async fn bad_uploads_get_clear_errors_and_leave_nothing() {
    let app = spawn_app().await;
    let u = app.create_user("u").await;
    let cases: Vec<(&str, reqwest::RequestBuilder)> = vec![
        ("path in filename", app.client.post(app.url("/v1/files?filename=../etc/passwd")).body("x")),
        ("control character", app.client.post(app.url("/v1/files?filename=a%00b")).body("x")),
        (
            "multipart without a file part",
            app.client.post(app.url("/v1/files")).multipart(reqwest::multipart::Form::new().text("other", "x")),
        ),
        (
            "two file parts",
            app.client.post(app.url("/v1/files")).multipart(
                reqwest::multipart::Form::new()
                    .part("file", reqwest::multipart::Part::bytes(b"one".to_vec()).file_name("a.txt"))
                    .part("file", reqwest::multipart::Part::bytes(b"two".to_vec()).file_name("b.txt")),
            ),
        ),
        (
            "wrong boundary",
            app.client
                .post(app.url("/v1/files"))
                .header("content-type", "multipart/form-data; boundary=nope")
                .body("--other\r\ncontent-disposition: form-data; name=\"file\"; filename=\"a\"\r\n\r\nx\r\n--other--\r\n"),
        ),
    ];
    for (what, req) in cases {
        let res = req.bearer_auth(&u.key).send().await.unwrap();
        assert_eq!(
            error_code(res).await,
            (StatusCode::BAD_REQUEST, "invalid_request".into()),
            "{what}"
        );
    }
    assert!(app.list_ids(&u).await.is_empty());
    assert!(app.blob_keys(&u).await.is_empty());
    assert_eq!(app.intents().await, 0);
}

#[tokio::test]
async fn malformed_json_and_unknown_routes_use_the_error_shape() {
    let app = spawn_app().await;
    let res = app
        .client
        .post(app.url("/v1/admin/users"))
        .bearer_auth(ADMIN_KEY)
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(
        error_code(res).await,
        (StatusCode::BAD_REQUEST, "invalid_request".into())
    );
    let res = app.client.get(app.url("/v2/nothing")).send().await.unwrap();
    assert_eq!(
        error_code(res).await,
        (StatusCode::NOT_FOUND, "not_found".into())
    );
    let res = app
        .client
        .get(app.url("/v1/files/not-an-id"))
        .bearer_auth("x")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn delete_removes_metadata_and_blob() {
    let app = spawn_app().await;
    let u = app.create_user("u").await;
    let file: Value = app.upload_json(&u, "gone.txt", b"bye".to_vec()).await;
    let id = file["id"].as_str().unwrap();
    assert_eq!(app.blob_keys(&u).await.len(), 1);
    let res = app
        .client
        .delete(app.url(&format!("/v1/files/{id}")))
        .bearer_auth(&u.key)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    assert!(app.list_ids(&u).await.is_empty());
    assert!(app.blob_keys(&u).await.is_empty());
    assert_eq!(
        error_code(app.download(&u, id).await).await.0,
        StatusCode::NOT_FOUND
    );
    let user = app
        .state
        .ports
        .meta
        .user(&u.user_id())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(user.file_count, 0);
    assert_eq!(user.used_bytes, 0);
    let res = app
        .client
        .delete(app.url(&format!("/v1/files/{id}")))
        .bearer_auth(&u.key)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn an_idempotency_key_replays_the_first_result() {
    let app = spawn_app().await;
    let u = app.create_user("u").await;
    let send = |body: &'static str| {
        app.client
            .post(app.url("/v1/files?filename=once.txt"))
            .bearer_auth(&u.key)
            .header("idempotency-key", "req-42")
            .body(body)
            .send()
    };
    let first = send("first").await.unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    let first: Value = first.json().await.unwrap();
    // Sequential retry, then concurrent retries: all get the first file.
    let again = send("first").await.unwrap();
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    let again: Value = again.json().await.unwrap();
    assert_eq!(again["id"], first["id"]);
    let racing = join_all((0..8).map(|_| send("first"))).await;
    for r in racing {
        let v: Value = r.unwrap().json().await.unwrap();
        assert_eq!(v["id"], first["id"]);
    }
    assert_eq!(
        app.list_ids(&u).await,
        vec![first["id"].as_str().unwrap().to_owned()]
    );
    assert_eq!(app.blob_keys(&u).await.len(), 1, "replays keep no blob");
    assert_eq!(
        app.download(&u, first["id"].as_str().unwrap())
            .await
            .text()
            .await
            .unwrap(),
        "first"
    );
}

#[tokio::test]
async fn files_survive_a_restart() {
    let app = spawn_app().await;
    let u = app.create_user("durable").await;
    let bytes = pseudo_random_bytes(300_000, 3);
    let file: Value = app.upload_json(&u, "keep.bin", bytes.clone()).await;
    let settings = app.stop().await;
    let app = spawn_app_with(settings).await;
    let got = app.download(&u, file["id"].as_str().unwrap()).await;
    assert_eq!(
        got.status(),
        StatusCode::OK,
        "the user's key and the file survive"
    );
    assert_eq!(sha256_hex(&got.bytes().await.unwrap()), sha256_hex(&bytes));
}

#[tokio::test]
async fn a_quota_refuses_what_does_not_fit() {
    let mut settings = test_settings();
    settings.user_quota_bytes = Some(1000);
    let app = spawn_app_with(settings).await;
    let u = app.create_user("q").await;
    assert_eq!(
        app.upload_raw(&u, "a", vec![0; 600]).await.status(),
        StatusCode::CREATED
    );
    let res = app.upload_raw(&u, "b", vec![0; 600]).await;
    assert_eq!(
        error_code(res).await,
        (StatusCode::INSUFFICIENT_STORAGE, "quota_exceeded".into())
    );
    assert_eq!(app.list_ids(&u).await.len(), 1);
    assert_eq!(app.blob_keys(&u).await.len(), 1);
}

#[tokio::test]
async fn health_and_readiness() {
    let app = spawn_app().await;
    assert_eq!(
        app.client
            .get(app.url("/healthz"))
            .send()
            .await
            .unwrap()
            .status(),
        StatusCode::OK
    );
    let res = app.client.get(app.url("/readyz")).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let body: Value = res.json().await.unwrap();
    assert_eq!(body["checks"]["metadata"], "ok");
    assert_eq!(body["checks"]["blobs"], "ok");
    assert_eq!(body["checks"]["locks"], "ok");
}
