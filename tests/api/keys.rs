//! API keys (issue 25): several per user, each listed by id, name and
//! creation time (never its secret), stored hashed, revocable by the admin
//! and by the user; a revoked key is refused at once by the instance that
//! revoked it and by every other within the auth cache's lifetime.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::*;

/// The admin, as a caller of `TestApp::json`.
pub fn admin() -> TestUser {
    TestUser {
        id: String::new(),
        key: ADMIN_KEY.into(),
    }
}

/// `user` under another of their keys.
fn with_key(user: &TestUser, key: &Value) -> TestUser {
    TestUser {
        id: user.id.clone(),
        key: key["api_key"].as_str().expect("a secret").into(),
    }
}

async fn status_of_me(app: &TestApp, user: &TestUser) -> StatusCode {
    app.json("GET", "/v1/me", user, None).await.0
}

/// Makes another key for `user` through the admin API.
pub async fn admin_key_for(app: &TestApp, user: &TestUser, name: &str) -> Value {
    let res = app
        .client
        .post(app.url(&format!("/v1/admin/users/{}/keys", user.id)))
        .bearer_auth(ADMIN_KEY)
        .json(&json!({ "name": name }))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    assert_eq!(res.headers()["cache-control"], "no-store");
    res.json().await.unwrap()
}

#[tokio::test]
async fn a_user_holds_several_keys_lists_them_without_secrets_and_revokes_one_at_once() {
    let app = spawn_app().await;
    let ann = app.create_user("ann").await;
    let laptop = admin_key_for(&app, &ann, "laptop").await;
    assert_eq!(laptop["name"], "laptop");
    assert!(laptop["created_at"].is_string() && laptop["id"].is_string());
    let ann_laptop = with_key(&ann, &laptop);
    // Both keys are ann's, and both are remembered by the auth cache now.
    assert_eq!(status_of_me(&app, &ann).await, StatusCode::OK);
    assert_eq!(status_of_me(&app, &ann_laptop).await, StatusCode::OK);

    let (status, list) = app.json("GET", "/v1/me/keys", &ann_laptop, None).await;
    assert_eq!(status, StatusCode::OK);
    let keys = list["keys"].as_array().unwrap();
    let names: Vec<&str> = keys.iter().map(|k| k["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["default", "laptop"], "oldest first");
    assert_eq!(keys[1]["current"], true);
    assert_eq!(keys[0]["current"], false);
    let text = list.to_string();
    assert!(
        !text.contains(&ann.key) && !text.contains(laptop["api_key"].as_str().unwrap()),
        "a list shows no secret: {text}"
    );
    for k in keys {
        let mut fields: Vec<&String> = k.as_object().unwrap().keys().collect();
        fields.sort();
        assert_eq!(fields, ["created_at", "current", "id", "name"]);
    }

    // Stored hashed: the store has the secret's SHA-256, not the secret.
    let stored = app
        .state
        .ports
        .meta
        .keys(&ann.user_id(), None, 1000)
        .await
        .unwrap();
    assert_eq!(stored.len(), 2);
    assert_eq!(
        stored[1].hash.as_str(),
        sha256_hex(laptop["api_key"].as_str().unwrap().as_bytes())
    );

    // The user revokes their first key with the second: refused at once,
    // although this instance had it cached.
    let first_id = keys[0]["id"].as_str().unwrap();
    let (status, _) = app
        .json(
            "DELETE",
            format!("/v1/me/keys/{first_id}"),
            &ann_laptop,
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert_eq!(status_of_me(&app, &ann).await, StatusCode::UNAUTHORIZED);
    assert_eq!(status_of_me(&app, &ann_laptop).await, StatusCode::OK);
    let (status, _) = app
        .json(
            "DELETE",
            format!("/v1/me/keys/{first_id}"),
            &ann_laptop,
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "revoked once");

    // Another user can neither see nor revoke ann's keys.
    let bob = app.create_user("bob").await;
    let laptop_id = laptop["id"].as_str().unwrap();
    let (status, _) = app
        .json("DELETE", format!("/v1/me/keys/{laptop_id}"), &bob, None)
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(status_of_me(&app, &ann_laptop).await, StatusCode::OK);

    // The user makes a key themselves; the admin lists and revokes.
    let (status, phone) = app
        .json(
            "POST",
            "/v1/me/keys",
            &ann_laptop,
            Some(json!({"name": "phone"})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{phone}");
    let ann_phone = with_key(&ann, &phone);
    assert_eq!(status_of_me(&app, &ann_phone).await, StatusCode::OK);
    let (status, listed) = app
        .json(
            "GET",
            format!("/v1/admin/users/{}/keys", ann.id),
            &admin(),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(listed["keys"].as_array().unwrap().len(), 2);
    let (status, _) = app
        .json(
            "DELETE",
            format!("/v1/admin/users/{}/keys/{laptop_id}", ann.id),
            &admin(),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert_eq!(
        status_of_me(&app, &ann_laptop).await,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(status_of_me(&app, &ann_phone).await, StatusCode::OK);

    // Bad input: an unknown user, a bad name, a user's key on admin routes.
    let unknown = uuid::Uuid::now_v7();
    let (status, _) = app
        .json(
            "POST",
            format!("/v1/admin/users/{unknown}/keys"),
            &admin(),
            Some(json!({"name": "x"})),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, body) = app
        .json("POST", "/v1/me/keys", &ann_phone, Some(json!({"name": ""})))
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (StatusCode::BAD_REQUEST, Some("invalid_request"))
    );
    let (status, _) = app
        .json(
            "GET",
            format!("/v1/admin/users/{}/keys", ann.id),
            &ann_phone,
            None,
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(
        app.metric("filedock_audit_events_total", "action=\"key_revoked\"")
            .await,
        2.0
    );
    assert_eq!(
        app.metric("filedock_audit_events_total", "action=\"key_created\"")
            .await,
        2.0
    );
}

/// The auth cache's lifetime in the two-instance test.
const CACHED_FOR: Duration = Duration::from_secs(2);

#[tokio::test]
async fn a_revoked_key_is_refused_on_a_second_instance_within_the_auth_cache_lifetime() {
    if !real_backends() {
        // The embedded store is one process's: there is no second instance.
        return;
    }
    let mut settings = test_settings();
    settings.auth_cache_ttl = CACHED_FOR;
    let first = spawn_app_with(settings.clone()).await;
    let second = spawn_app_with(settings).await;
    let ann = first.create_user("ann").await;
    let spare = with_key(&ann, &admin_key_for(&first, &ann, "spare").await);
    // The second instance remembers the key.
    assert_eq!(status_of_me(&second, &ann).await, StatusCode::OK);
    let keys = first.json("GET", "/v1/me/keys", &spare, None).await.1;
    let id = keys["keys"][0]["id"].as_str().unwrap().to_owned();
    let (status, _) = first
        .json("DELETE", format!("/v1/me/keys/{id}"), &spare, None)
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let revoked = Instant::now();
    assert_eq!(status_of_me(&first, &ann).await, StatusCode::UNAUTHORIZED);
    // The second instance refuses it once its entry expires, at the latest.
    loop {
        if status_of_me(&second, &ann).await == StatusCode::UNAUTHORIZED {
            break;
        }
        assert!(
            revoked.elapsed() <= CACHED_FOR + Duration::from_millis(500),
            "still accepted {:?} after the revocation",
            revoked.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // And never accepts it again.
    for _ in 0..5 {
        assert_eq!(status_of_me(&second, &ann).await, StatusCode::UNAUTHORIZED);
    }
    assert_eq!(status_of_me(&second, &spare).await, StatusCode::OK);
}
