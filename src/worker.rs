//! The shape every background worker shares (the sweeper, the queue's bucket
//! manager and its bucket workers), as garage's `Worker` is: a name, a
//! status, and work done in steps until the worker is stopped. One runner
//! drives them all, so stopping, pacing and logging work the same way, and
//! [`Workers`] keeps their tasks so that a shutdown waits for them.

use std::time::{Duration, Instant};

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

/// A server's background workers, kept so that its shutdown waits until
/// each has stopped (and given back what it holds: leases, stores) before
/// the process goes on, as garage's runner drains its workers.
#[derive(Default)]
pub struct Workers {
    running: Vec<(String, JoinHandle<()>)>,
}

impl Workers {
    /// Runs `worker` on its own task, until `stop` fires.
    pub fn spawn(&mut self, worker: impl Worker, stop: CancellationToken) {
        let name = worker.name();
        self.running.push((name, spawn(worker, stop)));
    }

    /// Keeps the task of a worker started elsewhere.
    pub fn add(&mut self, name: impl Into<String>, task: JoinHandle<()>) {
        self.running.push((name.into(), task));
    }

    /// Waits for every worker to stop (their stop signal must have fired),
    /// at most until `deadline`; one still running then is aborted, and
    /// named in the log. How many were aborted.
    pub async fn drain(self, deadline: Instant) -> usize {
        let mut aborted = 0;
        for (name, mut task) in self.running {
            let left = deadline.saturating_duration_since(Instant::now());
            if tokio::time::timeout(left, &mut task).await.is_err() {
                tracing::warn!(worker = %name, "worker still busy at the end of the shutdown grace; stopped");
                task.abort();
                aborted += 1;
            }
        }
        aborted
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    };

    use super::*;

    /// Idles until stopped, then takes `cleanup` to give back what it holds.
    struct Slow {
        cleanup: Duration,
        cleaned: Arc<AtomicBool>,
    }

    #[async_trait]
    impl Worker for Slow {
        fn name(&self) -> String {
            "slow".into()
        }

        fn status(&self) -> String {
            String::new()
        }

        async fn work(&mut self, _: &CancellationToken) -> WorkerState {
            WorkerState::Idle(Duration::from_secs(3600))
        }

        async fn stopped(&mut self) {
            tokio::time::sleep(self.cleanup).await;
            self.cleaned.store(true, Ordering::SeqCst);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_drain_waits_for_each_worker_to_give_back_what_it_holds_until_the_deadline() {
        let stop = CancellationToken::new();
        let mut workers = Workers::default();
        let (quick, stuck) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicBool::new(false)),
        );
        for (cleanup, cleaned) in [(1, &quick), (120, &stuck)] {
            let cleanup = Duration::from_secs(cleanup);
            let cleaned = cleaned.clone();
            workers.spawn(Slow { cleanup, cleaned }, stop.child_token());
        }
        stop.cancel();
        let aborted = workers
            .drain(Instant::now() + Duration::from_secs(30))
            .await;
        assert!(
            quick.load(Ordering::SeqCst),
            "the drain waited for its clean-up"
        );
        assert_eq!(aborted, 1, "the one still busy at the deadline is stopped");
        assert!(!stuck.load(Ordering::SeqCst));
    }
}
