//! `filedock_mongo_commands_total` counts the commands sent to MongoDB. The
//! product counts them by the connections checked out to send them (the
//! driver's command events cost a copy and a parse of every command and
//! reply); a store with an observer counts the command events. Both stores
//! run the same work on the real MongoDB-compatible server (a transaction,
//! reads, a read past a cursor's first batch, a command that fails) and must
//! count the same, and that count must be the commands the observer saw.
//! Real backends only.

use std::sync::{
    Arc,
    atomic::{AtomicU64, Ordering},
};

use filedock::{
    domain::users::create_user,
    meta::{UserRepo, mongo::MongoStore},
};
use prometheus_client::metrics::counter::Counter;
use secrecy::ExposeSecret;

use crate::helpers::{real_backends, test_settings};

/// The same work on `store`, by users named with `tag`.
async fn work(store: &MongoStore, tag: &str) {
    let mut first = None;
    // More users than a cursor's first batch of a listing holds (101).
    for i in 0..105 {
        let (user, key) = create_user(store, &format!("{tag}-{i}")).await.unwrap();
        if first.is_none() {
            first = Some((user, key));
        }
    }
    let (user, key) = first.unwrap();
    assert!(store.user(&user.id).await.unwrap().is_some());
    assert!(
        store
            .set_quota(&user.id, Some(1 << 20))
            .await
            .unwrap()
            .is_some()
    );
    // The same user again: the server refuses the insert (a failed command).
    assert!(store.insert_user(&user, &key.record).await.is_err());
    let listed = store.list_users(None, 110).await.unwrap();
    assert!(listed.len() >= 105, "listed {}", listed.len());
}

#[tokio::test]
async fn the_command_count_by_checkouts_is_the_count_of_commands_sent() {
    if !real_backends() {
        return;
    }
    let settings = test_settings();
    let uri = settings.mongodb_uri.as_ref().unwrap().expose_secret();
    let db = &settings.mongodb_db;

    let by_checkouts = Counter::default();
    let plain = MongoStore::connect(uri, db, by_checkouts.clone())
        .await
        .unwrap();
    let by_events = Counter::default();
    let seen = Arc::new(AtomicU64::new(0));
    let observer = {
        let seen = seen.clone();
        Arc::new(move |_| {
            seen.fetch_add(1, Ordering::Relaxed);
        })
    };
    let observed = MongoStore::connect_observed(uri, db, by_events.clone(), observer)
        .await
        .unwrap();

    // What each start sent (indexes, migrations) is not counted here.
    let (c0, e0, s0) = (
        by_checkouts.get(),
        by_events.get(),
        seen.load(Ordering::Relaxed),
    );
    work(&plain, "checkouts").await;
    work(&observed, "events").await;
    let checkouts = by_checkouts.get() - c0;
    let events = by_events.get() - e0;
    let sent = seen.load(Ordering::Relaxed) - s0;
    assert_eq!(events, sent, "the observed store counts what it observes");
    assert!(events > 105, "the work sent {events} commands");
    assert_eq!(
        checkouts, events,
        "counted by checkouts {checkouts}, by command events {events}"
    );
}
