//! Keeps this instance linked to RabbitMQ: links (again, a second after
//! a failure; `open.rs`), starts a consumer on every bucket (and again when
//! one stops), and reads the queues' lengths once a second.

use std::{
    collections::HashMap,
    sync::Arc,
    time::{Duration, Instant},
};

use async_trait::async_trait;
use lapin::{Channel, options::QueueDeclareOptions, types::FieldTable};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::{
    RabbitQueue, buckets, consumer,
    live::{Lengths, Live},
};
use crate::worker::{self, WorkerState};

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
            Some(l) if l.blocked() => "connected, publishing blocked by an alarm".into(),
            Some(l) if l.linked() => format!("connected, {} consumers", self.consumers.len()),
            _ => "not connected".into(),
        }
    }

    async fn work(&mut self, shutdown: &CancellationToken) -> WorkerState {
        // A link an alarm blocks is kept (linking again would only block
        // the new one at its first publish): requests take the lock path
        // meanwhile, the consumers go on, and it unblocks when it clears.
        let live = match self.queue.live() {
            Some(live) if live.linked() => live,
            _ => {
                self.tear_down(false).await;
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
        self.tear_down(true).await;
        if let Some(live) = live {
            let _ = live.conn.close(200, "shutting down".into()).await;
            // Nothing is written on a connection an alarm blocks, its close
            // neither: not waited for past a second.
            let closing = live.publisher.close(200, "shutting down".into());
            let _ = tokio::time::timeout(Duration::from_secs(1), closing).await;
        }
    }
}

impl Link {
    /// Forgets a link that went down: its consumers stop, its answers are
    /// heard no more (a waiter whose answer went with it reads it from the
    /// store, every second: `processed_ops`). Waits for the consumers when
    /// `wait` (shutting down); else they finish what they hold in the
    /// background (one may be waiting on the store), each holding its
    /// bucket's lease until then, while the link connects again.
    async fn tear_down(&mut self, wait: bool) {
        self.queue.live.lock().unwrap().take();
        for (_, (handle, stop)) in self.consumers.drain() {
            stop.cancel();
            if wait {
                let _ = handle.await;
            }
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
