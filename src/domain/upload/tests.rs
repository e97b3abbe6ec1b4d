//! The upload service and the committer on the embedded adapters.

use std::time::Duration;

use super::{Commit, Hold, NewUpload, OnDrop, Refusal, StoredBlob};
use crate::{
    domain::{
        DomainError,
        test_kit::{Kit, body, sha256, stalled},
    },
    lock::Held,
    meta::{CleanupRepo, UserRecord},
    vocab::{BlobKey, Filename, IdempotencyKey, LockKey, SizeCategory},
};

fn new_upload(name: &str, body: crate::blob::ByteStream<'static>) -> NewUpload<'static> {
    NewUpload {
        filename: Filename::parse(name).unwrap(),
        content_type: "text/plain".into(),
        declared_len: None,
        body,
        idempotency_key: None,
        expected_digest: None,
    }
}

async fn upload(
    kit: &Kit,
    user: &UserRecord,
    new: NewUpload<'static>,
) -> Result<super::Uploaded, DomainError> {
    let slot = kit.uploads.reserve(user)?;
    kit.uploads.upload(slot, user, new).await
}

#[tokio::test]
async fn an_upload_commits_its_file_blob_and_usage_and_leaves_no_intent() {
    let kit = Kit::new(|_| {}).await;
    let user = kit.user("ann").await;
    let up = upload(
        &kit,
        &user,
        new_upload("a.txt", body(&[b"hello ", b"world"])),
    )
    .await
    .unwrap();
    assert!(!up.replayed);
    assert_eq!(up.file.sha256, sha256(b"hello world"));
    assert_eq!(up.file.key, BlobKey::file(user.id, up.file.id));
    assert_eq!(kit.read(&up.file.key).await, b"hello world");
    assert_eq!(kit.files(&user).await, vec![up.file]);
    assert_eq!(kit.stored(&user).await.used_bytes, 11);
    assert_eq!(kit.intents().await, 0);
}

#[tokio::test]
async fn a_refused_commit_undoes_the_upload() {
    let kit = Kit::new(|s| s.user_quota_bytes = Some(4)).await;
    let user = kit.user("bob").await;
    // No declared length: the body runs into the quota while it streams.
    let refused = upload(&kit, &user, new_upload("big.txt", body(&[b"0123456789"]))).await;
    assert!(
        matches!(refused, Err(DomainError::QuotaExceeded)),
        "{refused:?}"
    );
    assert!(kit.files(&user).await.is_empty());
    assert!(kit.objects(&user).await.is_empty(), "the blob is gone");
    assert_eq!(kit.intents().await, 0, "and its intent");
}

#[tokio::test]
async fn a_repeated_idempotency_key_replays_the_first_upload_and_a_different_body_is_refused() {
    let kit = Kit::new(|_| {}).await;
    let user = kit.user("cy").await;
    let keyed = |b: &'static [u8]| NewUpload {
        idempotency_key: Some(IdempotencyKey::parse("k-1").unwrap()),
        ..new_upload("k.txt", body(&[b]))
    };
    let first = upload(&kit, &user, keyed(b"same")).await.unwrap();
    let again = upload(&kit, &user, keyed(b"same")).await.unwrap();
    assert!(again.replayed);
    assert_eq!(again.file.id, first.file.id);
    let other = upload(&kit, &user, keyed(b"different")).await;
    assert!(matches!(other, Err(DomainError::IdempotencyKeyMismatch)));
    assert_eq!(kit.files(&user).await.len(), 1);
}

/// The drop guard: an upload whose future is dropped while its body still
/// streams (its client went away, the server stops) is undone at once
/// rather than left for the sweeper's grace period.
#[tokio::test]
async fn an_upload_dropped_while_its_body_streams_is_undone_at_once() {
    let kit = Kit::new(|_| {}).await;
    let user = kit.user("dee").await;
    let slot = kit.uploads.reserve(&user).unwrap();
    let running = kit
        .uploads
        .upload(slot, &user, new_upload("s.txt", stalled(b"first bytes")));
    let dropped = tokio::time::timeout(Duration::from_millis(300), running).await;
    assert!(dropped.is_err(), "the body never ends");
    wait_for(|| async { kit.intents().await == 0 }).await;
    assert!(kit.files(&user).await.is_empty());
}

/// The guard's "outcome unknown" state: an upload dropped once its commit
/// is on its way must not delete its blob, since the commit may still
/// apply — here it does, by the group committer, after the drop.
#[tokio::test]
async fn an_upload_dropped_while_its_commit_is_on_its_way_keeps_its_blob() {
    let kit = Kit::new(|s| s.upload_group_commit = true).await;
    let user = kit.user("eve").await;
    // The user's commit lock is held: the commit waits for it.
    let held = kit.locks.acquire(&LockKey::user_commit(&user.id)).await;
    let held = match held {
        Ok(h @ Held::Locked(_)) => h,
        _ => panic!("no lock"),
    };
    let slot = kit.uploads.reserve(&user).unwrap();
    let running = kit.uploads.upload(
        slot,
        &user,
        new_upload("c.txt", body(&[b"committed later"])),
    );
    let dropped = tokio::time::timeout(Duration::from_millis(500), running).await;
    assert!(dropped.is_err(), "the commit waits for the lock");
    held.release().await;
    wait_for(|| async { kit.files(&user).await.len() == 1 }).await;
    let file = kit.files(&user).await.remove(0);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        kit.read(&file.key).await,
        b"committed later",
        "its blob stayed"
    );
    assert_eq!(kit.intents().await, 0);
}

/// The committer undoes nothing: a refusal leaves the blob to its caller.
#[tokio::test]
async fn a_commit_refused_because_its_intent_was_swept_leaves_the_blob_to_the_caller() {
    let kit = Kit::new(|_| {}).await;
    let user = kit.user("fay").await;
    let intent = kit.committer.new_intent(user.id);
    let mut staged = kit.committer.stage(intent, OnDrop::Keep).await.unwrap();
    let key = staged.intent().key;
    {
        use crate::blob::BlobStore;
        kit.blobs.put(&key, body(&[b"bytes"])).await.unwrap();
    }
    // The sweeper took it for a dead upload's.
    kit.meta
        .delete_intent(&user.id, &staged.file_id())
        .await
        .unwrap();
    let stored = StoredBlob {
        filename: Filename::parse("late.txt").unwrap(),
        content_type: "text/plain".into(),
        size: 5,
        sha256: sha256(b"bytes"),
        category: SizeCategory::Small,
        idempotency_key: None,
        resumable: false,
        state: None,
    };
    let hold = Hold::none(SizeCategory::Small);
    match kit.committer.commit(&mut staged, hold, stored).await {
        Commit::Refused(Refusal::Error(DomainError::UploadExpired)) => {}
        _ => panic!("expected a refusal: the intent is gone"),
    }
    assert_eq!(
        staged.on_drop(),
        OnDrop::Keep,
        "the caller's choice is back"
    );
    assert_eq!(kit.read(&key).await, b"bytes", "nothing undone");
    staged.undo().await;
    assert!(kit.objects(&user).await.is_empty(), "undone when asked");
}

/// Waits (at most 10 s) until `done`.
async fn wait_for<F, Fut>(done: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for _ in 0..200 {
        if done().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("not within 10 s");
}
