//! The sweeper beside resumable uploads (issue 20): open tus uploads, however
//! many, do not starve the abandoning of dead plain uploads; staging left by
//! a dead upload goes with the sweep. On the embedded adapters and
//! (`FILEDOCK_TEST_BACKEND=real`) on MongoDB, S3 and Redis.

use std::time::Duration;

use filedock::{
    domain::sweeper::{Outcome, SweepReport},
    meta::{Claim, IntentRecord},
    vocab::{BlobKey, FileId, UserId},
};
use futures::StreamExt;
use reqwest::StatusCode;

use crate::{
    helpers::*,
    tus::{content, create, data, head, patch, patch_body},
};

/// More open uploads than the sweeper reads intents in one batch (500).
const OPEN_UPLOADS: usize = 501;

/// One pass's report.
async fn sweep(app: &TestApp) -> SweepReport {
    match app.state.sweeper.try_run_once().await.unwrap() {
        Outcome::Swept(report) => report,
        Outcome::Busy => panic!("the sweeper is busy"),
    }
}

#[tokio::test]
async fn open_resumable_uploads_do_not_starve_the_abandoning_of_a_dead_plain_upload() {
    let mut settings = test_settings();
    // Every intent is stale at once, the open uploads' included, were they scanned.
    settings.sweep.intent_grace = std::time::Duration::ZERO;
    settings.max_open_uploads = OPEN_UPLOADS as u64;
    let app = spawn_app_with(settings).await;
    let user = app.create_user("many-open").await;
    let ids: Vec<String> = futures::stream::iter(0..OPEN_UPLOADS)
        .map(|_| create(&app, &user, 10))
        .buffer_unordered(8)
        .collect()
        .await;

    // A plain upload killed mid-body, after them: its intent and half a blob.
    let file_id = FileId::new();
    let key = BlobKey::file(user.user_id(), file_id);
    let blobs = &app.state.ports.blobs;
    let intent = IntentRecord::new(user.user_id(), file_id, blobs.bucket());
    app.state.ports.meta.put_intent(&intent).await.unwrap();
    let half = futures::stream::iter([Ok(bytes::Bytes::from_static(b"half"))]);
    blobs.put(&key, Box::pin(half)).await.unwrap();

    let report = sweep(&app).await;
    assert_eq!(
        (report.intents_abandoned, report.orphans_deleted),
        (1, 1),
        "{report:?}"
    );
    assert!(
        blobs
            .list_keys(&format!("files/{}/", user.id))
            .await
            .unwrap()
            .is_empty()
    );
    // The open uploads wait for their clients.
    assert_eq!(report.resumables_expired, 0);
    assert_eq!(head(&app, &user, &ids[0]).await, (StatusCode::OK, Some(0)));
    assert_eq!(app.intents().await, OPEN_UPLOADS);
}

/// What staging holds: S3 tail objects, or local staging and temporary files.
async fn staging(app: &TestApp) -> Vec<String> {
    if real_backends() {
        app.state.ports.blobs.list_keys("tus/").await.unwrap()
    } else {
        let dir = std::fs::read_dir(app.settings.data_dir.join("blobs.tmp")).unwrap();
        dir.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect()
    }
}

