//! Reading a user's events (the outbox every committed change writes in
//! its own transaction, `meta::events`): in their sequence order, from a
//! cursor the previous read returned; with a wait, as soon as one comes
//! (woken by the events' bell, which [`Announced`] rings after each change
//! that committed, never by polling the store).

mod announced;
mod containers;
mod feed;
mod keys;

use std::{future::Future, sync::Arc, time::Duration};

use tokio::{sync::Notify, time::Instant};

pub use self::announced::Announced;
pub use self::feed::{Kicking, Sequencer, feed_channel};
use super::DomainError;
use crate::{
    meta::{EventBell, EventRecord, EventRepo, FeedPage, OwnerPage, UserRecord},
    metrics::Metrics,
    vocab::UserId,
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
    /// What wakes the sequencer ([`Kicking`] rings it).
    kick: Arc<Notify>,
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
    /// `bell`: the events' bell (not a [`Kicking`] one); `kick`: what the
    /// [`Kicking`] bell the writes ring wakes.
    pub fn new(
        events: Arc<dyn EventRepo>,
        bell: Arc<dyn EventBell>,
        metrics: Arc<Metrics>,
        kick: Arc<Notify>,
    ) -> Self {
        Self {
            events,
            bell,
            metrics,
            kick,
        }
    }

    /// This instance's sequencer, to run as a worker.
    pub fn sequencer(&self) -> Sequencer {
        Sequencer::new(self.events.clone(), self.bell.clone(), self.kick.clone())
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
        self.waiting(&user.id, wait, || self.pull(user, after, limit))
            .await
    }

    /// As [`Self::pull_feed`], waiting up to `wait` as [`Self::pull_waiting`]
    /// does, for an event placed in the feed.
    pub async fn pull_feed_waiting(
        &self,
        after: i64,
        limit: usize,
        wait: Duration,
    ) -> Result<EventPage, DomainError> {
        self.waiting(&feed_channel(), wait, || self.pull_feed(after, limit))
            .await
    }

    /// `read` until it finds events or `wait` passes, read again each time
    /// `channel`'s bell rings.
    async fn waiting<F, R>(
        &self,
        channel: &UserId,
        wait: Duration,
        read: F,
    ) -> Result<EventPage, DomainError>
    where
        F: Fn() -> R,
        R: Future<Output = Result<EventPage, DomainError>>,
    {
        if wait > MAX_WAIT {
            return Err(DomainError::InvalidRequest(format!(
                "wait must be at most {} seconds",
                MAX_WAIT.as_secs()
            )));
        }
        if wait.is_zero() {
            return read().await;
        }
        let deadline = Instant::now() + wait;
        loop {
            // Listening before reading: an event committed after the read
            // rings a listener that already hears (on one Redis node the
            // listening costs nothing; on a cluster, a subscription, which
            // an outage must not stretch past the deadline).
            let listening = tokio::time::timeout_at(deadline, self.bell.listen(channel)).await;
            let page = read().await?;
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
        check_limit(limit)?;
        // In one snapshot: every event numbered up to `last` is in the
        // page (but past a full page), unless the retention removed it.
        let OwnerPage { last, mut events } = self.events.owner_page(&user.id, after, limit).await?;
        if after > last {
            return Err(DomainError::InvalidRequest(format!(
                "after is past the last event ({last}): it is not a cursor this API returned"
            )));
        }
        // A read in several batches on a store that does not hold them to
        // one snapshot may have met the retention's removal between them:
        // the page ends before its first gap (the next read, from there,
        // is told).
        if let Some(gap) = events.windows(2).position(|w| w[1].seq != w[0].seq + 1) {
            events.truncate(gap + 1);
        }
        // Numbers have no gap: a first event past `after + 1`, or none
        // where some were written, means the ones between are gone.
        let missed = match events.first() {
            Some(first) => after > 0 && first.seq > after + 1,
            None => after > 0 && last > after,
        };
        if missed {
            return Err(DomainError::CursorExpired(after));
        }
        let cursor = events.last().map_or(after, |e| e.seq);
        Ok(EventPage { events, cursor })
    }

    /// Every owner's events placed in the feed after position `after` (0:
    /// from the oldest kept), at most `limit`, in feed order (which
    /// keeps each owner's sequence order); the cursor is the last one's
    /// place, or with none the last place read. `CursorExpired` if the
    /// retention removed one after `after`. A deleted user's events leave
    /// it with their data, but for their `user.deleted`: a reader meets no
    /// gap for them.
    pub async fn pull_feed(&self, after: i64, limit: usize) -> Result<EventPage, DomainError> {
        check_limit(limit)?;
        // Every place up to `upto` was given with its event in one
        // committed transaction, which the page's snapshot shows whole.
        let FeedPage {
            bounds,
            upto,
            events,
        } = self.events.feed(after, limit as i64, limit).await?;
        if after > bounds.last {
            return Err(DomainError::InvalidRequest(format!(
                "after is past the feed's last place ({}): it is not a cursor this API returned",
                bounds.last
            )));
        }
        if after > 0 && after < bounds.floor {
            return Err(DomainError::CursorExpired(after));
        }
        let cursor = events.last().and_then(|e| e.feed).unwrap_or(upto);
        Ok(EventPage { events, cursor })
    }
}

fn check_limit(limit: usize) -> Result<(), DomainError> {
    match (1..=MAX_LIMIT).contains(&limit) {
        true => Ok(()),
        false => Err(DomainError::InvalidRequest(format!(
            "limit must be between 1 and {MAX_LIMIT}"
        ))),
    }
}
