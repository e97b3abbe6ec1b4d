//! filedock beside a Redis Cluster: three masters with a replica each, started
//! by scripts/stack.sh `stack_cluster_start` (FILEDOCK_TEST_REDIS_CLUSTER_URL
//! lists the six nodes). Skipped when it is not set.
//!
//! Issue 43: pointed at one node of a cluster, filedock took MOVED for an
//! outage and, in development, answered 36 uploads of 12 users 201 with 66
//! warnings "proceeding without a lock". A topology answer is never an outage: the request answers 503 with
//! nothing run, and a single-mode filedock refuses to start on a cluster node.

use std::sync::Arc;

use filedock::{
    config::{Coordination, Settings},
    http::AppState,
    lock::{Locks, redis::RedisLocks},
    ports::Ports,
};
use reqwest::StatusCode;

use crate::helpers::*;

/// The cluster's nodes, if the test script started one (with the real stack).
fn cluster_urls() -> Option<Vec<String>> {
    let urls = std::env::var("FILEDOCK_TEST_REDIS_CLUSTER_URL").ok()?;
    real_backends().then(|| urls.split(',').map(|u| u.trim().to_owned()).collect())
}

#[tokio::test]
async fn a_single_mode_filedock_refuses_to_start_on_a_cluster_node() {
    let Some(urls) = cluster_urls() else { return };
    let mut settings = test_settings();
    settings.redis_url = Some(urls[0].clone().into());
    let Err(e) = Ports::connect(&settings).await else {
        panic!("a single-mode filedock started on a cluster node");
    };
    let message = format!("{e:#}");
    assert!(
        message.contains("FILEDOCK_REDIS_MODE=cluster"),
        "the refusal names the setting: {message}"
    );
}

/// An app in single mode on the cluster node `node`, its start-up probe
/// bypassed (as for a node that joined a cluster after start): its lock
/// manager is made apart, on `node`.
async fn app_on_node(mut settings: Settings, node: String) -> TestApp {
    settings.redis_url = None;
    let mut ports = Ports::connect(&settings).await.expect("ports connect");
    let manager = RedisLocks::connect(&node, &settings.redis_prefix).expect("a lazy client");
    ports.locks = Arc::new(Locks::new(
        Arc::new(manager),
        settings.lock.clone(),
        false,
        ports.metrics.clone(),
    ));
    settings.redis_url = Some(node.into());
    spawn_app_with_state(AppState::with_ports(settings, ports).expect("app builds")).await
}

/// 12 users × 3 uploads at once, development mode, single mode pointed at one
/// master (the start-up probe bypassed, as a node that joined a cluster after
/// start would be): about two locks in three live on another master.
#[tokio::test]
async fn a_moved_answer_never_runs_an_upload_without_its_lock() {
    let Some(urls) = cluster_urls() else { return };
    let settings = test_settings();
    assert!(
        !settings.is_production(),
        "the degraded path is development's"
    );
    let node = urls[0].clone();
    let app = app_on_node(settings, node).await;

    let mut users = Vec::new();
    for i in 0..12 {
        users.push(app.create_user(&format!("moved-{i}")).await);
    }
    let uploads = users.iter().flat_map(|u| {
        let app = &app;
        (0..3).map(move |n| async move {
            let res = app.upload_raw(u, &format!("f{n}"), vec![b'x'; 64]).await;
            (u.id.clone(), error_code(res).await)
        })
    });
    let answers = futures::future::join_all(uploads).await;

    let mut created = std::collections::HashMap::<String, usize>::new();
    let (mut ok, mut refused) = (0, 0);
    for (user, answer) in &answers {
        match answer {
            (StatusCode::CREATED, _) => {
                ok += 1;
                *created.entry(user.clone()).or_default() += 1;
            }
            (StatusCode::SERVICE_UNAVAILABLE, code) if code == "dependency_unavailable" => {
                refused += 1
            }
            other => panic!("an upload answered {other:?}"),
        }
    }
    let degraded = app.metric("filedock_lock_degraded_total", "").await;
    let misrouted = app.metric("filedock_lock_misrouted_total", "").await;
    eprintln!(
        "36 uploads on one node of a cluster: {ok} created, {refused} refused 503; \
         lock_misrouted {misrouted}, lock_degraded {degraded}"
    );
    assert_eq!(degraded, 0.0, "an upload ran without its lock");
    assert!(refused > 0, "no lock key fell on another master");
    // Fewer than the 503s: one commit lock serves a group of uploads.
    assert!(misrouted > 0.0, "the 503s came from MOVED answers");
    // A 503 ran nothing: each user has exactly the files it was told were created.
    for u in &users {
        let listed = app.list_ids(u).await.len();
        assert_eq!(listed, created.get(&u.id).copied().unwrap_or(0), "{}", u.id);
    }
}

