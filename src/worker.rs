//! The shape every background worker shares (the sweeper, the queue's bucket
//! manager and its bucket workers), as garage's `Worker` is: a name, a
//! status, and work done in steps until the worker is stopped. One runner
//! drives them all, so stopping, pacing and logging work the same way.

use std::time::Duration;

use async_trait::async_trait;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// What a step of work leaves to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorkerState {
    /// More to do now.
    Busy,
    /// Nothing to do for this long.
    Idle(Duration),
    /// Finished for good.
    Done,
}

#[async_trait]
pub trait Worker: Send + 'static {
    fn name(&self) -> String;

    /// What it is doing, in a few words.
    fn status(&self) -> String;

    /// How long to wait before the first step.
    fn first_delay(&self) -> Duration {
        Duration::ZERO
    }

    /// One step of work. `stop` fires when the worker is to stop: a step
    /// that runs long watches it.
    async fn work(&mut self, stop: &CancellationToken) -> WorkerState;

    /// Runs once the worker has stopped, for whatever reason: give back
    /// what it holds.
    async fn stopped(&mut self) {}
}

/// Runs `worker` step by step until it is done or `stop` fires (a step in
/// progress is not interrupted).
pub async fn run_until_stopped(mut worker: impl Worker, stop: CancellationToken) {
    tracing::debug!(worker = %worker.name(), "worker started");
    let mut wait = worker.first_delay();
    loop {
        if !wait.is_zero() {
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = tokio::time::sleep(wait) => {}
            }
        }
        if stop.is_cancelled() {
            break;
        }
        wait = match worker.work(&stop).await {
            WorkerState::Busy => Duration::ZERO,
            WorkerState::Idle(d) => d,
            WorkerState::Done => break,
        };
    }
    worker.stopped().await;
    tracing::debug!(worker = %worker.name(), status = %worker.status(), "worker stopped");
}

/// Runs `worker` on its own task.
pub fn spawn(worker: impl Worker, stop: CancellationToken) -> JoinHandle<()> {
    tokio::spawn(run_until_stopped(worker, stop))
}
