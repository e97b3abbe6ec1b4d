//! A user's own records (sessions, agents, tokens, keys) are created in one
//! transaction with a write of the user's document, so that none can slip
//! past the user's deletion. That write runs as every other write of the
//! document does, under the user's commit lock: a burst of creates starves
//! neither the user's uploads nor the admin's deletion into a write
//! conflict, and every create is answered created or, once the deletion
//! began, refused.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use futures::future::join_all;
use reqwest::StatusCode;
use serde_json::json;

use crate::helpers::*;

/// Clients creating at once, for as long as the uploads and the deletion take.
const CREATORS: usize = 8;
const UPLOADS: usize = 12;

#[tokio::test]
async fn a_burst_of_creates_starves_neither_uploads_nor_the_deletion() {
    let app = Arc::new(spawn_app().await);
    let ann = Arc::new(app.create_user("ann").await);
    let stop = Arc::new(AtomicBool::new(false));
    let creators: Vec<_> = (0..CREATORS)
        .map(|i| {
            let (app, ann, stop) = (app.clone(), ann.clone(), stop.clone());
            tokio::spawn(async move {
                let (path, body) = match i % 3 {
                    0 => ("/v1/sessions", json!({})),
                    1 => ("/v1/agents", json!({"name": "a"})),
                    _ => ("/v1/tokens", json!({"scopes": ["files:write"]})),
                };
                let mut answers = Vec::new();
                while !stop.load(Ordering::SeqCst) {
                    let req = app.client.post(app.url(path)).bearer_auth(&ann.key);
                    let res = req.json(&body).send().await.unwrap();
                    answers.push((path, res.status()));
                }
                answers
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;

    let uploads =
        (0..UPLOADS).map(|i| app.upload_raw(&ann, "f.txt", format!("file {i}").into_bytes()));
    let statuses: Vec<StatusCode> = join_all(uploads).await.iter().map(|r| r.status()).collect();
    let path = format!("/v1/admin/users/{}", ann.id);
    let deleted = (app.client.delete(app.url(&path)))
        .bearer_auth(ADMIN_KEY)
        .send()
        .await
        .unwrap();
    let deleted = deleted.status();
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.store(true, Ordering::SeqCst);
    let answers: Vec<_> = join_all(creators)
        .await
        .into_iter()
        .flat_map(Result::unwrap)
        .collect();

    assert!(
        statuses.iter().all(|s| *s == StatusCode::CREATED),
        "uploads: {statuses:?}"
    );
    assert_eq!(deleted, StatusCode::ACCEPTED, "the deletion");
    let created = answers
        .iter()
        .filter(|(_, s)| *s == StatusCode::CREATED)
        .count();
    let wrong: Vec<_> = (answers.iter())
        .filter(|(_, s)| !matches!(*s, StatusCode::CREATED | StatusCode::UNAUTHORIZED))
        .collect();
    assert!(
        wrong.is_empty(),
        "creates neither made nor refused: {wrong:?}"
    );
    assert!(
        created >= CREATORS,
        "too few creates to prove anything: {created}"
    );
}
