//! Keeps this instance connected to RabbitMQ: connects (again, a second
//! after a failure), declares the queues, opens the publishing channel and
//! hears its direct replies; starts a consumer on every bucket (and again
//! when one stops), and reads the queues' lengths once a second.

use std::{
    collections::HashMap,
    sync::{Arc, atomic::Ordering},
    time::{Duration, Instant},
};

use async_trait::async_trait;
use futures::StreamExt;
use lapin::{
    Channel, Connection, ConnectionProperties, Consumer,
    options::{BasicConsumeOptions, ConfirmSelectOptions, QueueDeclareOptions},
    types::FieldTable,
};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::{
    DIRECT_REPLY_TO, RabbitQueue, buckets, consumer,
    live::{Lengths, Live},
};
use crate::{
    coord::OpOutcome,
    worker::{self, WorkerState},
};

/// How long a connection attempt may take.
const CONNECT_WITHIN: Duration = Duration::from_secs(5);
/// How often the link checks the connection and its consumers.
const CHECK_EVERY: Duration = Duration::from_millis(500);
/// The pause after a failed connection attempt.
const RETRY_AFTER: Duration = Duration::from_secs(1);
/// How often the queues' lengths are read.
const LENGTHS_EVERY: Duration = Duration::from_secs(1);

impl RabbitQueue {
    /// Starts this instance's link to RabbitMQ (this file), which starts
    /// the bucket consumers; they stop with `shutdown`.
    pub fn spawn_workers(self: &Arc<Self>, shutdown: CancellationToken) -> JoinHandle<()> {
        worker::spawn(
            Link {
                queue: self.clone(),
                consumers: HashMap::new(),
                stats: None,
                lengths_read: None,
            },
            shutdown,
        )
    }
}

impl RabbitQueue {
    /// Connects (within 5 s), declares the queues, opens the publishing
    /// channel and hears its replies: the queue is up (its consumers are
    /// the link's to start). The server tries once before it listens, so
    /// that its first requests go through the queue when the broker is up.
    pub async fn connect(self: &Arc<Self>) -> anyhow::Result<()> {
        match tokio::time::timeout(CONNECT_WITHIN, self.open()).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(anyhow::anyhow!("cannot connect to RabbitMQ: {e}")),
            Err(_) => Err(anyhow::anyhow!("connecting to RabbitMQ timed out")),
        }
    }

    async fn open(self: &Arc<Self>) -> lapin::Result<Arc<Live>> {
        let props =
            ConnectionProperties::default().with_connection_name(self.instance.as_str().into());
        let conn = Connection::connect_uri(self.uri.clone(), props).await?;
        let publish = conn.create_channel().await?;
        let durable = QueueDeclareOptions {
            durable: true,
            ..QueueDeclareOptions::default()
        };
        let dlq = RabbitQueue::dlq_name(&self.prefix);
        publish
            .queue_declare(dlq.as_str().into(), durable, self.expiry_args())
            .await?;
        for b in buckets() {
            let name = RabbitQueue::queue_name(&self.prefix, b);
            publish
                .queue_declare(name.as_str().into(), durable, self.bucket_args())
                .await?;
        }
        publish
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        // Direct reply-to: consumed, without acknowledgements, on the
        // channel that publishes the requests, before the first publish.
        let no_ack = BasicConsumeOptions {
            no_ack: true,
            ..BasicConsumeOptions::default()
        };
        let replies = publish
            .basic_consume(
                DIRECT_REPLY_TO.into(),
                "replies".into(),
                no_ack,
                FieldTable::default(),
            )
            .await?;
        let replies = tokio::spawn(hand_replies(self.clone(), replies));
        let live = Arc::new(Live {
            conn,
            publish,
            generation: self.connections.fetch_add(1, Ordering::Relaxed) + 1,
            replies,
        });
        *self.live.lock().unwrap() = Some(live.clone());
        tracing::info!("connected to RabbitMQ");
        Ok(live)
    }
}

struct Link {
    queue: Arc<RabbitQueue>,
    /// A consumer per bucket on the live connection.
    consumers: HashMap<u32, (JoinHandle<()>, CancellationToken)>,
    /// A channel for reading the queues' lengths.
    stats: Option<Channel>,
    lengths_read: Option<Instant>,
}