/// Queue mode, single mode on one master (the probe bypassed): an operation
/// whose bucket's stream lives on another master gets MOVED at XADD. It
/// answers 503 and does not take the direct lock path (which would also
/// mark Redis unhealthy and send the next second's operations around the
/// queue): every operation answered 200 was applied by a queue worker.
/// (Without the fix, a run here: 10 of 24 applied, 1 of them by the queue.)
#[tokio::test]
async fn a_moved_enqueue_never_takes_the_direct_path() {
    let Some(urls) = cluster_urls() else { return };
    let mut settings = test_settings();
    settings.coordination = Coordination::Queue;
    settings.queue_wait = std::time::Duration::from_secs(5);
    let node = urls[0].clone();
    // The queue's member list has no hash tag: a prefix that puts it on
    // this node, so that this node's buckets get workers (else nothing is
    // applied and the check below holds trivially).
    let mut probe = redis::Client::open(node.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    loop {
        let members = format!("{}filedock_queue_members", settings.redis_prefix);
        let here: redis::RedisResult<i64> = redis::AsyncCommands::exists(&mut probe, members).await;
        if here.is_ok() {
            break;
        }
        settings.redis_prefix = format!("q{}:", uuid::Uuid::new_v4().simple());
    }
    let app = app_on_node(settings, node).await;
    // Creating an agent goes through its user's bucket, which may live on
    // another master: new users until 24 agents (a run that stopped at 48
    // users made only 7).
    let mut agents = Vec::new();
    for i in 0..400 {
        if agents.len() == 24 {
            break;
        }
        let user = app.create_user(&format!("moved-queue-{i}")).await;
        let res = app
            .client
            .post(app.url("/v1/agents"))
            .bearer_auth(&user.key)
            .json(&serde_json::json!({ "name": "a" }))
            .send()
            .await
            .unwrap();
        if res.status() == StatusCode::CREATED {
            let agent: serde_json::Value = res.json().await.unwrap();
            agents.push((user, agent["id"].as_str().unwrap().to_owned()));
        }
    }
    assert!(
        agents.len() == 24,
        "too few agents created: {}",
        agents.len()
    );
    let connects = agents.iter().map(|(user, agent)| {
        let req = app
            .client
            .put(app.url(&format!("/v1/agents/{agent}/mcps/mcp-1")))
            .bearer_auth(&user.key)
            .timeout(std::time::Duration::from_secs(60));
        async move { error_code(req.send().await.unwrap()).await }
    });
    let (mut ok, mut refused, mut waited) = (0.0, 0, 0);
    for answer in futures::future::join_all(connects).await {
        match answer {
            (StatusCode::OK, _) => ok += 1.0,
            (StatusCode::SERVICE_UNAVAILABLE, code) if code == "dependency_unavailable" => {
                refused += 1
            }
            (StatusCode::TOO_MANY_REQUESTS, code) if code == "lock_timeout" => waited += 1,
            other => panic!("a connect answered {other:?}"),
        }
    }
    // A worker counts an operation just after delivering its result.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let mut processed;
    loop {
        // Applied ones only: an operation answered 429 and picked up
        // late is dead-lettered, also counted as processed.
        let applied = "outcome=\"applied\"";
        processed = app.metric("filedock_queue_processed_total", applied).await;
        if processed >= ok || std::time::Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    eprintln!(
        "{} connects on one node of a cluster, queue mode: {ok} applied, {refused} refused 503, \
         {waited} settled 429; {processed} processed by the queue",
        agents.len()
    );
    assert!(refused > 0, "no bucket's stream fell on another master");
    assert_eq!(processed, ok, "an operation took the direct path");
}
