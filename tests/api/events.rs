//! Events (`GET /v1/events`): every committed change to a file writes one
//! event in its own transaction, numbered per owner 1, 2, 3… with no gap;
//! a change that did not happen writes none; a reader pages through them
//! with the cursor each answer returns.

use std::collections::HashSet;

use futures::future::join_all;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::{
    helpers::*,
    tus::{create_typed, data, patch},
};

/// `GET /v1/events` with `query`: status and body.
async fn read(app: &TestApp, user: &TestUser, query: &str) -> (StatusCode, Value) {
    app.json("GET", format!("/v1/events{query}"), user, None)
        .await
}

/// Every event of `user`, paged `limit` at a time from the first.
pub(crate) async fn all_events(app: &TestApp, user: &TestUser, limit: usize) -> Vec<Value> {
    let (mut out, mut cursor) = (Vec::new(), "0".to_owned());
    loop {
        let (status, page) = read(app, user, &format!("?after={cursor}&limit={limit}")).await;
        assert_eq!(status, StatusCode::OK, "{page}");
        let events = page["events"].as_array().unwrap().clone();
        assert!(events.len() <= limit);
        let next = page["cursor"].as_str().unwrap().to_owned();
        if events.is_empty() {
            assert_eq!(next, cursor, "an empty page keeps the cursor");
            return out;
        }
        assert_eq!(
            next,
            events.last().unwrap()["seq"].to_string(),
            "the cursor is the last event's number"
        );
        out.extend(events);
        cursor = next;
    }
}

/// The events' numbers are 1..=n, in order.
fn assert_no_gap(events: &[Value]) {
    let seqs: Vec<i64> = events.iter().map(|e| e["seq"].as_i64().unwrap()).collect();
    let expected: Vec<i64> = (1..=events.len() as i64).collect();
    assert_eq!(seqs, expected, "numbered 1, 2, 3… with no gap");
}

fn types(events: &[Value]) -> Vec<&str> {
    events.iter().map(|e| e["type"].as_str().unwrap()).collect()
}

#[tokio::test]
async fn each_change_to_a_file_writes_one_event_in_commit_order() {
    let app = spawn_app().await;
    let ann = app.create_user("ann").await;
    let bob = app.create_user("bob").await;
    let file = app.upload_json(&ann, "draft.txt", b"draft".to_vec()).await;
    let id = file["id"].as_str().unwrap().to_owned();
    let (status, _) = app
        .json(
            "PATCH",
            format!("/v1/files/{id}"),
            &ann,
            Some(json!({"name": "final.txt"})),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let res = app
        .client
        .delete(app.url(&format!("/v1/files/{id}")))
        .bearer_auth(&ann.key)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::NO_CONTENT);

    let events = all_events(&app, &ann, 100).await;
    assert_eq!(
        types(&events),
        ["file.created", "file.renamed", "file.deleted"]
    );
    assert_no_gap(&events);
    for e in &events {
        assert_eq!(e["owner_id"], ann.id.as_str());
        assert_eq!(e["subject"], id.as_str());
        assert_eq!(e["data"]["file_id"], id.as_str());
        assert_eq!(e["data"]["size"], 5);
        assert_eq!(e["data"]["sha256"], file["sha256"]);
        assert_eq!(e["id"], format!("{}:{}", ann.id, e["seq"]));
        assert!(e["time"].as_str().is_some_and(|t| t.contains('T')), "{e}");
    }
    assert_eq!(events[0]["data"]["filename"], "draft.txt");
    assert_eq!(events[1]["data"]["filename"], "final.txt");

    // Paged one at a time, from a cursor, the same events.
    assert_eq!(all_events(&app, &ann, 1).await, events);
    let (_, after_first) = read(&app, &ann, "?after=1").await;
    assert_eq!(after_first["events"].as_array().unwrap()[..], events[1..]);
    // At the last: none, and the cursor stays; past it, not a cursor.
    let (_, past) = read(&app, &ann, "?after=3").await;
    assert_eq!(past, json!({"events": [], "cursor": "3"}));
    let (status, body) = read(&app, &ann, "?after=4").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    // Another user's events are not theirs to read.
    assert_eq!(all_events(&app, &bob, 100).await, Vec::<Value>::new());
}

