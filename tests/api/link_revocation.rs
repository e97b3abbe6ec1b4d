//! Links die with the credential that made them (issue 42, item 3): a
//! token's link expires with the token at the latest; a link carries its
//! key (a token's: the key that minted it) and is refused once that key is
//! revoked — at once on the revoking instance, within the auth cache's
//! lifetime on another; a link made before links carried their key lives
//! until it expires.

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use reqwest::StatusCode;
use secrecy::SecretString;
use serde_json::{Value, json};

use crate::{
    helpers::*,
    keys::admin_key_for,
    links::{get_without_key, make_link, make_link_at, upload},
};

/// `user` holding `secret` (a key's or a token's) instead of their key.
fn holding(user: &TestUser, secret: &Value) -> TestUser {
    TestUser {
        id: user.id.clone(),
        key: secret.as_str().expect("a secret").into(),
    }
}

/// Revokes `user`'s key `key_id` with their key `by`.
async fn revoke(app: &TestApp, by: &TestUser, key_id: &str) {
    let (status, body) = app
        .json("DELETE", format!("/v1/me/keys/{key_id}"), by, None)
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{body}");
}

async fn code_of(app: &TestApp, url: &str) -> (StatusCode, String) {
    let res = get_without_key(app, url, &[]).await;
    if res.status() == StatusCode::OK {
        return (StatusCode::OK, String::new());
    }
    error_code(res).await
}

