//! Orphans and the sweeper: failed compensation, retries, the dead letter,
//! stale intents, one sweeper at a time, and reconcile.

use std::sync::{Arc, atomic::Ordering};

use filedock::{
    blob::{BlobError, BlobStore, ByteRange, ByteStream, ListedBlob},
    domain::sweeper::{Outcome, SweepReport},
    http::AppState,
    meta::{CommitUpload, IntentRecord, MetaError},
    ports::Ports,
    vocab::{BlobKey, FileId, SizeCategory, UserId},
};
use futures::StreamExt;
use reqwest::StatusCode;
use serde_json::Value;

use crate::helpers::*;

/// An app whose blob deletes fail until told otherwise, with a 10-byte quota
/// (see [`failing_upload`]) and orphans retried at every sweep.
async fn app_with_failing_deletes() -> (TestApp, Arc<FailingDeletes>) {
    let mut settings = test_settings();
    settings.user_quota_bytes = Some(10);
    // The user's usage stays cached as it was before the upload in `fill_quota`.
    settings.auth_cache_ttl = std::time::Duration::from_secs(600);
    settings.sweep.retry_interval = std::time::Duration::ZERO;
    settings.sweep.interval = std::time::Duration::ZERO;
    let mut ports = Ports::connect(&settings).await.unwrap();
    let failing = Arc::new(FailingDeletes {
        inner: ports.blobs.clone(),
        fail: true.into(),
        delete_calls: 0.into(),
    });
    ports.blobs = failing.clone();
    let state = AppState::with_ports(settings, ports).unwrap();
    (spawn_app_with_state(state).await, failing)
}

/// Stores 6 of the user's 10 bytes of quota with their first request, which
/// caches their usage as it was before (0 bytes).
async fn fill_quota(app: &TestApp, user: &TestUser) {
    let res = app.upload_raw(user, "fill.bin", vec![1u8; 6]).await;
    assert_eq!(res.status(), StatusCode::CREATED);
}

/// An upload that stores its blob and then fails at commit (over quota),
/// after [`fill_quota`]: without a `Content-Length` and within the quota as
/// the cached usage has it, it is streamed to the blob store, and the commit
/// (which counts the stored usage) refuses it.
async fn failing_upload(app: &TestApp, user: &TestUser) {
    let body = reqwest::Body::wrap_stream(futures::stream::iter([Ok::<_, std::io::Error>(vec![
            7u8;
            6
        ])]));
    let res = app
        .client
        .post(app.url("/v1/files?filename=too-big.bin"))
        .bearer_auth(&user.key)
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(
        error_code(res).await,
        (StatusCode::INSUFFICIENT_STORAGE, "quota_exceeded".into())
    );
}

async fn orphans(app: &TestApp, status: &str) -> Vec<Value> {
    let body: Value = app
        .client
        .get(app.url(&format!("/v1/admin/orphans?status={status}")))
        .bearer_auth(ADMIN_KEY)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    body["orphans"].as_array().unwrap().clone()
}

