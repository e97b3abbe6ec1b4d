//! The queue's front, whatever the broker ([`Broker`]): a request's
//! operation goes down the direct lock path while the broker is unhealthy
//! (the circuit breaker); else it is enqueued under a new id, and the
//! request waits for its answer, heard from the broker or read again every
//! second, as long as the dynamic timeout allows. An operation whose wait
//! ran out, that the broker refused, or whose failed enqueue the direct
//! path then failed too, is settled in the store before it is answered, so
//! that a copy still queued never applies after the answer.

use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio::sync::oneshot;

use crate::{
    coord::{
        Applier, CoordError, Coordinator, LockCoordinator, OpOutcome, bucket_of, wait_timeout,
    },
    lock::LockError,
    meta::{MetaError, Refusal, Settled},
    vocab::{OpId, Operation},
};

/// Callers waiting for their operation's result, by operation id.
pub type Waiters = crate::lock::waiters::Waiters<oneshot::Sender<OpOutcome>>;

/// How often a waiter re-reads its result, in case a notice was lost.
const RESULT_POLL_EVERY: Duration = Duration::from_secs(1);
/// How long settling a timed-out operation may take before the answer is
/// "outcome unknown" (the store may be waiting on a worker's transaction).
const SETTLE_WAIT: Duration = Duration::from_secs(5);

/// Why an enqueue did not go through.
pub(super) enum EnqueueError {
    /// The broker is up and did not take it (a Redis Cluster's topology
    /// answer, a publish the broker could not route): no circuit breaker
    /// and no direct path; the operation is refused.
    Misrouted(String),
    /// The broker failed to take it (it may have all the same: a lost
    /// reply): the direct path applies it under its id.
    Failed(String),
}

/// What a queue's front needs of its broker.
#[async_trait]
pub(super) trait Broker: Send + Sync {
    /// What keeps a waiter's answers heard (see [`Broker::listen`]).
    type Listening: Send;

    /// Whether the part of the broker that holds bucket `b` answers (the
    /// circuit breaker; checked at most once a second).
    async fn healthy(&self, b: u32) -> bool;

    /// Bucket `b`'s part of the broker failed a request: unhealthy until
    /// the next check.
    fn mark_unhealthy(&self, b: u32);

    /// Makes sure this instance hears the answers of bucket `b` while the
    /// returned value lives; `None` if that takes too long (the waiter
    /// then hears by reading its result again).
    async fn listen(&self, b: u32) -> Option<Self::Listening>;

    /// Enqueues `op` under `op_id` on bucket `b`, for this instance to hear
    /// the answer; how many operations are ahead of it. `Ok` only once the
    /// broker holds it durably (a stream's `XADD` answered, a publisher
    /// confirm).
    async fn enqueue(&self, b: u32, op: &Operation, op_id: &OpId) -> Result<u64, EnqueueError>;

    /// The answer for `op_id`, read again (every second while its waiter
    /// waits) in case its notice was lost; `heard` is what
    /// [`Broker::listen`] gave the waiter.
    async fn read_result(
        &self,
        b: u32,
        op_id: &OpId,
        heard: Option<&Self::Listening>,
    ) -> Option<OpOutcome>;
}

/// The broker-neutral part of a queue's front.
pub(super) struct Front {
    pub(super) waiters: Waiters,
    pub(super) applier: Applier,
    /// Where operations go while the broker is unhealthy.
    pub(super) direct: LockCoordinator,
    /// The waiter's base wait (`FILEDOCK_QUEUE_WAIT_SECS`).
    pub(super) wait: Duration,
}

impl Front {
    /// Runs `op` through `broker` (see the module).
    pub(super) async fn run<B: Broker>(&self, broker: &B, op: Operation) -> Result<(), CoordError> {
        let b = bucket_of(&op.lock_key());
        if !broker.healthy(b).await {
            return self.direct.run(op).await;
        }
        let op_id = OpId::new();
        let (tx, mut rx) = oneshot::channel();
        // Registered, and its answers heard, before the enqueue, so the
        // result cannot come too early.
        let _waiting = self.waiters.register(&op_id.to_string(), tx);
        let heard = broker.listen(b).await;
        let ahead = match broker.enqueue(b, &op, &op_id).await {
            Ok(n) => n,
            // This try was not taken, but an earlier one the broker's
            // client sent again (a dropped link, a timeout) may have been:
            // the refusal is settled first, so a copy in the queue never
            // applies after it (or, applied already, is the answer).
            Err(EnqueueError::Misrouted(e)) => {
                tracing::error!(error = %e, "enqueue misrouted; refusing the operation");
                let refused = CoordError::Lock(LockError::Misrouted(e));
                return self.settle(&op, &op_id, refused).await;
            }
            Err(EnqueueError::Failed(e)) => {
                // The entry may be in the queue all the same (a lost
                // reply): the direct path applies it under its id, so the
                // copy applies once; and a failure is settled before it is
                // told, so the copy cannot apply after the answer.
                tracing::warn!(error = %e, "enqueue failed; taking the direct path");
                broker.mark_unhealthy(b);
                return match self.direct.run_as(op.clone(), Some(&op_id)).await {
                    Ok(()) => Ok(()),
                    Err(e) => self.settle(&op, &op_id, e).await,
                };
            }
        };
        let deadline = Instant::now() + wait_timeout(self.wait, ahead);
        loop {
            let now = Instant::now();
            if now >= deadline {
                return self.settle(&op, &op_id, CoordError::Cancelled).await;
            }
            tokio::select! {
                outcome = &mut rx => {
                    if let Ok(o) = outcome {
                        return o.into_result();
                    }
                }
                _ = tokio::time::sleep(RESULT_POLL_EVERY.min(deadline - now)) => {}
            }
            if let Some(o) = broker.read_result(b, &op_id, heard.as_ref()).await {
                return o.into_result();
            }
        }
    }

    /// Answers for an operation that may still be queued without leaving
    /// it free to apply later: its id is recorded as processed, so a worker
    /// skips it, and `failure` is the answer. If the id was there already,
    /// it applied. If the store cannot say in time, the outcome is unknown.
    async fn settle(
        &self,
        op: &Operation,
        op_id: &OpId,
        failure: CoordError,
    ) -> Result<(), CoordError> {
        let why = match &failure {
            CoordError::Meta(MetaError::ContainerFull(max)) => Refusal::ContainerFull(*max),
            CoordError::Meta(MetaError::NotFound) => Refusal::NotFound,
            _ => Refusal::Cancelled,
        };
        match tokio::time::timeout(SETTLE_WAIT, self.applier.cancel(op_id, why)).await {
            Ok(Ok(Settled::Now)) => Err(failure),
            Ok(Ok(Settled::Applied)) => Ok(()),
            Ok(Ok(Settled::Refused(why))) => OpOutcome::from(why).into_result(),
            Ok(Err(e)) => {
                tracing::warn!(%op_id, error = %e, "could not settle a queued operation");
                Err(CoordError::OutcomeUnknown(op.resource_path()))
            }
            Err(_) => Err(CoordError::OutcomeUnknown(op.resource_path())),
        }
    }
}
