//! Reads everything back after healing and the final sweep: through the
//! direct backends (files, user documents, containers, permissions,
//! idempotency records, objects, intents) and through the API (downloads,
//! `GET /v1/files`, `/v1/me`, `GET /v1/events`, and the files that should
//! be gone).

use std::collections::{BTreeMap, BTreeSet};

use filedock::{http::AppState, vocab::UserId};
use mongodb::bson::{Document, doc};
use reqwest::StatusCode;
use serde_json::Value;
use sha2::Digest;

use crate::{
    helpers::bucket_against_metadata,
    support::{
        event_checks::read_events,
        history::{
            Answer, Container, Event, FinalAgent, FinalFile, FinalState, FinalUser, Holder, Op,
        },
        workload::UserWorld,
    },
};

/// Most of anything one user has here.
const ALL: usize = 100_000;

/// Whether the final sweeps have nothing left to wait for: no intent, no
/// user's deletion pending, and no resumable upload's state. A committed
/// upload's state has no intent and is kept until its expiry (a HEAD
/// still answers it), then swept: a commit that lands after its client
/// gave up (a PATCH's own task, a group commit) leaves one the first final
/// pass does not see expired. A store that cannot answer is not settled.
pub async fn settled(state: &AppState) -> bool {
    let far = filedock::meta::now() + chrono::Duration::days(3650);
    let meta = &state.ports.meta;
    let intents = meta.intents(far, 10).await.map(|i| i.len());
    let deleting = meta.users_being_deleted(1).await.map(|u| u.len());
    let states = meta.expired_resumables(far, 1).await.map(|s| s.len());
    matches!((intents, deleting, states), (Ok(0), Ok(0), Ok(0)))
}

pub async fn read_final(
    state: &AppState,
    base: &str,
    users: &[UserWorld],
    history: &[Event],
) -> FinalState {
    let client = reqwest::Client::new();
    let mut fin = FinalState::default();
    for (u, user) in users.iter().enumerate() {
        fin.users
            .push(read_user(state, &client, base, user, u, history).await);
    }
    let db = mongodb::Client::with_uri_str(std::env::var("FILEDOCK_TEST_MONGODB_URI").unwrap())
        .await
        .unwrap()
        .database(&state.settings.mongodb_db);
    for d in documents(&db, "permissions").await {
        let s = |k: &str| d.get_str(k).unwrap_or_default().to_owned();
        fin.permissions
            .push((s("file_id"), s("user_id"), s("role")));
    }
    for d in documents(&db, "idempotency").await {
        let id = d.get_str("_id").unwrap_or_default();
        let (user, key) = id.split_once(':').unwrap_or((id, ""));
        let file = d
            .get_document("file")
            .ok()
            .and_then(|f| f.get_str("_id").ok())
            .unwrap_or_default();
        fin.idempotency
            .push((user.to_owned(), key.to_owned(), file.to_owned()));
    }
    for d in documents(&db, "orphan_minio_objects").await {
        fin.orphans
            .insert(d.get_str("key").unwrap_or_default().to_owned());
    }
    let (strays, missing, _) = bucket_against_metadata(state).await;
    (fin.strays, fin.missing) = (strays.len(), missing.len());
    let meta = &state.ports.meta;
    let far = filedock::meta::now() + chrono::Duration::days(3650);
    fin.intents = meta.intents(far, ALL).await.unwrap().len();
    // Resumable uploads, after their expiry and a sweep: nothing of them.
    let resumables = documents(&db, "resumable_uploads").await;
    fin.resumables = resumables.len();
    for user in &mut fin.users {
        for d in resumables
            .iter()
            .filter(|d| d.get_str("user_id").ok() == Some(user.id.as_str()))
        {
            user.held.0 += d.get_i64("reserved").unwrap_or_default();
            user.held.1 += i64::from(d.get_bool("open").unwrap_or_default());
        }
    }
    fin.staging = state.ports.blobs.list_keys("tus/").await.unwrap().len();
    let tus: Vec<&str> = history
        .iter()
        .filter(|e| {
            matches!(
                e.op,
                Op::Upload {
                    resumable: true,
                    ..
                }
            )
        })
        .filter_map(|e| e.file_id.as_deref())
        .collect();
    if let Some((with_parts, empty)) = multipart_uploads(&tus) {
        (fin.multipart, fin.multipart_empty) = (Some(with_parts), empty);
    }
    fin
}

/// The multipart uploads s3s-fs keeps on disk for the files `ids` (it has
/// no ListMultipartUploads): a `.upload-{id}.json` per upload, and a
/// metadata file naming the upload's key. `None` without its data
/// directory (`FILEDOCK_TEST_S3_DIR`, which scripts/stack.sh sets). Those
/// holding a part (`.upload_id-{id}.part-{n}`) and the empty ones, apart.
pub fn multipart_uploads(ids: &[&str]) -> Option<(usize, usize)> {
    use base64::Engine;
    let dir = std::env::var("FILEDOCK_TEST_S3_DIR").ok()?;
    let names: Vec<String> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| Some(e.ok()?.file_name().to_string_lossy().into_owned()))
        .collect();
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let open = names.iter().filter_map(|n| {
        let id = n.strip_prefix(".upload-")?.strip_suffix(".json")?;
        let meta = names
            .iter()
            .find(|m| m.ends_with(&format!(".upload-{id}.metadata.json")))?;
        let key = meta.split(".object-").nth(1)?.split(".upload-").next()?;
        let key = String::from_utf8(b64.decode(key).ok()?).ok()?;
        let file = key.rsplit('/').next()?;
        ids.contains(&file).then_some(id)
    });
    let (mut with_parts, mut empty) = (0, 0);
    for id in open {
        let part = format!(".upload_id-{id}.part-");
        match names.iter().any(|n| n.starts_with(&part)) {
            true => with_parts += 1,
            false => empty += 1,
        }
    }
    Some((with_parts, empty))
}

