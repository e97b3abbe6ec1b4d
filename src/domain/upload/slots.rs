//! Uploads in flight: counted in a gauge, limited per user on one instance,
//! and their idempotency keys, one request per key at a time.

use crate::{
    metrics::Metrics,
    vocab::{IdempotencyKey, UserId},
};

/// Counts an upload in the in-flight gauge while it lives.
pub(super) struct InFlight<'a>(&'a Metrics);

impl<'a> InFlight<'a> {
    pub(super) fn new(metrics: &'a Metrics) -> Self {
        metrics.uploads_in_flight.inc();
        Self(metrics)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.uploads_in_flight.dec();
    }
}

/// Uploads in flight per user on this instance.
#[derive(Default)]
pub struct UploadSlots {
    in_flight: std::sync::Mutex<std::collections::HashMap<UserId, usize>>,
}

impl UploadSlots {
    /// How many uploads `user` has in flight on this instance.
    pub fn in_flight(&self, user: &UserId) -> usize {
        self.in_flight
            .lock()
            .unwrap()
            .get(user)
            .copied()
            .unwrap_or(0)
    }

    /// A slot for `user`, or `None` if `max` are taken.
    pub fn take(&self, user: &UserId, max: usize) -> Option<UploadSlot<'_>> {
        let mut in_flight = self.in_flight.lock().unwrap();
        let n = in_flight.entry(*user).or_default();
        if *n >= max {
            return None;
        }
        *n += 1;
        Some(UploadSlot {
            slots: self,
            user: *user,
        })
    }
}

/// Gives its slot back when dropped.
pub struct UploadSlot<'a> {
    slots: &'a UploadSlots,
    user: UserId,
}

impl UploadSlot<'_> {
    /// The user whose slot this is.
    pub fn user(&self) -> UserId {
        self.user
    }
}

impl Drop for UploadSlot<'_> {
    fn drop(&mut self) {
        let mut in_flight = self.slots.in_flight.lock().unwrap();
        if let Some(n) = in_flight.get_mut(&self.user) {
            *n -= 1;
            if *n == 0 {
                in_flight.remove(&self.user);
            }
        }
    }
}

/// The idempotency keys of uploads in flight on this instance.
#[derive(Default)]
pub struct InFlightKeys {
    keys: std::sync::Mutex<std::collections::HashSet<String>>,
}

impl InFlightKeys {
    /// `user`'s `key` for one upload, or `None` while another one holds it.
    pub fn claim(&self, user: &UserId, key: &IdempotencyKey) -> Option<KeyClaim<'_>> {
        let id = crate::meta::IdempotencyRecord::id_for(user, key);
        let fresh = self.keys.lock().unwrap().insert(id.clone());
        // Built only when fresh: a claim dropped frees its key.
        fresh.then(|| KeyClaim { keys: self, id })
    }
}

/// Frees its key when dropped.
pub struct KeyClaim<'a> {
    keys: &'a InFlightKeys,
    id: String,
}

impl Drop for KeyClaim<'_> {
    fn drop(&mut self) {
        self.keys.keys.lock().unwrap().remove(&self.id);
    }
}
