//! The RabbitMQ queue (`FILEDOCK_QUEUE_BROKER=rabbitmq`): the same front
//! (`front.rs`: circuit breaker, waiting, the dynamic timeout, settling)
//! and the same consumer logic (`apply.rs`: group commit, retries, dead
//! letters) as the Redis Streams queue, on another broker.
//!
//! - The 64 logical buckets are 64 durable queues (`filedock_queue.{b}`),
//!   each with **single active consumer**: every instance consumes every
//!   bucket, the broker delivers a bucket to one of them at a time, in
//!   order, and hands it to a standby when that one's connection dies.
//! - The broker says nothing of who consumed before, so the active consumer
//!   takes the bucket's lease (the Redis lock the Redis Streams queue's
//!   worker holds, `filedock_queue_lease:{b}`) before it applies, and every
//!   transaction checks its fencing token: a consumer that was paused past
//!   its lease, its deliveries handed to another, cannot apply after it.
//! - An enqueue counts once the broker confirmed it (publisher confirms; a
//!   persistent message on a durable queue). A delivery is acknowledged
//!   only once its outcome is in the store (applied, or recorded refused),
//!   so a consumer that dies leaves it to be delivered again, and
//!   `processed_ops` applies it once.
//! - The answer goes to the instance that asked, by direct reply-to
//!   (`amq.rabbitmq.reply-to` on the channel that published), or with
//!   `FILEDOCK_AMQP_REPLY_TO=queue` by an exclusive reply queue of the
//!   instance's own: never a reply queue shared between instances, no pool
//!   of reply channels. A waiter
//!   whose connection went down (and its answer with it) reads how its
//!   operation was settled in the store (`processed_ops`) every second.
//! - What keeps failing is rejected to the dead-letter queue
//!   (`filedock_queue_dlq`, through the queues' dead-letter exchange),
//!   counted by `GET /v1/admin/queue`.
//! - RabbitMQ not connected: the direct lock path (the circuit breaker).
//!
//! `open.rs` links to the broker, `link.rs` keeps the link (and starts the
//! consumers), `consumer.rs` consumes a bucket, `live.rs` is what a link
//! holds.

mod consumer;
mod link;
mod live;
mod open;

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use async_trait::async_trait;
use lapin::{
    BasicProperties,
    options::BasicPublishOptions,
    types::{AMQPValue, FieldTable},
    uri::{AMQPScheme, AMQPUri},
};
use secrecy::ExposeSecret;

use self::live::{Lengths, Live};
use super::{
    front::{Broker, EnqueueError, Front, Waiters},
    now_ms,
    stats::Recent,
};
use crate::{
    config::{AmqpReplyTo, Settings},
    coord::{Applier, BUCKETS, CoordError, Coordinator, LockCoordinator, OpOutcome, QueueStats},
    lock::Locks,
    metrics::Metrics,
    vocab::{OpId, Operation},
};

/// How long a broker that failed a publish counts as down (the circuit
/// breaker), unless the connection is found up again sooner.
const UNHEALTHY_FOR: Duration = Duration::from_secs(1);
/// How often a waiter whose link lives reads its outcome from the store
/// all the same (an answer may have been left unsent).
const STORE_READ_EVERY: Duration = Duration::from_secs(5);
/// The heartbeat asked of the broker when the URL names none: a consumer
/// whose process stalled loses its buckets to a standby after about two.
const HEARTBEAT_SECS: u16 = 5;
/// The figures' warning while operations take the lock path for want of
/// the broker.
pub const NOT_LINKED: &str =
    "not linked to RabbitMQ (or blocked by its alarm): operations take the lock path";
/// How long a publish may wait for the broker's confirm.
const PUBLISH_WITHIN: Duration = Duration::from_secs(5);
/// Where a publish asks its answer to go with direct reply-to: this
/// channel's own consumer.
const DIRECT_REPLY_TO: &str = "amq.rabbitmq.reply-to";

pub struct RabbitQueue {
    uri: AMQPUri,
    prefix: String,
    /// Where answers come back.
    reply_to: AmqpReplyTo,
    /// Names this instance's connection, for an operator's listing.
    instance: String,
    front: Front,
    /// The connection while it is up.
    live: Mutex<Option<Arc<Live>>>,
    /// Connections made so far (each one's generation).
    connections: AtomicU64,
    /// Until when a failed publish keeps the breaker open.
    unhealthy_until: Mutex<Option<Instant>>,
    /// When each bucket's consumer last failed to ask for its lease (the
    /// lock backend away): its requests take the lock path for a while.
    lease_failures: Mutex<HashMap<u32, Instant>>,
    /// The queues' lengths as last read (once a second).
    lengths: Mutex<Lengths>,
    /// Queues unused this long are removed by the broker (tests).
    expiry: Option<Duration>,
    recent: Recent,
    /// Buckets this instance is the active consumer of (holding the lease).
    held: AtomicUsize,
    locks: Arc<Locks>,
    metrics: Arc<Metrics>,
}

