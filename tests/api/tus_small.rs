//! Small resumable uploads (issue 44): what one costs in round trips, read
//! from filedock's own metrics (`filedock_s3_requests_total` by operation,
//! `filedock_redis_commands_total`, `filedock_mongo_commands_total`), and
//! that the requests it no longer sends were not needed: the type is still
//! decided from the bytes, nothing is left in staging. The counts are
//! checked on the real stack (`FILEDOCK_TEST_BACKEND=real`); the bytes and
//! types on both.

use std::{collections::BTreeMap, time::Duration};

use reqwest::StatusCode;

use crate::{
    helpers::*,
    tus::{content, create_typed, patch, staging_left},
};

const PNG_START: &[u8] = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR";

/// A PNG signature followed by `len` bytes in all.
fn png(len: usize) -> Vec<u8> {
    let mut bytes = PNG_START.to_vec();
    bytes.extend((0..len - PNG_START.len()).map(|i| (i % 251) as u8));
    bytes
}

/// An app whose sweeper does not run by itself (its passes would count).
async fn quiet_app() -> TestApp {
    let mut settings = test_settings();
    settings.sweep.interval = Duration::ZERO;
    spawn_app_with(settings).await
}

/// S3 requests sent so far, by operation.
async fn s3_requests(app: &TestApp) -> BTreeMap<String, f64> {
    let text = filedock::testing::metrics_text(&app.base).await;
    filedock::testing::metric_by_label(&text, "filedock_s3_requests_total")
}

/// The requests sent between `before` and `after`, by operation.
fn sent(before: &BTreeMap<String, f64>, after: &BTreeMap<String, f64>) -> BTreeMap<String, f64> {
    after
        .iter()
        .map(|(op, n)| (op.clone(), n - before.get(op).unwrap_or(&0.0)))
        .filter(|(_, n)| *n > 0.0)
        .collect()
}

#[tokio::test]
async fn a_small_upload_in_one_patch_is_one_put_object() {
    let app = quiet_app().await;
    let user = app.create_user("small-one-patch").await;
    let bytes = png(100 * 1024);
    let before = s3_requests(&app).await;
    // No type named: it is detected from the first bytes, which this PATCH
    // brought, so they are not read back from the store.
    let id = create_typed(&app, &user, bytes.len(), None).await;
    let done = patch(&app, &user, &id, 0, &bytes).await;
    assert_eq!(done.status(), StatusCode::NO_CONTENT);
    let sent = sent(&before, &s3_requests(&app).await);
    let stored = app.download(&user, &id).await;
    assert_eq!(stored.headers()["content-type"], "image/png");
    assert_eq!(stored.bytes().await.unwrap().to_vec(), bytes);
    assert_eq!(staging_left(&app).await, 0);
    if real_backends() {
        assert_eq!(
            sent.get("GetObject"),
            None,
            "the type from the bytes at hand: {sent:?}"
        );
        assert_eq!(
            sent.get("ListObjectsV2"),
            None,
            "nothing was staged to clear: {sent:?}"
        );
        // One object, no multipart upload: one request in all.
        let one = std::collections::BTreeMap::from([("PutObject".to_owned(), 1.0)]);
        assert_eq!(sent, one);
    }
}

#[tokio::test]
async fn a_type_is_detected_when_the_first_bytes_came_in_an_earlier_patch() {
    let app = quiet_app().await;
    let user = app.create_user("small-two-patches").await;
    let bytes = png(20 * 1024);
    let id = create_typed(&app, &user, bytes.len(), Some("application/octet-stream")).await;
    let first = patch(&app, &user, &id, 0, &bytes[..6]).await;
    assert_eq!(first.status(), StatusCode::NO_CONTENT);
    let before = s3_requests(&app).await;
    let done = patch(&app, &user, &id, 6, &bytes[6..]).await;
    assert_eq!(done.status(), StatusCode::NO_CONTENT);
    let sent = sent(&before, &s3_requests(&app).await);
    let stored = app.download(&user, &id).await;
    assert_eq!(
        stored.headers()["content-type"],
        "image/png",
        "read back from the store"
    );
    assert_eq!(content(&app, &user, &id).await, bytes);
    assert_eq!(staging_left(&app).await, 0, "the first PATCH's tail went");
    if real_backends() {
        assert_eq!(
            sent.get("GetObject"),
            Some(&2.0),
            "the staged tail and the head: {sent:?}"
        );
    }
}

