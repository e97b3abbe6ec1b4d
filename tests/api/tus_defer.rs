//! tus's creation-defer-length (issue 20): an upload created with
//! `Upload-Defer-Length: 1` (as Uppy Companion always creates them) learns
//! its `Upload-Length` from a PATCH, once; its quota reservation and its
//! size category are decided then. Bad combinations get 400 in the JSON
//! error shape. A declared upload whose last part failed keeps its staged
//! tail through a sweep. On the embedded adapters and the real backends.

use std::{
    sync::{Arc, atomic::Ordering},
    time::Duration,
};

use filedock::{domain::sweeper::Outcome, http::AppState, ports::Ports};
use reqwest::{Method, Response, StatusCode};

use crate::{
    helpers::{
        TestApp, TestUser, assert_bucket_matches_metadata, error_code, spawn_app, spawn_app_with,
        spawn_app_with_state, test_settings,
    },
    support::faulty_blobs::LosesCompleteAnswer,
    tus::{LEN, OCTETS, TUS, content, data, head, offset_of, patch, staging_left},
    tus_limits::{counts, try_create, upload_id},
};

/// `POST /v1/uploads` with `Upload-Defer-Length: 1`.
pub(crate) async fn create_deferred(app: &TestApp, user: &TestUser) -> String {
    let res = app
        .client
        .post(app.url("/v1/uploads"))
        .bearer_auth(&user.key)
        .header("tus-resumable", TUS)
        .header("upload-defer-length", "1")
        .send()
        .await
        .unwrap();
    upload_id(&res)
}

/// A PATCH of `bytes` at `offset` that declares `Upload-Length: length`.
pub(crate) async fn patch_declaring(
    app: &TestApp,
    user: &TestUser,
    id: &str,
    offset: usize,
    length: usize,
    bytes: &[u8],
) -> Response {
    app.client
        .patch(app.url(&format!("/v1/uploads/{id}")))
        .bearer_auth(&user.key)
        .header("tus-resumable", TUS)
        .header("content-type", OCTETS)
        .header("upload-offset", offset.to_string())
        .header("upload-length", length.to_string())
        .body(bytes.to_vec())
        .send()
        .await
        .unwrap()
}

/// `HEAD`'s `Upload-Length` and `Upload-Defer-Length`.
pub(crate) async fn lengths(
    app: &TestApp,
    user: &TestUser,
    id: &str,
) -> (Option<String>, Option<String>) {
    let res = app
        .client
        .request(Method::HEAD, app.url(&format!("/v1/uploads/{id}")))
        .bearer_auth(&user.key)
        .header("tus-resumable", TUS)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let h = |name: &str| {
        res.headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_owned())
    };
    (h("upload-length"), h("upload-defer-length"))
}

