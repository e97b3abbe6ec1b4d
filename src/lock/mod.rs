//! The `LockManager` port and [`Locks`], the facade the services use:
//! strategy (wake-on-release, or the original design's backoff), lease renewal,
//! metrics, and the degradation policy when the lock backend is down: a
//! lock is [`Held`] `Locked` or, in development with the backend down,
//! `Degraded` (go on without it). [`Locks::with_lock`] is the one "take,
//! work, release" sequence.

mod backoff;
pub mod memory;
pub mod redis;
pub mod release;
pub mod waiters;

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use async_trait::async_trait;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use self::backoff::LockBackoff;
pub use self::release::{Asked, ReleaseBoard, ReleaseListener};
/// Lock keys are vocabulary (`crate::vocab`); named here too, where locks are.
pub use crate::vocab::LockKey;

use crate::{
    config::{LockSettings, LockStrategy},
    metrics::Metrics,
};

/// A held lock: the key, the holder's random owner token, and its fencing
/// token (strictly greater than any token handed out before for this key).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    pub key: String,
    pub owner: String,
    pub fence: u64,
    /// How long the lease runs from its grant, before the first renewal. A
    /// lock handed over to a waiter starts short, so that a waiter that died
    /// while queued cannot hold it long.
    pub ttl: Duration,
}

#[derive(Clone, Debug, thiserror::Error)]
pub enum LockError {
    #[error("timed out after {0:?} waiting for the lock")]
    Timeout(Duration),
    #[error("lock backend unavailable: {0}")]
    Unavailable(String),
    /// Redis answered from a node that cannot serve the key now (MOVED,
    /// ASK…; a demoted primary's READONLY; no primary the sentinels agree
    /// on): the call did not run. Never degraded around, and no breaker:
    /// another node may be granting locks meanwhile.
    #[error(
        "Redis answered from a node that cannot serve this key now ({0}): a Redis Cluster slot that moved or a node cut off, or a primary demoted or not yet chosen"
    )]
    Misrouted(String),
}

/// A lock backend. Implementations must be owner-safe (release and renew
/// only by the owner token) and hand out increasing fencing tokens.
#[async_trait]
pub trait LockManager: Send + Sync {
    /// One attempt, no waiting (the backoff strategy's primitive). Does not
    /// jump ahead of queued fair waiters.
    async fn try_acquire(&self, key: &str, ttl: Duration) -> Result<Option<Lease>, LockError>;

    /// Waits in arrival order, woken when the lock is handed over, until `deadline`.
    async fn acquire_fair(
        &self,
        key: &str,
        ttl: Duration,
        deadline: Instant,
    ) -> Result<Lease, LockError>;

    /// Releases if `lease` still owns the lock; `false` if it did not.
    async fn release(&self, lease: &Lease) -> Result<bool, LockError>;

    /// Extends the lease if still owned; `false` if it was lost.
    async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<bool, LockError>;

    async fn ping(&self) -> Result<(), LockError>;

    /// Asks whoever holds `key`, in this process or another, to let go
    /// soon (`release.rs`); a holder that does not listen ignores it.
    async fn request_release(&self, key: &str) -> Result<(), LockError>;

    /// This process's holders that listen for release requests.
    fn release_board(&self) -> &ReleaseBoard;

    /// Listens for release requests on `key` (on the board, and wherever
    /// the manager must subscribe to hear them).
    async fn listen_for_release(&self, key: &str) -> ReleaseListener {
        self.release_board().listen(key)
    }

    /// Which part of the backend `key` lives on: an outage of one part
    /// (a Redis Cluster's master: its slots) opens the breaker for the
    /// keys of that part only.
    fn outage_scope(&self, _key: &str) -> u16 {
        0
    }
}

/// A lock held by this process. The watchdog renews it every TTL/3; if the
/// lease is lost, [`LockGuard::lost`] fires so the holder stops its work.
/// Dropped without [`LockGuard::release`], it is released in the background.
pub struct LockGuard {
    lease: Lease,
    manager: Arc<dyn LockManager>,
    lost: CancellationToken,
    watchdog: JoinHandle<()>,
    released: bool,
}

