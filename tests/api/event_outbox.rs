//! MongoDB's outbox (README "Events"): a change's transaction writes its
//! event into `event_outbox`; the sequencer moves it into `events` with its
//! place in the feed. An owner reads an event from either, once; events
//! the version before the outbox left unplaced in `events` are placed in
//! their owner's order among the moved ones. Real backends only (the
//! embedded store places its events where they are).

use bson::{Document, doc};
use filedock::{
    domain::users::create_user,
    meta::{DeletionRepo, EventRepo, mongo::MongoStore},
};
use mongodb::{Collection, Database};
use prometheus_client::metrics::counter::Counter;
use secrecy::ExposeSecret;
use serde_json::Value;

use crate::{
    event_feed::{until_placed, whole_feed},
    events::all_events,
    helpers::*,
};

/// The app's database, through a client of the test's own.
async fn database(settings: &filedock::config::Settings) -> Database {
    let uri = settings.mongodb_uri.as_ref().unwrap().expose_secret();
    let client = mongodb::Client::with_uri_str(uri).await.unwrap();
    client.database(&settings.mongodb_db)
}

/// The app's store, with no sequencer running.
async fn store(settings: &filedock::config::Settings) -> MongoStore {
    let uri = settings.mongodb_uri.as_ref().unwrap().expose_secret();
    let store = MongoStore::connect(uri, &settings.mongodb_db, Counter::default());
    store.await.unwrap()
}

/// Moves `owner`'s placed events numbered `seqs` back into the outbox, as
/// a commit leaves them.
async fn back_to_the_outbox(db: &Database, owner: &str, seqs: &[i64]) {
    let events: Collection<Document> = db.collection("events");
    let outbox: Collection<Document> = db.collection("event_outbox");
    for seq in seqs {
        let one = doc! {"owner_id": owner, "seq": seq};
        let mut event = events.find_one_and_delete(one).await.unwrap().unwrap();
        event.remove("feed");
        outbox.insert_one(event).await.unwrap();
    }
}

/// An event is its owner's as soon as it commits: read from the outbox
/// before any placing, and from `events` after it, the same and once.
#[tokio::test]
async fn an_owner_reads_an_event_in_the_outbox_and_once_moved_the_same() {
    if !real_backends() {
        return;
    }
    let app = spawn_app().await;
    let ann = app.create_user("ann").await;
    for i in 0..3 {
        app.upload_json(&ann, &format!("f{i}.txt"), vec![i; 10])
            .await;
    }
    assert_eq!(until_placed(&app.base, 3).await.len(), 3);
    let before = all_events(&app, &ann, 100).await;
    let settings = app.stop().await;
    let db = database(&settings).await;
    back_to_the_outbox(&db, &ann.id, &[2, 3]).await;

    // A store with no sequencer running: 2 and 3 wait in the outbox.
    let store = store(&settings).await;
    let owner = ann.id.parse().unwrap();
    let seqs = |events: &[filedock::meta::EventRecord]| -> Vec<i64> {
        events.iter().map(|e| e.seq).collect()
    };
    let page = store.owner_page(&owner, 0, 100).await.unwrap();
    assert_eq!((page.last, seqs(&page.events)), (3, vec![1, 2, 3]));
    // Past a cursor, and a page that ends inside the outbox.
    let page = store.owner_page(&owner, 1, 1).await.unwrap();
    assert_eq!(seqs(&page.events), [2]);
    assert_eq!(seqs(&store.events(&owner, 1, 100).await.unwrap()), [2, 3]);

    assert_eq!(store.sequence_events(200).await.unwrap(), 2);
    let outbox: Collection<Document> = db.collection("event_outbox");
    assert_eq!(outbox.count_documents(doc! {}).await.unwrap(), 0);
    let page = store.owner_page(&owner, 0, 100).await.unwrap();
    assert_eq!(seqs(&page.events), [1, 2, 3]);
    // Placed after the feed's last place (3, before they went back).
    let places: Vec<Option<i64>> = page.events.iter().map(|e| e.feed).collect();
    assert_eq!(places, [Some(1), Some(4), Some(5)]);

    // Through the API, the same events as before the move.
    let app = spawn_app_with(settings).await;
    let after = all_events(&app, &ann, 2).await;
    assert_eq!(after, before);
}