async fn sweep(app: &TestApp) -> Value {
    let res = app
        .client
        .post(app.url("/v1/admin/sweep"))
        .bearer_auth(ADMIN_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    res.json().await.unwrap()
}

#[tokio::test]
async fn a_failed_compensating_delete_leaves_an_orphan_that_a_sweep_deletes() {
    let (app, failing) = app_with_failing_deletes().await;
    let u = app.create_user("o").await;
    fill_quota(&app, &u).await;
    failing_upload(&app, &u).await;
    assert_eq!(
        app.blob_keys(&u).await.len(),
        2,
        "the blob is still there (beside the fill)"
    );
    let pending = orphans(&app, "pending").await;
    assert_eq!(pending.len(), 1);
    assert!(
        pending[0]["error"]
            .as_str()
            .unwrap()
            .contains("unreachable")
    );
    assert_eq!(
        app.intents().await,
        0,
        "the orphan record replaced the intent"
    );

    failing.fail.store(false, Ordering::SeqCst);
    let report = sweep(&app).await;
    assert_eq!(report["outcome"], "swept");
    assert_eq!(report["orphans_deleted"], 1);
    assert_eq!(
        app.blob_keys(&u).await.len(),
        1,
        "the sweep deleted the blob (the fill's is left)"
    );
    assert!(orphans(&app, "pending").await.is_empty());
    assert_eq!(orphans(&app, "deleted").await.len(), 1);
    assert_eq!(app.list_ids(&u).await.len(), 1, "only the fill");
}

#[tokio::test]
async fn an_undeletable_orphan_is_retried_then_marked_failed() {
    let (app, failing) = app_with_failing_deletes().await;
    let u = app.create_user("o").await;
    fill_quota(&app, &u).await;
    failing_upload(&app, &u).await;
    for (pass, (status, retries)) in [("pending", 1), ("pending", 2), ("failed", 3)]
        .into_iter()
        .enumerate()
    {
        let report = sweep(&app).await;
        assert_eq!(report["orphans_deleted"], 0);
        let listed = orphans(&app, status).await;
        assert_eq!(listed.len(), 1, "pass {pass}: {status}");
        assert_eq!(listed[0]["retries"], retries, "pass {pass}");
    }
    assert_eq!(
        app.metric("filedock_orphans_dead_lettered_total", "").await,
        1.0
    );
    // The dead letter is left alone by later passes.
    let calls = failing.delete_calls.load(Ordering::SeqCst);
    let report = sweep(&app).await;
    assert_eq!(report["orphans_failed"], 0);
    assert_eq!(failing.delete_calls.load(Ordering::SeqCst), calls);
    assert_eq!(
        app.blob_keys(&u).await.len(),
        2,
        "kept for a human to look at (beside the fill)"
    );
    assert_eq!(
        app.metric("filedock_orphans", "status=\"failed\"").await,
        1.0
    );
}

#[tokio::test]
async fn two_sweepers_process_each_orphan_once() {
    let (app, failing) = app_with_failing_deletes().await;
    let u = app.create_user("o").await;
    fill_quota(&app, &u).await;
    futures::future::join_all((0..10).map(|_| failing_upload(&app, &u))).await;
    assert_eq!(orphans(&app, "pending").await.len(), 10);
    failing.fail.store(false, Ordering::SeqCst);
    // With real servers the second sweeper is a second instance on the same
    // Redis, MongoDB and S3; the embedded store admits one process, so there
    // both sweepers share it.
    let other = if real_backends() {
        AppState::build(app.settings.clone()).await.unwrap()
    } else {
        app.state.clone()
    };
    let (a, b) = (app.state.sweeper.clone(), other.sweeper.clone());
    let (ra, rb) = tokio::join!(a.try_run_once(), b.try_run_once());
    let deleted = |o: &Outcome| match o {
        Outcome::Swept(r) => r.orphans_deleted,
        Outcome::Busy => 0,
    };
    let (ra, rb) = (ra.unwrap(), rb.unwrap());
    assert_eq!(deleted(&ra) + deleted(&rb), 10, "{ra:?} {rb:?}");
    let listed = orphans(&app, "deleted").await;
    assert_eq!(listed.len(), 10);
    assert!(
        listed.iter().all(|o| o["retries"] == 0),
        "no orphan was tried twice"
    );
    assert_eq!(app.blob_keys(&u).await.len(), 1, "only the fill");
}

#[tokio::test]
async fn a_stale_intent_is_swept_and_its_late_commit_fails_cleanly() {
    let mut settings = test_settings();
    settings.sweep.intent_grace = std::time::Duration::ZERO;
    let app = spawn_app_with(settings).await;
    let u = app.create_user("crashed").await;
    // An upload that died after writing its blob: intent + blob, no file.
    let file_id = FileId::new();
    let key = BlobKey::file(u.id.parse().unwrap(), file_id);
    let intent = IntentRecord {
        created_at: filedock::meta::now() - chrono::Duration::seconds(1),
        ..IntentRecord::new(
            u.id.parse().unwrap(),
            file_id,
            app.state.ports.blobs.bucket(),
        )
    };
    app.state.ports.meta.put_intent(&intent).await.unwrap();
    let body = futures::stream::iter([Ok(bytes::Bytes::from_static(b"half"))]);
    app.state
        .ports
        .blobs
        .put(&key, Box::pin(body))
        .await
        .unwrap();

    let outcome = app.state.sweeper.try_run_once().await.unwrap();
    let Outcome::Swept(report) = outcome else {
        panic!("busy")
    };
    assert_eq!(
        report,
        SweepReport {
            intents_abandoned: 1,
            orphans_deleted: 1,
            ..Default::default()
        }
    );
    assert_eq!(app.intents().await, 0);
    assert!(app.blob_keys(&u).await.is_empty());

    // Had that upload still been running, its commit now fails: the intent is gone.
    let file = filedock::meta::FileRecord {
        id: file_id,
        owner_id: u.id.parse().unwrap(),
        filename: "late".into(),
        content_type: "text/plain".into(),
        size: 4,
        sha256: sha256_hex(b"half"),
        category: SizeCategory::Small,
        bucket: intent.bucket.clone(),
        key,
        created_at: filedock::meta::now(),
        sessions: Vec::new(),
        agents: Vec::new(),
    };
    let commit = CommitUpload {
        file,
        fence: None,
        quota_bytes: None,
        idempotency: None,
        resumable: false,
        state: None,
    };
    assert!(matches!(
        app.state.ports.meta.commit_upload(&commit).await,
        Err(MetaError::IntentGone)
    ));
    assert!(app.list_ids(&u).await.is_empty());
}

#[tokio::test]
async fn reconcile_finds_strays_and_missing_objects_and_deletes_strays_only_when_asked() {
    let mut settings = test_settings();
    settings.sweep.intent_grace = std::time::Duration::ZERO;
    let app = spawn_app_with(settings).await;
    let u = app.create_user("audit").await;
    let kept: Value = app.upload_json(&u, "kept.txt", b"kept".to_vec()).await;
    let lost: Value = app.upload_json(&u, "lost.txt", b"lost".to_vec()).await;
    let lost_id: FileId = lost["id"].as_str().unwrap().parse().unwrap();
    app.state
        .ports
        .blobs
        .delete(&BlobKey::file(u.id.parse().unwrap(), lost_id))
        .await
        .unwrap();
    let stray = plant_stray(&app, &u).await;

    let report = app.state.reconciler.reconcile(false).await.unwrap();
    assert_eq!(report.strays, vec![stray.clone()]);
    assert_eq!(report.missing, vec![lost_id]);
    assert_eq!(report.deleted, 0);
    assert_eq!(
        app.blob_keys(&u).await.len(),
        2,
        "an audit alone deletes nothing"
    );

    let report = app.state.reconciler.reconcile(true).await.unwrap();
    assert_eq!(report.deleted, 1);
    assert_eq!(report.deleted_keys, vec![stray]);
    let left = app.blob_keys(&u).await;
    assert_eq!(
        left,
        vec![format!("files/{}/{}", u.id, kept["id"].as_str().unwrap())]
    );
}

/// A blob whose clean-up failed (a delete's, a refused upload's) is on the
/// sweeper's list as a pending orphan: reconcile counts it as the
/// sweeper's, not as a stray, and after the sweep it is gone.
#[tokio::test]
async fn reconcile_leaves_a_blob_a_pending_orphan_names_to_the_sweeper() {
    let (app, failing) = app_with_failing_deletes().await;
    let u = app.create_user("pending").await;
    fill_quota(&app, &u).await;
    let kept: Value = app.upload_json(&u, "kept.txt", b"kept".to_vec()).await;
    let id = kept["id"].as_str().unwrap();
    let res = app
        .client
        .delete(app.url(&format!("/v1/files/{id}")))
        .bearer_auth(&u.key)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    failing_upload(&app, &u).await;
    assert_eq!(app.blob_keys(&u).await.len(), 3, "both clean-ups failed");
    assert_eq!(orphans(&app, "pending").await.len(), 2);

    let report = app.state.reconciler.reconcile(false).await.unwrap();
    assert_eq!(report.strays, Vec::<String>::new());
    assert_eq!(report.pending_orphans, 2);

    failing.fail.store(false, Ordering::SeqCst);
    assert_eq!(sweep(&app).await["orphans_deleted"], 2);
    let report = app.state.reconciler.reconcile(false).await.unwrap();
    assert_eq!(
        (report.objects, report.pending_orphans),
        (1, 0),
        "the fill is left"
    );
}

/// A blob store whose listing is followed by the delete of what it listed,
/// as a clean-up that finishes while reconcile reads (a refused upload's
/// undo drops the blob, then its intent).
struct DeletedAfterListing(Arc<dyn BlobStore>);

#[async_trait::async_trait]
impl BlobStore for DeletedAfterListing {
    fn bucket(&self) -> &str {
        self.0.bucket()
    }
    async fn put(&self, key: &BlobKey, body: ByteStream<'_>) -> Result<u64, BlobError> {
        self.0.put(key, body).await
    }
    async fn get(
        &self,
        key: &BlobKey,
        range: Option<ByteRange>,
    ) -> Result<ByteStream<'static>, BlobError> {
        self.0.get(key, range).await
    }
    async fn delete(&self, key: &BlobKey) -> Result<(), BlobError> {
        self.0.delete(key).await
    }
    async fn head(&self, key: &BlobKey) -> Result<Option<u64>, BlobError> {
        self.0.head(key).await
    }
    async fn list(&self, prefix: &str) -> Result<Vec<ListedBlob>, BlobError> {
        let listed = self.0.list(prefix).await?;
        for blob in &listed {
            self.0.delete(&BlobKey::parse(&blob.key).unwrap()).await?;
        }
        Ok(listed)
    }
    async fn ping(&self) -> Result<(), BlobError> {
        self.0.ping().await
    }
}

