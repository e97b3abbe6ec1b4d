//! A bucket's consumer: one per bucket on every instance; the broker
//! delivers to one of them at a time (single active consumer). The active
//! one takes the bucket's lease before it applies, applies what one
//! delivery batch holds (up to the prefetch) as a group, answers each
//! waiter by its reply address, and acknowledges, or rejects to the dead
//! letters, only then.

use std::{sync::Arc, sync::atomic::Ordering, time::Duration};

use async_trait::async_trait;
use futures::{FutureExt, StreamExt};
use lapin::{
    BasicProperties, Channel, Connection,
    message::Delivery,
    options::{BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions},
    types::{AMQPValue, FieldTable},
};
use tokio_util::sync::CancellationToken;

use super::{RabbitQueue, live::Live};
use crate::{
    coord::OpOutcome,
    coord::queue::{
        apply::{Answered, Applying, Delivered, Sink, Step},
        now_ms,
    },
    lock::{LockGuard, LockKey},
    meta::Fence,
    vocab::OpId,
};

/// Deliveries a consumer holds unacknowledged (a group commit applies at
/// most this many).
const PREFETCH: u16 = 16;
/// The bucket's lease, renewed every third of it while held.
const LEASE_TTL: Duration = Duration::from_secs(3);
/// How often the active consumer asks for a lease another holds (one that
/// lost the bucket and has not let go yet, or died holding it).
const LEASE_RETRY: Duration = Duration::from_millis(100);
/// How long an answer may wait to be written (a connection an alarm
/// blocked writes nothing) before the consumer goes on without it.
const ANSWER_WITHIN: Duration = Duration::from_secs(1);

/// Consumes bucket `b` on `live` until `stop` fires, its channel closes, or
/// it can no longer apply (its lease lost): then it closes its channel, so
/// what it holds unacknowledged goes back to the queue, in order, for the
/// next consumer, and releases the lease after.
pub(super) async fn consume(
    queue: Arc<RabbitQueue>,
    live: Arc<Live>,
    b: u32,
    stop: CancellationToken,
) {
    let channel = match live.conn.create_channel().await {
        Ok(c) => c,
        Err(e) => {
            tracing::debug!(bucket = b, error = %e, "cannot open a consumer's channel");
            return;
        }
    };
    let mut lease = None;
    if let Err(e) = run(&queue, &live, &channel, b, &stop, &mut lease).await {
        tracing::debug!(bucket = b, error = %e, "bucket consumer stopped");
    }
    let _ = channel.close(200, "consumer stopped".into()).await;
    if let Some(guard) = lease {
        queue.held.fetch_sub(1, Ordering::Relaxed);
        guard.release().await;
    }
}

