//! The frequent writes that change a user's record — a commit (its stored
//! bytes and file count, its upload's reservation given back), a resumable
//! upload's creation, a deferred length's declaration, an upload's end —
//! — and every change that writes an event, which the user's record numbers —
//! conflict when two of one user's run at once, and one is retried after a
//! pause. Within this instance each of their transaction attempts takes
//! the user's turn (striped, so that the memory is fixed), as does every
//! write under the user's commit lock (a file's delete or rename, a quota
//! change, a key's mint or revocation, the start of the user's deletion),
//! which leaves the retry for writes from other instances and for the rarer
//! writes that take no turn (a deletion's later passes, the sweeper): a
//! client creating uploads in parallel while earlier ones commit (Uppy
//! sends several at once) is neither slowed by retries nor answered
//! `409 write_conflict` for racing itself, nor is a delete racing the
//! queue's workers.

use std::{
    future::Future,
    hash::{BuildHasher, RandomState},
};

use tokio::sync::{Mutex, MutexGuard};

use super::{
    error::MetaResult,
    retry::{Retried, Transactions},
};
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
    /// Held while one transaction attempt of `user`'s writes to their
    /// record runs: its holder waits for nothing but the store meanwhile
    /// (no lock, no other turn), so that no two holders wait on each other.
    pub async fn hold(&self, user: &UserId) -> MutexGuard<'_, ()> {
        self.stripes[self.stripe(user)].lock().await
    }

    /// The turns of all of `users` at once (a group commit of several
    /// users' writes), taken in stripe order: two holders of several never
    /// wait on each other, and a holder of one waits on nobody.
    pub async fn hold_all(&self, users: &[&UserId]) -> Vec<MutexGuard<'_, ()>> {
        let mut stripes: Vec<usize> = users.iter().map(|u| self.stripe(u)).collect();
        stripes.sort_unstable();
        stripes.dedup();
        let mut held = Vec::with_capacity(stripes.len());
        for s in stripes {
            held.push(self.stripes[s].lock().await);
        }
        held
    }

    fn stripe(&self, user: &UserId) -> usize {
        self.hasher.hash_one(user) as usize % STRIPES
    }

    /// `txn`, retried and counted as `op` by `txns`, each attempt in
    /// `user`'s turn (the pauses between attempts are not).
    pub async fn run<T, F, Fut>(
        &self,
        txns: &Transactions,
        op: &str,
        user: &UserId,
        mut txn: F,
    ) -> MetaResult<Retried<T>>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = MetaResult<T>>,
    {
        txns.run(op, || {
            let attempt = txn();
            async move {
                let _turn = self.hold(user).await;
                attempt.await
            }
        })
        .await
    }
}
