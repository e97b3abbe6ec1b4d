//! [`Locks`], the facade the services use over the [`LockManager`] port:
//! strategy (wake-on-release, or the original design's backoff), lease renewal,
//! metrics, and the degradation policy when the lock backend is down: a
//! lock is [`Held`] `Locked` or, in development with the backend down,
//! `Degraded` (go on without it). [`Locks::with_lock`] is the one "take,
//! work, release" sequence.

mod backoff;
pub mod memory;
mod port;
pub mod redis;
pub mod release;
mod strategy;
pub mod waiters;

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use self::backoff::LockBackoff;
pub use self::port::{Lease, LockError, LockManager, next_fence, now_micros, owner_token};
pub use self::release::{Asked, ReleaseBoard, ReleaseListener};
use self::strategy::{Backoff, Notify, WaitStrategy};
/// Lock keys are vocabulary (`crate::vocab`); named here too, where locks are.
pub use crate::vocab::LockKey;

use crate::{
    config::{LockSettings, LockStrategy},
    metrics::Metrics,
};

/// A lock held by this process. The watchdog renews it every TTL/3; if the
/// lease is lost, [`LockGuard::lost`] fires so the holder stops its work.
/// Dropped without [`LockGuard::release`], it is released in the background.
pub struct LockGuard {
    lease: Lease,
    /// Until when the lease surely holds, by this process's clock.
    until: LeaseClock,
    manager: Arc<dyn LockManager>,
    lost: CancellationToken,
    watchdog: JoinHandle<()>,
    released: bool,
    /// The lease each renewal grants: a release that fails is tried again
    /// for this long at most (the lease has run out by then).
    ttl: Duration,
}

/// How long a release that failed waits before it is tried again, at
/// first and at most (doubling in between).
const RELEASE_RETRY: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(2));

/// Releases `lease`. A release that fails (the backend away for a moment,
/// a master failing over) is tried again in the background until it
/// answers or the lease has run out anyway (`ttl` from now: it was last
/// renewed before now): a lock whose release was lost would otherwise bar
/// its key for what is left of its lease, five minutes by default. The
/// release is by owner token, so a late one frees nothing of another's.
async fn release_or_retry(manager: Arc<dyn LockManager>, lease: Lease, ttl: Duration) {
    let Err(e) = manager.release(&lease).await else {
        return;
    };
    tracing::warn!(key = %lease.key, error = %e, "lock release failed; trying again in the background until the lease would end");
    let deadline = Instant::now() + ttl;
    tokio::spawn(async move {
        let mut pause = RELEASE_RETRY.0;
        while Instant::now() + pause < deadline {
            tokio::time::sleep(pause).await;
            if manager.release(&lease).await.is_ok() {
                tracing::info!(key = %lease.key, "lock released on a later try");
                return;
            }
            pause = (pause * 2).min(RELEASE_RETRY.1);
        }
    });
}

/// Until when a held lease surely holds, by this process's monotonic
/// clock: from when its grant or last renewal was asked for (the lease
/// started no earlier), for its TTL. A process stopped (SIGSTOP, a long
/// pause) past it finds it passed when it wakes, before anything it then
/// does under the lease.
#[derive(Clone, Debug)]
pub struct LeaseClock(Arc<std::sync::Mutex<Instant>>);

impl LeaseClock {
    /// A clock that reads `until` (a lease's guard keeps its own up to date).
    pub fn new(until: Instant) -> Self {
        Self(Arc::new(std::sync::Mutex::new(until)))
    }

    pub fn until(&self) -> Instant {
        *self.0.lock().unwrap()
    }

    /// Whether the lease holds for at least `margin` more.
    pub fn holds_for(&self, margin: Duration) -> bool {
        Instant::now() + margin < self.until()
    }

    fn set(&self, until: Instant) {
        *self.0.lock().unwrap() = until;
    }
}

