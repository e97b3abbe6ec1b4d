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
//! This file is the queue's front (enqueue, wait for the result);
//! `worker.rs` holds the bucket workers, `stats.rs` the figures.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

mod dead_letter;
mod manager;
mod results;
mod stats;
mod worker;

use async_trait::async_trait;
use redis::AsyncCommands;
use tokio::sync::oneshot;

pub use self::results::{done_channel, result_key};
use self::{
    results::{Results, Waiters, read_result},
    stats::Recent,
};
use super::{
    Applier, BUCKETS, CoordError, Coordinator, LockCoordinator, OpOutcome, QueueStats, bucket_of,
    members::Members, wait_timeout,
};
use crate::{
    lock::{LockError, Locks},
    meta::{MetaError, Refusal, Settled},
    metrics::Metrics,
    redis_link::{Fault, RedisConn, RedisLink, fault_of},
    vocab::{OpId, Operation},
};

const GROUP: &str = "filedock";
/// About how many entries a bucket's stream keeps (`XADD MAXLEN ~`).
const MAX_STREAM_LEN: u64 = 100_000;
/// How long a Redis health check stands (the circuit breaker).
const HEALTH_CHECK_EVERY: Duration = Duration::from_secs(1);
/// How long the health check waits for its answer.
const PING_TIMEOUT: Duration = Duration::from_millis(500);
/// How often a waiter re-reads its result, in case a notice was lost.
const RESULT_POLL_EVERY: Duration = Duration::from_secs(1);
/// How long settling a timed-out operation may take before the answer is
/// "outcome unknown" (the store may be waiting on a worker's transaction).
const SETTLE_WAIT: Duration = Duration::from_secs(5);

pub struct RedisQueue {
    link: RedisLink,
    conn: RedisConn,
    prefix: String,
    /// Unique consumer name of this process.
    instance: String,
    waiters: Waiters,
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
    applier: Applier,
    /// Where operations go while Redis is unhealthy.
    direct: LockCoordinator,
    metrics: Arc<Metrics>,
    /// The waiter's base wait (`FILEDOCK_QUEUE_WAIT_SECS`).
    wait: Duration,
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
            waiters,
            health: Mutex::default(),
            recent: Recent::default(),
            held: Arc::default(),
            results,
            direct: LockCoordinator::new(locks.clone(), applier.clone()),
            locks,
            applier,
            metrics,
            wait,
        })
    }

    /// The stream of bucket `b`.
    pub fn stream(prefix: &str, b: u32) -> String {
        format!("{prefix}filedock_queue:{{{b}}}")
    }

    fn dlq(&self) -> String {
        format!("{}filedock_queue_dlq", self.prefix)
    }

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

    async fn enqueue(&self, b: u32, op: &Operation, op_id: &OpId) -> redis::RedisResult<u64> {
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
    /// Answers for an operation that may still be in the stream without
    /// leaving it free to apply later: its id is recorded as processed, so
    /// a worker skips it, and `failure` is the answer. If the id was there
    /// already, it applied. If the store cannot say in time, the outcome is
    /// unknown.
    async fn settle(
        &self,
        op: &Operation,
        op_id: &OpId,
        failure: CoordError,
    ) -> Result<(), CoordError> {
        let why = match &failure {
            CoordError::Meta(MetaError::ContainerFull(max)) => Refusal::ContainerFull(*max),
            CoordError::Meta(MetaError::NotFound) => Refusal::NotFound,
            _ => Refusal::Cancelled,
        };
        match tokio::time::timeout(SETTLE_WAIT, self.applier.cancel(op_id, why)).await {
            Ok(Ok(Settled::Now)) => Err(failure),
            Ok(Ok(Settled::Applied)) => Ok(()),
            Ok(Ok(Settled::Refused(why))) => OpOutcome::from(why).into_result(),
            Ok(Err(e)) => {
                tracing::warn!(%op_id, error = %e, "could not settle a queued operation");
                Err(CoordError::OutcomeUnknown(op.resource_path()))
            }
            Err(_) => Err(CoordError::OutcomeUnknown(op.resource_path())),
        }
    }
}

#[async_trait]
impl Coordinator for RedisQueue {
    async fn run(&self, op: Operation) -> Result<(), CoordError> {
        let b = bucket_of(&op.lock_key());
        if !self.healthy(b).await {
            return self.direct.run(op).await;
        }
        let op_id = OpId::new();
        let (tx, mut rx) = oneshot::channel();
        // Registered, and its channel heard, before the enqueue, so the
        // result cannot come too early.
        let _waiting = self.waiters.register(&op_id.to_string(), tx);
        let _heard = (self.results)
            .watch(&done_channel(&self.prefix, b, &self.instance))
            .await;
        let ahead = match self.enqueue(b, &op, &op_id).await {
            Ok(n) => n,
            // A topology answer (MOVED…): Redis is up, so no breaker and no
            // direct path. The last try did not run, but an earlier one the
            // cluster client sent again (a dropped link, a timeout) may
            // have: the refusal is settled first, so a copy in the stream
            // never applies after it (or, applied already, is the answer).
            Err(e) if fault_of(&e) == Fault::Topology => {
                tracing::error!(error = %e, "enqueue misrouted; refusing the operation");
                let refused = CoordError::Lock(LockError::Misrouted(e.to_string()));
                return self.settle(&op, &op_id, refused).await;
            }
            Err(e) => {
                // The entry may be in the stream all the same (a lost
                // reply): the direct path applies it under its id, so the
                // copy applies once; and a failure is settled before it is
                // told, so the copy cannot apply after the answer.
                tracing::warn!(error = %e, "enqueue failed; taking the direct path");
                self.mark_unhealthy(b);
                return match self.direct.run_as(op.clone(), Some(&op_id)).await {
                    Ok(()) => Ok(()),
                    Err(e) => self.settle(&op, &op_id, e).await,
                };
            }
        };
        let deadline = Instant::now() + wait_timeout(self.wait, ahead);
        loop {
            let now = Instant::now();
            if now >= deadline {
                return self.settle(&op, &op_id, CoordError::Cancelled).await;
            }
            tokio::select! {
                outcome = &mut rx => {
                    if let Ok(o) = outcome {
                        return o.into_result();
                    }
                }
                _ = tokio::time::sleep(RESULT_POLL_EVERY.min(deadline - now)) => {}
            }
            if let Some(o) = read_result(&mut self.conn.clone(), &self.prefix, b, &op_id).await {
                return o.into_result();
            }
        }
    }

    async fn stats(&self) -> Option<QueueStats> {
        Some(self.figures().await)
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