/// An object deleted between reconcile's listing and its reads is no stray:
/// nothing is reported (or deleted) for it.
#[tokio::test]
async fn reconcile_reports_no_stray_for_an_object_deleted_since_its_listing() {
    let settings = test_settings();
    let mut ports = Ports::connect(&settings).await.unwrap();
    ports.blobs = Arc::new(DeletedAfterListing(ports.blobs.clone()));
    let app = spawn_app_with_state(AppState::with_ports(settings, ports).unwrap()).await;
    let u = app.create_user("gone").await;
    plant_stray(&app, &u).await;
    let report = app.state.reconciler.reconcile(false).await.unwrap();
    assert_eq!(report.objects, 1, "the listing saw it");
    assert_eq!(report.strays, Vec::<String>::new());
    assert!(app.blob_keys(&u).await.is_empty());
}

#[tokio::test]
async fn reconcile_keeps_strays_younger_than_the_grace_period() {
    let app = spawn_app().await; // default grace: hours
    let u = app.create_user("young").await;
    let stray = plant_stray(&app, &u).await;
    let report = app.state.reconciler.reconcile(true).await.unwrap();
    assert_eq!(report.strays, vec![stray.clone()]);
    assert_eq!((report.deleted, report.too_young), (0, 1));
    assert_eq!(app.blob_keys(&u).await, vec![stray]);
}

