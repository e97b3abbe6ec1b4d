//! Deploys without a failed request (issue 48, part 2): three `filedock`
//! processes on the real stack behind a round-robin proxy that skips a
//! closed port (as a balancer in front of them); while clients upload
//! (plain and tus), attach and connect MCPs through it, each process in
//! turn gets SIGTERM, must end its drain with exit 0, and starts again on
//! its port. Counted: every answer a client got (any that is not a success
//! is a failure; a connection refused or cut before an answer is retried,
//! as any client behind a balancer would, and a tus PATCH a drain let go
//! with `503 draining` is resumed from `HEAD`'s offset, as a tus client
//! does: its upload must still complete), and every write a client was
//! told succeeded, read back at the end. In queue mode, how long fewer
//! than all the buckets were held during the roll.

use std::{
    collections::HashSet,
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use base64::Engine;
use reqwest::{Client, RequestBuilder, Response, StatusCode};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use filedock::config::{Coordination, Settings};

use crate::{
    helpers::*,
    support::round_robin::RoundRobin,
    tus::{OCTETS, TUS},
};

const INSTANCES: usize = 3;
const CLIENTS: usize = 6;
const PLAIN_BYTES: usize = 64 << 10;
const TUS_BYTES: usize = 128 << 10;

/// What one client did and was told.
#[derive(Default)]
struct Tally {
    /// Answers received, by every client together (to see that each
    /// drain met traffic).
    answers: Arc<AtomicUsize>,
    requests: usize,
    /// Connections refused or cut before an answer, sent again.
    retried: usize,
    /// tus PATCHes a drain let go (`503 draining`: what arrived is stored),
    /// resumed from `HEAD`'s offset as a tus client does.
    resumed: usize,
    failed: Vec<String>,
    /// Files it was told are stored: id and SHA-256.
    files: Vec<(String, String)>,
    attached: Vec<String>,
    mcps: Vec<String>,
}

impl Tally {
    /// Sends what `request` builds until an answer comes back; a transport
    /// error (refused, reset, closed before the answer) is sent again.
    async fn send(&mut self, what: &str, request: impl Fn() -> RequestBuilder) -> Option<Response> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            self.requests += 1;
            match request().send().await {
                Ok(res) => {
                    self.answers.fetch_add(1, Ordering::SeqCst);
                    return Some(res);
                }
                Err(_) if Instant::now() < deadline => {
                    self.retried += 1;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => {
                    self.failed.push(format!("{what}: no answer in 30 s: {e}"));
                    return None;
                }
            }
        }
    }

    /// The answer, if it is `expected`; otherwise a failure, counted.
    async fn answered(
        &mut self,
        what: &str,
        res: Option<Response>,
        expected: StatusCode,
    ) -> Option<Response> {
        let res = res?;
        if res.status() == expected {
            return Some(res);
        }
        let status = res.status();
        let body = res.text().await.unwrap_or_default();
        self.failed.push(format!("{what}: {status} {body}"));
        None
    }
}

/// One client's loop until `stop`: a plain upload (with an
/// `Idempotency-Key`, so that sending it again is safe), attached to its
/// session; an MCP connected to its agent; every third round a tus upload.
async fn client(
    base: String,
    (key, session, agent): (String, String, String),
    seed: u64,
    (stop, answers): (CancellationToken, Arc<AtomicUsize>),
) -> Tally {
    // No request waits longer than this for its answer.
    let http = Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let mut t = Tally {
        answers,
        ..Tally::default()
    };
    let mut round = 0u64;
    while !stop.is_cancelled() {
        round += 1;
        let bytes = pseudo_random_bytes(PLAIN_BYTES, seed * 1_000_000 + round);
        let idempotency = uuid::Uuid::new_v4().to_string();
        let res = t
            .send("upload", || {
                http.post(format!("{base}/v1/files?filename=r{round}.bin"))
                    .bearer_auth(&key)
                    .header("idempotency-key", &idempotency)
                    .body(bytes.clone())
            })
            .await;
        let Some(res) = t.answered("upload", res, StatusCode::CREATED).await else {
            continue;
        };
        let file: Value = res.json().await.unwrap();
        let id = file["id"].as_str().unwrap().to_owned();
        t.files.push((id.clone(), sha256_hex(&bytes)));
        let res = t
            .send("attach", || {
                http.post(format!("{base}/v1/sessions/{session}/files"))
                    .bearer_auth(&key)
                    .json(&json!({ "file_id": id }))
            })
            .await;
        if t.answered("attach", res, StatusCode::OK).await.is_some() {
            t.attached.push(id);
        }
        let mcp = format!("mcp-{round}");
        let res = t
            .send("connect", || {
                http.put(format!("{base}/v1/agents/{agent}/mcps/{mcp}"))
                    .bearer_auth(&key)
            })
            .await;
        if t.answered("connect", res, StatusCode::OK).await.is_some() {
            t.mcps.push(mcp);
        }
        if round.is_multiple_of(3) {
            tus_upload(&http, &base, &key, &mut t, seed * 1_000_000 + round).await;
        }
    }
    t
}

