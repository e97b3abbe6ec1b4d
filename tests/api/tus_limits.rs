//! What open resumable uploads count against (issue 20, item 6): their
//! `Upload-Length` is reserved against the user's quota from creation and
//! released when the file's bytes take its place, on termination and on
//! expiry; a user has at most `FILEDOCK_MAX_OPEN_UPLOADS` of them. Both are
//! in `/v1/me`. Racing creations are counted, on both backends.

use std::time::Duration;

use reqwest::{Response, StatusCode};
use serde_json::Value;

use crate::{
    helpers::{
        TestApp, TestUser, assert_bucket_matches_metadata, error_code, spawn_app_with,
        test_settings,
    },
    tus::{TUS, data, head, patch},
    tus_reserve::expire_and_sweep,
};

/// `POST /v1/uploads` of `len` bytes, whatever it answers.
pub(crate) async fn try_create(app: &TestApp, user: &TestUser, len: usize) -> Response {
    app.client
        .post(app.url("/v1/uploads"))
        .bearer_auth(&user.key)
        .header("tus-resumable", TUS)
        .header("upload-length", len.to_string())
        .send()
        .await
        .unwrap()
}

/// The id of a created upload.
pub(crate) fn upload_id(res: &Response) -> String {
    assert_eq!(res.status(), StatusCode::CREATED);
    let location = res.headers()["location"].to_str().unwrap();
    location.rsplit('/').next().unwrap().to_owned()
}

/// `/v1/me`'s usage.
pub(crate) async fn usage(app: &TestApp, user: &TestUser) -> Value {
    let (status, me) = app.json("GET", "/v1/me", user, None).await;
    assert_eq!(status, StatusCode::OK);
    me["usage"].clone()
}

/// `(used_bytes, reserved_bytes, open_uploads)`.
pub(crate) async fn counts(app: &TestApp, user: &TestUser) -> (i64, i64, i64) {
    let u = usage(app, user).await;
    let n = |k: &str| u[k].as_i64().unwrap_or_else(|| panic!("{k} in {u}"));
    (n("used_bytes"), n("reserved_bytes"), n("open_uploads"))
}

pub(crate) async fn terminate(app: &TestApp, user: &TestUser, id: &str) -> StatusCode {
    app.client
        .delete(app.url(&format!("/v1/uploads/{id}")))
        .bearer_auth(&user.key)
        .header("tus-resumable", TUS)
        .send()
        .await
        .unwrap()
        .status()
}

#[tokio::test]
async fn an_open_upload_reserves_its_length_until_its_file_takes_its_place() {
    // Both commit paths release the reservation in the commit's transaction.
    for group_commit in [true, false] {
        let mut settings = test_settings();
        settings.user_quota_bytes = Some(1000);
        settings.upload_group_commit = group_commit;
        let app = spawn_app_with(settings).await;
        let user = app.create_user("res").await;
        let id = upload_id(&try_create(&app, &user, 600).await);
        assert_eq!(counts(&app, &user).await, (0, 600, 1));
        let me = usage(&app, &user).await;
        assert_eq!(me["max_open_uploads"], 100, "the default cap is shown");

        // Neither a second upload nor a plain one may take the reserved bytes.
        assert_eq!(
            error_code(try_create(&app, &user, 401).await).await,
            (StatusCode::INSUFFICIENT_STORAGE, "quota_exceeded".into())
        );
        let plain = app.upload_raw(&user, "p.txt", vec![b'p'; 401]).await;
        assert_eq!(plain.status(), StatusCode::INSUFFICIENT_STORAGE);
        assert_eq!(
            counts(&app, &user).await,
            (0, 600, 1),
            "refusals count nothing"
        );
        let plain = app.upload_raw(&user, "p.txt", vec![b'p'; 400]).await;
        assert_eq!(plain.status(), StatusCode::CREATED);
        assert_eq!(counts(&app, &user).await, (400, 600, 1));

        // Half stored: still reserved once, not counted twice.
        let bytes = data(600);
        let res = patch(&app, &user, &id, 0, &bytes[..300]).await;
        assert_eq!(res.status(), StatusCode::NO_CONTENT);
        assert_eq!(counts(&app, &user).await, (400, 600, 1));
        let res = patch(&app, &user, &id, 300, &bytes[300..]).await;
        assert_eq!(res.status(), StatusCode::NO_CONTENT, "group {group_commit}");
        assert_eq!(
            counts(&app, &user).await,
            (1000, 0, 0),
            "the file took its place"
        );
        assert_eq!(
            error_code(try_create(&app, &user, 1).await).await,
            (StatusCode::INSUFFICIENT_STORAGE, "quota_exceeded".into())
        );
        assert_eq!(assert_bucket_matches_metadata(&app.state).await, 2);
    }
}

