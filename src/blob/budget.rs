//! The one budget for upload buffer memory (`FILEDOCK_UPLOAD_MEMORY_BYTES`):
//! every part buffer the part writer fills or sends, and every tus tail it
//! loads, is reserved here first. An upload that finds the budget spent
//! waits for its turn (first come, first served) and reads nothing more from
//! its client meanwhile, so TCP pushes back on the sender; nothing fails.
//!
//! No wait can deadlock: an upload asks for one part at a time, never while
//! a part it fills is unfinished, and what it holds besides (parts being
//! sent) comes back without any budget. A reservation is never larger than
//! the whole budget, so a single upload always gets its part.

use std::sync::{
    Arc,
    atomic::{AtomicI64, Ordering},
};

use prometheus_client::metrics::{counter::Counter, gauge::Gauge};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::metrics::Metrics;

/// The budget counts in units of this many bytes (a semaphore permit is
/// one unit; `acquire_many` takes a `u32`, so bytes would cap a part at 4 GiB).
const UNIT: u64 = 1024;

/// Memory reserved for upload buffers, and what waits for it.
pub struct MemoryBudget {
    /// The limit in bytes; `None`: counted, never waited for.
    limit: Option<u64>,
    units: Arc<Semaphore>,
    used: Gauge,
    peak: Gauge,
    waiters: Gauge,
    waits: Counter,
}

impl MemoryBudget {
    /// A budget of `limit` bytes (0: no limit, only counted), shown in `metrics`.
    pub fn new(limit: u64, metrics: &Metrics) -> Arc<Self> {
        metrics.upload_memory_limit.set(limit as i64);
        let limit = (limit > 0).then_some(limit);
        // Rounded up, so that a reservation of the whole budget fits.
        let units = limit.map_or(0, |l| l.div_ceil(UNIT) as usize);
        Arc::new(Self {
            limit,
            units: Arc::new(Semaphore::new(units.min(Semaphore::MAX_PERMITS))),
            used: metrics.upload_memory_used.clone(),
            peak: metrics.upload_memory_peak.clone(),
            waiters: metrics.upload_memory_waiters.clone(),
            waits: metrics.upload_memory_waits.clone(),
        })
    }

    /// No limit, counted nowhere (tests that build a store by hand).
    pub fn unbounded() -> Arc<Self> {
        Self::new(0, &Metrics::default())
    }

    /// Reserves `bytes` (at most the whole budget), waiting until they are
    /// free. Dropping the future while it waits gives back what it had.
    pub async fn reserve(self: &Arc<Self>, bytes: u64) -> Reservation {
        let bytes = self.limit.map_or(bytes, |l| bytes.min(l));
        let permit = match self.limit {
            None => None,
            Some(_) => Some(self.acquire(units_of(bytes)).await),
        };
        let used = self.used.inner().fetch_add(bytes as i64, Ordering::Relaxed) + bytes as i64;
        self.peak.inner().fetch_max(used, Ordering::Relaxed);
        Reservation {
            budget: Some(self.clone()),
            permit,
            bytes,
        }
    }

    async fn acquire(&self, units: u32) -> OwnedSemaphorePermit {
        if let Ok(p) = self.units.clone().try_acquire_many_owned(units) {
            return p;
        }
        self.waits.inc();
        let _waiting = Waiting::enter(self.waiters.inner());
        self.units
            .clone()
            .acquire_many_owned(units)
            .await
            .expect("the budget's semaphore is never closed")
    }

    /// Bytes reserved now.
    pub fn used(&self) -> u64 {
        self.used.get().max(0) as u64
    }

    /// The most bytes ever reserved at once.
    pub fn peak(&self) -> u64 {
        self.peak.get().max(0) as u64
    }
}

fn units_of(bytes: u64) -> u32 {
    bytes.div_ceil(UNIT).min(u32::MAX as u64) as u32
}

/// Counts a waiter while it waits (also when its future is dropped).
struct Waiting<'a>(&'a AtomicI64);

impl<'a> Waiting<'a> {
    fn enter(count: &'a AtomicI64) -> Self {
        count.fetch_add(1, Ordering::Relaxed);
        Self(count)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Bytes of the budget held for one buffer; given back when dropped.
#[must_use = "the reservation is given back when dropped"]
pub struct Reservation {
    budget: Option<Arc<MemoryBudget>>,
    permit: Option<OwnedSemaphorePermit>,
    bytes: u64,
}

impl Reservation {
    /// Holds nothing (nothing was read).
    pub fn none() -> Self {
        Self {
            budget: None,
            permit: None,
            bytes: 0,
        }
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Gives back all but `bytes` (a buffer that turned out shorter).
    pub fn shrink_to(&mut self, bytes: u64) {
        if bytes >= self.bytes {
            return;
        }
        // Counted out before the units go back, so that the count never
        // passes the budget while another reservation takes them.
        if let Some(b) = &self.budget {
            b.used.dec_by((self.bytes - bytes) as i64);
        }
        self.bytes = bytes;
        if let Some(permit) = self.permit.as_mut() {
            let keep = units_of(bytes) as usize;
            let give = permit.num_permits().saturating_sub(keep);
            drop(permit.split(give));
        }
    }
}

impl Drop for Reservation {
    /// Counted out first; the units go back after, with `permit`.
    fn drop(&mut self) {
        if let Some(b) = &self.budget {
            b.used.dec_by(self.bytes as i64);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_reservation_past_the_budget_waits_for_one_given_back() {
        let budget = MemoryBudget::new(10 * UNIT, &Metrics::default());
        let first = budget.reserve(8 * UNIT).await;
        let second = budget.clone();
        let waiting = tokio::spawn(async move { second.reserve(4 * UNIT).await });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "only 2 units are free");
        assert_eq!(budget.waiters.get(), 1);
        drop(first);
        let second = waiting.await.unwrap();
        assert_eq!((budget.used(), budget.peak()), (4 * UNIT, 8 * UNIT));
        assert_eq!((budget.waiters.get(), budget.waits.get()), (0, 1));
        drop(second);
        assert_eq!(budget.used(), 0);
    }

    #[tokio::test]
    async fn a_reservation_larger_than_the_budget_gets_the_whole_budget() {
        let budget = MemoryBudget::new(4 * UNIT, &Metrics::default());
        let mut all = budget.reserve(100 * UNIT).await;
        assert_eq!(all.bytes(), 4 * UNIT);
        all.shrink_to(UNIT);
        assert_eq!(budget.used(), UNIT);
        let rest = budget.reserve(3 * UNIT).await;
        assert_eq!(budget.used(), 4 * UNIT);
        drop((all, rest));
        assert_eq!(budget.used(), 0);
        assert_eq!(budget.units.available_permits(), 4);
    }
}
