//! Per-user quotas and the user list (issue 25): `GET /v1/admin/users`
//! pages through the users, `PATCH /v1/admin/users/{id} {"quota_bytes"}`
//! sets one user's quota (the setting stays the default); a quota lowered
//! below the usage refuses new uploads and keeps the files, and no upload
//! racing the change commits past it.

use std::time::Duration;

use bytes::Bytes;
use futures::future::join_all;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::*;
use crate::keys::admin;
use crate::tus::TUS;
use crate::tus_defer::{create_deferred, patch_declaring};
use crate::tus_limits::{counts, try_create, upload_id};
use crate::tus_reserve::{tally, until_settled};
use filedock::testing::upload_raw_at;

/// The default quota of the first test (`FILEDOCK_USER_QUOTA_BYTES`).
const DEFAULT_QUOTA: u64 = 1_000_000;

async fn set_quota(app: &TestApp, user: &TestUser, quota: Value) -> (StatusCode, Value) {
    app.json(
        "PATCH",
        format!("/v1/admin/users/{}", user.id),
        &admin(),
        Some(json!({ "quota_bytes": quota })),
    )
    .await
}

async fn upload_status(app: &TestApp, user: &TestUser, name: &str, len: usize) -> StatusCode {
    app.upload_raw(user, name, vec![b'q'; len]).await.status()
}

