//! Queue mode on RabbitMQ when the broker or a link to it fails: answers
//! stay true and in order, and arrive without waiting for the deadline.

use std::time::{Duration, Instant};

use filedock::{
    config::{Coordination, QueueBroker, Settings},
    coord::{bucket_of, queue::rabbit::RabbitQueue},
    lock::LockKey,
};
use futures::future::join_all;
use reqwest::StatusCode;

use crate::{
    helpers::*,
    queue::mcp_ids,
    queue_faults::hold_agent,
    rabbit_queue::{assert_once_and_in_lane_order, events_of, toggle_counts},
    support::{fault_proxy::FaultProxy, own_rabbit::OwnRabbit},
};

/// A waiter's base wait: an answer that came in far less did not wait for
/// its deadline.
const WAIT: Duration = Duration::from_secs(60);

/// Settings for an app in queue mode on the broker at `url`.
fn on_rabbit(settings: &Settings, url: String) -> Settings {
    let mut s = settings.clone();
    s.coordination = Coordination::Queue;
    s.queue_broker = QueueBroker::Rabbitmq;
    s.amqp_url = Some(url.into());
    s.amqp_queue_expiry = Some(Duration::from_secs(120));
    s.queue_wait = WAIT;
    s
}

fn machine_broker() -> String {
    std::env::var("FILEDOCK_TEST_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
}

/// An agent of `u`'s.
async fn agent_of(app: &TestApp, u: &TestUser) -> String {
    let (status, agent) = app
        .json(
            "POST",
            "/v1/agents",
            u,
            Some(serde_json::json!({"name": "a"})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{agent}");
    agent["id"].as_str().unwrap().to_owned()
}

/// Connects (PUT) or disconnects (DELETE) an MCP link; the status.
async fn link(app: &TestApp, u: &TestUser, method: &str, agent: &str, mcp: &str) -> StatusCode {
    let path = format!("/v1/agents/{agent}/mcps/{mcp}");
    app.json(method, path, u, None).await.0
}

/// The agent's MCP links, in the order they were connected.
async fn mcps(app: &TestApp, u: &TestUser, agent: &str) -> Vec<String> {
    mcp_ids(&app.base, &u.key, agent).await
}

/// The asker's link to the broker is cut while its operation waits to be
/// applied (another instance is the bucket's active consumer; a
/// transaction left open on the agent holds it back): its answer, sent by
/// reply to a channel that is gone, is lost. The waiter reads how its
/// operation was settled from the store once its connection has changed:
/// 200 within seconds, not at its deadline; applied once.
#[tokio::test]
async fn an_answer_lost_with_the_asker_s_link_is_read_from_the_store() {
    if !real_backends() {
        return;
    }
    let base = test_settings();
    // The consumer first: it is every bucket's active consumer.
    let consumer = spawn_app_with(on_rabbit(&base, machine_broker())).await;
    let broker: std::net::SocketAddr = "127.0.0.1:5672".parse().unwrap();
    let proxy = FaultProxy::start(broker).await;
    let via_proxy = format!("amqp://guest:guest@{}/%2f", proxy.addr());
    let asker = spawn_app_with(on_rabbit(&base, via_proxy)).await;
    let u = asker.create_user("lost-answer").await;
    let agent = agent_of(&asker, &u).await;
    let held = hold_agent(&asker, &agent).await;
    let started = Instant::now();
    let waiting = link(&asker, &u, "PUT", &agent, "lost");
    let faults = async {
        // Enqueued and delivered to the consumer, which waits on the agent.
        tokio::time::sleep(Duration::from_secs(1)).await;
        proxy.cut(Duration::from_secs(2));
        tokio::time::sleep(Duration::from_millis(2500)).await;
        drop(held); // aborted: the consumer applies, its answer goes nowhere
    };
    let (status, ()) = tokio::join!(waiting, faults);
    let took = started.elapsed();
    eprintln!("answered {status} after {took:?}");
    assert_eq!(status, StatusCode::OK);
    assert!(
        took < WAIT / 2,
        "answered at the waiter's deadline ({took:?}), not from the store"
    );
    assert_eq!(mcps(&consumer, &u, &agent).await, ["lost"]);
}

/// With the broker down, operations take the lock path at once; once it is
/// back, the queue again. The links are an array in the order they were
/// connected: every operation applied once and in order, whichever path it
/// took.
#[tokio::test]
async fn with_the_broker_down_operations_take_the_lock_path_and_the_queue_resumes_after() {
    if !real_backends() {
        return;
    }
    let mut rabbit = OwnRabbit::start().await;
    let app = spawn_app_with(on_rabbit(&test_settings(), rabbit.url())).await;
    let u = app.create_user("broker-down").await;
    let agent = agent_of(&app, &u).await;
    let queued = || app.metric("filedock_queue_processed_total", "outcome=\"applied\"");

    assert_eq!(link(&app, &u, "PUT", &agent, "one").await, StatusCode::OK);
    assert_eq!(link(&app, &u, "PUT", &agent, "two").await, StatusCode::OK);
    assert_eq!(queued().await, 2.0, "applied by a queue consumer");

    rabbit.kill();
    let started = Instant::now();
    for (method, mcp) in [("DELETE", "one"), ("PUT", "three"), ("PUT", "one")] {
        let status = link(&app, &u, method, &agent, mcp).await;
        assert_eq!(status, StatusCode::OK, "{method} {mcp}");
    }
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(queued().await, 2.0, "not through the queue");

    rabbit.restart().await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut n = 0;
    while queued().await < 3.0 {
        assert!(Instant::now() < deadline, "the queue did not resume");
        tokio::time::sleep(Duration::from_millis(300)).await;
        n += 1;
        let status = link(&app, &u, "PUT", &agent, &format!("again-{n}")).await;
        assert_eq!(status, StatusCode::OK);
    }
    assert_eq!(
        link(&app, &u, "DELETE", &agent, "two").await,
        StatusCode::OK
    );
    let expected: Vec<String> = ["three", "one"]
        .into_iter()
        .map(str::to_owned)
        .chain((1..=n).map(|i| format!("again-{i}")))
        .collect();
    assert_eq!(
        mcps(&app, &u, &agent).await,
        expected,
        "every operation applied once and in order, whichever path it took"
    );
}

/// Asks `asker` for `names` (links of `agent`) 150 ms apart while a
/// transaction holds the agent, so that they are delivered and wait; a
/// second in, the broker's memory alarm goes off; a second later the agent
/// is let go. Each must be answered applied, long before its deadline.
async fn answered_through_an_alarm(
    rabbit: &OwnRabbit,
    asker: &TestApp,
    u: &TestUser,
    agent: &str,
    names: &[&'static str],
) {
    let held = hold_agent(asker, agent).await;
    let started = Instant::now();
    let waiting = join_all(names.iter().enumerate().map(|(i, mcp)| async move {
        tokio::time::sleep(Duration::from_millis(150 * i as u64)).await;
        let status = link(asker, u, "PUT", agent, mcp).await;
        (mcp, status, started.elapsed())
    }));
    let alarm = async {
        tokio::time::sleep(Duration::from_secs(1)).await;
        rabbit.memory_alarm(true).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        drop(held);
    };
    let (answers, ()) = tokio::join!(waiting, alarm);
    for (mcp, status, took) in answers {
        eprintln!("{mcp} answered {status} after {took:?} through the alarm");
        assert_eq!(status, StatusCode::OK);
        assert!(
            took < WAIT / 3,
            "{mcp} answered at the waiter's deadline ({took:?}), not from the store"
        );
    }
}

/// A memory alarm of the broker's blocks every connection that publishes
/// (the broker stops reading them): an operation already delivered is
/// applied and acknowledged all the same (the consumers' connection
/// publishes nothing), and its waiter, whose answer the alarm holds, reads
/// it from the store within seconds, not at its deadline; requests made
/// during the alarm take the lock path at once, on the link kept; once it
/// clears, the queue again. Every operation applied once and in order.
#[tokio::test]
async fn a_broker_alarm_sends_requests_down_the_lock_path_and_answers_from_the_store() {
    if !real_backends() {
        return;
    }
    let rabbit = OwnRabbit::start().await;
    let app = spawn_app_with(on_rabbit(&test_settings(), rabbit.url())).await;
    let u = app.create_user("alarm").await;
    let agent = agent_of(&app, &u).await;
    let queued = || app.metric("filedock_queue_processed_total", "outcome=\"applied\"");
    assert_eq!(link(&app, &u, "PUT", &agent, "one").await, StatusCode::OK);
    assert_eq!(queued().await, 1.0, "applied by a queue consumer");

    // The broker takes the first answer published after the alarm (and
    // blocks the connection that sent it), and holds the others.
    let names = ["two-a", "two-b", "two-c"];
    answered_through_an_alarm(&rabbit, &app, &u, &agent, &names).await;
    // The alarm blocked the instance's publishing connection...
    assert!(
        rabbit.blocked_connections().await > 0,
        "no connection blocked: {:?}",
        rabbit.connection_states().await
    );
    // ...and the consumer acknowledged all the same (its answers held).
    let deadline = Instant::now() + Duration::from_secs(5);
    while rabbit.unacknowledged().await > 0 {
        assert!(
            Instant::now() < deadline,
            "deliveries stayed unacknowledged under the alarm"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(queued().await, 4.0, "applied by the queue's consumer");

    // The link knows it is blocked (its first answer met the alarm): the
    // requests take the lock path at once, not after a publish's 5 s; and
    // it is kept (no new connections made, to be blocked in turn).
    for (method, mcp) in [("DELETE", "one"), ("PUT", "three")] {
        let started = Instant::now();
        let status = link(&app, &u, method, &agent, mcp).await;
        let took = started.elapsed();
        assert_eq!(status, StatusCode::OK, "{method} {mcp}");
        assert!(took < Duration::from_secs(3), "{method} {mcp}: {took:?}");
    }
    let states = rabbit.connection_states().await;
    assert_eq!(
        states.len(),
        2,
        "the instance's two connections: {states:?}"
    );

    rabbit.memory_alarm(false).await;
    // The queue again: until a request goes through it (a copy of one
    // that met the alarm, delivered once it cleared, counts as applied
    // too, and cannot be told apart).
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut n = 0;
    loop {
        n += 1;
        let before = queued().await;
        let status = link(&app, &u, "PUT", &agent, &format!("again-{n}")).await;
        assert_eq!(status, StatusCode::OK);
        if queued().await > before {
            break;
        }
        assert!(Instant::now() < deadline, "the queue did not resume");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let expected: Vec<String> = names
        .into_iter()
        .chain(["three"])
        .map(str::to_owned)
        .chain((1..=n).map(|i| format!("again-{i}")))
        .collect();
    assert_eq!(
        mcps(&app, &u, &agent).await,
        expected,
        "every operation applied once and in order, whichever path it took"
    );
}

/// The alarm blocks the publishing connection of the instance that applies
/// (the bucket's active consumer), which leaves its answers unsent, while
/// the asking instance's link, which has not published since, is neither
/// blocked nor gone: its waiters read their outcome from the store every
/// few seconds all the same, and are answered long before their deadline.
#[tokio::test]
async fn answers_an_alarm_holds_on_another_instance_are_read_from_the_store() {
    if !real_backends() {
        return;
    }
    let rabbit = OwnRabbit::start().await;
    let settings = on_rabbit(&test_settings(), rabbit.url());
    // The consumer first: it is every bucket's active consumer.
    let consumer = spawn_app_with(settings.clone()).await;
    let asker = spawn_app_with(settings).await;
    let u = asker.create_user("held-elsewhere").await;
    let agent = agent_of(&asker, &u).await;
    let names = ["x1", "x2", "x3"];
    answered_through_an_alarm(&rabbit, &asker, &u, &agent, &names).await;
    rabbit.memory_alarm(false).await;
    assert_eq!(mcps(&consumer, &u, &agent).await, names);
}

/// With Redis cut (RabbitMQ up), a bucket's consumer cannot take its
/// lease: the operation delivered to it waits for Redis, and the bucket's
/// next requests take the lock path (which in production answers at once
/// that Redis is down: 503, nothing applied) rather than queue behind it
/// in vain. Once Redis is back, the waiting one applies and is answered.
#[tokio::test]
async fn a_bucket_whose_lease_cannot_be_taken_sends_its_requests_down_the_lock_path() {
    if !real_backends() {
        return;
    }
    let redis_url = std::env::var("FILEDOCK_TEST_REDIS_URL").unwrap();
    let redis_addr = redis_url
        .trim_start_matches("redis://")
        .trim_end_matches('/');
    let redis = FaultProxy::start(redis_addr.parse().unwrap()).await;
    // Production (no lock-free path with Redis down), on a node of its own
    // (production keeps its queues: no expiry).
    let rabbit = OwnRabbit::start().await;
    let mut settings = on_rabbit(&test_settings(), rabbit.url());
    settings.env = filedock::config::Environment::Production;
    settings.amqp_queue_expiry = None;
    settings.redis_url = Some(format!("redis://{}/", redis.addr()).into());
    let app = spawn_app_with(settings).await;
    let u = app.create_user("no-lease").await;
    let agent = agent_of(&app, &u).await;
    assert_eq!(link(&app, &u, "PUT", &agent, "one").await, StatusCode::OK);

    // Cut for longer than the lease (3 s): the consumer has lost it when
    // "two" is delivered, and cannot take it again until Redis is back.
    let cut = Duration::from_secs(10);
    redis.cut(cut);
    let cut_at = Instant::now();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let two = async {
        let status = link(&app, &u, "PUT", &agent, "two").await;
        (status, cut_at.elapsed())
    };
    let three = async {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let sent = Instant::now();
        let status = link(&app, &u, "PUT", &agent, "three").await;
        (status, sent.elapsed())
    };
    let ((two, two_at), (three, three_took)) = tokio::join!(two, three);
    eprintln!("two {two} at {two_at:?} into the cut; three {three} in {three_took:?}");
    assert_eq!(
        three,
        StatusCode::SERVICE_UNAVAILABLE,
        "the bucket's next request took the lock path"
    );
    assert!(three_took < Duration::from_secs(8), "{three_took:?}");
    assert_eq!(two, StatusCode::OK, "applied once Redis was back");
    assert!(two_at >= cut, "answered before Redis was back ({two_at:?})");
    assert_eq!(mcps(&app, &u, &agent).await, ["one", "two"]);
}

/// A bucket's queue deleted under a running instance (an operator's
/// `delete_queue`): a publish to it comes back unrouted (mandatory), is
/// declared again and published again once, and applies through the
/// queue, not the lock path. The consumer, cancelled by the deletion,
/// consumes the queue declared again.
#[tokio::test]
async fn an_operation_returned_for_a_deleted_queue_is_published_again_to_its_queue_declared_again()
{
    use lapin::{Connection, ConnectionProperties, options::QueueDeleteOptions};

    if !real_backends() {
        return;
    }
    let rabbit = OwnRabbit::start().await;
    let app = spawn_app_with(on_rabbit(&test_settings(), rabbit.url())).await;
    let u = app.create_user("returned").await;
    let agent = agent_of(&app, &u).await;
    let queued = || app.metric("filedock_queue_processed_total", "outcome=\"applied\"");
    let returned = || app.metric("filedock_queue_returned_total", "");
    assert_eq!(link(&app, &u, "PUT", &agent, "one").await, StatusCode::OK);
    let b = bucket_of(&LockKey::agent_config(&agent));
    let queue = RabbitQueue::queue_name(&app.settings.redis_prefix, b);
    let operator = Connection::connect(&rabbit.url(), ConnectionProperties::default())
        .await
        .unwrap();
    let channel = operator.create_channel().await.unwrap();
    // The instance declares the queue again within half a second of its
    // consumer's cancellation: the request must be published before that.
    let mut n = 0;
    while returned().await == 0.0 {
        n += 1;
        assert!(
            n <= 5,
            "no publish met the deleted queue in {} tries",
            n - 1
        );
        let before = queued().await;
        channel
            .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
            .await
            .unwrap();
        let status = link(&app, &u, "PUT", &agent, &format!("again-{n}")).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(queued().await, before + 1.0, "applied through the queue");
    }
    eprintln!("a publish met the deleted queue in try {n}");
    assert_eq!(link(&app, &u, "PUT", &agent, "last").await, StatusCode::OK);
    let expected: Vec<String> = std::iter::once("one".to_owned())
        .chain((1..=n).map(|i| format!("again-{i}")))
        .chain(std::iter::once("last".to_owned()))
        .collect();
    assert_eq!(mcps(&app, &u, &agent).await, expected);
}

/// The embedded metadata store (and local files) with the queue on
/// RabbitMQ (and its leases on Redis): one process, three clients each
/// connecting 30 links one after another while one link is connected and
/// disconnected 20 times: each client's links apply in its order, each
/// operation once (20 connect and 20 disconnect events for the toggled
/// link), all through the queue.
#[tokio::test]
async fn the_embedded_store_on_rabbitmq_applies_each_operation_once_in_order() {
    if !real_backends() {
        return;
    }
    let mut settings = on_rabbit(&test_settings(), machine_broker());
    settings.mongodb_uri = None;
    settings.s3 = None;
    let app = spawn_app_with(settings).await;
    let u = app.create_user("embedded").await;
    let agent = agent_of(&app, &u).await;
    let lanes: Vec<Vec<String>> = (0..3)
        .map(|l| (0..30).map(|i| format!("lane{l}-{i}")).collect())
        .collect();
    let runs = lanes.iter().map(|lane| {
        let (app, u, agent) = (&app, &u, &agent);
        async move {
            for mcp in lane {
                assert_eq!(
                    link(app, u, "PUT", agent, mcp).await,
                    StatusCode::OK,
                    "{mcp}"
                );
            }
        }
    });
    let toggles = async {
        for i in 0..40 {
            let method = if i % 2 == 0 { "PUT" } else { "DELETE" };
            assert_eq!(
                link(&app, &u, method, &agent, "toggled").await,
                StatusCode::OK
            );
        }
    };
    tokio::join!(futures::future::join_all(runs), toggles);
    let applied = mcps(&app, &u, &agent).await;
    assert_eq!(applied.len(), 90, "{applied:?}");
    assert_once_and_in_lane_order(&applied, &lanes);
    assert_eq!(
        toggle_counts(&events_of(&app.base, &u.key).await),
        (20, 20),
        "each connect and disconnect applied once"
    );
    let queued = app
        .metric("filedock_queue_processed_total", "outcome=\"applied\"")
        .await;
    assert_eq!(queued, 130.0, "every operation through the queue");
}
