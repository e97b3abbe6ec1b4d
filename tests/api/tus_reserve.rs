//! An open upload's reservation (its `Upload-Length` against the quota, its
//! open slot) is given back exactly once, on every path that ends it: the
//! commit (the file's bytes take its place), a retried final PATCH after a
//! refused commit, termination, expiry; a completed upload that stays
//! answerable holds none. Concurrent creations and declarations that each
//! fit alone but not together: exactly the ones that fit are let in. On the
//! embedded adapters and (`FILEDOCK_TEST_BACKEND=real`) on MongoDB, S3 and
//! Redis (issue 20, item 6).

use std::time::Duration;

use filedock::{domain::sweeper::Outcome, lock::LockKey, vocab::FileId};
use reqwest::{Response, StatusCode};

use crate::{
    helpers::{TestApp, TestUser, error_code, spawn_app_with, test_settings},
    tus::{TUS, content, data, head, patch},
    tus_defer::{create_deferred, patch_declaring},
    tus_limits::{counts, terminate, try_create, upload_id},
};

/// How often a racer resends a request answered `409 write_conflict`, as a
/// client retries it.
const CONFLICT_RETRIES: usize = 50;

/// Makes upload `id` expired, as if no PATCH had come for
/// `FILEDOCK_TUS_EXPIRY_SECS`, and runs one sweeper pass.
pub(crate) async fn expire_and_sweep(
    app: &TestApp,
    id: &str,
) -> filedock::domain::sweeper::SweepReport {
    let meta = &app.state.ports.meta;
    let file_id: FileId = id.parse().unwrap();
    let mut upload = meta.resumable_by_id_alone(&file_id).await.unwrap().unwrap();
    upload.expires_at = filedock::meta::now() - chrono::Duration::seconds(1);
    assert!(
        meta.advance_resumable(&upload, upload.progress())
            .await
            .unwrap()
    );
    let Outcome::Swept(report) = app.state.sweeper.try_run_once().await.unwrap() else {
        panic!("busy")
    };
    report
}

/// What upload `id`'s record holds of its user's counters: `(reserved, open)`.
async fn held(app: &TestApp, id: &str) -> (i64, bool) {
    let meta = &app.state.ports.meta;
    let upload = meta
        .resumable_by_id_alone(&id.parse().unwrap())
        .await
        .unwrap()
        .unwrap();
    (upload.reserved, upload.open)
}

/// A quota of `quota` bytes, the usage read from the store.
async fn app_with_quota(quota: u64) -> TestApp {
    let mut settings = test_settings();
    settings.user_quota_bytes = Some(quota);
    settings.auth_cache_ttl = Duration::ZERO;
    spawn_app_with(settings).await
}

/// [`app_with_quota`] with a lock wait of 1 s: a commit whose lock is
/// held is refused quickly.
async fn app_with_short_lock_wait(quota: u64) -> TestApp {
    let mut settings = test_settings();
    settings.user_quota_bytes = Some(quota);
    settings.auth_cache_ttl = Duration::ZERO;
    settings.lock.wait_timeout = Duration::from_secs(1);
    spawn_app_with(settings).await
}

/// Holds `user`'s small-upload lock, as a plain upload in progress does:
/// a resumable upload's commit waits for it and is refused (`429`).
pub(crate) async fn hold_commit_lock(app: &TestApp, user: &TestUser) -> filedock::lock::Held {
    let locks = &app.state.ports.locks;
    locks
        .acquire(&LockKey::user_upload(&user.user_id(), "small"))
        .await
        .unwrap()
}

