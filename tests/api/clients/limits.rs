//! Bodies past a limit and users past theirs: the size limit, the quota
//! (decided against the store, not a stale cache), the JSON body limit and
//! the uploads one user may have in flight.

use std::time::{Duration, Instant};

use futures::StreamExt;
use reqwest::StatusCode;

use crate::helpers::*;

use super::{FILE_PART_HEAD, only_files_left, paced, stalling, upload_stream};

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

#[tokio::test]
async fn json_bodies_are_small_and_uploads_are_not() {
    let app = spawn_app().await;
    let u = app.create_user("json").await;
    let name = "n".repeat(100 * 1024);
    let res = app
        .client
        .post(app.url("/v1/agents"))
        .bearer_auth(&u.key)
        .json(&serde_json::json!({ "name": name }))
        .send()
        .await
        .unwrap();
    assert_eq!(
        error_code(res).await,
        (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large".into())
    );
    // The JSON limit does not apply to uploads.
    let res = app.upload_raw(&u, "big.bin", vec![0u8; 1 << 20]).await;
    assert_eq!(res.status(), StatusCode::CREATED);
}

/// The authenticated user (and so their usage) is cached; after they delete
/// files, the cached usage overstates what they use. An upload the cache
/// would refuse is checked against the store first, with or without a
/// `Content-Length`.
#[tokio::test]
async fn a_quota_refusal_from_the_cached_usage_is_confirmed_first() {
    let mut settings = test_settings();
    settings.user_quota_bytes = Some(1 << 20);
    const CACHED_FOR: Duration = Duration::from_secs(3);
    settings.auth_cache_ttl = CACHED_FOR;
    let app = spawn_app_with(settings).await;
    let u = app.create_user("stale-usage").await;
    let full = app.upload_json(&u, "full.bin", vec![1; 900 << 10]).await;
    let full = full["id"]
        .as_str()
        .expect("the first upload fits")
        .to_owned();
    // Let the record cached before that upload expire, then cache one that
    // counts it (for 3 s).
    tokio::time::sleep(CACHED_FOR + Duration::from_millis(200)).await;
    let cached_at = Instant::now();
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
    // Both uploads came while the cache still counted the deleted 900 KiB
    // (else they passed on a fresh record and proved nothing).
    assert!(
        cached_at.elapsed() < CACHED_FOR,
        "the cached record expired after {:?}, before the uploads it was to overstate the usage for",
        cached_at.elapsed()
    );

    // A real refusal is still given.
    let res = app.upload_raw(&u, "over.bin", vec![4; 600 << 10]).await;
    assert_eq!(
        error_code(res).await,
        (StatusCode::INSUFFICIENT_STORAGE, "quota_exceeded".into())
    );
    only_files_left(&app, &u, 1).await;
}

#[tokio::test]
async fn a_user_gets_a_clear_error_past_the_concurrent_upload_cap() {
    let mut settings = test_settings();
    settings.max_uploads_per_user = 2;
    let app = spawn_app_with(settings).await;
    let u = app.create_user("busy").await;
    let slow = || {
        let chunks = futures::stream::iter(0..5).then(|_| async {
            tokio::time::sleep(Duration::from_millis(150)).await;
            Ok::<_, std::io::Error>(vec![1u8; 100])
        });
        app.client
            .post(app.url("/v1/files?filename=slow.bin"))
            .bearer_auth(&u.key)
            .body(reqwest::Body::wrap_stream(chunks))
            .send()
    };
    use futures::StreamExt;
    let results = futures::future::join_all([slow(), slow(), slow()]).await;
    let mut statuses: Vec<u16> = results
        .iter()
        .map(|r| r.as_ref().unwrap().status().as_u16())
        .collect();
    statuses.sort();
    assert_eq!(statuses, [201, 201, 429]);
    let refused = results
        .into_iter()
        .map(Result::unwrap)
        .find(|r| r.status() == 429)
        .unwrap();
    assert!(refused.headers().contains_key("retry-after"));
    assert_eq!(error_code(refused).await.1, "too_many_uploads");
    assert_eq!(
        app.upload_raw(&u, "after.bin", vec![1]).await.status(),
        StatusCode::CREATED,
        "slots come back"
    );
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
