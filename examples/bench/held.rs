//! Scenario 11 (issue 22): cost vs files held. One user grows to 1k, 10k, 50k
//! and 100k files of 4 KiB (over HTTP, 32 in flight); at each step the burst
//! that got there, one upload alone, `GET /v1/me` and the list's first page
//! are timed, on the embedded defaults and on the real stack, and each figure
//! is set against its value at 1k files.

use std::{
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use bytes::Bytes;
use filedock::testing::{Server, free_port};

use super::support::*;

/// Files held at each step; `FILEDOCK_BENCH_HELD_MAX` drops the steps above it.
const STEPS: [usize; 4] = [1_000, 10_000, 50_000, 100_000];
/// The timed burst: the last this many uploads that reach a step.
const BURST: usize = 1_000;
const IN_FLIGHT: usize = 32;
/// Sequential samples of each single-request figure (the median is reported).
const SAMPLES: usize = 20;
/// The list's first page on SecantusDB takes seconds at 100k files: after
/// this much time spent on it at one step, and at least 3 samples, stop.
const LIST_BUDGET: Duration = Duration::from_secs(60);

/// The figures at one step.
#[derive(Clone, Copy)]
struct Step {
    held: usize,
    rate: f64,
    failed: usize,
    upload_ms: f64,
    me_ms: f64,
    list_ms: f64,
    list_samples: usize,
}

pub(crate) async fn cost_vs_files_held(client: &Client, r: &mut Report) {
    let max = std::env::var("FILEDOCK_BENCH_HELD_MAX")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(usize::MAX);
    let steps: Vec<usize> = STEPS.into_iter().filter(|&s| s <= max).collect();
    r.section(
        "11. Cost vs files held (issue 22): one user, 4 KiB files, 32 in flight",
        "| backend | files held | burst uploads/s | ÷ 1k | one upload (p50) | ÷ 1k | `/v1/me` (p50) | ÷ 1k | first page, 100 (p50) | ÷ 1k |",
    );
    let (embedded, data) = start_embedded().await;
    grow(client, &embedded, "embedded", &steps, r).await;
    drop(embedded);
    let _ = std::fs::remove_dir_all(data); // 100k files: the next runs need not keep them
    let real = <Server as BenchServer>::start(&[]).await;
    grow(client, &real, "real stack", &steps, r).await;
    r.note(format!(
        "Burst: the last {BURST} uploads that reach the step, {IN_FLIGHT} in flight. One upload, \
         `/v1/me` and `GET /v1/files?limit=100`: medians of {SAMPLES} sequential requests each \
         (the list stops after {} s and 3 samples; see its sample count).",
        LIST_BUDGET.as_secs()
    ));
}

/// A filedock server on the embedded defaults: no MongoDB, Redis or S3
/// settings, only a data directory and the admin key.
async fn start_embedded() -> (Server, std::path::PathBuf) {
    let port = free_port();
    let data = std::env::temp_dir().join(format!("filedock-bench-{}", run_id()));
    let child = Command::new(env("FILEDOCK_BIN"))
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("FILEDOCK_BIND", format!("127.0.0.1:{port}"))
        .env("FILEDOCK_DATA_DIR", &data)
        .env("FILEDOCK_ADMIN_KEY", ADMIN)
        .env("FILEDOCK_SWEEP_INTERVAL_SECS", "0")
        .env("RUST_LOG", "error")
        .stdout(Stdio::null())
        .spawn()
        .expect("FILEDOCK_BIN runs");
    let server = Server::wait_until_up(child, port, 400, Duration::from_millis(25)).await;
    (server, data)
}

/// Grows one user of `server` through `steps`, one table row per step.
async fn grow(client: &Client, server: &Server, backend: &str, steps: &[usize], r: &mut Report) {
    let key = client.user(server, "held").await;
    let body = Bytes::from(vec![4u8; 4096]);
    // Open the connections the burst will use, so the first step does not pay for them.
    drive(IN_FLIGHT * 4, IN_FLIGHT, |_| client.timed_get(server, &key, "/v1/me")).await;
    let mut held = 0;
    let mut first: Option<Step> = None;
    for &target in steps {
        let started = Instant::now();
        let untimed = target.saturating_sub(BURST).saturating_sub(held);
        let fill = drive(untimed, IN_FLIGHT, |_| {
            client.upload(server, &key, reqwest::Body::from(body.clone()))
        })
        .await;
        let burst = drive(target - held - untimed, IN_FLIGHT, |_| {
            client.upload(server, &key, reqwest::Body::from(body.clone()))
        })
        .await;
        held += fill.ok + burst.ok;
        let (mut upload, mut me, mut list) = (Vec::new(), Vec::new(), Vec::new());
        let mut listing = Duration::ZERO;
        for i in 0..SAMPLES {
            let (ok, t) = client
                .upload(server, &key, reqwest::Body::from(body.clone()))
                .await;
            assert!(ok, "{backend}: a single upload at {held} files failed");
            upload.push(t.as_secs_f64() * 1000.0);
            me.push(client.timed_get(server, &key, "/v1/me").await.1.as_secs_f64() * 1000.0);
            if i < 3 || listing < LIST_BUDGET {
                let (ok, t) = client.timed_get(server, &key, "/v1/files?limit=100").await;
                assert!(ok, "{backend}: the first page at {held} files failed");
                listing += t;
                list.push(t.as_secs_f64() * 1000.0);
            }
        }
        let step = Step {
            held: target,
            rate: burst.rate(),
            failed: fill.total - fill.ok + burst.total - burst.ok,
            upload_ms: median_f(upload),
            me_ms: median_f(me),
            list_samples: list.len(),
            list_ms: median_f(list),
        };
        held += SAMPLES;
        let base = first.get_or_insert(step);
        r.row(row(backend, &step, base));
        eprintln!(
            "   ({backend}: step to {target} took {:.0} s)",
            started.elapsed().as_secs_f64()
        );
    }
}

fn row(backend: &str, s: &Step, base: &Step) -> String {
    let failed = match s.failed {
        0 => String::new(),
        n => format!(" ({n} failed)"),
    };
    let list_n = match s.list_samples {
        SAMPLES => String::new(),
        n => format!(" (of {n})"),
    };
    format!(
        "| {backend} | {} | {:.0}{failed} | {:.2}× | {:.1} ms | {:.2}× | {:.1} ms | {:.2}× | {:.1} ms{list_n} | {:.2}× |",
        thousands(s.held),
        s.rate,
        s.rate / base.rate,
        s.upload_ms,
        s.upload_ms / base.upload_ms,
        s.me_ms,
        s.me_ms / base.me_ms,
        s.list_ms,
        s.list_ms / base.list_ms,
    )
}

fn thousands(n: usize) -> String {
    match n {
        n if n >= 1000 => format!("{}k", n / 1000),
        n => n.to_string(),
    }
}

impl Client {
    /// One authenticated GET of `path`; `(succeeded, latency)`.
    async fn timed_get(&self, server: &Server, key: &str, path: &str) -> (bool, Duration) {
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
}
