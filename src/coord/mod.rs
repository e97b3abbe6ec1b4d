//! The `Coordinator` port: how a write to a hot resource (a session's files,
//! an agent's files or its connections) is serialized. `lock` takes the
//! resource's lock and applies the write directly; `queue` enqueues it on an
//! ordered per-key queue and waits for a worker to apply it (Redis Streams
//! across instances, or in-process without Redis). The HTTP API is the same.
//!
//! A coordinator gets its ports when it is built (`Coordinator::run(&self,
//! op)`), and every one ends in an [`Applier`]: the retried, counted
//! transaction on the container repository.

pub mod bell;
pub mod brokers;
pub mod local;
pub mod members;
pub mod queue;

use std::{sync::Arc, time::Duration};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::{
    lock::{LockError, Locks},
    meta::retry::Transactions,
    meta::{ContainerRepo, Fence, MetaError, MetaResult, Refusal, Settled, UserTurns},
    vocab::{LockKey, OpId, Operation, UserId},
};

/// Applies operations to the metadata store: what every coordinator ends in.
#[derive(Clone)]
pub struct Applier {
    meta: Arc<dyn ContainerRepo>,
    txns: Transactions,
    /// A change that writes an event writes its owner's record: each
    /// attempt runs in the owner's turn, as their commits' do.
    turns: Arc<UserTurns>,
    /// The most members one list of a container may hold
    /// (`FILEDOCK_MAX_CONTAINER_ITEMS`).
    max_items: usize,
}

impl Applier {
    pub fn new(
        meta: Arc<dyn ContainerRepo>,
        (txns, turns): (Transactions, Arc<UserTurns>),
        max_items: usize,
    ) -> Self {
        Self {
            meta,
            txns,
            turns,
            max_items,
        }
    }

