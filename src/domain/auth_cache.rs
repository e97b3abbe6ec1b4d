//! What an instance remembers of authentication, for
//! `FILEDOCK_AUTH_CACHE_SECS`: the callers bearer secrets belong to, and
//! which keys are alive (a signed link's download asks). A revocation
//! voids every entry whose lookup began before it (a generation stamp),
//! so a lookup that read a key before its delete and answers after the
//! revocation cannot leave it remembered here.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use crate::vocab::{ApiKeyHash, KeyId};

/// The most entries of each kind an instance remembers.
const CAPACITY: u64 = 100_000;

/// One remembered answer: valid until `until` (the cache's lifetime after
/// its lookup began, not after it was stored, which a stalled lookup could
/// put long after a revocation) and while no revocation came after the
/// lookup began (`generation`).
#[derive(Clone)]
struct Entry<T> {
    value: T,
    until: Instant,
    generation: u64,
}

/// A lookup's start: when, and the generation then. Taken before the
/// store is read.
#[derive(Clone, Copy)]
pub struct LookupStart {
    at: Instant,
    generation: u64,
}

/// The instance's authentication cache of callers `C` (the domain's
/// `Caller`; generic so that this module needs nothing of `auth`'s); cheap
/// to clone (shared).
#[derive(Clone)]
pub struct AuthCache<C> {
    callers: moka::sync::Cache<ApiKeyHash, Entry<C>>,
    /// Keys known to exist (a link's download checks its key here).
    live_keys: moka::sync::Cache<KeyId, Entry<()>>,
    /// Bumped by every revocation (and every forgetting) on this instance.
    generation: Arc<AtomicU64>,
    ttl: Duration,
}

impl<C: Clone + Send + Sync + 'static> AuthCache<C> {
    /// A cache whose entries last `ttl` (zero: nothing is remembered).
    pub fn new(ttl: Duration) -> Self {
        let capacity = if ttl.is_zero() { 0 } else { CAPACITY };
        let ttl_kept = ttl.max(Duration::from_millis(1));
        Self {
            callers: moka::sync::Cache::builder()
                .max_capacity(capacity)
                .time_to_live(ttl_kept)
                .build(),
            live_keys: moka::sync::Cache::builder()
                .max_capacity(capacity)
                .time_to_live(ttl_kept)
                .build(),
            generation: Arc::new(AtomicU64::new(0)),
            ttl,
        }
    }

    /// Marks the start of a lookup in the store: call before reading it.
    pub fn lookup_start(&self) -> LookupStart {
        LookupStart {
            at: Instant::now(),
            generation: self.generation.load(Ordering::SeqCst),
        }
    }

    /// Forgets everything remembered, and voids what lookups under way
    /// would remember: the next request is looked up again. Call after a
    /// revocation (a key's delete, a user's deletion, a quota change)
    /// was written, whatever its answer.
    pub fn forget_all(&self) {
        self.generation.fetch_add(1, Ordering::SeqCst);
        self.callers.invalidate_all();
        self.live_keys.invalidate_all();
    }

    fn valid<T>(&self, entry: &Entry<T>) -> bool {
        Instant::now() < entry.until && entry.generation == self.generation.load(Ordering::SeqCst)
    }

    fn entry<T>(&self, value: T, start: LookupStart) -> Option<Entry<T>> {
        if self.ttl.is_zero() || start.generation != self.generation.load(Ordering::SeqCst) {
            return None;
        }
        Some(Entry {
            value,
            until: start.at + self.ttl,
            generation: start.generation,
        })
    }

    /// The caller remembered for `hash`, if any still holds.
    pub fn caller(&self, hash: &ApiKeyHash) -> Option<C> {
        let entry = self.callers.get(hash)?;
        if self.valid(&entry) {
            return Some(entry.value);
        }
        self.callers.invalidate(hash);
        None
    }

    /// Remembers `caller` for `hash`, found by a lookup that began at `start`.
    pub fn remember_caller(&self, hash: ApiKeyHash, caller: C, start: LookupStart) {
        if let Some(e) = self.entry(caller, start) {
            self.callers.insert(hash, e);
        }
    }

    /// Forgets the caller of `hash` (an expired token).
    pub fn forget_caller(&self, hash: &ApiKeyHash) {
        self.callers.invalidate(hash);
    }

    /// Whether `key` is remembered alive.
    pub fn key_alive(&self, key: &KeyId) -> bool {
        match self.live_keys.get(key) {
            Some(e) if self.valid(&e) => true,
            Some(_) => {
                self.live_keys.invalidate(key);
                false
            }
            None => false,
        }
    }

    /// Remembers `key` alive, as found by a lookup that began at `start`.
    pub fn remember_key_alive(&self, key: KeyId, start: LookupStart) {
        if let Some(e) = self.entry((), start) {
            self.live_keys.insert(key, e);
        }
    }
}
