//! What the dispatcher's tasks do for one owner's head: an attempt at
//! delivering it under the partition's lease, or a read of the owner's
//! next events for a queue that overflowed; and the store's calls bounded
//! in time.

use std::{
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use super::{
    endpoint::{Endpoint, body_of},
    owners::Refill,
    service::Webhooks,
};
use crate::{
    hooks::Answer,
    lock::LeaseClock,
    meta::{DeadLetter, EventRecord, MetaError, MetaResult},
    vocab::UserId,
};

/// Nothing is sent under a lease with less than this left by this
/// process's clock (what a renewal's answer may lag, and clocks drift).
const LEASE_MARGIN: Duration = Duration::from_secs(2);

/// The pause before an owner whose lease was short, or whose own events
/// could not be read, is tried again.
pub(super) const SHORT_PAUSE: Duration = Duration::from_millis(500);
/// The longest a call to the store may take in the dispatcher's loop (a
/// link that hangs must not hold its partitions hostage).
const STORE_WAIT: Duration = Duration::from_secs(10);

/// `call`, given up after [`STORE_WAIT`] as the store being unavailable.
pub(super) async fn bounded<T>(call: impl Future<Output = MetaResult<T>>) -> MetaResult<T> {
    match tokio::time::timeout(STORE_WAIT, call).await {
        Ok(answer) => answer,
        Err(_) => Err(MetaError::Unavailable("no answer in time".into())),
    }
}

/// What one task did for an owner's head.
pub(super) enum What {
    Delivered,
    DeadLettered,
    /// Given up on, and not kept: its owner is deleted.
    Dropped,
    /// The next events of an owner whose queue overflowed.
    Refilled(Refill),
    /// They could not be read: read again soon.
    RefillFailed,
    Failed(String),
    /// Not sent (or cut off) because the lease did not surely hold: try
    /// again shortly.
    NotNow,
}

pub(super) struct Done {
    pub(super) part: u32,
    pub(super) fence: u64,
    pub(super) owner: UserId,
    pub(super) what: What,
}

/// `owner`'s events after number `after`, at most `limit`, for a queue
/// that overflowed when the partition had read the feed up to `read`.
pub(super) async fn refill(
    hooks: Arc<Webhooks>,
    owner: UserId,
    (after, limit): (i64, usize),
    read: i64,
) -> What {
    match bounded(hooks.events.events(&owner, after, limit)).await {
        Ok(events) => What::Refilled(Refill {
            events,
            read,
            limit,
        }),
        Err(e) => {
            tracing::warn!(error = %e, "could not read an owner's events for webhooks; trying again");
            tokio::time::sleep(SHORT_PAUSE).await;
            What::RefillFailed
        }
    }
}

/// One attempt at `event`, under the partition's lease (`clock`); a
/// refusal of an event past the maximum age makes it a dead letter. (What
/// was delivered is written with the partition's mark, once a second: a
/// holder that dies before is followed by one that sends it again.)
pub(super) async fn deliver(
    hooks: Arc<Webhooks>,
    endpoint: Endpoint,
    clock: LeaseClock,
    event: EventRecord,
    attempts: u32,
) -> What {
    let (Some(caller), Some(settings)) = (&hooks.caller, &hooks.settings) else {
        return What::NotNow;
    };
    if !clock.holds_for(LEASE_MARGIN) {
        return What::NotNow;
    }
    let body = body_of(&event);
    let sent = WithinLease {
        clock: clock.clone(),
        inner: Box::pin(caller.post(&endpoint.url, &event.id, &body)),
    };
    let why = match sent.await {
        None => return What::NotNow,
        Some(Answer::Accepted(_)) => return What::Delivered,
        Some(Answer::Refused(why)) => why,
    };
    let age = (chrono::Utc::now() - event.time)
        .to_std()
        .unwrap_or_default();
    if age < settings.max_age {
        return What::Failed(why);
    }
    // Given up on only by the lease's holder (one that woke past it writes
    // no letter for an event another instance delivers).
    if !clock.holds_for(LEASE_MARGIN) {
        return What::NotNow;
    }
    let letter = DeadLetter {
        id: DeadLetter::id_for(&endpoint.id, &event),
        endpoint: endpoint.id.clone(),
        url: crate::hooks::redacted(&endpoint.url),
        event,
        attempts: attempts + 1,
        last_error: why.clone(),
        dead_at: chrono::Utc::now(),
    };
    match bounded(hooks.repo.put_dead_letter(&letter)).await {
        Ok(true) => {
            tracing::warn!(event = %letter.id, reason = %why, "webhook event dead-lettered after FILEDOCK_WEBHOOK_MAX_AGE_SECS; the owner's later events go on");
            What::DeadLettered
        }
        // Nothing of a deleted user's is kept, their undelivered events
        // neither.
        Ok(false) => {
            tracing::info!(event = %letter.id, reason = %why, "webhook event given up on after FILEDOCK_WEBHOOK_MAX_AGE_SECS; its owner is deleted, so it is not kept");
            What::Dropped
        }
        Err(e) => {
            tracing::warn!(error = %e, "could not keep a dead letter; trying the event again");
            What::Failed(why)
        }
    }
}

/// A request polled only while the lease surely holds: a process that
/// wakes past it (paused, starved) drops the request at its next poll,
/// before the request goes further. (Bytes already handed to the
/// connection's own task may still go out: that window is the time
/// between two polls of one runtime, not the pause.)
struct WithinLease<F> {
    clock: LeaseClock,
    inner: Pin<Box<F>>,
}

impl<F: Future<Output = Answer>> Future for WithinLease<F> {
    type Output = Option<Answer>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if !self.clock.holds_for(LEASE_MARGIN / 2) {
            return Poll::Ready(None);
        }
        self.inner.as_mut().poll(cx).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use std::{
        sync::atomic::{AtomicBool, Ordering},
        time::Instant,
    };

    use super::*;

    /// A request under a lease whose clock has passed (a process that woke
    /// after it) is dropped before it is polled: it sends nothing.
    #[tokio::test]
    async fn a_request_is_never_polled_once_the_lease_s_clock_passed() {
        let polled = Arc::new(AtomicBool::new(false));
        let request = |polled: Arc<AtomicBool>| async move {
            polled.store(true, Ordering::SeqCst);
            Answer::Accepted(200)
        };
        let passed = LeaseClock::new(Instant::now());
        let sent = WithinLease {
            clock: passed,
            inner: Box::pin(request(polled.clone())),
        };
        assert_eq!(sent.await, None);
        assert!(!polled.load(Ordering::SeqCst), "the request was polled");

        let holding = LeaseClock::new(Instant::now() + Duration::from_secs(10));
        let sent = WithinLease {
            clock: holding,
            inner: Box::pin(request(polled.clone())),
        };
        assert_eq!(sent.await, Some(Answer::Accepted(200)));
        assert!(polled.load(Ordering::SeqCst));
    }
}
