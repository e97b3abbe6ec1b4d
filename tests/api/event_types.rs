//! Events of sessions, agents and keys: a creation, a deletion, a file
//! attached or detached, an MCP server or toolset connected or
//! disconnected, a key minted or revoked each writes one event in its own
//! transaction, numbered with the owner's file events (one sequence per
//! owner, no gap); a write that changes nothing (a file attached twice)
//! writes none. Run in lock and in queue mode (scripts/test.sh), so grouped
//! writes are covered too.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use futures::future::join_all;
use reqwest::StatusCode;
use serde_json::{Value, json};

use filedock::domain::sweeper::Outcome;

use crate::{
    events::all_events,
    faults::{mongo_addr, through_mongo_proxy},
    helpers::*,
    keys::admin_key_for,
    support::fault_proxy::FaultProxy,
    tus,
    tus_reserve::expire_and_sweep,
};

/// `method path` as `user`, answered with a 2xx.
async fn call(app: &TestApp, user: &TestUser, method: &str, path: String, body: Option<Value>) {
    let (status, answer) = app.json(method, path.clone(), user, body).await;
    assert!(status.is_success(), "{method} {path}: {status} {answer}");
}

async fn create(app: &TestApp, user: &TestUser, path: &str, body: Option<Value>) -> String {
    let (status, made) = app.json("POST", path, user, body).await;
    assert_eq!(status, StatusCode::CREATED, "{made}");
    made["id"].as_str().unwrap().to_owned()
}

/// Each event as `type subject data-field=value…` (the data's fields in
/// name order), to compare whole.
fn shown(e: &Value) -> String {
    let data = e["data"].as_object().unwrap();
    let fields: BTreeMap<&String, String> = data
        .iter()
        .map(|(k, v)| (k, v.as_str().map_or(v.to_string(), str::to_owned)))
        .collect();
    let fields: Vec<String> = fields.iter().map(|(k, v)| format!("{k}={v}")).collect();
    format!(
        "{} {} {}",
        e["type"].as_str().unwrap(),
        e["subject"].as_str().unwrap(),
        fields.join(" ")
    )
}

#[tokio::test]
async fn each_change_to_a_session_or_agent_writes_one_event_and_a_change_of_nothing_none() {
    let app = spawn_app().await;
    let ann = app.create_user("ann").await;
    let s = create(&app, &ann, "/v1/sessions", None).await;
    let a = create(&app, &ann, "/v1/agents", Some(json!({"name": "helper"}))).await;
    let f = app.upload_json(&ann, "notes.txt", b"notes".to_vec()).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let file = Some(json!({"file_id": f}));
    let writes = [
        ("POST", format!("/v1/sessions/{s}/files"), file.clone()),
        // Already there: changes nothing, writes no event.
        ("POST", format!("/v1/sessions/{s}/files"), file.clone()),
        ("POST", format!("/v1/agents/{a}/files"), file.clone()),
        ("PUT", format!("/v1/agents/{a}/mcps/github"), None),
        ("PUT", format!("/v1/agents/{a}/mcps/github"), None),
        ("PUT", format!("/v1/agents/{a}/toolsets/search"), None),
        ("DELETE", format!("/v1/agents/{a}/mcps/github"), None),
        ("DELETE", format!("/v1/agents/{a}/mcps/github"), None),
        ("DELETE", format!("/v1/agents/{a}/toolsets/search"), None),
        ("DELETE", format!("/v1/sessions/{s}/files/{f}"), None),
        ("DELETE", format!("/v1/sessions/{s}/files/{f}"), None),
        ("DELETE", format!("/v1/agents/{a}"), None),
        ("DELETE", format!("/v1/sessions/{s}"), None),
    ];
    for (method, path, body) in writes {
        call(&app, &ann, method, path, body).await;
    }
    let events = all_events(&app, &ann, 100).await;
    let seqs: Vec<i64> = events.iter().map(|e| e["seq"].as_i64().unwrap()).collect();
    assert_eq!(seqs, (1..=seqs.len() as i64).collect::<Vec<_>>(), "no gap");
    assert!(events.iter().all(|e| e["owner_id"] == ann.id.as_str()));
    let got: Vec<String> = events.iter().map(shown).collect();
    let created = "file.created".to_owned();
    assert_eq!(
        got.iter()
            .filter(|e| !e.starts_with(&created))
            .cloned()
            .collect::<Vec<_>>(),
        [
            format!("session.created {s} session_id={s}"),
            format!("agent.created {a} agent_id={a} name=helper"),
            format!("session.file_attached {s} file_id={f} session_id={s}"),
            format!("agent.file_attached {a} agent_id={a} file_id={f}"),
            format!("agent.mcp_connected {a} agent_id={a} mcp_id=github"),
            format!("agent.toolset_connected {a} agent_id={a} toolset_id=search"),
            format!("agent.mcp_disconnected {a} agent_id={a} mcp_id=github"),
            format!("agent.toolset_disconnected {a} agent_id={a} toolset_id=search"),
            format!("session.file_detached {s} file_id={f} session_id={s}"),
            format!("agent.deleted {a} agent_id={a}"),
            format!("session.deleted {s} session_id={s}"),
        ],
        "{got:#?}"
    );
    assert!(got[2].starts_with(&created), "{got:#?}");
}

