//! Group commits of different users merged: the groups of several users
//! ready while the instance's mergers are busy go to the store in one
//! transaction, and each upload still gets its own answer. The tests hold
//! every merger on a user's turn (each with one upload of a "busy" user),
//! so that the groups that arrive meanwhile wait together, then let go.

use filedock::{domain::UserId, domain::upload::MERGERS, meta::UserTurns};
use reqwest::StatusCode;
use tokio::sync::MutexGuard;

use crate::{events::all_events, group_commit::*, helpers::*};

/// Occupies every merger: a busy user's upload each, held on that user's
/// turn (taken here first), and taken by a merger before the next is sent.
async fn occupy_mergers<'a>(
    app: &TestApp,
    turns: &'a UserTurns,
    busy: &[TestUser],
) -> (
    Vec<MutexGuard<'a, ()>>,
    Vec<tokio::task::JoinHandle<reqwest::Response>>,
) {
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

async fn users(app: &TestApp, prefix: &str, n: usize) -> Vec<TestUser> {
    let mut out = Vec::new();
    for i in 0..n {
        out.push(app.create_user(&format!("{prefix}{i}")).await);
    }
    out
}

#[tokio::test]
async fn groups_of_different_users_ready_together_commit_in_one_transaction() {
    let app = spawn_app().await;
    let busy = users(&app, "busy", MERGERS).await;
    let merged = users(&app, "merged", 3).await;
    let (held, busy_sent) = occupy_mergers(&app, app.state.files.turns(), &busy).await;
    let body = |i: usize| pseudo_random_bytes(50 + i, i as u64);
    let sent: Vec<_> = merged
        .iter()
        .enumerate()
        .map(|(i, u)| send(&app, u, body(i), None))
        .collect();
    until_waiting(&app, merged.len()).await;
    drop(held);
    for (s, v) in statuses(busy_sent).await {
        assert_eq!(s, StatusCode::CREATED, "{v}");
    }
    let answers = statuses(sent).await;

    for (i, (u, (status, v))) in merged.iter().zip(&answers).enumerate() {
        assert_eq!(*status, StatusCode::CREATED, "{v}");
        let id = v["id"].as_str().unwrap().to_owned();
        assert_eq!(
            app.list_ids(u).await,
            std::slice::from_ref(&id),
            "{}'s file is theirs",
            u.id
        );
        let got = app.download(u, &id).await.bytes().await.unwrap();
        assert_eq!(got.as_ref(), body(i).as_slice(), "bytes of {id}");
        let user = stored_user(&app, u).await;
        assert_eq!(
            (user.file_count, user.used_bytes),
            (1, body(i).len() as i64)
        );
        let events = all_events(&app, u, 10).await;
        assert_eq!(events.len(), 1, "one event each: {events:?}");
        assert_eq!(events[0]["seq"], 1);
        assert_eq!(events[0]["type"], "file.created");
        assert_eq!(events[0]["subject"], id.as_str());
    }
    assert_eq!(app.intents().await, 0, "every intent settled");
    let (txns, conflicts) = commit_txns(&app).await;
    assert_eq!(
        txns - conflicts,
        (MERGERS + 1) as f64,
        "one transaction per busy upload, and one for the three merged"
    );
    let merged_groups = app.metric("filedock_upload_groups_merged_total", "").await;
    assert_eq!(merged_groups, merged.len() as f64);
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
    until_waiting(&app, merged.len()).await;
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
    for (s, v) in statuses(busy_sent).await {
        assert_eq!(s, StatusCode::CREATED, "{v}");
    }
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
}
