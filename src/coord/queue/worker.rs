//! A bucket worker: consumes one bucket in order while it holds the
//! bucket's lease (`manager.rs` hands out the leases).

use std::sync::Arc;

use async_trait::async_trait;
use redis::{
    AsyncCommands, Value,
    streams::{StreamAutoClaimOptions, StreamId, StreamReadOptions},
};
use tokio_util::sync::CancellationToken;

use super::{
    GROUP, RedisQueue,
    apply::{Answered, Applying, Delivered, Sink, Step},
    done_channel, now_ms, result_key,
};
use crate::{
    lock::LockGuard,
    meta::Fence,
    redis_link::DedicatedConn,
    vocab::OpId,
    worker::{self, WorkerState},
};

/// Entries read or claimed at once (a group commit applies at most this many).
const READ_BATCH: usize = 16;
/// How long a read blocks waiting for entries, in ms (the worker checks its
/// stop signal and lease between reads).
const READ_BLOCK_MS: usize = 500;
/// How long an operation's result stays readable, in seconds.
const RESULT_TTL_SECS: u64 = 300;

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
        applying: Applying {
            applier: &queue.front.applier,
            metrics: &queue.metrics,
            recent: &queue.recent,
            fence: Fence::of_queue_bucket(b, guard.fence()),
            lost: &lost,
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
        while !stop.is_cancelled() && !self.applying.lost.is_cancelled() {
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
            let entries: Vec<_> = claimed.claimed.iter().map(decode).collect();
            let mut sink = StreamSink {
                consumer: self,
                conn: &mut *conn,
            };
            if let Step::Stop = self.applying.handle(&mut sink, &entries).await {
                return Ok(Step::Stop);
            }
            if claimed.next_stream_id == "0-0" || claimed.claimed.is_empty() {
                return Ok(Step::Next);
            }
            start = claimed.next_stream_id;
        }
    }
}

/// Decodes a stream entry.
fn decode(raw: &StreamId) -> Delivered<&StreamId> {
    let op_id = raw.get::<String>("id").and_then(|id| OpId::parse(&id));
    let op = match op_id {
        None => Err("no operation id".to_owned()),
        Some(_) => raw
            .get::<String>("op")
            .ok_or_else(|| "no op field".to_owned())
            .and_then(|r| serde_json::from_str(&r).map_err(|e| e.to_string())),
    };
    Delivered {
        handle: raw,
        op_id,
        reply_to: raw.get("reply"),
        enqueued_ms: raw.get("at").unwrap_or_else(now_ms),
        op,
    }
}

/// What the worker holds while it consumes bucket `b`.
struct Consumer<'a> {
    queue: &'a RedisQueue,
    /// The bucket, and its stream.
    bucket: u32,
    stream: &'a str,
    applying: Applying<'a>,
}

/// Answers and acknowledges on the bucket's stream.
struct StreamSink<'c, 'a> {
    consumer: &'c Consumer<'a>,
    conn: &'c mut DedicatedConn,
}

#[async_trait]
impl<'r> Sink<&'r StreamId> for StreamSink<'_, '_> {
    /// Copies each entry given up on to the dead-letter stream; then, in
    /// one round trip, stores each result, tells its waiter's instance, and
    /// acknowledges the entries.
    async fn deliver(&mut self, done: &[Answered<'_, &'r StreamId>]) -> Step {
        let (queue, b) = (self.consumer.queue, self.consumer.bucket);
        for a in done {
            if let Some((error, attempts)) = a.dead {
                let raw = a.delivered.handle;
                queue.dead_letter(self.conn, raw, error, attempts).await;
            }
        }
        let prefix = &queue.prefix;
        // One slot on a cluster: the result keys, the channels and the
        // stream all carry the bucket's hash tag.
        let publish = queue.link.publish_command();
        let mut pipe = redis::pipe();
        for a in done {
            let entry = a.delivered;
            if let Some(op_id) = &entry.op_id {
                let body = serde_json::to_string(a.outcome).unwrap_or_default();
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
            pipe.xack(self.consumer.stream, GROUP, &[&entry.handle.id])
                .ignore();
        }
        let r: redis::RedisResult<Value> = pipe.query_async(self.conn).await;
        // Not acknowledged: the entries stay pending, and the next claim
        // answers them again from the store (a lost result is re-read).
        if let Err(e) = r {
            tracing::warn!(error = %e, "could not deliver queued operations' results");
        }
        Step::Next
    }
}