#[tokio::test]
async fn an_upload_s_round_trips_are_counted_in_the_metrics() {
    let app = quiet_app().await;
    let user = app.create_user("counted").await;
    let bytes = png(4096);
    let (mongo, redis) = (
        app.metric("filedock_mongo_commands_total", "").await,
        app.metric("filedock_redis_commands_total", "").await,
    );
    let before = s3_requests(&app).await;
    let id = create_typed(&app, &user, bytes.len(), Some("image/png")).await;
    assert_eq!(
        patch(&app, &user, &id, 0, &bytes).await.status(),
        StatusCode::NO_CONTENT
    );
    if real_backends() {
        let sent = sent(&before, &s3_requests(&app).await);
        assert!(sent.values().sum::<f64>() >= 1.0, "{sent:?}");
        assert!(app.metric("filedock_mongo_commands_total", "").await > mongo);
        assert!(
            app.metric("filedock_redis_commands_total", "").await > redis,
            "the upload's lock is taken in Redis"
        );
    }
}

#[tokio::test]
async fn a_small_upload_costs_at_most_13_mongodb_commands_and_ends_marked_committed() {
    let app = quiet_app().await;
    let user = app.create_user("marked").await;
    let bytes = png(3000);
    // The key is looked up once, then cached: not the upload's cost.
    let warm = app.client.get(app.url("/v1/files")).bearer_auth(&user.key);
    assert_eq!(warm.send().await.unwrap().status(), StatusCode::OK);
    let commands = app.metric("filedock_mongo_commands_total", "").await;
    let id = create_typed(&app, &user, bytes.len(), Some("image/png")).await;
    assert_eq!(
        patch(&app, &user, &id, 0, &bytes).await.status(),
        StatusCode::NO_CONTENT
    );
    let sent = app.metric("filedock_mongo_commands_total", "").await - commands;
    let upload = app
        .state
        .ports
        .meta
        .resumable_by_id_alone(&id.parse().unwrap())
        .await
        .unwrap()
        .expect("kept until it expires");
    assert!(upload.committed && upload.completed, "{upload:?}");
    assert_eq!((upload.reserved, upload.open), (0, false));
    assert_eq!(
        app.state
            .ports
            .meta
            .intent(&user.user_id(), &id.parse().unwrap())
            .await
            .unwrap(),
        None
    );
    if real_backends() {
        // Creation 4 (counters, intent and state, `commitTransaction`),
        // the PATCH 2 (two reads around the lock), the commit 7 (the
        // state's bytes and mark with its reservation, user, file, its
        // event, permission, intent, `commitTransaction`); 17 before issue
        // 44, 14 before the events, 15 before a young upload's PATCH left
        // its intent and the commit recorded the bytes (the intent renewed
        // and the state advanced before the commit).
        assert!(sent <= 13.0, "{sent} MongoDB commands for one small upload");
    }
}

/// A final PATCH whose commit was refused leaves the state at the end; the
/// retry that commits it (an empty PATCH there) renews its expiry, so that
/// a client that missed that answer still finds it complete (review of
/// issue 44: the renewal was skipped when the retry's own commit marked it).
#[tokio::test]
async fn a_retried_commit_renews_the_expiry_of_the_upload_it_finishes() {
    let app = crate::tus_recovery::spawn_with_short_lock_wait().await;
    let user = app.create_user("retried-commit").await;
    let bytes = png(1000);
    let id = create_typed(&app, &user, bytes.len(), Some("image/png")).await;
    let refused = crate::tus_recovery::patch_while_commit_lock_held(&app, &user, &id, &bytes);
    assert_eq!(refused.await.status(), StatusCode::TOO_MANY_REQUESTS);
    // As if the refusal were most of an expiry ago.
    let meta = &app.state.ports.meta;
    let mut upload = meta
        .resumable_by_id_alone(&id.parse().unwrap())
        .await
        .unwrap()
        .unwrap();
    upload.expires_at = filedock::meta::now() + chrono::Duration::minutes(1);
    assert!(
        meta.advance_resumable(&upload, upload.progress())
            .await
            .unwrap()
    );

    let retried = patch(&app, &user, &id, bytes.len(), b"").await;
    assert_eq!(retried.status(), StatusCode::NO_CONTENT);
    let upload = meta
        .resumable_by_id_alone(&id.parse().unwrap())
        .await
        .unwrap()
        .unwrap();
    assert!(upload.committed);
    let left = upload.expires_at - filedock::meta::now();
    let expiry = chrono::Duration::from_std(app.settings.tus_expiry).unwrap();
    assert!(left > expiry / 2, "expires in {left}, not renewed");
    assert_eq!(content(&app, &user, &id).await, bytes);
}

