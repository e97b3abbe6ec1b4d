//! The resumable-upload service on the embedded adapters.

use std::time::Duration;

use super::{Checksum, NewResumable, Patched, ResumableError};
use crate::{
    domain::{
        DomainError,
        test_kit::{Kit, body, sha256},
    },
    meta::{ResumableRecord, UserRecord},
    vocab::{Filename, LockKey, SizeCategory},
};

async fn create(kit: &Kit, user: &UserRecord, length: u64) -> ResumableRecord {
    let new = NewResumable {
        length: Some(length),
        filename: Filename::parse("r.bin").unwrap(),
        content_type: "text/plain".into(),
        metadata: String::new(),
    };
    kit.resumables.create(user, new).await.unwrap()
}

#[tokio::test]
async fn patches_append_and_the_last_one_commits_the_file() {
    let kit = Kit::new(|_| {}).await;
    let user = kit.user("ann").await;
    let up = create(&kit, &user, 11).await;
    let first = kit
        .resumables
        .patch(&user, &up.id, 0, None, None, body(&[b"hello"]))
        .await;
    let Ok(Patched::Partial(at)) = first else {
        panic!("more is to come")
    };
    assert_eq!(at.offset, 5);
    let last = kit
        .resumables
        .patch(&user, &up.id, 5, None, None, body(&[b" ", b"world"]))
        .await;
    let Ok(Patched::Done { file, .. }) = last else {
        panic!("the last bytes commit the file")
    };
    assert_eq!(file.id, up.id, "the file's id is the upload's");
    assert_eq!(file.sha256, sha256(b"hello world"));
    assert_eq!(kit.read(&file.key).await, b"hello world");
    assert_eq!(kit.files(&user).await.len(), 1);
    // Answerable as complete until it expires (its HEAD, a retried PATCH).
    assert!(matches!(
        kit.resumables.find(&user, &up.id).await,
        Ok(upload) if upload.committed
    ));
    assert_eq!(kit.intents().await, 0);
}

#[tokio::test]
async fn a_patch_from_another_offset_or_with_a_wrong_checksum_advances_nothing() {
    let kit = Kit::new(|_| {}).await;
    let user = kit.user("bob").await;
    let up = create(&kit, &user, 10).await;
    let wrong = kit
        .resumables
        .patch(&user, &up.id, 3, None, None, body(&[b"abc"]))
        .await;
    assert!(matches!(wrong, Err(ResumableError::OffsetMismatch(0))));
    let bad = Checksum::parse("sha1 AAAAAAAAAAAAAAAAAAAAAAAAAAA=").unwrap();
    let mismatch = kit
        .resumables
        .patch(&user, &up.id, 0, None, Some(bad), body(&[b"abc"]))
        .await;
    assert!(matches!(mismatch, Err(ResumableError::ChecksumMismatch)));
    assert_eq!(kit.resumables.find(&user, &up.id).await.unwrap().offset, 0);
    let past = kit
        .resumables
        .patch(&user, &up.id, 0, None, None, body(&[b"01234567890"]))
        .await;
    assert!(matches!(
        past,
        Err(ResumableError::Domain(DomainError::InvalidRequest(_)))
    ));
    assert_eq!(kit.resumables.find(&user, &up.id).await.unwrap().offset, 0);
}

/// The shared commit answers a refusal and the upload keeps everything for
/// its next try: a final PATCH whose commit waited past the lock wait
/// leaves the upload at its end, and a HEAD then finishes it.
#[tokio::test]
async fn a_final_patch_whose_commit_is_refused_stays_resumable_and_a_head_finishes_it() {
    let kit = Kit::new(|s| s.lock.wait_timeout = Duration::from_millis(200)).await;
    let user = kit.user("cy").await;
    let up = create(&kit, &user, 4).await;
    let held = kit
        .locks
        .acquire(&LockKey::user_upload(&user.id, SizeCategory::Small))
        .await
        .unwrap();
    let refused = kit
        .resumables
        .patch(&user, &up.id, 0, None, None, body(&[b"data"]))
        .await;
    assert!(
        matches!(
            refused,
            Err(ResumableError::Domain(DomainError::LockTimeout))
        ),
        "{refused:?}"
    );
    let kept = kit.resumables.find(&user, &up.id).await.unwrap();
    assert!(kept.all_stored() && kept.completed, "every byte kept");
    assert_eq!(kit.read(&kept.key).await, b"data", "and the completed blob");
    assert!(kit.files(&user).await.is_empty());
    held.release().await;
    let finished = kit.resumables.head(&user, &up.id).await.unwrap();
    assert_eq!(finished.offset, 4);
    let files = kit.files(&user).await;
    assert_eq!(files.len(), 1);
    assert_eq!(files[0].sha256, sha256(b"data"));
}

#[tokio::test]
async fn terminating_an_upload_drops_its_write_intent_and_state() {
    let kit = Kit::new(|_| {}).await;
    let user = kit.user("dee").await;
    let up = create(&kit, &user, 10).await;
    kit.resumables
        .patch(&user, &up.id, 0, None, None, body(&[b"half"]))
        .await
        .unwrap();
    kit.resumables.terminate(&user, &up.id).await.unwrap();
    assert_eq!(kit.intents().await, 0);
    assert!(kit.resumables.find(&user, &up.id).await.is_err());
    assert!(kit.objects(&user).await.is_empty());
}
