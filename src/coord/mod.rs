//! The `Coordinator` port: how a write to a hot resource (a session's files,
//! an agent's files or its connections) is serialized. `lock` takes the
//! resource's lock and applies the write directly; `queue` enqueues it on an
//! ordered per-key queue and waits for a worker to apply it (Redis Streams
//! across instances, or in-process without Redis). The HTTP API is the same.
//!
//! A coordinator gets its ports when it is built (`Coordinator::run(&self,
//! op)`), and every one ends in an [`Applier`]: the retried, counted
//! transaction on the container repository.

pub mod local;
pub mod queue;

use std::{sync::Arc, time::Duration};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::{
    lock::{LockError, Locks},
    meta::retry::Transactions,
    meta::{ContainerRepo, Fence, MetaError, MetaResult},
    vocab::{LockKey, Operation},
};

/// Applies operations to the metadata store: what every coordinator ends in.
#[derive(Clone)]
pub struct Applier {
    meta: Arc<dyn ContainerRepo>,
    txns: Transactions,
}

impl Applier {
    pub fn new(meta: Arc<dyn ContainerRepo>, txns: Transactions) -> Self {
        Self { meta, txns }
    }

    /// Applies `op` in a retried transaction. With an `op_id`, a redelivered
    /// operation is applied once (`processed_ops`).
    pub async fn apply(
        &self,
        op: &Operation,
        fence: Option<Fence>,
        op_id: Option<&str>,
    ) -> MetaResult<()> {
        let result = self
            .txns
            .run(op.metric_op(), || {
                self.meta.apply_op(op, fence.as_ref(), op_id)
            })
            .await;
        match result {
            Ok(_) | Err(MetaError::AlreadyApplied) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Settles a queued operation whose waiter gave up (see
    /// [`ContainerRepo::cancel_op`]): `true` if it can no longer apply,
    /// `false` if it already did.
    pub async fn cancel(&self, op_id: &str) -> MetaResult<bool> {
        Ok(self
            .txns
            .run("cancel_op", || self.meta.cancel_op(op_id))
            .await?
            .value)
    }

    /// Applies queued operations in one transaction (see [`ContainerRepo::apply_group`]).
    pub async fn apply_group(&self, ops: &[(Operation, String)], fence: &Fence) -> MetaResult<()> {
        self.meta.apply_group(ops, fence).await
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
    /// A queue worker answered with this error code.
    #[error("queued operation failed: {0}")]
    Failed(String),
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
    pub async fn run_as(&self, op: Operation, op_id: Option<&str>) -> Result<(), CoordError> {
        self.locks
            .with_lock(&op.lock_key(), async |held| {
                let fence = Fence::of_lock(held.fence(), op.fence_slot());
                match self.applier.apply(&op, fence, op_id).await {
                    Err(MetaError::OutcomeUnknown(_)) => {
                        Err(CoordError::OutcomeUnknown(op.resource_path()))
                    }
                    other => Ok(other?),
                }
            })
            .await
    }
}

/// The seed's `QueueMetrics`, plus what this instance holds.
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
    /// The seed's thresholds: length > 100, dead letters > 10, average wait > 5 s.
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

/// An operation's result as it travels back to the waiter.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct OpOutcome {
    pub code: Option<String>,
    pub message: Option<String>,
}

impl OpOutcome {
    pub fn ok() -> Self {
        Self {
            code: None,
            message: None,
        }
    }

    /// Either side of the operation is not the owner's.
    pub fn not_found() -> Self {
        Self {
            code: Some("not_found".into()),
            message: Some("not found".into()),
        }
    }

    pub fn into_result(self) -> Result<(), CoordError> {
        match self.code.as_deref() {
            None => Ok(()),
            Some("not_found") => Err(MetaError::NotFound.into()),
            Some("dead_lettered") => {
                Err(CoordError::DeadLettered(self.message.unwrap_or_default()))
            }
            Some(code) => Err(CoordError::Failed(code.to_owned())),
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
    fn warnings_follow_the_seed_thresholds() {
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
}