#[tokio::test]
async fn staging_no_live_upload_owns_goes_with_the_sweep_and_a_live_uploads_stays() {
    let mut settings = test_settings();
    settings.sweep.intent_grace = std::time::Duration::ZERO;
    let app = spawn_app_with(settings).await;
    let user = app.create_user("staging").await;
    let bytes = data(200);
    // A live upload with a stored tail (S3) or staging file (local).
    let live = create(&app, &user, 200).await;
    assert_eq!(
        patch(&app, &user, &live, 0, &bytes[..100]).await.status(),
        StatusCode::NO_CONTENT
    );
    // An upload whose state is gone but not its staging (a process that
    // died while it was terminated or expired).
    let dead = create(&app, &user, 200).await;
    assert_eq!(
        patch(&app, &user, &dead, 0, &bytes[..100]).await.status(),
        StatusCode::NO_CONTENT
    );
    let meta = &app.state.ports.meta;
    let dead_id: FileId = dead.parse().unwrap();
    let owner = user.user_id();
    meta.delete_resumable(&owner, &dead_id).await.unwrap();
    let past = filedock::meta::now() - chrono::Duration::seconds(1);
    assert!(
        meta.touch_intent(&owner, &dead_id, Some(past))
            .await
            .unwrap()
            .is_some()
    );
    if real_backends() {
        // A tail the live upload's state replaced (its delete failed).
        let key = BlobKey::file(user.user_id(), live.parse().unwrap()).tail(0, 40);
        let stray = futures::stream::iter([Ok(bytes::Bytes::from(bytes[..40].to_vec()))]);
        app.state
            .ports
            .blobs
            .put(&key, Box::pin(stray))
            .await
            .unwrap();
    } else {
        // A plain upload's temporary file, its process killed mid-body.
        let tmp = app
            .settings
            .data_dir
            .join("blobs.tmp")
            .join("0123456789abcdef");
        std::fs::write(tmp, b"half a body").unwrap();
    }
    assert_eq!(staging(&app).await.len(), 3, "{:?}", staging(&app).await);
    // The pass looks at staging written strictly before it began (the
    // grace is zero): let the clock pass the writes above.
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;

    let report = sweep(&app).await;
    assert_eq!(report.staging_removed, 2, "{report:?}");
    assert_eq!(report.failures, 0, "{report:?}");
    assert_eq!(staging(&app).await.len(), 1, "the live upload's is kept");
    let res = patch(&app, &user, &live, 100, &bytes[100..]).await;
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    assert!(
        content(&app, &user, &live).await == bytes,
        "the bytes differ"
    );
    sweep(&app).await;
    assert!(staging(&app).await.is_empty(), "{:?}", staging(&app).await);
}

#[tokio::test]
async fn the_sweeper_claims_an_upload_only_at_the_expiry_it_read() {
    let app = spawn_app().await;
    let user = app.create_user("claim").await;
    let id: FileId = create(&app, &user, 10).await.parse().unwrap();
    let meta = &app.state.ports.meta;
    let read = meta.resumable_by_id_alone(&id).await.unwrap().unwrap();
    // A PATCH renews it after the sweeper read it.
    let mut renewed = read.clone();
    renewed.expires_at = read.expires_at + chrono::Duration::seconds(60);
    assert!(
        meta.advance_resumable(&renewed, read.progress())
            .await
            .unwrap()
    );
    let missed = meta.delete_resumable_if_expires(&read.user_id, &id, read.expires_at, true);
    assert_eq!(missed.await.unwrap(), Claim::Missed);
    let kept = meta.resumable_by_id_alone(&id).await.unwrap().unwrap();
    // Open and never committed: its expiry is told.
    let claimed = meta.delete_resumable_if_expires(&kept.user_id, &id, kept.expires_at, true);
    assert_eq!(claimed.await.unwrap(), Claim::Claimed { told: true });
    assert!(meta.resumable_by_id_alone(&id).await.unwrap().is_none());
}

/// Once a user's deletion began, their `user.deleted` is their last event:
/// the expiry of an upload of theirs claimed after it tells nothing.
#[tokio::test]
async fn an_expiry_claimed_after_a_user_s_deletion_began_tells_nothing() {
    let app = spawn_app().await;
    let user = app.create_user("leaving").await;
    let id: FileId = create(&app, &user, 10).await.parse().unwrap();
    let meta = &app.state.ports.meta;
    let upload = meta.resumable_by_id_alone(&id).await.unwrap().unwrap();
    let owner: UserId = user.id.parse().unwrap();
    assert!(meta.begin_user_deletion(&owner).await.unwrap().is_some());
    let claimed = meta.delete_resumable_if_expires(&owner, &id, upload.expires_at, true);
    assert_eq!(claimed.await.unwrap(), Claim::Claimed { told: false });
    let kinds: Vec<String> = (meta.events(&owner, 0, 100).await.unwrap().into_iter())
        .map(|e| e.kind)
        .collect();
    assert_eq!(
        kinds.last().map(String::as_str),
        Some("user.deleted"),
        "{kinds:?}"
    );
    assert!(!kinds.contains(&"upload.expired".to_owned()), "{kinds:?}");
}

