//! Queue-based coordination across processes: exactly once, in order,
//! surviving a SIGKILL, dead-lettering poison, and falling back to the lock
//! path while Redis is down.

use std::time::{Duration, Instant};

use filedock::{
    config::Coordination,
    coord::{bucket_of, queue::RedisQueue},
    lock::LockKey,
};
use futures::future::join_all;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::{helpers::*, support::servers::OwnRedis};

const QUEUE: [(&str, &str); 1] = [("FILEDOCK_COORDINATION", "queue")];

fn skip() -> bool {
    if !real_backends() {
        eprintln!("needs the real servers: runs in the real-servers pass of scripts/test.sh");
    }
    !real_backends()
}

async fn call(
    client: &reqwest::Client,
    method: &str,
    url: String,
    key: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let mut req = client
        .request(method.parse().unwrap(), url)
        .bearer_auth(key)
        .timeout(Duration::from_secs(120));
    if let Some(b) = body {
        req = req.json(&b);
    }
    match req.send().await {
        Ok(res) => {
            let status = res.status();
            (status, res.json().await.unwrap_or(Value::Null))
        }
        Err(e) => (StatusCode::BAD_GATEWAY, json!({"transport": e.to_string()})),
    }
}

/// A user (key) and an agent (id) created through `base`.
async fn user_and_agent(base: &str) -> (String, String) {
    let client = reqwest::Client::new();
    let key = create_user_at(base, ADMIN_KEY, "q").await;
    let (_, agent) = call(
        &client,
        "POST",
        format!("{base}/v1/agents"),
        &key,
        Some(json!({"name": "hot"})),
    )
    .await;
    (key, agent["id"].as_str().unwrap().to_owned())
}

