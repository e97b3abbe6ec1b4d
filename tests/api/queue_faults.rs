//! Queue mode when an answer has to be given before the operation could be
//! applied: the answer must stay true afterwards.

use std::time::{Duration, Instant};

use filedock::config::Coordination;
use mongodb::bson::doc;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::*;

/// The agent as the API shows it.
async fn agent(app: &TestApp, key: &str, id: &str) -> Value {
    app.client
        .get(app.url(&format!("/v1/agents/{id}")))
        .bearer_auth(key)
        .send()
        .await
        .unwrap()
        .json()
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
    let mut settings = test_settings();
    settings.coordination = Coordination::Queue;
    settings.queue_wait = Duration::from_secs(1);
    let db_name = settings.mongodb_db.clone();
    let app = spawn_app_with(settings).await;
    let u = app.create_user("impatient").await;
    let created: Value = app
        .client
        .post(app.url("/v1/agents"))
        .bearer_auth(&u.key)
        .json(&json!({"name": "held"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let agent_id = created["id"].as_str().unwrap().to_owned();

    // Another client's transaction writes the agent and stays open.
    let mongo = mongodb::Client::with_uri_str(std::env::var("FILEDOCK_TEST_MONGODB_URI").unwrap())
        .await
        .unwrap();
    let agents = mongo
        .database(&db_name)
        .collection::<mongodb::bson::Document>("agents");
    let mut blocker = mongo.start_session().await.unwrap();
    blocker.start_transaction().await.unwrap();
    agents
        .update_one(doc! {"_id": &agent_id}, doc! {"$set": {"held": true}})
        .session(&mut blocker)
        .await
        .unwrap();

    let res = app
        .client
        .put(app.url(&format!("/v1/agents/{agent_id}/mcps/late")))
        .bearer_auth(&u.key)
        .send()
        .await
        .unwrap();
    assert!(res.headers().contains_key("retry-after"));
    assert_eq!(
        error_code(res).await,
        (StatusCode::TOO_MANY_REQUESTS, "lock_timeout".into()),
        "the wait ran out: the operation did not happen"
    );

    blocker.abort_transaction().await.unwrap();
    drained(&app).await;
    let now = agent(&app, &u.key, &agent_id).await;
    assert_eq!(
        now["mcp_ids"],
        json!([]),
        "an operation answered as not done was applied afterwards"
    );

    // The queue itself is fine: the same connect, sent again, applies.
    let res = app
        .client
        .put(app.url(&format!("/v1/agents/{agent_id}/mcps/late")))
        .bearer_auth(&u.key)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(
        agent(&app, &u.key, &agent_id).await["mcp_ids"],
        json!(["late"])
    );
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
    let mut settings = test_settings();
    settings.coordination = Coordination::Queue;
    let prefix = settings.redis_prefix.clone();
    let app = spawn_app_with(settings).await;
    let u = app.create_user("ordered").await;
    let created: Value = app
        .client
        .post(app.url("/v1/agents"))
        .bearer_auth(&u.key)
        .json(&json!({"name": "hot"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let agent_id = created["id"].as_str().unwrap().to_owned();
    let connect = |mcp: &'static str| {
        app.client
            .put(app.url(&format!("/v1/agents/{agent_id}/mcps/{mcp}")))
            .bearer_auth(&u.key)
            .send()
    };
    // The bucket's worker is running (it applied this).
    assert_eq!(connect("first").await.unwrap().status(), StatusCode::OK);

    // A stale worker ("ghost") reads the next entry: added and delivered to
    // it in one MULTI, so the owner's blocked read cannot get it first.
    let op = filedock::coord::Operation::Link {
        owner_id: u.id.clone(),
        agent_id: agent_id.clone(),
        kind: filedock::meta::LinkKind::Mcp,
        link_id: "second".into(),
        connected: true,
    };
    let stream = filedock::coord::queue::RedisQueue::stream(
        &prefix,
        filedock::coord::bucket_of(&filedock::lock::LockKey::agent_config(&agent_id)),
    );
    let client = redis::Client::open(std::env::var("FILEDOCK_TEST_REDIS_URL").unwrap()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let at = chrono::Utc::now().timestamp_millis();
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
        .arg(at)
        .cmd("XREADGROUP")
        .arg("GROUP")
        .arg("filedock")
        .arg("ghost")
        .arg("COUNT")
        .arg(1)
        .arg("STREAMS")
        .arg(&stream)
        .arg(">")
        .query_async(&mut conn)
        .await
        .unwrap();

    // A newer operation on the same agent, through the API.
    assert_eq!(connect("third").await.unwrap().status(), StatusCode::OK);
    drained(&app).await;
    assert_eq!(
        agent(&app, &u.key, &agent_id).await["mcp_ids"],
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
    let mut settings = test_settings();
    settings.coordination = Coordination::Queue;
    settings.queue_wait = Duration::from_secs(2);
    let (prefix, db_name) = (settings.redis_prefix.clone(), settings.mongodb_db.clone());
    let app = spawn_app_with(settings).await;
    let u = app.create_user("garbled").await;
    let created: Value = app
        .client
        .post(app.url("/v1/agents"))
        .bearer_auth(&u.key)
        .json(&json!({"name": "held"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let agent_id = created["id"].as_str().unwrap().to_owned();
    let mongo = mongodb::Client::with_uri_str(std::env::var("FILEDOCK_TEST_MONGODB_URI").unwrap())
        .await
        .unwrap();
    let mut blocker = mongo.start_session().await.unwrap();
    blocker.start_transaction().await.unwrap();
    mongo
        .database(&db_name)
        .collection::<mongodb::bson::Document>("agents")
        .update_one(doc! {"_id": &agent_id}, doc! {"$set": {"held": true}})
        .session(&mut blocker)
        .await
        .unwrap();

    let put = app
        .client
        .put(app.url(&format!("/v1/agents/{agent_id}/mcps/unread")))
        .bearer_auth(&u.key)
        .send();
    let garble = async {
        // Find the queued entry, then announce a result nobody can read.
        let stream = filedock::coord::queue::RedisQueue::stream(
            &prefix,
            filedock::coord::bucket_of(&filedock::lock::LockKey::agent_config(&agent_id)),
        );
        let client =
            redis::Client::open(std::env::var("FILEDOCK_TEST_REDIS_URL").unwrap()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
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
        let (op_id, instance): (String, String) =
            (entry.get("id").unwrap(), entry.get("reply").unwrap());
        let _: () = redis::AsyncCommands::set(
            &mut conn,
            format!("{prefix}filedock_queue_result:{op_id}"),
            "not json",
        )
        .await
        .unwrap();
        let _: i64 = redis::AsyncCommands::publish(
            &mut conn,
            format!("{prefix}filedock_queue_done:{instance}"),
            &op_id,
        )
        .await
        .unwrap();
    };
    let (res, ()) = tokio::join!(put, garble);
    let res = res.unwrap();
    let status = res.status();
    let applied = agent(&app, &u.key, &agent_id).await["mcp_ids"] == json!(["unread"]);
    assert!(
        status != StatusCode::OK || applied,
        "answered 200 while the operation had not applied"
    );
    assert_eq!(
        error_code(res).await,
        (StatusCode::TOO_MANY_REQUESTS, "lock_timeout".into())
    );
    blocker.abort_transaction().await.unwrap();
    drained(&app).await;
    assert_eq!(agent(&app, &u.key, &agent_id).await["mcp_ids"], json!([]));
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
    let proxy = crate::fault_proxy::FaultProxy::start(redis_addr.parse().unwrap()).await;
    let mut settings = test_settings();
    settings.coordination = Coordination::Queue;
    settings.redis_url = Some(format!("redis://{}/", proxy.addr()).into());
    let app = spawn_app_with(settings).await;
    let u = app.create_user("lost-reply").await;
    let created: Value = app
        .client
        .post(app.url("/v1/agents"))
        .bearer_auth(&u.key)
        .json(&json!({"name": "a"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let agent_id = created["id"].as_str().unwrap().to_owned();
    let link = |method: reqwest::Method, mcp: &'static str| {
        app.client
            .request(
                method,
                app.url(&format!("/v1/agents/{agent_id}/mcps/{mcp}")),
            )
            .bearer_auth(&u.key)
            .send()
    };
    assert_eq!(
        link(reqwest::Method::PUT, "warm").await.unwrap().status(),
        StatusCode::OK
    );

    proxy.cut_after(b"XADD", Duration::from_secs(1));
    let connect = link(reqwest::Method::PUT, "x").await.unwrap();
    assert!(proxy.triggered(), "the connect was never enqueued");
    assert_eq!(
        connect.status(),
        StatusCode::OK,
        "connect, by the lock path"
    );
    let disconnect = link(reqwest::Method::DELETE, "x").await.unwrap();
    assert_eq!(disconnect.status(), StatusCode::OK, "then disconnect");

    drained(&app).await;
    assert_eq!(
        agent(&app, &u.key, &agent_id).await["mcp_ids"],
        json!(["warm"]),
        "the queued copy of the connect applied again, after the disconnect"
    );
}
