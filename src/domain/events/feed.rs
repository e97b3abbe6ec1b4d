//! The feed of every owner's events, which the admin key reads: each event
//! is placed in it after its transaction committed, by the sequencer
//! ([`Sequencer`]) every instance runs, woken by its own commits
//! ([`Kicking`]), at its start, and by each sweep pass (the backstop for an
//! event whose instance died before placing it: any instance's next
//! commit places it too). Nothing polls the store for it. Placing is one
//! transaction on the store
//! (`EventRepo::sequence_events`), so that sequencers on several instances
//! never give a place twice; a sequencer that placed some rings the feed's
//! bell ([`FEED`]), which wakes the admin's long polls on every instance.

use std::{sync::Arc, time::Duration};

use async_trait::async_trait;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::{
    meta::{EventBell, EventRepo, Listener, MetaError},
    vocab::UserId,
    worker::{Worker, WorkerState},
};

/// The channel the feed's bell rings on: no user has the nil id (theirs
/// are UUID v7).
pub fn feed_channel() -> UserId {
    UserId::nil()
}

/// The events one sequencing transaction places at most.
pub const BATCH: usize = 200;
/// How long a woken sequencer lets more commits come before it places
/// (one transaction for a burst's events, not one each).
const GATHER: Duration = Duration::from_millis(50);
/// How long a sequencer waits after the store failed it.
const RETRY: Duration = Duration::from_millis(500);
/// Conflicts with another instance's sequencer in a row, each after a
/// short random pause, before waiting [`RETRY`].
const CONFLICTS: u32 = 10;

/// An events' bell that also wakes this instance's sequencer.
pub struct Kicking {
    inner: Arc<dyn EventBell>,
    kick: Arc<Notify>,
}

impl Kicking {
    pub fn new(inner: Arc<dyn EventBell>, kick: Arc<Notify>) -> Self {
        Self { inner, kick }
    }
}

#[async_trait]
impl EventBell for Kicking {
    async fn ring(&self, owner: &UserId) {
        self.kick.notify_one();
        self.inner.ring(owner).await;
    }

    async fn listen(&self, owner: &UserId) -> Listener {
        self.inner.listen(owner).await
    }
}

/// Places committed events in the feed (see the module's comment).
pub struct Sequencer {
    events: Arc<dyn EventRepo>,
    /// The bell without the kick (its own ring would wake it again).
    bell: Arc<dyn EventBell>,
    kick: Arc<Notify>,
    placed: u64,
}

impl Sequencer {
    pub fn new(events: Arc<dyn EventRepo>, bell: Arc<dyn EventBell>, kick: Arc<Notify>) -> Self {
        Self {
            events,
            bell,
            kick,
            placed: 0,
        }
    }

    /// Places what is waiting, a batch at a time; whether it met a
    /// failure (the store away: try again soon).
    async fn drain(&mut self) -> bool {
        let mut conflicts = 0;
        loop {
            match self.events.sequence_events(BATCH).await {
                Ok(n) => {
                    if n > 0 {
                        self.placed += n as u64;
                        self.bell.ring(&feed_channel()).await;
                    }
                    if n < BATCH {
                        return false;
                    }
                    conflicts = 0;
                }
                // Another instance's sequencer placed them meanwhile: look
                // again, after a pause that lets it finish.
                Err(MetaError::WriteConflict) if conflicts < CONFLICTS => {
                    conflicts += 1;
                    let pause = rand::random_range(5..50);
                    tokio::time::sleep(Duration::from_millis(pause)).await;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "could not place events in the feed; trying again");
                    // A placing whose answer was lost may have placed some
                    // (and the next finds nothing to ring for): a spare
                    // ring costs each waiting reader one read.
                    self.bell.ring(&feed_channel()).await;
                    return true;
                }
            }
        }
    }
}

#[async_trait]
impl Worker for Sequencer {
    fn name(&self) -> String {
        "event sequencer".into()
    }

    fn status(&self) -> String {
        format!("{} events placed in the feed", self.placed)
    }

    async fn work(&mut self, stop: &CancellationToken) -> WorkerState {
        if self.drain().await {
            return WorkerState::Idle(RETRY);
        }
        tokio::select! {
            _ = stop.cancelled() => return WorkerState::Busy,
            _ = self.kick.notified() => {}
        }
        WorkerState::Idle(GATHER)
    }
}
