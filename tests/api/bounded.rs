//! Nothing a user or container holds grows without a bound (issue 22): a
//! user's files are counted, not listed on the user (the `files` collection
//! is the list), with users of the old shape migrated at start-up; a
//! session's or agent's lists stop at `FILEDOCK_MAX_CONTAINER_ITEMS`.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{TestApp, TestUser, error_code, real_backends, spawn_app_with, test_settings};

/// Rewrites `user`'s document to the shape before issue 22, `file_ids`
/// holding `ids`, with a stale `file_count` beside it (as an instance of each
/// shape writing to one document would leave it).
pub(crate) async fn make_old_shape(
    settings: &filedock::config::Settings,
    user: &TestUser,
    ids: &[String],
) {
    if real_backends() {
        let uri = std::env::var("FILEDOCK_TEST_MONGODB_URI").unwrap();
        let client = mongodb::Client::with_uri_str(uri).await.unwrap();
        let users = client
            .database(&settings.mongodb_db)
            .collection::<bson::Document>("users");
        let done = users
            .update_one(
                bson::doc! {"_id": &user.id},
                bson::doc! {"$set": {"file_ids": ids, "file_count": 99_i64}},
            )
            .await
            .unwrap();
        assert_eq!(done.modified_count, 1);
    } else {
        let store = filedock::meta::embedded::EmbeddedStore::open(&settings.data_dir).unwrap();
        let mut tx = store.begin().unwrap();
        let key = format!("users/{}", user.id);
        let mut doc: Value = tx.get(&key).unwrap().unwrap();
        doc["file_count"] = json!(99);
        doc["file_ids"] = json!(ids);
        tx.put(&key, &doc).unwrap();
        tx.commit(&store).unwrap();
    }
}

async fn file_count(app: &TestApp, user: &TestUser) -> (i64, i64) {
    let me = get(app, user, "/v1/me").await;
    let stored = app
        .state
        .ports
        .meta
        .user(&user.user_id())
        .await
        .unwrap()
        .unwrap();
    (
        me["usage"]["file_count"].as_i64().unwrap(),
        stored.file_count,
    )
}

#[tokio::test]
async fn users_of_the_old_shape_are_migrated_at_start_up_once() {
    let app = spawn_app_with(test_settings()).await;
    let u = app.create_user("old-shape").await;
    let mut ids = Vec::new();
    for i in 0..3 {
        let v = app
            .upload_json(&u, &format!("f{i}.txt"), vec![b'x'; 10])
            .await;
        ids.push(v["id"].as_str().unwrap().to_owned());
    }
    let settings = app.stop().await;
    // The array misses a file, the counter is wrong: the files are the truth.
    make_old_shape(&settings, &u, &ids[..2]).await;

    let app = spawn_app_with(settings).await;
    assert_eq!(file_count(&app, &u).await, (3, 3), "counted from the files");
    // The counter moves with uploads and deletes from there.
    let v = app.upload_json(&u, "f3.txt", vec![b'y'; 10]).await;
    let res = app
        .client
        .delete(app.url(&format!("/v1/files/{}", ids[0])))
        .bearer_auth(&u.key)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    assert_eq!(file_count(&app, &u).await, (3, 3));
    assert!(v["id"].is_string());
    // A second start finds nothing to migrate and changes nothing.
    let settings = app.stop().await;
    let app = spawn_app_with(settings).await;
    assert_eq!(file_count(&app, &u).await, (3, 3), "migrated once");
    assert_eq!(app.list_ids(&u).await.len(), 3);
}

async fn post(app: &TestApp, user: &TestUser, path: &str, body: Value) -> reqwest::Response {
    app.client
        .post(app.url(path))
        .bearer_auth(&user.key)
        .json(&body)
        .send()
        .await
        .unwrap()
}

async fn get(app: &TestApp, user: &TestUser, path: &str) -> Value {
    let res = app
        .client
        .get(app.url(path))
        .bearer_auth(&user.key)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    res.json().await.unwrap()
}

