//! The Redis Streams queue.
//!
//! - An operation goes to one of 64 logical buckets by its lock key's hash;
//!   each bucket is a stream (`filedock_queue:{b}`) with one consumer group.
//! - A bucket is consumed by exactly one worker at a time: the worker holds
//!   the bucket's lease (a lock with renewal). Instances share the buckets
//!   (each takes at most ⌈64 / live instances⌉), so operations on one key
//!   apply in enqueue order while different buckets run in parallel.
//! - Consumer names are unique per process. A worker that takes a bucket
//!   first claims (`XAUTOCLAIM`) what a dead owner left pending.
//! - Every operation carries an id, recorded in `processed_ops` in the same
//!   transaction, so a redelivered operation is applied once; the lease's
//!   fencing token is checked too, so a worker that lost its lease cannot
//!   apply out of order.
//! - What one read of a bucket returns (up to 16 entries) is applied in one
//!   transaction, a group commit; a group the store refuses is applied one
//!   operation at a time, so each still gets its own answer.
//! - The result goes to a per-operation key, and the waiting instance is
//!   told on its own channel (`results.rs`; both carry the bucket's hash
//!   tag, so this runs on a Redis Cluster too); the waiter re-reads the key
//!   every second in case a notice is lost.
//! - An operation that keeps failing goes to `filedock_queue_dlq`; write
//!   conflicts and an unreachable store are waited out, not counted.
//! - Redis unhealthy (checked at most once a second; on a cluster, the
//!   bucket's master only): the direct lock path.
//!
//! What does not depend on the broker is apart: `front.rs` (the circuit
//! breaker, waiting, the dynamic timeout, settling) and `apply.rs` (what a
//! bucket's consumer does with its deliveries: group commit, retries, dead
//! letters). This file is the Redis Streams broker's side of the front
//! (health, enqueue, results); `worker.rs` consumes a bucket's stream,
//! `manager.rs` leases the buckets, `stats.rs` keeps the figures.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

mod apply;
#[cfg(test)]
mod apply_tests;
mod dead_letter;
mod front;
mod manager;
pub mod rabbit;
mod results;
mod stats;
mod worker;

use async_trait::async_trait;
use redis::AsyncCommands;

pub use self::results::{done_channel, result_key};
use self::{
    front::{Broker, EnqueueError, Front, Waiters},
    results::{Results, read_result},
    stats::Recent,
};
use super::{
    Applier, BUCKETS, CoordError, Coordinator, LockCoordinator, OpOutcome, QueueStats,
    members::Members,
};
use crate::{
    lock::Locks,
    metrics::Metrics,
    redis_link::{Fault, RedisConn, RedisLink, Watch, fault_of},
    vocab::{OpId, Operation},
};

const GROUP: &str = "filedock";
/// About how many entries a bucket's stream keeps (`XADD MAXLEN ~`).
const MAX_STREAM_LEN: u64 = 100_000;
/// How long a Redis health check stands (the circuit breaker).
const HEALTH_CHECK_EVERY: Duration = Duration::from_secs(1);
/// How long the health check waits for its answer.
const PING_TIMEOUT: Duration = Duration::from_millis(500);

pub struct RedisQueue {
    link: RedisLink,
    conn: RedisConn,
    prefix: String,
    /// Unique consumer name of this process.
    instance: String,
    /// Waiting, timeouts, settling and the direct path.
    front: Front,
    /// Last health check of each part of Redis (on a cluster, each slot
    /// checked: one master's outage leaves the others' buckets queued):
    /// when, and whether it answered.
    health: Mutex<HashMap<u16, (Instant, bool)>>,
    recent: Recent,
    held: Arc<Mutex<usize>>,
    /// This instance's result notices.
    results: Results,
    /// The live instances, among which the buckets are shared.
    members: Members,
    /// Bucket leases.
    locks: Arc<Locks>,
    metrics: Arc<Metrics>,
}

fn now_ms() -> u64 {
    crate::lock::now_micros() / 1000
}

impl RedisQueue {
    /// The queue on `link` (its own: connections are lazy, so a development
    /// server starts with Redis down).
    pub fn connect(
        link: RedisLink,
        prefix: &str,
        locks: Arc<Locks>,
        applier: Applier,
        metrics: Arc<Metrics>,
        wait: Duration,
    ) -> anyhow::Result<Self> {
        let conn = link.conn();
        let instance = format!("filedock-{}", uuid::Uuid::new_v4().simple());
        let waiters = Waiters::default();
        let results = Results::start(&link, prefix, &instance, waiters.clone());
        let members = Members::new(
            Some(conn.clone()),
            format!("{prefix}filedock_queue_members"),
            instance.clone(),
        );
        Ok(Self {
            members,
            link,
            conn,
            prefix: prefix.to_owned(),
            instance,
            front: Front {
                waiters,
                direct: LockCoordinator::new(locks.clone(), applier.clone()),
                applier,
                wait,
            },
            health: Mutex::default(),
            recent: Recent::default(),
            held: Arc::default(),
            results,
            locks,
            metrics,
        })
    }

