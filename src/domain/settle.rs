//! Inserting a new record (a session, an agent, a token) whose id is
//! chosen here, so that an insert whose answer was lost can be sent again
//! and settled: the store either creates it now or answers a duplicate,
//! which proves the earlier try applied (only ours can have that id).

use std::{
    future::Future,
    time::{Duration, Instant},
};

use super::DomainError;
use crate::meta::{MetaError, MetaResult};

/// First and longest pause between tries.
const PAUSE: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(2));

/// Runs `insert` until the store answers: sent again while its outcome is
/// unknown (or, once sent, the store is unavailable), and while it meets a
/// write conflict (the owner's document is being written: by a commit, or
/// by a deletion beginning), for at most `window`. Past it the outcome is
/// unknown (at `location`) if a try may have applied, else the conflict.
/// Never answered failed once it may have applied.
pub async fn insert_settled<F, Fut>(
    window: Duration,
    location: Option<String>,
    insert: F,
) -> Result<(), DomainError>
where
    F: Fn() -> Fut,
    Fut: Future<Output = MetaResult<()>>,
{
    let deadline = Instant::now() + window;
    let mut pause = PAUSE.0;
    let mut sent = false;
    loop {
        match insert().await {
            Ok(()) => return Ok(()),
            Err(MetaError::Duplicate) if sent => return Ok(()),
            Err(MetaError::OutcomeUnknown(_)) => sent = true,
            Err(MetaError::Unavailable(_) | MetaError::Transient(_)) if sent => {}
            Err(MetaError::WriteConflict) => {}
            Err(e) => return Err(e.into()),
        }
        if Instant::now() + pause > deadline {
            if !sent {
                return Err(DomainError::WriteConflict);
            }
            tracing::warn!(location, "an insert's outcome is still unknown");
            return Err(DomainError::OutcomeUnknown(location));
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(PAUSE.1);
    }
}