#[async_trait]
impl worker::Worker for Link {
    fn name(&self) -> String {
        "rabbitmq link".into()
    }

    fn status(&self) -> String {
        match self.queue.live() {
            Some(l) if l.is_up() => format!("connected, {} consumers", self.consumers.len()),
            _ => "not connected".into(),
        }
    }

    async fn work(&mut self, shutdown: &CancellationToken) -> WorkerState {
        let live = match self.queue.live() {
            Some(live) if live.is_up() => live,
            _ => {
                self.tear_down().await;
                if let Err(e) = self.queue.connect().await {
                    tracing::warn!(error = %e, "retrying");
                    return WorkerState::Idle(RETRY_AFTER);
                }
                match self.queue.live() {
                    Some(live) => live,
                    None => return WorkerState::Idle(RETRY_AFTER),
                }
            }
        };
        // A consumer that stopped (its channel closed, its lease lost)
        // starts again, behind any other instance's.
        self.consumers.retain(|_, (h, _)| !h.is_finished());
        for b in buckets() {
            if !self.consumers.contains_key(&b) {
                let stop = shutdown.child_token();
                let run = consumer::consume(self.queue.clone(), live.clone(), b, stop.clone());
                self.consumers.insert(b, (tokio::spawn(run), stop));
            }
        }
        if self
            .lengths_read
            .is_none_or(|t| t.elapsed() >= LENGTHS_EVERY)
        {
            self.lengths_read = Some(Instant::now());
            self.read_lengths(&live).await;
        }
        WorkerState::Idle(CHECK_EVERY)
    }

    /// Stops the consumers (their deliveries not acknowledged go back to
    /// the queues, their leases are released), then closes the connection.
    async fn stopped(&mut self) {
        let live = self.queue.live();
        self.tear_down().await;
        if let Some(live) = live {
            let _ = live.conn.close(200, "shutting down".into()).await;
        }
    }
}

impl Link {
    /// Forgets a connection that went down: its consumers stop, its
    /// replies are heard no more (a waiter whose answer went with it reads
    /// it from the store, every second: `processed_ops`).
    async fn tear_down(&mut self) {
        self.queue.live.lock().unwrap().take();
        for (_, (handle, stop)) in self.consumers.drain() {
            stop.cancel();
            let _ = handle.await;
        }
        self.stats = None;
    }

    /// Reads each queue's length (a passive declaration) for the dynamic
    /// timeout and the figures, and publishes them as metrics.
    async fn read_lengths(&mut self, live: &Live) {
        if self.stats.as_ref().is_none_or(|c| !c.status().connected()) {
            self.stats = live.conn.create_channel().await.ok();
        }
        let Some(channel) = &self.stats else {
            return;
        };
        let passive = QueueDeclareOptions {
            passive: true,
            ..QueueDeclareOptions::default()
        };
        let prefix = &self.queue.prefix;
        let mut lengths = Lengths::default();
        for b in buckets() {
            let name = RabbitQueue::queue_name(prefix, b);
            match channel
                .queue_declare(name.as_str().into(), passive, FieldTable::default())
                .await
            {
                Ok(q) => lengths.buckets.push(q.message_count().into()),
                Err(_) => return,
            }
        }
        let dlq = RabbitQueue::dlq_name(prefix);
        if let Ok(q) = channel
            .queue_declare(dlq.as_str().into(), passive, FieldTable::default())
            .await
        {
            lengths.dead = q.message_count().into();
        }
        let metrics = &self.queue.metrics;
        metrics
            .queue_length
            .set(lengths.buckets.iter().sum::<u64>() as i64);
        metrics.queue_dead_letters.set(lengths.dead as i64);
        *self.queue.lengths.lock().unwrap() = lengths;
    }
}

/// Hands each direct reply (the operation's id as its correlation id, the
/// outcome as its body) to the request waiting for it.
async fn hand_replies(queue: Arc<RabbitQueue>, mut replies: Consumer) {
    while let Some(Ok(reply)) = replies.next().await {
        let Some(op_id) = reply.properties.correlation_id() else {
            continue;
        };
        let Ok(outcome) = serde_json::from_slice::<OpOutcome>(&reply.data) else {
            continue;
        };
        if let Some(tx) = queue.front.waiters.take(op_id.as_str()) {
            let _ = tx.send(outcome);
        }
    }
}
