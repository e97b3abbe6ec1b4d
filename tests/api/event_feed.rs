//! The feed (`GET /v1/events` with the admin key): every owner's events,
//! each placed once after its transaction committed, in an order that keeps
//! each owner's; the cursor a place in it, which resumes; a long poll woken
//! by a placing on any instance; `user.deleted` the one event of a deleted
//! user it keeps; a cursor from before the retention's removal told 410.

use std::{
    collections::{BTreeMap, HashMap},
    time::{Duration, Instant},
};

use futures::future::join_all;
use reqwest::StatusCode;
use serde_json::Value;

use crate::{events::all_events, helpers::*, user_deletion::admin};

/// `GET /v1/events{query}` with the admin key: status and body.
async fn feed_page(base: &str, query: &str) -> (StatusCode, Value) {
    admin(base, "GET", &format!("/v1/events{query}")).await
}

/// The whole feed, `limit` at a time from the first, with each event's
/// place (the cursor after it, read one at a time when `limit` is 1).
async fn whole_feed(base: &str, limit: usize) -> Vec<(i64, Value)> {
    let (mut out, mut cursor) = (Vec::new(), "0".to_owned());
    loop {
        let (status, page) = feed_page(base, &format!("?after={cursor}&limit={limit}")).await;
        assert_eq!(status, StatusCode::OK, "{page}");
        let events = page["events"].as_array().unwrap().clone();
        let next = page["cursor"].as_str().unwrap().to_owned();
        if events.is_empty() {
            // At the feed's end (past places left empty, if any).
            let (end, at): (i64, i64) = (next.parse().unwrap(), cursor.parse().unwrap());
            assert!(
                end >= at,
                "an empty page's cursor goes back: {at} then {end}"
            );
            return out;
        }
        assert!(events.len() <= limit);
        let place: i64 = next.parse().unwrap();
        let before: i64 = cursor.parse().unwrap();
        assert!(place > before, "the cursor moves on: {before} then {place}");
        for e in events {
            out.push((place, e));
        }
        cursor = next;
    }
}

