//! Short-lived scoped tokens (issue 25): `POST /v1/tokens` mints a bearer
//! token with a subset of the caller's rights; it cannot exceed its scopes,
//! its session or agent, its lifetime, or outlive the key that minted it.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::*;
use crate::keys::{admin, admin_key_for};

/// Mints a token as `user` with `body`; the answer.
async fn mint(app: &TestApp, user: &TestUser, body: Value) -> (StatusCode, Value) {
    app.json("POST", "/v1/tokens", user, Some(body)).await
}

/// `user` holding `token` instead of their key.
fn bearer(user: &TestUser, token: &Value) -> TestUser {
    TestUser {
        id: user.id.clone(),
        key: token["token"].as_str().expect("a token").into(),
    }
}

async fn code(
    app: &TestApp,
    method: &str,
    path: &str,
    who: &TestUser,
    body: Option<Value>,
) -> (StatusCode, String) {
    let (status, body) = app.json(method, path.to_owned(), who, body).await;
    (
        status,
        body["error"]["code"].as_str().unwrap_or("").to_owned(),
    )
}

#[tokio::test]
async fn a_token_does_only_what_its_scopes_and_its_session_allow() {
    let app = spawn_app().await;
    let ann = app.create_user("ann").await;
    let (mine, other) = (app.new_session(&ann).await, app.new_session(&ann).await);
    let kept = app.upload_json(&ann, "kept.txt", b"kept".to_vec()).await;
    let kept = kept["id"].as_str().unwrap();

    let res = app
        .client
        .post(app.url("/v1/tokens"))
        .bearer_auth(&ann.key)
        .json(&json!({"scopes": ["files:write", "sessions:write"], "expires_in": 600, "session_id": mine}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    assert_eq!(res.headers()["cache-control"], "no-store");
    let token: Value = res.json().await.unwrap();
    assert!(token["token"].as_str().unwrap().starts_with("fdt_"));
    assert_eq!(token["scopes"], json!(["files:write", "sessions:write"]));
    assert_eq!(token["session_id"], mine.as_str());
    assert!(token["expires_at"].is_string());
    let browser = bearer(&ann, &token);

    // What it may do: upload, and attach into its session.
    let up = app
        .upload_json(&browser, "new.txt", b"from the browser".to_vec())
        .await;
    let new = up["id"].as_str().unwrap();
    let (status, session) = app
        .json(
            "POST",
            format!("/v1/sessions/{mine}/files"),
            &browser,
            Some(json!({"file_id": new})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{session}");

    // Write outside its session, read when it may only write, and anything
    // a key alone may do: 403 forbidden, nothing changed.
    let refused: Vec<(&str, String, Option<Value>)> = vec![
        (
            "POST",
            format!("/v1/sessions/{other}/files"),
            Some(json!({"file_id": new})),
        ),
        ("DELETE", format!("/v1/sessions/{other}/files/{kept}"), None),
        ("GET", format!("/v1/sessions/{mine}"), None),
        ("POST", "/v1/sessions".into(), None),
        ("GET", "/v1/files".into(), None),
        ("GET", format!("/v1/files/{kept}"), None),
        ("GET", format!("/v1/files/{kept}/content"), None),
        (
            "POST",
            format!("/v1/files/{kept}/links"),
            Some(json!({"expires_in": 60})),
        ),
        ("POST", "/v1/agents".into(), Some(json!({"name": "a"}))),
        ("GET", "/v1/me/keys".into(), None),
        ("POST", "/v1/me/keys".into(), Some(json!({"name": "k"}))),
        (
            "POST",
            "/v1/tokens".into(),
            Some(json!({"scopes": ["files:write"]})),
        ),
    ];
    for (method, path, body) in refused {
        assert_eq!(
            code(&app, method, &path, &browser, body).await,
            (StatusCode::FORBIDDEN, "forbidden".into()),
            "{method} {path}"
        );
    }
    let (_, other_session) = app
        .json("GET", format!("/v1/sessions/{other}"), &ann, None)
        .await;
    assert_eq!(other_session["file_ids"], json!([]));
    assert_eq!(
        code(
            &app,
            "GET",
            &format!("/v1/admin/users/{}/keys", ann.id),
            &browser,
            None
        )
        .await
        .0,
        StatusCode::FORBIDDEN
    );

    // A read-only token reads and cannot write.
    let (_, reader) = mint(&app, &ann, json!({"scopes": ["files:read"]})).await;
    let reader = bearer(&ann, &reader);
    assert_eq!(app.download(&reader, kept).await.status(), StatusCode::OK);
    assert_eq!(
        app.upload_raw(&reader, "x.txt", b"x".to_vec())
            .await
            .status(),
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        code(&app, "DELETE", &format!("/v1/files/{kept}"), &reader, None)
            .await
            .0,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        app.list_ids(&ann).await.len(),
        2,
        "nothing was deleted or added"
    );

    // Bad mints: 400 with a clear message, or 404 for what is not the caller's.
    let bob = app.create_user("bob").await;
    let bobs = app.new_session(&bob).await;
    for (body, want) in [
        (json!({"scopes": []}), StatusCode::BAD_REQUEST),
        (json!({"scopes": ["files:*"]}), StatusCode::BAD_REQUEST),
        (
            json!({"scopes": ["files:read"], "expires_in": 0}),
            StatusCode::BAD_REQUEST,
        ),
        (
            json!({"scopes": ["files:read"], "expires_in": 3601}),
            StatusCode::BAD_REQUEST,
        ),
        (
            json!({"scopes": ["sessions:write"], "session_id": bobs}),
            StatusCode::NOT_FOUND,
        ),
    ] {
        let (status, answer) = mint(&app, &ann, body.clone()).await;
        assert_eq!(status, want, "{body} → {answer}");
    }
    assert_eq!(
        app.metric("filedock_audit_events_total", "action=\"token_minted\"")
            .await,
        2.0
    );
}

#[tokio::test]
async fn a_token_is_refused_after_it_expires_and_after_its_key_is_revoked() {
    let app = spawn_app().await;
    let ann = app.create_user("ann").await;
    let (_, short) = mint(
        &app,
        &ann,
        json!({"scopes": ["files:read"], "expires_in": 1}),
    )
    .await;
    let short = bearer(&ann, &short);
    assert_eq!(
        code(&app, "GET", "/v1/files", &short, None).await.0,
        StatusCode::OK
    );
    tokio::time::sleep(Duration::from_millis(1300)).await;
    assert_eq!(
        code(&app, "GET", "/v1/files", &short, None).await,
        (StatusCode::UNAUTHORIZED, "unauthenticated".into()),
        "expired, though this instance remembers it"
    );

    let spare = admin_key_for(&app, &ann, "spare").await;
    let spare_user = TestUser {
        id: ann.id.clone(),
        key: spare["api_key"].as_str().unwrap().into(),
    };
    let (_, minted) = mint(
        &app,
        &spare_user,
        json!({"scopes": ["files:read", "files:write"]}),
    )
    .await;
    let minted = bearer(&ann, &minted);
    assert_eq!(
        code(&app, "GET", "/v1/files", &minted, None).await.0,
        StatusCode::OK
    );
    let (status, _) = app
        .json(
            "DELETE",
            format!(
                "/v1/admin/users/{}/keys/{}",
                ann.id,
                spare["id"].as_str().unwrap()
            ),
            &admin(),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert_eq!(
        code(&app, "GET", "/v1/files", &minted, None).await.0,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        app.upload_raw(&minted, "x.txt", b"x".to_vec())
            .await
            .status(),
        StatusCode::UNAUTHORIZED
    );
    // The user's other key and its tokens are untouched.
    let (_, kept) = mint(&app, &ann, json!({"scopes": ["files:read"]})).await;
    assert_eq!(
        code(&app, "GET", "/v1/files", &bearer(&ann, &kept), None)
            .await
            .0,
        StatusCode::OK
    );
}

#[tokio::test]
async fn a_write_token_uploads_resumably_as_a_browser_widget_does() {
    let app = spawn_app().await;
    let ann = app.create_user("ann").await;
    let (_, token) = mint(
        &app,
        &ann,
        json!({"scopes": ["files:write"], "expires_in": 900}),
    )
    .await;
    let token = token["token"].as_str().unwrap();
    let body = b"resumable via a token".to_vec();
    let res = app
        .client
        .post(app.url("/v1/uploads"))
        .bearer_auth(token)
        .header("Tus-Resumable", "1.0.0")
        .header("Upload-Length", body.len().to_string())
        .header("Upload-Metadata", "filename dG9rZW4udHh0")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    let location = res.headers()["location"].to_str().unwrap().to_owned();
    let url = if location.starts_with("http") {
        location
    } else {
        app.url(&location)
    };
    let res = app
        .client
        .patch(url)
        .bearer_auth(token)
        .header("Tus-Resumable", "1.0.0")
        .header("Upload-Offset", "0")
        .header("Content-Type", "application/offset+octet-stream")
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    let ids = app.list_ids(&ann).await;
    assert_eq!(ids.len(), 1);
    assert_eq!(
        app.download(&ann, &ids[0]).await.bytes().await.unwrap(),
        body
    );
}
