//! Scenario 9 (issue 27): memory under concurrency, the upload memory
//! budget off (`FILEDOCK_UPLOAD_MEMORY_BYTES=0`: every upload buffers what
//! it likes, as before the budget) vs on (the default 512 MiB), alternating,
//! each run on a fresh server so that its peak RSS is that run's.

use std::time::{Duration, Instant};

use filedock::testing::Server;
use serde_json::Value;

use super::support::*;

/// The default budget, which the "on" runs use.
const BUDGET: &str = "536870912";
/// Repetitions of each load, off and on alternating (A B, then B A).
const MEMORY_REPS: usize = 2;

/// One run: how many uploads got 201, the wall time, the server's peak RSS
/// and how many buffer reservations waited.
struct Run {
    ok: usize,
    wall: Duration,
    rss_mib: u64,
    waits: f64,
    budget_peak_mib: f64,
}

pub(crate) async fn memory_under_concurrency(client: &Client, r: &mut Report) {
    r.section(
        "9. Memory under concurrency: the upload memory budget off vs on (512 MiB)",
        "| load | run | budget | 201s | wall | aggregate | peak RSS | budget peak | waits |",
    );
    let loads: [(&str, usize, usize); 2] = [
        ("100 × 64 MiB at once", 100, 64 << 20),
        ("1 × 1 GiB alone", 1, 1 << 30),
    ];
    for (label, uploads, len) in loads {
        let mut rates = [Vec::new(), Vec::new()];
        for rep in 0..MEMORY_REPS {
            for i in 0..2 {
                let on = (i + rep) % 2 == 1;
                let run = one_run(client, on, uploads, len).await;
                let rate = (uploads * len) as f64 / (1 << 20) as f64 / run.wall.as_secs_f64();
                rates[on as usize].push(rate);
                r.row(format!(
                    "| {label} | {} | {} | {}/{uploads} | {:.1} s | {rate:.0} MiB/s | {} MiB | {:.0} MiB | {} |",
                    rep + 1,
                    if on { "512 MiB" } else { "off" },
                    run.ok,
                    run.wall.as_secs_f64(),
                    run.rss_mib,
                    run.budget_peak_mib,
                    run.waits,
                ));
            }
        }
        let mean = |xs: &[f64]| xs.iter().sum::<f64>() / xs.len() as f64;
        r.note(format!(
            "{label}: aggregate throughput on ÷ off = **{:.2}** (mean of {MEMORY_REPS} runs each).",
            mean(&rates[1]) / mean(&rates[0])
        ));
    }
}

async fn one_run(client: &Client, on: bool, uploads: usize, len: usize) -> Run {
    let budget = if on { BUDGET } else { "0" };
    // One user sends every upload: the whole budget is its share.
    let env = [
        ("FILEDOCK_UPLOAD_MEMORY_BYTES", budget),
        ("FILEDOCK_UPLOAD_MEMORY_USER_SHARE", "1"),
    ];
    let server = Server::start(&env).await;
    let key = client.user(&server, "memory").await;
    let started = Instant::now();
    let sent = (0..uploads).map(|_| {
        let (body, _) = generated(len);
        client.upload(&server, &key, body)
    });
    let results = futures::future::join_all(sent).await;
    let wall = started.elapsed();
    let metrics = client.metrics(&server).await;
    let metric = |name: &str| {
        metrics
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .unwrap_or_default()
    };
    let run = Run {
        ok: results.iter().filter(|r| r.0).count(),
        wall,
        rss_mib: server.peak_rss_mib(),
        waits: metric("filedock_upload_memory_waits_total"),
        budget_peak_mib: metric("filedock_upload_memory_peak_bytes") / (1 << 20) as f64,
    };
    // The bytes go: the next run must not pay for this one's disk.
    client.delete_all(&server, &key).await;
    run
}

impl Client {
    /// The server's `/metrics` text.
    async fn metrics(&self, server: &Server) -> String {
        let res = self.http.get(format!("{}/metrics", server.base)).send();
        res.await.unwrap().text().await.unwrap()
    }

    /// Deletes every file of `key`'s user.
    async fn delete_all(&self, server: &Server, key: &str) {
        loop {
            let list = self
                .http
                .get(format!("{}/v1/files?limit=1000", server.base))
                .bearer_auth(key)
                .send();
            let list: Value = list.await.unwrap().json().await.unwrap();
            let files = list["files"].as_array().cloned().unwrap_or_default();
            if files.is_empty() {
                return;
            }
            for f in files {
                let id = f["id"].as_str().unwrap();
                let res = self
                    .http
                    .delete(format!("{}/v1/files/{id}", server.base))
                    .bearer_auth(key)
                    .send();
                assert!(res.await.unwrap().status().is_success());
            }
        }
    }
}