/// A user's creations arriving together are inserted together: all are
/// created, counted exactly, in fewer transactions than creations (on the
/// real stack, where a transaction takes long enough for the others to
/// queue behind it; on the embedded store grouping is not asserted).
#[tokio::test]
async fn a_burst_of_one_user_s_creations_shares_its_transactions() {
    const N: usize = 32;
    let app = quiet_app().await;
    let user = app.create_user("burst").await;
    let txns = || app.metric("filedock_txn_attempts_total", "op=\"create_upload\"");
    let before = txns().await;
    let created = futures::future::join_all((0..N).map(|_| {
        let req = app
            .client
            .post(app.url("/v1/uploads"))
            .bearer_auth(&user.key)
            .header("tus-resumable", crate::tus::TUS)
            .header("upload-length", "1000");
        async move { req.send().await.unwrap().status() }
    }))
    .await;
    assert!(
        created.iter().all(|s| *s == StatusCode::CREATED),
        "{created:?}"
    );
    let (stored, reserved, open) = crate::tus_limits::counts(&app, &user).await;
    assert_eq!((stored, reserved, open), (0, 1000 * N as i64, N as i64));
    let ran = txns().await - before;
    assert!(ran >= 1.0);
    if real_backends() {
        assert!(ran < N as f64, "{ran} transactions for {N} creations");
    }
}

/// One user's creations and commits running at once take turns on the
/// user's record within an instance: none of them is retried after a write
/// conflict with another (on the real stack, where two transactions that
/// write one document conflict; the embedded store has none, and there
/// only the uploads and counts are checked), and every upload commits,
/// counted exactly. Both commit paths: grouped and one by one.
#[tokio::test]
async fn one_user_s_creations_and_commits_at_once_do_not_conflict() {
    const TASKS: usize = 16;
    const ROUNDS: usize = 3;
    const LEN: usize = 4096;
    for group_commit in [true, false] {
        let mut settings = test_settings();
        settings.sweep.interval = Duration::ZERO;
        settings.upload_group_commit = group_commit;
        let app = spawn_app_with(settings).await;
        let user = app.create_user("turns").await;
        let conflicts = || app.metric("filedock_txn_write_conflicts_total", "");
        let before = conflicts().await;
        let bytes = crate::tus::data(LEN);
        let done = futures::future::join_all((0..TASKS).map(|_| async {
            let mut codes = Vec::new();
            for _ in 0..ROUNDS {
                let id = create_typed(&app, &user, LEN, None).await;
                codes.push(patch(&app, &user, &id, 0, &bytes).await.status());
            }
            codes
        }))
        .await;
        let codes: Vec<StatusCode> = done.into_iter().flatten().collect();
        assert!(
            codes.iter().all(|c| *c == StatusCode::NO_CONTENT),
            "{codes:?}"
        );
        let (stored, reserved, open) = crate::tus_limits::counts(&app, &user).await;
        assert_eq!(
            (stored, reserved, open),
            ((TASKS * ROUNDS * LEN) as i64, 0, 0)
        );
        let retried = conflicts().await - before;
        assert_eq!(
            retried, 0.0,
            "write conflicts retried, group commit {group_commit}"
        );
    }
}

/// The fencing counters the upload's locks leave in Redis (the resumable
/// upload's lock, its user's) expire: one per upload ever locked must not
/// stay for ever (real Redis only; the embedded locks keep nothing).
#[tokio::test]
async fn an_upload_s_fencing_counters_expire() {
    if !real_backends() {
        return;
    }
    let mut settings = test_settings();
    settings.sweep.interval = Duration::ZERO;
    let prefix = settings.redis_prefix.clone();
    let app = spawn_app_with(settings).await;
    let user = app.create_user("fences").await;
    let bytes = crate::tus::data(4096);
    let id = create_typed(&app, &user, bytes.len(), None).await;
    assert_eq!(
        patch(&app, &user, &id, 0, &bytes).await.status(),
        StatusCode::NO_CONTENT
    );
    let mut redis = redis::Client::open(std::env::var("FILEDOCK_TEST_REDIS_URL").unwrap())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let fences: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}*:fence"))
        .query_async(&mut redis)
        .await
        .unwrap();
    assert!(
        fences.iter().any(|k| k.contains(&id)),
        "the upload's lock has a fencing counter: {fences:?}"
    );
    for key in fences {
        let ttl: i64 = redis::cmd("PTTL")
            .arg(&key)
            .query_async(&mut redis)
            .await
            .unwrap();
        assert!(ttl > 0, "{key} does not expire (PTTL {ttl})");
    }
}
