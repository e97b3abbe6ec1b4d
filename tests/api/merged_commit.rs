//! Group commits of different users merged: the groups of several users
//! ready while the instance's mergers are busy go to the store in one
//! transaction, and each upload still gets its own answer. The tests hold
//! every merger on a user's turn (each with one upload of a "busy" user),
//! so that the groups that arrive meanwhile wait together, then let go.

use std::collections::HashSet;

use filedock::{domain::UserId, domain::upload::MERGERS, meta::UserTurns};
use reqwest::{Response, StatusCode};
use serde_json::Value;
use tokio::{sync::MutexGuard, task::JoinHandle};

use crate::{events::all_events, group_commit::*, helpers::*};

/// Occupies every merger: a busy user's upload each, held on that user's
/// turn (taken here first), and taken by a merger before the next is sent.
async fn occupy_mergers<'a>(
    app: &TestApp,
    turns: &'a UserTurns,
    busy: &[TestUser],
) -> (Vec<MutexGuard<'a, ()>>, Vec<JoinHandle<Response>>) {
    let ids: Vec<UserId> = busy.iter().map(TestUser::user_id).collect();
    let held = turns.hold_all(&ids.iter().collect::<Vec<_>>()).await;
    let mut sent = Vec::new();
    for u in busy {
        // Held in its committer until it is the only one waiting, then
        // counted off as a merger takes it.
        let lock = hold_commit_lock(app, u).await;
        sent.push(send(app, u, b"busy".to_vec(), None));
        until_waiting(app, 1).await;
        lock.release().await;
        until_waiting(app, 0).await;
    }
    (held, sent)
}

/// Waits until `n` users' groups wait for a merger.
async fn until_groups_waiting(app: &TestApp, n: usize) {
    until_gauge(app, "filedock_upload_groups_waiting", n).await
}

async fn users(app: &TestApp, prefix: &str, n: usize) -> Vec<TestUser> {
    let mut out = Vec::new();
    for i in 0..n {
        out.push(app.create_user(&format!("{prefix}{i}")).await);
    }
    out
}

async fn all_created(sent: Vec<JoinHandle<Response>>) -> Vec<Value> {
    let answers = statuses(sent).await;
    for (s, v) in &answers {
        assert_eq!(*s, StatusCode::CREATED, "{v}");
    }
    answers.into_iter().map(|(_, v)| v).collect()
}

#[tokio::test]
async fn groups_of_different_users_ready_together_commit_in_one_transaction() {
    let app = spawn_app().await;
    let busy = users(&app, "busy", MERGERS).await;
    let merged = users(&app, "merged", 3).await;
    // Each has a file already: their new events number on from it.
    for u in &merged {
        let first = app.upload_raw(u, "first.bin", b"first".to_vec()).await;
        assert_eq!(first.status(), StatusCode::CREATED);
    }
    let (txns_before, conflicts_before) = commit_txns(&app).await;
    let (held, busy_sent) = occupy_mergers(&app, app.state.files.turns(), &busy).await;
    let body = |i: usize| pseudo_random_bytes(50 + i, i as u64);
    // The first user's two uploads wait in one group behind their lock
    // while the others' groups wait for a merger, then it joins them.
    let lock = hold_commit_lock(&app, &merged[0]).await;
    let mut sent = vec![
        send(&app, &merged[0], body(0), None),
        send(&app, &merged[0], body(1), None),
    ];
    until_waiting(&app, 2).await;
    sent.push(send(&app, &merged[1], body(2), None));
    sent.push(send(&app, &merged[2], body(3), None));
    until_groups_waiting(&app, 2).await;
    lock.release().await;
    until_groups_waiting(&app, 3).await;
    drop(held);
    all_created(busy_sent).await;
    let answers = all_created(sent).await;

    let owners = [0, 0, 1, 2];
    for (i, v) in answers.iter().enumerate() {
        let (u, id) = (&merged[owners[i]], v["id"].as_str().unwrap());
        let got = app.download(u, id).await.bytes().await.unwrap();
        assert_eq!(got.as_ref(), body(i).as_slice(), "bytes of {id}");
    }
    for (n, u) in merged.iter().enumerate() {
        let mine: Vec<&Value> = (0..4)
            .filter(|&i| owners[i] == n)
            .map(|i| &answers[i])
            .collect();
        let ids: HashSet<&str> = mine.iter().map(|v| v["id"].as_str().unwrap()).collect();
        let bytes: i64 = mine.iter().map(|v| v["size"].as_i64().unwrap()).sum();
        let user = stored_user(&app, u).await;
        assert_eq!(
            (user.file_count, user.used_bytes),
            (1 + ids.len() as i64, 5 + bytes),
            "{} counted once each",
            u.id
        );
        assert_eq!(app.list_ids(u).await.len(), 1 + ids.len());
        // Numbered on from the first file's event, no gap, one per file.
        let events = all_events(&app, u, 10).await;
        let seqs: Vec<i64> = events.iter().map(|e| e["seq"].as_i64().unwrap()).collect();
        assert_eq!(seqs, (1..=1 + ids.len() as i64).collect::<Vec<_>>());
        let subjects: HashSet<&str> = events[1..]
            .iter()
            .map(|e| {
                assert_eq!(e["type"], "file.created");
                e["subject"].as_str().unwrap()
            })
            .collect();
        assert_eq!(subjects, ids, "{}'s events are their files'", u.id);
    }
    assert_eq!(app.intents().await, 0, "every intent settled");
    let (txns, conflicts) = commit_txns(&app).await;
    assert_eq!(
        (txns - txns_before) - (conflicts - conflicts_before),
        (MERGERS + 1) as f64,
        "one transaction per busy upload, and one for the three merged"
    );
    let merged_groups = app.metric("filedock_upload_groups_merged_total", "").await;
    assert_eq!(merged_groups, merged.len() as f64);
    until_waiting(&app, 0).await;
    until_groups_waiting(&app, 0).await;
}

