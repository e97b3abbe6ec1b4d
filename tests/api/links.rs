//! Signed links (issue 13, item 3): a link downloads its file without a key
//! until it expires, as the keyed download does; a tampered link, an expired
//! one and one whose file was deleted download nothing.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::*;

/// Makes a link to `id` living `expires_in` seconds; returns its URL.
pub async fn make_link(app: &TestApp, u: &TestUser, id: &str, expires_in: u64) -> String {
    make_link_at(app, u, id, expires_in).await.0
}

/// Makes a link to `id` asking for `expires_in` seconds; its URL and expiry.
pub async fn make_link_at(
    app: &TestApp,
    u: &TestUser,
    id: &str,
    expires_in: u64,
) -> (String, chrono::DateTime<chrono::Utc>) {
    let (status, body) = app
        .json(
            "POST",
            format!("/v1/files/{id}/links"),
            u,
            Some(json!({ "expires_in": expires_in })),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let url = body["url"].as_str().unwrap().to_owned();
    let expires_at: chrono::DateTime<chrono::Utc> =
        body["expires_at"].as_str().unwrap().parse().unwrap();
    assert!(
        url.contains(&format!("expires={}", expires_at.timestamp())),
        "the URL carries the expiry the answer names: {url}"
    );
    (url, expires_at)
}

/// `url` with no API key, plus `headers`.
pub async fn get_without_key(
    app: &TestApp,
    url: &str,
    headers: &[(&str, &str)],
) -> reqwest::Response {
    let mut req = app.client.get(url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.send().await.unwrap()
}

pub async fn upload(app: &TestApp, u: &TestUser, bytes: Vec<u8>) -> String {
    app.upload_json(u, "shared.bin", bytes).await["id"]
        .as_str()
        .unwrap()
        .to_owned()
}

#[tokio::test]
async fn a_signed_link_downloads_without_a_key_with_ranges_and_conditionals() {
    let app = spawn_app().await;
    let u = app.create_user("links").await;
    let bytes = pseudo_random_bytes(100_000, 7);
    let id = upload(&app, &u, bytes.clone()).await;
    let url = make_link(&app, &u, &id, 600).await;
    assert!(
        url.starts_with(&app.base),
        "an absolute URL on this server: {url}"
    );

    let res = get_without_key(&app, &url, &[]).await;
    assert_eq!(res.status(), StatusCode::OK);
    let etag = res.headers()["etag"].to_str().unwrap().to_owned();
    assert_eq!(res.bytes().await.unwrap().as_ref(), bytes.as_slice());

    let res = get_without_key(&app, &url, &[("range", "bytes=10-19")]).await;
    assert_eq!(res.status(), StatusCode::PARTIAL_CONTENT);
    assert_eq!(res.bytes().await.unwrap().as_ref(), &bytes[10..20]);

    let res = get_without_key(&app, &url, &[("if-none-match", &etag)]).await;
    assert_eq!(res.status(), StatusCode::NOT_MODIFIED);

    // The keyed download still wants its key.
    let res = get_without_key(&app, &app.url(&format!("/v1/files/{id}/content")), &[]).await;
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn a_signed_link_fails_after_it_expires() {
    let app = spawn_app().await;
    let u = app.create_user("expiry").await;
    let id = upload(&app, &u, b"soon gone".to_vec()).await;
    // Two seconds: at least one whole second in which it must work.
    let url = make_link(&app, &u, &id, 2).await;
    let res = get_without_key(&app, &url, &[]).await;
    assert_eq!(res.status(), StatusCode::OK, "a fresh link works");
    let deadline = Instant::now() + Duration::from_secs(10);
    let refused = loop {
        let res = get_without_key(&app, &url, &[]).await;
        if res.status() != StatusCode::OK {
            break error_code(res).await;
        }
        assert!(Instant::now() < deadline, "the link still works after 10 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(refused, (StatusCode::FORBIDDEN, "link_expired".into()));
}

#[tokio::test]
async fn a_tampered_link_is_refused() {
    let app = spawn_app().await;
    let u = app.create_user("tamper").await;
    let other = app.create_user("other").await;
    let id = upload(&app, &u, b"mine".to_vec()).await;
    let second = upload(&app, &u, b"also mine".to_vec()).await;
    let url = make_link(&app, &u, &id, 600).await;
    let (path, query) = url.split_once('?').unwrap();
    let param = |name: &str| {
        query
            .split('&')
            .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
            .unwrap()
            .to_owned()
    };
    let (user, key, expires, sig) = (
        param("user"),
        param("key"),
        param("expires"),
        param("signature"),
    );
    let flipped = {
        let mut s = sig.clone().into_bytes();
        s[0] = if s[0] == b'A' { b'B' } else { b'A' };
        String::from_utf8(s).unwrap()
    };
    let later = (expires.parse::<i64>().unwrap() + 3600).to_string();
    let second_path = path.replace(&id, &second);
    // Another key of the same user (issue 42: a link carries its key).
    let spare = crate::keys::admin_key_for(&app, &u, "spare").await;
    let spare_id = spare["id"].as_str().unwrap();
    let link = |path: &str, user: &str, key: Option<&str>, expires: &str, sig: &str| {
        let key = key.map(|k| format!("&key={k}")).unwrap_or_default();
        format!("{path}?user={user}{key}&expires={expires}&signature={sig}")
    };
    let k = Some(key.as_str());
    for (what, tampered) in [
        ("signature", link(path, &user, k, &expires, &flipped)),
        ("expiry", link(path, &user, k, &later, &sig)),
        ("user", link(path, &other.id, k, &expires, &sig)),
        ("file", link(&second_path, &user, k, &expires, &sig)),
        ("no signature", link(path, &user, k, &expires, "")),
        // The signed number spelt otherwise (issue 20).
        (
            "expiry with a leading zero",
            link(path, &user, k, &format!("0{expires}"), &sig),
        ),
        (
            "expiry with a plus sign",
            link(path, &user, k, &format!("%2B{expires}"), &sig),
        ),
        // The key: another of the user's, none (a v1 link's form), empty.
        ("key", link(path, &user, Some(spare_id), &expires, &sig)),
        ("no key", link(path, &user, None, &expires, &sig)),
        ("empty key", link(path, &user, Some(""), &expires, &sig)),
    ] {
        let res = get_without_key(&app, &tampered, &[]).await;
        assert_eq!(
            error_code(res).await,
            (StatusCode::FORBIDDEN, "link_invalid".into()),
            "tampered {what}"
        );
    }
    let res = get_without_key(&app, &url, &[]).await;
    assert_eq!(res.status(), StatusCode::OK, "the untouched link works");
}

#[tokio::test]
async fn a_signed_link_dies_with_its_file() {
    let app = spawn_app().await;
    let u = app.create_user("deleted").await;
    let id = upload(&app, &u, b"to be deleted".to_vec()).await;
    let url = make_link(&app, &u, &id, 600).await;
    assert_eq!(
        get_without_key(&app, &url, &[]).await.status(),
        StatusCode::OK
    );
    let (status, _) = app
        .json("DELETE", format!("/v1/files/{id}"), &u, None)
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let res = get_without_key(&app, &url, &[]).await;
    assert_eq!(
        error_code(res).await,
        (StatusCode::NOT_FOUND, "not_found".into())
    );
}

#[tokio::test]
async fn links_are_bounded_and_only_for_the_callers_files() {
    let app = spawn_app().await;
    let u = app.create_user("bounds").await;
    let other = app.create_user("stranger").await;
    let id = upload(&app, &u, b"x".to_vec()).await;
    for bad in [
        json!({"expires_in": 0}),
        json!({"expires_in": 604_801}),
        json!({}),
    ] {
        let (status, body) = app
            .json(
                "POST",
                format!("/v1/files/{id}/links"),
                &u,
                Some(bad.clone()),
            )
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {body}");
    }
    let (status, body): (StatusCode, Value) = app
        .json(
            "POST",
            format!("/v1/files/{id}/links"),
            &other,
            Some(json!({"expires_in": 60})),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "another user's file: {body}");
    let (status, _) = app
        .json(
            "POST",
            format!("/v1/files/{id}/links"),
            &u,
            Some(json!({"expires_in": 604_800})),
        )
        .await;
    assert_eq!(
        status,
        StatusCode::CREATED,
        "the documented maximum is accepted"
    );
}

/// `FILEDOCK_SIGNED_LINKS=redirect`: on S3 a link answers 307 to a presigned
/// GET of the object; on local files (no presigned URLs) it streams as in
/// proxy mode. Either way a deleted file's link answers 404, no redirect.
#[tokio::test]
async fn redirect_mode_sends_a_link_to_a_presigned_s3_get() {
    let mut settings = test_settings();
    settings.signed_links = filedock::config::SignedLinks::Redirect;
    let app = spawn_app_with(settings).await;
    let u = app.create_user("redirect").await;
    let bytes = pseudo_random_bytes(50_000, 9);
    let id = upload(&app, &u, bytes.clone()).await;
    let url = make_link(&app, &u, &id, 600).await;
    let no_follow = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let res = no_follow.get(&url).send().await.unwrap();
    let got = if real_backends() {
        assert_eq!(res.status(), StatusCode::TEMPORARY_REDIRECT);
        let location = res.headers()["location"].to_str().unwrap().to_owned();
        let endpoint = &app.settings.s3.as_ref().unwrap().endpoint;
        assert!(location.starts_with(endpoint.as_str()), "{location}");
        let got = app.client.get(&location).send().await.unwrap();
        // S3 answers with the headers filedock would send.
        let h = got.headers();
        assert_eq!(h["cache-control"], "private");
        assert!(
            h["content-disposition"]
                .to_str()
                .unwrap()
                .starts_with("attachment; filename=\"shared.bin\""),
            "{h:?}"
        );
        got
    } else {
        res
    };
    assert_eq!(got.status(), StatusCode::OK);
    assert_eq!(got.bytes().await.unwrap().as_ref(), bytes.as_slice());

    let (status, _) = app
        .json("DELETE", format!("/v1/files/{id}"), &u, None)
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let res = no_follow.get(&url).send().await.unwrap();
    assert_eq!(
        error_code(res).await,
        (StatusCode::NOT_FOUND, "not_found".into())
    );
}
