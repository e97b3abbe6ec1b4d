//! filedock's load generator: drives real HTTP against filedock servers it
//! starts on loopback (release build), on the real Redis, MongoDB and S3 of
//! `scripts/stack.sh`, and prints one markdown table. Every comparison is
//! measured in the same run, alternating A and B, and reported as medians
//! and ratios. Bounded: a fixed number of requests per scenario, loopback only.
//!
//! Run it with `scripts/bench.sh` (which starts the stack and builds this).

mod cost;
mod events;
mod group;
mod handoff;
mod held;
mod memory;
mod small_tus;
mod support;
mod throughput;
mod tus;
mod webhooks;

use std::time::{Duration, Instant};

use bytes::Bytes;
use filedock::testing::Server;

use self::{
    events::events,
    group::group_commit,
    handoff::{hand_off, hand_off_on_a_cluster},
    held::cost_vs_files_held,
    memory::memory_under_concurrency,
    small_tus::small_tus,
    support::*,
    throughput::*,
    tus::*,
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
    if run("2c") {
        hand_off_on_a_cluster(&mut r).await;
    }
    if run("3") {
        lock_scope(&client, &mut r).await;
    }
    if run("4") {
        lock_vs_queue(&client, &mut r).await;
    }
    if run("4c") {
        lock_vs_queue_on_a_cluster(&client, &mut r).await;
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
    if run("12") {
        events(&client, &mut r).await;
    }
    if run("13") {
        small_tus(&client, &mut r).await;
    }
    // 13b is part of 13: alone only when asked for by name.
    if only.iter().any(|a| a == "13b") {
        small_tus::cpu_only(&client, &mut r).await;
    }
    if run("14") {
        webhooks::webhooks(&client, &mut r).await;
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