impl LockGuard {
    /// `asked`: when the grant was asked for.
    fn start(
        lease: Lease,
        manager: Arc<dyn LockManager>,
        ttl: Duration,
        asked: Instant,
        on_lost: impl Fn() + Send + 'static,
    ) -> Self {
        let lost = CancellationToken::new();
        let until = LeaseClock::new(asked + lease.ttl);
        let watchdog = tokio::spawn({
            let (lease, manager, lost) = (lease.clone(), manager.clone(), lost.clone());
            let clock = until.clone();
            async move {
                // When the lease runs out unless renewed.
                let mut expires = asked + lease.ttl;
                loop {
                    let now = Instant::now();
                    tokio::time::sleep(expires.saturating_duration_since(now).min(ttl) / 3).await;
                    // The lease runs from when the renewal was sent: its
                    // reply may arrive late, the lease does not wait for it.
                    let sent = Instant::now();
                    match manager.renew(&lease, ttl).await {
                        Ok(true) => {
                            expires = sent + ttl;
                            clock.set(expires);
                        }
                        Ok(false) => break,
                        Err(e) if Instant::now() < expires => {
                            tracing::warn!(key = %lease.key, error = %e, "lease renewal failed; retrying");
                        }
                        Err(_) => break,
                    }
                }
                tracing::error!(key = %lease.key, "lease lost while held; cancelling the holder's work");
                clock.set(Instant::now());
                on_lost();
                lost.cancel();
            }
        });
        Self {
            lease,
            until,
            manager,
            lost,
            watchdog,
            released: false,
            ttl,
        }
    }

    pub fn fence(&self) -> u64 {
        self.lease.fence
    }

    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// Until when the lease surely holds (see [`LeaseClock`]).
    pub fn clock(&self) -> LeaseClock {
        self.until.clone()
    }

    /// Fires when the lease is lost while held.
    pub fn lost(&self) -> CancellationToken {
        self.lost.clone()
    }

    /// Stops renewing and releases (compare-and-delete by owner token); its
    /// clock reads passed from now on.
    pub async fn release(mut self) {
        self.released = true;
        self.until.set(Instant::now());
        self.watchdog.abort();
        release_or_retry(self.manager.clone(), self.lease.clone(), self.ttl).await;
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        self.until.set(Instant::now());
        if !self.released {
            self.watchdog.abort();
            let (manager, lease) = (self.manager.clone(), self.lease.clone());
            if let Ok(handle) = tokio::runtime::Handle::try_current() {
                handle.spawn(release_or_retry(manager, lease, self.ttl));
            }
        }
    }
}

/// What [`Locks::acquire`] got: the lock, or — the lock backend being down
/// in development mode — leave to go on without it.
#[must_use = "a held lock must be released"]
pub enum Held {
    Locked(LockGuard),
    /// The backend is down and development mode goes on without a lock.
    Degraded,
}

impl Held {
    /// The guard, if the lock is held.
    pub fn guard(&self) -> Option<&LockGuard> {
        match self {
            Self::Locked(g) => Some(g),
            Self::Degraded => None,
        }
    }

    /// The fencing token, if the lock is held.
    pub fn fence(&self) -> Option<u64> {
        self.guard().map(LockGuard::fence)
    }

    /// The guard; panics if the lock backend was down (tests and benches,
    /// which run where it is not).
    pub fn unwrap(self) -> LockGuard {
        match self {
            Self::Locked(g) => g,
            Self::Degraded => panic!("the lock backend was down: no lock held"),
        }
    }

    /// Releases the lock, if held.
    pub async fn release(self) {
        if let Self::Locked(g) = self {
            g.release().await;
        }
    }
}

/// The result of [`Locks::try_acquire`].
pub enum TryLock {
    Held(LockGuard),
    /// Someone else holds it.
    Busy,
    /// The backend is down and development mode goes on without a lock.
    Degraded,
}

/// What the services call: picks the strategy, renews leases, records
/// metrics, and applies the degradation policy.
pub struct Locks {
    manager: Arc<dyn LockManager>,
    /// How a waiter gets a held lock, chosen from the settings at start-up.
    strategy: Box<dyn WaitStrategy>,
    settings: LockSettings,
    production: bool,
    metrics: Arc<Metrics>,
    /// When each part of the backend was last seen down (the 1 s circuit
    /// breaker; see [`LockManager::outage_scope`]).
    down_since: Mutex<HashMap<u16, Instant>>,
}

fn breaker_error() -> LockError {
    LockError::Unavailable("lock backend marked down in the last second".into())
}

/// How long a backend failure short-circuits further attempts.
const BREAKER_WINDOW: Duration = Duration::from_secs(1);

/// How often [`Locks::take_over`] asks the holder again while it waits.
pub const RELEASE_ASKED_EVERY: Duration = Duration::from_millis(250);

impl Locks {
    pub fn new(
        manager: Arc<dyn LockManager>,
        settings: LockSettings,
        production: bool,
        metrics: Arc<Metrics>,
    ) -> Self {
        let strategy: Box<dyn WaitStrategy> = match settings.strategy {
            LockStrategy::Notify => Box::new(Notify),
            LockStrategy::Backoff => Box::new(Backoff(LockBackoff::default())),
        };
        Self {
            manager,
            strategy,
            settings,
            production,
            metrics,
            down_since: Mutex::default(),
        }
    }