/// `reconcile --delete` in a loop beside live uploads of one user, with the
/// grace period off so that only the order of its reads protects them:
/// every acknowledged upload keeps its bytes, and real strays still go.
#[tokio::test]
async fn reconcile_beside_live_uploads_deletes_no_acknowledged_upload() {
    const UPLOADS: usize = 300;
    const IN_FLIGHT: usize = 32;
    let mut settings = test_settings();
    settings.sweep.intent_grace = std::time::Duration::ZERO;
    let app = spawn_app_with(settings).await;
    let u = app.create_user("busy").await;
    let mut strays = Vec::new();
    for _ in 0..5 {
        strays.push(plant_stray(&app, &u).await);
    }

    let stop = tokio_util::sync::CancellationToken::new();
    let auditor = {
        let (state, stop) = (app.state.clone(), stop.clone());
        tokio::spawn(async move {
            let (mut passes, mut deleted) = (0, 0);
            while !stop.is_cancelled() {
                let report = state.reconciler.reconcile(true).await.unwrap();
                passes += 1;
                deleted += report.deleted;
            }
            (passes, deleted)
        })
    };
    let uploads = futures::stream::iter(0..UPLOADS)
        .map(|i| {
            let app = &app;
            let u = &u;
            async move {
                let bytes = pseudo_random_bytes(2048, i as u64);
                let res = app.upload_raw(u, &format!("f{i}.bin"), bytes.clone()).await;
                assert_eq!(res.status(), StatusCode::CREATED);
                let body: Value = res.json().await.unwrap();
                (body["id"].as_str().unwrap().to_owned(), bytes)
            }
        })
        .buffer_unordered(IN_FLIGHT)
        .collect::<Vec<_>>()
        .await;
    stop.cancel();
    let (passes, deleted) = auditor.await.unwrap();
    eprintln!("{passes} reconcile passes beside {UPLOADS} uploads deleted {deleted} objects");

    let mut lost = 0;
    for (id, bytes) in &uploads {
        let res = app.download(&u, id).await;
        if res.status() != StatusCode::OK || res.bytes().await.unwrap().as_ref() != bytes.as_slice()
        {
            lost += 1;
        }
    }
    assert_eq!(
        lost, 0,
        "acknowledged uploads whose bytes reconcile deleted"
    );
    assert!(passes > 1, "reconcile ran beside the uploads");
    for key in &strays {
        assert!(
            !app.blob_keys(&u).await.contains(key),
            "a real stray survived"
        );
    }
    assert_eq!(assert_bucket_matches_metadata(&app.state).await, UPLOADS);
}