#[tokio::test]
async fn termination_and_expiry_give_the_reservation_back() {
    let mut settings = test_settings();
    settings.user_quota_bytes = Some(1000);
    let app = spawn_app_with(settings).await;
    let user = app.create_user("rel").await;
    let a = upload_id(&try_create(&app, &user, 600).await);
    let b = upload_id(&try_create(&app, &user, 400).await);
    assert_eq!(counts(&app, &user).await, (0, 1000, 2));
    assert_eq!(
        try_create(&app, &user, 1).await.status(),
        StatusCode::INSUFFICIENT_STORAGE
    );
    let res = patch(&app, &user, &a, 0, &data(100)).await;
    assert_eq!(res.status(), StatusCode::NO_CONTENT);

    assert_eq!(terminate(&app, &user, &a).await, StatusCode::NO_CONTENT);
    assert_eq!(counts(&app, &user).await, (0, 400, 1));
    assert_eq!(terminate(&app, &user, &a).await, StatusCode::NOT_FOUND);
    assert_eq!(counts(&app, &user).await, (0, 400, 1), "given back once");
    let c = upload_id(&try_create(&app, &user, 600).await);

    let report = expire_and_sweep(&app, &b).await;
    assert_eq!(report.resumables_expired, 1);
    assert_eq!(counts(&app, &user).await, (0, 600, 1));
    assert_eq!(head(&app, &user, &c).await.0, StatusCode::OK);
    assert_eq!(terminate(&app, &user, &c).await, StatusCode::NO_CONTENT);
    assert_eq!(counts(&app, &user).await, (0, 0, 0));
    assert_eq!(assert_bucket_matches_metadata(&app.state).await, 0);
}

#[tokio::test]
async fn a_user_may_have_so_many_open_uploads() {
    let mut settings = test_settings();
    settings.max_open_uploads = 3;
    let app = spawn_app_with(settings).await;
    let (user, other) = (app.create_user("cap").await, app.create_user("other").await);
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(upload_id(&try_create(&app, &user, 10).await));
    }
    let refused = try_create(&app, &user, 10).await;
    assert!(
        refused.headers().get("retry-after").is_none(),
        "a pause does not help"
    );
    assert_eq!(
        error_code(refused).await,
        (
            StatusCode::TOO_MANY_REQUESTS,
            "too_many_open_uploads".into()
        )
    );
    assert_eq!(counts(&app, &user).await, (0, 30, 3));
    assert_eq!(usage(&app, &user).await["max_open_uploads"], 3);
    // Another user's count is their own.
    upload_id(&try_create(&app, &other, 10).await);

    // Finished or terminated, an upload is no longer open.
    let res = patch(&app, &user, &ids[0], 0, &data(10)).await;
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    assert_eq!(counts(&app, &user).await, (10, 20, 2));
    assert_eq!(
        terminate(&app, &user, &ids[1]).await,
        StatusCode::NO_CONTENT
    );
    assert_eq!(counts(&app, &user).await, (10, 10, 1));
    upload_id(&try_create(&app, &user, 10).await);
    upload_id(&try_create(&app, &user, 10).await);
    assert_eq!(
        try_create(&app, &user, 10).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(counts(&app, &user).await, (10, 30, 3));
}

/// Creations racing for what is left: at most what fits is created, every
/// other one is refused (quota or cap) or told to retry (write conflict),
/// and the counters equal what was created: one more then fits exactly
/// when fewer than all fit were created.
async fn race(app: &TestApp, user: &TestUser, racers: usize, fits: usize) {
    let tasks: Vec<_> = (0..racers)
        .map(|_| {
            let (client, url, key) = (app.client.clone(), app.url("/v1/uploads"), user.key.clone());
            tokio::spawn(async move {
                let res = client
                    .post(url)
                    .bearer_auth(key)
                    .header("tus-resumable", TUS)
                    .header("upload-length", "100")
                    .send()
                    .await
                    .unwrap();
                error_code(res).await
            })
        })
        .collect();
    let mut created = 0;
    for t in tasks {
        let (status, code) = t.await.unwrap();
        match status {
            StatusCode::CREATED => created += 1,
            StatusCode::INSUFFICIENT_STORAGE => assert_eq!(code, "quota_exceeded"),
            StatusCode::TOO_MANY_REQUESTS => assert_eq!(code, "too_many_open_uploads"),
            StatusCode::CONFLICT => assert_eq!(code, "write_conflict"),
            s => panic!("a racing creation answered {s} {code}"),
        }
    }
    assert!(created <= fits, "{created} created, {fits} fit");
    assert!(created > 0, "one of them wins");
    let counted = created as i64;
    assert_eq!(counts(app, user).await, (0, 100 * counted, counted));
    // Fill up one by one: the counters let exactly `fits` in.
    for _ in created..fits {
        upload_id(&try_create(app, user, 100).await);
    }
    assert_ne!(
        try_create(app, user, 100).await.status(),
        StatusCode::CREATED
    );
    let fits = fits as i64;
    assert_eq!(counts(app, user).await, (0, 100 * fits, fits));
}

#[tokio::test]
async fn racing_creations_never_pass_the_quota_or_the_cap() {
    let mut settings = test_settings();
    settings.user_quota_bytes = Some(500);
    settings.max_open_uploads = 1000;
    let app = spawn_app_with(settings).await;
    race(&app, &app.create_user("quota").await, 24, 5).await;
    let mut settings = test_settings();
    settings.max_open_uploads = 4;
    let app = spawn_app_with(settings).await;
    race(&app, &app.create_user("cap").await, 24, 4).await;
}

#[tokio::test]
async fn an_upload_refused_for_good_gives_its_reservation_back() {
    // A type outside the allow-list ends the upload: its reservation goes with it.
    let mut settings = test_settings();
    settings.user_quota_bytes = Some(1000);
    settings.allowed_types = filedock::config::AllowedTypes::parse("image/*").unwrap();
    let app = spawn_app_with(settings).await;
    let user = app.create_user("refused").await;
    let id = upload_id(&try_create(&app, &user, 100).await);
    let res = patch(&app, &user, &id, 0, &data(100)).await;
    assert_eq!(res.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(counts(&app, &user).await, (0, 0, 0));
}