/// A tus upload in one PATCH, resumed from `HEAD`'s offset when the PATCH
/// gets no answer.
async fn tus_upload(http: &Client, base: &str, key: &str, t: &mut Tally, seed: u64) {
    let bytes = pseudo_random_bytes(TUS_BYTES, seed);
    let name = base64::engine::general_purpose::STANDARD.encode(format!("t{seed}.bin"));
    let res = t
        .send("tus create", || {
            http.post(format!("{base}/v1/uploads"))
                .bearer_auth(key)
                .header("tus-resumable", TUS)
                .header("upload-length", TUS_BYTES.to_string())
                .header("upload-metadata", format!("filename {name}"))
        })
        .await;
    let Some(res) = t.answered("tus create", res, StatusCode::CREATED).await else {
        return;
    };
    let location = res.headers()["location"].to_str().unwrap().to_owned();
    let id = location.rsplit('/').next().unwrap().to_owned();
    let upload = format!("{base}/v1/uploads/{id}");
    let mut offset = 0usize;
    for _ in 0..10 {
        let rest = bytes[offset..].to_vec();
        let res = t
            .send("tus patch", || {
                http.patch(&upload)
                    .bearer_auth(key)
                    .header("tus-resumable", TUS)
                    .header("content-type", OCTETS)
                    .header("upload-offset", offset.to_string())
                    .body(rest.clone())
            })
            .await;
        match res {
            Some(res) if res.status() == StatusCode::SERVICE_UNAVAILABLE => {
                let body = res.text().await.unwrap_or_default();
                match body.contains("\"code\":\"draining\"") {
                    true => t.resumed += 1,
                    false => t.failed.push(format!("tus patch: 503 {body}")),
                }
            }
            res => {
                if t.answered("tus patch", res, StatusCode::NO_CONTENT)
                    .await
                    .is_some()
                {
                    t.files.push((id, sha256_hex(&bytes)));
                    return;
                }
            }
        }
        // Where it is now, then the rest from there.
        let res = t
            .send("tus head", || {
                http.head(&upload)
                    .bearer_auth(key)
                    .header("tus-resumable", TUS)
            })
            .await;
        let Some(res) = t.answered("tus head", res, StatusCode::OK).await else {
            return;
        };
        offset = res.headers()["upload-offset"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        if offset == TUS_BYTES {
            t.files.push((id, sha256_hex(&bytes)));
            return;
        }
    }
    t.failed
        .push(format!("tus {id}: not done after 10 PATCHes"));
}

/// The instances' `FILEDOCK_DRAIN_*`: unready a second before the listener
/// closes, then up to 10 s for what is in flight.
const DRAIN_ENV: [(&str, &str); 2] = [
    ("FILEDOCK_DRAIN_READY_GRACE_SECS", "1"),
    ("FILEDOCK_DRAIN_SECS", "10"),
];

/// Starts instance `i` of the roll: the `filedock` binary on `port`, on the
/// test's stores, with its own data directory.
async fn start_instance(settings: &Settings, i: usize, port: u16) -> Server {
    let dir = settings.data_dir.join(format!("instance-{i}"));
    let dir = dir.display().to_string();
    let coordination = match settings.coordination {
        Coordination::Lock => "lock",
        Coordination::Queue => "queue",
    };
    let mut env = DRAIN_ENV.to_vec();
    env.extend([
        ("FILEDOCK_DATA_DIR", dir.as_str()),
        ("FILEDOCK_COORDINATION", coordination),
    ]);
    spawn_binary_on(settings, &env, port).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rolling_restart_under_load_fails_no_request_and_loses_no_write() {
    if !real_backends() {
        // The embedded store is one process's: instances cannot share it.
        return;
    }
    let settings = test_settings();
    // The users, sessions and agents, made on the stores before the roll.
    let setup = spawn_app_with(settings.clone()).await;
    let mut users = Vec::new();
    for i in 0..CLIENTS {
        let u = setup.create_user(&format!("roll-{i}")).await;
        let session = setup.new_session(&u).await;
        let agent = setup.new_agent(&u).await;
        users.push((u, session, agent));
    }
    let settings = setup.stop().await;

    let ports: Vec<u16> = (0..INSTANCES).map(|_| free_port()).collect();
    let mut instances = Vec::new();
    for (i, port) in ports.iter().enumerate() {
        instances.push(start_instance(&settings, i, *port).await);
    }
    let backends: Vec<SocketAddr> = ports
        .iter()
        .map(|p| format!("127.0.0.1:{p}").parse().unwrap())
        .collect();
    let proxy = RoundRobin::start(backends).await;
    let bases: Vec<String> = instances.iter().map(|s| s.base.clone()).collect();
    // On RabbitMQ the broker hands each bucket to one consumer (single
    // active consumer), which takes the bucket's lease only when it has
    // something to apply: the leases held say nothing of ownership there.
    let queue = matches!(settings.coordination, Coordination::Queue)
        && settings.queue_broker == filedock::config::QueueBroker::Redis;
    let sampling = CancellationToken::new();
    let buckets = queue.then(|| tokio::spawn(buckets_held(bases.clone(), sampling.clone())));

    let stop = CancellationToken::new();
    let answers = Arc::new(AtomicUsize::new(0));
    let clients: Vec<_> = users
        .iter()
        .enumerate()
        .map(|(i, (u, session, agent))| {
            let who = (u.key.clone(), session.clone(), agent.clone());
            tokio::spawn(client(
                proxy.base.clone(),
                who,
                i as u64,
                (stop.clone(), answers.clone()),
            ))
        })
        .collect();

    // Each instance in turn: SIGTERM, its drain to exit 0, started again
    // on its port; a pause before the next.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut stops = Vec::new();
    for (i, instance) in instances.iter_mut().enumerate() {
        let before = answers.load(Ordering::SeqCst);
        let (status, drained) = terminate(instance, Duration::from_secs(75)).await;
        assert!(
            status.success(),
            "instance {i} ended its drain with {status}"
        );
        let during = answers.load(Ordering::SeqCst) - before;
        let began = std::time::Instant::now();
        *instance = start_instance(&settings, i, ports[i]).await;
        stops.push((drained, began.elapsed(), during));
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.cancel();
    let mut tallies = Vec::new();
    for c in clients {
        let done = tokio::time::timeout(Duration::from_secs(60), c).await;
        tallies.push(
            done.expect("a client still running a minute after the roll")
                .unwrap(),
        );
    }

    let requests: usize = tallies.iter().map(|t| t.requests).sum();
    let retried: usize = tallies.iter().map(|t| t.retried).sum();
    let resumed: usize = tallies.iter().map(|t| t.resumed).sum();
    let written: usize = tallies.iter().map(|t| t.files.len()).sum();
    eprintln!(
        "rolling restart ({:?} mode): {requests} requests, {retried} sent again after a refused or cut connection, {resumed} tus PATCHes let go by a drain and resumed, {written} files written; each instance's (SIGTERM to exit, start, answers during the drain): {stops:?}",
        settings.coordination
    );
    let failed: Vec<&String> = tallies.iter().flat_map(|t| &t.failed).collect();
    assert!(failed.is_empty(), "failed requests: {failed:#?}");
    assert!(
        written >= CLIENTS * 3,
        "too little traffic to count: {written}"
    );
    assert!(
        stops.iter().all(|&(_, _, during)| during > 0),
        "a drain met no traffic: {stops:?}"
    );
    if let Some(buckets) = buckets {
        // Every bucket owned again once the roll is over.
        let deadline = Instant::now() + Duration::from_secs(10);
        while held_now(&reqwest::Client::new(), &bases).await != BUCKETS {
            assert!(
                Instant::now() < deadline,
                "buckets unowned 10 s after the roll"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        sampling.cancel();
        let (longest, total) = buckets.await.unwrap();
        eprintln!(
            "queue buckets during the roll: fewer than {BUCKETS} held for {total:?} in all, {longest:?} at the longest (an instance that does not answer counts as holding none: an upper bound)"
        );
    }

    // Every write a client was told succeeded, read on one instance.
    let app = spawn_app_with(settings).await;
    for ((u, session, agent), t) in users.iter().zip(&tallies) {
        // No more files than acknowledged (an upload sent again after a
        // cut connection carried its Idempotency-Key: applied once).
        let listed: HashSet<String> = app.list_ids(u).await.into_iter().collect();
        let acknowledged: HashSet<String> = t.files.iter().map(|(id, _)| id.clone()).collect();
        assert_eq!(listed, acknowledged, "{}'s files", u.id);
        for (id, sha) in &t.files {
            let got = app.download(u, id).await;
            assert_eq!(got.status(), StatusCode::OK, "file {id}");
            assert_eq!(&sha256_hex(&got.bytes().await.unwrap()), sha, "file {id}");
        }
        let (_, s) = app
            .json("GET", format!("/v1/sessions/{session}"), u, None)
            .await;
        let (_, a) = app
            .json("GET", format!("/v1/agents/{agent}"), u, None)
            .await;
        let has =
            |v: &Value, field: &str, id: &str| v[field].as_array().unwrap().iter().any(|x| x == id);
        for id in &t.attached {
            assert!(has(&s, "file_ids", id), "attached {id} is not in {s}");
        }
        for mcp in &t.mcps {
            assert!(has(&a, "mcp_ids", mcp), "connected {mcp} is not in {a}");
        }
    }
    app.stop().await;
    for instance in &mut instances {
        terminate(instance, Duration::from_secs(75)).await;
    }
}

/// The queue's buckets, each held by at most one instance.
const BUCKETS: usize = 64;

/// How many buckets the instances at `bases` hold together
/// (`GET /v1/admin/queue`'s `buckets_held`; one that does not answer
/// within 200 ms counts none).
async fn held_now(http: &Client, bases: &[String]) -> usize {
    let mut held = 0;
    for base in bases {
        let res = http
            .get(format!("{base}/v1/admin/queue"))
            .bearer_auth(ADMIN_KEY)
            .timeout(Duration::from_millis(200))
            .send()
            .await;
        if let Ok(res) = res
            && let Ok(body) = res.json::<Value>().await
        {
            held += body["buckets_held"].as_u64().unwrap_or(0) as usize;
        }
    }
    held
}

/// Samples [`held_now`] every 25 ms until `stop`: how long, at the longest
/// and in all, fewer than every bucket were held.
async fn buckets_held(bases: Vec<String>, stop: CancellationToken) -> (Duration, Duration) {
    let http = Client::new();
    let (mut longest, mut total, mut since) = (Duration::ZERO, Duration::ZERO, None);
    let mut last = Instant::now();
    while !stop.is_cancelled() {
        let short = held_now(&http, &bases).await < BUCKETS;
        let now = Instant::now();
        if short {
            total += now - last;
            let began = *since.get_or_insert(last);
            longest = longest.max(now - began);
        } else {
            since = None;
        }
        last = now;
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    (longest, total)
}
