//! A small resumable upload on S3 is one object (issue 44): no multipart
//! upload, its one part a `PutObject` with `If-None-Match: *`. What that
//! must keep: a write whose object landed before its state moved is taken
//! as stored when the client sends the same bytes again; a late write never
//! overwrites a committed file; an object with other bytes is never
//! committed and goes with the upload (as its intent's orphan); an upload
//! as long as a part, whose part is stored before its checksum is checked,
//! is not one object. The S3 store's own behaviour: real stack only.

use base64::Engine;
use bytes::Bytes;
use filedock::{domain::sweeper::Outcome, meta::ResumableRecord};
use reqwest::StatusCode;
use sha2::{Digest, Sha256};

use crate::{
    helpers::*,
    tus::{TUS, content, create_typed, patch, patch_body},
};

const LEN: usize = 64 * 1024;

async fn record(app: &TestApp, user: &TestUser, id: &str) -> ResumableRecord {
    let meta = &app.state.ports.meta;
    let owner = user.id.parse().unwrap();
    let upload = meta.resumable(&owner, &id.parse().unwrap()).await;
    upload.unwrap().unwrap()
}

/// Stores `bytes` as the upload's one part, as a PATCH does.
async fn store_part(app: &TestApp, upload: &ResumableRecord, bytes: &[u8]) -> bool {
    let parts = &app.state.ports.resumable;
    let bytes = Bytes::copy_from_slice(bytes);
    let put = parts.put_part(&upload.key, &upload.handle, 1, 0, bytes);
    put.await.is_ok()
}

#[tokio::test]
async fn an_object_stored_before_its_state_moved_is_taken_as_stored() {
    if !real_backends() {
        return;
    }
    let app = spawn_app().await;
    let user = app.create_user("whole-again").await;
    let bytes = pseudo_random_bytes(LEN, 1);
    let id = create_typed(&app, &user, LEN, Some("application/octet-stream")).await;
    // A PATCH whose PutObject landed, and whose state update did not.
    let upload = record(&app, &user, &id).await;
    assert!(store_part(&app, &upload, &bytes).await);
    let again = patch(&app, &user, &id, 0, &bytes).await;
    assert_eq!(again.status(), StatusCode::NO_CONTENT);
    assert_eq!(content(&app, &user, &id).await, bytes);
    assert_bucket_matches_metadata(&app.state).await;
}

#[tokio::test]
async fn a_late_write_never_overwrites_a_committed_small_file() {
    if !real_backends() {
        return;
    }
    let app = spawn_app().await;
    let user = app.create_user("whole-late").await;
    let bytes = pseudo_random_bytes(LEN, 2);
    let id = create_typed(&app, &user, LEN, None).await;
    let upload = record(&app, &user, &id).await;
    let done = patch(&app, &user, &id, 0, &bytes).await;
    assert_eq!(done.status(), StatusCode::NO_CONTENT);
    // A PATCH that stalled past its lease, its PutObject landing now.
    let other = pseudo_random_bytes(LEN, 3);
    assert!(!store_part(&app, &upload, &other).await, "overwritten");
    assert_eq!(content(&app, &user, &id).await, bytes);
}

#[tokio::test]
async fn an_object_with_other_bytes_is_never_committed_and_goes_with_the_upload() {
    if !real_backends() {
        return;
    }
    let app = spawn_app().await;
    let user = app.create_user("whole-other").await;
    let id = create_typed(&app, &user, LEN, None).await;
    let upload = record(&app, &user, &id).await;
    assert!(store_part(&app, &upload, &pseudo_random_bytes(LEN, 4)).await);
    let sent = patch(&app, &user, &id, 0, &pseudo_random_bytes(LEN, 5)).await;
    // Another request's bytes: a conflict (409, try again), not a 500.
    assert_eq!(sent.status(), StatusCode::CONFLICT);
    let body: serde_json::Value = sent.json().await.unwrap();
    assert_eq!(body["error"]["code"], "write_conflict", "{body}");
    assert!(app.list_ids(&user).await.is_empty(), "committed");
    let ended = app
        .client
        .delete(format!("{}/v1/uploads/{id}", app.base))
        .bearer_auth(&user.key)
        .header("tus-resumable", TUS)
        .send()
        .await
        .unwrap();
    assert_eq!(ended.status(), StatusCode::NO_CONTENT);
    // The object goes as the ended upload's intent's orphan.
    // A pass of this test's own (not one the app's sweeper began before).
    while let Outcome::Busy = app.state.sweeper.run_once_now().await.unwrap() {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let left = app.state.ports.blobs.head(&upload.key).await.unwrap();
    assert_eq!(left, None, "the object stayed");
    assert_bucket_matches_metadata(&app.state).await;
}

#[tokio::test]
async fn a_part_long_upload_whose_checksum_failed_completes_when_sent_again() {
    if !real_backends() {
        return;
    }
    let app = spawn_app().await;
    let user = app.create_user("whole-checksum").await;
    // As long as a part: the part writer stores it before the body's end.
    let len = app.state.ports.resumable.part_size();
    let bytes = pseudo_random_bytes(len, 6);
    let id = create_typed(&app, &user, len, None).await;
    let b64 = base64::engine::general_purpose::STANDARD;
    let sum = |b: &[u8]| format!("sha256 {}", b64.encode(Sha256::digest(b)));
    // A body changed on its way: its checksum, the right bytes', fails.
    let mut changed = bytes.clone();
    changed[len / 2] ^= 1;
    let bad = patch_body(&app, &user, &id, 0, changed.into(), Some(sum(&bytes)));
    assert_eq!(bad.await.unwrap().status().as_u16(), 460);
    let good = patch_body(&app, &user, &id, 0, bytes.clone().into(), Some(sum(&bytes)));
    let good = good.await.unwrap();
    assert_eq!(good.status(), StatusCode::NO_CONTENT);
    assert_eq!(content(&app, &user, &id).await, bytes);
}