#[tokio::test]
async fn a_retried_final_patch_and_the_completed_upload_give_the_reservation_back_once() {
    let app = app_with_short_lock_wait(1000).await;
    let user = app.create_user("retried").await;
    let bytes = data(600);
    let id = upload_id(&try_create(&app, &user, 600).await);
    let res = patch(&app, &user, &id, 0, &bytes[..300]).await;
    assert_eq!(res.status(), StatusCode::NO_CONTENT);

    // The final commit refused, twice: the reservation stays, once.
    let lock = hold_commit_lock(&app, &user).await;
    let res = patch(&app, &user, &id, 300, &bytes[300..]).await;
    assert_eq!(
        error_code(res).await,
        (StatusCode::TOO_MANY_REQUESTS, "lock_timeout".into())
    );
    assert_eq!(counts(&app, &user).await, (0, 600, 1));
    let res = patch(&app, &user, &id, 600, &[]).await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(counts(&app, &user).await, (0, 600, 1), "still held once");
    lock.release().await;

    // The retry commits: the file's bytes take the reservation's place.
    let res = patch(&app, &user, &id, 600, &[]).await;
    assert_eq!(
        res.status(),
        StatusCode::NO_CONTENT,
        "the retried final PATCH"
    );
    assert_eq!(counts(&app, &user).await, (600, 0, 0));
    assert!(content(&app, &user, &id).await == bytes, "the bytes differ");
    // Completed, it stays answerable, holding nothing: answering it again
    // gives nothing back twice.
    assert_eq!(held(&app, &id).await, (0, false));
    assert_eq!(head(&app, &user, &id).await, (StatusCode::OK, Some(600)));
    let res = patch(&app, &user, &id, 600, &[]).await;
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    assert_eq!(counts(&app, &user).await, (600, 0, 0));
    // What it gave back is another upload's to take, exactly.
    let other = upload_id(&try_create(&app, &user, 400).await);
    assert_eq!(
        try_create(&app, &user, 1).await.status(),
        StatusCode::INSUFFICIENT_STORAGE
    );
    assert_eq!(counts(&app, &user).await, (600, 400, 1));

    // Its expiry forgets it and gives nothing back: it held nothing.
    let report = expire_and_sweep(&app, &id).await;
    assert_eq!(report.resumables_expired, 1, "{report:?}");
    assert_eq!(counts(&app, &user).await, (600, 400, 1));
    assert_eq!(head(&app, &user, &other).await, (StatusCode::OK, Some(0)));
}

#[tokio::test]
async fn termination_gives_the_reservation_back_once_whatever_the_upload_stored() {
    let app = app_with_short_lock_wait(1000).await;
    let user = app.create_user("terminated").await;
    let bytes = data(300);
    let (open, stored) = (
        upload_id(&try_create(&app, &user, 300).await),
        upload_id(&try_create(&app, &user, 300).await),
    );
    let res = patch(&app, &user, &open, 0, &bytes[..100]).await;
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    assert_eq!(counts(&app, &user).await, (0, 600, 2));

    assert_eq!(terminate(&app, &user, &open).await, StatusCode::NO_CONTENT);
    assert_eq!(counts(&app, &user).await, (0, 300, 1));
    assert_eq!(terminate(&app, &user, &open).await, StatusCode::NOT_FOUND);
    assert_eq!(counts(&app, &user).await, (0, 300, 1), "given back once");

    // Every byte stored, its commit refused: terminated, nothing of it stays.
    let lock = hold_commit_lock(&app, &user).await;
    let res = patch(&app, &user, &stored, 0, &bytes).await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    lock.release().await;
    assert_eq!(counts(&app, &user).await, (0, 300, 1));
    assert_eq!(
        terminate(&app, &user, &stored).await,
        StatusCode::NO_CONTENT
    );
    assert_eq!(counts(&app, &user).await, (0, 0, 0));
    assert_eq!(terminate(&app, &user, &stored).await, StatusCode::NOT_FOUND);
    assert_eq!(counts(&app, &user).await, (0, 0, 0));
    assert!(app.list_ids(&user).await.is_empty(), "no file came of it");
}

