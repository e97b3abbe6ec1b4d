//! Scenario 12b: how soon a long-polling reader sees an upload's event. A
//! reader waits on `GET /v1/events?wait=30` in a loop and notes when each
//! `file.created` arrived; a writer uploads 4 KiB files one at a time and
//! notes when each 201 arrived. The wake's latency is the difference.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use filedock::testing::Server;
use serde_json::Value;

use super::upload_id;
use crate::support::*;

const UPLOADS: usize = 200;
/// Between one upload's 201 and the next upload.
const PAUSE: Duration = Duration::from_millis(5);
/// The reader's long poll, in seconds.
const WAIT_SECS: u64 = 30;
/// A reader stops after this long, whatever it has seen.
const DEADLINE: Duration = Duration::from_secs(60);

/// When each `file.created` reached the reader, by file id.
type Seen = Arc<Mutex<HashMap<String, Instant>>>;

pub(super) async fn wake_latency(client: &Client, r: &mut Report) {
    r.section(
        "12b. Long-poll wake: a file's `file.created` at a reader waiting on \
         `GET /v1/events?wait=30`, after the upload's 201; 200 × 4 KiB uploads one at a time (issue 45)",
        "| reader | events seen / uploads | p50 | p99 | max | arrived before the 201 |",
    );
    let bin = env("FILEDOCK_BIN");
    {
        let server = Server::start(&[]).await;
        let key = client.user(&server, "wake-own").await;
        let wake = measure(client, &server, &key, &server, &key).await;
        r.row(wake.row("the user's own, same instance"));
    }
    {
        // A second instance on the same database and prefixes: the wake
        // crosses from the writer's instance to the reader's through Redis.
        let id = run_id();
        let writer = Server::start_bin_with_id(&bin, &id, &[]).await;
        let reader = Server::start_bin_with_id(&bin, &id, &[]).await;
        let key = client.user(&writer, "wake-across").await;
        let wake = measure(client, &writer, &key, &reader, &key).await;
        r.row(wake.row("the user's own, another instance"));
    }
    {
        let server = Server::start(&[]).await;
        let key = client.user(&server, "wake-feed").await;
        let wake = measure(client, &server, &key, &server, ADMIN).await;
        r.row(wake.row("the admin's feed, same instance"));
    }
    r.note(format!(
        "A {PAUSE:?} pause after each 201; each reader on a server of its own, \
         stopped when it has seen every upload's event or after {} s. The \
         feed places events after their commit (a sequencer gathering ~50 ms), \
         so its reader waits longer. An event that arrived before its 201 \
         counts as 0.",
        DEADLINE.as_secs()
    ));
}

/// What one reader saw of one writer's uploads.
struct Wake {
    uploads: usize,
    latencies: Vec<Duration>,
    early: usize,
}

impl Wake {
    fn row(&self, reader: &str) -> String {
        let pick = |q: f64| {
            let i = ((self.latencies.len() as f64 - 1.0) * q).round() as usize;
            self.latencies.get(i).map_or("–".to_owned(), |d| ms(*d))
        };
        format!(
            "| {reader} | {}/{} | {} | {} | {} | {} |",
            self.latencies.len(),
            self.uploads,
            pick(0.5),
            pick(0.99),
            pick(1.0),
            self.early
        )
    }
}

/// `UPLOADS` uploads by `key` on `writer`, one at a time, while a reader
/// long-polls `reader` as `reader_key` (the same user, or the admin).
async fn measure(
    client: &Client,
    writer: &Server,
    key: &str,
    reader: &Server,
    reader_key: &str,
) -> Wake {
    let seen = Seen::default();
    let deadline = Instant::now() + DEADLINE;
    let task = tokio::spawn(read(
        client.http.clone(),
        format!("{}/v1/events", reader.base),
        reader_key.to_owned(),
        seen.clone(),
        deadline,
    ));
    // The reader's first poll is waiting before the first upload.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut answered = Vec::new();
    for _ in 0..UPLOADS {
        answered.extend(upload_id(client, writer, key, 4096).await);
        tokio::time::sleep(PAUSE).await;
    }
    let all_seen = || {
        let seen = seen.lock().unwrap();
        answered.iter().all(|(id, _)| seen.contains_key(id))
    };
    while !all_seen() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    task.abort();
    let seen = seen.lock().unwrap();
    let (mut latencies, mut early) = (Vec::new(), 0);
    for (id, created) in &answered {
        if let Some(at) = seen.get(id) {
            early += (at < created) as usize;
            latencies.push(at.saturating_duration_since(*created));
        }
    }
    latencies.sort();
    Wake {
        uploads: answered.len(),
        latencies,
        early,
    }
}

/// Long-polls `url` from the start until `deadline`, the cursor each page
/// returns read on from, noting when each `file.created` arrived.
async fn read(http: reqwest::Client, url: String, key: String, seen: Seen, deadline: Instant) {
    let mut after = "0".to_owned();
    while Instant::now() < deadline {
        let res = http
            .get(format!("{url}?after={after}&limit=1000&wait={WAIT_SECS}"))
            .bearer_auth(&key)
            .timeout(Duration::from_secs(WAIT_SECS + 10))
            .send()
            .await;
        let at = Instant::now();
        let page: Option<Value> = match res {
            Ok(res) if res.status().is_success() => res.json().await.ok(),
            _ => None,
        };
        let Some(page) = page else {
            // A failed poll: try again shortly, not in a tight loop.
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let events = page["events"].as_array().into_iter().flatten();
        let created = events.filter(|e| e["type"] == "file.created");
        let ids = created.filter_map(|e| e["data"]["file_id"].as_str());
        for id in ids {
            seen.lock().unwrap().entry(id.to_owned()).or_insert(at);
        }
        if let Some(cursor) = page["cursor"].as_str() {
            after = cursor.to_owned();
        }
    }
}