async fn file_category(app: &TestApp, user: &TestUser, id: &str) -> String {
    let (status, file) = app.json("GET", format!("/v1/files/{id}"), user, None).await;
    assert_eq!(status, StatusCode::OK);
    file["category"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn a_deferred_upload_learns_its_length_from_a_patch() {
    let app = spawn_app().await;
    let user = app.create_user("defer").await;
    let res = app
        .client
        .request(Method::OPTIONS, app.url("/v1/uploads"))
        .send()
        .await
        .unwrap();
    let extensions = res.headers()["tus-extension"].to_str().unwrap();
    assert!(extensions.split(',').any(|e| e == "creation-defer-length"));

    let id = create_deferred(&app, &user).await;
    assert_eq!(lengths(&app, &user, &id).await, (None, Some("1".into())));
    assert_eq!(
        counts(&app, &user).await,
        (0, 0, 1),
        "open, nothing reserved yet"
    );
    let bytes = data(600);
    let res = patch(&app, &user, &id, 0, &bytes[..300]).await;
    assert_eq!(
        (res.status(), offset_of(&res)),
        (StatusCode::NO_CONTENT, 300)
    );
    assert_eq!(lengths(&app, &user, &id).await, (None, Some("1".into())));

    let res = patch_declaring(&app, &user, &id, 300, 600, &bytes[300..]).await;
    assert_eq!(
        (res.status(), offset_of(&res)),
        (StatusCode::NO_CONTENT, 600)
    );
    assert_eq!(content(&app, &user, &id).await, bytes);
    assert_eq!(counts(&app, &user).await, (600, 0, 0));
}

#[tokio::test]
async fn a_length_declared_at_the_offset_finishes_the_upload_and_sets_its_category() {
    // What tus-js-client sends when its stream ends: an empty PATCH with the length.
    let app = spawn_app().await;
    let user = app.create_user("defer-end").await;
    let id = create_deferred(&app, &user).await;
    let bytes = data(LEN);
    let res = patch(&app, &user, &id, 0, &bytes).await;
    assert_eq!(
        (res.status(), offset_of(&res)),
        (StatusCode::NO_CONTENT, LEN)
    );
    assert_eq!(lengths(&app, &user, &id).await, (None, Some("1".into())));
    let res = patch_declaring(&app, &user, &id, LEN, LEN, b"").await;
    assert_eq!(
        (res.status(), offset_of(&res)),
        (StatusCode::NO_CONTENT, LEN)
    );
    assert_eq!(content(&app, &user, &id).await, bytes);
    // 13 MiB: medium, decided from the length declared.
    assert_eq!(file_category(&app, &user, &id).await, "medium");
    assert_eq!(counts(&app, &user).await, (LEN as i64, 0, 0));
}

#[tokio::test]
async fn bad_length_headers_get_400_and_change_nothing() {
    let app = spawn_app().await;
    let user = app.create_user("defer-bad").await;
    let creation = |headers: &'static [(&'static str, &'static str)]| {
        let mut req = app
            .client
            .post(app.url("/v1/uploads"))
            .bearer_auth(&user.key)
            .header("tus-resumable", TUS);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        req.send()
    };
    let bad = (StatusCode::BAD_REQUEST, "invalid_request".to_owned());
    let cases: [&'static [(&str, &str)]; 4] = [
        &[("upload-defer-length", "1"), ("upload-length", "10")],
        &[("upload-defer-length", "0")],
        &[("upload-defer-length", "true")],
        &[],
    ];
    for headers in cases {
        assert_eq!(
            error_code(creation(headers).await.unwrap()).await,
            bad,
            "{headers:?}"
        );
    }
    assert_eq!(counts(&app, &user).await, (0, 0, 0), "nothing was created");

    let id = create_deferred(&app, &user).await;
    let bytes = data(100);
    assert_eq!(
        patch(&app, &user, &id, 0, &bytes[..50]).await.status(),
        StatusCode::NO_CONTENT
    );
    // Below what is stored.
    let res = patch_declaring(&app, &user, &id, 50, 49, b"").await;
    assert_eq!(error_code(res).await, bad);
    // Above the size limit.
    let max = app.settings.max_upload_bytes as usize;
    let res = patch_declaring(&app, &user, &id, 50, max + 1, b"").await;
    assert_eq!(error_code(res).await.0, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(lengths(&app, &user, &id).await, (None, Some("1".into())));
    // Declared once; then it cannot change.
    let res = patch_declaring(&app, &user, &id, 50, 100, &bytes[50..60]).await;
    assert_eq!(
        (res.status(), offset_of(&res)),
        (StatusCode::NO_CONTENT, 60)
    );
    assert_eq!(lengths(&app, &user, &id).await, (Some("100".into()), None));
    let res = patch_declaring(&app, &user, &id, 60, 101, &bytes[60..]).await;
    assert_eq!(error_code(res).await, bad);
    assert_eq!(
        head(&app, &user, &id).await.1,
        Some(60),
        "the refused PATCH kept nothing"
    );
    let res = patch_declaring(&app, &user, &id, 60, 100, &bytes[60..]).await;
    assert_eq!(
        res.status(),
        StatusCode::NO_CONTENT,
        "the same length again is no change"
    );
    assert_eq!(content(&app, &user, &id).await, bytes);

    // An upload created with its length cannot be given another.
    let id = upload_id(&try_create(&app, &user, 10).await);
    let res = patch_declaring(&app, &user, &id, 0, 11, b"").await;
    assert_eq!(error_code(res).await, bad);
}

#[tokio::test]
async fn a_deferred_upload_is_held_to_the_quota_before_and_when_it_declares() {
    let mut settings = test_settings();
    settings.user_quota_bytes = Some(1000);
    let app = spawn_app_with(settings).await;
    let user = app.create_user("defer-quota").await;
    let other = upload_id(&try_create(&app, &user, 600).await);
    let id = create_deferred(&app, &user).await;
    let bytes = data(500);
    assert_eq!(
        patch(&app, &user, &id, 0, &bytes[..300]).await.status(),
        StatusCode::NO_CONTENT
    );
    let quota = (
        StatusCode::INSUFFICIENT_STORAGE,
        "quota_exceeded".to_owned(),
    );
    // 600 reserved + 500 declared is past 1000: refused, nothing changes.
    let res = patch_declaring(&app, &user, &id, 300, 500, &bytes[300..]).await;
    assert_eq!(error_code(res).await, quota);
    assert_eq!(lengths(&app, &user, &id).await, (None, Some("1".into())));
    // 600 for the other, 300 for the bytes this one stored.
    assert_eq!(counts(&app, &user).await, (0, 900, 2));
    // Undeclared, its bytes may not pass what the quota leaves (400 - 300 stored).
    let res = patch(&app, &user, &id, 300, &bytes[300..401]).await;
    assert_eq!(error_code(res).await, quota);
    assert_eq!(
        head(&app, &user, &id).await.1,
        Some(300),
        "nothing of it kept"
    );

    let res = app
        .client
        .delete(app.url(&format!("/v1/uploads/{other}")))
        .bearer_auth(&user.key)
        .header("tus-resumable", TUS)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    let res = patch_declaring(&app, &user, &id, 300, 500, &bytes[300..400]).await;
    assert_eq!(
        (res.status(), offset_of(&res)),
        (StatusCode::NO_CONTENT, 400)
    );
    assert_eq!(
        counts(&app, &user).await,
        (0, 500, 1),
        "reserved when declared"
    );
    let res = patch(&app, &user, &id, 400, &bytes[400..]).await;
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    assert_eq!(counts(&app, &user).await, (500, 0, 0));
    assert_eq!(content(&app, &user, &id).await, bytes);
}

/// A deferred upload whose declaring PATCH recorded the length but failed
/// to write the last part keeps the staged tail that holds its last bytes
/// through a sweep (it is named by the state, not replaced), and the next
/// HEAD finishes it with every acknowledged byte.
#[tokio::test]
async fn a_declared_upload_whose_last_part_failed_keeps_its_tail_through_a_sweep() {
    let mut settings = test_settings();
    settings.sweep.intent_grace = Duration::ZERO;
    let mut ports = Ports::connect(&settings).await.unwrap();
    let blobs = Arc::new(LosesCompleteAnswer::wrapping(ports.resumable.clone()));
    ports.resumable = blobs.clone();
    let app = spawn_app_with_state(AppState::with_ports(settings, ports).unwrap()).await;
    let user = app.create_user("declared-tail").await;
    let id = create_deferred(&app, &user).await;
    // Less than a part: all of it is the staged tail.
    let bytes = data(300);
    let res = patch(&app, &user, &id, 0, &bytes).await;
    assert_eq!(
        (res.status(), offset_of(&res)),
        (StatusCode::NO_CONTENT, 300)
    );

    blobs.refuse_part.store(true, Ordering::SeqCst);
    let res = patch_declaring(&app, &user, &id, 300, 300, b"").await;
    assert_eq!(
        res.status(),
        StatusCode::SERVICE_UNAVAILABLE,
        "the refused part"
    );
    assert!(
        !blobs.refuse_part.load(Ordering::SeqCst),
        "the last part was tried"
    );
    // Staging is judged by its age: let the tail be older than the grace
    // on blob stores whose times have whole seconds.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let Outcome::Swept(report) = app.state.sweeper.try_run_once().await.unwrap() else {
        panic!("the sweeper is busy")
    };
    assert_eq!(report.staging_removed, 0, "the upload's tail was swept");

    assert_eq!(head(&app, &user, &id).await, (StatusCode::OK, Some(300)));
    assert_eq!(content(&app, &user, &id).await, bytes);
    assert_eq!(assert_bucket_matches_metadata(&app.state).await, 1);
    assert_eq!(staging_left(&app).await, 0, "staging left behind");
}