/// 12 attaches to a session of at most 5 files, all at once, then more of the
/// same: exactly 5 apply, the rest are 409 `container_full` and change
/// nothing, re-attaching one it holds still succeeds, and a detach makes room.
#[tokio::test]
async fn a_session_holds_at_most_max_container_items_files_under_concurrency() {
    let mut settings = test_settings();
    settings.max_container_items = 5;
    let app = spawn_app_with(settings).await;
    let u = app.create_user("bounded").await;
    let mut files = Vec::new();
    for i in 0..12 {
        let v = app
            .upload_json(&u, &format!("f{i}.txt"), vec![b'z'; 4])
            .await;
        files.push(v["id"].as_str().unwrap().to_owned());
    }
    let session: Value = post(&app, &u, "/v1/sessions", json!({}))
        .await
        .json()
        .await
        .unwrap();
    let sid = session["id"].as_str().unwrap().to_owned();
    let path = format!("/v1/sessions/{sid}/files");
    let answers = futures::future::join_all(
        files
            .iter()
            .map(|f| post(&app, &u, &path, json!({"file_id": f}))),
    )
    .await;
    let mut attached = Vec::new();
    let mut full = 0;
    for (res, f) in answers.into_iter().zip(&files) {
        match res.status() {
            StatusCode::OK | StatusCode::CREATED | StatusCode::NO_CONTENT => {
                attached.push(f.clone())
            }
            _ => {
                assert_eq!(
                    error_code(res).await,
                    (StatusCode::CONFLICT, "container_full".into())
                );
                full += 1;
            }
        }
    }
    assert_eq!((attached.len(), full), (5, 7), "exactly the bound applies");
    let stored = get(&app, &u, &format!("/v1/sessions/{sid}")).await;
    let mut held: Vec<String> = serde_json::from_value(stored["file_ids"].clone()).unwrap();
    held.sort();
    attached.sort();
    assert_eq!(held, attached, "every 2xx applied, no refused one did");
    // Attaching one it holds changes nothing and is no refusal.
    let again = post(&app, &u, &path, json!({"file_id": attached[0]})).await;
    assert!(again.status().is_success(), "{}", again.status());
    // A detach makes room for one more.
    let res = app
        .client
        .delete(app.url(&format!("{path}/{}", attached[0])))
        .bearer_auth(&u.key)
        .send()
        .await
        .unwrap();
    assert!(res.status().is_success(), "{}", res.status());
    let newcomer = files.iter().find(|f| !attached.contains(f)).unwrap();
    let res = post(&app, &u, &path, json!({"file_id": newcomer})).await;
    assert!(res.status().is_success(), "{}", res.status());
    let stored = get(&app, &u, &format!("/v1/sessions/{sid}")).await;
    assert_eq!(stored["file_ids"].as_array().unwrap().len(), 5);
}

/// An agent's MCP list stops at the bound too, and a refused connect leaves
/// the list as it was (12 connects at once, 5 apply).
#[tokio::test]
async fn an_agent_holds_at_most_max_container_items_mcp_connections() {
    let mut settings = test_settings();
    settings.max_container_items = 5;
    let app = spawn_app_with(settings).await;
    let u = app.create_user("bounded-agent").await;
    let agent: Value = post(&app, &u, "/v1/agents", json!({"name": "a"}))
        .await
        .json()
        .await
        .unwrap();
    let aid = agent["id"].as_str().unwrap().to_owned();
    let names: Vec<String> = (0..12).map(|i| format!("mcp-{i}")).collect();
    let answers = futures::future::join_all(names.iter().map(|m| {
        app.client
            .put(app.url(&format!("/v1/agents/{aid}/mcps/{m}")))
            .bearer_auth(&u.key)
            .send()
    }))
    .await;
    let mut connected = Vec::new();
    for (res, m) in answers.into_iter().zip(&names) {
        let res = res.unwrap();
        if res.status().is_success() {
            connected.push(m.clone());
        } else {
            assert_eq!(
                error_code(res).await,
                (StatusCode::CONFLICT, "container_full".into())
            );
        }
    }
    assert_eq!(connected.len(), 5);
    let stored = get(&app, &u, &format!("/v1/agents/{aid}")).await;
    let mut held: Vec<String> = serde_json::from_value(stored["mcp_ids"].clone()).unwrap();
    held.sort();
    connected.sort();
    assert_eq!(held, connected);
}
