//! A deferred upload's bytes count against the quota as they are stored
//! (issue 20's review): undeclared uploads together hold no more than the
//! quota; a declaration is made only once the checks that need no body
//! passed, and a length the offset has passed is never set. On the
//! embedded adapters and the real backends.

use bytes::Bytes;
use filedock::meta::Reserve;
use reqwest::StatusCode;

use crate::{
    account::{tokio_stream_of, upload_raw_at_owned},
    helpers::{error_code, spawn_app_with, test_settings},
    tus::{data, head, offset_of, patch},
    tus_defer::{create_deferred, lengths, patch_declaring},
    tus_limits::counts,
    tus_recovery::usage,
};

#[tokio::test]
async fn undeclared_uploads_together_hold_no_more_than_the_quota() {
    let mut settings = test_settings();
    settings.user_quota_bytes = Some(1000);
    let app = spawn_app_with(settings).await;
    let user = app.create_user("defer-sum").await;
    let (first, second) = (
        create_deferred(&app, &user).await,
        create_deferred(&app, &user).await,
    );
    let res = patch(&app, &user, &first, 0, &data(1000)).await;
    assert_eq!(
        (res.status(), offset_of(&res)),
        (StatusCode::NO_CONTENT, 1000)
    );
    assert_eq!(
        counts(&app, &user).await,
        (0, 1000, 2),
        "its bytes reserved"
    );

    let res = patch(&app, &user, &second, 0, &data(1)).await;
    assert_eq!(
        error_code(res).await,
        (StatusCode::INSUFFICIENT_STORAGE, "quota_exceeded".into())
    );
    assert_eq!(head(&app, &user, &second).await.1, Some(0), "nothing kept");
    assert_eq!(counts(&app, &user).await, (0, 1000, 2));

    // Declared at what it holds, the first reserves nothing more and commits.
    let res = patch_declaring(&app, &user, &first, 1000, 1000, b"").await;
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    assert_eq!(counts(&app, &user).await, (1000, 0, 1));
}

#[tokio::test]
async fn a_declaring_patch_refused_before_its_body_declares_nothing() {
    let mut settings = test_settings();
    settings.max_uploads_per_user = 1;
    let app = spawn_app_with(settings).await;
    let user = app.create_user("defer-slot").await;
    let id = create_deferred(&app, &user).await;

    // A plain upload still streaming holds the user's one slot.
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(1);
    tx.send(Ok(Bytes::from_static(b"first half ")))
        .await
        .unwrap();
    let body = reqwest::Body::wrap_stream(tokio_stream_of(rx));
    let streaming = tokio::spawn(upload_raw_at_owned(
        app.base.clone(),
        user.key.clone(),
        body,
    ));
    for _ in 0..200 {
        if counts(&app, &user).await.2 == 1 && usage(&app, &user, "uploads_in_flight").await == 1 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(
        usage(&app, &user, "uploads_in_flight").await,
        1,
        "the plain upload streams"
    );
    let refused = patch_declaring(&app, &user, &id, 0, 10, &data(10)).await;
    assert_eq!(
        error_code(refused).await,
        (StatusCode::TOO_MANY_REQUESTS, "too_many_uploads".into())
    );
    assert_eq!(lengths(&app, &user, &id).await, (None, Some("1".into())));
    assert_eq!(counts(&app, &user).await.1, 0, "nothing reserved");

    tx.send(Ok(Bytes::from_static(b"second half")))
        .await
        .unwrap();
    drop(tx);
    assert_eq!(streaming.await.unwrap(), StatusCode::CREATED);
    let res = patch_declaring(&app, &user, &id, 0, 20, &data(10)).await;
    assert_eq!(
        (res.status(), offset_of(&res)),
        (StatusCode::NO_CONTENT, 10)
    );
    assert_eq!(lengths(&app, &user, &id).await.0, Some("20".into()));
}

#[tokio::test]
async fn a_length_below_the_offset_is_never_set_and_never_passed() {
    let app = spawn_app_with(test_settings()).await;
    let user = app.create_user("defer-past").await;
    let id = create_deferred(&app, &user).await;
    let res = patch(&app, &user, &id, 0, &data(100)).await;
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    let meta = &app.state.ports.meta;
    let file_id = id.parse().unwrap();

    // As a declaration read before a PATCH without the lock moved the offset.
    let now = meta
        .reserve_deferred(&user.user_id(), &file_id, Reserve::Length(50), None)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((now.length, now.offset), (None, 100), "not declared");

    // As a PATCH without the lock that read the offset before a declaration.
    let declared = meta
        .reserve_deferred(&user.user_id(), &file_id, Reserve::Length(150), None)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(declared.length, Some(150));
    let mut past = declared.clone();
    past.offset = 200;
    assert!(
        !meta
            .advance_resumable(&past, declared.progress())
            .await
            .unwrap(),
        "advanced past the length"
    );
    assert_eq!(head(&app, &user, &id).await.1, Some(100));
}

/// A request that read an upload before another finished it (the offset
/// unchanged: the staged tail became the last part, the file committed)
/// cannot write back what it read: the state's update is conditional on
/// the whole progress (offset, parts, commit), not the offset alone.
#[tokio::test]
async fn a_state_read_before_the_last_part_was_stored_is_never_written_back() {
    let app = spawn_app_with(test_settings()).await;
    let user = app.create_user("defer-stale").await;
    let id = create_deferred(&app, &user).await;
    let res = patch(&app, &user, &id, 0, b"staged").await;
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    let meta = &app.state.ports.meta;
    let file_id = id.parse().unwrap();
    let stale = meta.resumable_by_id_alone(&file_id).await.unwrap().unwrap();

    let res = patch_declaring(&app, &user, &id, 6, 6, b"").await;
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    let done = meta.resumable_by_id_alone(&file_id).await.unwrap().unwrap();
    assert!(done.committed);
    assert_eq!((done.offset, done.parts.len()), (6, 1));

    assert!(
        !meta
            .advance_resumable(&stale, stale.progress())
            .await
            .unwrap(),
        "written back over the finished upload"
    );
    let now = meta.resumable_by_id_alone(&file_id).await.unwrap().unwrap();
    assert_eq!(now, done, "unchanged");
    // Nor once only its commit is left to mark.
    let mut unmarked = done.clone();
    unmarked.committed = false;
    assert!(
        !meta
            .advance_resumable(&unmarked, unmarked.progress())
            .await
            .unwrap(),
        "unmarked the commit"
    );
    assert_eq!(head(&app, &user, &id).await.1, Some(6));
}
