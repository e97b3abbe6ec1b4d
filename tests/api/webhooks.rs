//! Webhooks (`FILEDOCK_WEBHOOK_URL`): every event `GET /v1/events` returns
//! is POSTed to a receiver in the test process, which verifies each
//! request with the `standardwebhooks` crate. At least once, each owner's
//! in sequence order, owners in parallel; an event failing past
//! `FILEDOCK_WEBHOOK_MAX_AGE_SECS` is dead-lettered (listed, replayed and
//! discarded under `/v1/admin/events/dead`) and its owner's later events go
//! on. Each wait is bounded and says what the receiver got when it fails.

use std::{
    collections::{HashMap, HashSet},
    time::Duration,
};

use filedock::{
    config::{Settings, WebhookSettings},
    domain::webhooks::{PARTITIONS, partition_of},
    http::AppState,
};
use reqwest::StatusCode;
use secrecy::SecretString;
use serde_json::{Value, json};

use crate::{
    events::all_events,
    helpers::*,
    support::webhook_receiver::{
        Delivery, WebhookReceiver, check_exact, check_order, random_secret, summary,
    },
};

/// The longest wait for deliveries that should come.
const WAIT: Duration = Duration::from_secs(20);

/// Owner → their events' `(seq, id)`, in sequence order.
type Expected = HashMap<String, Vec<(i64, String)>>;

/// Webhooks to `rx`, failed attempts retried after at most `retry_max`.
pub(crate) fn webhook_settings(rx: &WebhookReceiver, retry_max: Duration) -> WebhookSettings {
    WebhookSettings {
        urls: vec![rx.url()],
        secret: SecretString::from(rx.secret()),
        max_age: Duration::from_secs(86_400),
        concurrency: 16,
        timeout: Duration::from_secs(10),
        retry_max,
    }
}

/// A fresh instance's settings with webhooks to `rx`.
fn hooked(rx: &WebhookReceiver, retry_max: Duration) -> Settings {
    let mut s = test_settings();
    s.webhooks = Some(webhook_settings(rx, retry_max));
    s
}

fn admin() -> TestUser {
    TestUser {
        id: String::new(),
        key: ADMIN_KEY.into(),
    }
}

