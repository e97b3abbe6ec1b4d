//! filedock's load generator: drives real HTTP against filedock servers it
//! starts on loopback (release build), on the real Redis, MongoDB and S3 of
//! `scripts/stack.sh`, and prints one markdown table. Every comparison is
//! measured in the same run, alternating A and B, and reported as medians
//! and ratios. Bounded: a fixed number of requests per scenario, loopback only.
//!
//! Run it with `scripts/bench.sh` (which starts the stack and builds this).

mod group;
mod held;
mod memory;
mod support;
mod throughput;
mod tus;

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use bytes::Bytes;
use filedock::{
    config::{LockSettings, LockStrategy},
    lock::{LockKey, LockManager, Locks, redis::RedisLocks},
    metrics::Metrics,
    testing::{Server, script_calls},
};

use self::{
    group::group_commit, held::cost_vs_files_held, memory::memory_under_concurrency, support::*,
    throughput::*, tus::*,
};

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
    if run("7") {
        group_commit(&client, &mut r).await;
    }
    if run("8") {
        tus_vs_plain(&client, &mut r).await;
    }
    if run("9") {
        memory_under_concurrency(&client, &mut r).await;
    }
    if run("11") {
        cost_vs_files_held(&client, &mut r).await;
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
