//! Network faults between filedock and its backends, injected by a TCP
//! proxy on the real servers: what a client was told must stay true.

use std::{
    net::SocketAddr,
    time::{Duration, Instant},
};

use reqwest::StatusCode;
use serde_json::Value;

use crate::{helpers::*, support::fault_proxy::FaultProxy};

/// The real MongoDB's address, from the URI scripts/test.sh exports.
pub(crate) fn mongo_addr() -> SocketAddr {
    let uri = std::env::var("FILEDOCK_TEST_MONGODB_URI").unwrap();
    let host = uri
        .trim_start_matches("mongodb://")
        .split(['/', '?'])
        .next()
        .unwrap();
    host.parse().unwrap()
}

/// Settings whose MongoDB link runs through `proxy`. `directConnection`
/// keeps the driver from discovering the real address and going around it;
/// `query` adds driver options.
pub(crate) fn through_mongo_proxy(proxy: &FaultProxy, query: &str) -> filedock::config::Settings {
    let mut s = test_settings();
    s.mongodb_uri =
        Some(format!("mongodb://{}/?directConnection=true{query}", proxy.addr()).into());
    s
}

/// A short server selection, so that a link cut for seconds outlasts the
/// driver's and the store's own commit retries.
pub(crate) const FAST_SELECTION: &str = "&serverSelectionTimeoutMS=500";

#[tokio::test]
async fn an_upload_whose_commit_answer_is_lost_keeps_its_bytes() {
    if !real_backends() {
        eprintln!("needs the real servers: runs in the real-servers pass of scripts/test.sh");
        return;
    }
    let proxy = FaultProxy::start(mongo_addr()).await;
    let app = spawn_app_with(through_mongo_proxy(&proxy, FAST_SELECTION)).await;
    let u = app.create_user("unlucky").await;
    let bytes = pseudo_random_bytes(64 * 1024, 7);

    // The server gets commitTransaction and answers it (the proxy cuts once
    // the answer starts to arrive, so the commit applied); the answer is
    // lost, and the link stays down longer than the driver's and the
    // store's commit retries.
    proxy.cut_after(b"commitTransaction", Duration::from_secs(3));
    let res = app.upload_raw(&u, "kept.bin", bytes.clone()).await;
    assert!(proxy.triggered(), "the upload never sent its commit");
    let status = res.status();
    let body: Value = res.json().await.unwrap();
    assert_eq!(
        status,
        StatusCode::CREATED,
        "the commit applied; once the link is back the upload must say so: {body}"
    );
    let id = body["id"].as_str().unwrap();
    let got = app.download(&u, id).await;
    assert_eq!(
        got.status(),
        StatusCode::OK,
        "the committed file lost its bytes"
    );
    assert_eq!(got.bytes().await.unwrap().as_ref(), bytes.as_slice());
    assert_eq!(app.list_ids(&u).await, vec![id.to_owned()]);
    assert_eq!(app.intents().await, 0, "the commit removed the intent");
    assert_bucket_matches_metadata(&app.state).await;
}

