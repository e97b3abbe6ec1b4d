//! What a load cost a filedock server, from its own counters and `/proc`:
//! MongoDB and Redis commands, S3 requests, its CPU and the stack's, per
//! upload; and a row's repetitions with the median one's cost.

use std::collections::BTreeMap;

use filedock::testing::{Server, metric_by_label, metric_in, metrics_text};

use crate::support::*;

/// What a filedock server's counters say one load cost, per upload.
#[derive(Clone, Default)]
pub(crate) struct Cost {
    pub(crate) mongo: f64,
    pub(crate) redis: f64,
    /// Upload commit transactions (attempts), and write conflicts of any.
    pub(crate) txns: f64,
    pub(crate) conflicts: f64,
    pub(crate) s3: BTreeMap<String, f64>,
    /// The server's own CPU (filedock's, or the peer's).
    pub(crate) cpu_ms: f64,
    /// The stack's servers' CPU, by name (`FILEDOCK_BENCH_STACK_PIDS`).
    pub(crate) stack_ms: BTreeMap<String, f64>,
}

impl Cost {
    pub(crate) fn s3_total(&self) -> f64 {
        self.s3.values().sum()
    }

    /// The CPU ms of the stack's server `name` (`mongo`, `s3`, `redis`,
    /// `load`), or an empty cell when it was not counted.
    pub(crate) fn stack(&self, name: &str) -> String {
        self.stack_ms
            .get(name)
            .map_or(String::new(), |ms| format!("{ms:.2}"))
    }
}

/// The stack's server processes, `name=pid` pairs from
/// `FILEDOCK_BENCH_STACK_PIDS` (set by `scripts/bench.sh`).
fn stack_pids() -> Vec<(String, u32)> {
    std::env::var("FILEDOCK_BENCH_STACK_PIDS")
        .unwrap_or_default()
        .split(',')
        .filter_map(|p| {
            let (name, pid) = p.split_once('=')?;
            Some((name.to_owned(), pid.parse().ok()?))
        })
        .collect()
}

/// Waits (at most 30 s) until the stack's servers are quiet: under a tenth
/// of a core over each of two quarter seconds in a row. What one build's
/// load left the store to do (events to place, say) then does not count
/// against the next build's load, on the same store.
pub(crate) async fn quiet() {
    let pids = stack_pids();
    let busy_ms = || -> f64 {
        pids.iter()
            .map(|(_, pid)| proc_cpu_secs(*pid) * 1000.0)
            .sum()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let (mut last, mut calm) = (busy_ms(), 0);
    while calm < 2 && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        let now = busy_ms();
        calm = if now - last < 25.0 { calm + 1 } else { 0 };
        last = now;
    }
}

/// The counters a load moves, as they stand now; filedock's own metrics
/// only when `filedock` (a peer has none).
pub(crate) async fn counters(server: &Server, filedock: bool) -> Cost {
    let mut pids = stack_pids();
    pids.push(("load".to_owned(), std::process::id()));
    let stack_ms = pids
        .into_iter()
        .map(|(name, pid)| (name, proc_cpu_secs(pid) * 1000.0))
        .collect();
    let cpu_ms = server.cpu_secs() * 1000.0;
    if !filedock {
        return Cost {
            cpu_ms,
            stack_ms,
            ..Cost::default()
        };
    }
    let text = metrics_text(&server.base).await;
    Cost {
        mongo: metric_in(&text, "filedock_mongo_commands_total", ""),
        redis: metric_in(&text, "filedock_redis_commands_total", ""),
        txns: metric_in(&text, "filedock_upload_commit_txns_total", ""),
        conflicts: metric_in(&text, "filedock_txn_write_conflicts_total", ""),
        s3: metric_by_label(&text, "filedock_s3_requests_total"),
        cpu_ms,
        stack_ms,
    }
}

/// `after − before` of each of `after`'s entries, per `n`.
fn rise(
    before: &BTreeMap<String, f64>,
    after: &BTreeMap<String, f64>,
    n: f64,
) -> BTreeMap<String, f64> {
    after
        .iter()
        .map(|(k, v)| (k.clone(), (v - before.get(k).unwrap_or(&0.0)) / n))
        .collect()
}

/// `after − before`, per upload.
pub(crate) fn per_upload(before: &Cost, after: &Cost, n: usize) -> Cost {
    let n = n as f64;
    Cost {
        mongo: (after.mongo - before.mongo) / n,
        redis: (after.redis - before.redis) / n,
        txns: (after.txns - before.txns) / n,
        conflicts: (after.conflicts - before.conflicts) / n,
        s3: rise(&before.s3, &after.s3, n)
            .into_iter()
            .filter(|(_, v)| *v > 0.0)
            .collect(),
        cpu_ms: (after.cpu_ms - before.cpu_ms) / n,
        stack_ms: rise(&before.stack_ms, &after.stack_ms, n),
    }
}

/// One row's repetitions: the batches and (filedock) what they cost.
#[derive(Default)]
pub(crate) struct Runs {
    pub(crate) batches: Vec<Batch>,
    pub(crate) costs: Vec<Cost>,
}

impl Runs {
    /// The median repetition by wall time, with its cost.
    pub(crate) fn median(&self) -> (Batch, Option<Cost>) {
        let mut order: Vec<usize> = (0..self.batches.len()).collect();
        order.sort_by_key(|&i| self.batches[i].wall);
        let mid = order[order.len() / 2];
        (self.batches[mid], self.costs.get(mid).cloned())
    }
}
