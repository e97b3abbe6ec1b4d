//! A bucket worker: consumes one bucket in order while it holds the
//! bucket's lease (`manager.rs` hands out the leases).

use std::{sync::Arc, time::Duration};

use async_trait::async_trait;
use redis::{
    AsyncCommands, Value,
    streams::{StreamAutoClaimOptions, StreamId, StreamReadOptions},
};
use tokio_util::sync::CancellationToken;

use super::{GROUP, RedisQueue, done_channel, now_ms, result_key};
use crate::{
    coord::OpOutcome,
    lock::LockGuard,
    meta::{Fence, MetaError, Refusal, Settled},
    metrics::OutcomeLabel,
    redis_link::DedicatedConn,
    vocab::{OpId, Operation},
    worker::{self, WorkerState},
};

/// Attempts before an operation is dead-lettered.
const MAX_ATTEMPTS: u32 = 5;

/// Entries read or claimed at once (a group commit applies at most this many).
const READ_BATCH: usize = 16;
/// How long a read blocks waiting for entries, in ms (the worker checks its
/// stop signal and lease between reads).
const READ_BLOCK_MS: usize = 500;
/// How long an operation's result stays readable, in seconds.
const RESULT_TTL_SECS: u64 = 300;
/// The pause before a retry grows by this much each time.
const RETRY_STEP: Duration = Duration::from_millis(100);

/// Whether a refusal is the store's and not the operation's: a conflicting
/// transaction (perhaps left open by a process that died mid-commit, until
/// it is ended), the store being down, or a commit whose answer was lost.
/// Queued operations wait these out rather than count them as failures.
fn waits_for_store(e: &MetaError) -> bool {
    matches!(
        e,
        MetaError::WriteConflict
            | MetaError::Transient(_)
            | MetaError::Unavailable(_)
            | MetaError::OutcomeUnknown(_)
    )
}

/// The pause before the `n`th try at something the store refused for a
/// reason not the operation's (it grows, and stops growing at the tenth).
fn transient_pause(n: u32) -> Duration {
    RETRY_STEP * n.min(10)
}

pub(super) enum Step {
    Next,
    /// The lease is gone: stop without acknowledging; the next owner redoes it.
    Stop,
}

/// Consumes bucket `b` in order while the lease holds.
pub(super) struct BucketWorker {
    pub(super) queue: Arc<RedisQueue>,
    pub(super) b: u32,
    /// The bucket's lease, until the work is done.
    pub(super) guard: Option<LockGuard>,
}

#[async_trait]
impl worker::Worker for BucketWorker {
    fn name(&self) -> String {
        format!("queue bucket {}", self.b)
    }

    fn status(&self) -> String {
        match self.guard {
            Some(_) => "consuming".into(),
            None => "done".into(),
        }
    }

    /// One step that lasts while the lease holds and `stop` has not fired.
    async fn work(&mut self, stop: &CancellationToken) -> WorkerState {
        if let Some(guard) = self.guard.take() {
            consume_bucket(&self.queue, self.b, guard, stop).await;
        }
        WorkerState::Done
    }
}

async fn consume_bucket(queue: &RedisQueue, b: u32, guard: LockGuard, stop: &CancellationToken) {
    let lost = guard.lost();
    let stream = RedisQueue::stream(&queue.prefix, b);
    let consumer = Consumer {
        queue,
        bucket: b,
        stream: &stream,
        lost: &lost,
        fence: Fence {
            slot: format!("queue{b}"),
            token: guard.fence() as i64,
            pinned: true,
        },
    };
    if let Err(e) = consumer.consume(stop).await {
        tracing::warn!(bucket = b, error = %e, "queue worker stopped");
    }
    guard.release().await;
}

