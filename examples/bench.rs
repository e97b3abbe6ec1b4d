//! filedock's load generator: drives real HTTP against filedock servers it
//! starts on loopback (release build), on the real Redis, MongoDB and S3 of
//! `scripts/stack.sh`, and prints one markdown table. Every comparison is
//! measured in the same run, alternating A and B, and reported as medians
//! and ratios. Bounded: a fixed number of requests per scenario, loopback only.
//!
//! Run it with `scripts/bench.sh` (which starts the stack and builds this).

use std::{
    process::{Command, Stdio},
    sync::Arc,
    time::{Duration, Instant},
};

use bytes::Bytes;
use filedock::{
    blob::{BlobStore, s3::S3BlobStore},
    config::{LockSettings, LockStrategy, S3Settings, Settings},
    domain::{Filename, upload::NewUpload, users},
    http::AppState,
    lock::{LockKey, LockManager, Locks, redis::RedisLocks},
    metrics::Metrics,
    testing::{Server, create_user_json, free_port, json_of, script_calls},
};
use futures::{StreamExt, TryStreamExt, stream};
use serde_json::json;

const ADMIN: &str = "bench-admin-key";
const REPS: usize = 3;

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set: run scripts/bench.sh"))
}

fn run_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..12].to_owned()
}

/// What the benchmarks need of a server beyond the shared test support.
trait BenchServer: Sized {
    async fn start(extra: &[(&str, &str)]) -> Self;
    fn peak_rss_mib(&self) -> u64;
}

/// A filedock server process (release build) on its own database and prefixes.
impl BenchServer for Server {
    async fn start(extra: &[(&str, &str)]) -> Self {
        let id = run_id();
        let port = free_port();
        let data = std::env::temp_dir().join(format!("filedock-bench-{id}"));
        let child = Command::new(env("FILEDOCK_BIN"))
            .env("FILEDOCK_BIND", format!("127.0.0.1:{port}"))
            .env("FILEDOCK_DATA_DIR", &data)
            .env("FILEDOCK_ADMIN_KEY", ADMIN)
            .env("FILEDOCK_MONGODB_URI", env("FILEDOCK_TEST_MONGODB_URI"))
            .env("FILEDOCK_MONGODB_DB", format!("bench_{id}"))
            .env("FILEDOCK_REDIS_URL", env("FILEDOCK_TEST_REDIS_URL"))
            .env("FILEDOCK_REDIS_PREFIX", format!("b{id}:"))
            .env("FILEDOCK_S3_ENDPOINT", env("FILEDOCK_TEST_S3_ENDPOINT"))
            .env("FILEDOCK_S3_BUCKET", "filedock-bench")
            .env("FILEDOCK_S3_ACCESS_KEY", env("FILEDOCK_TEST_S3_ACCESS_KEY"))
            .env("FILEDOCK_S3_SECRET_KEY", env("FILEDOCK_TEST_S3_SECRET_KEY"))
            .env("FILEDOCK_S3_KEY_PREFIX", format!("b{id}/"))
            .env("FILEDOCK_SWEEP_INTERVAL_SECS", "0")
            .env("RUST_LOG", "error")
            .envs(extra.iter().copied())
            .stdout(Stdio::null())
            .spawn()
            .expect("FILEDOCK_BIN runs");
        Server::wait_until_up(child, port, 400, Duration::from_millis(25)).await
    }

    fn peak_rss_mib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .unwrap_or_default();
        status
            .lines()
            .find(|l| l.starts_with("VmHWM:"))
            .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
            .map_or(0, |kb| kb / 1024)
    }
}

struct Client {
    http: reqwest::Client,
}

impl Client {
    fn new() -> Self {
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(2048)
            .build()
            .unwrap();
        Self { http }
    }

    async fn user(&self, server: &Server, name: &str) -> String {
        let v = create_user_json(&self.http, &server.base, ADMIN, name).await;
        v["api_key"].as_str().unwrap().to_owned()
    }

    async fn agent(&self, server: &Server, key: &str) -> String {
        let agent = self
            .http
            .post(format!("{}/v1/agents", server.base))
            .bearer_auth(key)
            .json(&json!({"name": "bench"}));
        json_of(agent).await["id"].as_str().unwrap().to_owned()
    }

