//! One endpoint's dispatcher on this instance (see the module's comment in
//! `mod.rs`): it keeps this instance's share of the partitions leased,
//! reads the feed for them, and delivers each owner's queued events one at
//! a time, owners in parallel up to `FILEDOCK_WEBHOOK_CONCURRENCY`.

use std::{
    collections::HashMap,
    sync::Arc,
    time::{Duration, Instant},
};

use async_trait::async_trait;
use futures::{FutureExt, future::BoxFuture};
use rand::seq::SliceRandom;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::{
    endpoint::{Endpoint, PARTITIONS, partition_of},
    owners::Partition,
    service::Webhooks,
    tasks::{Done, SHORT_PAUSE, What, bounded, deliver, refill},
};
use crate::{
    domain::events::feed_channel,
    lock::{LockGuard, LockKey},
    meta::Listener,
    vocab::UserId,
    worker::{Worker, WorkerState},
};

/// A partition's lease (renewed every third of it while held): how long
/// a dead instance's partitions wait for another.
const LEASE_TTL: Duration = Duration::from_secs(5);
/// How often the instances are counted and the partitions shared again.
const REBALANCE_EVERY: Duration = Duration::from_secs(1);
/// How often the marks are written and the figures reported.
const SAVE_EVERY: Duration = Duration::from_secs(1);
/// How often the dead letters are counted.
const COUNT_EVERY: Duration = Duration::from_secs(10);
/// The feed is read again this often even with no ring (a ring lost
/// with a Redis link).
const READ_BACKSTOP: Duration = Duration::from_secs(5);
/// Feed positions read at once.
const WINDOW: i64 = 500;
/// Events held at most (the feed is read on once they go below half).
const MAX_PENDING: usize = 10_000;
/// Owners with nothing queued kept per partition before they are forgotten.
const KEEP_IDLE: usize = 10_000;
/// One dispatcher per endpoint, to run as workers (none without webhooks).
pub fn dispatchers(hooks: &Arc<Webhooks>) -> Vec<Dispatcher> {
    hooks
        .endpoints
        .iter()
        .map(|e| Dispatcher::new(hooks.clone(), e.clone()))
        .collect()
}

pub struct Dispatcher {
    hooks: Arc<Webhooks>,
    endpoint: Endpoint,
    parts: HashMap<u32, Partition>,
    /// The leases of `parts`.
    leases: HashMap<u32, LockGuard>,
    tasks: JoinSet<Done>,
    listener: Option<Listener>,
    read_due: bool,
    next_read: Instant,
    next_rebalance: Instant,
    next_save: Instant,
    next_count: Instant,
    alive: u32,
    delivered: u64,
}

impl Dispatcher {
    fn new(hooks: Arc<Webhooks>, endpoint: Endpoint) -> Self {
        let now = Instant::now();
        Self {
            hooks,
            endpoint,
            parts: HashMap::new(),
            leases: HashMap::new(),
            tasks: JoinSet::new(),
            listener: None,
            read_due: true,
            next_read: now,
            next_rebalance: now,
            next_save: now + SAVE_EVERY,
            next_count: now,
            alive: 1,
            delivered: 0,
        }
    }

    fn pending(&self) -> usize {
        self.parts.values().map(Partition::pending).sum()
    }

    /// Keeps this instance's share of the partitions leased: drops those
    /// whose lease was lost, takes free ones up to the share, gives back
    /// what is over it.
    async fn rebalance(&mut self) {
        if let Ok(n) = self.hooks.members.beat().await {
            self.alive = n;
        }
        let share = PARTITIONS.div_ceil(self.alive.max(1)) as usize;
        let lost: Vec<u32> = (self.leases.iter())
            .filter(|(_, g)| g.lost().is_cancelled())
            .map(|(p, _)| *p)
            .collect();
        for p in lost {
            self.drop_partition(p);
        }
        let mut free: Vec<u32> = (0..PARTITIONS)
            .filter(|p| !self.parts.contains_key(p))
            .collect();
        free.shuffle(&mut rand::rng());
        for p in free {
            if self.parts.len() >= share {
                break;
            }
            let key = LockKey::webhook_partition(&self.endpoint.id, p);
            let Ok(Some(guard)) = self.hooks.locks.try_lease(&key, LEASE_TTL).await else {
                continue;
            };
            match bounded(self.hooks.repo.webhook_mark(&self.endpoint.id, p)).await {
                Ok(mark) => {
                    self.parts.insert(p, Partition::new(mark));
                    self.leases.insert(p, guard);
                    self.read_due = true;
                }
                Err(e) => {
                    tracing::warn!(partition = p, error = %e, "could not read a webhook partition's mark; leaving it");
                    guard.release().await;
                }
            }
        }
        while self.parts.len() > share {
            let Some(&p) = self.parts.keys().next() else {
                break;
            };
            self.give_back(p).await;
        }
    }

    /// Writes the partition's mark and lets its lease go.
    async fn give_back(&mut self, p: u32) {
        self.save_mark(p).await;
        self.parts.remove(&p);
        if let Some(guard) = self.leases.remove(&p) {
            guard.release().await;
        }
    }