    pub fn manager(&self) -> &Arc<dyn LockManager> {
        &self.manager
    }

    /// Takes `key` within the configured wait. `Held::Degraded` means the
    /// backend is down and, in development, the caller proceeds without a lock.
    pub async fn acquire(&self, key: &LockKey) -> Result<Held, LockError> {
        let started = Instant::now();
        let result = match self.breaker_open(key) {
            true => Err(breaker_error()),
            false => {
                let (ttl, wait) = (self.settings.ttl, self.settings.wait_timeout);
                let manager = self.manager.as_ref();
                self.strategy
                    .acquire(manager, key.as_str(), ttl, wait)
                    .await
            }
        };
        match result {
            Ok(lease) => {
                self.metrics
                    .observe_lock_wait(key.level(), started.elapsed());
                Ok(Held::Locked(self.guard(lease, key.level())))
            }
            Err(LockError::Timeout(w)) => {
                self.metrics
                    .lock_timeouts
                    .get_or_create(&Metrics::level(key.level()))
                    .inc();
                Err(LockError::Timeout(w))
            }
            Err(LockError::Unavailable(why)) => self.degrade(key, why).map(|()| Held::Degraded),
            Err(e @ LockError::Misrouted(_)) => Err(self.misrouted(key, e)),
        }
    }

    /// Takes `key`, runs `work` with what it got, and releases: the
    /// "lock, do, release" sequence every coordinated write follows.
    pub async fn with_lock<T, E: From<LockError>>(
        &self,
        key: &LockKey,
        work: impl AsyncFnOnce(&Held) -> Result<T, E>,
    ) -> Result<T, E> {
        let held = self.acquire(key).await?;
        let result = work(&held).await;
        held.release().await;
        result
    }

    /// One attempt, no waiting: for work that another instance may be doing.
    pub async fn try_acquire(&self, key: &LockKey) -> Result<TryLock, LockError> {
        let attempt = match self.breaker_open(key) {
            true => Err(breaker_error()),
            false => {
                self.manager
                    .try_acquire(key.as_str(), self.settings.ttl)
                    .await
            }
        };
        match attempt {
            Ok(Some(lease)) => Ok(TryLock::Held(self.guard(lease, key.level()))),
            Ok(None) => Ok(TryLock::Busy),
            Err(LockError::Unavailable(why)) => self.degrade(key, why).map(|()| TryLock::Degraded),
            Err(e @ LockError::Misrouted(_)) => Err(self.misrouted(key, e)),
            Err(e) => Err(e),
        }
    }

    /// As [`Self::try_acquire`], but a lock held by someone else is asked
    /// to let go ([`LockManager::request_release`]) and waited for, up to
    /// `wait`: `Busy` only if its holder did not let go by then (it does
    /// not listen, or its process is gone and its lease runs out later).
    /// The request is sent again every [`RELEASE_ASKED_EVERY`], for a
    /// holder that started listening after the first one.
    pub async fn take_over(&self, key: &LockKey, wait: Duration) -> Result<TryLock, LockError> {
        let deadline = Instant::now() + wait;
        loop {
            match self.try_acquire(key).await? {
                TryLock::Busy => {}
                got => return Ok(got),
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(TryLock::Busy);
            }
            if let Err(e) = self.manager.request_release(key.as_str()).await {
                tracing::warn!(key = key.as_str(), error = %e, "could not ask the holder to let go");
            }
            let slice = deadline.min(now + RELEASE_ASKED_EVERY);
            let ttl = self.settings.ttl;
            match self.manager.acquire_fair(key.as_str(), ttl, slice).await {
                Ok(lease) => return Ok(TryLock::Held(self.guard(lease, key.level()))),
                Err(LockError::Timeout(_)) => {}
                Err(LockError::Unavailable(why)) => {
                    return self.degrade(key, why).map(|()| TryLock::Degraded);
                }
                Err(e @ LockError::Misrouted(_)) => return Err(self.misrouted(key, e)),
            }
        }
    }

    /// Listens for other requests asking for `key` (see [`Self::take_over`]),
    /// for a holder that can stop early and leave its work resumable.
    pub async fn listen_for_release(&self, key: &LockKey) -> ReleaseListener {
        self.manager.listen_for_release(key.as_str()).await
    }