impl Consumer<'_> {
    async fn consume(&self, stop: &CancellationToken) -> redis::RedisResult<()> {
        let (queue, stream) = (self.queue, self.stream);
        // A connection of its own: XREADGROUP blocks it.
        let mut conn = queue.link.dedicated().await?;
        let created: redis::RedisResult<()> = conn.xgroup_create_mkstream(stream, GROUP, "0").await;
        if let Err(e) = created
            && e.code() != Some("BUSYGROUP")
        {
            return Err(e);
        }
        let opts = StreamReadOptions::default()
            .group(GROUP, &queue.instance)
            .count(READ_BATCH)
            .block(READ_BLOCK_MS);
        while !stop.is_cancelled() && !self.lost.is_cancelled() {
            // Everything pending in the group, in stream order: what the last
            // read delivered, what earlier owners left, and what was
            // delivered to a worker that had lost its lease without knowing
            // (paused). Applying them all in id order keeps the stream's order.
            if let Step::Stop = self.claim_pending(&mut conn).await? {
                return Ok(());
            }
            // Waits for new entries and takes them into the pending list.
            let _: Value = conn.xread_options(&[stream], &[">"], &opts).await?;
        }
        Ok(())
    }

    /// Takes over and applies every entry pending in the group, oldest first.
    async fn claim_pending(&self, conn: &mut DedicatedConn) -> redis::RedisResult<Step> {
        let mut start = "0-0".to_owned();
        loop {
            let claimed: redis::streams::StreamAutoClaimReply = conn
                .xautoclaim_options(
                    self.stream,
                    GROUP,
                    &self.queue.instance,
                    0,
                    &start,
                    StreamAutoClaimOptions::default().count(READ_BATCH),
                )
                .await?;
            let entries: Vec<_> = claimed.claimed.iter().map(Entry::decode).collect();
            if let Step::Stop = self.handle(conn, &entries).await {
                return Ok(Step::Stop);
            }
            if claimed.next_stream_id == "0-0" || claimed.claimed.is_empty() {
                return Ok(Step::Next);
            }
            start = claimed.next_stream_id;
        }
    }

    /// Applies what one read returned, in order: as a group if it can.
    async fn handle(&self, conn: &mut DedicatedConn, entries: &[Entry<'_>]) -> Step {
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
    /// `None` for an entry filedock did not write (no valid operation id):
    /// it is undecodable, and no waiter waits for it.
    op_id: Option<OpId>,
    reply_to: Option<String>,
    enqueued_ms: u64,
    op: Result<Operation, String>,
}

impl<'a> Entry<'a> {
    fn decode(raw: &'a StreamId) -> Self {
        let op_id = raw.get::<String>("id").and_then(|id| OpId::parse(&id));
        let op = match op_id {
            None => Err("no operation id".to_owned()),
            Some(_) => raw
                .get::<String>("op")
                .ok_or_else(|| "no op field".to_owned())
                .and_then(|r| serde_json::from_str(&r).map_err(|e| e.to_string())),
        };
        Self {
            raw,
            op_id,
            reply_to: raw.get("reply"),
            enqueued_ms: raw.get("at").unwrap_or_else(now_ms),
            op,
        }
    }
}

/// What the worker holds while it consumes bucket `b`.
struct Consumer<'a> {
    queue: &'a RedisQueue,
    /// The bucket, and its stream.
    bucket: u32,
    stream: &'a str,
    lost: &'a CancellationToken,
    fence: Fence,
}