impl RabbitQueue {
    /// The queue on the broker at `FILEDOCK_AMQP_URL`; it connects in the
    /// background too (`link.rs`), so a server starts with RabbitMQ down.
    pub fn new(
        settings: &Settings,
        locks: Arc<Locks>,
        applier: Applier,
        metrics: Arc<Metrics>,
    ) -> anyhow::Result<Self> {
        let url = (settings.amqp_url.as_ref())
            .ok_or_else(|| anyhow::anyhow!("FILEDOCK_AMQP_URL is not set"))?;
        // The URL holds a password: the error names neither.
        let mut uri: AMQPUri = url
            .expose_secret()
            .parse()
            .map_err(|_| anyhow::anyhow!("FILEDOCK_AMQP_URL is not an amqp:// URL"))?;
        if uri.scheme == AMQPScheme::AMQPS {
            anyhow::bail!(
                "FILEDOCK_AMQP_URL: amqps:// is not supported (this build speaks AMQP without TLS)"
            );
        }
        // None or 0 (the broker's own, 60 s): a stalled consumer would keep
        // its buckets for minutes.
        if uri.query.heartbeat.is_none_or(|h| h == 0) {
            uri.query.heartbeat = Some(HEARTBEAT_SECS);
        }
        // A channel per bucket's consumer, and three more.
        if uri
            .query
            .channel_max
            .is_some_and(|c| u32::from(c) < BUCKETS + 3)
        {
            anyhow::bail!(
                "FILEDOCK_AMQP_URL: channel_max must allow at least {} channels",
                BUCKETS + 3
            );
        }
        Ok(Self {
            uri,
            prefix: settings.redis_prefix.clone(),
            reply_to: settings.amqp_reply_to,
            instance: format!("filedock-{}", uuid::Uuid::new_v4().simple()),
            front: Front {
                waiters: Waiters::default(),
                direct: LockCoordinator::new(locks.clone(), applier.clone()),
                applier,
                wait: settings.queue_wait,
            },
            live: Mutex::default(),
            connections: AtomicU64::new(0),
            unhealthy_until: Mutex::default(),
            lease_failures: Mutex::default(),
            lengths: Mutex::default(),
            expiry: settings.amqp_queue_expiry,
            recent: Recent::default(),
            held: AtomicUsize::new(0),
            locks,
            metrics,
        })
    }

    /// The queue of bucket `b`.
    pub fn queue_name(prefix: &str, b: u32) -> String {
        format!("{prefix}filedock_queue.{b}")
    }

    /// The dead-letter queue.
    pub fn dlq_name(prefix: &str) -> String {
        format!("{prefix}filedock_queue_dlq")
    }

    fn live(&self) -> Option<Arc<Live>> {
        self.live.lock().unwrap().clone()
    }

    /// Bucket `b`'s consumer could not ask for its lease: nothing applies
    /// there until it can, so the bucket's requests take the lock path
    /// (which answers at once whether the lock backend is back).
    fn lease_failed(&self, b: u32) {
        self.lease_failures
            .lock()
            .unwrap()
            .insert(b, Instant::now());
    }

    /// The arguments every bucket's queue is declared with (the same each
    /// time: a queue declared again with others is refused).
    fn bucket_args(&self) -> FieldTable {
        let mut args = self.expiry_args();
        args.insert("x-single-active-consumer".into(), AMQPValue::Boolean(true));
        args.insert(
            "x-dead-letter-exchange".into(),
            AMQPValue::LongString("".into()),
        );
        args.insert(
            "x-dead-letter-routing-key".into(),
            AMQPValue::LongString(Self::dlq_name(&self.prefix).as_str().into()),
        );
        args
    }

    fn expiry_args(&self) -> FieldTable {
        let mut args = FieldTable::default();
        if let Some(e) = self.expiry {
            let ms = i64::try_from(e.as_millis()).unwrap_or(i64::MAX);
            args.insert("x-expires".into(), AMQPValue::LongLongInt(ms));
        }
        args
    }
}

#[async_trait]
impl Coordinator for RabbitQueue {
    async fn run(&self, op: Operation) -> Result<(), CoordError> {
        self.front.run(self, op).await
    }

    async fn stats(&self) -> Option<QueueStats> {
        let lengths = self.lengths.lock().unwrap().clone();
        let (processing_rate, average_wait_ms, failure_rate) = self.recent.figures();
        let mut stats = QueueStats {
            length: lengths.buckets.iter().sum(),
            processing_rate,
            average_wait_ms,
            failure_rate,
            dead_letter_count: lengths.dead,
            buckets_held: self.held.load(Ordering::Relaxed),
            warnings: Vec::new(),
        }
        .with_warnings();
        if !self.live().is_some_and(|l| l.is_up()) {
            stats.warnings.push(NOT_LINKED.into());
        }
        Some(stats)
    }
}

/// What a waiter listened on: its link (which one: its generation), since
/// when, and the last [`STORE_READ_EVERY`] period since then in which it
/// read the store (0: none yet).
pub(super) struct Heard {
    generation: u64,
    since: Instant,
    reads: AtomicU64,
}