/// An upload that streams for three grace periods, with the sweeper running
/// all along, commits: it keeps its intent alive, so only dead uploads are
/// taken for abandoned ones.
#[tokio::test]
async fn a_slow_live_upload_outlasts_the_grace_period() {
    use std::time::Duration;
    const CHUNKS: u8 = 20;
    const PAUSE: Duration = Duration::from_millis(300);
    let mut settings = test_settings();
    settings.sweep.intent_grace = Duration::from_secs(2);
    let app = spawn_app_with(settings).await;
    let u = app.create_user("slow").await;
    let body = futures::stream::iter(0..CHUNKS).then(|i| async move {
        tokio::time::sleep(PAUSE).await;
        Ok::<_, std::io::Error>(bytes::Bytes::from(vec![i; 1024]))
    });
    let upload = app
        .client
        .post(app.url("/v1/files?filename=slow.bin"))
        .bearer_auth(&u.key)
        .body(reqwest::Body::wrap_stream(body))
        .send();
    let sweeper = app.state.sweeper.clone();
    let mut abandoned = 0;
    let sweeping = async {
        loop {
            if let Outcome::Swept(r) = sweeper.try_run_once().await.unwrap() {
                abandoned += r.intents_abandoned;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    let res = tokio::select! {
        r = upload => r.unwrap(),
        _ = sweeping => unreachable!("the sweep loop never ends"),
    };
    let (status, body) = (res.status(), res.text().await.unwrap());
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(
        abandoned, 0,
        "the sweeper took a live upload for a dead one"
    );
    let id = serde_json::from_str::<Value>(&body).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let expected: Vec<u8> = (0..CHUNKS).flat_map(|i| vec![i; 1024]).collect();
    let got = app.download(&u, &id).await.bytes().await.unwrap();
    assert_eq!(got.as_ref(), expected.as_slice());
}

/// An upload that waits for its commit lock longer than the grace period,
/// with the sweeper running all along, commits: its intent is kept alive
/// while it waits, not only while it streams.
#[tokio::test]
async fn an_upload_waiting_for_its_lock_outlasts_the_grace_period() {
    use std::time::Duration;
    let mut settings = test_settings();
    settings.sweep.intent_grace = Duration::from_secs(2);
    let app = spawn_app_with(settings).await;
    let u = app.create_user("patient").await;
    let user = filedock::domain::UserId::parse(&u.id).unwrap();
    let lock = filedock::lock::LockKey::user_commit(&user);
    let held = app.state.ports.locks.acquire(&lock).await.unwrap();
    let sweeper = app.state.sweeper.clone();
    let mut abandoned = 0;
    let sweeping = async {
        loop {
            if let Outcome::Swept(r) = sweeper.try_run_once().await.unwrap() {
                abandoned += r.intents_abandoned;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    let holding = async {
        tokio::time::sleep(Duration::from_secs(5)).await;
        held.release().await;
        std::future::pending::<()>().await
    };
    let res = tokio::select! {
        r = app.upload_raw(&u, "patient.txt", b"waited".to_vec()) => r,
        _ = sweeping => unreachable!("the sweep loop never ends"),
        _ = holding => unreachable!(),
    };
    let (status, body) = (res.status(), res.text().await.unwrap());
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(
        abandoned, 0,
        "the sweeper took a waiting upload for a dead one"
    );
}

/// An object under the user's prefix with neither a record nor an intent.
async fn plant_stray(app: &TestApp, u: &TestUser) -> String {
    let key = BlobKey::file(u.id.parse().unwrap(), FileId::new());
    let body = futures::stream::iter([Ok(bytes::Bytes::from_static(b"stray"))]);
    app.state
        .ports
        .blobs
        .put(&key, Box::pin(body))
        .await
        .unwrap();
    key.to_string()
}

/// `sweep` and `reconcile` are run from cron and piped to `jq`: their stdout is
/// the JSON report alone, whatever the log level (logs go to stderr).
#[tokio::test]
async fn the_cron_commands_print_only_their_json_report_on_stdout() {
    let settings = test_settings();
    {
        // A dead upload's intent, so that the sweep has something to log.
        let state = AppState::build(settings.clone()).await.unwrap();
        let intent = IntentRecord {
            created_at: filedock::meta::now() - chrono::Duration::seconds(1),
            ..IntentRecord::new(UserId::new(), FileId::new(), state.ports.blobs.bucket())
        };
        state.ports.meta.put_intent(&intent).await.unwrap();
    }
    for args in [&["sweep"][..], &["reconcile"][..]] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_filedock"))
            .args(args)
            .envs(binary_env(&settings))
            .env("FILEDOCK_SWEEP_INTENT_GRACE_SECS", "0")
            .env("RUST_LOG", "debug")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let report: Result<Value, _> = serde_json::from_slice(&out.stdout);
        assert!(
            report.is_ok(),
            "{args:?} printed more than its report on stdout:\n{}",
            String::from_utf8_lossy(&out.stdout)
        );
        if args == ["sweep"] {
            assert_eq!(report.unwrap()["intents_abandoned"], 1);
            let logs = String::from_utf8_lossy(&out.stderr);
            assert!(
                logs.contains("sweep pass"),
                "the sweep's log is on stderr: {logs}"
            );
        }
    }
}

/// A log written to a file or a pipe (cron, systemd, a container runtime)
/// is plain text: colour codes are for a terminal only.
#[tokio::test]
async fn a_log_written_to_a_pipe_has_no_colour_codes() {
    use tokio::io::AsyncBufReadExt;
    let settings = test_settings();
    let port = filedock::testing::free_port();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_filedock"))
        .envs(binary_env(&settings))
        .env("FILEDOCK_BIND", format!("127.0.0.1:{port}"))
        .env("FILEDOCK_SWEEP_INTERVAL_SECS", "0")
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let mut log = String::new();
    let started = tokio::time::timeout(std::time::Duration::from_secs(30), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            log.push_str(&line);
            log.push('\n');
            if line.contains("filedock listening") {
                return true;
            }
        }
        false
    })
    .await;
    child.kill().await.unwrap();
    assert!(
        matches!(started, Ok(true)),
        "the server did not start: {log}"
    );
    assert!(
        !log.contains('\u{1b}'),
        "colour codes in a piped log: {log:?}"
    );
}

/// An intent that another open transaction holds (one a cut link stranded,
/// until it is ended) is skipped by a sweep pass, not a failure of the whole
/// pass: the other stale intents are abandoned now, the held one later.
#[tokio::test]
async fn a_sweep_passes_over_an_intent_another_transaction_holds() {
    use mongodb::bson::{Document, doc};
    if !real_backends() {
        eprintln!("needs the real servers: runs in the real-servers pass of scripts/test.sh");
        return;
    }
    let mut settings = test_settings();
    settings.sweep.intent_grace = std::time::Duration::ZERO;
    settings.sweep.interval = std::time::Duration::ZERO;
    let app = spawn_app_with(settings.clone()).await;
    let u = app.create_user("swept").await;
    let mut ids = Vec::new();
    for _ in 0..2 {
        let id = FileId::new();
        let intent = IntentRecord {
            created_at: filedock::meta::now() - chrono::Duration::seconds(1),
            ..IntentRecord::new(u.id.parse().unwrap(), id, app.state.ports.blobs.bucket())
        };
        app.state.ports.meta.put_intent(&intent).await.unwrap();
        ids.push(id.to_string());
    }
    let client = mongodb::Client::with_uri_str(std::env::var("FILEDOCK_TEST_MONGODB_URI").unwrap())
        .await
        .unwrap();
    let intents = client
        .database(&settings.mongodb_db)
        .collection::<Document>("upload_intents");
    let mut holder = client.start_session().await.unwrap();
    holder.start_transaction().await.unwrap();
    intents
        .update_one(doc! {"_id": &ids[0]}, doc! {"$set": {"held": true}})
        .session(&mut holder)
        .await
        .unwrap();

    let Outcome::Swept(first) = app.state.sweeper.try_run_once().await.unwrap() else {
        panic!("busy")
    };
    assert_eq!(first.intents_abandoned, 1, "the free intent goes now");
    holder.abort_transaction().await.unwrap();
    let Outcome::Swept(second) = app.state.sweeper.try_run_once().await.unwrap() else {
        panic!("busy")
    };
    assert_eq!(
        second.intents_abandoned, 1,
        "the held one goes once released"
    );
    assert_eq!(app.intents().await, 0);
}