    /// Forgets a partition whose lease is gone (its tasks' answers are
    /// dropped as they come).
    fn drop_partition(&mut self, p: u32) {
        self.parts.remove(&p);
        self.leases.remove(&p);
    }

    /// Reads the feed past where the partitions stand, queueing their
    /// owners' events: a window at a time, each window with the feed's
    /// bounds in one snapshot (so no event placed up to where a window
    /// ends is passed unseen).
    async fn read_feed(&mut self) {
        let Some(mut from) = self.parts.values().map(|p| p.read).min() else {
            return;
        };
        let events = &self.hooks.events;
        // Up to the last place the first window saw: a feed that grows
        // meanwhile is read at the next turn, after deliveries started.
        let mut end = None;
        while self.pending() < MAX_PENDING {
            let page = match bounded(events.feed(from, WINDOW, WINDOW as usize)).await {
                Ok(page) => page,
                Err(e) => {
                    tracing::warn!(error = %e, "could not read the events' feed for webhooks; trying again");
                    return;
                }
            };
            let floor = page.bounds.floor;
            if from < floor {
                // The retention marks the feed before it removes: a
                // removal this window met shows in its floor.
                match from {
                    // A URL new to the store starts from the oldest kept.
                    0 => {
                        tracing::info!(url_id = %self.endpoint.id, "a webhook URL's first delivery starts from the oldest event kept")
                    }
                    _ => tracing::error!(
                        from,
                        floor,
                        "events were removed by the retention before their webhooks were delivered or dead-lettered"
                    ),
                }
                from = floor;
                continue;
            }
            let reached = match page.events.len() as i64 {
                WINDOW => page.events.last().and_then(|e| e.feed).unwrap_or(page.upto),
                _ => page.upto,
            };
            for event in page.events {
                if let Some(part) = self.parts.get_mut(&partition_of(&event.owner_id)) {
                    part.take(event);
                }
            }
            for part in self.parts.values_mut() {
                part.read = part.read.max(reached);
            }
            let end = *end.get_or_insert(page.bounds.last);
            if reached >= end {
                return;
            }
            from = reached;
        }
    }