impl Consumer<'_> {
    /// Applies `entries` in one transaction (a group commit): one commit for
    /// many operations is what lets a hot key go faster than one transaction
    /// at a time. `None` if the group was refused (an operation that fails,
    /// or one applied before): the caller applies them one at a time, so each
    /// gets its own answer.
    async fn process_group(&self, conn: &mut DedicatedConn, entries: &[Entry<'_>]) -> Option<Step> {
        let ops = entries
            .iter()
            .map(|e| Some((e.op.clone().ok()?, e.op_id?)))
            .collect::<Option<Vec<_>>>()?;
        let mut transient = 0u32;
        loop {
            if self.lost.is_cancelled() {
                return Some(Step::Stop);
            }
            match self.queue.applier.apply_group(&ops, &self.fence).await {
                Ok(()) => break,
                Err(MetaError::StaleFence) => return Some(Step::Stop),
                Err(e) if waits_for_store(&e) => {
                    transient += 1;
                    tracing::warn!(error = %e, "queued operations wait for the metadata store");
                    tokio::time::sleep(transient_pause(transient)).await;
                }
                Err(e) => {
                    tracing::debug!(error = %e, n = ops.len(), "group refused; applying one at a time");
                    return None;
                }
            }
        }
        self.queue.metrics.queue_grouped.inc_by(ops.len() as u64);
        let ok = OpOutcome::Applied;
        let done: Vec<_> = entries.iter().map(|e| (e, &ok)).collect();
        self.deliver(conn, &done).await;
        Some(Step::Next)
    }

    /// Applies one entry, retrying, dead-lettering what keeps failing.
    async fn process(&self, conn: &mut DedicatedConn, entry: &Entry<'_>) -> Step {
        let (mut attempts, mut transient) = (0, 0u32);
        let outcome = loop {
            if self.lost.is_cancelled() {
                return Step::Stop;
            }
            let op_id = entry.op_id.as_ref();
            let error = match &entry.op {
                Err(e) => format!("undecodable operation: {e}"),
                Ok(op) => {
                    let applied = self
                        .queue
                        .applier
                        .apply(op, Some(self.fence.clone()), op_id);
                    match applied.await {
                        Ok(()) => break OpOutcome::Applied,
                        // Settled too: the answer is 404, and a redelivery
                        // (its acknowledgement lost with a failed-over
                        // master) must not apply once the target exists.
                        Err(MetaError::NotFound) => {
                            match self.settle(op_id, Refusal::NotFound).await {
                                Some(Settled::Now) => break OpOutcome::NotFound,
                                Some(Settled::Applied) => break OpOutcome::Applied,
                                Some(Settled::Refused(why)) => break why.into(),
                                None => continue,
                            }
                        }
                        // Refused now, but room may be made later: settled so
                        // that a redelivery never applies what was answered
                        // refused (or answered applied if one already did).
                        Err(MetaError::ContainerFull(max)) => {
                            match self.settle(op_id, Refusal::ContainerFull(max)).await {
                                Some(Settled::Now) => break OpOutcome::ContainerFull(max),
                                Some(Settled::Applied) => break OpOutcome::Applied,
                                Some(Settled::Refused(why)) => break why.into(),
                                None => continue,
                            }
                        }
                        // Settled before (refused, dead-lettered or cancelled,
                        // then redelivered): the same answer again.
                        Err(MetaError::Refused(why)) => break why.into(),
                        Err(MetaError::StaleFence) => return Step::Stop,
                        // Transient: a conflicting transaction (perhaps left open by a
                        // process that died mid-commit, until it is ended), the
                        // store being down, or a commit whose answer was lost (the
                        // retry finds its id in `processed_ops` if it applied).
                        // Order forbids skipping ahead, and these are not the
                        // operation's fault: wait and try again.
                        Err(e) if waits_for_store(&e) => {
                            transient += 1;
                            tracing::warn!(?op_id, error = %e, "queued operation waits for the metadata store");
                            tokio::time::sleep(transient_pause(transient)).await;
                            continue;
                        }
                        Err(e) => e.to_string(),
                    }
                }
            };
            attempts += 1;
            if attempts >= MAX_ATTEMPTS || entry.op.is_err() {
                // Given up on: settled first, so that the answer stays true
                // (another worker with the same entry may have applied it).
                match self.settle(op_id, Refusal::DeadLettered).await {
                    Some(Settled::Now) => {}
                    Some(Settled::Applied) => break OpOutcome::Applied,
                    Some(Settled::Refused(why)) => break why.into(),
                    None => continue,
                }
                self.queue
                    .dead_letter(conn, entry.raw, &error, attempts)
                    .await;
                let message = format!(
                    "the operation failed {attempts} times and was moved to the dead-letter queue: {error}"
                );
                break OpOutcome::DeadLettered(message);
            }
            tracing::warn!(
                ?op_id,
                attempt = attempts,
                error,
                "queued operation failed; retrying"
            );
            tokio::time::sleep(RETRY_STEP * attempts).await;
        };
        self.deliver(conn, &[(entry, &outcome)]).await;
        Step::Next
    }

    /// Settles `op_id` unapplied for `why` (see
    /// [`crate::coord::Applier::cancel`]); `None` (after a pause) while the
    /// store cannot say. An entry without an id is no operation of
    /// filedock's: nothing applies it.
    async fn settle(&self, op_id: Option<&OpId>, why: Refusal) -> Option<Settled> {
        let Some(id) = op_id else {
            return Some(Settled::Now);
        };
        match self.queue.applier.cancel(id, why).await {
            Ok(settled) => Some(settled),
            Err(e) => {
                tracing::warn!(?op_id, error = %e, "cannot settle a failing operation yet");
                tokio::time::sleep(RETRY_STEP).await;
                None
            }
        }
    }

    /// Stores each result, tells its waiter's instance, acknowledges the
    /// entries (one round trip), and counts them.
    async fn deliver(&self, conn: &mut DedicatedConn, done: &[(&Entry<'_>, &OpOutcome)]) {
        let (prefix, b) = (&self.queue.prefix, self.bucket);
        // One slot on a cluster: the result keys, the channels and the
        // stream all carry the bucket's hash tag.
        let publish = self.queue.link.publish_command();
        let mut pipe = redis::pipe();
        for (entry, outcome) in done {
            if let Some(op_id) = &entry.op_id {
                let body = serde_json::to_string(outcome).unwrap_or_default();
                pipe.set_ex(result_key(prefix, b, op_id), body, RESULT_TTL_SECS)
                    .ignore();
                if let Some(instance) = &entry.reply_to {
                    let channel = done_channel(prefix, b, instance);
                    pipe.cmd(publish)
                        .arg(channel)
                        .arg(op_id.to_string())
                        .ignore();
                }
            }
            pipe.xack(self.stream, GROUP, &[&entry.raw.id]).ignore();
        }
        let r: redis::RedisResult<Value> = pipe.query_async(conn).await;
        if let Err(e) = r {
            tracing::warn!(error = %e, "could not deliver queued operations' results");
        }
        for (_, outcome) in done {
            let label = outcome.label();
            self.queue
                .metrics
                .queue_processed
                .get_or_create(&OutcomeLabel {
                    outcome: label.into(),
                })
                .inc();
        }
        self.queue
            .recent
            .record(done.iter().map(|(entry, outcome)| {
                let wait_ms = now_ms().saturating_sub(entry.enqueued_ms) as f64;
                (wait_ms, **outcome == OpOutcome::Applied)
            }));
    }
}
