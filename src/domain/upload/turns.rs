//! The writes that change a user's record — a commit (its stored bytes and
//! file count, its upload's reservation given back), a resumable upload's
//! creation, a deferred length's declaration, an upload's end — conflict
//! when two of one user's run at once, and one is retried after a pause.
//! Within this instance they take turns per user (striped, so that the
//! memory is fixed), which leaves the retry for writes from other
//! instances: a client creating uploads in parallel while earlier ones
//! commit (Uppy sends several at once) is neither slowed by retries nor
//! answered `409 write_conflict` for racing itself.

use std::hash::{BuildHasher, RandomState};

use tokio::sync::{Mutex, MutexGuard};

use crate::vocab::UserId;

/// How many users' writes can run at once in one instance (two users on
/// one stripe take turns too).
const STRIPES: usize = 1024;

pub struct UserTurns {
    stripes: Vec<Mutex<()>>,
    hasher: RandomState,
}

impl Default for UserTurns {
    fn default() -> Self {
        Self {
            stripes: (0..STRIPES).map(|_| Mutex::new(())).collect(),
            hasher: RandomState::new(),
        }
    }
}

impl UserTurns {
    /// Held while one of `user`'s writes to their record runs. Never held
    /// while waiting for anything but the store (a lock, another turn).
    pub async fn hold(&self, user: &UserId) -> MutexGuard<'_, ()> {
        let stripe = self.hasher.hash_one(user) as usize % STRIPES;
        self.stripes[stripe].lock().await
    }
}
