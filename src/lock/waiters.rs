//! Local waiters by id, for the pub/sub listeners that wake them (the Redis
//! lock manager's fair waiters, the Redis queue's callers): a waiter is
//! registered before it can be woken, and removed however its wait ends.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

/// How long a pub/sub listener waits before it subscribes again after its
/// connection dropped.
pub const RESUBSCRIBE_AFTER: Duration = Duration::from_millis(250);

/// The registry; clones share it.
pub struct Waiters<T> {
    by_id: Arc<Mutex<HashMap<String, T>>>,
}

impl<T> Clone for Waiters<T> {
    fn clone(&self) -> Self {
        Self {
            by_id: self.by_id.clone(),
        }
    }
}

impl<T> Default for Waiters<T> {
    fn default() -> Self {
        Self {
            by_id: Arc::default(),
        }
    }
}

impl<T> Waiters<T> {
    /// Registers `waiter` under `id` until the returned guard is dropped.
    pub fn register(&self, id: &str, waiter: T) -> Registered<'_, T> {
        self.by_id.lock().unwrap().insert(id.to_owned(), waiter);
        Registered {
            waiters: self,
            id: id.to_owned(),
        }
    }

    pub fn contains(&self, id: &str) -> bool {
        self.by_id.lock().unwrap().contains_key(id)
    }

    /// Takes the waiter out (it is woken once).
    pub fn take(&self, id: &str) -> Option<T> {
        self.by_id.lock().unwrap().remove(id)
    }

    /// Runs `f` on the waiter registered under `id`, if any.
    pub fn with(&self, id: &str, f: impl FnOnce(&T)) {
        if let Some(w) = self.by_id.lock().unwrap().get(id) {
            f(w);
        }
    }

    /// Runs `f` on every waiter.
    pub fn for_each(&self, f: impl FnMut(&T)) {
        self.by_id.lock().unwrap().values().for_each(f);
    }
}

/// Removes its waiter when dropped.
pub struct Registered<'a, T> {
    waiters: &'a Waiters<T>,
    id: String,
}

impl<T> Drop for Registered<'_, T> {
    fn drop(&mut self) {
        self.waiters.take(&self.id);
    }
}
