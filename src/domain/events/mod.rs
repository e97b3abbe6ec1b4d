//! Reading a user's events (the outbox every committed change writes in
//! its own transaction, `meta::events`): in their sequence order, from a
//! cursor the previous read returned; with a wait, as soon as one comes
//! (woken by the events' bell, which [`Announced`] rings after each change
//! that committed, never by polling the store).

mod announced;
mod containers;
mod keys;

use std::{sync::Arc, time::Duration};

use tokio::time::Instant;

pub use self::announced::Announced;
use super::DomainError;
use crate::{
    meta::{EventBell, EventRecord, EventRepo, UserRecord},
    metrics::Metrics,
};

/// What one read may ask for.
pub const MAX_LIMIT: usize = 1000;
pub const DEFAULT_LIMIT: usize = 100;
/// The longest a read waits for an event (`wait=`).
pub const MAX_WAIT: Duration = Duration::from_secs(60);

/// Events, and the cursor to read on from (the last one's number, or the
/// cursor read from when there was none).
pub struct EventPage {
    pub events: Vec<EventRecord>,
    pub cursor: i64,
}

pub struct EventService {
    events: Arc<dyn EventRepo>,
    bell: Arc<dyn EventBell>,
    metrics: Arc<Metrics>,
}

/// Counts a reader waiting for an event while it lives (a client that goes
/// away drops it with its request).
struct Waiting(Arc<Metrics>);

impl Waiting {
    fn new(metrics: &Arc<Metrics>) -> Self {
        metrics.event_waiters.inc();
        Self(metrics.clone())
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.0.event_waiters.dec();
    }
}

impl EventService {
    pub fn new(
        events: Arc<dyn EventRepo>,
        bell: Arc<dyn EventBell>,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            events,
            bell,
            metrics,
        }
    }

    /// As [`Self::pull`], waiting up to `wait` (at most [`MAX_WAIT`]) for
    /// an event when there is none yet: the read answers as soon as one
    /// commits (on this instance or, with Redis, another), or empty at the
    /// wait's end.
    pub async fn pull_waiting(
        &self,
        user: &UserRecord,
        after: i64,
        limit: usize,
        wait: Duration,
    ) -> Result<EventPage, DomainError> {
        if wait > MAX_WAIT {
            return Err(DomainError::InvalidRequest(format!(
                "wait must be at most {} seconds",
                MAX_WAIT.as_secs()
            )));
        }
        if wait.is_zero() {
            return self.pull(user, after, limit).await;
        }
        let deadline = Instant::now() + wait;
        loop {
            // Listening before reading: an event committed after the read
            // rings a listener that already hears (on one Redis node the
            // listening costs nothing; on a cluster, a subscription, which
            // an outage must not stretch past the deadline).
            let listening = tokio::time::timeout_at(deadline, self.bell.listen(&user.id)).await;
            let page = self.pull(user, after, limit).await?;
            let Ok(mut listener) = listening else {
                return Ok(page);
            };
            if !page.events.is_empty() {
                return Ok(page);
            }
            let _waiting = Waiting::new(&self.metrics);
            if tokio::time::timeout_at(deadline, listener.rung())
                .await
                .is_err()
            {
                return Ok(page);
            }
        }
    }

    /// `user`'s events numbered above `after` (0: from the oldest kept),
    /// at most `limit` (1 to [`MAX_LIMIT`]). `CursorExpired` if some of
    /// those after `after` are no longer kept (the retention removed them):
    /// the reader would miss them.
    pub async fn pull(
        &self,
        user: &UserRecord,
        after: i64,
        limit: usize,
    ) -> Result<EventPage, DomainError> {
        if !(1..=MAX_LIMIT).contains(&limit) {
            return Err(DomainError::InvalidRequest(format!(
                "limit must be between 1 and {MAX_LIMIT}"
            )));
        }
        // Read first: every event numbered up to `last` is in what the
        // read below sees, unless the retention removed it.
        let last = match after {
            0 => 0,
            _ => self.events.last_event_seq(&user.id).await?,
        };
        if after > last {
            return Err(DomainError::InvalidRequest(format!(
                "after is past the last event ({last}): it is not a cursor this API returned"
            )));
        }
        let mut events = self.events.events(&user.id, after, limit).await?;
        // A read in several batches may have met the retention's removal
        // between them: the page ends before its first gap (the next read,
        // from there, is told).
        if let Some(gap) = events.windows(2).position(|w| w[1].seq != w[0].seq + 1) {
            events.truncate(gap + 1);
        }
        // Numbers have no gap: a first event past `after + 1`, or none
        // where some were written, means the ones between are gone.
        let missed = match events.first() {
            Some(first) => after > 0 && first.seq > after + 1,
            None => last > after,
        };
        if missed {
            return Err(DomainError::CursorExpired(after));
        }
        let cursor = events.last().map_or(after, |e| e.seq);
        Ok(EventPage { events, cursor })
    }
}