/// A merged transaction one group's refusal fails (its upload's intent
/// was swept while it waited) changes nothing; each group is then
/// committed on its own: the swept upload 409 `upload_expired`, the
/// others 201, each counted once.
#[tokio::test]
async fn a_merged_transaction_a_group_refuses_commits_each_group_on_its_own() {
    let app = spawn_app().await;
    let busy = users(&app, "busy", MERGERS).await;
    let merged = users(&app, "refusing", 3).await;
    let (held, busy_sent) = occupy_mergers(&app, app.state.files.turns(), &busy).await;
    let sent: Vec<_> = merged
        .iter()
        .map(|u| send(&app, u, vec![b'm'; 40], None))
        .collect();
    until_groups_waiting(&app, merged.len()).await;
    let far = filedock::meta::now() + chrono::Duration::days(1);
    let intents = app.state.ports.meta.intents(far, 100).await.unwrap();
    let swept = intents
        .iter()
        .find(|i| i.user_id == merged[1].user_id())
        .expect("the second user's intent")
        .id;
    assert!(
        app.state
            .ports
            .meta
            .abandon_intent(&merged[1].user_id(), &swept, None)
            .await
            .unwrap()
            .is_some(),
        "the intent was there to sweep"
    );
    drop(held);
    all_created(busy_sent).await;
    let answers = statuses(sent).await;
    let got: Vec<u16> = answers.iter().map(|(s, _)| s.as_u16()).collect();
    assert_eq!(got, [201, 409, 201], "{answers:?}");
    assert_eq!(answers[1].1["error"]["code"], "upload_expired");
    for (i, u) in merged.iter().enumerate() {
        let user = stored_user(&app, u).await;
        let n = (i != 1) as i64;
        assert_eq!((user.file_count, user.used_bytes), (n, 40 * n), "{}", u.id);
        assert_eq!(app.list_ids(u).await.len(), n as usize);
        assert_eq!(all_events(&app, u, 10).await.len(), n as usize);
    }
    let (txns, conflicts) = commit_txns(&app).await;
    assert_eq!(
        txns - conflicts,
        (MERGERS + 1 + 3) as f64,
        "the busy ones, the merged one refused, then one per group"
    );
    assert_eq!(
        app.metric("filedock_upload_groups_merged_total", "").await,
        0.0
    );
    assert_eq!(app.intents().await, 0);
    assert_eq!(
        app.blob_keys(&merged[1]).await.len(),
        0,
        "the swept blob is gone"
    );
}