    /// Applies `op` in a retried transaction. With an `op_id`, a redelivered
    /// operation is applied once (`processed_ops`).
    pub async fn apply(
        &self,
        op: &Operation,
        fence: Option<Fence>,
        op_id: Option<&OpId>,
    ) -> MetaResult<()> {
        let result = self
            .turns
            .run(&self.txns, op.metric_op(), op.owner_id(), || {
                self.meta
                    .apply_op(op, fence.as_ref(), op_id, self.max_items)
            })
            .await;
        match result {
            Ok(_) | Err(MetaError::AlreadyApplied) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Settles a queued operation that will not be applied, for `why` (see
    /// [`ContainerRepo::cancel_op`]).
    pub async fn cancel(&self, op_id: &OpId, why: Refusal) -> MetaResult<Settled> {
        Ok(self
            .txns
            .run("cancel_op", || self.meta.cancel_op(op_id, why.clone()))
            .await?
            .value)
    }

    /// How a queued operation was settled, if it was and the store says
    /// (see [`ContainerRepo::find_op`]); `None` otherwise.
    pub async fn outcome(&self, op_id: &OpId) -> Option<OpOutcome> {
        match self.meta.find_op(op_id).await {
            Ok(Some(Settled::Refused(why))) => Some(why.into()),
            Ok(Some(_)) => Some(OpOutcome::Applied),
            Ok(None) | Err(_) => None,
        }
    }

    /// Applies queued operations in one transaction (see
    /// [`ContainerRepo::apply_group`]), in the turns of their owners.
    pub async fn apply_group(&self, ops: &[(Operation, OpId)], fence: &Fence) -> MetaResult<()> {
        let owners: Vec<&UserId> = ops.iter().map(|(op, _)| op.owner_id()).collect();
        let _turns = self.turns.hold_all(&owners).await;
        self.meta
            .apply_group(ops, fence, self.max_items)
            .await
            .map(drop)
    }
}

/// Why a coordinated write did not apply (or may not have).
#[derive(Debug, thiserror::Error)]
pub enum CoordError {
    #[error(transparent)]
    Lock(#[from] LockError),
    #[error(transparent)]
    Meta(#[from] MetaError),
    /// The change may or may not have applied (a lost answer; a queued
    /// operation that could not be cancelled). The resource to read to find out.
    #[error("the operation may or may not have applied; read {0} to find out")]
    OutcomeUnknown(String),
    /// Still queued when the wait ran out; cancelled, so it never applies.
    #[error("timed out waiting in the queue; the operation was cancelled")]
    Cancelled,
    /// It kept failing and was moved to the dead-letter queue.
    #[error("{0}")]
    DeadLettered(String),
}

#[async_trait]
pub trait Coordinator: Send + Sync {
    /// Applies `op` and answers when it is applied (or failed).
    async fn run(&self, op: Operation) -> Result<(), CoordError>;

    /// The queue's figures, for `GET /v1/admin/queue` (lock mode has none).
    async fn stats(&self) -> Option<QueueStats> {
        None
    }
}

/// The direct path: take the resource's lock, apply, release.
pub struct LockCoordinator {
    locks: Arc<Locks>,
    applier: Applier,
}

impl LockCoordinator {
    pub fn new(locks: Arc<Locks>, applier: Applier) -> Self {
        Self { locks, applier }
    }
}

#[async_trait]
impl Coordinator for LockCoordinator {
    async fn run(&self, op: Operation) -> Result<(), CoordError> {
        self.run_as(op, None).await
    }
}

impl LockCoordinator {
    /// Runs `op`, recording `op_id` with it when it has one (an operation
    /// that may also sit in the queue must apply once, whichever path gets
    /// to it first).
    ///
    /// The change runs under the owner's commit lock too, taken inside the
    /// resource's: one that changes something writes the owner's record
    /// (its event's number), as their uploads' commits do under that lock,
    /// so one user's writes to different sessions and agents, on any
    /// instance, take turns there instead of conflicting past the last
    /// retry. (The queue takes no such lock: its workers wait out a
    /// conflict, and a lock held by a killed process would stall them.)
    pub async fn run_as(&self, op: Operation, op_id: Option<&OpId>) -> Result<(), CoordError> {
        let commit = LockKey::user_commit(op.owner_id());
        self.locks
            .with_lock(&op.lock_key(), async |held| {
                let fence = Fence::of_lock(held.fence(), op.fence_slot());
                let applied = self
                    .locks
                    .with_lock(&commit, async |_| {
                        Ok::<_, CoordError>(self.applier.apply(&op, fence, op_id).await?)
                    })
                    .await;
                match applied {
                    Err(CoordError::Meta(MetaError::OutcomeUnknown(_))) => {
                        Err(CoordError::OutcomeUnknown(op.resource_path()))
                    }
                    other => other,
                }
            })
            .await
    }
}

/// The queue's figures (those of the original design's `QueueMetrics`:
/// length, rate, wait, failures, dead letters), plus what this instance holds.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct QueueStats {
    /// Operations enqueued and not yet acknowledged, over all buckets.
    pub length: u64,
    /// Operations applied per second by this instance over the last minute.
    pub processing_rate: f64,
    /// Mean time from enqueue to applied, last minute, this instance.
    pub average_wait_ms: f64,
    /// Share of operations that failed, last minute, this instance.
    pub failure_rate: f64,
    pub dead_letter_count: u64,
    /// Logical buckets this instance consumes.
    pub buckets_held: usize,
    pub warnings: Vec<String>,
}

impl QueueStats {
    /// Warnings past length 100, 10 dead letters or 5 s average wait.
    pub fn with_warnings(mut self) -> Self {
        self.warnings.clear();
        if self.length > 100 {
            self.warnings
                .push(format!("queue length {} is over 100", self.length));
        }
        if self.dead_letter_count > 10 {
            self.warnings.push(format!(
                "{} operations are in the dead-letter queue (over 10)",
                self.dead_letter_count
            ));
        }
        if self.average_wait_ms > 5000.0 {
            self.warnings.push(format!(
                "average wait {:.0} ms is over 5 s",
                self.average_wait_ms
            ));
        }
        self
    }
}

/// The fixed number of logical buckets: the unit of ownership, so adding
/// instances moves buckets and never remaps keys.
pub const BUCKETS: u32 = 64;

/// The bucket of a routing key (CRC-32, stable across processes and versions).
pub fn bucket_of(key: &LockKey) -> u32 {
    crc32fast::hash(key.as_str().as_bytes()) % BUCKETS
}

/// How long a waiter waits: `base` (30 s by default) + 2 s per queued
/// operation ahead, at most 5 min (or `base`, if that is longer).
pub fn wait_timeout(base: Duration, queue_len: u64) -> Duration {
    let cap = MAX_QUEUE_WAIT.max(base);
    (base + PER_OP_AHEAD * u32::try_from(queue_len).unwrap_or(u32::MAX)).min(cap)
}

const MAX_QUEUE_WAIT: Duration = Duration::from_secs(300);
const PER_OP_AHEAD: Duration = Duration::from_secs(2);

/// A queued operation's result as it travels back to its waiter.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(into = "OutcomeWire", try_from = "OutcomeWire")]
pub enum OpOutcome {
    Applied,
    /// Either side of the operation is not the owner's; nothing changed.
    NotFound,
    /// The list is at its limit (the limit); nothing changed, and the
    /// operation's id is settled so that it never applies later.
    ContainerFull(usize),
    /// It kept failing and was moved to the dead-letter queue; the message
    /// says why.
    DeadLettered(String),
}

/// The answer for an operation settled unapplied before (a redelivery of it).
impl From<Refusal> for OpOutcome {
    fn from(why: Refusal) -> Self {
        match why {
            Refusal::ContainerFull(max) => Self::ContainerFull(max),
            Refusal::DeadLettered => {
                Self::DeadLettered("the operation was moved to the dead-letter queue".into())
            }
            Refusal::Cancelled => {
                Self::DeadLettered("the operation was cancelled: its wait ran out".into())
            }
            Refusal::NotFound => Self::NotFound,
        }
    }
}

impl OpOutcome {
    /// Its name in the metrics (`filedock_queue_processed_total`).
    pub fn label(&self) -> &'static str {
        match self {
            Self::Applied => "applied",
            Self::NotFound => "not_found",
            Self::ContainerFull(_) => "container_full",
            Self::DeadLettered(_) => "dead_lettered",
        }
    }

    pub fn into_result(self) -> Result<(), CoordError> {
        match self {
            Self::Applied => Ok(()),
            Self::NotFound => Err(MetaError::NotFound.into()),
            Self::ContainerFull(max) => Err(MetaError::ContainerFull(max).into()),
            Self::DeadLettered(message) => Err(CoordError::DeadLettered(message)),
        }
    }
}

/// [`OpOutcome`] as Redis keeps it, `{"code", "message"}` (`code` null when
/// applied): the shape instances of every version read and write. A code
/// this version does not know does not decode; its waiter then settles the
/// operation as one whose answer was lost.
#[derive(Serialize, Deserialize)]
struct OutcomeWire {
    code: Option<String>,
    message: Option<String>,
}

impl From<OpOutcome> for OutcomeWire {
    fn from(o: OpOutcome) -> Self {
        let code = match &o {
            OpOutcome::Applied => None,
            other => Some(other.label().to_owned()),
        };
        let message = match o {
            OpOutcome::Applied => None,
            OpOutcome::NotFound => Some("not found".into()),
            OpOutcome::ContainerFull(max) => Some(max.to_string()),
            OpOutcome::DeadLettered(m) => Some(m),
        };
        Self { code, message }
    }
}

impl TryFrom<OutcomeWire> for OpOutcome {
    type Error = String;

    fn try_from(w: OutcomeWire) -> Result<Self, String> {
        match w.code.as_deref() {
            None => Ok(Self::Applied),
            Some("not_found") => Ok(Self::NotFound),
            Some("container_full") => w
                .message
                .and_then(|m| m.parse().ok())
                .map(Self::ContainerFull)
                .ok_or_else(|| "container_full without its limit".to_owned()),
            Some("dead_lettered") => Ok(Self::DeadLettered(w.message.unwrap_or_default())),
            Some(other) => Err(format!("unknown operation outcome {other:?}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_stable_and_spread() {
        let key = LockKey::agent_config("5f0c7a52-0000-7000-8000-000000000000");
        assert_eq!(bucket_of(&key), bucket_of(&key.clone()));
        let used: std::collections::HashSet<u32> = (0..1000)
            .map(|i| bucket_of(&LockKey::agent_config(&i.to_string())))
            .collect();
        assert!(
            used.len() > 60,
            "1000 keys reach {} of 64 buckets",
            used.len()
        );
    }

    #[test]
    fn the_wait_grows_with_the_queue_and_is_capped() {
        let base = Duration::from_secs(30);
        assert_eq!(wait_timeout(base, 0).as_secs(), 30);
        assert_eq!(wait_timeout(base, 10).as_secs(), 50);
        assert_eq!(wait_timeout(base, 10_000).as_secs(), 300);
    }

    #[test]
    fn warnings_start_past_100_queued_10_dead_letters_or_5_s_wait() {
        let quiet = QueueStats {
            length: 100,
            dead_letter_count: 10,
            average_wait_ms: 5000.0,
            ..Default::default()
        };
        assert!(quiet.with_warnings().warnings.is_empty());
        let loud = QueueStats {
            length: 101,
            dead_letter_count: 11,
            average_wait_ms: 5001.0,
            ..Default::default()
        };
        assert_eq!(loud.with_warnings().warnings.len(), 3);
    }

    #[test]
    fn outcomes_keep_their_wire_shape_and_an_unknown_code_does_not_decode() {
        let cases = [
            (OpOutcome::Applied, r#"{"code":null,"message":null}"#),
            (
                OpOutcome::ContainerFull(3),
                r#"{"code":"container_full","message":"3"}"#,
            ),
            (
                OpOutcome::NotFound,
                r#"{"code":"not_found","message":"not found"}"#,
            ),
            (
                OpOutcome::DeadLettered("failed 5 times".into()),
                r#"{"code":"dead_lettered","message":"failed 5 times"}"#,
            ),
        ];
        for (outcome, wire) in cases {
            assert_eq!(serde_json::to_string(&outcome).unwrap(), wire);
            assert_eq!(serde_json::from_str::<OpOutcome>(wire).unwrap(), outcome);
        }
        assert!(
            serde_json::from_str::<OpOutcome>(r#"{"code":"exploded","message":null}"#).is_err()
        );
    }
}
