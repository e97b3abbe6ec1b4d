//! Sessions and agents under their own lock levels: seed 000's MCP burst,
//! 100-way concurrent connects and attaches, delete-vs-attach races, both
//! lock strategies.

use std::collections::HashSet;

use filedock::config::{Coordination, LockStrategy};
use futures::future::join_all;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::*;

async fn app_with(strategy: LockStrategy) -> TestApp {
    let mut settings = test_settings();
    settings.lock.strategy = strategy;
    spawn_app_with(settings).await
}

const STRATEGIES: [LockStrategy; 2] = [LockStrategy::Notify, LockStrategy::Backoff];

impl TestApp {
    pub(crate) async fn json(
        &self,
        method: &str,
        path: impl Into<String>,
        user: &TestUser,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let mut req = self
            .client
            .request(method.parse().unwrap(), self.url(&path.into()))
            .bearer_auth(&user.key);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let res = req.send().await.unwrap();
        let status = res.status();
        (status, res.json().await.unwrap_or(Value::Null))
    }

    pub(crate) async fn new_agent(&self, user: &TestUser) -> String {
        let (status, agent) = self
            .json("POST", "/v1/agents", user, Some(json!({"name": "helper"})))
            .await;
        assert_eq!(status, StatusCode::CREATED);
        agent["id"].as_str().unwrap().to_owned()
    }

    pub(crate) async fn new_session(&self, user: &TestUser) -> String {
        let (status, session) = self.json("POST", "/v1/sessions", user, None).await;
        assert_eq!(status, StatusCode::CREATED);
        session["id"].as_str().unwrap().to_owned()
    }

    pub(crate) async fn new_file(&self, user: &TestUser, i: usize) -> String {
        let res = self
            .upload_raw(user, "f.txt", format!("file {i}").into_bytes())
            .await;
        assert_eq!(res.status(), StatusCode::CREATED);
        res.json::<Value>().await.unwrap()["id"]
            .as_str()
            .unwrap()
            .to_owned()
    }
}

