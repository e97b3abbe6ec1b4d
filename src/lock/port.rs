//! The lock backend's port: a [`Lease`], the [`LockError`]s, and the
//! [`LockManager`] each backend (in process, Redis) implements; with the
//! fencing-token and owner-token helpers they share.

use std::time::{Duration, Instant};

use async_trait::async_trait;

use super::release::{ReleaseBoard, ReleaseListener};

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
