//! The load generator's tools: servers, a client, batches and the report.

use std::{
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use bytes::Bytes;
use filedock::{
    config::{S3Settings, Settings},
    testing::{Server, create_user_json, free_port, json_of},
};
use futures::{StreamExt, stream};
use serde_json::json;

pub(crate) const ADMIN: &str = "bench-admin-key";
pub(crate) const REPS: usize = 3;

pub(crate) fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set: run scripts/bench.sh"))
}

pub(crate) fn run_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..12].to_owned()
}

/// What the benchmarks need of a server beyond the shared test support.
pub(crate) trait BenchServer: Sized {
    /// The build at `$FILEDOCK_BIN`.
    async fn start(extra: &[(&str, &str)]) -> Self {
        Self::start_bin(&env("FILEDOCK_BIN"), extra).await
    }
    /// The build at `bin`, on a database and prefixes of its own.
    async fn start_bin(bin: &str, extra: &[(&str, &str)]) -> Self {
        Self::start_bin_with_id(bin, &run_id(), extra).await
    }
    /// The build at `bin` on the database, Redis and S3 prefixes and data
    /// directory named by `id` (see [`run_id`]): a second instance started
    /// with an `id` already used shares them with the first (a cluster).
    async fn start_bin_with_id(bin: &str, id: &str, extra: &[(&str, &str)]) -> Self;
    fn peak_rss_mib(&self) -> u64;
    /// The CPU time the process has used (user and system), in seconds.
    fn cpu_secs(&self) -> f64;
}

/// A filedock server process (release build) on its own database and prefixes.
impl BenchServer for Server {
    async fn start_bin_with_id(bin: &str, id: &str, extra: &[(&str, &str)]) -> Self {
        let port = free_port();
        let data = std::env::temp_dir().join(format!("filedock-bench-{id}"));
        let child = Command::new(bin)
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

    fn cpu_secs(&self) -> f64 {
        proc_cpu_secs(self.child.id())
    }
}

/// The builds an A/B runs, `(name, path)`: "this" (`$FILEDOCK_BIN`), then
/// each of the comma-separated paths in `FILEDOCK_BENCH_BASE_BIN` (other
/// builds of filedock, say main before a change), named by its file name.
pub(crate) fn builds() -> Vec<(String, String)> {
    let bases = std::env::var("FILEDOCK_BENCH_BASE_BIN").unwrap_or_default();
    let bases = bases.split(',').map(str::trim).filter(|p| !p.is_empty());
    let named = bases.map(|path| {
        let name = std::path::Path::new(path)
            .file_name()
            .map_or(path.into(), |n| n.to_string_lossy().into_owned());
        (name, path.to_owned())
    });
    std::iter::once(("this".to_owned(), env("FILEDOCK_BIN")))
        .chain(named)
        .collect()
}

/// A server of each of [`builds`], with its name.
pub(crate) async fn start_builds() -> Vec<(String, Server)> {
    let mut servers = Vec::new();
    for (name, path) in builds() {
        servers.push((name, Server::start_bin(&path, &[]).await));
    }
    servers
}

/// The CPU time (user + system) process `pid` has used, in seconds; 0 when
/// it cannot be read.
pub(crate) fn proc_cpu_secs(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // After the command's name in parentheses: utime and stime are the
    // 12th and 13th fields, in clock ticks.
    let rest = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let ticks: u64 = rest
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|t| t.parse::<u64>().ok())
        .sum();
    // SAFETY: sysconf reads a constant of the system.
    let per_sec = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1);
    ticks as f64 / per_sec as f64
}

pub(crate) struct Client {
    pub(crate) http: reqwest::Client,
}

impl Client {
    pub(crate) fn new() -> Self {
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(2048)
            .build()
            .unwrap();
        Self { http }
    }

    pub(crate) async fn user(&self, server: &Server, name: &str) -> String {
        let v = create_user_json(&self.http, &server.base, ADMIN, name).await;
        v["api_key"].as_str().unwrap().to_owned()
    }

    pub(crate) async fn agent(&self, server: &Server, key: &str) -> String {
        let agent = self
            .http
            .post(format!("{}/v1/agents", server.base))
            .bearer_auth(key)
            .json(&json!({"name": "bench"}));
        json_of(agent).await["id"].as_str().unwrap().to_owned()
    }

    /// One upload; `(succeeded, latency)`.
    pub(crate) async fn upload(
        &self,
        server: &Server,
        key: &str,
        body: reqwest::Body,
    ) -> (bool, Duration) {
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

    /// One authenticated GET of `path`, body read; `(succeeded, latency)`.
    pub(crate) async fn timed_get(
        &self,
        server: &Server,
        key: &str,
        path: &str,
    ) -> (bool, Duration) {
        let started = Instant::now();
        let res = self
            .http
            .get(format!("{}{path}", server.base))
            .bearer_auth(key)
            .timeout(Duration::from_secs(300))
            .send()
            .await;
        let ok = match res {
            Ok(res) if res.status().is_success() => res.bytes().await.is_ok(),
            _ => false,
        };
        (ok, started.elapsed())
    }

    pub(crate) async fn connect(
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
pub(crate) struct Batch {
    pub(crate) ok: usize,
    pub(crate) total: usize,
    pub(crate) wall: Duration,
    pub(crate) p50: Duration,
    pub(crate) p99: Duration,
    pub(crate) mean: Duration,
}

impl Batch {
    pub(crate) fn from(results: Vec<(bool, Duration)>, wall: Duration) -> Self {
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
            mean: lat.iter().sum::<Duration>() / lat.len().max(1) as u32,
        }
    }

    pub(crate) fn rate(&self) -> f64 {
        self.ok as f64 / self.wall.as_secs_f64()
    }
}

/// The median batch by wall time.
pub(crate) fn median(mut batches: Vec<Batch>) -> Batch {
    batches.sort_by_key(|b| b.wall);
    batches[batches.len() / 2]
}

pub(crate) fn median_f(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(|a, b| a.partial_cmp(b).unwrap());
    xs[xs.len() / 2]
}

pub(crate) fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

/// `n` requests, at most `concurrency` at once.
pub(crate) async fn drive<F, Fut>(n: usize, concurrency: usize, f: F) -> Batch
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
pub(crate) fn generated(
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
pub(crate) fn floor_settings() -> Settings {
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

pub(crate) fn s3_store_settings(prefix: &str) -> S3Settings {
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

pub(crate) struct Report {
    pub(crate) lines: Vec<String>,
}

impl Report {
    pub(crate) fn section(&mut self, title: &str, header: &str) {
        let cols = header.matches('|').count() - 1;
        self.lines.push(format!(
            "\n### {title}\n\n{header}\n|{}",
            "---|".repeat(cols)
        ));
        eprintln!("== {title}");
    }

    pub(crate) fn row(&mut self, row: String) {
        eprintln!("{row}");
        self.lines.push(row);
    }

    pub(crate) fn note(&mut self, note: String) {
        eprintln!("{note}");
        self.lines.push(format!("\n{note}"));
    }
}