#[tokio::test]
async fn expiry_gives_the_reservation_back_once() {
    let app = app_with_quota(1000).await;
    let user = app.create_user("expired").await;
    let (partial, deferred) = (
        upload_id(&try_create(&app, &user, 500).await),
        create_deferred(&app, &user).await,
    );
    let res = patch(&app, &user, &partial, 0, &data(200)).await;
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    // A deferred length, declared: reserved from then on.
    let res = patch_declaring(&app, &user, &deferred, 0, 400, &data(100)).await;
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    assert_eq!(counts(&app, &user).await, (0, 900, 2));

    let report = expire_and_sweep(&app, &partial).await;
    assert_eq!(report.resumables_expired, 1, "{report:?}");
    assert_eq!(counts(&app, &user).await, (0, 400, 1));
    let report = expire_and_sweep(&app, &deferred).await;
    assert_eq!(report.resumables_expired, 1, "{report:?}");
    assert_eq!(counts(&app, &user).await, (0, 0, 0));
    // Nothing is given back twice: another pass finds nothing to expire.
    let Outcome::Swept(report) = app.state.sweeper.try_run_once().await.unwrap() else {
        panic!("busy")
    };
    assert_eq!(report.resumables_expired, 0);
    assert_eq!(counts(&app, &user).await, (0, 0, 0));
}

/// Sends `request` until it is answered something other than `409
/// write_conflict` (which a client retries).
pub(crate) async fn until_settled(request: impl AsyncFn() -> Response) -> (StatusCode, String) {
    for _ in 0..CONFLICT_RETRIES {
        let answer = error_code(request().await).await;
        if answer.0 != StatusCode::CONFLICT {
            return answer;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("still a write conflict after {CONFLICT_RETRIES} tries")
}

/// Of the answers, `(successes, quota refusals)`; anything else fails.
pub(crate) fn tally(answers: Vec<(StatusCode, String)>, success: StatusCode) -> (usize, usize) {
    let (mut ok, mut refused) = (0, 0);
    for (status, code) in answers {
        match status {
            s if s == success => ok += 1,
            StatusCode::INSUFFICIENT_STORAGE if code == "quota_exceeded" => refused += 1,
            s => panic!("a racer was answered {s} {code}"),
        }
    }
    (ok, refused)
}

/// 10 creations of 300 bytes each against a quota of 1000, at once: each
/// fits alone, 3 fit together, and exactly 3 are created.
#[tokio::test]
async fn concurrent_creations_that_fit_alone_are_let_in_exactly_as_many_as_fit() {
    let app = app_with_quota(1000).await;
    let user = app.create_user("racing").await;
    let racers = (0..10).map(|_| {
        until_settled(async || {
            app.client
                .post(app.url("/v1/uploads"))
                .bearer_auth(&user.key)
                .header("tus-resumable", TUS)
                .header("upload-length", "300")
                .send()
                .await
                .unwrap()
        })
    });
    let answers = futures::future::join_all(racers).await;
    assert_eq!(tally(answers, StatusCode::CREATED), (3, 7));
    assert_eq!(counts(&app, &user).await, (0, 900, 3));
}

/// 10 deferred uploads declare 300 bytes each at once (with their bytes),
/// against a quota of 1000: exactly 3 are stored and committed; the others
/// are refused, keep nothing and stay deferred (open, nothing reserved).
#[tokio::test]
async fn concurrent_declarations_that_fit_alone_are_let_in_exactly_as_many_as_fit() {
    let app = app_with_quota(1000).await;
    let user = app.create_user("declaring").await;
    let mut ids = Vec::new();
    for _ in 0..10 {
        ids.push(create_deferred(&app, &user).await);
    }
    assert_eq!(counts(&app, &user).await, (0, 0, 10));
    let bytes = data(300);
    let (app, user, bytes) = (&app, &user, &bytes);
    let racers = ids
        .iter()
        .map(|id| until_settled(async move || patch_declaring(app, user, id, 0, 300, bytes).await));
    let answers = futures::future::join_all(racers).await;
    assert_eq!(tally(answers, StatusCode::NO_CONTENT), (3, 7));
    assert_eq!(counts(app, user).await, (900, 0, 7));
    assert_eq!(app.list_ids(user).await.len(), 3);
}