    /// One upload; `(succeeded, latency)`.
    async fn upload(&self, server: &Server, key: &str, body: reqwest::Body) -> (bool, Duration) {
        let started = Instant::now();
        let res = self
            .http
            .post(format!("{}/v1/files?filename=bench.bin", server.base))
            .bearer_auth(key)
            .body(body)
            .timeout(Duration::from_secs(300))
            .send()
            .await;
        (
            res.is_ok_and(|r| r.status().as_u16() == 201),
            started.elapsed(),
        )
    }

    async fn connect(
        &self,
        server: &Server,
        key: &str,
        agent: &str,
        mcp: &str,
    ) -> (bool, Duration) {
        let started = Instant::now();
        let res = self
            .http
            .put(format!("{}/v1/agents/{agent}/mcps/{mcp}", server.base))
            .bearer_auth(key)
            .timeout(Duration::from_secs(300))
            .send()
            .await;
        (
            res.is_ok_and(|r| r.status().is_success()),
            started.elapsed(),
        )
    }
}

/// Outcome of one batch of requests.
#[derive(Clone, Copy, Default)]
struct Batch {
    ok: usize,
    total: usize,
    wall: Duration,
    p50: Duration,
    p99: Duration,
}

impl Batch {
    fn from(results: Vec<(bool, Duration)>, wall: Duration) -> Self {
        let mut lat: Vec<Duration> = results.iter().map(|r| r.1).collect();
        lat.sort();
        let pick = |q: f64| {
            lat.get(((lat.len() as f64 - 1.0) * q).round() as usize)
                .copied()
                .unwrap_or_default()
        };
        Self {
            ok: results.iter().filter(|r| r.0).count(),
            total: results.len(),
            wall,
            p50: pick(0.5),
            p99: pick(0.99),
        }
    }

    fn rate(&self) -> f64 {
        self.ok as f64 / self.wall.as_secs_f64()
    }
}

/// The median batch by wall time.
fn median(mut batches: Vec<Batch>) -> Batch {
    batches.sort_by_key(|b| b.wall);
    batches[batches.len() / 2]
}

