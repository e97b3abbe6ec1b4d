//! A dead letter holds a copy of its event (file names, sizes, hashes): it
//! goes where the event goes, with its user's deletion and past
//! `FILEDOCK_EVENT_RETENTION_SECS`, unless an admin replayed or discarded
//! it first.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::Value;

use crate::{
    helpers::*,
    support::webhook_receiver::{WebhookReceiver, summary},
    webhooks::{dead_letters, webhook_settings},
};

/// The dead letters' events' ids.
async fn letters_of(app: &TestApp) -> Vec<String> {
    let page = dead_letters(app, "?limit=1000").await;
    let letters = page["dead_letters"].as_array().unwrap();
    letters
        .iter()
        .map(|l| l["event"]["id"].as_str().unwrap().to_owned())
        .collect()
}

/// Sweeps until `done` holds of the dead letters' events, at most 30 s.
async fn sweep_until(app: &TestApp, what: &str, done: impl Fn(&[String]) -> bool) {
    let began = Instant::now();
    loop {
        app.state.sweeper.try_run_once().await.unwrap();
        let ids = letters_of(app).await;
        if done(&ids) {
            return;
        }
        assert!(
            began.elapsed() < Duration::from_secs(30),
            "{what}: the dead letters are {ids:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn dead_letters_go_with_their_user_and_past_the_events_retention() {
    let rx = WebhookReceiver::start().await;
    let mut settings = test_settings();
    let mut hooks = webhook_settings(&rx, Duration::from_millis(200));
    hooks.max_age = Duration::from_secs(1);
    settings.webhooks = Some(hooks);
    // Long enough that ann's deletion is swept before bob's letter is
    // past it, on a slow machine too.
    settings.sweep.event_retention = Duration::from_secs(10);
    let app = spawn_app_with(settings).await;
    let (ann, bob) = (app.create_user("ann").await, app.create_user("bob").await);
    // Each one's first is refused until given up on.
    let firsts = [format!("{}:1", ann.id), format!("{}:1", bob.id)];
    rx.fail_ids(firsts.clone());
    for user in [&ann, &bob] {
        app.upload_json(user, "a.txt", b"a".to_vec()).await;
        app.upload_json(user, "b.txt", b"b".to_vec()).await;
    }
    let began = Instant::now();
    loop {
        let ids = letters_of(&app).await;
        if firsts.iter().all(|f| ids.contains(f)) {
            assert_eq!(ids.len(), 2, "{ids:?}");
            break;
        }
        assert!(
            began.elapsed() < Duration::from_secs(20),
            "not dead-lettered: {ids:?}; {}",
            summary(&rx.requests())
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    rx.answer_ok();

    // Ann's deletion takes hers; bob's stays.
    let res = app
        .client
        .delete(app.url(&format!("/v1/admin/users/{}", ann.id)))
        .bearer_auth(ADMIN_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::ACCEPTED);
    sweep_until(&app, "ann's deletion", |ids| {
        !ids.contains(&firsts[0]) && ids.contains(&firsts[1])
    })
    .await;
    let kept: Value = dead_letters(&app, "").await;
    assert_eq!(kept["dead_letters"].as_array().unwrap().len(), 1, "{kept}");

    // Bob's goes once his event is past the retention (10 s after it was
    // written), with the event.
    sweep_until(&app, "the retention", |ids| ids.is_empty()).await;
    let (status, body) = app.json("GET", "/v1/events?after=0", &bob, None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(
        body["events"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["seq"] != 1),
        "bob's first event outlived its dead letter: {body}"
    );
    app.stop().await;
}

/// Nothing of a user whose deletion began is kept as a dead letter (their
/// events hold file names), but `user.deleted`, which their deletion keeps
/// as an event and so as a letter. Without the owner's check a given-up
/// event of theirs was kept after the purge had passed (the fault suite's
/// seed 13831216074796081333); without the purge sparing it, the
/// `user.deleted` letter went with the purge.
#[tokio::test]
async fn a_deleted_user_s_events_given_up_are_not_kept_but_user_deleted_is() {
    let rx = WebhookReceiver::start().await;
    let mut settings = test_settings();
    let mut hooks = webhook_settings(&rx, Duration::from_millis(200));
    hooks.max_age = Duration::from_secs(1);
    settings.webhooks = Some(hooks);
    // The deletion's purge runs only when the test sweeps.
    settings.sweep.interval = Duration::ZERO;
    let app = spawn_app_with(settings).await;
    let ann = app.create_user("ann").await;
    rx.fail_ids((1..=10).map(|seq| format!("{}:{seq}", ann.id)));
    app.upload_json(&ann, "a.txt", b"a".to_vec()).await;
    // Marked while the upload's event is younger than the maximum age: it
    // is given up on after the mark, before any purge.
    let res = app
        .client
        .delete(app.url(&format!("/v1/admin/users/{}", ann.id)))
        .bearer_auth(ADMIN_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::ACCEPTED);
    let kinds = |page: &Value| -> Vec<String> {
        let letters = page["dead_letters"].as_array().unwrap();
        letters
            .iter()
            .map(|l| l["event"]["type"].as_str().unwrap().to_owned())
            .collect()
    };
    // Every event of hers refused past the maximum age (a second), then
    // given up on: by now only user.deleted is a letter.
    let began = Instant::now();
    loop {
        let page = dead_letters(&app, "?limit=1000").await;
        if kinds(&page) == ["user.deleted"] && began.elapsed() > Duration::from_secs(3) {
            break;
        }
        assert!(
            began.elapsed() < Duration::from_secs(20),
            "the dead letters: {page}; {}",
            summary(&rx.requests())
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let upload_refused = rx
        .requests()
        .iter()
        .any(|d| d.kind.as_deref() == Some("file.created"));
    assert!(upload_refused, "the upload's event was never tried");
    // Her deletion's purge, to its end, leaves it.
    let began = Instant::now();
    loop {
        app.state.sweeper.try_run_once().await.unwrap();
        let meta = &app.state.ports.meta;
        if meta.users_being_deleted(1).await.unwrap().is_empty() {
            break;
        }
        assert!(began.elapsed() < Duration::from_secs(30), "not deleted");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let page = dead_letters(&app, "").await;
    assert_eq!(kinds(&page), ["user.deleted"], "{page}");
    app.stop().await;
}
