//! A lone commit's writes after its user document's (the file, its event,
//! permission and idempotency record, the intent's deletion) go to MongoDB
//! in one `bulkWrite` command where the server takes it (8.0 or later:
//! SecantusDB does), else (`FILEDOCK_MONGODB_BULK_WRITE=false`, as before
//! 8.0) a command per collection, as a group commit's always do (an insert
//! of many documents costs the server less than a bulkWrite of them). Both ways, on the real server,
//! single commits and group commits: what is stored, counted and numbered
//! is the same, and which commands carried it is seen by the store's
//! observer. Real backends only (the embedded store sends no commands).

use std::sync::{Arc, Mutex};

use bson::{Document, doc};
use filedock::{
    http::AppState,
    meta::mongo::{MongoStore, SentCommand},
    ports::Ports,
};
use futures::{TryStreamExt, future::join_all};
use reqwest::StatusCode;
use secrecy::ExposeSecret;

use crate::{
    events::all_events, faults::run_again_after_it_applied, helpers::*, keys::admin,
    support::servers::OwnServer,
};

/// An app on the real stack whose store sends writes in one `bulkWrite`
/// or not (`bulk`), commits one upload at a time or groups them (`group`),
/// and puts every command it sends in `log`.
async fn app_logged(bulk: bool, group: bool, log: &Arc<Mutex<Vec<SentCommand>>>) -> TestApp {
    let mut settings = test_settings();
    settings.upload_group_commit = group;
    let mut ports = Ports::connect(&settings).await.unwrap();
    let uri = settings.mongodb_uri.as_ref().unwrap().expose_secret();
    let commands = ports.metrics.mongo_commands.clone();
    let seen = log.clone();
    let observer = Arc::new(move |c| seen.lock().unwrap().push(c));
    let store = MongoStore::connect_observed(uri, &settings.mongodb_db, commands, observer)
        .await
        .unwrap();
    ports.meta = Arc::new(match bulk {
        true => store,
        false => store.without_bulk_write(),
    });
    spawn_app_with_state(AppState::with_ports(settings, ports).unwrap()).await
}

/// How many commands in `log` are `name` (on `collection`, if given).
fn count(log: &[SentCommand], name: &str, collection: Option<&str>) -> usize {
    log.iter()
        .filter(|c| c.name == name && (collection.is_none() || c.collection() == collection))
        .count()
}

/// Eight uploads of one user at once, two with an idempotency key, then
/// what is stored, counted and numbered; the commands they sent.
async fn uploads(bulk: bool, group: bool) -> Vec<SentCommand> {
    let log = Arc::default();
    let app = app_logged(bulk, group, &log).await;
    let u = app.create_user(&format!("bulk-{bulk}-{group}")).await;
    log.lock().unwrap().clear();
    let sends = (0..8).map(|i| {
        let mut req = app
            .client
            .post(app.url("/v1/files"))
            .query(&[("filename", format!("f{i}.txt"))])
            .bearer_auth(&u.key)
            .body(vec![b'a'; 10 + i]);
        if i < 2 {
            req = req.header("idempotency-key", format!("key-{i}"));
        }
        req.send()
    });
    for res in join_all(sends).await {
        assert_eq!(res.unwrap().status(), StatusCode::CREATED);
    }
    let sent = std::mem::take(&mut *log.lock().unwrap());

    let mut ids = app.list_ids(&u).await;
    ids.sort();
    assert_eq!(ids.len(), 8, "every upload stored");
    let path = format!("/v1/admin/users/{}", u.id);
    let account = app.json("GET", path, &admin(), None).await.1;
    assert_eq!(account["file_count"], 8, "{account}");
    assert_eq!(account["used_bytes"], (10..18).sum::<u64>(), "{account}");
    let events = all_events(&app, &u, 100).await;
    let seqs: Vec<i64> = events.iter().map(|e| e["seq"].as_i64().unwrap()).collect();
    assert_eq!(seqs, (1..=8).collect::<Vec<_>>(), "one event each, no gap");
    let mut subjects: Vec<String> = (events.iter())
        .map(|e| e["subject"].as_str().unwrap().to_owned())
        .collect();
    subjects.sort();
    assert_eq!(subjects, ids, "each event names its file");
    // A key replays its upload: its record was written with the file.
    let again = app
        .client
        .post(app.url("/v1/files"))
        .query(&[("filename", "f0.txt")])
        .bearer_auth(&u.key)
        .header("idempotency-key", "key-0")
        .body(vec![b'a'; 10])
        .send()
        .await
        .unwrap();
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    // Each file's owner permission was written.
    let uri = std::env::var("FILEDOCK_TEST_MONGODB_URI").unwrap();
    let client = mongodb::Client::with_uri_str(uri).await.unwrap();
    let settings = app.stop().await;
    let permissions = client
        .database(&settings.mongodb_db)
        .collection::<Document>("permissions");
    let mut found: Vec<String> = (permissions.find(doc! {"user_id": &u.id}).await.unwrap())
        .try_collect::<Vec<_>>()
        .await
        .unwrap()
        .iter()
        .map(|p| p.get_str("file_id").unwrap().to_owned())
        .collect();
    found.sort();
    assert_eq!(found, ids, "one owner permission per file");
    sent
}