/// One user's writes to twenty containers at once (each under its own
/// lock, or in its own queue bucket) all write the same user's event
/// counter, as twenty uploads of the user's meanwhile do: every one
/// succeeds, with one event each and no gap. On the real servers, through
/// two instances at once (half the writes each).
#[tokio::test]
async fn writes_to_many_containers_of_one_user_at_once_all_succeed_with_one_event_each() {
    const UPLOADS: usize = 20;
    let app = spawn_app().await;
    let other = match real_backends() {
        true => Some(spawn_app_with(app.settings.clone()).await),
        false => None,
    };
    let ann = app.create_user("ann").await;
    let mut sessions = Vec::new();
    let mut agents = Vec::new();
    for _ in 0..10 {
        sessions.push(create(&app, &ann, "/v1/sessions", None).await);
        agents.push(create(&app, &ann, "/v1/agents", Some(json!({"name": "a"}))).await);
    }
    let mut files = Vec::new();
    for i in 0..3 {
        let up = app.upload_json(&ann, "f.txt", format!("file {i}").into_bytes());
        files.push(up.await["id"].as_str().unwrap().to_owned());
    }
    let mut writes = Vec::new();
    for f in &files {
        let body = Some(json!({"file_id": f}));
        for s in &sessions {
            writes.push(("POST", format!("/v1/sessions/{s}/files"), body.clone()));
        }
        for a in &agents {
            writes.push(("POST", format!("/v1/agents/{a}/files"), body.clone()));
        }
    }
    for a in &agents {
        for m in 0..5 {
            writes.push(("PUT", format!("/v1/agents/{a}/mcps/m{m}"), None));
        }
    }
    let sent = writes.len();
    let via = |i: usize| match &other {
        Some(other) if i % 2 == 1 => other,
        _ => &app,
    };
    let changes = writes
        .into_iter()
        .enumerate()
        .map(|(i, (method, path, body))| via(i).json(method, path, &ann, body));
    // Uploads of the same user meanwhile: their commits write the same
    // user document.
    let uploads = (0..UPLOADS).map(|i| via(i).upload_raw(&ann, "u.txt", format!("up {i}").into()));
    let (answers, uploaded) = futures::future::join(join_all(changes), join_all(uploads)).await;
    for (status, body) in &answers {
        assert_eq!(*status, StatusCode::OK, "{body}");
    }
    for res in uploaded {
        let status = res.status();
        assert_eq!(status, StatusCode::CREATED, "{}", res.text().await.unwrap());
    }
    let events = all_events(&app, &ann, 1000).await;
    let seqs: Vec<i64> = events.iter().map(|e| e["seq"].as_i64().unwrap()).collect();
    assert_eq!(seqs, (1..=seqs.len() as i64).collect::<Vec<_>>(), "no gap");
    let mut by_type: BTreeMap<&str, usize> = BTreeMap::new();
    for e in &events {
        *by_type.entry(e["type"].as_str().unwrap()).or_default() += 1;
    }
    let expected = BTreeMap::from([
        ("agent.created", 10),
        ("agent.file_attached", 30),
        ("agent.mcp_connected", 50),
        ("file.created", 3 + UPLOADS),
        ("session.created", 10),
        ("session.file_attached", 30),
    ]);
    assert_eq!(by_type, expected, "{sent} writes");
}

#[tokio::test]
async fn a_key_minted_and_revoked_writes_its_events_without_its_secret() {
    let app = spawn_app().await;
    let ann = app.create_user("ann").await;
    let laptop = admin_key_for(&app, &ann, "laptop").await;
    let (status, phone) = app
        .json("POST", "/v1/me/keys", &ann, Some(json!({"name": "phone"})))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{phone}");
    let (l, p) = (
        laptop["id"].as_str().unwrap(),
        phone["id"].as_str().unwrap(),
    );
    call(&app, &ann, "DELETE", format!("/v1/me/keys/{l}"), None).await;
    // Gone already: 404, and no second event.
    let (status, _) = app
        .json("DELETE", format!("/v1/me/keys/{l}"), &ann, None)
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let events = all_events(&app, &ann, 100).await;
    let got: Vec<String> = events.iter().map(shown).collect();
    assert_eq!(
        got,
        [
            format!("key.created {l} key_id={l} name=laptop"),
            format!("key.created {p} key_id={p} name=phone"),
            format!("key.revoked {l} key_id={l} name=laptop"),
        ]
    );
    let text = serde_json::to_string(&events).unwrap();
    for secret in [&laptop["api_key"], &phone["api_key"]] {
        assert!(
            !text.contains(secret.as_str().unwrap()),
            "a secret in {text}"
        );
    }
}

