//! Resumable uploads whose user is being deleted (issue 42, item 5): a
//! PATCH still trickling stops as soon as the deletion asks for its upload,
//! and an upload dropped because the sweeper took its intent takes its
//! blob store write with it.

use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;

use super::{NewResumable, Patched, ResumableError};
use crate::{
    blob::ByteStream,
    domain::{
        DomainError,
        test_kit::{Kit, body},
    },
    lock::TryLock,
    meta::{CleanupRepo, DeletionRepo, ResumableRecord, UserRecord},
    vocab::{Filename, LockKey},
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

/// The embedded blob store's writes in progress (a staging file each).
fn staging_files(kit: &Kit) -> usize {
    std::fs::read_dir(kit.dir().join("blobs.tmp"))
        .unwrap()
        .filter(|e| {
            let name = e.as_ref().unwrap().file_name();
            name.to_string_lossy().starts_with("tus-")
        })
        .count()
}

/// A byte every `every`, for ever: never silent long enough for a release
/// request to stop it.
fn trickle(every: Duration) -> ByteStream<'static> {
    futures::stream::unfold((), move |()| async move {
        tokio::time::sleep(every).await;
        Some((Ok(Bytes::from_static(b"x")), ()))
    })
    .boxed()
}

/// A release request alone does not stop a PATCH whose body still flows
/// (its client is alive); once its user is marked for deletion, the same
/// request stops it at once, and it answers as a deleted user's request
/// is answered (401), keeping none of its bytes.
#[tokio::test]
async fn a_trickling_patch_of_a_user_being_deleted_lets_go_when_asked() {
    let kit = Kit::new(|_| {}).await;
    let user = kit.user("gil").await;
    let up = create(&kit, &user, 1000).await;
    let key = LockKey::resumable(&up.id);
    let patch = kit.resumables.patch(
        &user,
        &up.id,
        0,
        None,
        None,
        trickle(Duration::from_millis(200)),
    );
    let deletion = async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let live = kit.locks.take_over(&key, Duration::from_secs(3)).await;
        assert!(matches!(live, Ok(TryLock::Busy)), "a live PATCH kept on");
        kit.meta.begin_user_deletion(&user.id).await.unwrap();
        let started = tokio::time::Instant::now();
        let got = kit.locks.take_over(&key, Duration::from_secs(3)).await;
        let took = started.elapsed();
        let Ok(TryLock::Held(guard)) = got else {
            panic!("the PATCH of a user being deleted did not let go")
        };
        guard.release().await;
        took
    };
    let (patched, took) = tokio::join!(patch, deletion);
    assert!(took < Duration::from_secs(1), "let go after {took:?}");
    assert!(
        matches!(
            patched,
            Err(ResumableError::Domain(DomainError::Unauthenticated))
        ),
        "{patched:?}"
    );
    let now = kit.resumables.resumables.resumable(&up.user_id, &up.id);
    let now = now.await.unwrap();
    assert_eq!(now.unwrap().offset, 0, "none of its bytes recorded");
}

/// A byte each time it is polled, after yielding once: a body flowing far
/// faster than a store read answers.
fn flood() -> ByteStream<'static> {
    futures::stream::unfold((), |()| async {
        tokio::task::yield_now().await;
        Some((Ok(Bytes::from_static(b"x")), ()))
    })
    .boxed()
}

/// The same for a body that flows fast: the check of its user runs beside
/// it, so a chunk arriving before the store answers does not cancel the
/// check (it did: a body sending faster than a read took was never
/// stopped, and held its user's deletion up).
#[tokio::test]
async fn a_flowing_patch_of_a_user_being_deleted_lets_go_when_asked() {
    let kit = Kit::new(|_| {}).await;
    let user = kit.user("ida").await;
    let up = create(&kit, &user, 1 << 33).await;
    let key = LockKey::resumable(&up.id);
    let patch = kit.resumables.patch(&user, &up.id, 0, None, None, flood());
    let deletion = async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        kit.meta.begin_user_deletion(&user.id).await.unwrap();
        let got = kit.locks.take_over(&key, Duration::from_secs(3)).await;
        let Ok(TryLock::Held(guard)) = got else {
            panic!("a flowing PATCH of a user being deleted did not let go in 3 s")
        };
        guard.release().await;
    };
    let (patched, ()) = tokio::join!(patch, deletion);
    assert!(
        matches!(
            patched,
            Err(ResumableError::Domain(DomainError::Unauthenticated))
        ),
        "{patched:?}"
    );
}

/// A final PATCH whose intent the sweeper abandoned while its body
/// streamed (the user's deletion, or an expiry): its completion finds the
/// intent gone and drops the upload, its blob store write too (the
/// multipart upload or staging file the state alone named).
#[tokio::test]
async fn a_final_patch_whose_intent_was_abandoned_drops_its_write() {
    let kit = Kit::new(|_| {}).await;
    let user = kit.user("hal").await;
    let up = create(&kit, &user, 10).await;
    let first = kit
        .resumables
        .patch(&user, &up.id, 0, None, None, body(&[b"01234"]))
        .await;
    assert!(matches!(first, Ok(Patched::Partial(_))), "{first:?}");
    assert_eq!(staging_files(&kit), 1);
    let (meta, owner, id) = (kit.meta.clone(), up.user_id, up.id);
    let abandoned_meanwhile = futures::stream::once(async move {
        meta.abandon_intent(&owner, &id, None)
            .await
            .unwrap()
            .unwrap();
        Ok(Bytes::from_static(b"56789"))
    });
    let last = abandoned_meanwhile.boxed();
    let last = kit
        .resumables
        .patch(&user, &up.id, 5, None, None, last)
        .await;
    assert!(
        matches!(
            last,
            Err(ResumableError::Domain(DomainError::UploadExpired))
        ),
        "{last:?}"
    );
    assert!(
        kit.resumables
            .resumables
            .resumable(&up.user_id, &up.id)
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(staging_files(&kit), 0, "the write left behind");
    assert!(kit.files(&user).await.is_empty());
    assert!(kit.objects(&user).await.is_empty());
}