/// Waits until the feed (the admin's read) holds every event of the user
/// whose key is `key`: their sequencer has placed them all.
async fn until_feed_holds_all(base: &str, key: &str) {
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let url = format!("{base}/v1/events?limit=1000");
        let (_, own) = call(&client, "GET", url.clone(), key, None).await;
        let (_, all) = call(&client, "GET", url, ADMIN_KEY, None).await;
        let own = own["events"].as_array().map_or(0, Vec::len);
        if own > 0 && all["events"].as_array().map_or(0, Vec::len) >= own {
            return;
        }
        assert!(Instant::now() < deadline, "the feed never held the events");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The MCP ids enqueued for `agent`, in stream (enqueue) order.
async fn enqueued_links(settings: &filedock::config::Settings, agent: &str) -> Vec<String> {
    let client = redis::Client::open(std::env::var("FILEDOCK_TEST_REDIS_URL").unwrap()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let stream = RedisQueue::stream(
        &settings.redis_prefix,
        bucket_of(&LockKey::agent_config(agent)),
    );
    let reply: redis::streams::StreamRangeReply =
        redis::AsyncCommands::xrange_all(&mut conn, stream)
            .await
            .unwrap();
    reply
        .ids
        .iter()
        .filter_map(|e| serde_json::from_str::<Value>(&e.get::<String>("op")?).ok())
        .filter(|op| op["agent_id"] == agent)
        .map(|op| op["link_id"].as_str().unwrap().to_owned())
        .collect()
}

pub(crate) async fn mcp_ids(base: &str, key: &str, agent: &str) -> Vec<String> {
    let (_, a) = call(
        &reqwest::Client::new(),
        "GET",
        format!("{base}/v1/agents/{agent}"),
        key,
        None,
    )
    .await;
    a["mcp_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn three_processes_apply_300_operations_on_one_agent_once_each_in_enqueue_order() {
    if skip() {
        return;
    }
    let settings = test_settings();
    let servers = [
        spawn_binary(&settings, &QUEUE).await,
        spawn_binary(&settings, &QUEUE).await,
        spawn_binary(&settings, &QUEUE).await,
    ];
    let (key, agent) = user_and_agent(&servers[0].base).await;
    let client = reqwest::Client::new();
    let started = Instant::now();
    let ops = (0..300).map(|i| {
        let url = format!("{}/v1/agents/{agent}/mcps/mcp-{i}", servers[i % 3].base);
        call(&client, "PUT", url, &key, None)
    });
    for (status, body) in join_all(ops).await {
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    eprintln!(
        "300 queued connects over 3 processes in {:?}",
        started.elapsed()
    );
    let applied = mcp_ids(&servers[1].base, &key, &agent).await;
    assert_eq!(applied.len(), 300);
    let mut grouped = 0.0;
    for s in &servers {
        grouped += metric_at(&s.base, "filedock_queue_grouped_total", "").await;
    }
    eprintln!("{grouped} of 300 operations applied in group commits");
    assert!(grouped > 0.0, "a burst on one key is applied in groups");
    assert_eq!(
        applied
            .iter()
            .collect::<std::collections::HashSet<_>>()
            .len(),
        300,
        "none twice"
    );
    assert_eq!(
        applied,
        enqueued_links(&settings, &agent).await,
        "apply order is enqueue order"
    );
}

#[tokio::test]
async fn a_killed_process_leaves_its_operations_to_the_others_none_lost_none_doubled() {
    if skip() {
        return;
    }
    let settings = test_settings();
    let first = spawn_binary(&settings, &QUEUE).await;
    let (key, agent) = user_and_agent(&first.base).await;
    // The first process holds every bucket; kill it while its operations are in flight.
    let client = reqwest::Client::new();
    let doomed: Vec<_> = (0..100)
        .map(|i| {
            let (client, key) = (client.clone(), key.clone());
            let url = format!("{}/v1/agents/{agent}/mcps/early-{i}", first.base);
            tokio::spawn(async move { call(&client, "PUT", url, &key, None).await })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    while enqueued_links(&settings, &agent).await.len() < 10 {
        assert!(Instant::now() < deadline, "nothing was enqueued");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    drop(first); // SIGKILL, with operations enqueued and some not yet applied
    for t in doomed {
        let _ = t.await;
    }
    let others = [
        spawn_binary(&settings, &QUEUE).await,
        spawn_binary(&settings, &QUEUE).await,
    ];
    let ops = (0..100).map(|i| {
        let url = format!("{}/v1/agents/{agent}/mcps/late-{i}", others[i % 2].base);
        call(&client, "PUT", url, &key, None)
    });
    for (status, body) in join_all(ops).await {
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    let enqueued = enqueued_links(&settings, &agent).await;
    let applied = mcp_ids(&others[0].base, &key, &agent).await;
    let early = enqueued.iter().filter(|l| l.starts_with("early-")).count();
    eprintln!(
        "{early} operations were enqueued before the kill; all {} enqueued applied",
        enqueued.len()
    );
    assert!(early > 0, "the kill came before anything was enqueued");
    assert_eq!(
        applied, enqueued,
        "every enqueued operation applied once, in order"
    );
    let client = redis::Client::open(std::env::var("FILEDOCK_TEST_REDIS_URL").unwrap()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let dlq = format!("{}filedock_queue_dlq", settings.redis_prefix);
    let dead: u64 = redis::AsyncCommands::xlen(&mut conn, dlq).await.unwrap();
    assert_eq!(
        dead, 0,
        "a transaction left open by the killed process is waited out, not dead-lettered"
    );
}

/// A process that dies between its writes and its commit leaves the
/// transaction open on the server, holding the agent's document until the
/// server reaps it (60 s). The next holder of the bucket aborts it on taking
/// over, so the operations behind it finish within their waiters' deadline
/// (30 s plus 2 s per operation ahead) instead of timing out.
#[tokio::test]
async fn a_transaction_left_open_by_a_dead_process_does_not_hold_up_the_queue() {
    if skip() {
        return;
    }
    let settings = test_settings();
    // The user is made first, elsewhere: creating one (user and key) is a
    // transaction too, and would reach the crash point; and so would
    // placing its events in the feed, so that instance places them first.
    let first = spawn_binary(&settings, &QUEUE).await;
    let (key, agent) = user_and_agent(&first.base).await;
    until_feed_holds_all(&first.base, &key).await;
    drop(first);
    let crash = [QUEUE[0], ("FILEDOCK_TEST_CRASH_AT", "before_txn_commit")];
    let mut doomed = spawn_binary(&settings, &crash).await;
    let client = reqwest::Client::new();
    let url = format!("{}/v1/agents/{agent}/mcps/first", doomed.base);
    let (status, _) = call(&client, "PUT", url, &key, None).await;
    assert!(!status.is_success(), "the process died before answering");
    let deadline = Instant::now() + Duration::from_secs(10);
    while doomed.child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "the crash point was not reached");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let next = spawn_binary(&settings, &QUEUE).await;
    let ops = (0..20).map(|i| {
        let url = format!("{}/v1/agents/{agent}/mcps/after-{i}", next.base);
        call(&client, "PUT", url, &key, None)
    });
    for (status, body) in join_all(ops).await {
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    let applied = mcp_ids(&next.base, &key, &agent).await;
    assert_eq!(applied.len(), 21, "{applied:?}");
    assert_eq!(applied, enqueued_links(&settings, &agent).await);
}

/// Operations read together are applied in one transaction; one operation
/// the store refuses (here: files whose documents were corrupted, as in the
/// dead-letter test) refuses the group, and then each is applied alone: the
/// refused ones are dead-lettered, every other one lands, once.
#[tokio::test]
async fn a_refused_operation_in_a_group_fails_alone() {
    if skip() {
        return;
    }
    let mut settings = test_settings();
    settings.coordination = Coordination::Queue;
    let app = spawn_app_with(settings).await;
    let u = app.create_user("grouped").await;
    let mut files = Vec::new();
    for i in 0..40 {
        files.push(app.new_file(&u, i).await);
    }
    let (_, session) = app.json("POST", "/v1/sessions", &u, None).await;
    let session = session["id"].as_str().unwrap().to_owned();
    let mongo = mongodb::Client::with_uri_str(std::env::var("FILEDOCK_TEST_MONGODB_URI").unwrap())
        .await
        .unwrap();
    let poisoned: Vec<String> = files.iter().step_by(10).cloned().collect();
    mongo
        .database(&app.settings.mongodb_db)
        .collection::<bson::Document>("files")
        .update_many(
            bson::doc! {"_id": {"$in": &poisoned}},
            bson::doc! {"$set": {"sessions": "not a list"}},
        )
        .await
        .unwrap();
    let attaches = files.iter().map(|f| {
        app.json(
            "POST",
            format!("/v1/sessions/{session}/files"),
            &u,
            Some(json!({"file_id": f})),
        )
    });
    for (f, (status, body)) in files.iter().zip(join_all(attaches).await) {
        if poisoned.contains(f) {
            assert_eq!(body["error"]["code"], "dead_lettered", "{f}: {body}");
        } else {
            assert_eq!(status, StatusCode::OK, "{f}: {body}");
        }
    }
    let grouped = app.metric("filedock_queue_grouped_total", "").await;
    eprintln!("{grouped} of 40 attaches applied in group commits");
    let (_, s) = app
        .json("GET", format!("/v1/sessions/{session}"), &u, None)
        .await;
    let attached: Vec<&str> = s["file_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    let kept: Vec<&str> = files
        .iter()
        .filter(|f| !poisoned.contains(f))
        .map(String::as_str)
        .collect();
    assert_eq!(attached.len(), kept.len(), "each once: {attached:?}");
    assert_eq!(
        attached
            .into_iter()
            .collect::<std::collections::HashSet<_>>(),
        kept.into_iter().collect()
    );
}

#[tokio::test]
async fn a_poisoned_operation_is_dead_lettered_and_its_waiter_told() {
    if skip() {
        return;
    }
    let mut settings = test_settings();
    settings.coordination = Coordination::Queue;
    let app = spawn_app_with(settings).await;
    let (key, agent) = user_and_agent(&app.base).await;
    let client = reqwest::Client::new();
    let upload = client
        .post(app.url("/v1/files?filename=f.txt"))
        .bearer_auth(&key)
        .body("payload")
        .send()
        .await
        .unwrap();
    let file = upload.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    // Corrupt the file's back-references so that every attach fails in MongoDB.
    let mongo = mongodb::Client::with_uri_str(std::env::var("FILEDOCK_TEST_MONGODB_URI").unwrap())
        .await
        .unwrap();
    mongo
        .database(&app.settings.mongodb_db)
        .collection::<bson::Document>("files")
        .update_one(
            bson::doc! {"_id": &file},
            bson::doc! {"$set": {"agents": "not a list"}},
        )
        .await
        .unwrap();
    let attach = Some(json!({ "file_id": file }));
    let (status, body) = call(
        &client,
        "POST",
        app.url(&format!("/v1/agents/{agent}/files")),
        &key,
        attach,
    )
    .await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{body}");
    assert_eq!(body["error"]["code"], "dead_lettered");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("dead-letter"),
        "{body}"
    );
    // The queue goes on: the next operation on the same agent succeeds.
    let (status, _) = call(
        &client,
        "PUT",
        app.url(&format!("/v1/agents/{agent}/mcps/fine")),
        &key,
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    // Counted at once on Redis; on RabbitMQ, once the lengths are read
    // again (every second).
    let deadline = Instant::now() + Duration::from_secs(5);
    let stats = loop {
        let (_, stats) = call(&client, "GET", app.url("/v1/admin/queue"), ADMIN_KEY, None).await;
        if stats["dead_letter_count"] == 1 || Instant::now() > deadline {
            break stats;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(stats["mode"], "queue");
    assert_eq!(stats["dead_letter_count"], 1, "{stats}");
    assert!(stats["failure_rate"].as_f64().unwrap() > 0.0);
}

/// Operations on one agent keep their acknowledged order across the queue
/// and its fallback: through the queue, then (Redis down) the direct path,
/// then the queue again once Redis is back. The links are an array in the
/// order they were connected, so the order is compared, not just the set.
#[tokio::test]
async fn with_redis_down_operations_take_the_direct_path_and_the_queue_resumes_after() {
    if skip() {
        return;
    }
    let port = free_port();
    let mut redis = OwnRedis::start(port).await;
    let mut settings = test_settings();
    settings.coordination = Coordination::Queue;
    settings.redis_url = Some(format!("redis://127.0.0.1:{port}/").into());
    let app = spawn_app_with(settings).await;
    let (key, agent) = user_and_agent(&app.base).await;
    let client = reqwest::Client::new();
    let queued = || app.metric("filedock_queue_processed_total", "outcome=\"applied\"");
    let link = |method: &'static str, mcp: String| {
        let url = app.url(&format!("/v1/agents/{agent}/mcps/{mcp}"));
        let (client, key) = (client.clone(), key.clone());
        async move { call(&client, method, url, &key, None).await.0 }
    };

    assert_eq!(link("PUT", "one".into()).await, StatusCode::OK);
    assert_eq!(link("PUT", "two".into()).await, StatusCode::OK);
    assert_eq!(queued().await, 2.0, "applied by a queue worker");

    redis.stop();
    let started = Instant::now();
    // The direct path (development: without a lock): "one" leaves and comes
    // back after "three".
    for (method, mcp) in [("DELETE", "one"), ("PUT", "three"), ("PUT", "one")] {
        assert_eq!(
            link(method, mcp.into()).await,
            StatusCode::OK,
            "{method} {mcp}"
        );
    }
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(queued().await, 2.0, "not through the queue");

    let _redis = OwnRedis::start(port).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut n = 0;
    while queued().await < 3.0 {
        assert!(Instant::now() < deadline, "the queue did not resume");
        tokio::time::sleep(Duration::from_millis(300)).await;
        n += 1;
        assert_eq!(link("PUT", format!("again-{n}")).await, StatusCode::OK);
    }
    // Through the queue again: "two" leaves.
    assert_eq!(link("DELETE", "two".into()).await, StatusCode::OK);
    let all = mcp_ids(&app.base, &key, &agent).await;
    let expected: Vec<String> = ["three", "one"]
        .into_iter()
        .map(str::to_owned)
        .chain((1..=n).map(|i| format!("again-{i}")))
        .collect();
    assert_eq!(
        all, expected,
        "every operation applied once and in order, whichever path it took"
    );
}

/// A server that has stopped has given back every queue bucket it held and
/// left the members: its workers are waited for, not left running behind
/// the shutdown (another instance takes the buckets at once, not when the
/// leases run out).
#[tokio::test]
async fn a_stopped_server_has_given_back_its_queue_buckets() {
    if skip() {
        return;
    }
    let mut settings = test_settings();
    settings.coordination = Coordination::Queue;
    let prefix = settings.redis_prefix.clone();
    let app = spawn_app_with(settings).await;
    let client = redis::Client::open(std::env::var("FILEDOCK_TEST_REDIS_URL").unwrap()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    // The lease keys themselves, not the fencing counters beside them.
    let leases = || async {
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{prefix}filedock_queue_lease:*"))
            .query_async(&mut conn.clone())
            .await
            .unwrap();
        keys.into_iter().filter(|k| k.ends_with('}')).count()
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while leases().await < filedock::coord::BUCKETS as usize {
        assert!(
            Instant::now() < deadline,
            "the workers took {} buckets",
            leases().await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    app.stop().await;
    let held = leases().await;
    assert_eq!(held, 0, "{held} leases still held after the stop");
    let members: u64 = redis::cmd("ZCARD")
        .arg(format!("{prefix}filedock_queue_members"))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(members, 0, "the stopped instance is still a member");
}
