//! What a frontend asks first: `GET /v1/me` (the user, their usage against
//! the quota, their uploads in flight) and the lists of their sessions and
//! agents, paged as files are.

use std::time::Duration;

use bytes::Bytes;
use reqwest::StatusCode;
use serde_json::Value;

use crate::helpers::*;

/// The caller's `/v1/me`.
async fn me(app: &TestApp, user: &TestUser) -> Value {
    let (status, me) = app.json("GET", "/v1/me", user, None).await;
    assert_eq!(status, StatusCode::OK, "{me}");
    me
}

#[tokio::test]
async fn me_shows_the_user_their_usage_against_the_quota_and_uploads_in_flight() {
    let mut settings = test_settings();
    settings.user_quota_bytes = Some(1000);
    let app = spawn_app_with(settings).await;
    let created =
        filedock::testing::create_user_json(&app.client, &app.base, ADMIN_KEY, "ann").await;
    let ann = TestUser {
        id: created["id"].as_str().unwrap().into(),
        key: created["api_key"].as_str().unwrap().into(),
    };
    let first = me(&app, &ann).await;
    assert_eq!(first["id"], created["id"]);
    assert_eq!(first["name"], "ann");
    assert!(first["created_at"].is_string());
    assert_eq!(
        first["usage"],
        serde_json::json!({
            "used_bytes": 0, "quota_bytes": 1000, "file_count": 0, "uploads_in_flight": 0,
            "reserved_bytes": 0, "open_uploads": 0, "max_open_uploads": 100,
        })
    );

    // Read from the store, not from the auth cache that authenticated the request.
    let a = app.upload_json(&ann, "a.txt", vec![b'a'; 100]).await;
    app.upload_json(&ann, "b.txt", vec![b'b'; 250]).await;
    let usage = &me(&app, &ann).await["usage"];
    assert_eq!(
        (&usage["used_bytes"], &usage["file_count"]),
        (&350.into(), &2.into())
    );

    // An upload still streaming counts as in flight, and only for its user.
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(1);
    tx.send(Ok(Bytes::from_static(b"first half ")))
        .await
        .unwrap();
    let body = reqwest::Body::wrap_stream(tokio_stream_of(rx));
    let streaming = tokio::spawn(upload_raw_at_owned(app.base.clone(), ann.key.clone(), body));
    let mut seen = 0;
    for _ in 0..200 {
        seen = me(&app, &ann).await["usage"]["uploads_in_flight"]
            .as_u64()
            .unwrap();
        if seen == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(seen, 1, "the streaming upload is in flight");
    let bob = app.create_user("bob").await;
    assert_eq!(me(&app, &bob).await["usage"]["uploads_in_flight"], 0);
    tx.send(Ok(Bytes::from_static(b"second half")))
        .await
        .unwrap();
    drop(tx);
    assert_eq!(streaming.await.unwrap(), StatusCode::CREATED);
    let usage = &me(&app, &ann).await["usage"];
    assert_eq!(usage["uploads_in_flight"], 0);
    assert_eq!(
        (&usage["used_bytes"], &usage["file_count"]),
        (&372.into(), &3.into())
    );

    let id = a["id"].as_str().unwrap();
    let (status, _) = app
        .json("DELETE", format!("/v1/files/{id}"), &ann, None)
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let usage = &me(&app, &ann).await["usage"];
    assert_eq!(
        (&usage["used_bytes"], &usage["file_count"]),
        (&272.into(), &2.into())
    );

    let res = app.client.get(app.url("/v1/me")).send().await.unwrap();
    assert_eq!(
        error_code(res).await,
        (StatusCode::UNAUTHORIZED, "unauthenticated".to_owned())
    );
}

#[tokio::test]
async fn without_a_quota_me_says_null() {
    let app = spawn_app().await;
    let u = app.create_user("free").await;
    assert_eq!(me(&app, &u).await["usage"]["quota_bytes"], Value::Null);
}

/// Uploads `body` raw; the answer's status.
pub(crate) async fn upload_raw_at_owned(
    base: String,
    key: String,
    body: reqwest::Body,
) -> StatusCode {
    filedock::testing::upload_raw_at(&reqwest::Client::new(), &base, &key, "s.txt", body)
        .await
        .status()
}

/// The chunks a channel receives, as a stream.
pub(crate) fn tokio_stream_of(
    rx: tokio::sync::mpsc::Receiver<Result<Bytes, std::io::Error>>,
) -> impl futures::Stream<Item = Result<Bytes, std::io::Error>> {
    futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|c| (c, rx)) })
}

#[tokio::test]
async fn sessions_and_agents_are_listed_in_pages_like_files() {
    let app = spawn_app().await;
    let (ann, bob) = (app.create_user("ann").await, app.create_user("bob").await);
    let mut sessions = Vec::new();
    for _ in 0..5 {
        sessions.push(app.new_session(&ann).await);
    }
    let mut agents = Vec::new();
    for _ in 0..3 {
        agents.push(app.new_agent(&ann).await);
    }
    let bobs = app.new_session(&bob).await;

    for (path, field, made) in [
        ("/v1/sessions", "sessions", &sessions),
        ("/v1/agents", "agents", &agents),
    ] {
        let pages = app.list_pages(&ann, path, field, 2).await;
        assert!(
            pages.iter().all(|p| p.len() <= 2),
            "{field}: at most the limit a page"
        );
        assert_eq!(
            pages.len(),
            made.len().div_ceil(2),
            "{field}: no empty page at the end"
        );
        let listed: Vec<&str> = pages
            .iter()
            .flatten()
            .map(|s| s["id"].as_str().unwrap())
            .collect();
        assert_eq!(listed, *made, "{field}: each once, oldest first");
        // An item in a list is the item as its own GET shows it.
        let one = &pages[0][0];
        let (status, got) = app
            .json(
                "GET",
                format!("{path}/{}", one["id"].as_str().unwrap()),
                &ann,
                None,
            )
            .await;
        assert_eq!((status, &got), (StatusCode::OK, one));

        for bad in ["limit=0", "limit=1001", "cursor=nope", "limit=x"] {
            let (status, body) = app.json("GET", format!("{path}?{bad}"), &ann, None).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{path}?{bad}: {body}");
            assert_eq!(body["error"]["code"], "invalid_request");
        }
    }
    let bob_sees = app
        .list_pages(&bob, "/v1/sessions", "sessions", 100)
        .await
        .concat();
    assert_eq!(bob_sees.len(), 1);
    assert_eq!(bob_sees[0]["id"], bobs.as_str());
    assert!(
        app.list_pages(&bob, "/v1/agents", "agents", 100)
            .await
            .concat()
            .is_empty()
    );
}

#[tokio::test]
async fn the_embedded_store_lists_sessions_made_before_lists_existed() {
    if real_backends() {
        return; // the owner index is the embedded store's own
    }
    let app = spawn_app().await;
    let u = app.create_user("old").await;
    let session = app.new_session(&u).await;
    let settings = app.stop().await;
    // A store from before the owner index: the index key is gone.
    {
        let store = filedock::meta::embedded::EmbeddedStore::open(&settings.data_dir).unwrap();
        let mut tx = store.begin().unwrap();
        tx.delete(&format!("owner_sessions/{}/{session}", u.id));
        tx.commit(&store).unwrap();
    }
    let app = spawn_app_with(settings).await;
    let listed = app
        .list_pages(&u, "/v1/sessions", "sessions", 10)
        .await
        .concat();
    assert_eq!(listed.len(), 1, "indexed again when the store opened");
    assert_eq!(listed[0]["id"], session.as_str());
}
