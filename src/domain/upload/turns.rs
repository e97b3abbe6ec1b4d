//! The writes that change a user's open-upload counters (a creation, a
//! deferred length's declaration, an upload's end) all write the user's
//! record, so concurrent ones of one user conflict and are retried. Within
//! this instance they are taken one at a time per user (striped, so that
//! the memory is fixed), which leaves the retry for writes from other
//! instances: a client creating uploads in parallel (Uppy sends several at
//! once) is not answered `409 write_conflict` for racing itself.

use std::hash::{BuildHasher, RandomState};

use tokio::sync::{Mutex, MutexGuard};

use crate::vocab::UserId;

/// How many users' counting writes can run at once in one instance.
const STRIPES: usize = 64;

pub(super) struct Counting {
    stripes: Vec<Mutex<()>>,
    hasher: RandomState,
}

impl Counting {
    pub(super) fn new() -> Self {
        Self {
            stripes: (0..STRIPES).map(|_| Mutex::new(())).collect(),
            hasher: RandomState::new(),
        }
    }

    /// Held while one of `user`'s counting writes runs.
    pub(super) async fn hold(&self, user: &UserId) -> MutexGuard<'_, ()> {
        let stripe = self.hasher.hash_one(user) as usize % STRIPES;
        self.stripes[stripe].lock().await
    }
}
