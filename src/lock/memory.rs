//! In-process `LockManager` with the Redis adapter's semantics: random
//! owner token, TTL, owner-only release and renewal, increasing fencing
//! tokens, and FIFO waiters handed the lock directly on release.

use std::{
    collections::{HashMap, VecDeque},
    sync::{
        Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use async_trait::async_trait;
use tokio::sync::oneshot;

use super::{Lease, LockError, LockManager, next_fence, now_micros, owner_token};

#[derive(Default)]
pub struct MemoryLocks {
    slots: Mutex<HashMap<String, Slot>>,
    fence: AtomicU64,
    tickets: AtomicU64,
}

#[derive(Default)]
struct Slot {
    holder: Option<Holder>,
    waiters: VecDeque<Waiter>,
}

struct Holder {
    owner: String,
    expires: Instant,
}

struct Waiter {
    ticket: u64,
    ttl: Duration,
    grant: oneshot::Sender<Lease>,
}

impl Slot {
    fn is_free(&self, now: Instant) -> bool {
        self.holder.as_ref().is_none_or(|h| h.expires <= now)
    }
}

impl MemoryLocks {
    pub fn new() -> Self {
        Self::default()
    }

    /// Waiters queued for `key` (as `ZCARD` of its queue shows on Redis).
    pub fn waiters(&self, key: &str) -> usize {
        self.slots
            .lock()
            .unwrap()
            .get(key)
            .map_or(0, |slot| slot.waiters.len())
    }

    /// Drops `key`'s holder, as a Redis flush or failover that lost the
    /// key does: its next renewal fails, and its lease is lost.
    #[cfg(test)]
    pub(crate) fn evict(&self, key: &str) {
        if let Some(slot) = self.slots.lock().unwrap().get_mut(key) {
            slot.holder = None;
        }
    }

    fn grant(&self, key: &str, slot: &mut Slot, ttl: Duration) -> Lease {
        let mut fence = 0;
        let _ = self
            .fence
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |p| {
                fence = next_fence(p, now_micros());
                Some(fence)
            });
        let owner = owner_token();
        slot.holder = Some(Holder {
            owner: owner.clone(),
            expires: Instant::now() + ttl,
        });
        Lease {
            key: key.to_owned(),
            owner,
            fence,
            ttl,
        }
    }

    /// Hands the free lock to the first waiter still waiting.
    fn hand_off(&self, key: &str, slot: &mut Slot) {
        while let Some(w) = slot.waiters.pop_front() {
            let lease = self.grant(key, slot, w.ttl);
            if w.grant.send(lease).is_ok() {
                return;
            }
            slot.holder = None; // that waiter gave up; try the next
        }
    }
}

#[async_trait]
impl LockManager for MemoryLocks {
    async fn try_acquire(&self, key: &str, ttl: Duration) -> Result<Option<Lease>, LockError> {
        let mut slots = self.slots.lock().unwrap();
        let slot = slots.entry(key.to_owned()).or_default();
        if slot.is_free(Instant::now()) && slot.waiters.is_empty() {
            return Ok(Some(self.grant(key, slot, ttl)));
        }
        Ok(None)
    }

    async fn acquire_fair(
        &self,
        key: &str,
        ttl: Duration,
        deadline: Instant,
    ) -> Result<Lease, LockError> {
        let started = Instant::now();
        let ticket = self.tickets.fetch_add(1, Ordering::Relaxed);
        let (tx, mut rx) = oneshot::channel();
        let mut holder_expires = {
            let mut slots = self.slots.lock().unwrap();
            let slot = slots.entry(key.to_owned()).or_default();
            if slot.is_free(Instant::now()) && slot.waiters.is_empty() {
                return Ok(self.grant(key, slot, ttl));
            }
            slot.waiters.push_back(Waiter {
                ticket,
                ttl,
                grant: tx,
            });
            slot.holder.as_ref().map(|h| h.expires)
        };
        loop {
            // Woken by a hand-off; the timer only covers a holder that
            // expired without releasing, and our own deadline.
            let wake_at = holder_expires.map_or(deadline, |e| e.min(deadline));
            tokio::select! {
                granted = &mut rx => if let Ok(lease) = granted { return Ok(lease) },
                _ = tokio::time::sleep_until(wake_at.into()) => {}
            }
            let mut slots = self.slots.lock().unwrap();
            if let Ok(lease) = rx.try_recv() {
                return Ok(lease);
            }
            let slot = slots.entry(key.to_owned()).or_default();
            let now = Instant::now();
            let at_front = slot.waiters.front().is_some_and(|w| w.ticket == ticket);
            if at_front && slot.is_free(now) {
                slot.waiters.pop_front();
                return Ok(self.grant(key, slot, ttl));
            }
            if now >= deadline {
                slot.waiters.retain(|w| w.ticket != ticket);
                if slot.is_free(now) {
                    self.hand_off(key, slot);
                }
                return Err(LockError::Timeout(started.elapsed()));
            }
            holder_expires = slot.holder.as_ref().map(|h| h.expires);
        }
    }

    async fn release(&self, lease: &Lease) -> Result<bool, LockError> {
        let mut slots = self.slots.lock().unwrap();
        let Some(slot) = slots.get_mut(&lease.key) else {
            return Ok(false);
        };
        if slot.holder.as_ref().is_none_or(|h| h.owner != lease.owner) {
            return Ok(false);
        }
        slot.holder = None;
        self.hand_off(&lease.key, slot);
        if slot.holder.is_none() && slot.waiters.is_empty() {
            slots.remove(&lease.key);
        }
        Ok(true)
    }

    async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<bool, LockError> {
        let mut slots = self.slots.lock().unwrap();
        let now = Instant::now();
        match slots.get_mut(&lease.key).and_then(|s| s.holder.as_mut()) {
            Some(h) if h.owner == lease.owner && h.expires > now => {
                h.expires = now + ttl;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn ping(&self) -> Result<(), LockError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    const TTL: Duration = Duration::from_secs(30);

    fn far() -> Instant {
        Instant::now() + Duration::from_secs(10)
    }

    #[tokio::test]
    async fn only_the_owner_releases_and_fences_increase() {
        let locks = MemoryLocks::new();
        let a = locks.try_acquire("k", TTL).await.unwrap().unwrap();
        assert!(locks.try_acquire("k", TTL).await.unwrap().is_none(), "held");
        let forged = Lease {
            owner: owner_token(),
            ..a.clone()
        };
        assert!(
            !locks.release(&forged).await.unwrap(),
            "a non-owner cannot release"
        );
        assert!(
            locks.try_acquire("k", TTL).await.unwrap().is_none(),
            "still held"
        );
        assert!(locks.release(&a).await.unwrap());
        let b = locks.try_acquire("k", TTL).await.unwrap().unwrap();
        assert!(b.fence > a.fence);
        assert_ne!(a.owner, b.owner);
    }

    #[tokio::test]
    async fn an_expired_lease_can_be_taken_and_cannot_be_renewed() {
        let locks = MemoryLocks::new();
        let a = locks
            .try_acquire("k", Duration::from_millis(20))
            .await
            .unwrap()
            .unwrap();
        tokio::time::sleep(Duration::from_millis(40)).await;
        assert!(!locks.renew(&a, TTL).await.unwrap());
        let b = locks
            .try_acquire("k", TTL)
            .await
            .unwrap()
            .expect("expired lock is free");
        assert!(b.fence > a.fence);
        assert!(
            !locks.release(&a).await.unwrap(),
            "the old holder cannot release the new one"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn waiters_are_served_in_arrival_order() {
        let locks = Arc::new(MemoryLocks::new());
        let first = locks.try_acquire("k", TTL).await.unwrap().unwrap();
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for i in 0..20 {
            let (mine, order) = (locks.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                let lease = mine.acquire_fair("k", TTL, far()).await.unwrap();
                order.lock().unwrap().push(i);
                mine.release(&lease).await.unwrap();
            }));
            // Each waiter is queued before the next one arrives.
            while locks.slots.lock().unwrap()["k"].waiters.len() < i + 1 {
                tokio::task::yield_now().await;
            }
        }
        locks.release(&first).await.unwrap();
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), (0..20).collect::<Vec<_>>());
    }

    #[tokio::test]
    async fn a_waiter_times_out_at_its_deadline_and_leaves_the_queue() {
        let locks = MemoryLocks::new();
        let _held = locks.try_acquire("k", TTL).await.unwrap().unwrap();
        let started = Instant::now();
        let r = locks
            .acquire_fair("k", TTL, Instant::now() + Duration::from_millis(50))
            .await;
        assert!(matches!(r, Err(LockError::Timeout(_))));
        assert!(started.elapsed() >= Duration::from_millis(50));
        assert!(locks.slots.lock().unwrap()["k"].waiters.is_empty());
    }

    #[tokio::test]
    async fn a_waiter_takes_over_from_a_holder_that_expired() {
        let locks = MemoryLocks::new();
        let stale = locks
            .try_acquire("k", Duration::from_millis(30))
            .await
            .unwrap()
            .unwrap();
        let next = locks.acquire_fair("k", TTL, far()).await.unwrap();
        assert!(next.fence > stale.fence);
    }
}