/// The `bulkWrite`s in `sent` that write files (a commit's, not the
/// sequencer's placing of events).
fn bulk_commits(sent: &[SentCommand]) -> usize {
    let writes_files = |c: &&SentCommand| {
        (c.body.get_array("nsInfo").map(Vec::as_slice))
            .unwrap_or_default()
            .iter()
            .filter_map(|n| n.as_document()?.get_str("ns").ok())
            .any(|ns| ns.ends_with(".files"))
    };
    sent.iter()
        .filter(|c| c.name == "bulkWrite")
        .filter(writes_files)
        .count()
}

/// The writes a commit sends after the user document, one command per
/// collection: none of them is left when they go in one `bulkWrite`.
fn separate_writes(sent: &[SentCommand]) -> usize {
    ["files", "events", "permissions", "idempotency"]
        .iter()
        .map(|c| count(sent, "insert", Some(c)))
        .sum::<usize>()
        + count(sent, "delete", Some("upload_intents"))
}

#[tokio::test]
async fn a_lone_commit_s_writes_go_in_one_bulk_write_a_group_s_a_command_per_collection() {
    if !real_backends() {
        return;
    }
    for group in [false, true] {
        let sent = uploads(true, group).await;
        // Each commit transaction writes the user document once (a write
        // conflict's retry again: then the rest too).
        let commits = count(&sent, "findAndModify", Some("users"));
        let bulk = bulk_commits(&sent);
        let file_inserts: Vec<usize> = (sent.iter())
            .filter(|c| c.name == "insert" && c.collection() == Some("files"))
            .map(|c| c.body.get_array("documents").map_or(0, Vec::len))
            .collect();
        assert!(
            (1..=commits).contains(&(bulk + file_inserts.len())),
            "group {group}: {bulk} bulkWrites and {} inserts for {commits} commits",
            file_inserts.len()
        );
        if group {
            // Several files into one collection: an insert of them all.
            assert!(
                file_inserts.iter().all(|n| *n >= 2),
                "only a group's files are inserted with a command of their own: {file_inserts:?}"
            );
        } else {
            assert_eq!(
                separate_writes(&sent),
                0,
                "no write of a lone commit sent alone"
            );
            assert!(bulk >= 8, "a bulkWrite per upload's commit: {bulk}");
        }
    }
}

#[tokio::test]
async fn without_bulk_write_a_commit_sends_a_command_per_collection() {
    if !real_backends() {
        return;
    }
    for group in [false, true] {
        let sent = uploads(false, group).await;
        assert_eq!(count(&sent, "bulkWrite", None), 0, "group {group}");
        let files = count(&sent, "insert", Some("files"));
        assert!(
            (1..=8).contains(&files),
            "group {group}: {files} inserts of files"
        );
        assert_eq!(
            count(&sent, "delete", Some("upload_intents")),
            files,
            "group {group}: an intents' deletion per commit"
        );
        if !group {
            assert_eq!(files, 8, "one insert of a file per upload's commit");
        }
    }
}

#[tokio::test]
async fn without_bulk_write_a_commit_run_again_still_meets_its_own_file() {
    if !real_backends() {
        return;
    }
    let app = app_logged(false, true, &Arc::default()).await;
    run_again_after_it_applied(&app).await;
}

/// A server that refuses `bulkWrite` after the start (an upgrade rolled
/// back; here a fail point answering `CommandNotFound`, as MongoDB 7 does):
/// the commit that met the refusal runs again a command each and is
/// answered 201, and so are the commits after it.
#[tokio::test]
async fn a_bulk_write_refused_after_the_start_is_sent_again_a_command_each() {
    if !real_backends() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("filedock-bulk-{}", uuid::Uuid::new_v4().simple()));
    let mongo = OwnServer::mongo_with(&dir, &["--enable-test-commands"]).await;
    let uri = format!("mongodb://127.0.0.1:{}/?replicaSet=secantus", mongo.port());
    let mut settings = test_settings();
    settings.mongodb_uri = Some(uri.clone().into());
    let app = spawn_app_with(settings).await;
    let u = app.create_user("refused").await;
    let client = mongodb::Client::with_uri_str(&uri).await.unwrap();
    let arm = doc! {
        "configureFailPoint": "failCommand",
        "mode": {"times": 1},
        "data": {"failCommands": ["bulkWrite"], "errorCode": 59},
    };
    client.database("admin").run_command(arm).await.unwrap();
    let first = app.upload_json(&u, "first.txt", b"first".to_vec()).await;
    assert!(
        first["id"].is_string(),
        "the refused commit ran again: {first}"
    );
    let second = app.upload_json(&u, "second.txt", b"second".to_vec()).await;
    assert!(second["id"].is_string(), "{second}");
    assert_eq!(app.list_ids(&u).await.len(), 2);
    let events = all_events(&app, &u, 10).await;
    assert_eq!(
        events.len(),
        2,
        "one event each, none from the refused attempt"
    );
    app.stop().await;
    drop(mongo);
    let _ = std::fs::remove_dir_all(&dir);
}
