//! What a bucket's consumer does with the operations a broker delivered,
//! whatever the broker: applies them in order (a group in one transaction
//! when it can), waits out the store's own failures, retries the rest and
//! dead-letters what keeps failing, settles every refusal in the store
//! before it is told, then hands the outcomes to the broker ([`Sink`]:
//! tell each waiter, acknowledge) and counts them. The broker decides how
//! deliveries arrive and who consumes a bucket (`worker.rs`: a Redis
//! stream under a lease).

use std::time::Duration;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use super::{now_ms, stats::Recent};
use crate::{
    coord::{Applier, OpOutcome},
    meta::{Fence, MetaError, Refusal, Settled},
    metrics::{Metrics, OutcomeLabel},
    vocab::{OpId, Operation},
};

/// Attempts before an operation is dead-lettered.
const MAX_ATTEMPTS: u32 = 5;
/// The pause before a retry grows by this much each time.
const RETRY_STEP: Duration = Duration::from_millis(100);

/// Whether a refusal is the store's and not the operation's: a conflicting
/// transaction (perhaps left open by a process that died mid-commit, until
/// it is ended), the store being down, or a commit whose answer was lost.
/// Queued operations wait these out rather than count them as failures.
fn waits_for_store(e: &MetaError) -> bool {
    matches!(
        e,
        MetaError::WriteConflict
            | MetaError::Transient(_)
            | MetaError::Unavailable(_)
            | MetaError::OutcomeUnknown(_)
    )
}

/// The pause before the `n`th try at something the store refused for a
/// reason not the operation's (it grows, and stops growing at the tenth).
fn transient_pause(n: u32) -> Duration {
    RETRY_STEP * n.min(10)
}

pub(super) enum Step {
    Next,
    /// The bucket is no longer this consumer's (its lease or its fence is
    /// gone): stop without acknowledging; the next consumer redoes it.
    Stop,
}

/// An operation as a broker delivered it; `handle` is the broker's own
/// (what it acknowledges or dead-letters).
pub(super) struct Delivered<H> {
    pub(super) handle: H,
    /// `None` for a message filedock did not write (no valid operation
    /// id): it is undecodable, and no waiter waits for it.
    pub(super) op_id: Option<OpId>,
    /// The instance waiting for the answer.
    pub(super) reply_to: Option<String>,
    pub(super) enqueued_ms: u64,
    pub(super) op: Result<Operation, String>,
}

/// An operation answered, and what becomes of its delivery.
pub(super) struct Answered<'a, H> {
    pub(super) delivered: &'a Delivered<H>,
    pub(super) outcome: &'a OpOutcome,
    /// `Some((error, attempts))`: it kept failing, and goes to the dead
    /// letters (instead of being acknowledged, where the broker moves a
    /// refused delivery there itself).
    pub(super) dead: Option<(&'a str, u32)>,
}

/// What the broker does with operations answered.
#[async_trait]
pub(super) trait Sink<H: Sync>: Send {
    /// Tells each waiter its outcome and acknowledges each delivery, or
    /// dead-letters it (the outcomes are in the store by now: a delivery
    /// redelivered after a lost acknowledgement gets the same answer).
    /// [`Step::Stop`] if the deliveries are no longer this consumer's (a
    /// broker whose channel closed redelivers them elsewhere).
    async fn deliver(&mut self, done: &[Answered<'_, H>]) -> Step;
}

/// A bucket's consumer while the bucket is its own: `fence` is checked by
/// every transaction that applies (a consumer that lost the bucket without
/// knowing cannot apply out of order), `lost` fires when it knows. A
/// broker that says nothing of who consumes (RabbitMQ's single active
/// consumer) takes a fence of its own before it applies.
pub(super) struct Applying<'a> {
    pub(super) applier: &'a Applier,
    pub(super) metrics: &'a Metrics,
    pub(super) recent: &'a Recent,
    pub(super) fence: Fence,
    pub(super) lost: &'a CancellationToken,
}

impl Applying<'_> {
    /// Applies a batch of deliveries (what one read returned, or what a
    /// push consumer gathered up to its prefetch), in order: as a group if
    /// it can.
    pub(super) async fn handle<H: Sync>(
        &self,
        sink: &mut impl Sink<H>,
        entries: &[Delivered<H>],
    ) -> Step {
        if entries.len() > 1
            && let Some(step) = self.process_group(sink, entries).await
        {
            return step;
        }
        for entry in entries {
            if let Step::Stop = self.process(sink, entry).await {
                return Step::Stop;
            }
        }
        Step::Next
    }

    /// Applies `entries` in one transaction (a group commit): one commit for
    /// many operations is what lets a hot key go faster than one transaction
    /// at a time. `None` if the group was refused (an operation that fails,
    /// or one applied before): the caller applies them one at a time, so each
    /// gets its own answer.
    async fn process_group<H: Sync>(
        &self,
        sink: &mut impl Sink<H>,
        entries: &[Delivered<H>],
    ) -> Option<Step> {
        let ops = entries
            .iter()
            .map(|e| Some((e.op.clone().ok()?, e.op_id?)))
            .collect::<Option<Vec<_>>>()?;
        let mut transient = 0u32;
        loop {
            if self.lost.is_cancelled() {
                return Some(Step::Stop);
            }
            match self.applier.apply_group(&ops, &self.fence).await {
                Ok(()) => break,
                Err(MetaError::StaleFence) => return Some(Step::Stop),
                Err(e) if waits_for_store(&e) => {
                    transient += 1;
                    tracing::warn!(error = %e, "queued operations wait for the metadata store");
                    tokio::time::sleep(transient_pause(transient)).await;
                }
                Err(e) => {
                    tracing::debug!(error = %e, n = ops.len(), "group refused; applying one at a time");
                    return None;
                }
            }
        }
        self.metrics.queue_grouped.inc_by(ops.len() as u64);
        let ok = OpOutcome::Applied;
        let done: Vec<_> = entries
            .iter()
            .map(|delivered| Answered {
                delivered,
                outcome: &ok,
                dead: None,
            })
            .collect();
        Some(self.deliver(sink, &done).await)
    }

