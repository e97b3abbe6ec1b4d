//! Queue mode when an answer has to be given before the operation could be
//! applied: the answer must stay true afterwards.

use std::time::{Duration, Instant};

use filedock::{
    config::Coordination,
    coord::{
        bucket_of,
        queue::{self, RedisQueue},
    },
    lock::LockKey,
};
use mongodb::bson::doc;
use reqwest::{Response, StatusCode};
use serde_json::{Value, json};

use crate::helpers::*;

/// An app in queue mode on the real servers, waiting `wait` for a result.
async fn queue_app(wait: Duration) -> TestApp {
    let mut settings = test_settings();
    settings.coordination = Coordination::Queue;
    settings.queue_wait = wait;
    spawn_app_with(settings).await
}

/// The agent's MCP links as the API shows them.
async fn mcps(app: &TestApp, u: &TestUser, agent: &str) -> Value {
    app.json("GET", format!("/v1/agents/{agent}"), u, None)
        .await
        .1["mcp_ids"]
        .clone()
}

/// Connects (PUT) or disconnects (DELETE) an MCP link; the status.
async fn link(app: &TestApp, u: &TestUser, method: &str, agent: &str, mcp: &str) -> Response {
    app.client
        .request(
            method.parse().unwrap(),
            app.url(&format!("/v1/agents/{agent}/mcps/{mcp}")),
        )
        .bearer_auth(&u.key)
        .send()
        .await
        .unwrap()
}

/// Another client's transaction that writes the agent and stays open, so
/// that a worker's transactions on it meet write conflicts until it ends.
pub(crate) async fn hold_agent(app: &TestApp, agent: &str) -> mongodb::ClientSession {
    let mongo = mongodb::Client::with_uri_str(std::env::var("FILEDOCK_TEST_MONGODB_URI").unwrap())
        .await
        .unwrap();
    let mut held = mongo.start_session().await.unwrap();
    held.start_transaction().await.unwrap();
    mongo
        .database(&app.settings.mongodb_db)
        .collection::<mongodb::bson::Document>("agents")
        .update_one(doc! {"_id": agent}, doc! {"$set": {"held": true}})
        .session(&mut held)
        .await
        .unwrap();
    held
}

/// The bucket stream that carries the agent's link operations.
fn link_stream(app: &TestApp, agent: &str) -> String {
    RedisQueue::stream(
        &app.settings.redis_prefix,
        bucket_of(&LockKey::agent_config(agent)),
    )
}