    /// The stream of bucket `b`.
    pub fn stream(prefix: &str, b: u32) -> String {
        format!("{prefix}filedock_queue:{{{b}}}")
    }

    fn dlq(&self) -> String {
        format!("{}filedock_queue_dlq", self.prefix)
    }

    /// Entries waiting or in flight in bucket `b`.
    async fn bucket_len(&self, b: u32) -> redis::RedisResult<u64> {
        let groups: redis::streams::StreamInfoGroupsReply = self
            .conn
            .clone()
            .xinfo_groups(Self::stream(&self.prefix, b))
            .await?;
        Ok(groups
            .groups
            .iter()
            .map(|g| (g.lag.unwrap_or(0) + g.pending) as u64)
            .sum())
    }
}

#[async_trait]
impl Coordinator for RedisQueue {
    async fn run(&self, op: Operation) -> Result<(), CoordError> {
        self.front.run(self, op).await
    }

    async fn stats(&self) -> Option<QueueStats> {
        Some(self.figures().await)
    }
}

#[async_trait]
impl Broker for RedisQueue {
    type Listening = Watch;

    /// The circuit breaker: whether the part of Redis that holds bucket
    /// `b` answers, checked at most once a second (a read of the bucket's
    /// stream key: routed to its master on a cluster, where a `PING` would
    /// need every master).
    async fn healthy(&self, b: u32) -> bool {
        let stream = Self::stream(&self.prefix, b);
        let scope = self.link.outage_scope(&stream);
        if let Some((at, ok)) = self.health.lock().unwrap().get(&scope).copied()
            && at.elapsed() < HEALTH_CHECK_EVERY
        {
            return ok;
        }
        let mut conn = self.conn.clone();
        let probe = conn.exists::<_, bool>(&stream);
        // A redirection (MOVED, ASK: one node of a cluster in single
        // mode) is Redis up: the enqueue meets it too and is refused, never
        // sent down the direct path. A master down (CLUSTERDOWN…) is not.
        let ok = match tokio::time::timeout(PING_TIMEOUT, probe).await {
            Ok(Ok(_)) => true,
            Ok(Err(e)) => e.redirect_node().is_some(),
            Err(_) => false,
        };
        let mut health = self.health.lock().unwrap();
        health.insert(scope, (Instant::now(), ok));
        ok
    }

    fn mark_unhealthy(&self, b: u32) {
        let scope = self.link.outage_scope(&Self::stream(&self.prefix, b));
        let mut health = self.health.lock().unwrap();
        health.insert(scope, (Instant::now(), false));
    }

    async fn listen(&self, b: u32) -> Option<Watch> {
        (self.results)
            .watch(&done_channel(&self.prefix, b, &self.instance))
            .await
    }

    async fn enqueue(&self, b: u32, op: &Operation, op_id: &OpId) -> Result<u64, EnqueueError> {
        match self.add(b, op, op_id).await {
            Ok(ahead) => Ok(ahead),
            // A topology answer (MOVED…): Redis is up.
            Err(e) if fault_of(&e) == Fault::Topology => {
                Err(EnqueueError::Misrouted(e.to_string()))
            }
            Err(e) => Err(EnqueueError::Failed(e.to_string())),
        }
    }

    async fn read_result(&self, b: u32, op_id: &OpId, _heard: Option<&Watch>) -> Option<OpOutcome> {
        read_result(&mut self.conn.clone(), &self.prefix, b, op_id).await
    }
}

impl RedisQueue {
    /// Adds `op` to bucket `b`'s stream; how many entries were ahead.
    async fn add(&self, b: u32, op: &Operation, op_id: &OpId) -> redis::RedisResult<u64> {
        let ahead = self.bucket_len(b).await.unwrap_or(0);
        let body = serde_json::to_string(op)
            .map_err(|e| redis::RedisError::from(std::io::Error::other(e)))?;
        let _: String = redis::cmd("XADD")
            .arg(Self::stream(&self.prefix, b))
            .arg("MAXLEN")
            .arg("~")
            .arg(MAX_STREAM_LEN)
            .arg("*")
            .arg("op")
            .arg(body)
            .arg("id")
            .arg(op_id.to_string())
            .arg("reply")
            .arg(&self.instance)
            .arg("at")
            .arg(now_ms())
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(ahead)
    }
}

impl RedisQueue {
    /// The queue's figures: lengths from Redis, rates from this instance.
    async fn figures(&self) -> QueueStats {
        let mut length = 0;
        for b in 0..BUCKETS {
            length += self.bucket_len(b).await.unwrap_or(0);
        }
        let dead_letter_count: u64 = self.conn.clone().xlen(self.dlq()).await.unwrap_or(0);
        let (processing_rate, average_wait_ms, failure_rate) = self.recent.figures();
        QueueStats {
            length,
            processing_rate,
            average_wait_ms,
            failure_rate,
            dead_letter_count,
            buckets_held: *self.held.lock().unwrap(),
            warnings: Vec::new(),
        }
        .with_warnings()
    }
}
