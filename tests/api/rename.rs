//! Renaming a file (`PATCH /v1/files/{id} {"name"}`): the upload's name
//! rule, the owner only, and ordered with the owner's other writes — many
//! at once all land, and a rename racing a delete never brings a file back.

use std::collections::HashMap;

use futures::future::join_all;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::*;

/// `PATCH /v1/files/{id}` with `body`: status and JSON body.
async fn rename(app: &TestApp, user: &TestUser, id: &str, body: Value) -> (StatusCode, Value) {
    app.json("PATCH", format!("/v1/files/{id}"), user, Some(body))
        .await
}

fn id_of(file: &Value) -> String {
    file["id"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn a_rename_changes_the_name_and_nothing_else() {
    let app = spawn_app().await;
    let u = app.create_user("u").await;
    let bytes = b"the same bytes".to_vec();
    let file = app.upload_json(&u, "draft.txt", bytes.clone()).await;
    let id = id_of(&file);

    let (status, renamed) = rename(&app, &u, &id, json!({"name": "final report.txt"})).await;
    assert_eq!(status, StatusCode::OK, "{renamed}");
    let mut expected = file.clone();
    expected["filename"] = "final report.txt".into();
    assert_eq!(renamed, expected, "only the name changed");
    let (_, got) = app.json("GET", format!("/v1/files/{id}"), &u, None).await;
    assert_eq!(got, expected, "what the rename returned is what is stored");
    let res = app.download(&u, &id).await;
    assert!(
        res.headers()["content-disposition"]
            .to_str()
            .unwrap()
            .contains("filename=\"final report.txt\""),
        "downloads carry the new name"
    );
    assert_eq!(res.bytes().await.unwrap().as_ref(), bytes.as_slice());

    // The upload's name rule: stored NFC-normalised, refused with 400 otherwise.
    let (status, nfc) = rename(&app, &u, &id, json!({"name": "cafe\u{301}.txt"})).await;
    assert_eq!(
        (status, &nfc["filename"]),
        (StatusCode::OK, &json!("caf\u{e9}.txt"))
    );
    for bad in [
        json!({"name": ""}),
        json!({"name": "a/b.txt"}),
        json!({"name": ".."}),
        json!({"name": "evil\u{202e}txt.exe"}),
        json!({"name": "x".repeat(256)}),
        json!({"filename": "wrong-field.txt"}),
        json!({"name": 7}),
    ] {
        let (status, body) = rename(&app, &u, &id, bad.clone()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {body}");
        assert_eq!(body["error"]["code"], "invalid_request");
    }
    let (status, body) = rename(&app, &u, &id, json!({"name": "x".repeat(70_000)})).await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (StatusCode::PAYLOAD_TOO_LARGE, &json!("payload_too_large")),
        "a JSON body over 64 KiB"
    );
    let (_, got) = app.json("GET", format!("/v1/files/{id}"), &u, None).await;
    assert_eq!(
        got["filename"], "caf\u{e9}.txt",
        "a refused rename changes nothing"
    );

    // Someone else's file, an unknown one and a malformed id look the same.
    let other = app.create_user("other").await;
    let unknown = uuid::Uuid::now_v7().to_string();
    for (who, target) in [(&other, id.as_str()), (&u, &unknown), (&u, "nope")] {
        let (status, body) = rename(&app, who, target, json!({"name": "mine.txt"})).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{target}: {body}");
        assert_eq!(body["error"]["code"], "not_found");
    }
    let (_, got) = app.json("GET", format!("/v1/files/{id}"), &u, None).await;
    assert_eq!(got["filename"], "caf\u{e9}.txt");
}

#[tokio::test]
async fn concurrent_renames_and_uploads_by_one_user_all_land_with_exact_usage() {
    let app = spawn_app().await;
    let u = app.create_user("busy").await;
    let n = 30;
    let mut sizes = HashMap::new();
    let mut originals = Vec::new();
    for i in 0..n {
        let file = app.upload_json(&u, "old.txt", vec![b'o'; i + 1]).await;
        sizes.insert(id_of(&file), i + 1);
        originals.push(id_of(&file));
    }
    // Renames of every original and as many new uploads, all at once.
    let renames = originals
        .iter()
        .enumerate()
        .map(|(i, id)| rename(&app, &u, id, json!({"name": format!("renamed-{i}.txt")})));
    let names: Vec<String> = (0..n).map(|i| format!("new-{i}.txt")).collect();
    let uploads = (0..n).map(|i| app.upload_raw(&u, &names[i], vec![b'n'; 100 + i]));
    let (renamed, uploaded) = tokio::join!(join_all(renames), join_all(uploads));
    for (status, body) in &renamed {
        assert_eq!(*status, StatusCode::OK, "{body}");
    }
    let mut expected_names = HashMap::new();
    for (i, id) in originals.iter().enumerate() {
        expected_names.insert(id.clone(), format!("renamed-{i}.txt"));
    }
    for (i, res) in uploaded.into_iter().enumerate() {
        assert_eq!(res.status(), StatusCode::CREATED);
        let file: Value = res.json().await.unwrap();
        sizes.insert(id_of(&file), 100 + i);
        expected_names.insert(id_of(&file), format!("new-{i}.txt"));
    }

    let listed: HashMap<String, String> = app
        .list_pages(&u, "/v1/files", "files", 17)
        .await
        .concat()
        .iter()
        .map(|f| (id_of(f), f["filename"].as_str().unwrap().to_owned()))
        .collect();
    assert_eq!(
        listed, expected_names,
        "every file once, each with its own name"
    );
    let (_, me) = app.json("GET", "/v1/me", &u, None).await;
    let total: usize = sizes.values().sum();
    assert_eq!(
        me["usage"]["used_bytes"], total,
        "usage counts each file once"
    );
    assert_eq!(me["usage"]["file_count"], 2 * n);
    let user = app
        .state
        .ports
        .meta
        .user(&u.user_id())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        user.file_count,
        2 * n as i64,
        "the user counts each file once"
    );
    assert_eq!(assert_bucket_matches_metadata(&app.state).await, 2 * n);
}

#[tokio::test]
async fn a_rename_racing_a_delete_is_applied_first_or_finds_nothing() {
    let app = spawn_app().await;
    let u = &app.create_user("racer").await;
    let n = 30;
    let mut ids = Vec::new();
    for i in 0..n + 2 {
        ids.push(id_of(
            &app.upload_json(u, "doomed.txt", vec![b'd'; i + 1]).await,
        ));
    }
    // Both orders, one after the other: a rename that comes first is
    // applied and the delete still removes the file; one that comes after
    // finds nothing, and the file does not come back.
    let (before, after) = (ids.pop().unwrap(), ids.pop().unwrap());
    let renamed = rename(&app, u, &before, json!({"name": "first.txt"})).await;
    assert_eq!(renamed.0, StatusCode::OK, "{}", renamed.1);
    let (deleted, _) = app
        .json("DELETE", format!("/v1/files/{before}"), u, None)
        .await;
    assert_eq!(deleted, StatusCode::NO_CONTENT);
    let (deleted, _) = app
        .json("DELETE", format!("/v1/files/{after}"), u, None)
        .await;
    assert_eq!(deleted, StatusCode::NO_CONTENT);
    let late = rename(&app, u, &after, json!({"name": "late.txt"})).await;
    assert_eq!(late.0, StatusCode::NOT_FOUND, "{}", late.1);
    assert_eq!(late.1["error"]["code"], "not_found");
    let n = ids.len();
    // Then racing.
    let app = &app;
    let races = ids.iter().map(|id| async move {
        let delete = app.json("DELETE", format!("/v1/files/{id}"), u, None);
        let rename = rename(app, u, id, json!({"name": "survivor.txt"}));
        let ((deleted, _), (renamed, body)) = tokio::join!(delete, rename);
        (deleted, renamed, body)
    });
    let mut applied = 0;
    for (deleted, renamed, body) in join_all(races).await {
        assert_eq!(deleted, StatusCode::NO_CONTENT, "every delete lands");
        match renamed {
            StatusCode::OK => applied += 1,
            StatusCode::NOT_FOUND => assert_eq!(body["error"]["code"], "not_found"),
            other => panic!("a rename racing a delete answered {other}: {body}"),
        }
    }
    eprintln!(
        "{n} renames racing deletes: {applied} applied first, {} found nothing",
        n - applied
    );
    for id in ids.iter().chain([&before, &after]) {
        let (status, _) = app.json("GET", format!("/v1/files/{id}"), u, None).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{id} came back");
    }
    assert!(app.list_ids(u).await.is_empty(), "nothing listed");
    let (_, me) = app.json("GET", "/v1/me", u, None).await;
    assert_eq!(me["usage"]["used_bytes"], 0);
    assert_eq!(me["usage"]["file_count"], 0);
    let records = app
        .state
        .ports
        .meta
        .list_files(&u.user_id(), None, 100)
        .await
        .unwrap();
    assert!(
        records.is_empty(),
        "no file record resurrected: {records:?}"
    );
}

#[tokio::test]
async fn a_browser_on_an_allowed_origin_may_rename() {
    let mut settings = test_settings();
    settings.cors_origins = vec!["http://app.example".into()];
    let app = spawn_app_with(settings).await;
    let id = uuid::Uuid::now_v7();
    let res = app
        .client
        .request(
            reqwest::Method::OPTIONS,
            app.url(&format!("/v1/files/{id}")),
        )
        .header("origin", "http://app.example")
        .header("access-control-request-method", "PATCH")
        .header(
            "access-control-request-headers",
            "authorization, content-type",
        )
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let allowed = res.headers()["access-control-allow-methods"]
        .to_str()
        .unwrap();
    assert!(allowed.contains("PATCH"), "the preflight allows {allowed}");
}
