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

/// An upload of deferred length with "staged" (6 bytes) stored as its
/// tail, and the state a slow request read then.
async fn staged(kit: &Kit, user: &UserRecord) -> ResumableRecord {
    let new = NewResumable {
        length: None,
        filename: Filename::parse("d.bin").unwrap(),
        content_type: "text/plain".into(),
        metadata: String::new(),
    };
    let up = kit.resumables.create(user, new).await.unwrap();
    let staged = kit
        .resumables
        .patch(user, &up.id, 0, None, None, body(&[b"staged"]))
        .await;
    assert!(matches!(staged, Ok(Patched::Partial(_))), "{staged:?}");
    kit.resumables.find(user, &up.id).await.unwrap()
}

/// The final PATCH (length 6 declared at offset 6, no body): the tail
/// becomes the last part and the file commits.
async fn finish(kit: &Kit, user: &UserRecord, up: &ResumableRecord) {
    let empty = Box::pin(futures::stream::empty());
    let first = kit
        .resumables
        .patch(user, &up.id, 6, Some(6), None, empty)
        .await;
    assert!(matches!(first, Ok(Patched::Done { .. })), "{first:?}");
}

/// Two requests finishing one upload at once (the lock backend down, or a
/// lease lost): the one that read the state before the other stored the
/// last part finds the staged tail gone. It is answered as the winner was,
/// finished, not 500 (nor 409, which would send its client to resume an
/// upload that is complete).
#[tokio::test]
async fn a_request_that_lost_the_race_to_store_the_last_part_is_answered_finished() {
    let kit = Kit::new(|_| {}).await;
    let user = kit.user("eve").await;
    let mut stale = staged(&kit, &user).await;
    // Its length declared, as the PATCH's was.
    stale.length = Some(6);
    finish(&kit, &user, &stale).await;
    let empty = Box::pin(futures::stream::empty());
    let late = kit
        .resumables
        .append(&user, stale.clone(), None, empty, None, None)
        .await;
    let Ok(Patched::Done { upload, file }) = late else {
        panic!("answered finished: {late:?}")
    };
    assert!(upload.committed);
    assert_eq!((upload.offset, file.id), (6, stale.id));
    assert_eq!(kit.read(&file.key).await, b"staged");
    assert_eq!(kit.files(&user).await.len(), 1, "one file");
}

/// An empty PATCH that read the state before another request finished the
/// upload (its offset unchanged, its tail now its last part, its file
/// committed) must not write back what it read: that would drop the last
/// part from the state and unmark the commit.
#[tokio::test]
async fn a_stale_empty_patch_does_not_write_back_the_state_it_read() {
    let kit = Kit::new(|_| {}).await;
    let user = kit.user("fay").await;
    let stale = staged(&kit, &user).await;
    finish(&kit, &user, &stale).await;
    let empty = Box::pin(futures::stream::empty());
    let late = kit
        .resumables
        .append(&user, stale.clone(), None, empty, None, None)
        .await;
    assert!(
        matches!(late, Err(ResumableError::OffsetMismatch(6))),
        "answered where the upload is: {late:?}"
    );
    let now = kit.resumables.head(&user, &stale.id).await.unwrap();
    assert!(now.committed, "still committed");
    assert_eq!((now.offset, now.parts.len()), (6, 1));
    assert_eq!(kit.files(&user).await.len(), 1, "one file");
}
