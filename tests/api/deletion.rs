//! Deleting a session or an agent (issue 25): its links (and an agent's
//! connections) go, its files stay the user's and lose their reference to
//! it; an attach racing the delete lands before it or finds it gone.

use std::time::Duration;

use futures::future::join_all;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::*;

impl TestApp {
    /// The `sessions` and `agents` a file's record names, as stored.
    async fn back_references(&self, user: &TestUser, file: &str) -> (Vec<String>, Vec<String>) {
        let stored = self
            .state
            .ports
            .meta
            .file(&user.user_id(), &file.parse().unwrap())
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("file {file} is gone"));
        let sessions = stored.sessions.iter().map(ToString::to_string);
        let agents = stored.agents.iter().map(ToString::to_string);
        (sessions.collect(), agents.collect())
    }
}

fn ids(v: &Value) -> Vec<String> {
    serde_json::from_value(v["file_ids"].clone()).unwrap()
}

#[tokio::test]
async fn deleting_a_session_or_an_agent_drops_its_links_and_keeps_its_files() {
    let app = spawn_app().await;
    let ann = app.create_user("ann").await;
    let (session, agent) = (app.new_session(&ann).await, app.new_agent(&ann).await);
    let kept = app.new_session(&ann).await;
    let file = app.new_file(&ann, 1).await;
    for path in [
        format!("/v1/sessions/{session}/files"),
        format!("/v1/sessions/{kept}/files"),
        format!("/v1/agents/{agent}/files"),
    ] {
        let (status, body) = app
            .json("POST", path, &ann, Some(json!({"file_id": file})))
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    for link in ["mcps/search", "toolsets/web"] {
        let path = format!("/v1/agents/{agent}/{link}");
        assert_eq!(app.json("PUT", path, &ann, None).await.0, StatusCode::OK);
    }

    // Another user's delete finds nothing and changes nothing.
    let bob = app.create_user("bob").await;
    for path in [
        format!("/v1/sessions/{session}"),
        format!("/v1/agents/{agent}"),
    ] {
        let (status, _) = app.json("DELETE", path.clone(), &bob, None).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert_eq!(app.json("GET", path, &ann, None).await.0, StatusCode::OK);
    }
    let not_an_id = app.json("DELETE", "/v1/sessions/nope", &ann, None).await;
    assert_eq!(not_an_id.0, StatusCode::NOT_FOUND, "{}", not_an_id.1);

    let audited = || app.metric("filedock_audit_events_total", "action=\"session_deleted\"");
    let before = audited().await;
    for path in [
        format!("/v1/sessions/{session}"),
        format!("/v1/agents/{agent}"),
    ] {
        let (status, _) = app.json("DELETE", path.clone(), &ann, None).await;
        assert_eq!(status, StatusCode::NO_CONTENT, "{path}");
        let gone = app.json("GET", path.clone(), &ann, None).await.0;
        assert_eq!(gone, StatusCode::NOT_FOUND, "{path}");
        let again = app.json("DELETE", path, &ann, None).await.0;
        assert_eq!(again, StatusCode::NOT_FOUND, "deleted once");
    }
    assert_eq!(audited().await, before + 1.0);
    // Attaching to (or connecting) what is gone: 404, not a bad file.
    for (method, path, body) in [
        (
            "POST",
            format!("/v1/sessions/{session}/files"),
            Some(json!({"file_id": file})),
        ),
        (
            "POST",
            format!("/v1/agents/{agent}/files"),
            Some(json!({"file_id": file})),
        ),
        ("PUT", format!("/v1/agents/{agent}/mcps/search"), None),
    ] {
        let (status, body) = app.json(method, path, &ann, body).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    }

    // The file stays, named by the session left only.
    assert_eq!(app.download(&ann, &file).await.status(), StatusCode::OK);
    let (_, left) = app
        .json("GET", format!("/v1/sessions/{kept}"), &ann, None)
        .await;
    assert_eq!(ids(&left), std::slice::from_ref(&file));
    let (sessions, agents) = app.back_references(&ann, &file).await;
    assert_eq!(sessions, std::slice::from_ref(&kept));
    assert!(agents.is_empty(), "{agents:?}");
    // Deleting the file later detaches it from the session left.
    let (status, _) = app
        .json("DELETE", format!("/v1/files/{file}"), &ann, None)
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (_, left) = app
        .json("GET", format!("/v1/sessions/{kept}"), &ann, None)
        .await;
    assert!(ids(&left).is_empty(), "{left}");
    // The lists no longer show them.
    let (_, sessions) = app.json("GET", "/v1/sessions", &ann, None).await;
    assert_eq!(sessions["sessions"].as_array().unwrap().len(), 1);
    let (_, agents) = app.json("GET", "/v1/agents", &ann, None).await;
    assert_eq!(agents["agents"], json!([]));
}

#[tokio::test]
async fn a_token_deletes_only_with_the_write_scope_and_its_own_session() {
    let app = spawn_app().await;
    let ann = app.create_user("ann").await;
    let (mine, other) = (app.new_session(&ann).await, app.new_session(&ann).await);
    let mint = |scopes: Value| {
        let body = json!({"scopes": scopes, "expires_in": 600, "session_id": mine});
        app.json("POST", "/v1/tokens", &ann, Some(body))
    };
    let token = |v: Value| TestUser {
        id: ann.id.clone(),
        key: v["token"].as_str().unwrap().to_owned(),
    };
    let reader = token(mint(json!(["sessions:read"])).await.1);
    let writer = token(mint(json!(["sessions:write"])).await.1);
    let delete = |s: &str| format!("/v1/sessions/{s}");
    let status = app.json("DELETE", delete(&mine), &reader, None).await.0;
    assert_eq!(status, StatusCode::FORBIDDEN, "no write scope");
    let status = app.json("DELETE", delete(&other), &writer, None).await.0;
    assert_eq!(status, StatusCode::FORBIDDEN, "another session");
    let status = app.json("DELETE", delete(&mine), &writer, None).await.0;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert_eq!(
        app.json("GET", delete(&other), &ann, None).await.0,
        StatusCode::OK
    );
}

/// Rounds of attaches racing the delete of their session (and agent): each
/// attach answers 200 (it landed before the delete, which took it away),
/// 204 (it landed, and the delete came before it read the container back:
/// README "Sessions and agents") or 404 (it found the container gone), and
/// afterwards no file names a session or an agent that is gone.
#[tokio::test]
async fn attaches_racing_a_delete_leave_no_file_naming_what_is_gone() {
    const ROUNDS: usize = 12;
    const FILES: usize = 12;
    let app = spawn_app().await;
    let ann = app.create_user("ann").await;
    let mut files = Vec::new();
    for i in 0..FILES {
        files.push(app.new_file(&ann, i).await);
    }
    let (mut landed, mut found_gone) = (0, 0);
    // How far apart the attaches go out (ms): widened after a round none
    // of whose attaches landed first (a loaded machine, where an attach's
    // reads before it applies outlast the spacing), narrowed after one
    // none of whose found the container gone.
    let mut step = 1_u64;
    for round in 0..ROUNDS {
        let container = match round % 2 {
            0 => format!("/v1/sessions/{}", app.new_session(&ann).await),
            _ => format!("/v1/agents/{}", app.new_agent(&ann).await),
        };
        // The attaches go out `step` ms apart; the delete halfway through.
        let (app, ann) = (&app, &ann);
        let attach = |(i, f): (usize, &String)| {
            let body = Some(json!({"file_id": f}));
            let path = format!("{container}/files");
            async move {
                tokio::time::sleep(Duration::from_millis(i as u64 * step)).await;
                app.json("POST", path, ann, body).await
            }
        };
        let delete = async {
            tokio::time::sleep(Duration::from_millis(FILES as u64 / 2 * step)).await;
            app.json("DELETE", container.clone(), ann, None).await
        };
        let (answers, (deleted, body)) =
            tokio::join!(join_all(files.iter().enumerate().map(attach)), delete);
        assert_eq!(deleted, StatusCode::NO_CONTENT, "{body}");
        let (mut first, mut gone) = (0, 0);
        for (status, body) in answers {
            match status {
                StatusCode::OK | StatusCode::NO_CONTENT => first += 1,
                StatusCode::NOT_FOUND => gone += 1,
                other => panic!("round {round}: an attach answered {other} {body}"),
            }
        }
        (landed, found_gone) = (landed + first, found_gone + gone);
        if first == 0 {
            step = (step * 2).min(64);
        } else if gone == 0 {
            step = (step / 2).max(1);
        }
        assert_eq!(
            app.json("GET", container.clone(), ann, None).await.0,
            StatusCode::NOT_FOUND
        );
    }
    // No file names a session or an agent: every one was deleted.
    let mut dangling = 0;
    for f in &files {
        let (sessions, agents) = app.back_references(&ann, f).await;
        dangling += sessions.len() + agents.len();
    }
    eprintln!(
        "{} attaches racing {ROUNDS} deletes: {landed} answered 200 (landed first), {found_gone} answered 404; {dangling} references left; attaches {step} ms apart at the end",
        ROUNDS * FILES
    );
    assert_eq!(landed + found_gone, ROUNDS * FILES);
    assert!(
        landed > 0 && found_gone > 0,
        "the attaches did not race the deletes"
    );
    assert_eq!(dangling, 0, "files name deleted sessions or agents");
    // The files are all still the user's.
    assert_eq!(app.list_ids(&ann).await.len(), FILES);
}