pub(super) async fn documents(db: &mongodb::Database, collection: &str) -> Vec<Document> {
    use futures::TryStreamExt;
    db.collection::<Document>(collection)
        .find(doc! {})
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap()
}

async fn get(client: &reqwest::Client, url: String, key: &str) -> reqwest::Response {
    client.get(url).bearer_auth(key).send().await.unwrap()
}

async fn read_user(
    state: &AppState,
    client: &reqwest::Client,
    base: &str,
    user: &UserWorld,
    u: usize,
    history: &[Event],
) -> FinalUser {
    let meta = &state.ports.meta;
    let mut fin = FinalUser {
        id: user.id.clone(),
        ..Default::default()
    };
    let uid = UserId::parse(&user.id).expect("a user id");
    for f in meta.list_files(&uid, None, ALL).await.unwrap() {
        let res = get(
            client,
            format!("{base}/v1/files/{}/content", f.id),
            &user.key,
        )
        .await;
        let downloaded = match res.status() {
            StatusCode::OK => Some(hex::encode(sha2::Sha256::digest(
                res.bytes().await.unwrap(),
            ))),
            _ => None,
        };
        let file = FinalFile {
            name: f.filename,
            size: f.size,
            sha256: f.sha256,
            downloaded,
            sessions: strings(&f.sessions),
            agents: strings(&f.agents),
        };
        fin.files.insert(f.id.to_string(), file);
    }
    fin.listed = listed(client, base, "files", &user.key).await;
    (fin.events, fin.events_off) = read_events(client, base, &user.key).await;
    for kind in [Holder::Session, Holder::Agent] {
        let name = &kind.path()["/v1/".len()..];
        let ids = listed(client, base, name, &user.key).await;
        fin.listed_containers
            .extend(ids.into_iter().map(|id| kind.with(id)));
    }
    let record = meta.user(&uid).await.unwrap().unwrap();
    (fin.used_bytes, fin.file_count) = (record.used_bytes, record.file_count);
    fin.counted = (record.reserved_bytes, record.open_uploads);
    let me: Value = get(client, format!("{base}/v1/me"), &user.key)
        .await
        .json()
        .await
        .unwrap();
    let usage = &me["usage"];
    fin.me = (
        usage["used_bytes"].as_i64().unwrap_or(-1),
        usage["file_count"].as_i64().unwrap_or(-1),
    );
    fin.me_counted = (
        usage["reserved_bytes"].as_i64().unwrap_or(-1),
        usage["open_uploads"].as_i64().unwrap_or(-1),
    );
    for s in meta.list_sessions(&uid, None, ALL).await.unwrap() {
        fin.sessions.insert(s.id.to_string(), strings(&s.file_ids));
    }
    for a in meta.list_agents(&uid, None, ALL).await.unwrap() {
        let agent = FinalAgent {
            files: strings(&a.file_ids),
            mcps: a.mcp_ids.iter().map(|l| l.as_str().to_owned()).collect(),
            toolsets: a
                .toolset_ids
                .iter()
                .map(|l| l.as_str().to_owned())
                .collect(),
        };
        fin.agents.insert(a.id.to_string(), agent);
    }
    let mine = history.iter().filter(|e| e.op.user() == u);
    let containers: BTreeSet<Container> = mine.clone().filter_map(|e| e.op.container()).collect();
    for c in containers {
        let there = match &c {
            Container::Session(id) => fin.sessions.contains_key(id),
            Container::Agent(id) => fin.agents.contains_key(id),
        };
        if !there {
            let status = get(client, format!("{base}{}", c.path()), &user.key).await;
            fin.gone_containers.insert(c, status.status().as_u16());
        }
    }
    let acknowledged: BTreeMap<&str, ()> = history
        .iter()
        .filter(|e| e.op.user() == u && matches!(e.op, Op::Upload { .. }))
        .filter(|e| e.answer == Answer::Ok)
        .filter_map(|e| Some((e.file_id.as_deref()?, ())))
        .collect();
    for id in acknowledged
        .keys()
        .filter(|id| !fin.files.contains_key(**id))
    {
        let meta = get(client, format!("{base}/v1/files/{id}"), &user.key).await;
        let content = get(client, format!("{base}/v1/files/{id}/content"), &user.key).await;
        fin.gone.insert(
            (*id).to_owned(),
            (meta.status().as_u16(), content.status().as_u16()),
        );
    }
    fin
}

/// The ids `GET /v1/{name}` lists, every page.
async fn listed(client: &reqwest::Client, base: &str, name: &str, key: &str) -> Vec<String> {
    let mut ids = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut url = format!("{base}/v1/{name}?limit=1000");
        if let Some(c) = &cursor {
            url.push_str(&format!("&cursor={c}"));
        }
        let page: Value = get(client, url, key).await.json().await.unwrap();
        ids.extend(
            page[name]
                .as_array()
                .unwrap()
                .iter()
                .map(|f| f["id"].as_str().unwrap().to_owned()),
        );
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => return ids,
        }
    }
}

/// Ids as the checker keeps them: their text.
fn strings<T: std::fmt::Display>(ids: &[T]) -> Vec<String> {
    ids.iter().map(ToString::to_string).collect()
}
