//! Scenario 2: a lock's hand-off on Redis, notify vs backoff; and 2c: the
//! notify hand-off on one Redis node vs a Redis Cluster (cluster mode).

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use filedock::{
    config::{LockSettings, LockStrategy, RedisMode},
    lock::{LockKey, Locks, redis::RedisLocks},
    metrics::Metrics,
    redis_link::RedisLink,
    testing::script_calls,
};

use crate::support::*;

/// Locks on `link` with `strategy`, production (no degraded path).
fn locks(link: &RedisLink, strategy: LockStrategy) -> Arc<Locks> {
    let settings = LockSettings {
        strategy,
        scope: filedock::config::LockScope::Commit,
        ttl: Duration::from_secs(30),
        wait_timeout: Duration::from_secs(30),
    };
    let manager = Arc::new(RedisLocks::on(link, &format!("h{}:", run_id())));
    Arc::new(Locks::new(
        manager,
        settings,
        true,
        Arc::new(Metrics::default()),
    ))
}

/// One waiter: ms from the holder's release to the waiter's acquisition.
async fn release_to_next_holder(l: &Arc<Locks>) -> f64 {
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
    acquired.saturating_duration_since(released).as_secs_f64() * 1000.0
}

/// 32 waiters, 2 ms holds: the mean idle ms between one holder's end of work
/// (it calls release) and the next holder's start (its acquire returned).
async fn idle_between_32_holders(l: &Arc<Locks>) -> f64 {
    let key = LockKey::agent_config(&run_id());
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
    gaps / (holds.len() - 1) as f64
}

/// ms of one uncontended acquire + release (the lock's cost per upload).
async fn uncontended(l: &Arc<Locks>) -> f64 {
    let key = LockKey::agent_config(&run_id());
    let t = Instant::now();
    let g = l.acquire(&key).await.unwrap().unwrap();
    g.release().await;
    t.elapsed().as_secs_f64() * 1000.0
}

/// Runs `measure` on A and B `reps` times, alternating which goes first;
/// the medians.
async fn a_b<F, Fut>(ab: &[Arc<Locks>; 2], reps: usize, measure: F) -> [f64; 2]
where
    F: Fn(Arc<Locks>) -> Fut,
    Fut: std::future::Future<Output = f64>,
{
    let mut got = [Vec::new(), Vec::new()];
    for rep in 0..reps {
        for i in 0..2 {
            let which = (i + rep) % 2;
            got[which].push(measure(ab[which].clone()).await);
        }
    }
    [median_f(got[0].clone()), median_f(got[1].clone())]
}

/// Scenario 2: release → next acquisition on one Redis, both strategies.
pub(crate) async fn hand_off(r: &mut Report) {
    r.section(
        "2. Lock hand-off on Redis",
        "| measure | notify | backoff | backoff ÷ notify |",
    );
    let url = env("FILEDOCK_TEST_REDIS_URL");
    let link = RedisLink::connect(&url, RedisMode::Single).unwrap();
    let ab = [
        locks(&link, LockStrategy::Notify),
        locks(&link, LockStrategy::Backoff),
    ];
    let [n, b] = a_b(&ab, 20, |l| async move { release_to_next_holder(&l).await }).await;
    r.row(format!(
        "| release → next holder, p50 (20 hand-offs) | {n:.2} ms | {b:.2} ms | {:.0}× |",
        b / n
    ));
    let mut stats = redis::Client::open(url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let mut idle = [Vec::new(), Vec::new()];
    let mut tries = [Vec::new(), Vec::new()];
    for rep in 0..REPS {
        for i in 0..2 {
            let which = (i + rep) % 2;
            let before = script_calls(&mut stats).await;
            idle[which].push(idle_between_32_holders(&ab[which]).await);
            let scripts = script_calls(&mut stats).await - before;
            tries[which].push(scripts as f64 / 32.0);
        }
    }
    let (n, b) = (median_f(idle[0].clone()), median_f(idle[1].clone()));
    r.row(format!("| 32 waiters × 2 ms holds: idle between holders (release → next acquire returns), mean | {n:.2} ms | {b:.2} ms | {:.0}× |", b / n.max(0.001)));
    let (n, b) = (median_f(tries[0].clone()), median_f(tries[1].clone()));
    r.row(format!(
        "| 32 waiters: Redis script calls per hold (tries + release) | {n:.1} | {b:.1} | {:.0}× |",
        b / n
    ));
    let mut rt = Vec::new();
    for _ in 0..200 {
        rt.push(uncontended(&ab[0]).await);
    }
    r.row(format!(
        "| uncontended acquire + release, p50 of 200 | {:.2} ms | | |",
        median_f(rt)
    ));
}

/// Scenario 2c: the notify hand-off on one Redis node vs a Redis Cluster
/// (three masters with a replica each, cluster mode), same run, alternating.
pub(crate) async fn hand_off_on_a_cluster(r: &mut Report) {
    r.section(
        "2c. Lock hand-off: one Redis node vs a Redis Cluster (notify)",
        "| measure | one node | cluster | cluster ÷ one node |",
    );
    let node = RedisLink::connect(&env("FILEDOCK_TEST_REDIS_URL"), RedisMode::Single).unwrap();
    let seeds = env("FILEDOCK_TEST_REDIS_CLUSTER_URL");
    let cluster = RedisLink::connect(&seeds, RedisMode::Cluster).unwrap();
    let ab = [
        locks(&node, LockStrategy::Notify),
        locks(&cluster, LockStrategy::Notify),
    ];
    let rows: [(&str, usize); 3] = [
        ("release → next holder, p50 of 20 (a new key each)", 20),
        (
            "32 waiters × 2 ms holds: idle between holders, mean (median of 3)",
            REPS,
        ),
        ("uncontended acquire + release, p50 of 200", 200),
    ];
    for (i, (label, reps)) in rows.into_iter().enumerate() {
        let [a, b] = match i {
            0 => {
                a_b(
                    &ab,
                    reps,
                    |l| async move { release_to_next_holder(&l).await },
                )
                .await
            }
            1 => {
                a_b(
                    &ab,
                    reps,
                    |l| async move { idle_between_32_holders(&l).await },
                )
                .await
            }
            _ => a_b(&ab, reps, |l| async move { uncontended(&l).await }).await,
        };
        r.row(format!(
            "| {label} | {a:.2} ms | {b:.2} ms | {:.2}× |",
            b / a.max(0.001)
        ));
    }
}