/// Polls `url` until it stops answering 200; how it was refused, and when.
async fn refused_within(app: &TestApp, url: &str, within: Duration) -> (StatusCode, String) {
    let start = Instant::now();
    loop {
        let got = code_of(app, url).await;
        if got.0 != StatusCode::OK {
            return got;
        }
        assert!(
            start.elapsed() <= within,
            "the link still works {:?} on",
            start.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn revoked() -> (StatusCode, String) {
    (StatusCode::FORBIDDEN, "link_revoked".into())
}

/// (a) A token living 3 s asks for a 7-day link: the link expires with the
/// token (the answer names the clamped expiry) and stops working then.
#[tokio::test]
async fn a_tokens_link_expires_with_the_token() {
    let app = spawn_app().await;
    let ann = app.create_user("ann").await;
    let id = upload(&app, &ann, b"short-lived".to_vec()).await;
    let (status, token) = app
        .json(
            "POST",
            "/v1/tokens",
            &ann,
            Some(json!({"scopes": ["files:read"], "expires_in": 3})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{token}");
    let token_ends: DateTime<Utc> = token["expires_at"].as_str().unwrap().parse().unwrap();
    let browser = holding(&ann, &token["token"]);
    let (url, link_ends) = make_link_at(&app, &browser, &id, 7 * 24 * 3600).await;
    assert!(
        link_ends <= token_ends,
        "the link ends {link_ends}, after its token ({token_ends})"
    );
    // Rounded down to the second: at least 2 s of the token's 3 are left.
    assert_eq!(code_of(&app, &url).await.0, StatusCode::OK);
    let left = (token_ends - Utc::now()).to_std().unwrap_or_default();
    let got = refused_within(&app, &url, left + Duration::from_secs(1)).await;
    assert_eq!(got, (StatusCode::FORBIDDEN, "link_expired".into()));
    assert!(Utc::now() >= link_ends);
}

/// (b) A link made with a key downloads until the key is revoked, and is
/// refused at once after (this instance remembered the key alive).
/// (c) A link made with a token dies with the key that minted the token.
#[tokio::test]
async fn a_link_dies_with_its_key_and_a_tokens_link_with_the_minting_key() {
    let app = spawn_app().await;
    let ann = app.create_user("ann").await;
    let id = upload(&app, &ann, b"shared".to_vec()).await;
    let spare = admin_key_for(&app, &ann, "spare").await;
    let spare_user = holding(&ann, &spare["api_key"]);
    let spare_id = spare["id"].as_str().unwrap();
    let by_key = make_link(&app, &spare_user, &id, 600).await;
    assert!(by_key.contains(&format!("key={spare_id}")), "{by_key}");
    let (_, token) = app
        .json(
            "POST",
            "/v1/tokens",
            &spare_user,
            Some(json!({"scopes": ["files:read"], "expires_in": 600})),
        )
        .await;
    let by_token = make_link(&app, &holding(&ann, &token["token"]), &id, 600).await;
    assert!(by_token.contains(&format!("key={spare_id}")), "{by_token}");
    // The user's first key's link is not touched by the revocation.
    let by_first = make_link(&app, &ann, &id, 600).await;
    for url in [&by_key, &by_token, &by_first] {
        assert_eq!(code_of(&app, url).await.0, StatusCode::OK);
    }
    revoke(&app, &ann, spare_id).await;
    assert_eq!(code_of(&app, &by_key).await, revoked(), "the key's link");
    assert_eq!(
        code_of(&app, &by_token).await,
        revoked(),
        "its token's link"
    );
    assert_eq!(code_of(&app, &by_first).await.0, StatusCode::OK);
}

/// `FILEDOCK_SIGNED_LINKS=redirect`: a revoked key's link is refused
/// before any redirect to a presigned URL.
#[tokio::test]
async fn redirect_mode_checks_the_key_before_redirecting() {
    let mut settings = test_settings();
    settings.signed_links = filedock::config::SignedLinks::Redirect;
    let app = spawn_app_with(settings).await;
    let ann = app.create_user("ann").await;
    let id = upload(&app, &ann, b"redirected".to_vec()).await;
    let spare = admin_key_for(&app, &ann, "spare").await;
    let url = make_link(&app, &holding(&ann, &spare["api_key"]), &id, 600).await;
    let no_follow = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let expected = if real_backends() {
        StatusCode::TEMPORARY_REDIRECT
    } else {
        StatusCode::OK
    };
    assert_eq!(no_follow.get(&url).send().await.unwrap().status(), expected);
    revoke(&app, &ann, spare["id"].as_str().unwrap()).await;
    let res = no_follow.get(&url).send().await.unwrap();
    assert_eq!(error_code(res).await, revoked());
}

/// The auth cache's lifetime in the two-instance test.
const CACHED_FOR: Duration = Duration::from_secs(2);

/// (b) on two instances sharing the real stack: the second, which knows
/// the key alive, refuses its link within the auth cache's lifetime of the
/// revocation on the first, and never serves it again.
#[tokio::test]
async fn a_revoked_keys_link_is_refused_on_a_second_instance_within_the_cache_lifetime() {
    if !real_backends() {
        // The embedded store is one process's: there is no second instance.
        return;
    }
    let mut settings = test_settings();
    settings.auth_cache_ttl = CACHED_FOR;
    settings.link_secret = Some(SecretString::from("s".repeat(32)));
    let first = spawn_app_with(settings.clone()).await;
    let second = spawn_app_with(settings).await;
    let ann = first.create_user("ann").await;
    let id = upload(&first, &ann, b"two instances".to_vec()).await;
    let spare = admin_key_for(&first, &ann, "spare").await;
    let url = make_link(&first, &holding(&ann, &spare["api_key"]), &id, 600).await;
    let on_second = url.replace(&first.base, &second.base);
    // The second instance reads the key and remembers it alive.
    assert_eq!(code_of(&second, &on_second).await.0, StatusCode::OK);
    assert_eq!(code_of(&second, &on_second).await.0, StatusCode::OK);
    revoke(&first, &ann, spare["id"].as_str().unwrap()).await;
    let at = Instant::now();
    assert_eq!(code_of(&first, &url).await, revoked(), "at once, here");
    let got = refused_within(&second, &on_second, CACHED_FOR + Duration::from_millis(500)).await;
    assert_eq!(got, revoked(), "after {:?}", at.elapsed());
    for _ in 0..5 {
        assert_eq!(code_of(&second, &on_second).await, revoked());
    }
}

/// (e) A link made before links carried their key (signed v1, without
/// one) still downloads, even after every key it could have come from is
/// revoked, until it expires.
#[tokio::test]
async fn a_link_without_a_key_works_until_it_expires() {
    let app = spawn_app().await;
    let ann = app.create_user("ann").await;
    let id = upload(&app, &ann, b"old link".to_vec()).await;
    let spare = admin_key_for(&app, &ann, "spare").await;
    let now = Utc::now();
    let ends = DateTime::from_timestamp(now.timestamp() + 2, 0).unwrap();
    let sig = app.state.links.sign(&ann.id, &id, None, ends);
    let url = app.url(&format!(
        "/v1/links/{id}?user={}&expires={}&signature={sig}",
        ann.id,
        ends.timestamp()
    ));
    assert_eq!(code_of(&app, &url).await.0, StatusCode::OK);
    // Revoke the user's first key (the spare one asks).
    let keys = app
        .json(
            "GET",
            "/v1/me/keys",
            &holding(&ann, &spare["api_key"]),
            None,
        )
        .await
        .1;
    let first_id = keys["keys"][0]["id"].as_str().unwrap();
    revoke(&app, &holding(&ann, &spare["api_key"]), first_id).await;
    if Utc::now() < ends {
        assert_eq!(code_of(&app, &url).await.0, StatusCode::OK);
    }
    let got = refused_within(&app, &url, Duration::from_secs(4)).await;
    assert_eq!(got, (StatusCode::FORBIDDEN, "link_expired".into()));
}

/// `FILEDOCK_SIGNED_LINKS=redirect` on two instances: a presigned URL
/// lives on after the redirect (up to the cache's lifetime), so the second
/// instance reads the key from the store before each redirect instead of
/// trusting what it remembers: a revocation on the first is refused there
/// at once, even with a 600 s cache (it remembered the key alive).
#[tokio::test]
async fn redirect_mode_reads_the_key_before_each_redirect_on_every_instance() {
    if !real_backends() {
        // The embedded store is one process's, and its files are served.
        return;
    }
    let mut settings = test_settings();
    settings.auth_cache_ttl = Duration::from_secs(600);
    settings.link_secret = Some(SecretString::from("s".repeat(32)));
    settings.signed_links = filedock::config::SignedLinks::Redirect;
    let first = spawn_app_with(settings.clone()).await;
    let second = spawn_app_with(settings).await;
    let ann = first.create_user("ann").await;
    let id = upload(&first, &ann, b"redirected twice".to_vec()).await;
    let spare = admin_key_for(&first, &ann, "spare").await;
    let spare_user = holding(&ann, &spare["api_key"]);
    let url = make_link(&first, &spare_user, &id, 600).await;
    let on_second = url.replace(&first.base, &second.base);
    let no_follow = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    // The second instance knows the key alive: it authenticated it.
    assert_eq!(
        second.json("GET", "/v1/me", &spare_user, None).await.0,
        StatusCode::OK
    );
    let res = no_follow.get(&on_second).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::TEMPORARY_REDIRECT);
    revoke(&first, &ann, spare["id"].as_str().unwrap()).await;
    let res = no_follow.get(&on_second).send().await.unwrap();
    assert_eq!(error_code(res).await, revoked(), "no redirect after");
}
