//! How a waiter gets a lock that someone else holds
//! (`FILEDOCK_LOCK_STRATEGY`): woken by the release, or the original
//! design's backoff loop.

use std::time::{Duration, Instant};

use async_trait::async_trait;

use super::{
    backoff::LockBackoff,
    port::{Lease, LockError, LockManager},
};

/// How a waiter gets a lock that someone else holds (`FILEDOCK_LOCK_STRATEGY`).
#[async_trait]
pub(super) trait WaitStrategy: Send + Sync {
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
pub(super) struct Notify;

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
pub(super) struct Backoff(pub(super) LockBackoff);

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
