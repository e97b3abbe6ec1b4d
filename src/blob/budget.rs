//! The one budget for upload buffer memory (`FILEDOCK_UPLOAD_MEMORY_BYTES`):
//! every part buffer the part writer fills or sends, and every tus tail it
//! loads, is reserved here first. An upload that finds the budget spent
//! waits for its turn (first come, first served) and reads nothing more from
//! its client meanwhile, so TCP pushes back on the sender.
//!
//! Two bounds keep one client from stalling the others: a user's uploads
//! together hold at most the user's share (`FILEDOCK_UPLOAD_MEMORY_USER_SHARE`
//! of the budget), and a wait lasts at most `FILEDOCK_UPLOAD_MEMORY_WAIT_SECS`,
//! after which the reservation is refused ([`Refused::Busy`]: the upload
//! answers 503 `memory_busy`). A waiting tus PATCH also stops when another
//! request asks it to let go of its upload ([`Refused::LetGo`]).
//!
//! No wait can deadlock: an upload asks for one part at a time, never while
//! a part it fills is unfinished, and what it holds besides (parts being
//! sent) comes back without any budget. A reservation is never larger than
//! the whole budget or the user's share, so a single upload always gets its
//! part. (This is why a part is reserved whole once its first bytes arrive,
//! not grown chunk by chunk: uploads that each held half a part and waited
//! for the rest could wait on each other for ever.)

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicI64, Ordering},
    },
    time::Duration,
};

use futures::future::BoxFuture;
use prometheus_client::metrics::{counter::Counter, gauge::Gauge};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::metrics::Metrics;

/// The budget counts in units of this many bytes (a semaphore permit is
/// one unit; `acquire_many` takes a `u32`, so bytes would cap a part at 4 GiB).
const UNIT: u64 = 1024;

/// How a budget is bounded.
#[derive(Clone, Copy, Debug)]
pub struct BudgetLimits {
    /// All uploads together; 0: no limit (only counted).
    pub bytes: u64,
    /// One user's uploads together; 0: no limit of their own.
    pub per_user: u64,
    /// How long a reservation waits before it is refused; `None`: for ever.
    pub wait: Option<Duration>,
}

impl BudgetLimits {
    /// All uploads together hold at most `bytes`; nothing else is bounded.
    pub fn total(bytes: u64) -> Self {
        Self {
            bytes,
            per_user: 0,
            wait: None,
        }
    }
}

/// Resolves when whoever waits for the budget should stop waiting (another
/// request asked a tus PATCH to let go of its upload); called once per wait.
pub type LetGo = Arc<dyn Fn() -> BoxFuture<'static, ()> + Send + Sync>;

/// Why a reservation was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// The budget stayed spent for this long.
    Busy(Duration),
    /// The upload was asked to let go while it waited.
    LetGo,
}

/// Memory reserved for upload buffers, and what waits for it.
pub struct MemoryBudget {
    /// The limit in bytes; `None`: counted, never waited for.
    limit: Option<u64>,
    /// One user's limit in bytes, when there is one.
    per_user: Option<u64>,
    wait: Option<Duration>,
    units: Arc<Semaphore>,
    /// Each user's share while the user holds or waits for some of it.
    users: Mutex<HashMap<String, Arc<Semaphore>>>,
    used: Gauge,
    peak: Gauge,
    waiters: Gauge,
    waits: Counter,
    busy: Counter,
}

impl MemoryBudget {
    /// A budget bounded by `limits`, shown in `metrics`.
    pub fn new(limits: BudgetLimits, metrics: &Metrics) -> Arc<Self> {
        metrics.upload_memory_limit.set(limits.bytes as i64);
        let limit = (limits.bytes > 0).then_some(limits.bytes);
        // A share as large as the budget bounds nothing of its own.
        let per_user = limit
            .and_then(|l| (0 < limits.per_user && limits.per_user < l).then_some(limits.per_user));
        // Rounded up, so that a reservation of the whole budget fits.
        let units = limit.map_or(0, |l| l.div_ceil(UNIT) as usize);
        Arc::new(Self {
            limit,
            per_user,
            wait: limits.wait,
            units: Arc::new(Semaphore::new(units.min(Semaphore::MAX_PERMITS))),
            users: Mutex::default(),
            used: metrics.upload_memory_used.clone(),
            peak: metrics.upload_memory_peak.clone(),
            waiters: metrics.upload_memory_waiters.clone(),
            waits: metrics.upload_memory_waits.clone(),
            busy: metrics.upload_memory_busy.clone(),
        })
    }

    /// No limit, counted nowhere (tests that build a store by hand).
    pub fn unbounded() -> Arc<Self> {
        Self::new(BudgetLimits::total(0), &Metrics::default())
    }

    /// Reservations for `user`'s upload (`None`: counted against no user).
    pub fn claim(self: &Arc<Self>, user: Option<&str>) -> Claim {
        Claim {
            budget: self.clone(),
            user: user.map(str::to_owned),
            let_go: None,
        }
    }

    /// The semaphore of `user`'s share, made when the user first asks.
    fn share_of(&self, user: &str) -> Option<Arc<Semaphore>> {
        let share = self.per_user?;
        let mut users = self.users.lock().unwrap();
        let units = share.div_ceil(UNIT) as usize;
        let sem = users
            .entry(user.to_owned())
            .or_insert_with(|| Arc::new(Semaphore::new(units.min(Semaphore::MAX_PERMITS))));
        Some(sem.clone())
    }

