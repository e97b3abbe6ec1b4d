//! Upgrading a store written when a user had one key (issue 25): the key,
//! kept on the user (`api_key_hash`, and on the embedded store an
//! `api_keys/{hash}` index), is moved into the keys at start-up, once, so a
//! user created by the old code still authenticates, with one key listed.

use bson::doc;
use reqwest::StatusCode;
use serde_json::Value;

use crate::helpers::*;

fn mongo_uri() -> String {
    std::env::var("FILEDOCK_TEST_MONGODB_URI").unwrap()
}

/// Rewrites `user`'s keys into the old shape: the one key on the user, no
/// key records; with `file_ids`, their files too into the shape before
/// issue 22 (as `bounded::make_old_shape` does; in the same write on the
/// embedded store, whose every opening migrates what it finds).
async fn write_old_shape(
    settings: &filedock::config::Settings,
    user: &TestUser,
    file_ids: Option<&[String]>,
) {
    let hash = sha256_hex(user.key.as_bytes());
    if real_backends() {
        if let Some(ids) = file_ids {
            crate::bounded::make_old_shape(settings, user, ids).await;
        }
        let client = mongodb::Client::with_uri_str(mongo_uri()).await.unwrap();
        let db = client.database(&settings.mongodb_db);
        db.collection::<bson::Document>("api_keys")
            .delete_many(doc! {"user_id": &user.id})
            .await
            .unwrap();
        db.collection::<bson::Document>("users")
            .update_one(
                doc! {"_id": &user.id},
                doc! {"$set": {"api_key_hash": &hash}},
            )
            .await
            .unwrap();
        return;
    }
    let store = filedock::meta::embedded::EmbeddedStore::open(&settings.data_dir).unwrap();
    let mut tx = store.begin().unwrap();
    for index in tx
        .keys(&format!("user_keys/{}/", user.id), None, 10)
        .unwrap()
    {
        tx.delete(&index);
    }
    tx.delete(&format!("keys/{hash}"));
    tx.put(&format!("api_keys/{hash}"), &user.id).unwrap();
    let ukey = format!("users/{}", user.id);
    let mut doc: Value = tx.get(&ukey).unwrap().unwrap();
    doc["api_key_hash"] = hash.into();
    if let Some(ids) = file_ids {
        doc["file_ids"] = ids.into();
        doc["file_count"] = 99.into();
    }
    tx.put(&ukey, &doc).unwrap();
    tx.commit(&store).unwrap();
}

/// The old code's unique index on `users.api_key_hash` (which the new code
/// drops), once every user has the old shape (a user without the field
/// would be a duplicate of `null`).
async fn create_old_index(settings: &filedock::config::Settings) {
    if !real_backends() {
        return;
    }
    let client = mongodb::Client::with_uri_str(mongo_uri()).await.unwrap();
    let users = client
        .database(&settings.mongodb_db)
        .collection::<bson::Document>("users");
    let unique = mongodb::options::IndexOptions::builder()
        .unique(true)
        .build();
    let index = mongodb::IndexModel::builder()
        .keys(doc! {"api_key_hash": 1})
        .options(unique)
        .build();
    users.create_index(index).await.unwrap();
}

/// The names of `user`'s keys as the store holds them.
async fn stored_keys(app: &TestApp, user: &TestUser) -> Vec<String> {
    let keys = app
        .state
        .ports
        .meta
        .keys(&user.user_id(), None, 1000)
        .await
        .unwrap();
    keys.into_iter().map(|k| k.name).collect()
}

async fn me(app: &TestApp, user: &TestUser) -> (StatusCode, Value) {
    app.json("GET", "/v1/me", user, None).await
}

#[tokio::test]
async fn a_user_created_with_one_key_still_authenticates_after_an_upgrade_and_a_second_start() {
    let app = spawn_app().await;
    let old = app.create_user("old").await;
    let (_, before) = me(&app, &old).await;
    let settings = app.stop().await;
    write_old_shape(&settings, &old, None).await;
    create_old_index(&settings).await;

    // The first start moves the key; the second finds nothing to move.
    let app = spawn_app_with(settings).await;
    let (status, after) = me(&app, &old).await;
    assert_eq!(status, StatusCode::OK, "{after}");
    assert_eq!(after["id"], before["id"]);
    assert_eq!(stored_keys(&app, &old).await, ["default"]);
    let (_, listed) = app.json("GET", "/v1/me/keys", &old, None).await;
    assert_eq!(listed["keys"][0]["created_at"], before["created_at"]);
    let settings = app.stop().await;

    let app = spawn_app_with(settings.clone()).await;
    assert_eq!(me(&app, &old).await.0, StatusCode::OK);
    assert_eq!(stored_keys(&app, &old).await, ["default"], "moved once");
    // New users are not refused by the old shape's unique index.
    let new = app.create_user("new").await;
    let other = app.create_user("newer").await;
    assert_eq!(me(&app, &new).await.0, StatusCode::OK);
    assert_eq!(me(&app, &other).await.0, StatusCode::OK);
    if !real_backends() {
        return;
    }
    let users = mongodb::Client::with_uri_str(mongo_uri())
        .await
        .unwrap()
        .database(&settings.mongodb_db)
        .collection::<bson::Document>("users");
    let left = users
        .count_documents(doc! {"api_key_hash": {"$exists": true}})
        .await
        .unwrap();
    assert_eq!(left, 0, "the old field is gone");
}

#[tokio::test]
async fn instances_starting_at_once_move_each_old_key_once() {
    if !real_backends() {
        return; // one process holds the embedded store
    }
    let app = spawn_app().await;
    let mut users = Vec::new();
    for i in 0..20 {
        users.push(app.create_user(&format!("old{i}")).await);
    }
    let settings = app.stop().await;
    for u in &users {
        write_old_shape(&settings, u, None).await;
    }
    create_old_index(&settings).await;
    let (a, b) = tokio::join!(
        spawn_app_with(settings.clone()),
        spawn_app_with(settings.clone())
    );
    for u in &users {
        assert_eq!(me(&a, u).await.0, StatusCode::OK);
        assert_eq!(me(&b, u).await.0, StatusCode::OK);
        assert_eq!(stored_keys(&a, u).await, ["default"]);
    }
    a.stop().await;
    b.stop().await;
}

/// A user of the shape before both issue 22 and issue 25 (a `file_ids`
/// array and one key on the user): start-up counts their files and moves
/// their key, each migration keeping what the other reads.
#[tokio::test]
async fn a_user_with_a_file_list_and_one_key_is_migrated_by_both_migrations() {
    let app = spawn_app().await;
    let old = app.create_user("oldest").await;
    let mut ids = Vec::new();
    for i in 0..2 {
        let v = app
            .upload_json(&old, &format!("f{i}.txt"), vec![b'o'; 10])
            .await;
        ids.push(v["id"].as_str().unwrap().to_owned());
    }
    let settings = app.stop().await;
    write_old_shape(&settings, &old, Some(&ids)).await;

    let app = spawn_app_with(settings).await;
    let (status, after) = me(&app, &old).await;
    assert_eq!(status, StatusCode::OK, "{after}");
    assert_eq!(after["usage"]["file_count"], 2, "{after}");
    assert_eq!(after["usage"]["used_bytes"], 20, "{after}");
    assert_eq!(stored_keys(&app, &old).await, ["default"]);
    let stored = app.state.ports.meta.user(&old.user_id()).await.unwrap();
    assert_eq!(stored.map(|u| u.file_count), Some(2));
    assert_eq!(app.list_ids(&old).await.len(), 2);
}