/// A PATCH renews the upload's intent to the very instant it renews the
/// upload to: an intent that lapsed first would be swept (its blob taken)
/// while the upload still lives and may be finished. It renews them once
/// less than half the expiry is left, not before: a young upload's PATCH
/// writes neither (issue 44).
#[tokio::test]
async fn a_patch_renews_the_intent_as_long_as_the_upload_past_half_its_expiry() {
    let app = spawn_app().await;
    let user = app.create_user("renewed").await;
    let id = create(&app, &user, 200).await;
    let file_id: FileId = id.parse().unwrap();
    let meta = &app.state.ports.meta;
    let owner = user.user_id();
    let created = meta.resumable_by_id_alone(&file_id).await.unwrap().unwrap();
    let res = patch(&app, &user, &id, 0, &data(100)).await;
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    let intent = meta.intent(&owner, &file_id).await.unwrap().unwrap();
    let upload = meta.resumable_by_id_alone(&file_id).await.unwrap().unwrap();
    assert_eq!(upload.offset, 100);
    assert_eq!(upload.expires_at, created.expires_at, "young: not renewed");
    assert_eq!(intent.alive_until, Some(upload.expires_at));

    // Less than half of it left.
    let mut old = upload.clone();
    old.expires_at = filedock::meta::now() + chrono::Duration::seconds(30);
    assert!(
        meta.advance_resumable(&old, upload.progress())
            .await
            .unwrap()
    );
    let res = patch(&app, &user, &id, 100, &data(50)).await;
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    let intent = meta.intent(&owner, &file_id).await.unwrap().unwrap();
    let upload = meta.resumable_by_id_alone(&file_id).await.unwrap().unwrap();
    let expiry = chrono::Duration::from_std(app.settings.tus_expiry).unwrap();
    let left = upload.expires_at - filedock::meta::now();
    assert!(left > expiry / 2, "renewed: {left} left");
    assert_eq!(intent.alive_until, Some(upload.expires_at));
}

/// The renewal is decided as the PATCH records its bytes, not as it
/// begins: a PATCH that began with more than half the expiry left and
/// streamed past that point leaves the upload renewed, never expiring
/// soon after the 204 (review of issue 44's fifth cut).
#[tokio::test]
async fn a_patch_that_streamed_past_half_the_expiry_renews_the_upload() {
    let mut settings = test_settings();
    settings.tus_expiry = Duration::from_secs(4);
    let app = spawn_app_with(settings).await;
    let user = app.create_user("slow-renewed").await;
    let id = create(&app, &user, 200).await;
    let file_id: FileId = id.parse().unwrap();
    let meta = &app.state.ports.meta;
    // One byte, then the rest once under half of the expiry is left.
    let bytes = data(100);
    let (first, rest) = (bytes[..1].to_vec(), bytes[1..].to_vec());
    let slow = futures::stream::once(async move { Ok::<_, std::io::Error>(first) }).chain(
        futures::stream::once(async move {
            tokio::time::sleep(Duration::from_millis(2600)).await;
            Ok(rest)
        }),
    );
    let body = reqwest::Body::wrap_stream(slow);
    let res = patch_body(&app, &user, &id, 0, body, None).await.unwrap();
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    let upload = meta.resumable_by_id_alone(&file_id).await.unwrap().unwrap();
    assert_eq!(upload.offset, 100);
    let left = upload.expires_at - filedock::meta::now();
    assert!(
        left > chrono::Duration::seconds(2),
        "{left} left after the 204"
    );
    let intent = meta
        .intent(&user.user_id(), &file_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(intent.alive_until, Some(upload.expires_at));
}