/// MongoDB during a rolling upgrade: an instance of the version before the
/// outbox (or one with `FILEDOCK_EVENT_OUTBOX=false`) wrote a user's first
/// events into `events` unplaced, this version's their next into the
/// outbox; the sequencer places them all in the owner's order, also when a
/// placing cannot take them all at once (its read of the unplaced ones
/// full, the outbox's event waits for the next).
#[tokio::test]
async fn events_left_unplaced_by_the_version_before_the_outbox_are_placed_in_order() {
    if !real_backends() {
        return;
    }
    let app = spawn_app().await;
    let ann = app.create_user("ann").await;
    for i in 0..3 {
        app.upload_json(&ann, &format!("f{i}.txt"), vec![i; 10])
            .await;
    }
    assert_eq!(until_placed(&app.base, 3).await.len(), 3);
    let settings = app.stop().await;
    let db = database(&settings).await;
    // Number 3 in the outbox, as this version's commit left it; 1 and 2
    // as the version before left them; the feed empty again.
    back_to_the_outbox(&db, &ann.id, &[3]).await;
    let events: Collection<Document> = db.collection("events");
    let old = doc! {"owner_id": &ann.id, "seq": {"$lte": 2}};
    let unset = doc! {"$unset": {"feed": ""}};
    assert_eq!(
        events.update_many(old, unset).await.unwrap().modified_count,
        2
    );
    let feed: Collection<Document> = db.collection("event_feed");
    feed.delete_many(doc! {}).await.unwrap();

    // Two at a time: 1 and 2, then 3.
    let store = store(&settings).await;
    let place = |seq: i64| {
        let events = events.clone();
        let owner = ann.id.clone();
        async move {
            let event = events.find_one(doc! {"owner_id": owner, "seq": seq});
            event.await.unwrap().and_then(|e| e.get_i64("feed").ok())
        }
    };
    assert_eq!(store.sequence_events(2).await.unwrap(), 2);
    assert_eq!(
        (place(1).await, place(2).await, place(3).await),
        (Some(1), Some(2), None)
    );
    assert_eq!(store.sequence_events(2).await.unwrap(), 1);
    assert_eq!(place(3).await, Some(3));

    // Moved, not copied: the outbox is empty, and the user and the admin
    // read each once.
    let app = spawn_app_with(settings).await;
    let placed: Vec<(i64, Value)> = (whole_feed(&app.base, 1).await.into_iter())
        .map(|(p, e)| (p, e["seq"].clone()))
        .collect();
    let want: Vec<(i64, Value)> = (1..=3).map(|s| (s, Value::from(s))).collect();
    assert_eq!(placed, want);
    let seqs: Vec<i64> = (all_events(&app, &ann, 2).await.iter())
        .map(|e| e["seq"].as_i64().unwrap())
        .collect();
    assert_eq!(seqs, [1, 2, 3]);
    let outbox: Collection<Document> = db.collection("event_outbox");
    assert_eq!(outbox.count_documents(doc! {}).await.unwrap(), 0);
}

/// `FILEDOCK_EVENT_OUTBOX=false` (a rolling upgrade from a version before
/// the outbox): a change writes its event into `events`, unplaced, where
/// the older instances read it; it is read and placed where it is.
#[tokio::test]
async fn with_the_outbox_off_an_event_is_written_where_older_versions_read_it() {
    if !real_backends() {
        return;
    }
    let settings = test_settings();
    let store = store(&settings).await.writing_outbox(false);
    let (ann, _) = create_user(&store, "ann").await.unwrap();
    store.begin_user_deletion(&ann.id).await.unwrap();
    let db = database(&settings).await;
    let events: Collection<Document> = db.collection("events");
    let outbox: Collection<Document> = db.collection("event_outbox");
    let theirs = doc! {"owner_id": ann.id.to_string()};
    let written = events.find_one(theirs.clone()).await.unwrap().unwrap();
    assert_eq!(written.get_str("type"), Ok("user.deleted"));
    assert!(written.get("feed").is_none(), "{written}");
    assert_eq!(outbox.count_documents(theirs.clone()).await.unwrap(), 0);
    let page = store.owner_page(&ann.id, 0, 10).await.unwrap();
    assert_eq!(page.events.len(), 1);

    assert_eq!(store.sequence_events(200).await.unwrap(), 1);
    let placed = events.find_one(theirs).await.unwrap().unwrap();
    assert_eq!(placed.get_i64("feed"), Ok(1));
}