impl LockGuard {
    fn start(
        lease: Lease,
        manager: Arc<dyn LockManager>,
        ttl: Duration,
        on_lost: impl Fn() + Send + 'static,
    ) -> Self {
        let lost = CancellationToken::new();
        let watchdog = tokio::spawn({
            let (lease, manager, lost) = (lease.clone(), manager.clone(), lost.clone());
            async move {
                // When the lease runs out unless renewed.
                let mut expires = Instant::now() + lease.ttl;
                loop {
                    let now = Instant::now();
                    tokio::time::sleep(expires.saturating_duration_since(now).min(ttl) / 3).await;
                    // The lease runs from when the renewal was sent: its
                    // reply may arrive late, the lease does not wait for it.
                    let sent = Instant::now();
                    match manager.renew(&lease, ttl).await {
                        Ok(true) => expires = sent + ttl,
                        Ok(false) => break,
                        Err(e) if Instant::now() < expires => {
                            tracing::warn!(key = %lease.key, error = %e, "lease renewal failed; retrying");
                        }
                        Err(_) => break,
                    }
                }
                tracing::error!(key = %lease.key, "lease lost while held; cancelling the holder's work");
                on_lost();
                lost.cancel();
            }
        });
        Self {
            lease,
            manager,
            lost,
            watchdog,
            released: false,
        }
    }

    pub fn fence(&self) -> u64 {
        self.lease.fence
    }

    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// Fires when the lease is lost while held.
    pub fn lost(&self) -> CancellationToken {
        self.lost.clone()
    }

    /// Stops renewing and releases (compare-and-delete by owner token).
    pub async fn release(mut self) {
        self.released = true;
        self.watchdog.abort();
        if let Err(e) = self.manager.release(&self.lease).await {
            tracing::warn!(key = %self.lease.key, error = %e, "lock release failed; it expires with its TTL");
        }
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if !self.released {
            self.watchdog.abort();
            let (manager, lease) = (self.manager.clone(), self.lease.clone());
            if let Ok(handle) = tokio::runtime::Handle::try_current() {
                handle.spawn(async move {
                    let _ = manager.release(&lease).await;
                });
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
        let lease = self.manager.try_acquire(key.as_str(), ttl).await?;
        Ok(lease.map(|lease| {
            let (metrics, lvl) = (self.metrics.clone(), Metrics::level(key.level()));
            LockGuard::start(lease, self.manager.clone(), ttl, move || {
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
        LockGuard::start(lease, self.manager.clone(), self.settings.ttl, move || {
            metrics.lock_lost.get_or_create(&lvl).inc();
        })
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

/// How a waiter gets a lock that someone else holds (`FILEDOCK_LOCK_STRATEGY`).
#[async_trait]
trait WaitStrategy: Send + Sync {
    /// The lock on `key`, waiting at most `wait` for it.
    async fn acquire(
        &self,
        manager: &dyn LockManager,
        key: &str,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Lease, LockError>;
}

/// Queue in arrival order; the holder's release hands the lock to the next
/// waiter, who is woken by a notice (the default: BENCHMARKS.md).
struct Notify;

#[async_trait]
impl WaitStrategy for Notify {
    async fn acquire(
        &self,
        manager: &dyn LockManager,
        key: &str,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Lease, LockError> {
        manager.acquire_fair(key, ttl, Instant::now() + wait).await
    }
}

/// The original design's loop: try, sleep on a growing schedule, try again
/// (kept to measure against; see [`LockBackoff`]).
struct Backoff(LockBackoff);

#[async_trait]
impl WaitStrategy for Backoff {
    async fn acquire(
        &self,
        manager: &dyn LockManager,
        key: &str,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Lease, LockError> {
        let deadline = Instant::now() + wait;
        for delay in self.0.delays() {
            if let Some(lease) = manager.try_acquire(key, ttl).await? {
                return Ok(lease);
            }
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            tokio::time::sleep(jitter(delay).min(deadline - now)).await;
        }
        Err(LockError::Timeout(wait))
    }
}

/// A random sleep in `[d/2, d]`. Without it, waiters that arrived together
/// retry together: in a 100-way burst on one key, the plain schedule
/// let only one or two through per wave and 76 of 100 timed out.
fn jitter(d: Duration) -> Duration {
    use rand::Rng;
    d.mul_f64(rand::rng().random_range(0.5..=1.0))
}

/// A fencing token that never goes backwards, even if the counter behind
/// it is lost (a restarted in-process manager, a flushed Redis): the next
/// token is `max(previous + 1, now in µs)`.
pub fn next_fence(previous: u64, now_micros: u64) -> u64 {
    (previous + 1).max(now_micros)
}

pub fn now_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// A random owner token (128 bits).
pub fn owner_token() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}
