//! Queue mode on RabbitMQ (`FILEDOCK_QUEUE_BROKER=rabbitmq`), across
//! processes sharing one broker: every operation applied once, each
//! client's in the order it was acknowledged, each answer heard by the
//! instance that asked; a process SIGKILLed with deliveries in hand leaves
//! them to the standby consumer, none lost, none applied twice.

use std::{
    collections::HashSet,
    time::{Duration, Instant},
};

use futures::future::join_all;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::{helpers::*, queue::mcp_ids};

/// How long a waiter waits: an answer that came by its reply is back long
/// before; one whose reply was lost is answered at this deadline.
const WAIT_SECS: u64 = 60;

/// The environment of a process in queue mode on the machine's RabbitMQ
/// (`FILEDOCK_TEST_AMQP_URL`).
fn rabbit_env() -> Vec<(&'static str, String)> {
    let url = std::env::var("FILEDOCK_TEST_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into());
    vec![
        ("FILEDOCK_COORDINATION", "queue".into()),
        ("FILEDOCK_QUEUE_BROKER", "rabbitmq".into()),
        ("FILEDOCK_AMQP_URL", url),
        ("FILEDOCK_AMQP_QUEUE_EXPIRY_SECS", "120".into()),
        ("FILEDOCK_QUEUE_WAIT_SECS", WAIT_SECS.to_string()),
    ]
}

async fn spawn(settings: &filedock::config::Settings) -> Server {
    spawn_replying(settings, "direct").await
}

/// A process whose answers come back by `reply_to` (`FILEDOCK_AMQP_REPLY_TO`).
async fn spawn_replying(settings: &filedock::config::Settings, reply_to: &str) -> Server {
    let mut env = rabbit_env();
    env.push(("FILEDOCK_AMQP_REPLY_TO", reply_to.into()));
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    spawn_binary(settings, &env).await
}

fn skip() -> bool {
    if !real_backends() {
        eprintln!(
            "needs the real servers (and RabbitMQ): runs in the real-servers pass of scripts/test.sh"
        );
    }
    !real_backends()
}

/// Sends one request; its status, body and how long it took.
async fn call(
    client: &reqwest::Client,
    method: &str,
    url: String,
    key: &str,
    body: Option<Value>,
) -> (StatusCode, Value, Duration) {
    let started = Instant::now();
    let mut req = client
        .request(method.parse().unwrap(), url)
        .bearer_auth(key)
        .timeout(Duration::from_secs(2 * WAIT_SECS));
    if let Some(b) = body {
        req = req.json(&b);
    }
    match req.send().await {
        Ok(res) => {
            let status = res.status();
            let body = res.json().await.unwrap_or(Value::Null);
            (status, body, started.elapsed())
        }
        Err(e) => (
            StatusCode::BAD_GATEWAY,
            json!({"transport": e.to_string()}),
            started.elapsed(),
        ),
    }
}

/// A user (key) and an agent (id) created through `base`.
async fn user_and_agent(base: &str) -> (String, String) {
    let client = reqwest::Client::new();
    let key = create_user_at(base, ADMIN_KEY, "rq").await;
    let url = format!("{base}/v1/agents");
    let (status, agent, _) = call(&client, "POST", url, &key, Some(json!({"name": "hot"}))).await;
    assert_eq!(status, StatusCode::CREATED, "{agent}");
    (key, agent["id"].as_str().unwrap().to_owned())
}

/// Every event of the user whose key is `key`, in order.
pub(crate) async fn events_of(base: &str, key: &str) -> Vec<Value> {
    let client = reqwest::Client::new();
    let (mut all, mut cursor) = (Vec::new(), "0".to_owned());
    loop {
        let url = format!("{base}/v1/events?after={cursor}&limit=500");
        let (status, page, _) = call(&client, "GET", url, key, None).await;
        assert_eq!(status, StatusCode::OK, "{page}");
        let events = page["events"].as_array().unwrap().clone();
        if events.is_empty() {
            return all;
        }
        all.extend(events);
        cursor = page["cursor"].as_str().unwrap().to_owned();
    }
}

/// Asserts that `applied` holds each id once and each lane's ids in lane
/// order (a lane: one client's requests, each sent after the last answer).
pub(crate) fn assert_once_and_in_lane_order(applied: &[String], lanes: &[Vec<String>]) {
    let distinct: HashSet<&String> = applied.iter().collect();
    assert_eq!(distinct.len(), applied.len(), "none twice: {applied:?}");
    for lane in lanes {
        let order: Vec<&String> = applied.iter().filter(|id| lane.contains(id)).collect();
        let expected: Vec<&String> = lane.iter().collect();
        assert_eq!(order, expected, "a client's operations apply in its order");
    }
}

/// How many times the link `toggled` was connected and disconnected, by
/// `events`.
pub(crate) fn toggle_counts(events: &[Value]) -> (usize, usize) {
    let count = |kind: &str| {
        let toggled = |e: &&Value| e["type"] == kind && e["data"]["mcp_id"] == "toggled";
        events.iter().filter(toggled).count()
    };
    (
        count("agent.mcp_connected"),
        count("agent.mcp_disconnected"),
    )
}

/// The queue's figures at `base`, once they show nothing waiting.
async fn drained(base: &str) -> Value {
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let url = format!("{base}/v1/admin/queue");
        let (_, stats, _) = call(&client, "GET", url, ADMIN_KEY, None).await;
        if stats["length"] == 0 || Instant::now() > deadline {
            return stats;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Two processes on one broker: four clients each send 40 connects one
/// after another, alternating the process they ask, while a burst of 100
/// goes to both at once. Every one is answered 200 by its reply (long
/// before the waiter's deadline, which a reply gone to the wrong instance
/// would have to wait for), applied once, each client's in its order, and
/// the burst partly in group commits.
#[tokio::test]
async fn two_processes_on_one_broker_apply_each_operation_once_in_order_answering_the_asker() {
    two_processes_answering_by("direct").await;
}

/// The same, each process with a reply queue of its own.
#[tokio::test]
async fn two_processes_with_reply_queues_of_their_own_answer_the_asker() {
    two_processes_answering_by("queue").await;
}

async fn two_processes_answering_by(reply_to: &str) {
    if skip() {
        return;
    }
    let settings = test_settings();
    let servers = [
        spawn_replying(&settings, reply_to).await,
        spawn_replying(&settings, reply_to).await,
    ];
    let (key, agent) = user_and_agent(&servers[0].base).await;
    let client = reqwest::Client::new();
    let lanes: Vec<Vec<String>> = (0..4)
        .map(|l| (0..40).map(|i| format!("lane{l}-{i}")).collect())
        .collect();
    let runs = lanes.iter().enumerate().map(|(l, lane)| {
        let (client, key, agent) = (client.clone(), key.clone(), agent.clone());
        let bases: Vec<String> = servers.iter().map(|s| s.base.clone()).collect();
        async move {
            let mut slowest = Duration::ZERO;
            for (i, mcp) in lane.iter().enumerate() {
                let base = &bases[(l + i) % 2];
                let url = format!("{base}/v1/agents/{agent}/mcps/{mcp}");
                let (status, body, took) = call(&client, "PUT", url, &key, None).await;
                assert_eq!(status, StatusCode::OK, "{mcp}: {body}");
                slowest = slowest.max(took);
            }
            slowest
        }
    });
    let burst = (0..100).map(|i| {
        let base = &servers[i % 2].base;
        let url = format!("{base}/v1/agents/{agent}/mcps/burst-{i}");
        call(&client, "PUT", url, &key, None)
    });
    // One link connected and disconnected 20 times, one request after
    // another: an operation applied twice (a connect again after its
    // disconnect) would leave it there, or write an event too many.
    let toggles = async {
        let mut slowest = Duration::ZERO;
        for i in 0..40 {
            let method = if i % 2 == 0 { "PUT" } else { "DELETE" };
            let base = &servers[i % 2].base;
            let url = format!("{base}/v1/agents/{agent}/mcps/toggled");
            let (status, body, took) = call(&client, method, url, &key, None).await;
            assert_eq!(status, StatusCode::OK, "{method} toggled: {body}");
            slowest = slowest.max(took);
        }
        slowest
    };
    let (slowest_lanes, burst, toggled) = tokio::join!(join_all(runs), join_all(burst), toggles);
    let slowest_lanes = slowest_lanes.into_iter().chain([toggled]);
    let mut slowest = slowest_lanes.max().unwrap();
    for (status, body, took) in burst {
        assert_eq!(status, StatusCode::OK, "{body}");
        slowest = slowest.max(took);
    }
    eprintln!(
        "260 connects over 2 processes ({reply_to} replies); the slowest answer took {slowest:?}"
    );
    assert!(
        slowest < Duration::from_secs(WAIT_SECS / 2),
        "an answer came at the waiter's deadline, not by its reply: {slowest:?}"
    );
    let applied = mcp_ids(&servers[1].base, &key, &agent).await;
    assert_eq!(applied.len(), 260, "toggled is disconnected last");
    assert_once_and_in_lane_order(&applied, &lanes);
    let events = events_of(&servers[0].base, &key).await;
    assert_eq!(
        toggle_counts(&events),
        (20, 20),
        "each connect and disconnect applied once"
    );
    let mut grouped = 0.0;
    for s in &servers {
        grouped += metric_at(&s.base, "filedock_queue_grouped_total", "").await;
    }
    eprintln!("{grouped} of 260 operations applied in group commits");
    assert!(grouped > 0.0, "a burst on one key is applied in groups");
    let stats = drained(&servers[0].base).await;
    assert_eq!(stats["dead_letter_count"], 0, "{stats}");
}

/// The first process is every bucket's active consumer; it is SIGKILLed
/// with deliveries in hand. The broker hands them to the standby, which
/// applies each once (those the dead one applied are found in
/// `processed_ops`): every operation answered 200 before the kill is
/// there once, nothing is there twice, and what is sent after applies in
/// its order.
#[tokio::test]
async fn a_killed_process_leaves_its_deliveries_to_the_standby_none_lost_none_doubled() {
    if skip() {
        return;
    }
    let settings = test_settings();
    let first = spawn(&settings).await;
    let (key, agent) = user_and_agent(&first.base).await;
    let standby = spawn(&settings).await;
    let client = reqwest::Client::new();
    let early: Vec<_> = (0..150)
        .map(|i| {
            let (client, key) = (client.clone(), key.clone());
            let url = format!("{}/v1/agents/{agent}/mcps/early-{i}", first.base);
            tokio::spawn(async move { (i, call(&client, "PUT", url, &key, None).await) })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(20);
    while mcp_ids(&standby.base, &key, &agent).await.len() < 10 {
        assert!(Instant::now() < deadline, "nothing was applied");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    drop(first); // SIGKILL, with deliveries unacknowledged
    let mut answered = Vec::new();
    for t in early {
        let (i, (status, _, _)) = t.await.unwrap();
        if status == StatusCode::OK {
            answered.push(format!("early-{i}"));
        }
    }
    let late: Vec<String> = (0..30).map(|i| format!("late-{i}")).collect();
    for mcp in &late {
        let url = format!("{}/v1/agents/{agent}/mcps/{mcp}", standby.base);
        let (status, body, _) = call(&client, "PUT", url, &key, None).await;
        assert_eq!(status, StatusCode::OK, "{mcp}: {body}");
    }
    let applied = mcp_ids(&standby.base, &key, &agent).await;
    let early_applied = applied.iter().filter(|m| m.starts_with("early-")).count();
    eprintln!(
        "{} early connects answered 200 before the kill, {early_applied} applied in all",
        answered.len()
    );
    // What the standby applied of the early ones: what the dead one left,
    // delivered to it, unacknowledged, or still queued.
    let taken_over = metric_at(
        &standby.base,
        "filedock_queue_processed_total",
        "outcome=\"applied\"",
    )
    .await
        - late.len() as f64;
    eprintln!("the standby applied {taken_over} of them after the kill");
    assert!(
        taken_over > 0.0,
        "the kill came after everything was applied"
    );
    for mcp in &answered {
        assert!(
            applied.contains(mcp),
            "{mcp} was answered 200 and is not there"
        );
    }
    assert_once_and_in_lane_order(&applied, &[late]);
    let stats = drained(&standby.base).await;
    assert_eq!(stats["length"], 0, "nothing left in the queues: {stats}");
    assert_eq!(stats["dead_letter_count"], 0, "{stats}");
}
