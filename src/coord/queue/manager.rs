//! The bucket manager: this instance's fair share of the 64 buckets (a
//! heartbeat counts the live instances), a worker for each bucket it
//! leases (`worker.rs`), and the queue's figures reported as metrics.

use std::{
    collections::HashMap,
    sync::Arc,
    time::{Duration, Instant},
};

use async_trait::async_trait;
use rand::seq::SliceRandom;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::{RedisQueue, worker::BucketWorker};
use crate::{
    coord::{BUCKETS, Coordinator},
    lock::LockKey,
    worker::{self, WorkerState},
};

impl RedisQueue {
    /// Starts this instance's bucket manager (this file), which starts the
    /// bucket workers; they stop with `shutdown`.
    pub fn spawn_workers(self: &Arc<Self>, shutdown: CancellationToken) -> JoinHandle<()> {
        worker::spawn(Manager::new(self.clone()), shutdown)
    }
}

/// A bucket lease; renewed every third of it while the worker lives.
const LEASE_TTL: Duration = Duration::from_secs(3);
/// How often an instance heartbeats and rebalances its buckets.
const REBALANCE_EVERY: Duration = Duration::from_millis(500);
/// How often the queue figures go to the metrics and the log.
const REPORT_EVERY: Duration = Duration::from_secs(10);

/// Keeps this instance's fair share of buckets leased, each with a worker.
pub(super) struct Manager {
    queue: Arc<RedisQueue>,
    workers: HashMap<u32, (JoinHandle<()>, CancellationToken)>,
    last_report: Instant,
    /// The live instances the last heartbeat counted.
    last_alive: Option<u32>,
}

impl Manager {
    pub(super) fn new(queue: Arc<RedisQueue>) -> Self {
        Self {
            queue,
            workers: HashMap::new(),
            last_alive: None,
            last_report: Instant::now(),
        }
    }
}

#[async_trait]
impl worker::Worker for Manager {
    fn name(&self) -> String {
        "queue manager".into()
    }

    fn status(&self) -> String {
        format!("{} buckets held", self.workers.len())
    }

    async fn work(&mut self, shutdown: &CancellationToken) -> WorkerState {
        let Self {
            queue,
            workers,
            last_report,
            last_alive,
        } = self;
        workers.retain(|_, (h, _)| !h.is_finished());
        // The members' key unreachable (Redis down, or on a cluster its
        // master failing over): the last count stands, so a bucket whose
        // worker stopped (its lease lost) is taken again where its master
        // answers; a running worker stops only when its own lease is lost.
        let alive = match queue.members.beat().await {
            Ok(alive) => *last_alive.insert(alive),
            Err(_) => last_alive.unwrap_or(0),
        };
        // Nobody counted yet: take nothing, give nothing back.
        let share = match alive {
            0 => workers.len(),
            n => BUCKETS.div_ceil(n) as usize,
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
                let bucket = BucketWorker {
                    queue: queue.clone(),
                    b,
                    guard: Some(guard),
                };
                workers.insert(b, (worker::spawn(bucket, stop.clone()), stop));
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
        if last_report.elapsed() > REPORT_EVERY {
            *last_report = Instant::now();
            report(queue).await;
        }
        WorkerState::Idle(REBALANCE_EVERY)
    }

    /// Stops the bucket workers and leaves the members.
    async fn stopped(&mut self) {
        for (_, (handle, stop)) in self.workers.drain() {
            stop.cancel();
            let _ = handle.await;
        }
        self.queue.members.leave().await;
    }
}

/// Publishes the queue figures as metrics and logs their warnings.
pub(super) async fn report(queue: &RedisQueue) {
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