#[tokio::test]
async fn the_admin_pages_through_users_and_sets_one_users_quota() {
    let mut settings = test_settings();
    settings.user_quota_bytes = Some(DEFAULT_QUOTA);
    let app = spawn_app_with(settings).await;
    let mut users = Vec::new();
    for i in 0..5 {
        users.push(app.create_user(&format!("u{i}")).await);
    }
    let pages = app
        .list_pages(&admin(), "/v1/admin/users", "users", 2)
        .await;
    assert_eq!(pages.iter().map(Vec::len).collect::<Vec<_>>(), [2, 2, 1]);
    let listed: Vec<&str> = pages
        .iter()
        .flatten()
        .map(|u| u["id"].as_str().unwrap())
        .collect();
    let made: Vec<&str> = users.iter().map(|u| u.id.as_str()).collect();
    assert_eq!(listed, made, "every user once, in creation order");
    assert_eq!(pages[0][0]["quota_bytes"], DEFAULT_QUOTA, "the default");
    assert_eq!(pages[0][0]["quota_is_default"], true);

    let (ann, bob) = (&users[0], &users[1]);
    let (status, view) = set_quota(&app, ann, json!(100)).await;
    assert_eq!(status, StatusCode::OK, "{view}");
    assert_eq!(view["quota_bytes"], 100);
    assert_eq!(view["quota_is_default"], false);
    assert_eq!(
        upload_status(&app, ann, "a.txt", 80).await,
        StatusCode::CREATED
    );
    let (status, code) = error_code(app.upload_raw(ann, "b.txt", vec![b'b'; 30]).await).await;
    assert_eq!(
        (status, code.as_str()),
        (StatusCode::INSUFFICIENT_STORAGE, "quota_exceeded")
    );
    assert_eq!(
        upload_status(&app, bob, "b.txt", 300).await,
        StatusCode::CREATED,
        "bob keeps the default"
    );
    let (_, me) = app.json("GET", "/v1/me", ann, None).await;
    assert_eq!(me["usage"]["quota_bytes"], 100);

    // Below the usage: nothing more goes in, nothing already in goes.
    let (_, view) = set_quota(&app, ann, json!(50)).await;
    assert_eq!(view["used_bytes"], 80);
    assert_eq!(
        upload_status(&app, ann, "c.txt", 1).await,
        StatusCode::INSUFFICIENT_STORAGE
    );
    let ids = app.list_ids(ann).await;
    assert_eq!(ids.len(), 1);
    let kept = app.download(ann, &ids[0]).await.bytes().await.unwrap();
    assert_eq!(kept.len(), 80);

    // `null`: the default again.
    let (_, view) = set_quota(&app, ann, Value::Null).await;
    assert_eq!(view["quota_bytes"], DEFAULT_QUOTA);
    assert_eq!(view["quota_is_default"], true);
    assert_eq!(
        upload_status(&app, ann, "d.txt", 30).await,
        StatusCode::CREATED
    );
    let path = format!("/v1/admin/users/{}", ann.id);
    let (status, one) = app.json("GET", path.as_str(), &admin(), None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        (one["used_bytes"].as_u64(), one["file_count"].as_u64()),
        (Some(110), Some(2))
    );

    // Bad input changes nothing.
    for body in [
        json!({"quota_bytes": -1}),
        json!({"quota_bytes": "lots"}),
        json!({"quota_bytes": 1.5}),
        json!({"quota_bytes": u64::MAX}),
        json!({}),
    ] {
        let (status, answer) = app
            .json("PATCH", path.as_str(), &admin(), Some(body.clone()))
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body} → {answer}");
        assert_eq!(answer["error"]["code"], "invalid_request");
    }
    let (_, one) = app.json("GET", path.as_str(), &admin(), None).await;
    assert_eq!(one["quota_is_default"], true, "unchanged");
    let unknown = uuid::Uuid::now_v7();
    let (status, _) = app
        .json(
            "PATCH",
            format!("/v1/admin/users/{unknown}"),
            &admin(),
            Some(json!({"quota_bytes": 1})),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    // Only the admin: a user's key is refused.
    assert_eq!(
        app.json("GET", "/v1/admin/users", ann, None).await.0,
        StatusCode::FORBIDDEN
    );
    let (status, _) = app
        .json(
            "PATCH",
            path.as_str(),
            ann,
            Some(json!({"quota_bytes": null})),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let changes = app
        .metric("filedock_audit_events_total", "action=\"quota_changed\"")
        .await;
    assert_eq!(changes, 3.0, "each change audited, no refusal");
}

/// A user's own quota bounds their resumable uploads' reservations as the
/// default does: a creation (or a deferred length's declaration) past what
/// it leaves beside the bytes stored and reserved is refused with the same
/// `507 quota_exceeded`, here with no default at all; concurrent creations
/// that each fit alone are let in exactly as many as fit together.
#[tokio::test]
async fn a_users_own_quota_bounds_their_tus_reservations() {
    let mut settings = test_settings();
    settings.user_quota_bytes = None;
    settings.auth_cache_ttl = Duration::ZERO;
    let app = spawn_app_with(settings).await;
    let (ann, bob) = (app.create_user("ann").await, app.create_user("bob").await);
    assert_eq!(set_quota(&app, &ann, json!(1000)).await.0, StatusCode::OK);
    assert_eq!(
        upload_status(&app, &ann, "a.txt", 100).await,
        StatusCode::CREATED
    );
    upload_id(&try_create(&app, &ann, 600).await);
    assert_eq!(counts(&app, &ann).await, (100, 600, 1));
    // 1000 - 100 used - 600 reserved leaves 300.
    assert_eq!(
        error_code(try_create(&app, &ann, 301).await).await,
        (StatusCode::INSUFFICIENT_STORAGE, "quota_exceeded".into())
    );
    upload_id(&try_create(&app, &ann, 300).await);
    assert_eq!(counts(&app, &ann).await, (100, 900, 2));
    let deferred = create_deferred(&app, &ann).await;
    assert_eq!(
        error_code(patch_declaring(&app, &ann, &deferred, 0, 1, b"d").await).await,
        (StatusCode::INSUFFICIENT_STORAGE, "quota_exceeded".into()),
        "a declaration is held to it too"
    );
    assert_eq!(
        counts(&app, &ann).await,
        (100, 900, 3),
        "refusals count nothing"
    );
    // Bob has no quota; and with `null`, Ann has none again.
    upload_id(&try_create(&app, &bob, 1_000_000).await);
    assert_eq!(set_quota(&app, &ann, Value::Null).await.0, StatusCode::OK);
    upload_id(&try_create(&app, &ann, 1_000_000).await);

    // 10 creations of 300 at once against Carl's own 1000: 3 fit.
    let carl = app.create_user("carl").await;
    assert_eq!(set_quota(&app, &carl, json!(1000)).await.0, StatusCode::OK);
    let racers = (0..10).map(|_| {
        until_settled(async || {
            app.client
                .post(app.url("/v1/uploads"))
                .bearer_auth(&carl.key)
                .header("tus-resumable", TUS)
                .header("upload-length", "300")
                .send()
                .await
                .unwrap()
        })
    });
    let answers = join_all(racers).await;
    assert_eq!(tally(answers, StatusCode::CREATED), (3, 7));
    assert_eq!(counts(&app, &carl).await, (0, 900, 3));
}

/// Uploads in flight while the quota drops: each body arrives in two
/// halves, up to 3 × `GAP` apart, so that many are streaming, and others
/// committing, when the change lands.
const RACING_UPLOADS: usize = 48;
const UPLOAD_BYTES: usize = 2048;
const GAP: Duration = Duration::from_millis(300);

async fn racing_quota_drop(group_commit: bool) {
    let mut settings = test_settings();
    settings.upload_group_commit = group_commit;
    let app = spawn_app_with(settings).await;
    let ann = app.create_user("ann").await;
    let uploads = (0..RACING_UPLOADS).map(|i| {
        let (base, key) = (app.base.clone(), ann.key.clone());
        async move {
            let half = Bytes::from(vec![b'a' + (i % 26) as u8; UPLOAD_BYTES / 2]);
            let body = futures::stream::unfold(0, move |n| {
                let half = half.clone();
                async move {
                    match n {
                        0 => Some((Ok::<_, std::io::Error>(half), 1)),
                        1 => {
                            tokio::time::sleep(GAP * (i % 4) as u32).await;
                            Some((Ok(half), 2))
                        }
                        _ => None,
                    }
                }
            });
            let client = reqwest::Client::new();
            let body = reqwest::Body::wrap_stream(body);
            let res = upload_raw_at(&client, &base, &key, "r.bin", body).await;
            error_code(res).await
        }
    });
    let racing = tokio::spawn(join_all(uploads));
    // Some have committed, others still stream.
    loop {
        let (_, me) = app.json("GET", "/v1/me", &ann, None).await;
        if me["usage"]["used_bytes"].as_u64().unwrap() > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (status, view) = set_quota(&app, &ann, json!(1)).await;
    assert_eq!(status, StatusCode::OK, "{view}");
    let at_change = view["used_bytes"].as_u64().unwrap();
    let answers = racing.await.unwrap();
    let created = answers
        .iter()
        .filter(|(s, _)| *s == StatusCode::CREATED)
        .count();
    let refused = answers
        .iter()
        .filter(|(_, code)| code == "quota_exceeded")
        .count();
    // Contention may refuse an upload too (nothing committed); nothing else.
    let conflicts = answers
        .iter()
        .filter(|(_, code)| code == "write_conflict")
        .count();
    assert_eq!(created + refused + conflicts, RACING_UPLOADS, "{answers:?}");
    assert!(
        refused > 0,
        "some uploads were still streaming at the change"
    );
    let (_, me) = app.json("GET", "/v1/me", &ann, None).await;
    assert_eq!(
        me["usage"]["used_bytes"].as_u64().unwrap(),
        at_change,
        "nothing committed after the quota dropped below the usage"
    );
    assert_eq!(created as u64 * UPLOAD_BYTES as u64, at_change);
    assert_eq!(app.list_ids(&ann).await.len(), created);
    assert_eq!(app.intents().await, 0);
    assert_eq!(
        app.blob_keys(&ann).await.len(),
        created,
        "refused uploads left no blob"
    );
    eprintln!(
        "quota drop (group commit {group_commit}): {created} committed before it, \
         {refused} refused after, {conflicts} write conflicts"
    );
}

#[tokio::test]
async fn lowering_a_quota_under_concurrent_uploads_lets_no_upload_past_it() {
    racing_quota_drop(true).await;
}

#[tokio::test]
async fn lowering_a_quota_under_concurrent_uploads_one_commit_each_lets_no_upload_past_it() {
    racing_quota_drop(false).await;
}

/// A quota change reaches the store and its answer is lost with the link:
/// it may have applied, so it is never answered 503 (failed). It is 504
/// `outcome_unknown`, and reading the user tells; or, if the driver's own
/// retry got through, 200.
#[tokio::test]
async fn a_quota_change_whose_answer_is_lost_is_not_answered_failed() {
    use crate::{faults::*, support::fault_proxy::FaultProxy};
    if !real_backends() {
        eprintln!("needs the real servers: runs in the real-servers pass of scripts/test.sh");
        return;
    }
    /// BSON of `"findAndModify": "users"`.
    const UPDATE_USERS: &[u8] = b"\x02findAndModify\x00\x06\x00\x00\x00users\x00";
    let proxy = FaultProxy::start(mongo_addr()).await;
    let app = spawn_app_with(through_mongo_proxy(&proxy, FAST_SELECTION)).await;
    let u = app.create_user("unlucky").await;
    let path = format!("/v1/admin/users/{}", u.id);
    proxy.cut_after(UPDATE_USERS, Duration::from_secs(3));
    let body = json!({"quota_bytes": 1234});
    let (status, v) = app.json("PATCH", &path, &admin(), Some(body)).await;
    assert!(proxy.triggered(), "the change never reached the store");
    assert!(
        matches!(status, StatusCode::OK | StatusCode::GATEWAY_TIMEOUT),
        "{status} {v}"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (status, v) = app.json("GET", &path, &admin(), None).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["quota_bytes"], 1234, "it applied: {v}");
}
