//! Inserting a new record of a user's own (a session, an agent, a token)
//! whose id is chosen here, so that an insert whose answer was lost can be
//! sent again and settled: the store either creates it now or answers a
//! duplicate, which proves the earlier try applied (only ours can have
//! that id). The insert writes the user's document (so that their deletion
//! cannot miss it), so it runs as every such write does: under the user's
//! commit lock, retried on a write conflict (`super::commit`).

use std::{
    future::Future,
    time::{Duration, Instant},
};

use super::{
    DomainError,
    commit::{UserCommitError, user_commit},
};
use crate::{
    lock::Locks,
    meta::{MetaError, MetaResult, UserTurns, retry::Transactions},
    vocab::UserId,
};

/// First and longest pause between tries.
const PAUSE: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(2));

/// What an owned insert runs with: the user's commit lock and the
/// transaction retry, and how long an insert whose answer was lost is sent
/// again (`FILEDOCK_SETTLE_WINDOW_SECS`).
#[derive(Clone)]
pub struct OwnedInserts {
    pub locks: std::sync::Arc<Locks>,
    /// The users' turns in this instance (see [`user_commit`]).
    pub turns: std::sync::Arc<UserTurns>,
    pub txns: Transactions,
    pub settle_window: Duration,
}

impl OwnedInserts {
    /// Runs `insert` (named `op` in the metrics) for `owner` until the store
    /// answers, for at most the settle window: tried again on a write
    /// conflict, and sent again while its outcome is unknown (then also
    /// while the store or the lock is unavailable). Once a try may have
    /// applied it is never answered failed: past the window, or at any
    /// other error, its outcome is unknown (at `location`). Never sent and
    /// past the window: the write conflict. A user being deleted, or gone,
    /// is `Unauthenticated`.
    pub async fn insert<F, Fut>(
        &self,
        owner: &UserId,
        (op, location): (&str, Option<String>),
        insert: F,
    ) -> Result<(), DomainError>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = MetaResult<()>>,
    {
        let deadline = Instant::now() + self.settle_window;
        let mut pause = PAUSE.0;
        let mut sent = false;
        loop {
            let tried = user_commit(&self.locks, &self.turns, &self.txns, owner, op, &insert).await;
            let retry = match tried {
                Ok(_) => return Ok(()),
                Err(UserCommitError::Meta(MetaError::Duplicate)) if sent => return Ok(()),
                Err(UserCommitError::Meta(MetaError::OutcomeUnknown(_))) => {
                    sent = true;
                    true
                }
                // Writers of the user's document outside the commit lock
                // (a resumable upload's creation, a deletion's end) can
                // still conflict: tried again, sent or not.
                Err(UserCommitError::Meta(MetaError::WriteConflict)) => true,
                Err(UserCommitError::Meta(MetaError::Unavailable(_) | MetaError::Transient(_)))
                | Err(UserCommitError::Lock(_))
                    if sent =>
                {
                    true
                }
                Err(_) if sent => false,
                Err(e) => return Err(e.into()),
            };
            if !sent && Instant::now() + pause > deadline {
                return Err(DomainError::WriteConflict);
            }
            if !retry || Instant::now() + pause > deadline {
                tracing::warn!(location, "an insert's outcome is still unknown");
                return Err(DomainError::OutcomeUnknown(location));
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(PAUSE.1);
        }
    }
}