fn median_f(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(|a, b| a.partial_cmp(b).unwrap());
    xs[xs.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

/// `n` requests, at most `concurrency` at once.
async fn drive<F, Fut>(n: usize, concurrency: usize, f: F) -> Batch
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = (bool, Duration)>,
{
    let started = Instant::now();
    let results: Vec<_> = stream::iter(0..n)
        .map(f)
        .buffer_unordered(concurrency)
        .collect()
        .await;
    Batch::from(results, started.elapsed())
}

/// A body of `len` bytes generated as it is sent (never held whole).
fn generated(
    len: usize,
) -> (
    reqwest::Body,
    impl futures::Stream<Item = std::io::Result<Bytes>> + Send + 'static,
) {
    const CHUNK: usize = 1 << 20;
    let block = Bytes::from(vec![0x5a; CHUNK]);
    let make = move || {
        let block = block.clone();
        stream::iter(
            (0..len.div_ceil(CHUNK))
                .map(move |i| Ok::<_, std::io::Error>(block.slice(..(len - i * CHUNK).min(CHUNK)))),
        )
    };
    (reqwest::Body::wrap_stream(make()), make())
}

/// Settings for an in-process service on the stack (the small-files floor).
fn floor_settings() -> Settings {
    let id = run_id();
    let mut s = Settings::embedded(std::env::temp_dir().join(format!("filedock-bench-{id}")));
    s.admin_key = Some(ADMIN.to_owned().into());
    s.mongodb_uri = Some(env("FILEDOCK_TEST_MONGODB_URI").into());
    s.mongodb_db = format!("bench_{id}");
    s.redis_url = Some(env("FILEDOCK_TEST_REDIS_URL").into());
    s.redis_prefix = format!("b{id}:");
    s.s3 = Some(s3_store_settings(&format!("b{id}/")));
    s
}

fn s3_store_settings(prefix: &str) -> S3Settings {
    S3Settings {
        endpoint: env("FILEDOCK_TEST_S3_ENDPOINT"),
        bucket: "filedock-bench".into(),
        region: "us-east-1".into(),
        access_key: env("FILEDOCK_TEST_S3_ACCESS_KEY").into(),
        secret_key: env("FILEDOCK_TEST_S3_SECRET_KEY").into(),
        key_prefix: prefix.into(),
        create_bucket: true,
        part_size: 8 << 20,
        part_concurrency: 4,
    }
}

struct Report {
    lines: Vec<String>,
}

impl Report {
    fn section(&mut self, title: &str, header: &str) {
        let cols = header.matches('|').count() - 1;
        self.lines.push(format!(
            "\n### {title}\n\n{header}\n|{}",
            "---|".repeat(cols)
        ));
        eprintln!("== {title}");
    }

    fn row(&mut self, row: String) {
        eprintln!("{row}");
        self.lines.push(row);
    }

    fn note(&mut self, note: String) {
        eprintln!("{note}");
        self.lines.push(format!("\n{note}"));
    }
}

#[tokio::main]
async fn main() {
    let started = Instant::now();
    let client = Client::new();
    let mut r = Report { lines: Vec::new() };

    // `bench 1 6` runs scenarios 1 and 6 only; no arguments run them all.
    let only: Vec<String> = std::env::args().skip(1).collect();
    let run = |n: &str| only.is_empty() || only.iter().any(|a| a == n);
    if run("1") {
        seeds_table(&client, &mut r).await;
    }
    if run("2") {
        hand_off(&mut r).await;
    }
    if run("3") {
        lock_scope(&client, &mut r).await;
    }
    if run("4") {
        lock_vs_queue(&client, &mut r).await;
    }
    if run("5") {
        ceiling(&client, &mut r).await;
    }
    if run("6") {
        small_files(&client, &mut r).await;
    }

    println!("{}", r.lines.join("\n"));
    println!("\n_({:.0} s)_", started.elapsed().as_secs_f64());
}

/// Scenario 1: N concurrent 1 KiB uploads by one user, notify vs backoff.
async fn seeds_table(client: &Client, r: &mut Report) {
    r.section(
        "1. The seeds' table: N concurrent 1 KiB uploads by one user",
        "| N | strategy | succeeded | wall | p50 | p99 |",
    );
    let notify = Server::start(&[("FILEDOCK_LOCK_STRATEGY", "notify")]).await;
    let backoff = Server::start(&[("FILEDOCK_LOCK_STRATEGY", "backoff")]).await;
    for n in [10, 20, 100, 1000] {
        let mut results: Vec<(&str, Vec<Batch>)> = vec![("notify", vec![]), ("backoff", vec![])];
        for rep in 0..REPS {
            for i in 0..2 {
                let which = (i + rep) % 2; // alternate which goes first
                let server = if which == 0 { &notify } else { &backoff };
                let key = client.user(server, &format!("seed-{n}-{rep}")).await;
                let batch = drive(n, n, |_| {
                    client.upload(server, &key, reqwest::Body::from(vec![7u8; 1024]))
                })
                .await;
                results[which].1.push(batch);
            }
        }
        let walls: Vec<Duration> = results
            .iter()
            .map(|(_, b)| median(b.clone()).wall)
            .collect();
        for (name, batches) in results {
            let b = median(batches);
            r.row(format!(
                "| {n} | {name} | {}/{} | {} | {} | {} |",
                b.ok,
                b.total,
                ms(b.wall),
                ms(b.p50),
                ms(b.p99)
            ));
        }
        r.row(format!(
            "| {n} | backoff ÷ notify (wall) | | {:.2}× | | |",
            walls[1].as_secs_f64() / walls[0].as_secs_f64()
        ));
    }
}

/// Scenario 2: release → next acquisition, on Redis, both strategies.
async fn hand_off(r: &mut Report) {
    r.section(
        "2. Lock hand-off on Redis",
        "| measure | notify | backoff | backoff ÷ notify |",
    );
    let url = env("FILEDOCK_TEST_REDIS_URL");
    let manager: Arc<dyn LockManager> =
        Arc::new(RedisLocks::connect(&url, &format!("h{}:", run_id())).unwrap());
    let locks = |strategy| {
        let settings = LockSettings {
            strategy,
            scope: filedock::config::LockScope::Commit,
            ttl: Duration::from_secs(30),
            wait_timeout: Duration::from_secs(30),
        };
        Arc::new(Locks::new(
            manager.clone(),
            settings,
            true,
            Arc::new(Metrics::default()),
        ))
    };
    let (notify, backoff) = (locks(LockStrategy::Notify), locks(LockStrategy::Backoff));
    // One waiter: time from release to its acquisition.
    let mut gaps = [Vec::new(), Vec::new()];
    for rep in 0..20 {
        for i in 0..2 {
            let which = (i + rep) % 2;
            let l = if which == 0 {
                notify.clone()
            } else {
                backoff.clone()
            };
            let key = LockKey::agent_config(&run_id());
            let held = l.acquire(&key).await.unwrap().unwrap();
            let (l2, k2) = (l.clone(), key.clone());
            let waiter = tokio::spawn(async move {
                let g = l2.acquire(&k2).await.unwrap().unwrap();
                let at = Instant::now();
                g.release().await;
                at
            });
            tokio::time::sleep(Duration::from_millis(150)).await;
            let released = Instant::now();
            held.release().await;
            let acquired = waiter.await.unwrap();
            gaps[which].push(acquired.saturating_duration_since(released).as_secs_f64() * 1000.0);
        }
    }
    let (n, b) = (median_f(gaps[0].clone()), median_f(gaps[1].clone()));
    r.row(format!(
        "| release → next holder, p50 (20 hand-offs) | {n:.2} ms | {b:.2} ms | {:.0}× |",
        b / n
    ));
    // 32 waiters, 2 ms holds: the idle time between one holder's end of work
    // (it calls release) and the next holder's start (its acquire returned).
    let mut idle = [Vec::new(), Vec::new()];
    let mut tries = [Vec::new(), Vec::new()];
    let redis = redis::Client::open(url.as_str()).unwrap();
    let mut stats = redis.get_multiplexed_async_connection().await.unwrap();
    for rep in 0..REPS {
        for i in 0..2 {
            let which = (i + rep) % 2;
            let l = if which == 0 {
                notify.clone()
            } else {
                backoff.clone()
            };
            let key = LockKey::agent_config(&run_id());
            let scripts_before = script_calls(&mut stats).await;
            let tasks: Vec<_> = (0..32)
                .map(|_| {
                    let (l, key) = (l.clone(), key.clone());
                    tokio::spawn(async move {
                        let g = l.acquire(&key).await.unwrap().unwrap();
                        let start = Instant::now();
                        tokio::time::sleep(Duration::from_millis(2)).await;
                        let end = Instant::now();
                        g.release().await;
                        (start, end)
                    })
                })
                .collect();
            let mut holds = Vec::new();
            for t in tasks {
                holds.push(t.await.unwrap());
            }
            holds.sort();
            let gaps: f64 = holds
                .windows(2)
                .map(|w| w[1].0.saturating_duration_since(w[0].1).as_secs_f64() * 1000.0)
                .sum();
            idle[which].push(gaps / (holds.len() - 1) as f64);
            let scripts = script_calls(&mut stats).await - scripts_before;
            tries[which].push(scripts as f64 / holds.len() as f64);
        }
    }
    let (n, b) = (median_f(idle[0].clone()), median_f(idle[1].clone()));
    r.row(format!("| 32 waiters × 2 ms holds: idle between holders (release → next acquire returns), mean | {n:.2} ms | {b:.2} ms | {:.0}× |", b / n.max(0.001)));
    let (n, b) = (median_f(tries[0].clone()), median_f(tries[1].clone()));
    r.row(format!(
        "| 32 waiters: Redis script calls per hold (tries + release) | {n:.1} | {b:.1} | {:.0}× |",
        b / n
    ));
    // Uncontended acquire + release round trip (the lock's cost per upload).
    let mut rt = Vec::new();
    for _ in 0..200 {
        let key = LockKey::agent_config(&run_id());
        let t = Instant::now();
        let g = notify.acquire(&key).await.unwrap().unwrap();
        g.release().await;
        rt.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    r.row(format!(
        "| uncontended acquire + release, p50 of 200 | {:.2} ms | | |",
        median_f(rt)
    ));
}

/// Scenario 3: 32 concurrent 4 MiB uploads by one user, commit vs upload scope.
async fn lock_scope(client: &Client, r: &mut Report) {
    r.section(
        "3. Lock scope: 32 concurrent 4 MiB uploads by one user",
        "| scope | succeeded | wall | p50 | p99 |",
    );
    let commit = Server::start(&[("FILEDOCK_LOCK_SCOPE", "commit")]).await;
    let upload = Server::start(&[("FILEDOCK_LOCK_SCOPE", "upload")]).await;
    let body = Bytes::from(vec![3u8; 4 << 20]);
    let mut results = [Vec::new(), Vec::new()];
    for rep in 0..REPS {
        for i in 0..2 {
            let which = (i + rep) % 2;
            let server = if which == 0 { &commit } else { &upload };
            let key = client.user(server, "scope").await;
            let batch = drive(32, 32, |_| {
                client.upload(server, &key, reqwest::Body::from(body.clone()))
            })
            .await;
            results[which].push(batch);
        }
    }
    let (c, u) = (median(results[0].clone()), median(results[1].clone()));
    for (name, b) in [("commit", c), ("upload", u)] {
        r.row(format!(
            "| {name} | {}/{} | {} | {} | {} |",
            b.ok,
            b.total,
            ms(b.wall),
            ms(b.p50),
            ms(b.p99)
        ));
    }
    r.row(format!(
        "| upload ÷ commit (wall) | | {:.2}× | | |",
        u.wall.as_secs_f64() / c.wall.as_secs_f64()
    ));
}

/// Scenario 4: lock vs queue coordination, spread over 200 users and on one hot agent.
async fn lock_vs_queue(client: &Client, r: &mut Report) {
    r.section(
        "4. Lock vs queue coordination (1000 MCP connects, 64 in flight)",
        "| load | coordination | succeeded | ops/s | p50 | p99 |",
    );
    let lock = Server::start(&[("FILEDOCK_COORDINATION", "lock")]).await;
    let queue = Server::start(&[("FILEDOCK_COORDINATION", "queue")]).await;
    // 200 users with an agent each, on both servers.
    let mut owners: [Vec<(String, String)>; 2] = [Vec::new(), Vec::new()];
    for (i, server) in [&lock, &queue].into_iter().enumerate() {
        for u in 0..200 {
            let key = client.user(server, &format!("spread-{u}")).await;
            let agent = client.agent(server, &key).await;
            owners[i].push((key, agent));
        }
    }
    for (load, spread) in [
        ("A: spread over 200 agents", true),
        ("B: one hot agent", false),
    ] {
        let mut results = [Vec::new(), Vec::new()];
        for rep in 0..REPS {
            for i in 0..2 {
                let which = (i + rep) % 2;
                let server = if which == 0 { &lock } else { &queue };
                let owners = &owners[which];
                let batch = drive(1000, 64, |n| {
                    let (key, agent) = if spread { &owners[n % 200] } else { &owners[0] };
                    let mcp = format!("m{rep}-{n}");
                    async move { client.connect(server, key, agent, &mcp).await }
                })
                .await;
                results[which].push(batch);
            }
        }
        let (l, q) = (median(results[0].clone()), median(results[1].clone()));
        for (name, b) in [("lock", l), ("queue", q)] {
            r.row(format!(
                "| {load} | {name} | {}/{} | {:.0} | {} | {} |",
                b.ok,
                b.total,
                b.rate(),
                ms(b.p50),
                ms(b.p99)
            ));
        }
        r.row(format!(
            "| {load} | queue ÷ lock (ops/s) | | {:.2}× | | |",
            q.rate() / l.rate()
        ));
    }
}

/// Scenario 5: large uploads through filedock vs straight to S3, and peak RSS.
async fn ceiling(client: &Client, r: &mut Report) {
    r.section(
        "5. Throughput ceiling: filedock vs a direct aws-sdk-s3 upload of the same bytes",
        "| size | filedock | direct S3 | filedock ÷ direct |",
    );
    let server = Server::start(&[]).await;
    let key = client.user(&server, "big").await;
    let direct = S3BlobStore::connect(
        &s3_store_settings(&format!("d{}/", run_id())),
        Arc::new(Metrics::default()),
    )
    .await
    .unwrap();
    for (size, reps) in [(256usize << 20, REPS), (1 << 30, 1)] {
        let mut rates = [Vec::new(), Vec::new()];
        for rep in 0..reps {
            for i in 0..2 {
                let which = (i + rep) % 2;
                let (body, raw) = generated(size);
                let started = Instant::now();
                let ok = if which == 0 {
                    client.upload(&server, &key, body).await.0
                } else {
                    direct
                        .put(
                            &format!("direct/{rep}-{size}"),
                            raw.map_err(Into::into).boxed(),
                        )
                        .await
                        .is_ok()
                };
                assert!(ok, "upload of {size} bytes failed");
                rates[which].push(size as f64 / (1 << 20) as f64 / started.elapsed().as_secs_f64());
            }
        }
        let (f, d) = (median_f(rates[0].clone()), median_f(rates[1].clone()));
        r.row(format!(
            "| {} MiB | {f:.0} MiB/s | {d:.0} MiB/s | {:.2} |",
            size >> 20,
            f / d
        ));
    }
    // Peak memory of a fresh server through one 1 GiB upload.
    let fresh = Server::start(&[]).await;
    let key = client.user(&fresh, "rss").await;
    let (body, _) = generated(1 << 30);
    assert!(client.upload(&fresh, &key, body).await.0);
    r.note(format!(
        "Peak RSS of a fresh filedock through one 1 GiB upload (8 MiB parts, 4 in flight): **{} MiB**.",
        fresh.peak_rss_mib()
    ));
}

/// Scenario 6: 4 KiB uploads at 32 in flight over 200 users vs direct S3 PUTs.
async fn small_files(client: &Client, r: &mut Report) {
    r.section(
        "6. Small files: 2000 × 4 KiB, 32 in flight",
        "| path | succeeded | per second | p50 | p99 |",
    );
    let server = Server::start(&[]).await;
    let mut keys = Vec::new();
    for u in 0..200 {
        keys.push(client.user(&server, &format!("small-{u}")).await);
    }
    let direct = S3BlobStore::connect(
        &s3_store_settings(&format!("s{}/", run_id())),
        Arc::new(Metrics::default()),
    )
    .await
    .unwrap();
    let body = Bytes::from(vec![9u8; 4096]);
    // The floor: the same service code (intent, lock, PUT, transaction,
    // release) called in-process, without HTTP or authentication.
    let floor_state = AppState::build(floor_settings()).await.unwrap();
    let mut floor_users = Vec::new();
    for u in 0..200 {
        floor_users.push(
            users::create_user(floor_state.ports.meta.as_ref(), &format!("floor-{u}"))
                .await
                .unwrap()
                .0,
        );
    }
    let mut results = [Vec::new(), Vec::new(), Vec::new()];
    for rep in 0..REPS {
        for i in 0..3 {
            let which = (i + rep) % 3;
            let batch = if which == 0 {
                drive(2000, 32, |n| {
                    client.upload(&server, &keys[n % 200], reqwest::Body::from(body.clone()))
                })
                .await
            } else if which == 2 {
                drive(2000, 32, |n| {
                    let (state, user, body) = (&floor_state, &floor_users[n % 200], body.clone());
                    async move {
                        let t = Instant::now();
                        let new = NewUpload {
                            filename: Filename::parse("floor.bin").unwrap(),
                            content_type: "application/octet-stream".into(),
                            declared_len: Some(4096),
                            body: stream::iter([Ok(body)]).boxed(),
                            idempotency_key: None,
                        };
                        (state.uploads.upload(user, new).await.is_ok(), t.elapsed())
                    }
                })
                .await
            } else {
                drive(2000, 32, |n| {
                    let (direct, body) = (&direct, body.clone());
                    async move {
                        let t = Instant::now();
                        let ok = direct
                            .put(
                                &format!("small/{rep}/{n}"),
                                stream::iter([Ok(body)]).boxed(),
                            )
                            .await
                            .is_ok();
                        (ok, t.elapsed())
                    }
                })
                .await
            };
            results[which].push(batch);
        }
    }
    let (f, d, fl) = (
        median(results[0].clone()),
        median(results[1].clone()),
        median(results[2].clone()),
    );
    for (name, b) in [
        ("filedock over HTTP", f),
        ("the floor: same service calls in-process, no HTTP", fl),
        ("direct S3 PUT only", d),
    ] {
        r.row(format!(
            "| {name} | {}/{} | {:.0} | {} | {} |",
            b.ok,
            b.total,
            b.rate(),
            ms(b.p50),
            ms(b.p99)
        ));
    }
    r.row(format!(
        "| filedock ÷ floor (per second) | | {:.2} | | |",
        f.rate() / fl.rate()
    ));
    r.row(format!(
        "| filedock ÷ direct S3 PUT (per second) | | {:.2} | | |",
        f.rate() / d.rate()
    ));
}