/// A change that applied is answered as applied even when its container is
/// deleted before the answer reads it back: `204` (there is nothing left
/// to show), never `404`, and its event is there. (It was `404`: the fault
/// suite's events checker found a disconnect answered so, yet written.)
#[tokio::test]
async fn a_change_whose_container_is_deleted_before_its_read_back_is_answered_applied() {
    if !real_backends() {
        eprintln!("needs the real servers: runs in the real-servers pass of scripts/test.sh");
        return;
    }
    // BSON of `"find": "agents"`: the check before the change is the first,
    // the read-back after it the second.
    const FIND_AGENTS: &[u8] = b"\x02find\x00\x07\x00\x00\x00agents\x00";
    let proxy = FaultProxy::start(mongo_addr()).await;
    let mut proxied = through_mongo_proxy(&proxy, "&serverSelectionTimeoutMS=15000");
    // Lock mode whatever the run's: a queued delete could wait on the cut
    // link's instance, and the read-back would come first.
    proxied.coordination = filedock::config::Coordination::Lock;
    let app = spawn_app_with(proxied.clone()).await;
    let mut direct = proxied;
    direct.mongodb_uri = Some(std::env::var("FILEDOCK_TEST_MONGODB_URI").unwrap().into());
    let other = spawn_app_with(direct).await;
    let u = app.create_user("racer").await;
    let agent = create(&app, &u, "/v1/agents", Some(json!({"name": "a"}))).await;
    // The read-back's answer is lost and the link stays down while the
    // other instance deletes the agent; the driver then reads again.
    proxy.cut_after_nth(FIND_AGENTS, 1, Duration::from_secs(2));
    let connect = {
        let (client, key) = (app.client.clone(), u.key.clone());
        let url = app.url(&format!("/v1/agents/{agent}/mcps/github"));
        tokio::spawn(async move {
            let res = client.put(url).bearer_auth(key).send().await.unwrap();
            (res.status(), res.text().await.unwrap())
        })
    };
    let began = Instant::now();
    while !proxy.triggered() {
        assert!(began.elapsed() < Duration::from_secs(10), "no read-back");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (status, body) = other
        .json("DELETE", format!("/v1/agents/{agent}"), &u, None)
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{body}");
    let (status, body) = connect.await.unwrap();
    assert_eq!(
        status,
        StatusCode::NO_CONTENT,
        "the connect applied: {body}"
    );
    let events = all_events(&other, &u, 100).await;
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        ["agent.created", "agent.mcp_connected", "agent.deleted"]
    );
}

/// A resumable upload that expires writes `upload.expired` when the
/// sweeper claims it, once (not again when put back after a failed clean-up
/// and claimed anew); one whose file committed writes its `file.created`
/// and nothing when its lingering state goes.
#[tokio::test]
async fn an_upload_that_expires_writes_upload_expired_once_and_a_committed_one_none() {
    let app = spawn_app().await;
    let ann = app.create_user("ann").await;
    let lapsed = tus::create(&app, &ann, 10).await;
    let res = tus::patch(&app, &ann, &lapsed, 0, &tus::data(4)).await;
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    let done = tus::create(&app, &ann, 3).await;
    let res = tus::patch(&app, &ann, &done, 0, &tus::data(3)).await;
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    let meta = &app.state.ports.meta;
    let mut claimed = meta
        .resumable_by_id_alone(&lapsed.parse().unwrap())
        .await
        .unwrap()
        .unwrap();
    let report = expire_and_sweep(&app, &lapsed).await;
    assert_eq!(report.resumables_expired, 1, "{report:?}");
    expire_and_sweep(&app, &done).await;
    // Put back as the sweeper does when a claimed upload's clean-up fails,
    // and claimed again: its expiry was told already.
    claimed.expires_at = filedock::meta::now() - chrono::Duration::seconds(1);
    meta.restore_resumable(&claimed).await.unwrap();
    let again = app.state.sweeper.try_run_once().await.unwrap();
    assert!(matches!(again, Outcome::Swept(_)));
    assert!(
        meta.resumable(&claimed.user_id, &claimed.id)
            .await
            .unwrap()
            .is_none(),
        "claimed again"
    );
    let events = all_events(&app, &ann, 100).await;
    let got: Vec<String> = events.iter().map(shown).collect();
    assert_eq!(got.len(), 2, "{got:#?}");
    assert!(
        got[0].starts_with(&format!("file.created {done} ")),
        "{got:#?}"
    );
    assert_eq!(
        got[1],
        format!("upload.expired {lapsed} filename=big.bin length=10 offset=4 upload_id={lapsed}")
    );
}