    /// Forgets `user`'s share once nobody holds or waits for any of it
    /// (every permit and every waiter holds the semaphore).
    fn forget_idle(&self, user: &str) {
        let mut users = self.users.lock().unwrap();
        if users.get(user).is_some_and(|s| Arc::strong_count(s) == 1) {
            users.remove(user);
        }
    }

    /// Bytes reserved now.
    pub fn used(&self) -> u64 {
        self.used.get().max(0) as u64
    }

    /// The most bytes ever reserved at once.
    pub fn peak(&self) -> u64 {
        self.peak.get().max(0) as u64
    }

    fn count_in(&self, bytes: u64) {
        let used = self.used.inner().fetch_add(bytes as i64, Ordering::Relaxed) + bytes as i64;
        self.peak.inner().fetch_max(used, Ordering::Relaxed);
    }
}

/// Who reserves: one upload (of a user), and what may stop its waits.
pub struct Claim {
    budget: Arc<MemoryBudget>,
    user: Option<String>,
    let_go: Option<LetGo>,
}

impl Claim {
    /// Waits stop (refused with [`Refused::LetGo`]) when `let_go` resolves.
    pub fn let_go_on(mut self, let_go: Option<LetGo>) -> Self {
        self.let_go = let_go;
        self
    }

    /// Reserves `bytes` (at most the whole budget or the user's share),
    /// waiting until they are free, at most the budget's wait. Dropping the
    /// future while it waits gives back what it had.
    pub async fn reserve(&self, bytes: u64) -> Result<Reservation, Refused> {
        let b = &self.budget;
        let Some(limit) = b.limit else {
            b.count_in(bytes);
            return Ok(Reservation::counted(b.clone(), bytes, None, None));
        };
        let share = self.user.as_deref().and_then(|u| b.share_of(u));
        let bytes = bytes.min(limit).min(b.per_user.unwrap_or(u64::MAX));
        let units = units_of(bytes);
        let try_now = |sem: &Arc<Semaphore>| sem.clone().try_acquire_many_owned(units).ok();
        let mut mine = share.as_ref().and_then(try_now);
        let mut all = match share.is_none() || mine.is_some() {
            true => try_now(&b.units),
            false => None,
        };
        if all.is_none() {
            let waited = self.wait_for(share.as_ref(), units, &mut mine).await;
            drop(share);
            match waited {
                Ok(p) => all = Some(p),
                Err(refused) => {
                    drop(mine);
                    if let Some(u) = &self.user {
                        b.forget_idle(u);
                    }
                    return Err(refused);
                }
            }
        }
        b.count_in(bytes);
        let mine = mine.zip(self.user.clone());
        Ok(Reservation::counted(b.clone(), bytes, all, mine))
    }

    /// Waits for the units `mine` (of the user's `share`) and the budget's
    /// do not hold yet: the whole budget's permit once it has both.
    async fn wait_for(
        &self,
        share: Option<&Arc<Semaphore>>,
        units: u32,
        mine: &mut Option<OwnedSemaphorePermit>,
    ) -> Result<OwnedSemaphorePermit, Refused> {
        let b = &self.budget;
        b.waits.inc();
        let _waiting = Waiting::enter(b.waiters.inner());
        let acquire = async {
            if let Some(sem) = share.filter(|_| mine.is_none()) {
                *mine = Some(acquired(sem.clone().acquire_many_owned(units).await));
            }
            acquired(b.units.clone().acquire_many_owned(units).await)
        };
        let let_go = async {
            match &self.let_go {
                Some(f) => f().await,
                None => std::future::pending().await,
            }
        };
        let limited = async {
            match b.wait {
                Some(wait) => tokio::time::timeout(wait, acquire)
                    .await
                    .map_err(|_| Refused::Busy(wait)),
                None => Ok(acquire.await),
            }
        };
        let r = tokio::select! {
            r = limited => r,
            () = let_go => Err(Refused::LetGo),
        };
        if matches!(r, Err(Refused::Busy(_))) {
            b.busy.inc();
        }
        r
    }
}

fn acquired(r: Result<OwnedSemaphorePermit, tokio::sync::AcquireError>) -> OwnedSemaphorePermit {
    r.expect("the budget's semaphores are never closed")
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
    /// The units of the user's share, and the user.
    mine: Option<(OwnedSemaphorePermit, String)>,
    bytes: u64,
}

impl Reservation {
    /// Holds nothing (nothing was read, or the bytes were read before a
    /// refused reservation).
    pub fn none() -> Self {
        Self {
            budget: None,
            permit: None,
            mine: None,
            bytes: 0,
        }
    }

    fn counted(
        budget: Arc<MemoryBudget>,
        bytes: u64,
        permit: Option<OwnedSemaphorePermit>,
        mine: Option<(OwnedSemaphorePermit, String)>,
    ) -> Self {
        Self {
            budget: Some(budget),
            permit,
            mine,
            bytes,
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
        let keep = units_of(bytes) as usize;
        let permits = self
            .permit
            .iter_mut()
            .chain(self.mine.iter_mut().map(|m| &mut m.0));
        for permit in permits {
            let give = permit.num_permits().saturating_sub(keep);
            drop(permit.split(give));
        }
    }
}

impl Drop for Reservation {
    /// Counted out first; the units go back after, the user's share
    /// forgotten once idle.
    fn drop(&mut self) {
        if let Some(b) = &self.budget {
            b.used.dec_by(self.bytes as i64);
            if let Some((permit, user)) = self.mine.take() {
                drop(permit);
                b.forget_idle(&user);
            }
        }
    }
}

#[cfg(test)]
#[path = "budget_tests.rs"]
mod tests;