/// The link is cut just after a transaction's first write reached the
/// server, which keeps that transaction open (MongoDB and SecantusDB do, until
/// they reap it), holding the user's document. The upload in flight is told
/// the store was unreachable; once the link is back, the user's next uploads
/// commit, instead of meeting that transaction as a write conflict.
#[tokio::test]
async fn a_transaction_cut_midway_is_an_outage_and_does_not_block_the_next_writers() {
    if !real_backends() {
        eprintln!("needs the real servers: runs in the real-servers pass of scripts/test.sh");
        return;
    }
    const DOWN: Duration = Duration::from_millis(1500);
    let proxy = FaultProxy::start(mongo_addr()).await;
    let app = spawn_app_with(through_mongo_proxy(&proxy, FAST_SELECTION)).await;
    let u = app.create_user("partitioned").await;

    proxy.cut_after(b"startTransaction", DOWN);
    let res = app.upload_raw(&u, "cut.bin", vec![1; 4096]).await;
    assert!(proxy.triggered(), "the upload never began its transaction");
    assert_eq!(
        error_code(res).await,
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "dependency_unavailable".into()
        ),
        "a broken link is an outage"
    );

    tokio::time::sleep(DOWN).await;
    let mut kept = Vec::new();
    for i in 0..5u64 {
        let bytes = pseudo_random_bytes(4096, i);
        let res = app
            .upload_raw(&u, &format!("after{i}.bin"), bytes.clone())
            .await;
        let (status, body) = (res.status(), res.text().await.unwrap());
        assert_eq!(
            status,
            StatusCode::CREATED,
            "upload {i} after the link healed: {body}"
        );
        let id = serde_json::from_str::<Value>(&body).unwrap()["id"]
            .as_str()
            .unwrap()
            .to_owned();
        kept.push(id);
    }
    let mut listed = app.list_ids(&u).await;
    listed.sort();
    kept.sort();
    assert_eq!(listed, kept, "only the acknowledged uploads are listed");
    let mut keys = app.blob_keys(&u).await;
    keys.sort();
    let expected: Vec<String> = kept
        .iter()
        .map(|id| format!("files/{}/{id}", u.id))
        .collect();
    assert_eq!(keys, expected, "the failed upload left its blob");
}

/// A sweep asked for over the admin API while MongoDB cannot be reached is
/// an outage (503, as `openapi.yaml` says), not a bug (500).
#[tokio::test]
async fn a_sweep_without_the_store_answers_503() {
    if !real_backends() {
        eprintln!("needs the real servers: runs in the real-servers pass of scripts/test.sh");
        return;
    }
    let proxy = FaultProxy::start(mongo_addr()).await;
    let mut settings = through_mongo_proxy(&proxy, FAST_SELECTION);
    settings.sweep.interval = Duration::ZERO; // only the pass asked for runs
    let app = spawn_app_with(settings).await;
    proxy.cut(Duration::from_secs(30));
    let res = app
        .client
        .post(app.url("/v1/admin/sweep"))
        .bearer_auth(ADMIN_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(
        error_code(res).await,
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "dependency_unavailable".into()
        )
    );
    proxy.heal();
}

