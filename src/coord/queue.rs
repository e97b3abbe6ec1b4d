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
//!   told on its own channel; the waiter re-reads the key every second in
//!   case a notice is lost.
//! - An operation that keeps failing goes to `filedock_queue_dlq`; write
//!   conflicts and an unreachable store are waited out, not counted.
//! - Redis unhealthy (checked at most once a second): the direct lock path.

use std::{
    collections::{HashMap, VecDeque},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use async_trait::async_trait;
use futures::StreamExt;
use rand::seq::SliceRandom;
use redis::{
    AsyncCommands, Client, Value,
    aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection},
    streams::{StreamAutoClaimOptions, StreamId, StreamReadOptions, StreamReadReply},
};
use tokio::{sync::oneshot, task::JoinHandle};
use tokio_util::sync::CancellationToken;

use super::{
    Applier, BUCKETS, CoordError, Coordinator, LockCoordinator, OpOutcome, Operation, QueueStats,
    bucket_of, wait_timeout,
};
use crate::{
    lock::{LockGuard, LockKey, Locks},
    meta::{Fence, MetaError},
    metrics::{Metrics, OutcomeLabel},
};

const GROUP: &str = "filedock";
/// Attempts before an operation is dead-lettered.
const MAX_ATTEMPTS: u32 = 5;
/// A bucket lease; renewed every third of it while the worker lives.
const LEASE_TTL: Duration = Duration::from_secs(3);
/// How long an instance counts as alive after its last heartbeat.
const MEMBER_TTL_MS: u64 = 5_000;

type Waiters = Arc<Mutex<HashMap<String, oneshot::Sender<OpOutcome>>>>;

pub struct RedisQueue {
    client: Client,
    conn: ConnectionManager,
    prefix: String,
    /// Unique consumer name of this process.
    instance: String,
    waiters: Waiters,
    /// Last health check: when, and whether Redis answered.
    health: Mutex<Option<(Instant, bool)>>,
    recent: Arc<Mutex<VecDeque<Done>>>,
    held: Arc<Mutex<usize>>,
    subscriber: JoinHandle<()>,
    /// Bucket leases.
    locks: Arc<Locks>,
    applier: Applier,
    /// Where operations go while Redis is unhealthy.
    direct: LockCoordinator,
    metrics: Arc<Metrics>,
}

/// One applied (or failed) operation, for the last-minute figures.
struct Done {
    at: Instant,
    wait_ms: f64,
    ok: bool,
}

impl Drop for RedisQueue {
    fn drop(&mut self) {
        self.subscriber.abort();
    }
}

fn now_ms() -> u64 {
    crate::lock::now_micros() / 1000
}