async fn run(
    queue: &RabbitQueue,
    live: &Live,
    channel: &Channel,
    b: u32,
    stop: &CancellationToken,
    lease: &mut Option<LockGuard>,
) -> lapin::Result<()> {
    // Declared again: a queue deleted since the link was made comes back.
    queue.declare_bucket(channel, b).await?;
    channel
        .basic_qos(PREFETCH, BasicQosOptions::default())
        .await?;
    let name = RabbitQueue::queue_name(&queue.prefix, b);
    let tag = format!("{}-{b}", queue.instance);
    let mut deliveries = channel
        .basic_consume(
            name.as_str().into(),
            tag.as_str().into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    loop {
        let first = tokio::select! {
            _ = stop.cancelled() => return Ok(()),
            next = deliveries.next() => next,
        };
        let mut batch = match first {
            Some(d) => vec![d?],
            None => return Ok(()),
        };
        // What else has arrived: one group.
        while batch.len() < PREFETCH as usize {
            match deliveries.next().now_or_never() {
                Some(Some(d)) => batch.push(d?),
                _ => break,
            }
        }
        // The broker made this consumer the bucket's: the lease first (the
        // one before may not have let go yet), then its fence on each write.
        if lease.as_ref().is_none_or(|g| g.lost().is_cancelled()) {
            if let Some(old) = lease.take() {
                queue.held.fetch_sub(1, Ordering::Relaxed);
                old.release().await;
            }
            match take_lease(queue, b, stop).await {
                Some(g) => {
                    queue.held.fetch_add(1, Ordering::Relaxed);
                    *lease = Some(g);
                }
                None => return Ok(()),
            }
        }
        let Some(guard) = lease.as_ref() else {
            return Ok(());
        };
        let lost = guard.lost();
        let applying = Applying {
            applier: &queue.front.applier,
            metrics: &queue.metrics,
            recent: &queue.recent,
            fence: Fence::of_queue_bucket(b, guard.fence()),
            lost: &lost,
        };
        let entries: Vec<_> = batch.into_iter().map(decode).collect();
        let mut sink = DeliverySink {
            answer: &live.answer,
            publisher: &live.publisher,
        };
        if let Step::Stop = applying.handle(&mut sink, &entries).await {
            return Ok(());
        }
    }
}

/// The bucket's lease, asked for until it is free (`None`: stopped). While
/// the lock backend cannot be asked, the bucket's requests take the lock
/// path (see [`RabbitQueue::lease_failed`]) rather than wait in vain.
async fn take_lease(queue: &RabbitQueue, b: u32, stop: &CancellationToken) -> Option<LockGuard> {
    let key = LockKey::queue_bucket(b);
    let mut failing = false;
    loop {
        if stop.is_cancelled() {
            return None;
        }
        match queue.locks.try_lease(&key, LEASE_TTL).await {
            Ok(Some(guard)) => return Some(guard),
            Ok(None) => {}
            Err(e) => {
                queue.lease_failed(b);
                if !failing {
                    tracing::warn!(bucket = b, error = %e, "cannot take a queue bucket's lease");
                }
                failing = true;
            }
        }
        tokio::time::sleep(LEASE_RETRY).await;
    }
}

/// Decodes a delivery: the operation's id is its correlation id, the
/// waiter's address its reply-to, the time it was enqueued a header.
fn decode(d: Delivery) -> Delivered<Delivery> {
    let props = &d.properties;
    let op_id = props
        .correlation_id()
        .as_ref()
        .and_then(|id| OpId::parse(id.as_str()));
    let reply_to = props.reply_to().as_ref().map(|r| r.as_str().to_owned());
    let enqueued_ms = props
        .headers()
        .as_ref()
        .and_then(|h| match h.inner().get("at") {
            Some(AMQPValue::LongLongInt(ms)) => u64::try_from(*ms).ok(),
            _ => None,
        })
        .unwrap_or_else(now_ms);
    let op = match op_id {
        None => Err("no operation id".to_owned()),
        Some(_) => serde_json::from_slice(&d.data).map_err(|e| e.to_string()),
    };
    Delivered {
        handle: d,
        op_id,
        reply_to,
        enqueued_ms,
        op,
    }
}

/// Answers on the publishing connection's answer channel, acknowledges on
/// the consumer's own (each delivery's acker).
struct DeliverySink<'c> {
    answer: &'c Channel,
    publisher: &'c Connection,
}

impl DeliverySink<'_> {
    /// Sends `outcome` to its waiter, unless the publishing connection is
    /// blocked by an alarm of the broker's (nothing is written on it until
    /// the alarm clears) or the answer cannot be written within
    /// [`ANSWER_WITHIN`]: the acknowledgements, on the consumer's own
    /// connection, go on all the same. An answer not sent is read from the
    /// store: a waiter whose link went down or is blocked reads its
    /// outcome there.
    async fn send_answer(&self, reply_to: &str, op_id: &OpId, outcome: &OpOutcome) {
        if self.publisher.status().blocked() {
            return;
        }
        let body = serde_json::to_vec(outcome).unwrap_or_default();
        let props = BasicProperties::default().with_correlation_id(op_id.to_string().into());
        let sent =
            self.answer
                .basic_publish("".into(), reply_to.into(), Default::default(), &body, props);
        match tokio::time::timeout(ANSWER_WITHIN, sent).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "could not send a queued operation's answer");
            }
            Err(_) => tracing::debug!("a queued operation's answer was not written in time"),
        }
    }
}

#[async_trait]
impl Sink<Delivery> for DeliverySink<'_> {
    /// For each delivery in turn: its answer to its waiter's reply address
    /// (a waiter's connection gone, the answer is dropped: it reads the
    /// store instead),
    /// then its acknowledgement, or its rejection to the dead letters.
    /// A channel that closed under them: [`Step::Stop`] (the broker
    /// delivers them again, to whichever consumer is active).
    async fn deliver(&mut self, done: &[Answered<'_, Delivery>]) -> Step {
        for a in done {
            let d = a.delivered;
            if let (Some(reply_to), Some(op_id)) = (&d.reply_to, &d.op_id) {
                self.send_answer(reply_to, op_id, a.outcome).await;
            }
            let acker = &d.handle.acker;
            let settled = match a.dead {
                Some((error, attempts)) => {
                    tracing::error!(
                        op_id = ?d.op_id,
                        error,
                        attempts,
                        "queued operation moved to the dead-letter queue"
                    );
                    let reject = BasicNackOptions {
                        requeue: false,
                        multiple: false,
                    };
                    acker.nack(reject).await
                }
                None => acker.ack(BasicAckOptions::default()).await,
            };
            if !matches!(settled, Ok(true)) {
                return Step::Stop;
            }
        }
        Step::Next
    }
}