async fn redis_conn() -> redis::aio::MultiplexedConnection {
    redis::Client::open(std::env::var("FILEDOCK_TEST_REDIS_URL").unwrap())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// Waits until no operation is queued or in flight.
async fn drained(app: &TestApp) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let stats: Value = app
            .client
            .get(app.url("/v1/admin/queue"))
            .bearer_auth(ADMIN_KEY)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if stats["length"] == 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the queue did not drain: {stats}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A worker cannot apply the operation in time (a transaction left open on
/// the agent holds it back with write conflicts). The waiter's answer, when
/// its wait runs out, is a definite "did not happen" (429), and it stays
/// true: once the agent is free the operation does not apply after all.
#[tokio::test]
async fn a_queued_operation_whose_wait_runs_out_never_applies_after_its_answer() {
    if !real_backends() {
        eprintln!("needs the real servers: runs in the real-servers pass of scripts/test.sh");
        return;
    }
    let app = queue_app(Duration::from_secs(1)).await;
    let u = app.create_user("impatient").await;
    let agent = app.new_agent(&u).await;
    let mut held = hold_agent(&app, &agent).await;

    let res = link(&app, &u, "PUT", &agent, "late").await;
    assert!(res.headers().contains_key("retry-after"));
    assert_eq!(
        error_code(res).await,
        (StatusCode::TOO_MANY_REQUESTS, "lock_timeout".into()),
        "the wait ran out: the operation did not happen"
    );

    held.abort_transaction().await.unwrap();
    drained(&app).await;
    assert_eq!(
        mcps(&app, &u, &agent).await,
        json!([]),
        "an operation answered as not done was applied afterwards"
    );
    // The queue itself is fine: the same connect, sent again, applies.
    assert_eq!(
        link(&app, &u, "PUT", &agent, "late").await.status(),
        StatusCode::OK
    );
    assert_eq!(mcps(&app, &u, &agent).await, json!(["late"]));
}

/// An entry that Redis delivered to a worker that no longer holds the
/// bucket (paused past its lease, it read after the bucket changed hands) is
/// taken over by the bucket's owner and applied before the newer entries.
#[tokio::test]
async fn an_entry_delivered_to_a_worker_that_lost_its_lease_is_applied_in_order() {
    if !real_backends() {
        eprintln!("needs the real servers: runs in the real-servers pass of scripts/test.sh");
        return;
    }
    let app = queue_app(Duration::from_secs(30)).await;
    let u = app.create_user("ordered").await;
    let agent = app.new_agent(&u).await;
    // The bucket's worker is running (it applied this).
    assert_eq!(
        link(&app, &u, "PUT", &agent, "first").await.status(),
        StatusCode::OK
    );

    // A stale worker ("ghost") reads the next entry: added and delivered to
    // it in one MULTI, so the owner's blocked read cannot get it first.
    let op = filedock::vocab::Operation::Link {
        owner_id: u.user_id(),
        agent_id: agent.parse().unwrap(),
        kind: filedock::vocab::LinkKind::Mcp,
        link_id: filedock::vocab::LinkId::parse("second").unwrap(),
        connected: true,
    };
    let stream = link_stream(&app, &agent);
    let _: redis::Value = redis::pipe()
        .atomic()
        .cmd("XADD")
        .arg(&stream)
        .arg("*")
        .arg("op")
        .arg(serde_json::to_string(&op).unwrap())
        .arg("id")
        .arg(uuid::Uuid::now_v7().to_string())
        .arg("at")
        .arg(chrono::Utc::now().timestamp_millis())
        .cmd("XREADGROUP")
        .arg("GROUP")
        .arg("filedock")
        .arg("ghost")
        .arg("COUNT")
        .arg(1)
        .arg("STREAMS")
        .arg(&stream)
        .arg(">")
        .query_async(&mut redis_conn().await)
        .await
        .unwrap();

    // A newer operation on the same agent, through the API.
    assert_eq!(
        link(&app, &u, "PUT", &agent, "third").await.status(),
        StatusCode::OK
    );
    drained(&app).await;
    assert_eq!(
        mcps(&app, &u, &agent).await,
        json!(["first", "second", "third"]),
        "the ghost's entry was stranded or applied out of order"
    );
}

/// The waiter is told its operation is done but its result cannot be read
/// (here: garbage where the result should be). That is not a success: the
/// waiter keeps waiting for a result it can read, and the operation, held
/// back until the wait runs out, is answered 429 and never applies.
#[tokio::test]
async fn a_result_that_cannot_be_read_is_not_taken_for_success() {
    if !real_backends() {
        eprintln!("needs the real servers: runs in the real-servers pass of scripts/test.sh");
        return;
    }
    let app = queue_app(Duration::from_secs(2)).await;
    let u = app.create_user("garbled").await;
    let agent = app.new_agent(&u).await;
    let mut held = hold_agent(&app, &agent).await;

    let garble = async {
        // Find the queued entry, then announce a result nobody can read.
        let mut conn = redis_conn().await;
        let stream = link_stream(&app, &agent);
        let entry = loop {
            let reply: redis::streams::StreamRangeReply =
                redis::AsyncCommands::xrange_all(&mut conn, &stream)
                    .await
                    .unwrap();
            if let Some(e) = reply.ids.into_iter().next() {
                break e;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let op_id: String = entry.get("id").unwrap();
        let instance: String = entry.get("reply").unwrap();
        let prefix = &app.settings.redis_prefix;
        let b = bucket_of(&LockKey::agent_config(&agent));
        let result = queue::result_key(prefix, b, &op_id);
        let _: () = redis::AsyncCommands::set(&mut conn, result, "not json")
            .await
            .unwrap();
        let done = queue::done_channel(prefix, b, &instance);
        // The waiter is registered (the entry is queued) and its instance
        // listens: the notice reaches it, and it reads the garbage.
        let told: i64 = redis::AsyncCommands::publish(&mut conn, done, &op_id)
            .await
            .unwrap();
        assert_eq!(told, 1, "the waiting instance never heard of the result");
    };
    let (res, ()) = tokio::join!(link(&app, &u, "PUT", &agent, "unread"), garble);
    let applied = mcps(&app, &u, &agent).await == json!(["unread"]);
    assert!(
        res.status() != StatusCode::OK || applied,
        "answered 200 while the operation had not applied"
    );
    assert_eq!(
        error_code(res).await,
        (StatusCode::TOO_MANY_REQUESTS, "lock_timeout".into())
    );
    held.abort_transaction().await.unwrap();
    drained(&app).await;
    assert_eq!(mcps(&app, &u, &agent).await, json!([]));
}

/// The Redis link is cut right after an enqueue (XADD) was sent: the entry
/// is in the stream, but the caller never hears so and takes the lock path,
/// and so does the next operation on the link. When Redis is back, the
/// queued copy must not apply a second time, after (and over) the later one.
#[tokio::test]
async fn an_enqueue_whose_answer_was_lost_applies_once() {
    if !real_backends() {
        eprintln!("needs the real servers: runs in the real-servers pass of scripts/test.sh");
        return;
    }
    let redis_url = std::env::var("FILEDOCK_TEST_REDIS_URL").unwrap();
    let redis_addr = redis_url
        .trim_start_matches("redis://")
        .trim_end_matches('/');
    let proxy = crate::support::fault_proxy::FaultProxy::start(redis_addr.parse().unwrap()).await;
    let mut settings = test_settings();
    settings.coordination = Coordination::Queue;
    settings.redis_url = Some(format!("redis://{}/", proxy.addr()).into());
    let app = spawn_app_with(settings).await;
    let u = app.create_user("lost-reply").await;
    let agent = app.new_agent(&u).await;
    assert_eq!(
        link(&app, &u, "PUT", &agent, "warm").await.status(),
        StatusCode::OK
    );

    proxy.cut_after(b"XADD", Duration::from_secs(1));
    let connect = link(&app, &u, "PUT", &agent, "x").await;
    assert!(proxy.triggered(), "the connect was never enqueued");
    assert_eq!(
        connect.status(),
        StatusCode::OK,
        "connect, by the lock path"
    );
    let disconnect = link(&app, &u, "DELETE", &agent, "x").await;
    assert_eq!(disconnect.status(), StatusCode::OK, "then disconnect");

    drained(&app).await;
    assert_eq!(
        mcps(&app, &u, &agent).await,
        json!(["warm"]),
        "the queued copy of the connect applied again, after the disconnect"
    );
}

/// Redis loses a queued operation (FLUSHALL) before any worker read it: its
/// waiter's answer, at the deadline, is 429 (it did not and will not apply),
/// and the queue works on after.
#[tokio::test]
async fn an_operation_lost_with_a_flushed_queue_is_cancelled_at_its_deadline() {
    if !real_backends() {
        eprintln!("needs the real servers: runs in the real-servers pass of scripts/test.sh");
        return;
    }
    let port = free_port();
    let _redis = crate::support::servers::OwnRedis::start(port).await;
    let url = format!("redis://127.0.0.1:{port}/");
    let mut settings = test_settings();
    settings.coordination = Coordination::Queue;
    settings.redis_url = Some(url.clone().into());
    settings.queue_wait = Duration::from_secs(2);
    // Every bucket leased by someone else: what is queued waits unread.
    let squatter =
        filedock::lock::redis::RedisLocks::connect(&url, &settings.redis_prefix).unwrap();
    for b in 0..filedock::coord::BUCKETS {
        let key = LockKey::queue_bucket(b);
        let lease = filedock::lock::LockManager::try_acquire(
            &squatter,
            key.as_str(),
            Duration::from_secs(60),
        );
        assert!(lease.await.unwrap().is_some(), "bucket {b} was free");
    }
    let app = spawn_app_with(settings).await;
    let u = app.create_user("flushed").await;
    let agent = app.new_agent(&u).await;

    let connect = link(&app, &u, "PUT", &agent, "lost");
    let flush = async {
        let mut conn = redis::Client::open(url.as_str())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let stream = link_stream(&app, &agent);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let queued: usize = redis::AsyncCommands::xlen(&mut conn, &stream)
                .await
                .unwrap();
            if queued == 1 {
                break;
            }
            assert!(Instant::now() < deadline, "the connect was never queued");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let () = redis::cmd("FLUSHALL").query_async(&mut conn).await.unwrap();
    };
    let (res, ()) = tokio::join!(connect, flush);
    assert!(res.headers().contains_key("retry-after"));
    assert_eq!(
        error_code(res).await,
        (StatusCode::TOO_MANY_REQUESTS, "lock_timeout".into()),
        "lost with the stream: cancelled at the deadline"
    );
    // The leases went with the flush: the workers take the buckets again.
    assert_eq!(
        link(&app, &u, "PUT", &agent, "after").await.status(),
        StatusCode::OK
    );
    drained(&app).await;
    assert_eq!(
        mcps(&app, &u, &agent).await,
        json!(["after"]),
        "the cancelled connect applied after all"
    );
}

/// A queued operation answered 404 (its agent deleted while it waited in
/// the queue) is settled as well as answered: its id is recorded in
/// `processed_ops`, refused `not_found`, so a redelivery of its entry (its
/// acknowledgement lost with a failed-over master) cannot apply after the
/// answer.
#[tokio::test]
async fn a_queued_operation_answered_not_found_is_settled() {
    if !real_backends() {
        eprintln!("needs the real servers: runs in the real-servers pass of scripts/test.sh");
        return;
    }
    let app = queue_app(Duration::from_secs(10)).await;
    let u = app.create_user("gone").await;
    let agent = app.new_agent(&u).await;
    // The worker waits on the held agent; meanwhile the holder deletes it.
    let mut held = hold_agent(&app, &agent).await;
    let stream = link_stream(&app, &agent);
    let gone = async {
        let mut conn = redis_conn().await;
        let deadline = Instant::now() + Duration::from_secs(15);
        let op_id: String = loop {
            assert!(Instant::now() < deadline, "the connect was never queued");
            let reply: redis::streams::StreamRangeReply =
                redis::AsyncCommands::xrange_all(&mut conn, &stream)
                    .await
                    .unwrap();
            let late = reply
                .ids
                .iter()
                .find(|e| e.get::<String>("op").is_some_and(|op| op.contains("late")));
            if let Some(id) = late.and_then(|e| e.get("id")) {
                break id;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let mongo = held.client();
        let agents = mongo
            .database(&app.settings.mongodb_db)
            .collection::<mongodb::bson::Document>("agents");
        agents
            .delete_one(doc! {"_id": &agent})
            .session(&mut held)
            .await
            .unwrap();
        held.commit_transaction().await.unwrap();
        (mongo, op_id)
    };
    let (res, (mongo, op_id)) = tokio::join!(link(&app, &u, "PUT", &agent, "late"), gone);
    assert_eq!(res.status(), StatusCode::NOT_FOUND);
    let settled = mongo
        .database(&app.settings.mongodb_db)
        .collection::<mongodb::bson::Document>("processed_ops")
        .find_one(doc! {"_id": &op_id})
        .await
        .unwrap();
    let refused = settled.as_ref().and_then(|d| d.get_str("refused").ok());
    assert_eq!(refused, Some("not_found"), "{settled:?}");
}
