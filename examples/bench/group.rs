//! Scenario 7: group commit on vs off, on the same loads, alternating.

use filedock::testing::{Server, metric_at};

use crate::support::*;

/// One load: `n` uploads of `size` bytes, `in_flight` at once, spread over `users`.
struct Load {
    name: &'static str,
    n: usize,
    in_flight: usize,
    users: usize,
    size: usize,
}

// The latency loads first, on a store not yet filled by the bursts
// (SecantusDB slows as it fills).
const LOADS: [Load; 5] = [
    Load {
        name: "100 × 4 KiB, 1 in flight, one user",
        n: 100,
        in_flight: 1,
        users: 1,
        size: 4096,
    },
    Load {
        name: "200 × 4 KiB, 10 in flight, one user",
        n: 200,
        in_flight: 10,
        users: 1,
        size: 4096,
    },
    Load {
        name: "1000 concurrent × 1 KiB, one user",
        n: 1000,
        in_flight: 1000,
        users: 1,
        size: 1024,
    },
    Load {
        name: "2000 × 4 KiB, 32 in flight, one user",
        n: 2000,
        in_flight: 32,
        users: 1,
        size: 4096,
    },
    Load {
        name: "2000 × 4 KiB, 32 in flight, 32 users",
        n: 2000,
        in_flight: 32,
        users: 32,
        size: 4096,
    },
];

/// A batch and what it cost the metadata store, per upload.
#[derive(Clone, Copy)]
struct Measured {
    batch: Batch,
    txns: f64,
    commands: f64,
}

/// Counters of `server` that the loads move.
async fn counters(server: &Server) -> (f64, f64) {
    (
        metric_at(&server.base, "filedock_upload_commit_txns_total", "").await,
        metric_at(&server.base, "filedock_mongo_commands_total", "").await,
    )
}

async fn run(client: &Client, server: &Server, load: &Load, tag: &str) -> Measured {
    let mut keys = Vec::new();
    for u in 0..load.users {
        keys.push(client.user(server, &format!("{tag}-{u}")).await);
    }
    let before = counters(server).await;
    let batch = drive(load.n, load.in_flight, |i| {
        client.upload(
            server,
            &keys[i % load.users],
            reqwest::Body::from(vec![7u8; load.size]),
        )
    })
    .await;
    let after = counters(server).await;
    let n = load.n as f64;
    Measured {
        batch,
        txns: (after.0 - before.0) / n,
        commands: (after.1 - before.1) / n,
    }
}

/// The median batch (by wall time), with its own per-upload costs.
fn median_measured(mut ms: Vec<Measured>) -> Measured {
    ms.sort_by_key(|m| m.batch.wall);
    ms[ms.len() / 2]
}

/// Scenario 7: group commit on vs off, each load alternating which goes first.
pub(crate) async fn group_commit(client: &Client, r: &mut Report) {
    r.section(
        "7. Group commit on vs off (`FILEDOCK_UPLOAD_GROUP_COMMIT`)",
        "| load | group commit | succeeded | per second | wall | p50 | p99 | transactions / upload | MongoDB commands / upload |",
    );
    let on = Server::start(&[]).await;
    let off = Server::start(&[("FILEDOCK_UPLOAD_GROUP_COMMIT", "false")]).await;
    for (l, load) in LOADS.iter().enumerate() {
        let mut results: [Vec<Measured>; 2] = [Vec::new(), Vec::new()];
        for rep in 0..REPS {
            for i in 0..2 {
                let which = (i + rep) % 2;
                let server = if which == 0 { &on } else { &off };
                let tag = format!("group-{l}-{rep}");
                results[which].push(run(client, server, load, &tag).await);
            }
        }
        let [a, b] = results.map(median_measured);
        for (mode, m) in [("on", a), ("off", b)] {
            r.row(format!(
                "| {} | {mode} | {}/{} | {:.0} | {} | {} | {} | {:.3} | {:.2} |",
                load.name,
                m.batch.ok,
                m.batch.total,
                m.batch.rate(),
                ms(m.batch.wall),
                ms(m.batch.p50),
                ms(m.batch.p99),
                m.txns,
                m.commands
            ));
        }
        r.row(format!(
            "| {} | on ÷ off | | {:.2}× | {:.2}× | | {:.2}× | | |",
            load.name,
            a.batch.rate() / b.batch.rate(),
            a.batch.wall.as_secs_f64() / b.batch.wall.as_secs_f64(),
            a.batch.p99.as_secs_f64() / b.batch.p99.as_secs_f64(),
        ));
    }
}
