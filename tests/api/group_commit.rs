//! Group commit: one user's uploads whose bytes are stored commit together,
//! in one transaction, and each still gets its own answer. The tests hold
//! the user's commit lock while the uploads arrive, so that the group they
//! form does not depend on timing, then let go.

use std::{collections::HashSet, time::Duration};

use filedock::{
    config::LockScope,
    domain::UserId,
    lock::{Held, LockKey},
};
use futures::future::join_all;
use reqwest::{Response, StatusCode};
use serde_json::Value;

use crate::helpers::*;

/// The most uploads one group takes (the default `FILEDOCK_UPLOAD_GROUP_MAX`).
const GROUP_MAX: usize = 32;
/// How long the uploads may take to reach their committer.
const ARRIVAL_LIMIT: Duration = Duration::from_secs(30);

/// Takes `u`'s commit lock, as another instance committing for them would.
pub(crate) async fn hold_commit_lock(app: &TestApp, u: &TestUser) -> Held {
    let user = UserId::parse(&u.id).unwrap();
    app.state
        .ports
        .locks
        .acquire(&LockKey::user_commit(&user))
        .await
        .unwrap()
}

/// Waits until `n` uploads have stored their bytes and wait for a commit.
pub(crate) async fn until_waiting(app: &TestApp, n: usize) {
    let deadline = tokio::time::Instant::now() + ARRIVAL_LIMIT;
    loop {
        let waiting = app.metric("filedock_upload_commits_waiting", "").await;
        if waiting == n as f64 {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{waiting} of {n} uploads reached their committer"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Commit transactions run (attempts), and the write conflicts among them.
async fn commit_txns(app: &TestApp) -> (f64, f64) {
    let txns = app.metric("filedock_upload_commit_txns_total", "").await;
    let conflicts = app
        .metric("filedock_txn_write_conflicts_total", "op=\"commit_upload")
        .await;
    (txns, conflicts)
}

/// Sends an upload in a task of its own, so it runs while the test waits.
fn send(
    app: &TestApp,
    u: &TestUser,
    body: Vec<u8>,
    key: Option<&str>,
) -> tokio::task::JoinHandle<Response> {
    let mut req = app
        .client
        .post(app.url("/v1/files?filename=g.bin"))
        .bearer_auth(&u.key)
        .body(body);
    if let Some(k) = key {
        req = req.header("idempotency-key", k);
    }
    tokio::spawn(async move { req.send().await.unwrap() })
}

async fn statuses(sent: Vec<tokio::task::JoinHandle<Response>>) -> Vec<(StatusCode, Value)> {
    let mut out = Vec::new();
    for r in join_all(sent).await {
        let r = r.unwrap();
        out.push((r.status(), r.json().await.unwrap_or(Value::Null)));
    }
    out
}

async fn stored_user(app: &TestApp, u: &TestUser) -> filedock::meta::UserRecord {
    app.state
        .ports
        .meta
        .user(&u.user_id())
        .await
        .unwrap()
        .unwrap()
}

#[tokio::test]
async fn a_burst_by_one_user_commits_in_fewer_transactions_than_uploads() {
    let app = spawn_app().await;
    let u = app.create_user("burst").await;
    let n = GROUP_MAX + 8;
    let body = |i: usize| pseudo_random_bytes(100 + i, i as u64);
    let held = hold_commit_lock(&app, &u).await;
    let sent: Vec<_> = (0..n).map(|i| send(&app, &u, body(i), None)).collect();
    until_waiting(&app, n).await;
    held.release().await;
    let answers = statuses(sent).await;

    let mut created = Vec::new();
    for (i, (status, v)) in answers.iter().enumerate() {
        assert_eq!(*status, StatusCode::CREATED, "{v}");
        created.push((v["id"].as_str().unwrap().to_owned(), i));
    }
    let ids: HashSet<_> = created.iter().map(|(id, _)| id.clone()).collect();
    assert_eq!(ids.len(), n, "each upload its own file");
    let listed = app.list_ids(&u).await;
    assert_eq!(listed.iter().cloned().collect::<HashSet<_>>(), ids);
    let user = stored_user(&app, &u).await;
    assert_eq!(
        user.file_count, n as i64,
        "each file counted once on the user"
    );
    let bytes: usize = (0..n).map(|i| body(i).len()).sum();
    assert_eq!(user.used_bytes, bytes as i64, "usage exact");
    for (id, i) in &created {
        let got = app.download(&u, id).await.bytes().await.unwrap();
        assert_eq!(got.as_ref(), body(*i).as_slice(), "bytes of {id}");
    }
    assert_eq!(app.blob_keys(&u).await.len(), n, "no stray blob");
    assert_eq!(app.intents().await, 0, "every intent settled");

    let (txns, conflicts) = commit_txns(&app).await;
    let groups = n.div_ceil(GROUP_MAX) as f64;
    eprintln!("{n} uploads: {txns} commit transactions ({conflicts} retried)");
    assert_eq!(
        txns - conflicts,
        groups,
        "one transaction per group of {GROUP_MAX}"
    );
    assert!(txns < n as f64);
    let grouped = app.metric("filedock_uploads_grouped_total", "").await;
    assert_eq!(grouped, n as f64);
}

#[tokio::test]
async fn the_quota_is_decided_in_arrival_order_inside_a_group() {
    let mut settings = test_settings();
    settings.user_quota_bytes = Some(100);
    let app = spawn_app_with(settings).await;
    let u = app.create_user("quota").await;
    let held = hold_commit_lock(&app, &u).await;
    // One at a time into the group, so that their order is known: the
    // third does not fit after the first two; the fourth, smaller, does.
    let sizes = [40, 40, 30, 10];
    let mut sent = Vec::new();
    for (i, size) in sizes.into_iter().enumerate() {
        sent.push(send(&app, &u, vec![b'q'; size], None));
        until_waiting(&app, i + 1).await;
    }
    held.release().await;
    let answers = statuses(sent).await;
    let got: Vec<_> = answers.iter().map(|(s, _)| s.as_u16()).collect();
    assert_eq!(got, [201, 201, 507, 201]);
    assert_eq!(answers[2].1["error"]["code"], "quota_exceeded");
    let user = stored_user(&app, &u).await;
    assert_eq!(user.used_bytes, 90);
    assert_eq!(user.file_count, 3);
    assert_eq!(app.blob_keys(&u).await.len(), 3, "the refused blob is gone");
    assert_eq!(app.intents().await, 0);
    assert_eq!(
        commit_txns(&app).await.0,
        1.0,
        "one transaction for all four"
    );
}

#[tokio::test]
async fn a_burst_past_the_quota_commits_exactly_what_fits() {
    let (n, fits, size) = (12, 5, 10);
    let mut settings = test_settings();
    settings.user_quota_bytes = Some((fits * size) as u64);
    let app = spawn_app_with(settings).await;
    let u = app.create_user("full").await;
    let held = hold_commit_lock(&app, &u).await;
    let sent: Vec<_> = (0..n)
        .map(|_| send(&app, &u, vec![b'f'; size], None))
        .collect();
    until_waiting(&app, n).await;
    held.release().await;
    let answers = statuses(sent).await;
    let count = |code: u16| answers.iter().filter(|(s, _)| s.as_u16() == code).count();
    assert_eq!((count(201), count(507)), (fits, n - fits));
    let user = stored_user(&app, &u).await;
    assert_eq!(user.used_bytes, (fits * size) as i64, "usage exact");
    assert_eq!(app.list_ids(&u).await.len(), fits);
    assert_eq!(app.blob_keys(&u).await.len(), fits);
    assert_eq!(app.intents().await, 0);
}

#[tokio::test]
async fn a_key_in_flight_in_a_group_gets_409_and_its_retry_replays_the_grouped_commit() {
    // A key recorded by another instance while the group waited is a replay
    // inside the group (see the plan's unit tests); on one instance, the
    // key's second request is refused while the first waits in the group.
    let app = spawn_app().await;
    let u = app.create_user("replay").await;
    let held = hold_commit_lock(&app, &u).await;
    let mut sent = Vec::new();
    for (i, (body, key)) in [(&b"first"[..], Some("k1")), (b"other", None)]
        .into_iter()
        .enumerate()
    {
        sent.push(send(&app, &u, body.to_vec(), key));
        until_waiting(&app, i + 1).await;
    }
    let again = send(&app, &u, b"first".to_vec(), Some("k1")).await.unwrap();
    assert_eq!(
        error_code(again).await,
        (StatusCode::CONFLICT, "idempotency_key_in_flight".into())
    );
    held.release().await;
    let mut ids = Vec::new();
    for r in join_all(sent).await {
        let r = r.unwrap();
        assert_eq!(r.status(), StatusCode::CREATED);
        let v: Value = r.json().await.unwrap();
        ids.push(v["id"].as_str().unwrap().to_owned());
    }
    assert_eq!(commit_txns(&app).await.0, 1.0, "the two committed together");
    let retry = send(&app, &u, b"first".to_vec(), Some("k1")).await.unwrap();
    assert_eq!(retry.status(), StatusCode::CREATED);
    assert!(retry.headers().contains_key("idempotent-replayed"));
    let v: Value = retry.json().await.unwrap();
    assert_eq!(
        v["id"],
        ids[0].as_str(),
        "the replay answers the first upload's file"
    );
    let listed: HashSet<_> = app.list_ids(&u).await.into_iter().collect();
    assert_eq!(listed, HashSet::from([ids[0].clone(), ids[1].clone()]));
    assert_eq!(stored_user(&app, &u).await.used_bytes, 10);
    assert_eq!(
        app.blob_keys(&u).await.len(),
        2,
        "the refused and the replay keep no blob"
    );
    assert_eq!(app.intents().await, 0);
}

#[tokio::test]
async fn with_lock_scope_upload_each_upload_brings_its_own_fence() {
    // Each upload holds its category's lock while it streams: a small one
    // and a streamed (large) one group, and both fences are checked and stored.
    let mut settings = test_settings();
    settings.lock.scope = LockScope::Upload;
    let app = spawn_app_with(settings).await;
    let u = app.create_user("scoped").await;
    let held = hold_commit_lock(&app, &u).await;
    let small = send(&app, &u, b"small".to_vec(), None);
    let streamed = {
        let req = app
            .client
            .post(app.url("/v1/files?filename=s.bin"))
            .bearer_auth(&u.key)
            .body(reqwest::Body::wrap_stream(futures::stream::iter([Ok::<
                _,
                std::io::Error,
            >(
                b"streamed".to_vec(),
            )])));
        tokio::spawn(async move { req.send().await.unwrap() })
    };
    until_waiting(&app, 2).await;
    held.release().await;
    let answers = statuses(vec![small, streamed]).await;
    let categories: HashSet<_> = answers
        .iter()
        .map(|(s, v)| {
            assert_eq!(*s, StatusCode::CREATED, "{v}");
            v["category"].as_str().unwrap().to_owned()
        })
        .collect();
    assert_eq!(categories, HashSet::from(["small".into(), "large".into()]));
    let user = stored_user(&app, &u).await;
    assert_eq!(user.file_count, 2);
    let slots: HashSet<_> = user.upload_fence.keys().cloned().collect();
    assert_eq!(slots, HashSet::from(["small".into(), "large".into()]));
    assert_eq!(commit_txns(&app).await.0, 1.0, "one transaction for both");
}

#[tokio::test]
async fn with_group_commit_off_each_upload_commits_alone() {
    let mut settings = test_settings();
    settings.upload_group_commit = false;
    let app = spawn_app_with(settings).await;
    let u = app.create_user("alone").await;
    let n = 20;
    let sent: Vec<_> = (0..n)
        .map(|i| send(&app, &u, vec![i as u8; 64], None))
        .collect();
    for (s, v) in statuses(sent).await {
        assert_eq!(s, StatusCode::CREATED, "{v}");
    }
    assert_eq!(stored_user(&app, &u).await.file_count, n as i64);
    let (txns, conflicts) = commit_txns(&app).await;
    assert_eq!(txns - conflicts, n as f64, "one transaction per upload");
    assert_eq!(app.metric("filedock_uploads_grouped_total", "").await, 0.0);
}

/// A group the store refuses (one of its uploads had its intent swept while
/// it waited) is committed one upload at a time, so each gets its own
/// answer: the swept one 409 `upload_expired`, the others 201.
#[tokio::test]
async fn a_refused_group_is_committed_one_upload_at_a_time() {
    let app = spawn_app().await;
    let u = app.create_user("refused").await;
    let held = hold_commit_lock(&app, &u).await;
    let sizes = [10, 20, 30];
    let sent: Vec<_> = sizes
        .iter()
        .map(|&n| send(&app, &u, vec![b'r'; n], None))
        .collect();
    until_waiting(&app, sizes.len()).await;
    // One upload's intent is swept (as a stalled upload's would be).
    let far = filedock::meta::now() + chrono::Duration::days(1);
    let intents = app.state.ports.meta.intents(far, 10).await.unwrap();
    assert_eq!(intents.len(), sizes.len());
    let swept = intents[1].id;
    assert!(
        app.state
            .ports
            .meta
            .abandon_intent(&u.user_id(), &swept, None)
            .await
            .unwrap()
            .is_some(),
        "the intent was there to sweep"
    );
    held.release().await;
    let answers = statuses(sent).await;
    let mut got: Vec<u16> = answers.iter().map(|(s, _)| s.as_u16()).collect();
    got.sort();
    assert_eq!(got, [201, 201, 409], "{answers:?}");
    let refused = answers
        .iter()
        .find(|(s, _)| *s == StatusCode::CONFLICT)
        .unwrap();
    assert_eq!(refused.1["error"]["code"], "upload_expired");
    let created: HashSet<String> = answers
        .iter()
        .filter_map(|(_, v)| Some(v["id"].as_str()?.to_owned()))
        .collect();
    assert!(
        !created.contains(&swept.to_string()),
        "the swept upload was answered 201"
    );
    let listed: HashSet<String> = app.list_ids(&u).await.into_iter().collect();
    assert_eq!(listed, created, "the two others committed");
    let user = stored_user(&app, &u).await;
    let kept: i64 = answers
        .iter()
        .filter(|(s, _)| *s == StatusCode::CREATED)
        .map(|(_, v)| v["size"].as_i64().unwrap())
        .sum();
    assert_eq!(user.used_bytes, kept, "usage counts the two");
    // One transaction for the group, refused, then one per upload.
    let (txns, conflicts) = commit_txns(&app).await;
    assert_eq!(
        txns - conflicts,
        1.0 + sizes.len() as f64,
        "the group, then one each"
    );
    assert_eq!(app.metric("filedock_uploads_grouped_total", "").await, 0.0);
    assert_eq!(app.intents().await, 0);
}

/// A group whose commit answer is lost (the MongoDB link cut right after the
/// server answered `commitTransaction`) makes every member settle its own
/// outcome: the group applied, so each is answered 201, and nothing is
/// compensated.
#[tokio::test]
async fn a_group_whose_commit_answer_is_lost_answers_each_upload_as_applied() {
    if !real_backends() {
        eprintln!("needs the real servers: runs in the real-servers pass of scripts/test.sh");
        return;
    }
    let mongo: std::net::SocketAddr = std::env::var("FILEDOCK_TEST_MONGODB_URI")
        .unwrap()
        .trim_start_matches("mongodb://")
        .split(['/', '?'])
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let proxy = crate::support::fault_proxy::FaultProxy::start(mongo).await;
    let mut settings = test_settings();
    settings.mongodb_uri = Some(
        format!(
            "mongodb://{}/?directConnection=true&serverSelectionTimeoutMS=500",
            proxy.addr()
        )
        .into(),
    );
    let app = spawn_app_with(settings).await;
    let u = app.create_user("lost-group").await;
    let held = hold_commit_lock(&app, &u).await;
    let bodies: Vec<Vec<u8>> = (0..3)
        .map(|i| pseudo_random_bytes(100 + i, i as u64))
        .collect();
    let sent: Vec<_> = bodies
        .iter()
        .map(|b| send(&app, &u, b.clone(), None))
        .collect();
    until_waiting(&app, bodies.len()).await;
    // The next commit is the group's.
    proxy.cut_after(b"commitTransaction", Duration::from_secs(2));
    held.release().await;
    let answers = statuses(sent).await;
    assert!(proxy.triggered(), "the group never sent its commit");
    for (status, v) in &answers {
        assert_eq!(*status, StatusCode::CREATED, "{v}");
    }
    let created: HashSet<String> = answers
        .iter()
        .map(|(_, v)| v["id"].as_str().unwrap().to_owned())
        .collect();
    let listed: HashSet<String> = app.list_ids(&u).await.into_iter().collect();
    assert_eq!(listed, created);
    for ((_, v), body) in answers.iter().zip(&bodies) {
        let got = app
            .download(&u, v["id"].as_str().unwrap())
            .await
            .bytes()
            .await
            .unwrap();
        assert_eq!(got.as_ref(), body.as_slice(), "the bytes of {v}");
    }
    let total: usize = bodies.iter().map(Vec::len).sum();
    assert_eq!(stored_user(&app, &u).await.used_bytes, total as i64);
    assert_eq!(
        commit_txns(&app).await.0,
        1.0,
        "one transaction, not retried one by one"
    );
    assert_eq!(app.intents().await, 0);
    assert_bucket_matches_metadata(&app.state).await;
}
