//! Many uploads by one user at once, in one size category and across them:
//! every one lands once.

use std::collections::HashSet;

use futures::future::join_all;
use reqwest::StatusCode;
use serde_json::Value;

use crate::helpers::*;

#[tokio::test]
async fn concurrent_uploads_by_one_user_all_land_once() {
    let app = spawn_app().await;
    let u = app.create_user("busy").await;
    let uploads =
        (0..50).map(|i| app.upload_raw(&u, "same-name.txt", format!("file {i}").into_bytes()));
    let mut created = Vec::new();
    for res in join_all(uploads).await {
        assert_eq!(res.status(), StatusCode::CREATED);
        let v: Value = res.json().await.unwrap();
        created.push(v["id"].as_str().unwrap().to_owned());
    }
    let listed = app.list_ids(&u).await;
    assert_eq!(listed.len(), 50, "nothing lost, nothing doubled");
    assert_eq!(
        listed.iter().collect::<HashSet<_>>(),
        created.iter().collect::<HashSet<_>>()
    );
    let user = app
        .state
        .ports
        .meta
        .user(&u.user_id())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(user.file_count, 50, "each file counted once on the user");
    assert_eq!(app.blob_keys(&u).await.len(), 50);
}

#[tokio::test]
async fn uploads_spanning_categories_all_commit_once() {
    // Small uploads (declared length) and streamed ones (no length → large)
    // take different category locks, and their commits write one user
    // document: the user's commit lock serializes them (without it, most runs
    // lost an upload to `write_conflict` after three attempts); any conflict
    // left is retried and counted.
    let app = spawn_app().await;
    let u = app.create_user("mixed").await;
    let n = 100;
    let payload = |i: usize| format!("payload {i}").into_bytes();
    let uploads = (0..n).map(|i| {
        let req = app
            .client
            .post(app.url("/v1/files?filename=f.txt"))
            .bearer_auth(&u.key);
        if i % 2 == 0 {
            req.body(payload(i)).send()
        } else {
            let chunk = Ok::<_, std::io::Error>(payload(i));
            req.body(reqwest::Body::wrap_stream(futures::stream::iter([chunk])))
                .send()
        }
    });
    let mut categories = HashSet::new();
    let mut created = Vec::new();
    for (i, res) in join_all(uploads).await.into_iter().enumerate() {
        let res = res.unwrap();
        let status = res.status();
        let v: Value = res.json().await.unwrap();
        assert_eq!(status, StatusCode::CREATED, "{v}");
        categories.insert(v["category"].as_str().unwrap().to_owned());
        created.push((
            v["id"].as_str().unwrap().to_owned(),
            sha256_hex(&payload(i)),
        ));
    }
    assert_eq!(categories.len(), 2);
    let user = app
        .state
        .ports
        .meta
        .user(&u.user_id())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(user.file_count, n as i64, "each file counted once");
    let listed = app.list_ids(&u).await;
    assert_eq!(listed.len(), n);
    assert_eq!(
        listed.iter().collect::<HashSet<_>>(),
        created.iter().map(|(id, _)| id).collect::<HashSet<_>>()
    );
    for (id, sha) in &created {
        let body = app.download(&u, id).await.bytes().await.unwrap();
        assert_eq!(&sha256_hex(&body), sha, "blob of {id}");
    }
    assert_eq!(app.blob_keys(&u).await.len(), n, "no stray blob");
    // `op="commit_upload` also matches group commits (`commit_upload_group`).
    let conflicts = app
        .metric("filedock_txn_write_conflicts_total", "op=\"commit_upload")
        .await;
    let run = app.metric("filedock_upload_commit_txns_total", "").await;
    let committed = app
        .metric("filedock_uploads_total", "outcome=\"committed\"")
        .await;
    let grouped = app.metric("filedock_uploads_grouped_total", "").await;
    eprintln!(
        "{n} uploads over two lock categories: {run} commit transactions, {conflicts} WriteConflict retries, {grouped} uploads grouped"
    );
    assert_eq!(committed, n as f64, "each upload committed once");
    // Every transaction run either committed (one upload alone, or a group
    // of several) or was a conflict retried: those that committed a group
    // are what is left, and a group holds 2 to 32 uploads. A conflict that
    // was retried but not counted makes too many groups for the uploads
    // grouped.
    let alone = n as f64 - grouped;
    let groups = run - conflicts - alone;
    assert!(
        groups >= (grouped / GROUP_MAX).ceil() && groups <= grouped / 2.0,
        "{run} transactions less {conflicts} retries and {alone} lone commits leave {groups} groups for {grouped} grouped uploads"
    );
}

/// The most uploads one group commit takes (the default `FILEDOCK_UPLOAD_GROUP_MAX`).
const GROUP_MAX: f64 = 32.0;