fn ids(v: &Value, field: &str) -> Vec<String> {
    v[field]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn seed_000_four_mcp_connects_within_milliseconds_all_succeed() {
    for strategy in STRATEGIES {
        let app = app_with(strategy).await;
        let u = app.create_user("u").await;
        let agent = app.new_agent(&u).await;
        let started = std::time::Instant::now();
        let connects = ["github", "slack", "notion", "jira"]
            .map(|mcp| app.json("PUT", format!("/v1/agents/{agent}/mcps/{mcp}"), &u, None));
        let results = join_all(connects).await;
        eprintln!(
            "{strategy:?}: 4 connects fired together, done in {:?}",
            started.elapsed()
        );
        for (status, _) in &results {
            assert_eq!(*status, StatusCode::OK, "{strategy:?}");
        }
        let (_, agent) = app
            .json("GET", format!("/v1/agents/{agent}"), &u, None)
            .await;
        let mut mcps = ids(&agent, "mcp_ids");
        mcps.sort();
        assert_eq!(mcps, ["github", "jira", "notion", "slack"], "{strategy:?}");
    }
}

#[tokio::test]
async fn a_hundred_concurrent_connects_are_all_kept_once_and_repeats_change_nothing() {
    for strategy in STRATEGIES {
        let app = app_with(strategy).await;
        let u = app.create_user("u").await;
        let agent = app.new_agent(&u).await;
        for round in 0..2 {
            let connects = (0..100)
                .map(|i| app.json("PUT", format!("/v1/agents/{agent}/mcps/mcp-{i}"), &u, None));
            for (status, body) in join_all(connects).await {
                assert_eq!(status, StatusCode::OK, "{strategy:?} round {round}: {body}");
            }
            let (_, a) = app
                .json("GET", format!("/v1/agents/{agent}"), &u, None)
                .await;
            let mcps = ids(&a, "mcp_ids");
            assert_eq!(mcps.len(), 100, "{strategy:?} round {round}");
            assert_eq!(mcps.iter().collect::<HashSet<_>>().len(), 100, "none twice");
        }
        // Toolsets live beside MCPs under the same lock, without mixing.
        let toolsets = (0..20).map(|i| {
            app.json(
                "PUT",
                format!("/v1/agents/{agent}/toolsets/ts-{i}"),
                &u,
                None,
            )
        });
        join_all(toolsets).await;
        let disconnects = (0..50).map(|i| {
            app.json(
                "DELETE",
                format!("/v1/agents/{agent}/mcps/mcp-{i}"),
                &u,
                None,
            )
        });
        join_all(disconnects).await;
        let (_, a) = app
            .json("GET", format!("/v1/agents/{agent}"), &u, None)
            .await;
        assert_eq!(ids(&a, "toolset_ids").len(), 20);
        let left: HashSet<_> = ids(&a, "mcp_ids").into_iter().collect();
        assert_eq!(
            left,
            (50..100)
                .map(|i| format!("mcp-{i}"))
                .collect::<HashSet<_>>()
        );
        // 200 connects + 20 toolsets + 50 disconnects, each in a transaction of
        // its own (counted by lock level) or, in queue mode, in a group commit.
        let attempts = app
            .metric("filedock_txn_attempts_total", "op=\"agent_config\"")
            .await;
        let grouped = app.metric("filedock_queue_grouped_total", "").await;
        assert!(attempts + grouped >= 270.0, "{attempts} + {grouped}");
        if app.settings.coordination == Coordination::Lock {
            let waits = app
                .metric("filedock_lock_wait_seconds_count", "level=\"agent_config\"")
                .await;
            assert!(waits >= 270.0, "{waits}");
        }
    }
}

#[tokio::test]
async fn a_hundred_concurrent_attaches_to_one_session_are_all_kept_once() {
    for strategy in STRATEGIES {
        let app = app_with(strategy).await;
        let u = app.create_user("u").await;
        let session = app.new_session(&u).await;
        let agent = app.new_agent(&u).await;
        let mut files = Vec::new();
        for i in 0..100 {
            files.push(app.new_file(&u, i).await);
        }
        let attaches = files.iter().map(|f| {
            app.json(
                "POST",
                format!("/v1/sessions/{session}/files"),
                &u,
                Some(json!({"file_id": f})),
            )
        });
        for (status, body) in join_all(attaches).await {
            assert_eq!(status, StatusCode::OK, "{strategy:?}: {body}");
        }
        let agent_attaches = files[..30].iter().map(|f| {
            app.json(
                "POST",
                format!("/v1/agents/{agent}/files"),
                &u,
                Some(json!({"file_id": f})),
            )
        });
        join_all(agent_attaches).await;
        let (_, s) = app
            .json("GET", format!("/v1/sessions/{session}"), &u, None)
            .await;
        let attached = ids(&s, "file_ids");
        assert_eq!(attached.len(), 100, "{strategy:?}");
        assert_eq!(
            attached.iter().collect::<HashSet<_>>(),
            files.iter().collect::<HashSet<_>>()
        );
        let (_, a) = app
            .json("GET", format!("/v1/agents/{agent}"), &u, None)
            .await;
        assert_eq!(ids(&a, "file_ids").len(), 30);
        // Detach one; attach again is idempotent.
        let (_, s) = app
            .json(
                "DELETE",
                format!("/v1/sessions/{session}/files/{}", files[0]),
                &u,
                None,
            )
            .await;
        assert_eq!(ids(&s, "file_ids").len(), 99);
        let f = json!({"file_id": files[1]});
        let (_, s) = app
            .json("POST", format!("/v1/sessions/{session}/files"), &u, Some(f))
            .await;
        assert_eq!(ids(&s, "file_ids").len(), 99);
    }
}

#[tokio::test]
async fn deleting_a_file_while_it_is_being_attached_never_leaves_a_dangling_id() {
    let app = spawn_app().await;
    let u = app.create_user("u").await;
    let session = app.new_session(&u).await;
    let agent = app.new_agent(&u).await;
    // Both orders, one after the other: an attach that lands first is undone
    // by the delete; one that comes after finds no file.
    let attach_to = |file: &str| {
        [
            format!("/v1/sessions/{session}/files"),
            format!("/v1/agents/{agent}/files"),
        ]
        .map(|path| (path, json!({ "file_id": file })))
    };
    let first = app.new_file(&u, 100).await;
    for (path, body) in attach_to(&first) {
        assert_eq!(
            app.json("POST", path, &u, Some(body)).await.0,
            StatusCode::OK
        );
    }
    let (status, _) = app
        .json("DELETE", format!("/v1/files/{first}"), &u, None)
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (_, s) = app
        .json("GET", format!("/v1/sessions/{session}"), &u, None)
        .await;
    let (_, a) = app
        .json("GET", format!("/v1/agents/{agent}"), &u, None)
        .await;
    assert!(
        ids(&s, "file_ids").is_empty() && ids(&a, "file_ids").is_empty(),
        "the delete left the attached file in {s} / {a}"
    );
    for (path, body) in attach_to(&first) {
        let (status, body) = app.json("POST", path, &u, Some(body)).await;
        assert_eq!(
            status,
            StatusCode::BAD_REQUEST,
            "an attach after the delete: {body}"
        );
    }
    // Then racing.
    let mut deleted = 0;
    let mut landed = 0;
    for round in 0..10 {
        let file = app.new_file(&u, round).await;
        let attach_s = app.json(
            "POST",
            format!("/v1/sessions/{session}/files"),
            &u,
            Some(json!({"file_id": file})),
        );
        let attach_a = app.json(
            "POST",
            format!("/v1/agents/{agent}/files"),
            &u,
            Some(json!({"file_id": file})),
        );
        let delete = app
            .client
            .delete(app.url(&format!("/v1/files/{file}")))
            .bearer_auth(&u.key)
            .send();
        let (s, a, d) = tokio::join!(attach_s, attach_a, delete);
        assert_eq!(d.unwrap().status(), StatusCode::NO_CONTENT);
        deleted += 1;
        // An attach either landed before the delete (and was undone by it) or found no file.
        for (status, _) in [s, a] {
            assert!(
                status == StatusCode::OK || status == StatusCode::BAD_REQUEST,
                "round {round}: {status}"
            );
            landed += usize::from(status == StatusCode::OK);
        }
    }
    eprintln!("racing a delete: {landed} of 20 attaches landed first, the rest found no file");
    let (_, s) = app
        .json("GET", format!("/v1/sessions/{session}"), &u, None)
        .await;
    let (_, a) = app
        .json("GET", format!("/v1/agents/{agent}"), &u, None)
        .await;
    assert_eq!(deleted, 10);
    assert!(
        ids(&s, "file_ids").is_empty(),
        "session references a deleted file: {s}"
    );
    assert!(
        ids(&a, "file_ids").is_empty(),
        "agent references a deleted file: {a}"
    );
}

/// A file's delete and rename write the owner's record (their events'
/// numbers), as every change to their sessions does: racing a burst of such
/// changes (in queue mode, applied by the queue's workers, which take no
/// commit lock) they take turns with them, and none is answered
/// `409 write_conflict` (CI saw a delete racing two attaches answered so).
#[tokio::test]
async fn deletes_and_renames_racing_a_burst_of_changes_to_the_owner_s_sessions_all_succeed() {
    const SESSIONS: usize = 8;
    const ROUNDS: usize = 6;
    let app = spawn_app().await;
    let u = app.create_user("u").await;
    let mut sessions = Vec::new();
    let mut kept = Vec::new();
    for i in 0..SESSIONS {
        sessions.push(app.new_session(&u).await);
        kept.push(app.new_file(&u, i).await);
    }
    let renamed = app.new_file(&u, SESSIONS).await;
    let mut refused = Vec::new();
    for round in 0..ROUNDS {
        let doomed = app.new_file(&u, 100 + round).await;
        // Each change changes something (attached in even rounds, detached
        // in odd ones), so each writes an event.
        let changes = sessions.iter().zip(&kept).map(|(s, f)| {
            if round % 2 == 0 {
                app.json(
                    "POST",
                    format!("/v1/sessions/{s}/files"),
                    &u,
                    Some(json!({"file_id": f})),
                )
            } else {
                app.json("DELETE", format!("/v1/sessions/{s}/files/{f}"), &u, None)
            }
        });
        // The file being deleted, attached everywhere at once: each attach
        // lands before the delete (which detaches it) or finds no file.
        let attaches = sessions.iter().map(|s| {
            app.json(
                "POST",
                format!("/v1/sessions/{s}/files"),
                &u,
                Some(json!({"file_id": doomed})),
            )
        });
        let delete = app.json("DELETE", format!("/v1/files/{doomed}"), &u, None);
        let rename = app.json(
            "PATCH",
            format!("/v1/files/{renamed}"),
            &u,
            Some(json!({"name": format!("round-{round}.txt")})),
        );
        let (changed, attached, (deleted, _), (renamed_status, body)) =
            tokio::join!(join_all(changes), join_all(attaches), delete, rename);
        for (status, body) in attached {
            if status != StatusCode::OK && status != StatusCode::BAD_REQUEST {
                refused.push(format!("round {round}: an attach answered {status} {body}"));
            }
        }
        for (status, body) in changed {
            if status != StatusCode::OK {
                refused.push(format!("round {round}: a change answered {status} {body}"));
            }
        }
        if deleted != StatusCode::NO_CONTENT {
            refused.push(format!("round {round}: the delete answered {deleted}"));
        }
        if renamed_status != StatusCode::OK {
            refused.push(format!(
                "round {round}: the rename answered {renamed_status} {body}"
            ));
        }
    }
    assert!(refused.is_empty(), "{refused:#?}");
    // One instance: its writes of the user's record take turns, so none
    // conflicts with another (a conflict is retried, but only three times).
    let conflicts = app.metric("filedock_txn_write_conflicts_total", "").await;
    assert_eq!(
        conflicts, 0.0,
        "transactions retried after a write conflict"
    );
    for s in &sessions {
        let (_, session) = app.json("GET", format!("/v1/sessions/{s}"), &u, None).await;
        let left: HashSet<_> = ids(&session, "file_ids").into_iter().collect();
        assert!(
            left.iter().all(|f| kept.contains(f)),
            "a session names a deleted file: {session}"
        );
    }
    let (_, file) = app
        .json("GET", format!("/v1/files/{renamed}"), &u, None)
        .await;
    assert_eq!(
        file["filename"],
        format!("round-{}.txt", ROUNDS - 1),
        "{file}"
    );
}

#[tokio::test]
async fn deleting_a_file_detaches_it_everywhere() {
    let app = spawn_app().await;
    let u = app.create_user("u").await;
    let (s1, s2, agent) = (
        app.new_session(&u).await,
        app.new_session(&u).await,
        app.new_agent(&u).await,
    );
    let (keep, gone) = (app.new_file(&u, 1).await, app.new_file(&u, 2).await);
    for f in [&keep, &gone] {
        for path in [
            format!("/v1/sessions/{s1}/files"),
            format!("/v1/sessions/{s2}/files"),
            format!("/v1/agents/{agent}/files"),
        ] {
            let (status, _) = app
                .json("POST", path.clone(), &u, Some(json!({"file_id": f})))
                .await;
            assert_eq!(status, StatusCode::OK);
        }
    }
    let res = app
        .client
        .delete(app.url(&format!("/v1/files/{gone}")))
        .bearer_auth(&u.key)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    for path in [
        format!("/v1/sessions/{s1}"),
        format!("/v1/sessions/{s2}"),
        format!("/v1/agents/{agent}"),
    ] {
        let (_, v) = app.json("GET", path.clone(), &u, None).await;
        assert_eq!(ids(&v, "file_ids"), vec![keep.clone()], "{path}");
    }
}

#[tokio::test]
async fn sessions_agents_and_their_files_belong_to_their_owner() {
    let app = spawn_app().await;
    let (alice, bob) = (app.create_user("alice").await, app.create_user("bob").await);
    let (session, agent) = (app.new_session(&alice).await, app.new_agent(&alice).await);
    let alice_file = app.new_file(&alice, 1).await;
    let bob_file = app.new_file(&bob, 2).await;
    let f = |id: &str| Some(json!({"file_id": id}));
    let cases = [
        ("GET", format!("/v1/sessions/{session}"), None),
        ("GET", format!("/v1/agents/{agent}"), None),
        (
            "POST",
            format!("/v1/sessions/{session}/files"),
            f(&bob_file),
        ),
        ("PUT", format!("/v1/agents/{agent}/mcps/evil"), None),
        ("DELETE", format!("/v1/agents/{agent}/toolsets/x"), None),
    ];
    for (method, path, body) in cases {
        let (status, v) = app.json(method, path.clone(), &bob, body).await;
        assert_eq!(
            (status, v["error"]["code"].as_str()),
            (StatusCode::NOT_FOUND, Some("not_found")),
            "{method} {path}"
        );
    }
    // A file that is not the caller's is a bad reference, whether it exists or not.
    for other in [
        bob_file.as_str(),
        "not-an-id",
        "01a22a8f-0000-7000-8000-000000000000",
    ] {
        let path = format!("/v1/sessions/{session}/files");
        let (status, v) = app.json("POST", path, &alice, f(other)).await;
        let got = (status, v["error"]["code"].as_str());
        assert_eq!(
            got,
            (StatusCode::BAD_REQUEST, Some("invalid_request")),
            "{other}"
        );
    }
    let (status, v) = app
        .json(
            "PUT",
            format!("/v1/agents/{agent}/mcps/bad%20id"),
            &alice,
            None,
        )
        .await;
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (StatusCode::BAD_REQUEST, Some("invalid_request"))
    );
    let (status, v) = app
        .json(
            "POST",
            format!("/v1/sessions/{session}/files"),
            &alice,
            f(&alice_file),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(ids(&v, "file_ids"), vec![alice_file]);
}