/// `files` uploads by `user` (every other one multipart), a rename of the
/// first and a delete of the second.
async fn workload(app: &TestApp, user: &TestUser, files: usize) -> Vec<String> {
    let mut ids = Vec::new();
    for i in 0..files {
        let bytes = format!("{}'s file {i}", user.id).into_bytes();
        let name = format!("f{i}.txt");
        let id = match i % 2 {
            0 => app.upload_json(user, &name, bytes).await["id"].clone(),
            _ => {
                let res = app.upload_multipart(user, &name, bytes).await;
                assert_eq!(res.status(), StatusCode::CREATED);
                res.json::<Value>().await.unwrap()["id"].clone()
            }
        };
        ids.push(id.as_str().expect("the upload committed").to_owned());
    }
    if files >= 1 {
        let (status, body) = app
            .json(
                "PATCH",
                format!("/v1/files/{}", ids[0]),
                user,
                Some(json!({"name": "renamed.txt"})),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    if files >= 2 {
        let res = app
            .client
            .delete(app.url(&format!("/v1/files/{}", ids[1])))
            .bearer_auth(&user.key)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::NO_CONTENT);
    }
    ids
}

/// Every event of `users` as `GET /v1/events` gives them, and as expected
/// deliveries.
async fn events_of(app: &TestApp, users: &[&TestUser]) -> (Vec<Value>, Expected) {
    let mut all = Vec::new();
    let mut expected = Expected::new();
    for user in users {
        let events = all_events(app, user, 100).await;
        assert!(!events.is_empty(), "{} has no events", user.id);
        expected.insert(
            user.id.clone(),
            events
                .iter()
                .map(|e| {
                    (
                        e["seq"].as_i64().unwrap(),
                        e["id"].as_str().unwrap().to_owned(),
                    )
                })
                .collect(),
        );
        all.extend(events);
    }
    (all, expected)
}

/// Waits until `rx` accepted every expected event, then checks the order
/// and that nothing else was accepted.
async fn delivered_in_order(rx: &WebhookReceiver, expected: &Expected) {
    if let Err(e) = rx.wait_accepted(expected, WAIT).await {
        panic!("the webhooks were not all delivered: {e}");
    }
    if let Err(e) = check_exact(&rx.accepted(), expected) {
        panic!("the webhooks' order or content is wrong: {e}");
    }
    if let Err(e) = rx.all_verified() {
        panic!("a request did not verify: {e}");
    }
}

/// Each event as delivered is the event `GET /v1/events` gives: its type,
/// its time as the timestamp, its data with its owner and number.
fn assert_bodies_match(rx: &WebhookReceiver, events: &[Value]) {
    let accepted = rx.accepted();
    for e in events {
        let id = e["id"].as_str().unwrap();
        let d = accepted
            .iter()
            .find(|d| d.webhook_id == id)
            .unwrap_or_else(|| panic!("{id} was not delivered"));
        assert_eq!(
            (d.method.as_str(), d.path.as_str()),
            ("POST", "/hooks"),
            "{id}"
        );
        assert_eq!(d.content_type, "application/json", "{id}");
        let ts: i64 = d.webhook_timestamp.parse().expect("a unix timestamp");
        let now = chrono::Utc::now().timestamp();
        assert!(
            (now - 120..=now + 1).contains(&ts),
            "{id}: webhook-timestamp {ts} is not the attempt's time ({now})"
        );
        let body = d.json.as_ref().expect("a JSON body");
        assert_eq!(body["type"], e["type"], "{id}: {body}");
        assert_eq!(body["timestamp"], e["time"], "{id}: {body}");
        assert_eq!(body["data"]["owner_id"], e["owner_id"], "{id}: {body}");
        assert_eq!(body["data"]["seq"], e["seq"], "{id}: {body}");
        if e["type"].as_str().unwrap().starts_with("file.") {
            assert_eq!(
                body["data"]["file_id"], e["data"]["file_id"],
                "{id}: {body}"
            );
            assert!(body["data"]["file_id"].is_string(), "{id}: {body}");
        }
        let mut data = e["data"].as_object().unwrap().clone();
        data.insert("owner_id".into(), e["owner_id"].clone());
        data.insert("seq".into(), e["seq"].clone());
        assert_eq!(body["data"], Value::Object(data), "{id}: the whole data");
        assert_eq!(
            body.as_object().unwrap().len(),
            3,
            "{id}: type, timestamp and data only: {body}"
        );
    }
}

/// Two users' uploads, renames, deletes and a session at once: every event
/// is delivered once at least, signed (verified by `standardwebhooks`),
/// as the event, each owner's in order.
#[tokio::test]
async fn every_event_is_delivered_signed_and_in_each_owner_s_order() {
    let rx = WebhookReceiver::start().await;
    let app = spawn_app_with(hooked(&rx, Duration::from_secs(60))).await;
    let (ann, bob) = (app.create_user("ann").await, app.create_user("bob").await);
    let session = async {
        app.new_session(&bob).await;
    };
    tokio::join!(workload(&app, &ann, 5), workload(&app, &bob, 4), session);
    let (events, expected) = events_of(&app, &[&ann, &bob]).await;
    assert_eq!(expected[&ann.id].len(), 7, "5 uploads, a rename, a delete");
    assert_eq!(
        expected[&bob.id].len(),
        7,
        "4 uploads, a session, a rename, a delete"
    );
    delivered_in_order(&rx, &expected).await;
    assert_bodies_match(&rx, &events);
    assert!(rx.refused().is_empty(), "{:?}", rx.refused());

    // Events after the first burst go too.
    workload(&app, &ann, 1).await;
    let (_, expected) = events_of(&app, &[&ann, &bob]).await;
    assert_eq!(expected[&ann.id].len(), 9);
    delivered_in_order(&rx, &expected).await;
    deliveries_counted(&app, "delivered", 16.0).await;
}

/// A receiver refusing one owner's events holds up only that owner: the
/// other's are delivered meanwhile; once it accepts, the held owner's all
/// come, in order, the first retried until then and none after it tried.
#[tokio::test]
async fn a_failing_owner_is_retried_and_does_not_hold_up_the_others() {
    let rx = WebhookReceiver::start().await;
    let app = spawn_app_with(hooked(&rx, Duration::from_millis(500))).await;
    let (ann, bob) = (app.create_user("ann").await, app.create_user("bob").await);
    rx.fail_owners([ann.id.clone()]);
    let failing_since = std::time::Instant::now();
    tokio::join!(workload(&app, &ann, 4), workload(&app, &bob, 4));
    let (_, expected) = events_of(&app, &[&ann, &bob]).await;
    let bob_only: Expected = [(bob.id.clone(), expected[&bob.id].clone())].into();
    if let Err(e) = rx.wait_accepted(&bob_only, WAIT).await {
        panic!("bob's events waited on ann's: {e}");
    }
    // Refused for about 2 s, retried meanwhile.
    let ann_refused = |log: &[Delivery]| {
        log.iter()
            .filter(|d| d.owner_id.as_deref() == Some(ann.id.as_str()) && !d.accepted())
            .count()
    };
    if let Err(e) = rx.wait_for(|log| ann_refused(log) >= 2, WAIT).await {
        panic!("ann's first event was not retried: {e}");
    }
    tokio::time::sleep(Duration::from_secs(2).saturating_sub(failing_since.elapsed())).await;
    assert!(
        rx.accepted()
            .iter()
            .all(|d| d.owner_id.as_deref() != Some(ann.id.as_str())),
        "the receiver refuses ann"
    );
    let refused = rx.refused();
    assert!(
        refused
            .iter()
            .all(|d| d.webhook_id == format!("{}:1", ann.id)),
        "only ann's first event is tried while it fails: {:?}",
        refused.iter().map(|d| &d.webhook_id).collect::<Vec<_>>()
    );
    let failed = refused.len();
    assert!(failed >= 2, "{failed} failed attempts");

    rx.answer_ok();
    delivered_in_order(&rx, &expected).await;
    // Once accepted, ann's first is not retried again and her next go.
    let first_ok = rx
        .accepted()
        .iter()
        .find(|d| d.owner_id.as_deref() == Some(ann.id.as_str()))
        .map(|d| d.webhook_id.clone());
    assert_eq!(first_ok, Some(format!("{}:1", ann.id)));
    deliveries_counted(&app, "failed", failed as f64).await;
}

/// Waits until `app` counts at least `n` delivery attempts of `outcome`
/// (`filedock_webhook_deliveries_total`; counted once the dispatcher
/// took the answer in, just after the receiver gave it).
async fn deliveries_counted(app: &TestApp, outcome: &str, n: f64) {
    let labels = format!("outcome=\"{outcome}\"");
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let counted = app
            .metric("filedock_webhook_deliveries_total", &labels)
            .await;
        if counted >= n {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{counted} webhook deliveries counted as {outcome} in {WAIT:?}, not {n} or more"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `GET /v1/admin/events/dead` (admin key) and what `id`'s letter says.
pub(crate) async fn dead_letters(app: &TestApp, query: &str) -> Value {
    let (status, body) = app
        .json(
            "GET",
            format!("/v1/admin/events/dead{query}"),
            &admin(),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body
}

/// An event refused past `FILEDOCK_WEBHOOK_MAX_AGE_SECS` is dead-lettered
/// (listed with its event) and its owner's later events go on; replayed
/// while the receiver still refuses it: 502 and kept; once it accepts:
/// 200, delivered and no longer listed. A letter discarded is gone; an
/// unknown one is 404; a user key may not list them.
#[tokio::test]
async fn an_event_failing_past_its_max_age_is_dead_lettered_and_replayable() {
    let rx = WebhookReceiver::start().await;
    let mut settings = hooked(&rx, Duration::from_millis(500));
    settings.webhooks.as_mut().unwrap().max_age = Duration::from_secs(1);
    settings.sweep.event_retention = Duration::from_secs(3600);
    let app = spawn_app_with(settings).await;
    let (ann, bob) = (app.create_user("ann").await, app.create_user("bob").await);
    let (ann1, bob1) = (format!("{}:1", ann.id), format!("{}:1", bob.id));
    rx.fail_ids([ann1.clone(), bob1.clone()]);
    tokio::join!(workload(&app, &ann, 3), workload(&app, &bob, 2));
    let (events, mut expected) = events_of(&app, &[&ann, &bob]).await;
    // All but the first of each are delivered, after it was given up on.
    for list in expected.values_mut() {
        assert_eq!(list[0].0, 1);
        list.remove(0);
    }
    delivered_in_order(&rx, &expected).await;
    let requests = rx.requests();
    for (first, owner) in [(&ann1, &ann), (&bob1, &bob)] {
        let last_try = requests
            .iter()
            .filter(|d| &d.webhook_id == first)
            .map(|d| d.n)
            .max()
            .unwrap_or_else(|| panic!("{first} was never tried"));
        let next = requests
            .iter()
            .find(|d| d.owner_id.as_deref() == Some(owner.id.as_str()) && d.seq == Some(2))
            .unwrap();
        assert!(
            next.n > last_try,
            "{owner}'s second event came before the first was given up on",
            owner = owner.id
        );
    }

    // Listed, with its event as GET /v1/events gives it; a page at a time.
    let all = dead_letters(&app, "").await;
    assert_eq!(all["next"], Value::Null, "{all}");
    let letters = all["dead_letters"].as_array().unwrap().clone();
    assert_eq!(letters.len(), 2, "{all}");
    for first in [&ann1, &bob1] {
        let letter = letters
            .iter()
            .find(|l| l["event"]["id"] == first.as_str())
            .unwrap_or_else(|| panic!("{first} is not a dead letter: {all}"));
        let event = events.iter().find(|e| e["id"] == first.as_str()).unwrap();
        assert_eq!(&letter["event"], event, "the letter's event is the event");
        assert_eq!(letter["url"], rx.url());
        assert!(letter["attempts"].as_u64().unwrap() >= 1, "{letter}");
        assert!(
            letter["last_error"].as_str().unwrap().contains("500"),
            "{letter}"
        );
        assert!(letter["dead_at"].is_string(), "{letter}");
        assert!(letter["id"].is_string(), "{letter}");
    }
    let one = dead_letters(&app, "?limit=1").await;
    assert_eq!(one["dead_letters"].as_array().unwrap().len(), 1, "{one}");
    assert_eq!(one["dead_letters"][0], letters[0], "in id order");
    let next = one["next"].as_str().expect("a next page").to_owned();
    let two = dead_letters(&app, &format!("?limit=1&after={next}")).await;
    assert_eq!(two["dead_letters"][0], letters[1], "{two}");
    let three = dead_letters(
        &app,
        &format!("?limit=1&after={}", letters[1]["id"].as_str().unwrap()),
    )
    .await;
    assert_eq!(three, json!({"dead_letters": [], "next": null}));

    let letter_of = |first: &str| {
        letters.iter().find(|l| l["event"]["id"] == first).unwrap()["id"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let (ann_letter, bob_letter) = (letter_of(&ann1), letter_of(&bob1));
    let admin = admin();
    let replay = |id: &str| {
        app.json(
            "POST",
            format!("/v1/admin/events/dead/{id}/replay"),
            &admin,
            None,
        )
    };
    // Still refused: 502, and kept.
    rx.fail_all();
    let tried = rx
        .requests()
        .iter()
        .filter(|d| d.webhook_id == ann1)
        .count();
    let (status, body) = replay(&ann_letter).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{body}");
    assert_eq!(body["error"]["code"], "delivery_failed", "{body}");
    assert!(body["error"]["message"].is_string(), "{body}");
    assert_eq!(
        rx.requests()
            .iter()
            .filter(|d| d.webhook_id == ann1)
            .count(),
        tried + 1,
        "the replay was sent"
    );
    assert_eq!(
        dead_letters(&app, "").await["dead_letters"]
            .as_array()
            .unwrap()
            .len(),
        2
    );

    // Accepted: 200, delivered, gone.
    rx.answer_ok();
    let (status, body) = replay(&ann_letter).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body, json!({"replayed": true, "status": 200}));
    let got = rx
        .accepted()
        .into_iter()
        .find(|d| d.webhook_id == ann1)
        .expect("the replay delivered");
    assert!(got.verified.is_ok(), "{:?}", got.verified);
    let event = events.iter().find(|e| e["id"] == ann1.as_str()).unwrap();
    assert_eq!(got.json.as_ref().unwrap()["type"], event["type"]);
    assert_eq!(got.json.as_ref().unwrap()["timestamp"], event["time"]);
    let left = dead_letters(&app, "").await;
    assert_eq!(left["dead_letters"].as_array().unwrap().len(), 1, "{left}");
    assert_eq!(left["dead_letters"][0]["id"], bob_letter.as_str());
    let (status, body) = replay(&ann_letter).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "replayed once: {body}");

    // Discarded: 204, then gone (404).
    let discard = |id: &str| {
        app.client
            .delete(app.url(&format!("/v1/admin/events/dead/{id}")))
            .bearer_auth(ADMIN_KEY)
            .send()
    };
    assert_eq!(
        discard(&bob_letter).await.unwrap().status(),
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        dead_letters(&app, "").await,
        json!({"dead_letters": [], "next": null})
    );
    let (status, code) = error_code(discard(&bob_letter).await.unwrap()).await;
    assert_eq!(
        (status, code.as_str()),
        (StatusCode::NOT_FOUND, "not_found")
    );
    let (status, _) = error_code(discard("no-such-letter").await.unwrap()).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = replay("no-such-letter").await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // The admin's only.
    for user in [&ann, &bob] {
        let (status, body) = app.json("GET", "/v1/admin/events/dead", user, None).await;
        assert!(
            [StatusCode::UNAUTHORIZED, StatusCode::FORBIDDEN].contains(&status),
            "{status}: {body}"
        );
    }
    let res = app
        .client
        .get(app.url("/v1/admin/events/dead"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    let res = app
        .client
        .post(app.url(&format!("/v1/admin/events/dead/{bob_letter}/replay")))
        .bearer_auth(&ann.key)
        .send()
        .await
        .unwrap();
    assert!(
        [StatusCode::UNAUTHORIZED, StatusCode::FORBIDDEN].contains(&res.status()),
        "{}",
        res.status()
    );
    for bad in ["?limit=0", "?limit=1001", "?limit=x", "?since=1"] {
        let (status, body) = app
            .json("GET", format!("/v1/admin/events/dead{bad}"), &admin, None)
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {body}");
    }
    deliveries_counted(&app, "dead_lettered", 2.0).await;
    deliveries_counted(&app, "replayed", 1.0).await;
}

/// The receiver down (connections refused, open ones cut) for 2 s, then
/// back on its port: every event is delivered, in order.
#[tokio::test]
async fn a_receiver_down_for_a_while_gets_everything_in_order_once_back() {
    let rx = WebhookReceiver::start().await;
    let app = spawn_app_with(hooked(&rx, Duration::from_millis(500))).await;
    let (ann, bob) = (app.create_user("ann").await, app.create_user("bob").await);
    // A first event delivered: the sender holds a connection to it.
    app.upload_json(&ann, "first.txt", b"first".to_vec()).await;
    let (_, first) = events_of(&app, &[&ann]).await;
    delivered_in_order(&rx, &first).await;

    rx.down().await;
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", rx.port())).is_err(),
        "down refuses connections"
    );
    let before = rx.requests().len();
    tokio::join!(workload(&app, &ann, 3), workload(&app, &bob, 3));
    let (_, expected) = events_of(&app, &[&ann, &bob]).await;
    // Tried meanwhile (and refused).
    deliveries_counted(&app, "failed", 2.0).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        rx.requests().len(),
        before,
        "nothing got through while down"
    );
    rx.up().await;
    delivered_in_order(&rx, &expected).await;
}

/// A slow receiver (its answers taking 300 ms) gets everything, in order.
#[tokio::test]
async fn a_slow_receiver_gets_everything_in_order() {
    let rx = WebhookReceiver::start().await;
    let app = spawn_app_with(hooked(&rx, Duration::from_millis(500))).await;
    let (ann, bob) = (app.create_user("ann").await, app.create_user("bob").await);
    rx.slow(Duration::from_millis(300));
    tokio::join!(workload(&app, &ann, 3), workload(&app, &bob, 3));
    let (_, expected) = events_of(&app, &[&ann, &bob]).await;
    delivered_in_order(&rx, &expected).await;
    // One owner's one at a time: none sent before the previous was answered.
    let accepted = rx.accepted();
    for owner in [&ann.id, &bob.id] {
        let mine: Vec<_> = accepted
            .iter()
            .filter(|d| d.owner_id.as_deref() == Some(owner.as_str()))
            .collect();
        for w in mine.windows(2) {
            assert!(
                w[1].at >= w[0].at + Duration::from_millis(290),
                "{} came before {} was answered",
                w[1].webhook_id,
                w[0].webhook_id
            );
        }
    }
}

/// What a dispatcher holds of one owner's events at most
/// (`PER_OWNER` in `domain::webhooks::owners`, private there).
const PER_OWNER: usize = 256;

/// One owner's burst past what a dispatcher holds of one owner
/// ([`PER_OWNER`]), answered slowly, holds up no one else: another owner
/// of the same partition has their events delivered meanwhile, and the
/// dispatcher holds no more than [`PER_OWNER`] of the first's (their later
/// ones are left to be read from their own events). Once the receiver is
/// fast again, the rest all come, each owner's in order with no gap.
#[tokio::test]
async fn one_owner_s_burst_past_the_cap_holds_up_no_one_else() {
    use futures::StreamExt;
    /// Ann's events (a session each).
    const BURST: usize = 320;
    /// Bob's.
    const BOB: usize = 3;
    /// How long the receiver takes to answer each of ann's meanwhile.
    const ANN_SLOW: Duration = Duration::from_millis(500);
    let rx = WebhookReceiver::start().await;
    let app = spawn_app_with(hooked(&rx, Duration::from_millis(500))).await;
    let ann = app.create_user("ann").await;
    // Bob in ann's partition: the one partition queues both.
    let part = partition_of(&ann.user_id());
    let mut bob = None;
    for i in 0..200 {
        let u = app.create_user(&format!("bob{i}")).await;
        if partition_of(&u.user_id()) == part {
            bob = Some(u);
            break;
        }
    }
    let bob = bob.expect("none of 200 users falls in ann's partition");
    let ann_done = || {
        let ids: HashSet<String> = (rx.accepted().into_iter())
            .filter(|d| d.owner_id.as_deref() == Some(ann.id.as_str()))
            .map(|d| d.webhook_id)
            .collect();
        ids.len()
    };

    rx.slow_owners([ann.id.clone()], ANN_SLOW);
    let started = std::time::Instant::now();
    futures::stream::iter(0..BURST)
        .for_each_concurrent(8, |_| async {
            app.new_session(&ann).await;
        })
        .await;
    let burst_took = started.elapsed();
    for _ in 0..BOB {
        app.new_session(&bob).await;
    }
    let (_, bob_only) = events_of(&app, &[&bob]).await;
    assert_eq!(bob_only[&bob.id].len(), BOB, "a session.created each");
    if let Err(e) = rx.wait_accepted(&bob_only, Duration::from_secs(5)).await {
        panic!(
            "bob's events waited behind ann's burst (made in {burst_took:?}; {} of hers delivered): {e}",
            ann_done()
        );
    }
    let done = ann_done();
    assert!(
        BURST - done > PER_OWNER,
        "bob's events came only once ann had {done} of her {BURST} delivered (her burst was made in {burst_took:?}, her answers take {ANN_SLOW:?})"
    );
    // The figures are reported each second: one after bob's were delivered
    // (so after the feed was read past all of ann's) counts ann's held and
    // perhaps bob's last, its answer not yet taken in.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let held = app.metric("filedock_webhook_pending", "").await;
    let done = ann_done();
    assert!(
        BURST - done > PER_OWNER,
        "ann has {done} of her {BURST} delivered already (her burst was made in {burst_took:?})"
    );
    assert!(
        (1.0..=(PER_OWNER + 1) as f64).contains(&held),
        "the dispatcher holds {held} events while ann has {} undelivered: more than {PER_OWNER} of one owner, or none",
        BURST - done
    );

    rx.answer_ok();
    let (_, expected) = events_of(&app, &[&ann, &bob]).await;
    assert_eq!(expected[&ann.id].len(), BURST, "a session.created each");
    assert_eq!(expected[&bob.id].len(), BOB);
    delivered_in_order(&rx, &expected).await;
}

/// Attempts that time out (the receiver answering past
/// `FILEDOCK_WEBHOOK_TIMEOUT_SECS`) are tried again: the receiver gets the
/// same event more than once (the same `webhook-id`, the same body), and
/// its owner's next only after an attempt was answered in time.
#[tokio::test]
async fn an_attempt_that_times_out_is_sent_again_as_the_same_message() {
    let rx = WebhookReceiver::start().await;
    let mut settings = hooked(&rx, Duration::from_millis(300));
    settings.webhooks.as_mut().unwrap().timeout = Duration::from_millis(400);
    let app = spawn_app_with(settings).await;
    let ann = app.create_user("ann").await;
    rx.slow(Duration::from_millis(1500));
    workload(&app, &ann, 2).await;
    let (_, expected) = events_of(&app, &[&ann]).await;
    let first = format!("{}:1", ann.id);
    let tried_twice = |log: &[Delivery]| log.iter().filter(|d| d.webhook_id == first).count() >= 2;
    if let Err(e) = rx.wait_for(tried_twice, WAIT).await {
        panic!("a timed-out attempt was not tried again: {e}");
    }
    assert!(
        rx.requests().iter().all(|d| d.webhook_id == first),
        "nothing after the first event before it was answered in time"
    );
    assert!(
        rx.accepted().is_empty(),
        "an attempt the sender gave up on is not accepted (its answer was never sent): {:?}",
        rx.accepted()
    );
    rx.answer_ok();
    delivered_in_order(&rx, &expected).await;
    let requests = rx.requests();
    let last_first = requests.iter().rfind(|d| d.webhook_id == first).unwrap();
    let second = format!("{}:2", ann.id);
    let first_second = requests.iter().find(|d| d.webhook_id == second).unwrap();
    assert!(
        first_second.n > last_first.n,
        "{second} was sent before {first} was answered in time"
    );
    let copies: Vec<_> = requests.iter().filter(|d| d.webhook_id == first).collect();
    assert!(copies.len() >= 2);
    assert!(
        copies.iter().all(|d| d.body == copies[0].body),
        "the same body"
    );
}

/// Several URLs (`FILEDOCK_WEBHOOK_URL` comma-separated): each gets every
/// event, and one refusing does not hold up the other.
#[tokio::test]
async fn each_url_gets_every_event_and_one_failing_holds_up_no_other() {
    let rx1 = WebhookReceiver::start().await;
    let rx2 = WebhookReceiver::start_with_secret(rx1.secret()).await;
    let mut settings = hooked(&rx1, Duration::from_millis(500));
    settings.webhooks.as_mut().unwrap().urls.push(rx2.url());
    let app = spawn_app_with(settings).await;
    let (ann, bob) = (app.create_user("ann").await, app.create_user("bob").await);
    rx2.fail_all();
    tokio::join!(workload(&app, &ann, 3), workload(&app, &bob, 2));
    let (_, expected) = events_of(&app, &[&ann, &bob]).await;
    delivered_in_order(&rx1, &expected).await;
    if let Err(e) = rx2.wait_for(|log| log.len() >= 4, WAIT).await {
        panic!("the failing URL was not retried: {e}");
    }
    assert!(rx2.accepted().is_empty());
    rx2.answer_ok();
    delivered_in_order(&rx2, &expected).await;
}

/// Two instances on the same stores share the partitions of owners. With
/// no fault, each delivers its partitions' owners' events and nothing
/// else: both deliver some, every event is accepted exactly once, each
/// owner's in order. One stopped (giving its partitions back), the other
/// delivers every later event (and perhaps again some the stopped one had
/// in flight: at least once).
#[tokio::test]
async fn two_instances_deliver_every_owner_s_events_in_order() {
    if !real_backends() {
        return;
    }
    let rx = WebhookReceiver::start().await;
    let settings = hooked(&rx, Duration::from_millis(500));
    let one = spawn_app_with(settings.clone()).await;
    let two = spawn_app_with(settings).await;
    // The instances rebalance each second: by then both beat and took
    // their share, so no partition moves while its events are delivered.
    let shared_by = tokio::time::Instant::now() + Duration::from_secs(3);
    // A user in every partition: whichever partitions each instance holds,
    // it has users to deliver.
    let mut by_partition = HashMap::new();
    for i in 0.. {
        assert!(
            i < 2000,
            "{i} users cover only {} partitions",
            by_partition.len()
        );
        let u = one.create_user(&format!("u{i}")).await;
        by_partition.entry(partition_of(&u.user_id())).or_insert(u);
        if by_partition.len() == PARTITIONS as usize {
            break;
        }
    }
    let users: Vec<TestUser> = by_partition.into_values().collect();
    tokio::time::sleep_until(shared_by).await;
    // Each user's changes through both instances, the users at once.
    let runs = users.iter().enumerate().map(|(i, u)| {
        let (a, b) = if i % 2 == 0 {
            (&one, &two)
        } else {
            (&two, &one)
        };
        async move {
            for round in 0..3 {
                let app = if round % 2 == 0 { a } else { b };
                workload(app, u, 2).await;
            }
        }
    });
    futures::future::join_all(runs).await;
    let refs: Vec<&TestUser> = users.iter().collect();
    let (_, expected) = events_of(&one, &refs).await;
    for u in &users {
        assert_eq!(
            expected[&u.id].len(),
            12,
            "3 rounds of 2 uploads, a rename, a delete"
        );
    }
    let n = users.len() * 12;
    delivered_in_order(&rx, &expected).await;
    // Counted by the instance that delivered, once it took the answer in.
    let delivered = "outcome=\"delivered\"";
    let deadline = std::time::Instant::now() + WAIT;
    let (d1, d2) = loop {
        let d1 = one
            .metric("filedock_webhook_deliveries_total", delivered)
            .await;
        let d2 = two
            .metric("filedock_webhook_deliveries_total", delivered)
            .await;
        if d1 + d2 >= n as f64 {
            break (d1, d2);
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{d1} + {d2} deliveries counted, not {n} or more"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // Time for a second delivery of anything to come, if one were to.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let requests = rx.requests();
    let accepted = rx.accepted();
    let ids: HashSet<&str> = accepted.iter().map(|d| d.webhook_id.as_str()).collect();
    assert_eq!(
        (accepted.len(), ids.len(), requests.len()),
        (n, n, n),
        "with no fault every event is sent once and accepted once:\n{}",
        summary(&requests)
    );
    let (d1, d2) = (
        d1.max(
            one.metric("filedock_webhook_deliveries_total", delivered)
                .await,
        ),
        d2.max(
            two.metric("filedock_webhook_deliveries_total", delivered)
                .await,
        ),
    );
    assert_eq!(
        d1 + d2,
        n as f64,
        "the instances counted {d1} + {d2} deliveries of {n} events"
    );
    assert!(
        d1 >= 1.0 && d2 >= 1.0,
        "each instance delivers its share of the partitions: {d1} delivered by one, {d2} by two"
    );
    // Two senders, so two connections at least (none is shared).
    let peers: HashSet<_> = accepted.iter().map(|d| d.peer).collect();
    assert!(peers.len() >= 2, "the deliveries came over {peers:?}");

    // One stops (giving its partitions back): the other delivers them all.
    one.stop().await;
    futures::future::join_all(users.iter().map(|u| workload(&two, u, 1))).await;
    let (_, expected) = events_of(&two, &refs).await;
    for u in &users {
        assert_eq!(expected[&u.id].len(), 14, "and an upload and a rename");
    }
    delivered_in_order(&rx, &expected).await;
    two.stop().await;
}

/// Where delivery stands (the partitions' marks in the store) outlives an
/// instance: one that delivered its users' events and stopped gracefully
/// (writing its marks) is followed, on the same stores and with the same
/// receiver, by one that sends none of them again, and sends a new event
/// exactly once.
#[tokio::test]
async fn a_restart_goes_on_from_where_delivery_stood() {
    let rx = WebhookReceiver::start().await;
    let a = spawn_app_with(hooked(&rx, Duration::from_millis(500))).await;
    let (ann, bob) = (a.create_user("ann").await, a.create_user("bob").await);
    tokio::join!(workload(&a, &ann, 3), workload(&a, &bob, 2));
    let (_, expected) = events_of(&a, &[&ann, &bob]).await;
    let n: usize = expected.values().map(Vec::len).sum();
    assert_eq!(n, 9, "5 and 4 events");
    delivered_in_order(&rx, &expected).await;
    // A took every answer in (so what it delivered is in its marks).
    deliveries_counted(&a, "delivered", n as f64).await;
    let settings = a.stop().await;
    let by_a = rx.requests();
    assert_eq!(by_a.len(), n, "A sent each event once:\n{}", summary(&by_a));

    // B on the same data dir (embedded) or database and prefixes (real).
    let b = spawn_app_with(settings).await;
    // B reads the marks, the feed and every owner's last event delivered
    // at once; marks are written each second.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let requests = rx.requests();
    assert_eq!(
        requests.len(),
        n,
        "B sent again what A had delivered:\n{}",
        summary(&requests[n..])
    );

    // A new event through B goes, once.
    b.upload_json(&ann, "after.txt", b"after the restart".to_vec())
        .await;
    let (_, expected) = events_of(&b, &[&ann, &bob]).await;
    assert_eq!(expected[&ann.id].len(), 6, "and an upload");
    let new_id = expected[&ann.id][5].1.clone();
    delivered_in_order(&rx, &expected).await;
    deliveries_counted(&b, "delivered", 1.0).await;
    // Past B's next marks and rebalances: nothing more comes.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let requests = rx.requests();
    assert_eq!(
        requests.len(),
        n + 1,
        "B delivers the new event, once, and nothing else:\n{}",
        summary(&requests[n..])
    );
    assert_eq!(requests[n].webhook_id, new_id);
    assert!(requests[n].accepted(), "{:?}", requests[n]);
    let counted = b
        .metric("filedock_webhook_deliveries_total", "outcome=\"delivered\"")
        .await;
    assert_eq!(counted, 1.0, "B counted {counted} deliveries");
    b.stop().await;
}

/// Start-up refuses a URL without a secret, a secret that is not
/// `whsec_` + base64 of 24 bytes or more, and a maximum age not below the
/// events' retention; it takes fractional seconds and several URLs.
#[tokio::test]
async fn start_up_refuses_webhooks_without_a_good_secret() {
    let lookup = |vars: &[(&str, &str)]| {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        Settings::from_lookup(move |n| vars.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone()))
    };
    let err = lookup(&[("FILEDOCK_WEBHOOK_URL", "http://127.0.0.1:9/hooks")])
        .unwrap_err()
        .to_string();
    assert!(err.contains("FILEDOCK_WEBHOOK_SECRET"), "{err}");

    let secret = random_secret();
    let err = lookup(&[
        ("FILEDOCK_WEBHOOK_URL", "ftp://127.0.0.1:9/hooks"),
        ("FILEDOCK_WEBHOOK_SECRET", &secret),
    ])
    .unwrap_err()
    .to_string();
    assert!(err.contains("FILEDOCK_WEBHOOK_URL"), "{err}");

    let err = lookup(&[
        ("FILEDOCK_WEBHOOK_URL", "http://127.0.0.1:9/hooks"),
        ("FILEDOCK_WEBHOOK_SECRET", &secret),
        ("FILEDOCK_WEBHOOK_MAX_AGE_SECS", "600"),
        ("FILEDOCK_EVENT_RETENTION_SECS", "600"),
    ])
    .unwrap_err()
    .to_string();
    assert!(err.contains("FILEDOCK_WEBHOOK_MAX_AGE_SECS"), "{err}");

    let s = lookup(&[
        (
            "FILEDOCK_WEBHOOK_URL",
            "http://127.0.0.1:9/a, https://example.invalid/b",
        ),
        ("FILEDOCK_WEBHOOK_SECRET", &secret),
        ("FILEDOCK_WEBHOOK_RETRY_MAX_SECS", "0.5"),
    ])
    .unwrap();
    let w = s.webhooks.expect("webhooks on");
    assert_eq!(
        w.urls,
        ["http://127.0.0.1:9/a", "https://example.invalid/b"]
    );
    assert_eq!(w.retry_max, Duration::from_millis(500));
    assert_eq!(
        (w.max_age, w.concurrency, w.timeout),
        (Duration::from_secs(86_400), 16, Duration::from_secs(10))
    );
    assert!(lookup(&[]).unwrap().webhooks.is_none(), "off by default");

    // The secret is checked when the app is built (the signer is made).
    use base64::{Engine, engine::general_purpose::STANDARD};
    let bare = secret.strip_prefix("whsec_").unwrap().to_owned();
    let short = format!("whsec_{}", STANDARD.encode([7u8; 16]));
    for bad in [bare, short, "whsec_not*base64".to_owned()] {
        let mut settings = test_settings();
        settings.webhooks = Some(WebhookSettings {
            urls: vec!["http://127.0.0.1:9/hooks".into()],
            secret: SecretString::from(bad.clone()),
            max_age: Duration::from_secs(60),
            concurrency: 4,
            timeout: Duration::from_secs(1),
            retry_max: Duration::from_secs(1),
        });
        match AppState::build(settings).await {
            Ok(_) => panic!("an app was built with the webhook secret {bad:?}"),
            Err(e) => {
                let text = format!("{e:#}");
                assert!(text.contains("FILEDOCK_WEBHOOK_SECRET"), "{text}");
                assert!(!text.contains(&bad), "the error repeats the secret: {text}");
            }
        }
    }
}

/// The checker itself: it finds an event missing, a gap (an event
/// accepted before an earlier one), a duplicate with another body.
#[test]
fn the_checker_finds_what_is_wrong() {
    let d = |n: usize, seq: i64, body: &str| Delivery {
        n,
        at: std::time::Instant::now(),
        peer: "127.0.0.1:1".parse().unwrap(),
        method: "POST".into(),
        path: "/hooks".into(),
        webhook_id: format!("o:{seq}"),
        webhook_timestamp: "0".into(),
        content_type: "application/json".into(),
        owner_id: Some("o".into()),
        seq: Some(seq),
        kind: Some("file.created".into()),
        body: body.to_owned().into(),
        json: None,
        verified: Ok(()),
        status: 200,
        answered: true,
    };
    let expected: Expected = [(
        "o".to_owned(),
        (1..=3).map(|s| (s, format!("o:{s}"))).collect(),
    )]
    .into();
    let good = [
        d(0, 1, "a"),
        d(1, 2, "b"),
        d(2, 2, "b"),
        d(3, 1, "a"),
        d(4, 3, "c"),
    ];
    check_exact(&good, &expected).unwrap();
    let missing = [d(0, 1, "a"), d(1, 3, "c")];
    assert!(
        check_order(&missing, &expected)
            .unwrap_err()
            .contains("never accepted")
    );
    let swapped = [d(0, 2, "b"), d(1, 1, "a"), d(2, 3, "c")];
    assert!(
        check_order(&swapped, &expected)
            .unwrap_err()
            .contains("out of order")
    );
    let changed = [d(0, 1, "a"), d(1, 1, "A"), d(2, 2, "b"), d(3, 3, "c")];
    assert!(
        check_order(&changed, &expected)
            .unwrap_err()
            .contains("another body")
    );
    let mut unsigned = good.clone();
    unsigned[4].verified = Err("signature invalid".into());
    assert!(
        check_order(&unsigned, &expected)
            .unwrap_err()
            .contains("verification")
    );
    let extra = [d(0, 1, "a"), d(1, 2, "b"), d(2, 3, "c"), d(3, 4, "d")];
    check_order(&extra, &expected).unwrap();
    assert!(
        check_exact(&extra, &expected)
            .unwrap_err()
            .contains("not expected")
    );
}

/// The receiver itself: it verifies with `standardwebhooks` (a request
/// signed with its secret passes; another secret's signature, a body
/// changed after signing or no signature do not), and down it refuses
/// connections until it is up again on its port.
#[tokio::test]
async fn the_receiver_verifies_and_goes_down_and_up() {
    let rx = WebhookReceiver::start().await;
    let body = r#"{"type":"file.created","timestamp":"2024-01-01T00:00:00Z","data":{"owner_id":"o","seq":1}}"#;
    let now = chrono::Utc::now().timestamp();
    let sign = |secret: &str, body: &str| {
        standardwebhooks::Webhook::new(secret)
            .unwrap()
            .sign("o:1", now, body.as_bytes())
            .unwrap()
    };
    let client = reqwest::Client::new();
    let send = |signature: Option<String>, body: &'static str| {
        let mut req = client
            .post(rx.url())
            .header("content-type", "application/json")
            .header("webhook-id", "o:1")
            .header("webhook-timestamp", now.to_string())
            .body(body);
        if let Some(s) = signature {
            req = req.header("webhook-signature", s);
        }
        req.send()
    };
    let changed = r#"{"type":"file.deleted","timestamp":"2024-01-01T00:00:00Z","data":{"owner_id":"o","seq":1}}"#;
    for (signature, body) in [
        (Some(sign(&rx.secret(), body)), body),
        (Some(sign(&random_secret(), body)), body),
        (Some(sign(&rx.secret(), body)), changed),
        (None, body),
    ] {
        let res = send(signature, body).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK, "answered by its behaviour");
    }
    let log = rx.requests();
    let verified: Vec<bool> = log.iter().map(|d| d.verified.is_ok()).collect();
    assert_eq!(verified, [true, false, false, false]);
    assert_eq!(
        (
            log[0].owner_id.as_deref(),
            log[0].seq,
            log[0].kind.as_deref()
        ),
        (Some("o"), Some(1), Some("file.created"))
    );
    assert!(rx.all_verified().is_err());

    rx.fail_ids(["o:1"]);
    let res = send(Some(sign(&rx.secret(), body)), body).await.unwrap();
    assert_eq!(res.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(rx.refused().len(), 1);

    rx.down().await;
    assert!(send(None, body).await.is_err(), "down: refused");
    rx.up().await;
    rx.answer_ok();
    let res = send(Some(sign(&rx.secret(), body)), body).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK, "up again on the same port");
    assert_eq!(rx.accepted().len(), 5);
    assert!(log.iter().all(|d| d.peer.ip().is_loopback()), "{log:?}");

    // A slow answer counts once it was sent, not while it waits.
    rx.slow(Duration::from_millis(800));
    let waiting = async {
        rx.wait_for(|log| log.len() == 7, WAIT).await.unwrap();
        let last = rx.requests().pop().unwrap();
        assert_eq!((last.status, last.answered), (200, false), "{last:?}");
        assert_eq!(rx.accepted().len(), 5, "not yet sent");
    };
    let (res, ()) = tokio::join!(send(Some(sign(&rx.secret(), body)), body), waiting);
    assert_eq!(res.unwrap().status(), StatusCode::OK);
    assert!(rx.requests()[6].answered);
    assert_eq!(rx.accepted().len(), 6, "sent");

    // A slow answer cut by down() was never sent: never accepted.
    let cut = async {
        rx.wait_for(|log| log.len() == 8, WAIT).await.unwrap();
        rx.down().await;
    };
    let (res, ()) = tokio::join!(send(Some(sign(&rx.secret(), body)), body), cut);
    assert!(res.is_err(), "cut: {res:?}");
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let cut = &rx.requests()[7];
    assert_eq!((cut.status, cut.answered), (200, false), "{cut:?}");
    assert!(!cut.accepted() && !cut.refused());
    assert_eq!(rx.accepted().len(), 6, "down cut it before its answer");
    rx.up().await;

    // A sender that gives up (closes the connection) before a slow answer
    // is not answered either.
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    let res = impatient
        .post(rx.url())
        .header("content-type", "application/json")
        .header("webhook-id", "o:1")
        .header("webhook-timestamp", now.to_string())
        .header("webhook-signature", sign(&rx.secret(), body))
        .body(body)
        .send()
        .await;
    assert!(res.as_ref().is_err_and(|e| e.is_timeout()), "{res:?}");
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let dropped = &rx.requests()[8];
    assert_eq!(
        (dropped.status, dropped.answered),
        (200, false),
        "{dropped:?}"
    );
    assert_eq!(rx.accepted().len(), 6, "the sender left before the answer");
    assert_eq!(rx.unanswered().len(), 2);
    assert_eq!(rx.refused().len(), 1);
}