#[async_trait]
impl Broker for RabbitQueue {
    /// Answers come on the publishing channel's own consumer, heard while
    /// the connection lives: which connection it was, and since when.
    type Listening = Heard;

    /// Whether the connection and its publishing channel are up (for every
    /// bucket: one broker holds them all), and no publish failed in the
    /// last second.
    async fn healthy(&self, b: u32) -> bool {
        let failed = *self.unhealthy_until.lock().unwrap();
        if failed.is_some_and(|t| Instant::now() < t) {
            return false;
        }
        let lease_failed = self.lease_failures.lock().unwrap().get(&b).copied();
        if lease_failed.is_some_and(|t| t.elapsed() < UNHEALTHY_FOR) {
            return false;
        }
        self.live().is_some_and(|l| l.is_up())
    }

    fn mark_unhealthy(&self, _b: u32) {
        *self.unhealthy_until.lock().unwrap() = Some(Instant::now() + UNHEALTHY_FOR);
    }

    async fn listen(&self, _b: u32) -> Option<Heard> {
        self.live().map(|l| Heard {
            generation: l.generation,
            since: Instant::now(),
            reads: AtomicU64::new(0),
        })
    }

    /// The outcome as the store has it (how the operation was settled, if
    /// it was) once the link the waiter listened on is gone, or blocked by
    /// an alarm of the broker's (which holds every publisher's frames, the
    /// consumers' answers among them, until it clears); while it lives and
    /// publishes, the answer comes by reply, and the store is read only
    /// every [`STORE_READ_EVERY`] (the instance that applied the operation
    /// may have left its answer unsent: an alarm blocked its publisher).
    async fn read_result(&self, _b: u32, op_id: &OpId, heard: Option<&Heard>) -> Option<OpOutcome> {
        if let Some(heard) = heard {
            let listening = self
                .live()
                .is_some_and(|l| l.generation == heard.generation && !l.blocked());
            let due = heard.since.elapsed().as_secs() / STORE_READ_EVERY.as_secs();
            if listening && heard.reads.swap(due, Ordering::Relaxed) == due {
                return None;
            }
        }
        self.front.applier.outcome(op_id).await
    }

    async fn enqueue(&self, b: u32, op: &Operation, op_id: &OpId) -> Result<u64, EnqueueError> {
        let live = self
            .live()
            .ok_or_else(|| EnqueueError::Failed("not connected to RabbitMQ".into()))?;
        let body = serde_json::to_vec(op).map_err(|e| EnqueueError::Failed(e.to_string()))?;
        // A broker that neither confirms nor refuses (an alarm blocks the
        // connection): failed, the lock path, and the breaker open.
        let published = tokio::time::timeout(PUBLISH_WITHIN, async {
            if self.publish(&live, b, &body, op_id).await? {
                return Ok(());
            }
            // Returned: the bucket's queue is not there (deleted since the
            // link declared it). Declared again, published again once.
            self.metrics.queue_returned.inc();
            tracing::warn!(
                bucket = b,
                "RabbitMQ returned an operation: its queue is missing; declaring it again"
            );
            let declared = self.declare_bucket(&live.publish, b).await;
            declared.map_err(|e| e.to_string())?;
            match self.publish(&live, b, &body, op_id).await? {
                true => Ok(()),
                false => Err("RabbitMQ returned the message: its queue is missing".to_owned()),
            }
        });
        match published.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(EnqueueError::Failed(e)),
            Err(_) => {
                return Err(EnqueueError::Failed(
                    "RabbitMQ did not confirm in time".into(),
                ));
            }
        }
        let ahead = self
            .lengths
            .lock()
            .unwrap()
            .buckets
            .get(b as usize)
            .copied();
        Ok(ahead.unwrap_or(0))
    }
}

impl RabbitQueue {
    /// Publishes an operation to bucket `b`'s queue, persistent; `true`
    /// once the broker confirmed it, `false` if it returned it
    /// (unroutable: mandatory, so a missing queue does not drop it).
    async fn publish(
        &self,
        live: &Live,
        b: u32,
        body: &[u8],
        op_id: &OpId,
    ) -> Result<bool, String> {
        let mut headers = FieldTable::default();
        headers.insert("at".into(), AMQPValue::LongLongInt(now_ms() as i64));
        let props = BasicProperties::default()
            .with_correlation_id(op_id.to_string().into())
            .with_reply_to(live.reply_to.as_str().into())
            .with_delivery_mode(2)
            .with_content_type("application/json".into())
            .with_headers(headers);
        let options = BasicPublishOptions {
            mandatory: true,
            ..BasicPublishOptions::default()
        };
        let queue = Self::queue_name(&self.prefix, b);
        let confirm = live
            .publish
            .basic_publish("".into(), queue.as_str().into(), options, body, props)
            .await
            .map_err(|e| e.to_string())?
            .await
            .map_err(|e| e.to_string())?;
        if confirm.is_nack() {
            return Err("RabbitMQ refused the message".into());
        }
        Ok(confirm.take_message().is_none())
    }
}

/// The buckets' names, for the declarations.
fn buckets() -> impl Iterator<Item = u32> {
    0..BUCKETS
}