    /// Applies one entry, retrying, dead-lettering what keeps failing.
    async fn process<H: Sync>(&self, sink: &mut impl Sink<H>, entry: &Delivered<H>) -> Step {
        let (mut attempts, mut transient) = (0, 0u32);
        let mut dead = None;
        let outcome = loop {
            if self.lost.is_cancelled() {
                return Step::Stop;
            }
            let op_id = entry.op_id.as_ref();
            let error = match &entry.op {
                Err(e) => format!("undecodable operation: {e}"),
                Ok(op) => {
                    let applied = self.applier.apply(op, Some(self.fence.clone()), op_id);
                    match applied.await {
                        Ok(()) => break OpOutcome::Applied,
                        // Settled too: the answer is 404, and a redelivery
                        // (its acknowledgement lost with a failed-over
                        // master) must not apply once the target exists.
                        Err(MetaError::NotFound) => {
                            match self.settle(op_id, Refusal::NotFound).await {
                                Some(Settled::Now) => break OpOutcome::NotFound,
                                Some(Settled::Applied) => break OpOutcome::Applied,
                                Some(Settled::Refused(why)) => break why.into(),
                                None => continue,
                            }
                        }
                        // Refused now, but room may be made later: settled so
                        // that a redelivery never applies what was answered
                        // refused (or answered applied if one already did).
                        Err(MetaError::ContainerFull(max)) => {
                            match self.settle(op_id, Refusal::ContainerFull(max)).await {
                                Some(Settled::Now) => break OpOutcome::ContainerFull(max),
                                Some(Settled::Applied) => break OpOutcome::Applied,
                                Some(Settled::Refused(why)) => break why.into(),
                                None => continue,
                            }
                        }
                        // Dead-lettered before, then delivered again (the
                        // broker did not hear it was dead-lettered): dead-
                        // lettered again, so that the letter is not lost.
                        Err(MetaError::Refused(Refusal::DeadLettered)) => {
                            let error = "dead-lettered before, and delivered again";
                            dead = Some((error.to_owned(), attempts.max(1)));
                            break Refusal::DeadLettered.into();
                        }
                        // Settled before (refused or cancelled, then
                        // redelivered): the same answer again.
                        Err(MetaError::Refused(why)) => break why.into(),
                        Err(MetaError::StaleFence) => return Step::Stop,
                        // Transient: a conflicting transaction (perhaps left open by a
                        // process that died mid-commit, until it is ended), the
                        // store being down, or a commit whose answer was lost (the
                        // retry finds its id in `processed_ops` if it applied).
                        // Order forbids skipping ahead, and these are not the
                        // operation's fault: wait and try again.
                        Err(e) if waits_for_store(&e) => {
                            transient += 1;
                            tracing::warn!(?op_id, error = %e, "queued operation waits for the metadata store");
                            tokio::time::sleep(transient_pause(transient)).await;
                            continue;
                        }
                        Err(e) => e.to_string(),
                    }
                }
            };
            attempts += 1;
            if attempts >= MAX_ATTEMPTS || entry.op.is_err() {
                // Given up on: settled first, so that the answer stays true
                // (another worker with the same entry may have applied it).
                match self.settle(op_id, Refusal::DeadLettered).await {
                    Some(Settled::Now) => {}
                    Some(Settled::Applied) => break OpOutcome::Applied,
                    Some(Settled::Refused(why)) => break why.into(),
                    None => continue,
                }
                let message = format!(
                    "the operation failed {attempts} times and was moved to the dead-letter queue: {error}"
                );
                dead = Some((error, attempts));
                break OpOutcome::DeadLettered(message);
            }
            tracing::warn!(
                ?op_id,
                attempt = attempts,
                error,
                "queued operation failed; retrying"
            );
            tokio::time::sleep(RETRY_STEP * attempts).await;
        };
        let answered = Answered {
            delivered: entry,
            outcome: &outcome,
            dead: dead.as_ref().map(|(e, n)| (e.as_str(), *n)),
        };
        self.deliver(sink, &[answered]).await
    }

    /// Settles `op_id` unapplied for `why` (see [`Applier::cancel`]);
    /// `None` (after a pause) while the store cannot say. An entry without
    /// an id is no operation of filedock's: nothing applies it.
    async fn settle(&self, op_id: Option<&OpId>, why: Refusal) -> Option<Settled> {
        let Some(id) = op_id else {
            return Some(Settled::Now);
        };
        match self.applier.cancel(id, why).await {
            Ok(settled) => Some(settled),
            Err(e) => {
                tracing::warn!(?op_id, error = %e, "cannot settle a failing operation yet");
                tokio::time::sleep(RETRY_STEP).await;
                None
            }
        }
    }

    /// Hands the outcomes to the broker, then counts them.
    async fn deliver<H: Sync>(&self, sink: &mut impl Sink<H>, done: &[Answered<'_, H>]) -> Step {
        let step = sink.deliver(done).await;
        for a in done {
            let label = OutcomeLabel {
                outcome: a.outcome.label().into(),
            };
            self.metrics.queue_processed.get_or_create(&label).inc();
        }
        self.recent.record(done.iter().map(|a| {
            let wait_ms = now_ms().saturating_sub(a.delivered.enqueued_ms) as f64;
            (wait_ms, *a.outcome == OpOutcome::Applied)
        }));
        step
    }
}