/// Waits until the feed holds `n` events (placing follows the commits).
async fn until_placed(base: &str, n: usize) -> Vec<(i64, Value)> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let feed = whole_feed(base, 1000).await;
        if feed.len() >= n || Instant::now() > deadline {
            return feed;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn key(e: &Value) -> (String, i64) {
    (
        e["owner_id"].as_str().unwrap().to_owned(),
        e["seq"].as_i64().unwrap(),
    )
}

/// Each owner's events appear in the feed in their sequence order, once.
fn assert_each_owner_in_order(feed: &[Value]) {
    let mut last: HashMap<String, i64> = HashMap::new();
    for e in feed {
        let (owner, seq) = key(e);
        let before = last.insert(owner.clone(), seq).unwrap_or(0);
        assert!(seq > before, "{owner}'s {seq} after {before}");
    }
}

#[tokio::test]
async fn the_admin_reads_every_owner_s_events_in_one_feed_that_keeps_each_owner_s_order() {
    let app = spawn_app().await;
    let users = [app.create_user("ann").await, app.create_user("bob").await];
    // Both users' uploads at once, interleaved.
    let uploads = users.iter().flat_map(|u| {
        let app = &app;
        (0..8).map(move |i| async move {
            app.upload_json(u, &format!("f{i}.txt"), vec![i as u8; 10])
                .await
        })
    });
    join_all(uploads).await;
    let mut theirs = Vec::new();
    for u in &users {
        theirs.extend(all_events(&app, u, 100).await);
    }
    let feed: Vec<Value> = until_placed(&app.base, theirs.len())
        .await
        .into_iter()
        .map(|(_, e)| e)
        .collect();
    assert_eq!(feed.len(), theirs.len(), "every event placed, once");
    let by_key: BTreeMap<_, _> = feed.iter().map(|e| (key(e), e)).collect();
    assert_eq!(by_key.len(), feed.len(), "none twice");
    for e in &theirs {
        assert_eq!(by_key.get(&key(e)), Some(&e), "as the owner reads it");
    }
    assert_each_owner_in_order(&feed);

    // Paged one at a time, the same events, their places 1, 2, 3…
    let one_by_one = whole_feed(&app.base, 1).await;
    let places: Vec<i64> = one_by_one.iter().map(|(p, _)| *p).collect();
    assert_eq!(places, (1..=feed.len() as i64).collect::<Vec<_>>());
    let again: Vec<Value> = one_by_one.into_iter().map(|(_, e)| e).collect();
    assert_eq!(again, feed);
    // A cursor resumes where it was.
    let (_, page) = feed_page(&app.base, "?after=5&limit=2").await;
    assert_eq!(page["events"].as_array().unwrap()[..], feed[5..7]);
    assert_eq!(page["cursor"], "7");

    // Past the last place: not a cursor this API returned.
    let past = format!("?after={}", feed.len() + 1);
    let (status, body) = feed_page(&app.base, &past).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    // A user's key still reads only their own.
    let (_, own) = app
        .json("GET", "/v1/events?limit=1000", &users[0], None)
        .await;
    let own = own["events"].as_array().unwrap();
    assert!(own.iter().all(|e| e["owner_id"] == users[0].id.as_str()));
    assert_eq!(own.len(), 8);
}

/// Two instances placing at once (each woken by its own commits, on the
/// same store): every event once, the places 1..=n with none skipped.
#[tokio::test]
async fn two_instances_place_every_event_once_with_no_place_skipped() {
    if !real_backends() {
        return;
    }
    let settings = test_settings();
    let apps = [
        spawn_app_with(settings.clone()).await,
        spawn_app_with(settings).await,
    ];
    let mut users = Vec::new();
    for i in 0..4 {
        users.push(apps[0].create_user(&format!("u{i}")).await);
    }
    let uploads = users.iter().enumerate().flat_map(|(i, u)| {
        let apps = &apps;
        (0..10).map(move |n| async move {
            apps[(i + n) % 2]
                .upload_json(u, &format!("f{n}.txt"), vec![n as u8; 10])
                .await
        })
    });
    join_all(uploads).await;
    let mut expected = 0;
    for u in &users {
        expected += all_events(&apps[0], u, 100).await.len();
    }
    assert_eq!(expected, 40);
    until_placed(&apps[1].base, expected).await;
    let one_by_one = whole_feed(&apps[1].base, 1).await;
    let places: Vec<i64> = one_by_one.iter().map(|(p, _)| *p).collect();
    assert_eq!(places, (1..=expected as i64).collect::<Vec<_>>());
    let feed: Vec<Value> = one_by_one.into_iter().map(|(_, e)| e).collect();
    assert_each_owner_in_order(&feed);
}

/// An admin's long poll answers with the first event placed while it
/// waits, placed on another instance when there is Redis.
#[tokio::test]
async fn an_admin_waiting_on_the_feed_is_woken_by_an_event_placed_anywhere() {
    let settings = test_settings();
    let one = spawn_app_with(settings.clone()).await;
    let two = match real_backends() {
        true => Some(spawn_app_with(settings).await),
        false => None,
    };
    let writer = two.as_ref().unwrap_or(&one);
    let ann = one.create_user("ann").await;
    let reader = tokio::spawn({
        let base = one.base.clone();
        async move { feed_page(&base, "?after=0&wait=30").await }
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    while one.metric("filedock_event_waiters", "").await != 1.0 {
        assert!(Instant::now() < deadline, "the admin never waited");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let file = writer.upload_json(&ann, "a.txt", b"a".to_vec()).await;
    let (status, page) = reader.await.unwrap();
    assert_eq!(status, StatusCode::OK, "{page}");
    assert_eq!(page["events"][0]["subject"], file["id"], "{page}");
    assert_eq!(page["cursor"], "1");
}

/// A user's deletion removes their events from their data, and from the
/// feed, but for the `user.deleted` it writes as it begins; another
/// user's events stay.
#[tokio::test]
async fn a_deleted_user_s_events_leave_the_feed_but_their_user_deleted() {
    let mut settings = test_settings();
    settings.sweep.interval = Duration::ZERO;
    let app = spawn_app_with(settings).await;
    let (ann, bob) = (app.create_user("ann").await, app.create_user("bob").await);
    for u in [&ann, &bob] {
        for i in 0..3 {
            app.upload_json(u, &format!("f{i}.txt"), vec![i; 10]).await;
        }
    }
    until_placed(&app.base, 6).await;
    let user = format!("/v1/admin/users/{}", ann.id);
    let (status, _) = admin(&app.base, "DELETE", &user).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let started = Instant::now();
    loop {
        app.state.sweeper.try_run_once().await.unwrap();
        if admin(&app.base, "GET", &user).await.0 == StatusCode::NOT_FOUND {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(60), "stalled");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let feed: Vec<Value> = until_placed(&app.base, 4)
        .await
        .into_iter()
        .map(|(_, e)| e)
        .collect();
    let anns: Vec<&Value> = feed.iter().filter(|e| e["owner_id"] == ann.id).collect();
    assert_eq!(anns.len(), 1, "{feed:?}");
    assert_eq!(anns[0]["type"], "user.deleted");
    assert_eq!(anns[0]["seq"], 4, "numbered after their last event");
    assert_eq!(anns[0]["subject"], ann.id.as_str());
    assert_eq!(anns[0]["data"]["user_id"], ann.id.as_str());
    let bobs = feed.iter().filter(|e| e["owner_id"] == bob.id).count();
    assert_eq!(bobs, 3);
    // Read a place at a time, past the places ann's events left empty.
    let one_by_one: Vec<Value> = whole_feed(&app.base, 1)
        .await
        .into_iter()
        .map(|(_, e)| e)
        .collect();
    assert_eq!(one_by_one, feed);
}

/// The retention removes events from the feed too: a cursor from before
/// one it removed is told 410, a read from the start begins at the oldest
/// kept.
#[tokio::test]
async fn a_feed_cursor_from_before_the_retention_s_removal_is_told() {
    let mut settings = test_settings();
    settings.sweep.interval = Duration::ZERO;
    settings.sweep.event_retention = Duration::from_secs(1);
    let app = spawn_app_with(settings).await;
    let ann = app.create_user("ann").await;
    for i in 0..3 {
        app.upload_json(&ann, &format!("old{i}.txt"), vec![i; 10])
            .await;
    }
    until_placed(&app.base, 3).await;
    tokio::time::sleep(Duration::from_millis(1200)).await;
    // All removed: a read from the start is told where the feed stands,
    // so that a reader who comes back later with that cursor is told
    // what it missed in between.
    app.state.sweeper.try_run_once().await.unwrap();
    let (status, page) = feed_page(&app.base, "").await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert_eq!(page["events"].as_array().unwrap().len(), 0, "{page}");
    assert_eq!(page["cursor"], "3");
    let young = app.upload_json(&ann, "young.txt", b"young".to_vec()).await;
    until_placed(&app.base, 1).await;
    app.state.sweeper.try_run_once().await.unwrap();
    let (status, page) = feed_page(&app.base, "").await;
    assert_eq!(status, StatusCode::OK, "{page}");
    let events = page["events"].as_array().unwrap();
    assert_eq!(events.len(), 1, "{page}");
    assert_eq!(events[0]["subject"], young["id"]);
    assert_eq!(page["cursor"], "4");
    assert_eq!(feed_page(&app.base, "?after=3").await.1, page);
    for old in ["?after=1", "?after=2"] {
        let (status, body) = feed_page(&app.base, old).await;
        assert_eq!(status, StatusCode::GONE, "{old}: {body}");
        assert_eq!(body["error"]["code"], "cursor_expired");
    }
}

/// An embedded store written before the feed existed: its events are
/// placed in it once the new version opens it (without that they would
/// never be, and neither the retention nor a deletion would remove them).
#[tokio::test]
async fn events_written_before_the_feed_are_placed_after_an_upgrade() {
    if real_backends() {
        // MongoDB finds them by their unset `feed` without a migration.
        return;
    }
    let app = spawn_app().await;
    let ann = app.create_user("ann").await;
    for i in 0..2 {
        app.upload_json(&ann, &format!("f{i}.txt"), vec![i; 10])
            .await;
    }
    until_placed(&app.base, 2).await;
    let settings = app.stop().await;
    {
        // The shape before: no place, no entries of the feed.
        let store = filedock::meta::embedded::EmbeddedStore::open(&settings.data_dir).unwrap();
        let mut tx = store.begin().unwrap();
        for key in tx.keys(&format!("events/{}/", ann.id), None, 100).unwrap() {
            let mut event: Value = tx.get(&key).unwrap().unwrap();
            event.as_object_mut().unwrap().remove("feed");
            tx.put(&key, &event).unwrap();
        }
        for prefix in ["feed/", "feed_pending/", "migrations/"] {
            for key in tx.keys(prefix, None, 100).unwrap() {
                tx.delete(&key);
            }
        }
        tx.delete("event_feed");
        tx.commit(&store).unwrap();
    }
    let app = spawn_app_with(settings).await;
    // Placed by the sequencer at its start, in order.
    until_placed(&app.base, 2).await;
    let placed: Vec<(i64, Value)> = (whole_feed(&app.base, 1).await.into_iter())
        .map(|(p, e)| (p, e["seq"].clone()))
        .collect();
    assert_eq!(placed, [(1, Value::from(1)), (2, Value::from(2))]);
}