    /// Starts a task for each owner whose head may go, up to the
    /// concurrency, and a read for each whose queue overflowed and drained.
    fn start_ready(&mut self) {
        let most = self.hooks.settings.as_ref().map_or(1, |s| s.concurrency);
        let now = Instant::now();
        let mut started: Vec<(u32, u64, UserId, BoxFuture<'static, What>)> = Vec::new();
        let mut sending = self.tasks.len();
        for (&p, part) in self.parts.iter_mut() {
            let Some(lease) = self.leases.get(&p) else {
                continue;
            };
            let (fence, clock) = (lease.fence(), lease.clock());
            for (owner_id, after, room) in part.to_refill() {
                let Some(owner) = part.owners.get_mut(&owner_id) else {
                    continue;
                };
                owner.refilling = true;
                let work = refill(self.hooks.clone(), owner_id, (after, room), part.read);
                started.push((p, fence, owner_id, work.boxed()));
            }
            for owner_id in part.ready(now) {
                if sending >= most {
                    break;
                }
                let Some(owner) = part.owners.get_mut(&owner_id) else {
                    continue;
                };
                let Some(head) = owner.queue.front() else {
                    continue;
                };
                owner.busy = true;
                sending += 1;
                let (hooks, endpoint) = (self.hooks.clone(), self.endpoint.clone());
                let work = deliver(hooks, endpoint, clock.clone(), head.clone(), owner.attempts);
                started.push((p, fence, owner_id, work.boxed()));
            }
        }
        for (part, fence, owner, work) in started {
            self.tasks.spawn(async move {
                let what = std::panic::AssertUnwindSafe(work)
                    .catch_unwind()
                    .await
                    .unwrap_or_else(|_| What::Failed("the delivery task panicked".into()));
                Done {
                    part,
                    fence,
                    owner,
                    what,
                }
            });
        }
    }

    /// Takes a task's result in (dropped if its partition's lease is gone).
    fn finish(&mut self, done: Done) {
        let stalled = self.pending() >= MAX_PENDING / 2;
        let Some(part) = self.parts.get_mut(&done.part) else {
            return;
        };
        if self.leases.get(&done.part).map(LockGuard::fence) != Some(done.fence) {
            return;
        }
        let Some(owner) = part.owners.get_mut(&done.owner) else {
            return;
        };
        // A refill runs beside the head's delivery: the head is not its.
        match done.what {
            What::Refilled(refill) => return owner.refilled(refill, part.read),
            What::RefillFailed => {
                owner.refilling = false;
                return;
            }
            _ => {}
        }
        owner.busy = false;
        let most = self
            .hooks
            .settings
            .as_ref()
            .map_or(SHORT_PAUSE, |s| s.retry_max);
        let outcome = match done.what {
            What::NotNow => {
                owner.not_before = Some(Instant::now() + SHORT_PAUSE);
                None
            }
            What::Refilled(_) | What::RefillFailed => None,
            What::Delivered => {
                owner.done();
                self.delivered += 1;
                Some("delivered")
            }
            What::DeadLettered => {
                owner.done();
                Some("dead_lettered")
            }
            What::Dropped => {
                owner.done();
                Some("dropped")
            }
            What::Failed(why) => {
                if owner.attempts == 0 {
                    tracing::warn!(url_id = %self.endpoint.id, owner = %done.owner, reason = %why, "webhook delivery failed; retrying with backoff");
                }
                owner.failed(most);
                Some("failed")
            }
        };
        if let Some(outcome) = outcome {
            self.hooks.count(outcome);
        }
        if stalled && self.pending() < MAX_PENDING / 2 {
            self.read_due = true;
        }
    }

    /// Writes partition `p`'s mark if it moved; a lease found gone (a
    /// holder with a greater token wrote) drops the partition.
    async fn save_mark(&mut self, p: u32) {
        let (Some(part), Some(lease)) = (self.parts.get(&p), self.leases.get(&p)) else {
            return;
        };
        let mark = part.to_mark();
        if mark == part.saved {
            return;
        }
        let fence = lease.fence();
        let repo = &self.hooks.repo;
        match repo
            .raise_webhook_mark(&self.endpoint.id, p, fence, &mark)
            .await
        {
            Ok(true) => {
                if let Some(part) = self.parts.get_mut(&p) {
                    part.saved = mark;
                }
            }
            Ok(false) => {
                tracing::warn!(
                    partition = p,
                    "a webhook partition's lease passed to another instance; leaving it"
                );
                self.drop_partition(p);
            }
            Err(e) => {
                tracing::warn!(partition = p, error = %e, "could not write a webhook partition's mark")
            }
        }
    }

    async fn save_marks(&mut self) {
        let held: Vec<u32> = self.parts.keys().copied().collect();
        for p in held {
            self.save_mark(p).await;
        }
        for part in self.parts.values_mut() {
            part.forget_idle(KEEP_IDLE);
        }
        let oldest = self.parts.values().filter_map(Partition::oldest).min();
        let age = oldest.map_or(0, |t| (chrono::Utc::now() - t).num_seconds().max(0));
        self.hooks
            .report(&self.endpoint.id, self.pending() as i64, age);
    }

    /// When the next thing is due, with nothing else happening.
    fn next_due(&self) -> Instant {
        let now = Instant::now();
        let paused = self.parts.values().filter_map(|p| p.next_due(now)).min();
        [self.next_read, self.next_rebalance, self.next_save]
            .into_iter()
            .chain(paused)
            .min()
            .expect("a list of three")
    }
}

#[async_trait]
impl Worker for Dispatcher {
    fn name(&self) -> String {
        format!("webhook dispatcher {}", self.endpoint.id)
    }

    fn status(&self) -> String {
        format!(
            "{} partitions held, {} events pending, {} delivered",
            self.parts.len(),
            self.pending(),
            self.delivered
        )
    }

    async fn work(&mut self, stop: &CancellationToken) -> WorkerState {
        if self.listener.is_none() {
            // Listening before the first read: a ring after it is heard.
            self.listener = Some(self.hooks.bell.listen(&feed_channel()).await);
        }
        let now = Instant::now();
        if now >= self.next_rebalance {
            self.rebalance().await;
            self.next_rebalance = now + REBALANCE_EVERY;
        }
        if self.read_due || now >= self.next_read {
            self.read_due = false;
            self.read_feed().await;
            self.next_read = now + READ_BACKSTOP;
        }
        self.start_ready();
        if now >= self.next_save {
            self.save_marks().await;
            self.next_save = now + SAVE_EVERY;
        }
        if now >= self.next_count {
            if let Ok(n) = bounded(self.hooks.repo.count_dead_letters()).await {
                self.hooks.metrics.webhook_dead_letters.set(n as i64);
            }
            self.next_count = now + COUNT_EVERY;
        }
        let due = tokio::time::Instant::from_std(self.next_due());
        let listener = self.listener.as_mut().expect("made above");
        tokio::select! {
            _ = stop.cancelled() => {}
            Some(joined) = self.tasks.join_next(), if !self.tasks.is_empty() => {
                if let Ok(done) = joined {
                    self.finish(done);
                }
            }
            _ = listener.rung() => self.read_due = true,
            _ = tokio::time::sleep_until(due) => {}
        }
        WorkerState::Busy
    }

    /// Writes the marks and lets the leases go (a request cut here is
    /// delivered again by the next holder).
    async fn stopped(&mut self) {
        self.tasks.abort_all();
        while let Some(joined) = self.tasks.join_next().await {
            if let Ok(done) = joined {
                self.finish(done);
            }
        }
        let held: Vec<u32> = self.parts.keys().copied().collect();
        for p in held {
            self.give_back(p).await;
        }
        self.hooks.members.leave().await;
        self.hooks.report(&self.endpoint.id, 0, 0);
    }
}
