//! Scenario 14 (issue 46): what webhooks cost. 14a: how soon a receiver
//! on loopback has an upload's `file.created` after the upload's 201;
//! 14b: uploads on a server that delivers every event to that receiver
//! against the same build without webhooks, in the same run, alternating.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use axum::{Router, body::Bytes, extract::State, http::StatusCode};
use filedock::testing::Server;
use serde_json::Value;

use crate::{
    cost::Runs,
    events::{LOADS, WARM_UP, load_row, one_load, ratio_row, upload_id},
    support::*,
};

/// `whsec_` and the base64 of 32 bytes: a bench's own, not a secret.
const SECRET: &str = "whsec_YmVuY2gtd2ViaG9vay1zZWNyZXQtMzItYnl0ZXMhIQ==";
const UPLOADS: usize = 200;
/// Between one upload's 201 and the next upload.
const PAUSE: Duration = Duration::from_millis(5);
/// The receiver must have every upload's event by then.
const DEADLINE: Duration = Duration::from_secs(60);

/// When each `file.created` reached the receiver, by file id; and how many
/// requests it got.
#[derive(Clone, Default)]
struct Seen {
    created: Arc<Mutex<HashMap<String, Instant>>>,
    requests: Arc<Mutex<usize>>,
}

/// A receiver on loopback that answers 204 at once.
struct Receiver {
    url: String,
    seen: Seen,
    task: tokio::task::JoinHandle<()>,
}

impl Receiver {
    async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        let seen = Seen::default();
        let app = Router::new().fallback(receive).with_state(seen.clone());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self { url, seen, task }
    }

    fn env(&self) -> [(&str, &str); 2] {
        [
            ("FILEDOCK_WEBHOOK_URL", self.url.as_str()),
            ("FILEDOCK_WEBHOOK_SECRET", SECRET),
        ]
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn receive(State(seen): State<Seen>, body: Bytes) -> StatusCode {
    let at = Instant::now();
    *seen.requests.lock().unwrap() += 1;
    if let Ok(event) = serde_json::from_slice::<Value>(&body)
        && event["type"] == "file.created"
        && let Some(id) = event["data"]["file_id"].as_str()
    {
        seen.created
            .lock()
            .unwrap()
            .entry(id.to_owned())
            .or_insert(at);
    }
    StatusCode::NO_CONTENT
}

pub(crate) async fn webhooks(client: &Client, r: &mut Report) {
    latency(client, r).await;
    on_vs_off(client, r).await;
}

/// 14a: `UPLOADS` 4 KiB uploads one at a time; each one's `file.created`
/// at the receiver after its 201.
async fn latency(client: &Client, r: &mut Report) {
    r.section(
        "14a. Webhook delivery: a file's `file.created` at a receiver on loopback, \
         after the upload's 201; 200 × 4 KiB uploads one at a time (issue 46)",
        "| server | delivered / uploads | p50 | p99 | max | arrived before the 201 |",
    );
    let receiver = Receiver::start().await;
    let server = Server::start(&receiver.env()).await;
    let key = client.user(&server, "hook-latency").await;
    // The dispatcher holds its partitions (taken at start) before the first.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut answered = Vec::new();
    for _ in 0..UPLOADS {
        answered.extend(upload_id(client, &server, &key, 4096).await);
        tokio::time::sleep(PAUSE).await;
    }
    let deadline = Instant::now() + DEADLINE;
    let all_seen = || {
        let seen = receiver.seen.created.lock().unwrap();
        answered.iter().all(|(id, _)| seen.contains_key(id))
    };
    while !all_seen() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let seen = receiver.seen.created.lock().unwrap().clone();
    let (mut latencies, mut early) = (Vec::new(), 0);
    for (id, created) in &answered {
        if let Some(at) = seen.get(id) {
            early += usize::from(at < created);
            latencies.push(at.saturating_duration_since(*created));
        }
    }
    latencies.sort();
    let pick = |q: f64| {
        let i = ((latencies.len() as f64 - 1.0) * q).round() as usize;
        latencies.get(i).map_or("–".to_owned(), |d| ms(*d))
    };
    r.row(format!(
        "| one instance, one URL | {}/{} | {} | {} | {} | {early} |",
        latencies.len(),
        answered.len(),
        pick(0.5),
        pick(0.99),
        pick(1.0),
    ));
    r.note(format!(
        "A {PAUSE:?} pause after each 201. An event reaches the dispatcher \
         through the feed, which a sequencer places events in after their \
         commit, gathering ~50 ms; the receiver answers 204 at once. An \
         event that arrived before its 201 counts as 0."
    ));
}

/// 14b: each load on the server with webhooks and on the one without,
/// alternating which goes first, `REPS` times; the median repetition by
/// wall, then on ÷ off.
async fn on_vs_off(client: &Client, r: &mut Report) {
    r.section(
        "14b. Uploads with every event delivered by webhook (on) vs the same build without (off), plain uploads (issue 46)",
        "| build | load | succeeded | uploads/s | MiB/s | p50 | p99 | MongoDB cmds / upload | filedock CPU ms / upload | SecantusDB CPU ms / upload |",
    );
    let receiver = Receiver::start().await;
    let builds = [
        ("on", Server::start(&receiver.env()).await),
        ("off", Server::start(&[]).await),
    ];
    for (name, server) in &builds {
        one_load(client, server, &WARM_UP, &format!("hook-warm-{name}")).await;
    }
    let mut medians = Vec::new();
    for (l, load) in LOADS.iter().enumerate() {
        let mut runs: Vec<Runs> = builds.iter().map(|_| Runs::default()).collect();
        for rep in 0..REPS {
            for i in 0..builds.len() {
                let which = (i + rep) % builds.len();
                let tag = format!("hook-{l}-{rep}");
                let (batch, cost) = one_load(client, &builds[which].1, load, &tag).await;
                runs[which].batches.push(batch);
                runs[which].costs.push(cost);
            }
        }
        let mut of_load = Vec::new();
        for (which, (name, _)) in builds.iter().enumerate() {
            let (batch, cost) = runs[which].median();
            let cost = cost.unwrap_or_default();
            r.row(load_row(name, load, &batch, &cost));
            of_load.push((batch, cost));
        }
        medians.push(of_load);
    }
    for (load, of_load) in LOADS.iter().zip(&medians) {
        let row = ratio_row("off", load, &of_load[0], &of_load[1]);
        r.row(row.replacen("this ÷", "on ÷", 1));
    }
    let requests = *receiver.seen.requests.lock().unwrap();
    r.note(format!(
        "The same build, one server with `FILEDOCK_WEBHOOK_URL` set to a \
         receiver on loopback (answering 204 at once; {requests} deliveries \
         over the run), one without. Each load's users are new for each \
         repetition; the costs are the median repetition's (by wall), from \
         filedock's own counters and the processes' CPU time."
    ));
}