impl RedisQueue {
    pub fn connect(
        url: &str,
        prefix: &str,
        locks: Arc<Locks>,
        applier: Applier,
        metrics: Arc<Metrics>,
    ) -> anyhow::Result<Self> {
        let client = Client::open(url)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_millis(500)))
            .set_response_timeout(Some(Duration::from_secs(2)))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_millis(500));
        let conn = ConnectionManager::new_lazy_with_config(client.clone(), config)?;
        let instance = format!("filedock-{}", uuid::Uuid::new_v4().simple());
        let waiters: Waiters = Arc::default();
        let channel = format!("{prefix}filedock_queue_done:{instance}");
        let subscriber = tokio::spawn(listen(
            client.clone(),
            channel,
            conn.clone(),
            prefix.to_owned(),
            waiters.clone(),
        ));
        Ok(Self {
            client,
            conn,
            prefix: prefix.to_owned(),
            instance,
            waiters,
            health: Mutex::new(None),
            recent: Arc::default(),
            held: Arc::default(),
            subscriber,
            direct: LockCoordinator::new(locks.clone(), applier.clone()),
            locks,
            applier,
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

    fn members(&self) -> String {
        format!("{}filedock_queue_members", self.prefix)
    }

    /// The circuit breaker: Redis health, checked at most once a second.
    async fn healthy(&self) -> bool {
        if let Some((at, ok)) = *self.health.lock().unwrap()
            && at.elapsed() < Duration::from_secs(1)
        {
            return ok;
        }
        let ping = tokio::time::timeout(
            Duration::from_millis(500),
            self.conn.clone().ping::<String>(),
        )
        .await;
        let ok = matches!(ping, Ok(Ok(_)));
        *self.health.lock().unwrap() = Some((Instant::now(), ok));
        ok
    }

    fn mark_unhealthy(&self) {
        *self.health.lock().unwrap() = Some((Instant::now(), false));
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

    async fn enqueue(&self, op: &Operation, op_id: &str) -> redis::RedisResult<u64> {
        let b = bucket_of(&op.lock_key());
        let ahead = self.bucket_len(b).await.unwrap_or(0);
        let body = serde_json::to_string(op)
            .map_err(|e| redis::RedisError::from(std::io::Error::other(e)))?;
        let _: String = redis::cmd("XADD")
            .arg(Self::stream(&self.prefix, b))
            .arg("MAXLEN")
            .arg("~")
            .arg(100_000)
            .arg("*")
            .arg("op")
            .arg(body)
            .arg("id")
            .arg(op_id)
            .arg("reply")
            .arg(&self.instance)
            .arg("at")
            .arg(now_ms())
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(ahead)
    }

    /// Starts this instance's bucket workers; they stop with `shutdown`.
    pub fn spawn_workers(self: &Arc<Self>, shutdown: CancellationToken) -> JoinHandle<()> {
        tokio::spawn(manage(self.clone(), shutdown))
    }
}

/// Wakes local waiters when a worker (in any instance) publishes their result.
async fn listen(
    client: Client,
    channel: String,
    conn: ConnectionManager,
    prefix: String,
    waiters: Waiters,
) {
    loop {
        if let Ok(mut pubsub) = client.get_async_pubsub().await
            && pubsub.subscribe(&channel).await.is_ok()
        {
            let mut messages = pubsub.on_message();
            while let Some(msg) = messages.next().await {
                let Ok(op_id) = msg.get_payload::<String>() else {
                    continue;
                };
                if !waiters.lock().unwrap().contains_key(&op_id) {
                    continue;
                }
                // A result that cannot be read is not a success: the
                // waiter's own poll reads it again, or answers unknown.
                let Some(outcome) = read_result(&mut conn.clone(), &prefix, &op_id).await else {
                    continue;
                };
                if let Some(tx) = waiters.lock().unwrap().remove(&op_id) {
                    let _ = tx.send(outcome);
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn result_key(prefix: &str, op_id: &str) -> String {
    format!("{prefix}filedock_queue_result:{op_id}")
}

async fn read_result(conn: &mut ConnectionManager, prefix: &str, op_id: &str) -> Option<OpOutcome> {
    let raw: Option<String> = conn.get(result_key(prefix, op_id)).await.ok()?;
    serde_json::from_str(&raw?).ok()
}

/// Removes a waiter however its wait ends.
struct Waiting<'a> {
    waiters: &'a Waiters,
    op_id: &'a str,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.waiters.lock().unwrap().remove(self.op_id);
    }
}

#[async_trait]
impl Coordinator for RedisQueue {
    async fn run(&self, op: Operation) -> Result<(), CoordError> {
        if !self.healthy().await {
            return self.direct.run(op).await;
        }
        let op_id = uuid::Uuid::now_v7().to_string();
        let (tx, mut rx) = oneshot::channel();
        // Registered before the enqueue, so the result cannot come too early.
        self.waiters.lock().unwrap().insert(op_id.clone(), tx);
        let _waiting = Waiting {
            waiters: &self.waiters,
            op_id: &op_id,
        };
        let ahead = match self.enqueue(&op, &op_id).await {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!(error = %e, "enqueue failed; taking the direct path");
                self.mark_unhealthy();
                return self.direct.run(op).await;
            }
        };
        let deadline = Instant::now() + wait_timeout(ahead);
        loop {
            let now = Instant::now();
            if now >= deadline {
                // Still queued: it may be applied after this answer.
                return Err(CoordError::OutcomeUnknown(op.resource_path()));
            }
            tokio::select! {
                outcome = &mut rx => {
                    if let Ok(o) = outcome {
                        return o.into_result();
                    }
                }
                _ = tokio::time::sleep(Duration::from_secs(1).min(deadline - now)) => {}
            }
            if let Some(o) = read_result(&mut self.conn.clone(), &self.prefix, &op_id).await {
                return o.into_result();
            }
        }
    }

    async fn stats(&self) -> Option<QueueStats> {
        let mut length = 0;
        for b in 0..BUCKETS {
            length += self.bucket_len(b).await.unwrap_or(0);
        }
        let dead_letter_count: u64 = self.conn.clone().xlen(self.dlq()).await.unwrap_or(0);
        let recent = self.recent.lock().unwrap();
        let window = recent
            .front()
            .map_or(1.0, |d| d.at.elapsed().as_secs_f64().clamp(1.0, 60.0));
        let n = recent.len() as f64;
        Some(
            QueueStats {
                length,
                processing_rate: n / window,
                average_wait_ms: if n > 0.0 {
                    recent.iter().map(|d| d.wait_ms).sum::<f64>() / n
                } else {
                    0.0
                },
                failure_rate: if n > 0.0 {
                    recent.iter().filter(|d| !d.ok).count() as f64 / n
                } else {
                    0.0
                },
                dead_letter_count,
                buckets_held: *self.held.lock().unwrap(),
                warnings: Vec::new(),
            }
            .with_warnings(),
        )
    }
}

/// Keeps this instance's fair share of buckets leased, each with a worker.
async fn manage(queue: Arc<RedisQueue>, shutdown: CancellationToken) {
    let mut workers: HashMap<u32, (JoinHandle<()>, CancellationToken)> = HashMap::new();
    let mut last_report = Instant::now();
    loop {
        workers.retain(|_, (h, _)| !h.is_finished());
        let share = match heartbeat(&queue).await {
            Ok(alive) => BUCKETS.div_ceil(alive.max(1)) as usize,
            Err(_) => 0, // Redis is down: hold nothing new; running workers stop on lease loss
        };
        let mut order: Vec<u32> = (0..BUCKETS).filter(|b| !workers.contains_key(b)).collect();
        order.shuffle(&mut rand::rng());
        for b in order {
            if workers.len() >= share {
                break;
            }
            let key = LockKey::queue_bucket(b);
            if let Ok(Some(guard)) = queue.locks.try_lease(&key, LEASE_TTL).await {
                let stop = shutdown.child_token();
                let handle = tokio::spawn(work(queue.clone(), b, guard, stop.clone()));
                workers.insert(b, (handle, stop));
            }
        }
        // Give back what is over our share (another instance joined).
        let extra: Vec<u32> = workers.keys().copied().skip(share).collect();
        for b in extra {
            if let Some((_, stop)) = workers.get(&b) {
                stop.cancel();
            }
        }
        *queue.held.lock().unwrap() = workers.len();
        if last_report.elapsed() > Duration::from_secs(10) {
            last_report = Instant::now();
            report(&queue).await;
        }
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
        }
    }
    for (_, (handle, stop)) in workers {
        stop.cancel();
        let _ = handle.await;
    }
    let _: Result<i64, _> = queue
        .conn
        .clone()
        .zrem(queue.members(), &queue.instance)
        .await;
}

/// Announces this instance and counts the live ones.
async fn heartbeat(queue: &RedisQueue) -> redis::RedisResult<u32> {
    let now = now_ms();
    let mut conn = queue.conn.clone();
    let (_, _, alive): (i64, i64, u32) = redis::pipe()
        .zadd(queue.members(), &queue.instance, now)
        .zrembyscore(queue.members(), 0, now.saturating_sub(MEMBER_TTL_MS))
        .zcard(queue.members())
        .query_async(&mut conn)
        .await?;
    Ok(alive)
}

/// Publishes the queue figures as metrics and logs the seed's warnings.
async fn report(queue: &RedisQueue) {
    if let Some(stats) = queue.stats().await {
        queue.metrics.queue_length.set(stats.length as i64);
        queue
            .metrics
            .queue_dead_letters
            .set(stats.dead_letter_count as i64);
        for w in &stats.warnings {
            tracing::warn!(warning = %w, "queue health");
        }
    }
}

enum Step {
    Next,
    /// The lease is gone: stop without acknowledging; the next owner redoes it.
    Stop,
}

/// Consumes bucket `b` in order while the lease holds.
async fn work(queue: Arc<RedisQueue>, b: u32, guard: LockGuard, stop: CancellationToken) {
    let lost = guard.lost();
    let stream = RedisQueue::stream(&queue.prefix, b);
    let worker = Worker {
        queue: &queue,
        stream: &stream,
        lost: &lost,
        fence: Fence {
            slot: format!("queue{b}"),
            token: guard.fence() as i64,
            pinned: true,
        },
    };
    if let Err(e) = worker.consume(&stop).await {
        tracing::warn!(bucket = b, error = %e, "queue worker stopped");
    }
    guard.release().await;
}

impl Worker<'_> {
    async fn consume(&self, stop: &CancellationToken) -> redis::RedisResult<()> {
        let (queue, stream) = (self.queue, self.stream);
        // A connection of its own: XREADGROUP blocks it.
        let mut conn: MultiplexedConnection =
            queue.client.get_multiplexed_async_connection().await?;
        let created: redis::RedisResult<()> = conn.xgroup_create_mkstream(stream, GROUP, "0").await;
        if let Err(e) = created
            && e.code() != Some("BUSYGROUP")
        {
            return Err(e);
        }
        // First what earlier owners left pending, in order.
        let mut start = "0-0".to_owned();
        loop {
            let claimed: redis::streams::StreamAutoClaimReply = conn
                .xautoclaim_options(
                    stream,
                    GROUP,
                    &queue.instance,
                    0,
                    &start,
                    StreamAutoClaimOptions::default().count(64),
                )
                .await?;
            let entries: Vec<_> = claimed.claimed.iter().map(Entry::decode).collect();
            if let Step::Stop = self.handle(&mut conn, &entries).await {
                return Ok(());
            }
            if claimed.next_stream_id == "0-0" || claimed.claimed.is_empty() {
                break;
            }
            start = claimed.next_stream_id;
        }
        let opts = StreamReadOptions::default()
            .group(GROUP, &queue.instance)
            .count(16)
            .block(500);
        while !stop.is_cancelled() && !self.lost.is_cancelled() {
            let reply: StreamReadReply = conn.xread_options(&[stream], &[">"], &opts).await?;
            let entries: Vec<_> = reply
                .keys
                .iter()
                .flat_map(|k| &k.ids)
                .map(Entry::decode)
                .collect();
            if let Step::Stop = self.handle(&mut conn, &entries).await {
                return Ok(());
            }
        }
        Ok(())
    }

    /// Applies what one read returned, in order: as a group if it can.
    async fn handle(&self, conn: &mut MultiplexedConnection, entries: &[Entry<'_>]) -> Step {
        if entries.len() > 1
            && let Some(step) = self.process_group(conn, entries).await
        {
            return step;
        }
        for entry in entries {
            if let Step::Stop = self.process(conn, entry).await {
                return Step::Stop;
            }
        }
        Step::Next
    }
}

/// A stream entry, decoded.
struct Entry<'a> {
    raw: &'a StreamId,
    op_id: String,
    reply_to: Option<String>,
    enqueued_ms: u64,
    op: Result<Operation, String>,
}

impl<'a> Entry<'a> {
    fn decode(raw: &'a StreamId) -> Self {
        Self {
            raw,
            op_id: raw.get("id").unwrap_or_else(|| raw.id.clone()),
            reply_to: raw.get("reply"),
            enqueued_ms: raw.get("at").unwrap_or_else(now_ms),
            op: raw
                .get::<String>("op")
                .ok_or_else(|| "no op field".to_owned())
                .and_then(|r| serde_json::from_str(&r).map_err(|e| e.to_string())),
        }
    }
}

/// What the worker holds while it consumes bucket `b`.
struct Worker<'a> {
    queue: &'a RedisQueue,
    stream: &'a str,
    lost: &'a CancellationToken,
    fence: Fence,
}

impl Worker<'_> {
    /// Applies `entries` in one transaction (a group commit): one commit for
    /// many operations is what lets a hot key go faster than one transaction
    /// at a time. `None` if the group was refused (an operation that fails,
    /// or one applied before): the caller applies them one at a time, so each
    /// gets its own answer.
    async fn process_group(
        &self,
        conn: &mut MultiplexedConnection,
        entries: &[Entry<'_>],
    ) -> Option<Step> {
        let ops = entries
            .iter()
            .map(|e| Some((e.op.clone().ok()?, e.op_id.clone())))
            .collect::<Option<Vec<_>>>()?;
        let mut transient = 0u32;
        loop {
            if self.lost.is_cancelled() {
                return Some(Step::Stop);
            }
            match self.queue.applier.apply_group(&ops, &self.fence).await {
                Ok(()) => break,
                Err(MetaError::StaleFence) => return Some(Step::Stop),
                Err(
                    e @ (MetaError::WriteConflict
                    | MetaError::Transient(_)
                    | MetaError::Unavailable(_)
                    | MetaError::OutcomeUnknown(_)),
                ) => {
                    transient += 1;
                    tracing::warn!(error = %e, "queued operations wait for the metadata store");
                    tokio::time::sleep(Duration::from_millis(100 * u64::from(transient.min(10))))
                        .await;
                }
                Err(e) => {
                    tracing::debug!(error = %e, n = ops.len(), "group refused; applying one at a time");
                    return None;
                }
            }
        }
        self.queue.metrics.queue_grouped.inc_by(ops.len() as u64);
        let ok = OpOutcome::ok();
        let done: Vec<_> = entries.iter().map(|e| (e, &ok)).collect();
        self.deliver(conn, &done).await;
        Some(Step::Next)
    }

    /// Applies one entry, retrying, dead-lettering what keeps failing.
    async fn process(&self, conn: &mut MultiplexedConnection, entry: &Entry<'_>) -> Step {
        let (mut attempts, mut transient) = (0, 0u32);
        let outcome = loop {
            if self.lost.is_cancelled() {
                return Step::Stop;
            }
            let op_id = entry.op_id.as_str();
            let error = match &entry.op {
                Err(e) => format!("undecodable operation: {e}"),
                Ok(op) => {
                    let applied =
                        self.queue
                            .applier
                            .apply(op, Some(self.fence.clone()), Some(op_id));
                    match applied.await {
                        Ok(()) => break OpOutcome::ok(),
                        Err(MetaError::NotFound) => break OpOutcome::not_found(),
                        Err(MetaError::StaleFence) => return Step::Stop,
                        // Transient: a conflicting transaction (perhaps left open by a
                        // process that died mid-commit, until it is ended), the
                        // store being down, or a commit whose answer was lost (the
                        // retry finds its id in `processed_ops` if it applied).
                        // Order forbids skipping ahead, and these are not the
                        // operation's fault: wait and try again.
                        Err(
                            e @ (MetaError::WriteConflict
                            | MetaError::Transient(_)
                            | MetaError::Unavailable(_)
                            | MetaError::OutcomeUnknown(_)),
                        ) => {
                            transient += 1;
                            tracing::warn!(op_id, error = %e, "queued operation waits for the metadata store");
                            let pause = Duration::from_millis(100 * u64::from(transient.min(10)));
                            tokio::time::sleep(pause).await;
                            continue;
                        }
                        Err(e) => e.to_string(),
                    }
                }
            };
            attempts += 1;
            if attempts >= MAX_ATTEMPTS || entry.op.is_err() {
                dead_letter(self.queue, conn, entry.raw, &error, attempts).await;
                let message = format!(
                    "the operation failed {attempts} times and was moved to the dead-letter queue: {error}"
                );
                break OpOutcome {
                    code: Some("dead_lettered".into()),
                    message: Some(message),
                };
            }
            tracing::warn!(
                op_id,
                attempt = attempts,
                error,
                "queued operation failed; retrying"
            );
            tokio::time::sleep(Duration::from_millis(100 * u64::from(attempts))).await;
        };
        self.deliver(conn, &[(entry, &outcome)]).await;
        Step::Next
    }

    /// Stores each result, tells its waiter's instance, acknowledges the
    /// entries (one round trip), and counts them.
    async fn deliver(&self, conn: &mut MultiplexedConnection, done: &[(&Entry<'_>, &OpOutcome)]) {
        let prefix = &self.queue.prefix;
        let mut pipe = redis::pipe();
        for (entry, outcome) in done {
            let body = serde_json::to_string(outcome).unwrap_or_default();
            pipe.set_ex(result_key(prefix, &entry.op_id), body, 300)
                .ignore();
            if let Some(instance) = &entry.reply_to {
                pipe.publish(
                    format!("{prefix}filedock_queue_done:{instance}"),
                    &entry.op_id,
                )
                .ignore();
            }
            pipe.xack(self.stream, GROUP, &[&entry.raw.id]).ignore();
        }
        let r: redis::RedisResult<Value> = pipe.query_async(conn).await;
        if let Err(e) = r {
            tracing::warn!(error = %e, "could not deliver queued operations' results");
        }
        let mut recent = self.queue.recent.lock().unwrap();
        for (entry, outcome) in done {
            let ok = outcome.code.is_none();
            let label = outcome.code.as_deref().unwrap_or("applied");
            self.queue
                .metrics
                .queue_processed
                .get_or_create(&OutcomeLabel {
                    outcome: label.into(),
                })
                .inc();
            recent.push_back(Done {
                at: Instant::now(),
                wait_ms: now_ms().saturating_sub(entry.enqueued_ms) as f64,
                ok,
            });
        }
        while recent
            .front()
            .is_some_and(|d| d.at.elapsed() > Duration::from_secs(60))
            || recent.len() > 100_000
        {
            recent.pop_front();
        }
    }
}

async fn dead_letter(
    queue: &RedisQueue,
    conn: &mut MultiplexedConnection,
    entry: &StreamId,
    error: &str,
    attempts: u32,
) {
    let op: String = entry.get("op").unwrap_or_default();
    let id: String = entry.get("id").unwrap_or_default();
    let r: redis::RedisResult<String> = redis::cmd("XADD")
        .arg(queue.dlq())
        .arg("*")
        .arg("op")
        .arg(op)
        .arg("id")
        .arg(&id)
        .arg("error")
        .arg(error)
        .arg("attempts")
        .arg(attempts)
        .arg("entry")
        .arg(&entry.id)
        .query_async(conn)
        .await;
    tracing::error!(
        op_id = id,
        error,
        attempts,
        dead_lettered = r.is_ok(),
        "queued operation moved to the dead-letter queue"
    );
}
