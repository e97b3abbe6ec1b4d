//! The user's commit lock: what every transaction that writes a user
//! document (an upload's commit, a delete) runs under.

use std::future::Future;

use super::{DomainError, UserId};
use crate::{
    lock::{LockError, LockKey, Locks},
    meta::retry::{Retried, Transactions},
    meta::{MetaError, UserTurns},
};

/// Runs `txn`, a transaction that writes the user document, under the
/// user's commit lock, retried on WriteConflict and counted as `op`, each
/// attempt in the user's turn in this instance. Without the lock, commits
/// of different size categories (different locks, one document) conflict,
/// and a steady stream in one category can starve another's retries past
/// the last attempt: 6 of 8 runs of 100 mixed uploads on the test stack had
/// a `write_conflict` failure. Without the turn, the writers of the
/// document that take no commit lock (the queue's workers, a resumable
/// upload's creation) conflict with it: a file's delete racing two attaches
/// of the file in queue mode was answered `409 write_conflict` on CI.
pub(crate) async fn user_commit<T, F, Fut>(
    locks: &Locks,
    turns: &UserTurns,
    txns: &Transactions,
    user: &UserId,
    op: &str,
    txn: F,
) -> Result<Retried<T>, UserCommitError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, MetaError>>,
{
    locks
        .with_lock(&LockKey::user_commit(user), async |_| {
            Ok(turns.run(txns, op, user, txn).await?)
        })
        .await
}

/// Why [`user_commit`] failed: the lock, or the transaction (whose error the
/// caller may need to tell apart, e.g. an unknown outcome).
#[derive(Clone, Debug, thiserror::Error)]
pub(crate) enum UserCommitError {
    #[error(transparent)]
    Lock(#[from] LockError),
    #[error(transparent)]
    Meta(#[from] MetaError),
}

impl From<UserCommitError> for DomainError {
    fn from(e: UserCommitError) -> Self {
        match e {
            UserCommitError::Lock(e) => e.into(),
            UserCommitError::Meta(e) => e.into(),
        }
    }
}