/// Uploads arriving at once commit in groups (one transaction for several
/// files): each still gets its own event, numbered with no gap.
#[tokio::test]
async fn a_burst_of_one_user_s_uploads_gets_one_event_each_with_no_gap() {
    let app = spawn_app().await;
    let ann = app.create_user("ann").await;
    let uploads = (0..24).map(|i| {
        let (app, ann) = (&app, &ann);
        async move {
            app.upload_json(ann, &format!("f{i}.txt"), vec![i as u8; 100 + i])
                .await
        }
    });
    let ids: HashSet<String> = join_all(uploads)
        .await
        .iter()
        .map(|f| f["id"].as_str().expect("every upload committed").to_owned())
        .collect();
    assert_eq!(ids.len(), 24);
    let events = all_events(&app, &ann, 10).await;
    assert_no_gap(&events);
    assert!(types(&events).iter().all(|t| *t == "file.created"));
    let subjects: HashSet<String> = events
        .iter()
        .map(|e| e["subject"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(subjects, ids, "one event per upload, none twice");
}

#[tokio::test]
async fn a_change_that_did_not_happen_writes_no_event() {
    let mut settings = test_settings();
    settings.user_quota_bytes = Some(64);
    let app = spawn_app_with(settings).await;
    let ann = app.create_user("ann").await;
    let bob = app.create_user("bob").await;
    let file = app.upload_json(&ann, "a.txt", vec![1; 40]).await;
    let id = file["id"].as_str().unwrap().to_owned();
    // Past the quota: refused.
    let res = app.upload_raw(&ann, "big.txt", vec![2; 40]).await;
    assert_eq!(res.status(), StatusCode::INSUFFICIENT_STORAGE);
    // A bad name, another user's file, a file that is not there.
    let rename = |who: &TestUser, id: &str, name: &str| {
        let req = app
            .client
            .patch(app.url(&format!("/v1/files/{id}")))
            .bearer_auth(&who.key)
            .json(&json!({"name": name}));
        async move { req.send().await.unwrap().status() }
    };
    assert_eq!(rename(&ann, &id, "a/b").await, StatusCode::BAD_REQUEST);
    assert_eq!(rename(&bob, &id, "b.txt").await, StatusCode::NOT_FOUND);
    let missing = uuid::Uuid::new_v4().to_string();
    assert_eq!(rename(&ann, &missing, "b.txt").await, StatusCode::NOT_FOUND);
    for (who, target) in [(&bob, &id), (&ann, &missing)] {
        let res = app
            .client
            .delete(app.url(&format!("/v1/files/{target}")))
            .bearer_auth(&who.key)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::NOT_FOUND);
    }
    let events = all_events(&app, &ann, 100).await;
    assert_eq!(types(&events), ["file.created"], "{events:?}");
    assert_eq!(all_events(&app, &bob, 100).await, Vec::<Value>::new());
}

#[tokio::test]
async fn a_resumable_upload_writes_its_event_when_its_file_commits() {
    let app = spawn_app().await;
    let ann = app.create_user("ann").await;
    let bytes = data(10_000);
    let id = create_typed(&app, &ann, bytes.len(), None).await;
    assert_eq!(
        patch(&app, &ann, &id, 0, &bytes[..4000]).await.status(),
        StatusCode::NO_CONTENT
    );
    assert!(
        all_events(&app, &ann, 100).await.is_empty(),
        "no file yet, no event"
    );
    assert_eq!(
        patch(&app, &ann, &id, 4000, &bytes[4000..]).await.status(),
        StatusCode::NO_CONTENT
    );
    let events = all_events(&app, &ann, 100).await;
    assert_eq!(types(&events), ["file.created"]);
    assert_eq!(events[0]["subject"], id.as_str());
    assert_eq!(events[0]["data"]["size"], 10_000);
}

#[tokio::test]
async fn a_token_needs_events_read_and_may_not_be_bound() {
    let app = spawn_app().await;
    let ann = app.create_user("ann").await;
    app.upload_json(&ann, "a.txt", b"a".to_vec()).await;
    let session = app.new_session(&ann).await;
    let mint = async |body: Value| {
        let (status, token) = app.json("POST", "/v1/tokens", &ann, Some(body)).await;
        assert_eq!(status, StatusCode::CREATED, "{token}");
        TestUser {
            id: ann.id.clone(),
            key: token["token"].as_str().unwrap().to_owned(),
        }
    };
    let reader = mint(json!({"scopes": ["events:read"]})).await;
    let (status, page) = read(&app, &reader, "").await;
    assert_eq!(status, StatusCode::OK, "{page}");
    // The upload's and the session's.
    assert_eq!(page["events"].as_array().unwrap().len(), 2);
    let files_only = mint(json!({"scopes": ["files:read", "files:write"]})).await;
    let (status, body) = read(&app, &files_only, "").await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    // Not given to a token bound to a session (the events are the whole
    // account's); a bound token without it is refused.
    let (status, body) = app
        .json(
            "POST",
            "/v1/tokens",
            &ann,
            Some(json!({"scopes": ["events:read"], "session_id": session})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["code"], "invalid_request");
    let bound = mint(json!({"scopes": ["files:read"], "session_id": session})).await;
    let (status, body) = read(&app, &bound, "").await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(body["error"]["code"], "forbidden");
}

#[tokio::test]
async fn a_bad_cursor_or_limit_is_a_clear_error() {
    let app = spawn_app().await;
    let ann = app.create_user("ann").await;
    app.upload_json(&ann, "a.txt", b"a".to_vec()).await;
    for query in [
        "?after=abc",
        "?after=-1",
        "?after=1e3",
        "?after=",
        "?after=99999999999999999999",
        "?limit=0",
        "?limit=1001",
        "?limit=x",
        "?since=1",
    ] {
        let (status, body) = read(&app, &ann, query).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}: {body}");
        assert_eq!(body["error"]["code"], "invalid_request", "{query}: {body}");
    }
    let res = app.client.get(app.url("/v1/events")).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    // Nothing was lost to the bad reads.
    assert_eq!(all_events(&app, &ann, 100).await.len(), 1);
}

/// Events past `FILEDOCK_EVENT_RETENTION_SECS` are removed by the sweeper,
/// younger ones stay; a reader whose cursor is older than what is kept is
/// told (410 `cursor_expired`), and one without a cursor reads from the
/// oldest kept.
#[tokio::test]
async fn events_past_their_retention_go_and_an_older_cursor_is_told() {
    let mut settings = test_settings();
    settings.sweep.interval = std::time::Duration::ZERO;
    settings.sweep.event_retention = std::time::Duration::from_secs(1);
    let app = spawn_app_with(settings).await;
    let ann = app.create_user("ann").await;
    for i in 0..3 {
        app.upload_json(&ann, &format!("old{i}.txt"), vec![i; 10])
            .await;
    }
    tokio::time::sleep(std::time::Duration::from_millis(1200)).await;
    let young = app.upload_json(&ann, "young.txt", b"young".to_vec()).await;
    let report = match app.state.sweeper.try_run_once().await.unwrap() {
        filedock::domain::sweeper::Outcome::Swept(r) => r,
        busy => panic!("{busy:?}"),
    };
    assert_eq!(report.events_expired, 3, "{report:?}");
    assert_eq!(app.metric("filedock_events_expired_total", "").await, 3.0);

    // From the oldest kept: the young upload's, numbered 4.
    let (status, page) = read(&app, &ann, "").await;
    assert_eq!(status, StatusCode::OK, "{page}");
    let events = page["events"].as_array().unwrap();
    assert_eq!(events.len(), 1, "{page}");
    assert_eq!(
        (&events[0]["seq"], &events[0]["subject"]),
        (&json!(4), &young["id"])
    );
    assert_eq!(read(&app, &ann, "?after=0").await.1, page);
    // A cursor past the removed ones reads on; one before them is told.
    assert_eq!(read(&app, &ann, "?after=3").await.1, page);
    for old in ["?after=1", "?after=2"] {
        let (status, body) = read(&app, &ann, old).await;
        assert_eq!(status, StatusCode::GONE, "{old}: {body}");
        assert_eq!(body["error"]["code"], "cursor_expired");
    }
    // Once every event is gone, a cursor before the last is told too.
    tokio::time::sleep(std::time::Duration::from_millis(1200)).await;
    app.state.sweeper.try_run_once().await.unwrap();
    let (status, body) = read(&app, &ann, "?after=3").await;
    assert_eq!(status, StatusCode::GONE, "{body}");
    assert_eq!(
        read(&app, &ann, "?after=4").await.1,
        json!({"events": [], "cursor": "4"})
    );
    assert_eq!(
        read(&app, &ann, "").await.1,
        json!({"events": [], "cursor": "0"})
    );
}

/// Waits until `app` counts `n` readers waiting for an event.
async fn until_waiting(app: &TestApp, n: f64) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while app.metric("filedock_event_waiters", "").await != n {
        assert!(
            std::time::Instant::now() < deadline,
            "{n} readers never waited"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// A long poll answers with the event that commits while it waits (a read
/// that ran out its wait answers empty: the event in the answer is the
/// wake-up), and a wait with nothing to wake it reads the store only at
/// its start (no polling), then answers empty with the cursor it got.
#[tokio::test]
async fn a_waiting_reader_is_woken_by_the_event_and_an_idle_one_does_not_poll() {
    // No sweeper worker: its look for deletions every 2 s reads the store.
    let mut settings = test_settings();
    settings.sweep.interval = std::time::Duration::ZERO;
    let app = spawn_app_with(settings).await;
    let ann = app.create_user("ann").await;
    let reader = {
        let (client, url, key) = (
            app.client.clone(),
            app.url("/v1/events?after=0&wait=30"),
            ann.key.clone(),
        );
        tokio::spawn(async move {
            let res = client.get(url).bearer_auth(key).send().await.unwrap();
            (res.status(), res.json::<Value>().await.unwrap())
        })
    };
    until_waiting(&app, 1.0).await;
    let file = app.upload_json(&ann, "a.txt", b"a".to_vec()).await;
    let (status, page) = reader.await.unwrap();
    assert_eq!(status, StatusCode::OK, "{page}");
    assert_eq!(page["events"][0]["subject"], file["id"], "{page}");
    assert_eq!(page["cursor"], "1");
    assert_eq!(app.metric("filedock_event_waiters", "").await, 0.0);

    // The event placed in the admin's feed (by the sequencer the commit
    // woke) before the idle wait is counted.
    let res = (app.client.get(app.url("/v1/events?after=0&wait=10")))
        .bearer_auth(ADMIN_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(res.json::<Value>().await.unwrap()["cursor"], "1");
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let commands = app.metric("filedock_mongo_commands_total", "").await;
    let started = std::time::Instant::now();
    let (status, page) = read(&app, &ann, "?after=1&wait=2").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(page, json!({"events": [], "cursor": "1"}));
    assert!(started.elapsed() >= std::time::Duration::from_millis(1900));
    if real_backends() {
        // Its user's last number and one read of the events, at the start.
        let sent = app.metric("filedock_mongo_commands_total", "").await - commands;
        assert!(
            sent <= 2.0,
            "{sent} MongoDB commands for an idle wait of 2 s"
        );
    }
    for bad in ["?wait=61", "?wait=-1", "?wait=x"] {
        let (status, body) = read(&app, &ann, bad).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {body}");
    }
}

/// With Redis, a reader waiting on one instance is woken by an event that
/// commits on another.
#[tokio::test]
async fn a_reader_on_one_instance_is_woken_by_an_event_committed_on_another() {
    if !real_backends() {
        return;
    }
    let settings = test_settings();
    let (one, two) = (
        spawn_app_with(settings.clone()).await,
        spawn_app_with(settings).await,
    );
    let ann = one.create_user("ann").await;
    let reader = {
        let (client, url, key) = (
            one.client.clone(),
            one.url("/v1/events?wait=30"),
            ann.key.clone(),
        );
        tokio::spawn(async move {
            let res = client.get(url).bearer_auth(key).send().await.unwrap();
            (res.status(), res.json::<Value>().await.unwrap())
        })
    };
    until_waiting(&one, 1.0).await;
    let file = two.upload_json(&ann, "b.txt", b"b".to_vec()).await;
    let (status, page) = reader.await.unwrap();
    assert_eq!(status, StatusCode::OK, "{page}");
    assert_eq!(page["events"][0]["subject"], file["id"], "{page}");
}