/// A transaction cut mid-way holds what it wrote (the user's document) until
/// it is ended. Once the link heals, the instance that stranded it ends it by
/// itself — not at its own next transaction, which may never come — so
/// another instance's uploads for that user go through well before the
/// server would reap it (60 s).
#[tokio::test]
async fn a_transaction_cut_midway_stops_blocking_other_instances_once_the_link_heals() {
    if !real_backends() {
        eprintln!("needs the real servers: runs in the real-servers pass of scripts/test.sh");
        return;
    }
    const DOWN: Duration = Duration::from_millis(1500);
    /// Well under the server's own reaping of the transaction.
    const PATIENCE: Duration = Duration::from_secs(20);
    let proxy = FaultProxy::start(mongo_addr()).await;
    let through_proxy = through_mongo_proxy(&proxy, FAST_SELECTION);
    let mut direct = through_proxy.clone();
    direct.mongodb_uri = Some(std::env::var("FILEDOCK_TEST_MONGODB_URI").unwrap().into());
    let stranding = spawn_app_with(through_proxy).await;
    let other = spawn_app_with(direct).await;
    let u = stranding.create_user("shared").await;

    proxy.cut_after(b"startTransaction", DOWN);
    let res = stranding.upload_raw(&u, "cut.bin", vec![1; 4096]).await;
    assert!(proxy.triggered(), "the upload never began its transaction");
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);

    // The stranding instance does nothing more; the other one uploads.
    let deadline = Instant::now() + PATIENCE;
    let mut answers = Vec::new();
    loop {
        let res = other.upload_raw(&u, "after.bin", vec![2; 4096]).await;
        answers.push(res.status());
        if res.status() == StatusCode::CREATED {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the stranded transaction still blocks the user after {PATIENCE:?}: {answers:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        other.list_ids(&u).await.len(),
        1,
        "only the acknowledged upload is listed"
    );
}

/// An attach that applied, whose read-back of the agent then fails (the
/// link to MongoDB cut right after the commit was answered), is not
/// answered as failed: the outcome is reported unknown, with where to read
/// it — and it did apply.
#[tokio::test]
async fn an_applied_attach_whose_read_back_fails_is_not_answered_failed() {
    if !real_backends() {
        eprintln!("needs the real servers: runs in the real-servers pass of scripts/test.sh");
        return;
    }
    // BSON of `"find": "agents"`: the check before the change is the first,
    // the read-back after it the second.
    const FIND_AGENTS: &[u8] = b"\x02find\x00\x07\x00\x00\x00agents\x00";
    let proxy = FaultProxy::start(mongo_addr()).await;
    let app = spawn_app_with(through_mongo_proxy(&proxy, FAST_SELECTION)).await;
    let u = app.create_user("readback").await;
    let file = app.upload_raw(&u, "a.txt", b"a".to_vec()).await;
    let file: Value = file.json().await.unwrap();
    let (_, agent) = app
        .json(
            "POST",
            "/v1/agents",
            &u,
            Some(serde_json::json!({"name": "x"})),
        )
        .await;
    let agent = agent["id"].as_str().unwrap().to_owned();

    proxy.cut_after_nth(FIND_AGENTS, 1, Duration::from_secs(2));
    let body = serde_json::json!({"file_id": file["id"]});
    let res = app
        .json("POST", format!("/v1/agents/{agent}/files"), &u, Some(body))
        .await;
    assert!(proxy.triggered(), "the read-back never ran");
    assert_ne!(
        res.0,
        StatusCode::SERVICE_UNAVAILABLE,
        "answered failed: {}",
        res.1
    );
    assert!(
        res.0.is_success() || res.0 == StatusCode::GATEWAY_TIMEOUT,
        "{res:?}"
    );

    tokio::time::sleep(Duration::from_secs(2)).await;
    let (_, now) = app
        .json("GET", format!("/v1/agents/{agent}"), &u, None)
        .await;
    assert_eq!(
        now["file_ids"],
        serde_json::json!([file["id"]]),
        "it applied"
    );
}

/// The S3 link is cut right after the server answered a multipart upload's
/// `CompleteMultipartUpload`: the SDK sends it again, and the server no
/// longer knows the upload (it completed; S3 answers `NoSuchUpload`, s3s-fs
/// `AccessDenied`). The object is there: the upload must say 201, not 500.
#[tokio::test]
async fn a_multipart_upload_whose_complete_answer_is_lost_is_kept() {
    if !real_backends() {
        eprintln!("needs the real servers: runs in the real-servers pass of scripts/test.sh");
        return;
    }
    let s3: SocketAddr = std::env::var("FILEDOCK_TEST_S3_ENDPOINT")
        .unwrap()
        .trim_start_matches("http://")
        .parse()
        .unwrap();
    let proxy = FaultProxy::start(s3).await;
    let mut settings = test_settings();
    settings.s3.as_mut().unwrap().endpoint = format!("http://{}", proxy.addr());
    let app = spawn_app_with(settings).await;
    let u = app.create_user("completed").await;
    let bytes = pseudo_random_bytes(12 << 20, 3); // three 5 MiB parts
    proxy.cut_after(b"<CompleteMultipartUpload", Duration::from_millis(300));
    let res = app.upload_raw(&u, "parts.bin", bytes.clone()).await;
    assert!(proxy.triggered(), "the upload never completed its parts");
    let status = res.status();
    let body: Value = res.json().await.unwrap();
    assert_eq!(
        status,
        StatusCode::CREATED,
        "the object was completed: {body}"
    );
    let got = app.download(&u, body["id"].as_str().unwrap()).await;
    assert_eq!(got.bytes().await.unwrap().as_ref(), bytes.as_slice());
    assert_bucket_matches_metadata(&app.state).await;
}

/// The store loses a multipart upload while completing it (s3s-fs drops a
/// complete whose link is cut midway, after it forgot the upload; here the
/// test aborts the upload while the complete is held back): the SDK's retry
/// finds neither the upload nor an object. Nothing was stored because the
/// store failed: 503, not 500.
#[tokio::test]
async fn a_multipart_upload_the_store_lost_while_completing_is_an_outage() {
    if !real_backends() {
        eprintln!("needs the real servers: runs in the real-servers pass of scripts/test.sh");
        return;
    }
    let endpoint = std::env::var("FILEDOCK_TEST_S3_ENDPOINT").unwrap();
    let proxy = FaultProxy::start(endpoint.trim_start_matches("http://").parse().unwrap()).await;
    let mut settings = test_settings();
    let s3 = settings.s3.as_mut().unwrap();
    s3.endpoint = format!("http://{}", proxy.addr());
    let bucket = s3.bucket.clone();
    let app = spawn_app_with(settings).await;
    let u = app.create_user("lost-parts").await;
    let direct = aws_sdk_s3::Client::from_conf(
        aws_sdk_s3::Config::builder()
            .behavior_version(aws_sdk_s3::config::BehaviorVersion::latest())
            .endpoint_url(&endpoint)
            .region(aws_sdk_s3::config::Region::new("us-east-1"))
            .credentials_provider(aws_sdk_s3::config::Credentials::new(
                std::env::var("FILEDOCK_TEST_S3_ACCESS_KEY").unwrap(),
                std::env::var("FILEDOCK_TEST_S3_SECRET_KEY").unwrap(),
                None,
                None,
                "test",
            ))
            .force_path_style(true)
            .build(),
    );

    proxy.watch(format!("POST /{bucket}/").as_bytes());
    proxy.cut_instead_of(b"<CompleteMultipartUpload", Duration::from_millis(300));
    let upload = {
        let (client, url, key) = (
            app.client.clone(),
            app.url("/v1/files?filename=p.bin"),
            u.key.clone(),
        );
        tokio::spawn(async move {
            let res = client
                .post(url)
                .bearer_auth(key)
                .body(pseudo_random_bytes(12 << 20, 5))
                .send()
                .await
                .unwrap();
            error_code(res).await
        })
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while !proxy.triggered() {
        assert!(
            Instant::now() < deadline,
            "the upload never completed its parts"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    // The complete's request line: `POST /bucket/{key}?uploadId={id} HTTP/1.1`.
    let line = proxy.watched().pop().unwrap();
    let path = line.split(' ').next().unwrap();
    let (key, id) = path.split_once("?uploadId=").unwrap();
    direct
        .abort_multipart_upload()
        .bucket(&bucket)
        .key(key)
        .upload_id(id)
        .send()
        .await
        .unwrap();
    assert_eq!(
        upload.await.unwrap(),
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "dependency_unavailable".into()
        ),
        "the store lost the upload: an outage, not a bug"
    );
    assert!(app.list_ids(&u).await.is_empty(), "nothing is stored");
    assert_bucket_matches_metadata(&app.state).await;
}

/// A commit run again whole after an attempt that applied (the store said
/// it had not: a transient error, a stall) meets its own file. That is not
/// a conflict to answer 500 on but an unknown outcome, which the upload
/// settles by reading the file back; and the second run counts nothing.
#[tokio::test]
async fn a_commit_run_again_after_it_applied_is_an_unknown_outcome_not_a_conflict() {
    run_again_after_it_applied(&spawn_app().await).await;
}

/// [`a_commit_run_again_after_it_applied_is_an_unknown_outcome_not_a_conflict`]
/// on `app` (`bulk_write` runs it with the writes a command each).
pub(crate) async fn run_again_after_it_applied(app: &TestApp) {
    use filedock::meta::{CommitUpload, MetaError};

    let u = app.create_user("again").await;
    let up = app.upload_json(&u, "once.txt", b"once".to_vec()).await;
    let owner: filedock::vocab::UserId = u.id.parse().unwrap();
    let id = up["id"].as_str().unwrap().parse().unwrap();
    let meta = &app.state.ports.meta;
    let file = meta.file(&owner, &id).await.unwrap().expect("the file");
    let commit = CommitUpload {
        file,
        fence: None,
        quota_bytes: None,
        idempotency: None,
        resumable: false,
        state: None,
    };
    let again = meta.commit_upload(&commit).await;
    assert!(
        matches!(again, Err(MetaError::OutcomeUnknown(_))),
        "{again:?}"
    );
    let grouped = meta.commit_uploads(std::slice::from_ref(&commit)).await;
    assert!(
        matches!(grouped, Err(MetaError::OutcomeUnknown(_))),
        "{grouped:?}"
    );
    let user = meta.user(&owner).await.unwrap().expect("the user");
    assert_eq!((user.file_count, user.used_bytes), (1, 4), "counted once");
}

/// A session's create reaches the store and commits, and the commit's
/// answer is lost with the link (cut for longer than the driver's own
/// retry waits). It applied: it must not be answered failed (the fault
/// suite found a 503 here). The create is sent again with the same id once
/// the link is back, and its duplicate says it was created.
#[tokio::test]
async fn a_create_whose_answer_is_lost_is_answered_created() {
    if !real_backends() {
        eprintln!("needs the real servers: runs in the real-servers pass of scripts/test.sh");
        return;
    }
    /// BSON of `"insert": "sessions"`.
    const INSERT_SESSIONS: &[u8] = b"\x02insert\x00\x09\x00\x00\x00sessions\x00";
    let proxy = FaultProxy::start(mongo_addr()).await;
    let app = spawn_app_with(through_mongo_proxy(&proxy, FAST_SELECTION)).await;
    let u = app.create_user("unlucky").await;
    // The insert runs in a transaction with the user's document: the
    // answer lost is its commit's.
    let commit: &[u8] = b"commitTransaction";
    proxy.cut_after_sequence(&[INSERT_SESSIONS, commit], 0, Duration::from_secs(3));
    let res = app
        .client
        .post(app.url("/v1/sessions"))
        .bearer_auth(&u.key)
        .json(&serde_json::json!({}))
        .send()
        .await
        .unwrap();
    assert!(proxy.triggered(), "the create never reached the store");
    let status = res.status();
    let body: Value = res.json().await.unwrap();
    assert_eq!(status, StatusCode::CREATED, "it applied: {body}");
    let id = body["id"].as_str().unwrap();
    let (status, listed) = app.json("GET", "/v1/sessions", &u, None).await;
    assert_eq!(status, StatusCode::OK);
    let ids: Vec<_> = listed["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, vec![id], "one session, the one answered");
}

/// A key's revocation is one transaction (the key, its tokens, its id
/// kept): a link cut inside it (after its tokens' delete was sent, before
/// the commit) leaves nothing done. It is answered 503, the key still
/// works, and the revocation sent again holds. (When the key and its
/// tokens were deleted apart, the same cut left the key gone and answered
/// 503; then the key's delete was answered revoked.)
#[tokio::test]
async fn a_revocation_cut_before_its_commit_is_answered_failed_and_changes_nothing() {
    if !real_backends() {
        eprintln!("needs the real servers: runs in the real-servers pass of scripts/test.sh");
        return;
    }
    /// BSON of `"delete": "api_tokens"`.
    const DELETE_TOKENS: &[u8] = b"\x02delete\x00\x0b\x00\x00\x00api_tokens\x00";
    let proxy = FaultProxy::start(mongo_addr()).await;
    let app = spawn_app_with(through_mongo_proxy(&proxy, FAST_SELECTION)).await;
    let u = app.create_user("revoking").await;
    let spare = crate::keys::admin_key_for(&app, &u, "spare").await;
    let spare_key = spare["api_key"].as_str().unwrap().to_owned();
    let spare_id = spare["id"].as_str().unwrap().to_owned();
    let revoke = || {
        app.client
            .delete(app.url(&format!("/v1/me/keys/{spare_id}")))
            .bearer_auth(&u.key)
            .send()
    };
    let me = || {
        app.client
            .get(app.url("/v1/me"))
            .bearer_auth(&spare_key)
            .send()
    };
    proxy.cut_after(DELETE_TOKENS, Duration::from_secs(3));
    let res = revoke().await.unwrap();
    assert!(
        proxy.triggered(),
        "the tokens' delete never reached the store"
    );
    let status = res.status();
    assert_eq!(
        status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        res.text().await.unwrap()
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(me().await.unwrap().status(), StatusCode::OK, "not revoked");
    // Sent again: revoked (the cut transaction may hold the key a moment
    // longer, until the store aborts it: a conflict, answered 409).
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let status = revoke().await.unwrap().status();
        if status == StatusCode::NO_CONTENT {
            break;
        }
        assert!(
            matches!(
                status,
                StatusCode::CONFLICT | StatusCode::SERVICE_UNAVAILABLE
            ) && std::time::Instant::now() < deadline,
            "the revocation sent again answered {status}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(
        me().await.unwrap().status(),
        StatusCode::UNAUTHORIZED,
        "the key is revoked"
    );
}

/// The S3 link is cut right after the server answered a terminate's
/// `AbortMultipartUpload`: the SDK sends it again, and the server no longer
/// knows the upload (S3 answers `NoSuchUpload`, taken as aborted; s3s-fs
/// `AccessDenied`, which on S3 is a missing permission, so it cannot be
/// taken as aborted). The store refused: 503 `dependency_unavailable`,
/// not 500 (the fault suite met it), and the upload is still there to
/// terminate again or to expire.
#[tokio::test]
async fn a_terminate_whose_abort_answer_is_lost_is_an_outage_not_a_bug() {
    if !real_backends() {
        eprintln!("needs the real servers: runs in the real-servers pass of scripts/test.sh");
        return;
    }
    let endpoint = std::env::var("FILEDOCK_TEST_S3_ENDPOINT").unwrap();
    let proxy = FaultProxy::start(endpoint.trim_start_matches("http://").parse().unwrap()).await;
    let mut settings = test_settings();
    settings.s3.as_mut().unwrap().endpoint = format!("http://{}", proxy.addr());
    let app = spawn_app_with(settings).await;
    let user = app.create_user("lost-abort").await;
    let len = 12 << 20;
    let bytes = crate::tus::data(len);
    let id = crate::tus::create(&app, &user, len).await;
    let first = crate::tus::patch(&app, &user, &id, 0, &bytes[..6 << 20]).await;
    assert_eq!(first.status(), StatusCode::NO_CONTENT, "a part stored");
    proxy.cut_after(b"x-id=AbortMultipartUpload", Duration::from_millis(300));
    let res = app
        .client
        .delete(app.url(&format!("/v1/uploads/{id}")))
        .bearer_auth(&user.key)
        .header("tus-resumable", crate::tus::TUS)
        .send()
        .await
        .unwrap();
    assert!(proxy.triggered(), "the abort was not cut");
    let status = res.status();
    let body: Value = res.json().await.unwrap_or(Value::Null);
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["error"]["code"], "dependency_unavailable", "{body}");
    // Expired, the sweeper takes it (the write the store refuses to abort
    // is left to its backstops, not tried for ever): nothing of it stays.
    crate::tus_reserve::expire_and_sweep(&app, &id).await;
    let file_id = id.parse().unwrap();
    let meta = &app.state.ports.meta;
    let left = meta.resumable_by_id_alone(&file_id).await.unwrap();
    assert!(left.is_none(), "the upload's state stayed: {left:?}");
}