    /// One attempt at a lease with its own TTL, renewed while held. Never
    /// degrades: without the lock backend there is no lease.
    pub async fn try_lease(
        &self,
        key: &LockKey,
        ttl: Duration,
    ) -> Result<Option<LockGuard>, LockError> {
        let asked = Instant::now();
        let lease = self.manager.try_acquire(key.as_str(), ttl).await?;
        Ok(lease.map(|lease| {
            let (metrics, lvl) = (self.metrics.clone(), Metrics::level(key.level()));
            LockGuard::start(lease, self.manager.clone(), ttl, asked, move || {
                metrics.lock_lost.get_or_create(&lvl).inc();
            })
        }))
    }

    /// The degradation policy: remember the outage (circuit breaker); in
    /// production fail, in development warn and go on without a lock.
    fn degrade(&self, key: &LockKey, why: String) -> Result<(), LockError> {
        let scope = self.manager.outage_scope(key.as_str());
        self.down_since
            .lock()
            .unwrap()
            .entry(scope)
            .or_insert_with(Instant::now);
        if self.production {
            return Err(LockError::Unavailable(why));
        }
        self.metrics
            .lock_degraded
            .get_or_create(&Metrics::level(key.level()))
            .inc();
        tracing::warn!(key = key.as_str(), reason = %why, "lock backend down; proceeding without a lock (development mode)");
        Ok(())
    }

    /// A topology answer: counted and logged, then refused as it is, with
    /// no breaker (the backend answered) and no lock-free path.
    fn misrouted(&self, key: &LockKey, e: LockError) -> LockError {
        self.metrics
            .lock_misrouted
            .get_or_create(&Metrics::level(key.level()))
            .inc();
        tracing::error!(key = key.as_str(), error = %e, "lock call misrouted; refusing the request");
        e
    }

    fn guard(&self, lease: Lease, level: &str) -> LockGuard {
        let scope = self.manager.outage_scope(&lease.key);
        self.down_since.lock().unwrap().remove(&scope);
        let (metrics, lvl) = (self.metrics.clone(), Metrics::level(level));
        // Asked for before now: the clock of a lease taken by waiting is
        // not read (only leases taken by `try_lease` are timed).
        let asked = Instant::now();
        LockGuard::start(
            lease,
            self.manager.clone(),
            self.settings.ttl,
            asked,
            move || {
                metrics.lock_lost.get_or_create(&lvl).inc();
            },
        )
    }

    fn breaker_open(&self, key: &LockKey) -> bool {
        let scope = self.manager.outage_scope(key.as_str());
        let mut down = self.down_since.lock().unwrap();
        match down.get(&scope) {
            Some(t) if t.elapsed() < BREAKER_WINDOW => true,
            Some(_) => {
                down.remove(&scope);
                false
            }
            None => false,
        }
    }

    /// Whether the backend answers (for `/readyz`).
    pub async fn ping(&self) -> Result<(), LockError> {
        self.manager.ping().await
    }
}

#[cfg(test)]
mod lease_clock_tests {
    use super::*;
    use crate::{
        config::{LockScope, LockStrategy},
        lock::memory::MemoryLocks,
    };

    fn locks() -> Locks {
        let settings = LockSettings {
            strategy: LockStrategy::Notify,
            scope: LockScope::Commit,
            ttl: Duration::from_secs(5),
            wait_timeout: Duration::from_secs(1),
        };
        Locks::new(
            Arc::new(MemoryLocks::new()),
            settings,
            false,
            Arc::default(),
        )
    }

    /// A lease's clock runs from before its grant for its TTL, moves on
    /// with each renewal, and reads passed once it is released.
    #[tokio::test]
    async fn a_lease_s_clock_holds_while_renewed_and_passes_at_release() {
        let locks = locks();
        let key = LockKey::webhook_partition("e", 0);
        let asked = Instant::now();
        let ttl = Duration::from_millis(600);
        let guard = locks.try_lease(&key, ttl).await.unwrap().unwrap();
        let clock = guard.clock();
        assert!(clock.until() <= asked + ttl + Duration::from_millis(50));
        assert!(clock.holds_for(Duration::from_millis(300)));
        tokio::time::sleep(Duration::from_millis(900)).await;
        assert!(
            clock.holds_for(Duration::ZERO),
            "renewed past its first TTL"
        );
        guard.release().await;
        assert!(!clock.holds_for(Duration::ZERO), "released: passed");
    }
}
