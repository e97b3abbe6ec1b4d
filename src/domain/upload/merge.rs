//! Group commits of different users merged: a user's committer, its locks
//! held, hands its group here; groups that arrive while a transaction is on
//! its way to the store go in the next one together, each user's document
//! written under its own fences as in a group of its own, and the files,
//! events, permissions and intents of all in one command each
//! ([`FileRepo::commit_upload_groups`]). Many users uploading at once then
//! send a few commands per upload instead of six, which is what a small
//! upload's cost was (see BENCHMARKS 13).
//!
//! Up to [`MERGERS`] such transactions are on their way at once, so that
//! one slowed by its retries (a write conflict with another instance) does
//! not hold every other user's commit behind it.
//!
//! A merged transaction is tried once. One the store refuses (one group's
//! refusal: a stale fence, a swept intent, the user gone, a file already
//! there; or a write conflict) changed nothing, and each group is then
//! committed on its own, with its own retries, so that each upload gets its
//! own answer and no group waits out another's conflicts. One whose outcome
//! is unknown leaves every upload in it to settle its own.

use std::{
    collections::VecDeque,
    sync::{Arc, Mutex},
};

use futures::future::join_all;
use tokio::sync::oneshot;

use crate::{
    domain::commit::UserCommitError,
    meta::retry::Transactions,
    meta::{CommitOutcome, CommitUpload, FileRepo, MetaError, UserTurns},
    metrics::Metrics,
    vocab::UserId,
};

/// What one upload's commit came to.
pub(super) type Answer = Result<CommitOutcome, UserCommitError>;

/// How many merged transactions may be on their way at once.
pub const MERGERS: usize = 4;

struct Waiting {
    user: UserId,
    commits: Vec<CommitUpload>,
    answer: oneshot::Sender<Vec<Answer>>,
}

/// This instance's merger of group commits.
pub(super) struct Merges {
    files: Arc<dyn FileRepo>,
    txns: Transactions,
    metrics: Arc<Metrics>,
    /// The most uploads one transaction takes (a group bigger alone goes alone).
    max: usize,
    /// Whose turn it is to write a user's record.
    turns: Arc<UserTurns>,
    queue: Mutex<Queue>,
}

#[derive(Default)]
struct Queue {
    waiting: VecDeque<Waiting>,
    /// Merger tasks running (at most [`MERGERS`]).
    running: usize,
}

impl Merges {
    pub(super) fn new(
        files: Arc<dyn FileRepo>,
        txns: Transactions,
        metrics: Arc<Metrics>,
        max: usize,
        turns: Arc<UserTurns>,
    ) -> Arc<Self> {
        Arc::new(Self {
            files,
            txns,
            metrics,
            max: max.max(1),
            turns,
            queue: Mutex::default(),
        })
    }

    /// Commits `commits`, a group of `user`'s whose locks the caller holds,
    /// with the groups of other users waiting at the time: an answer per
    /// upload, in order. `None` if the merger died without answering (a
    /// panic): they may or may not have applied.
    pub(super) async fn commit(
        self: &Arc<Self>,
        user: UserId,
        commits: Vec<CommitUpload>,
    ) -> Option<Vec<Answer>> {
        let (answer, answered) = oneshot::channel();
        let start = {
            let mut queue = self.queue.lock().unwrap();
            queue.waiting.push_back(Waiting {
                user,
                commits,
                answer,
            });
            self.metrics.upload_groups_waiting.inc();
            let start = queue.running < MERGERS;
            queue.running += start as usize;
            start
        };
        if start {
            let merges = self.clone();
            tokio::spawn(async move { merges.run().await });
        }
        answered.await.ok()
    }

    /// Commits batches until none waits.
    async fn run(self: Arc<Self>) {
        let mut done = Done {
            merges: self.clone(),
            finished: false,
        };
        loop {
            let batch = {
                let mut queue = self.queue.lock().unwrap();
                if queue.waiting.is_empty() {
                    queue.running -= 1;
                    break;
                }
                self.take(&mut queue.waiting)
            };
            let answers = match batch.as_slice() {
                [one] => vec![self.commit_group(&one.user, &one.commits).await],
                _ => self.commit_merged(&batch).await,
            };
            for (w, a) in batch.into_iter().zip(answers) {
                // A committer whose uploads all went away may have ended.
                let _ = w.answer.send(a);
            }
        }
        done.finished = true;
    }

    /// The groups waiting first, as many as fit in `max` uploads (the
    /// first whatever its size).
    fn take(&self, queue: &mut VecDeque<Waiting>) -> Vec<Waiting> {
        let mut batch: Vec<Waiting> = Vec::new();
        let mut uploads = 0;
        while let Some(next) = queue.front()
            && (batch.is_empty() || uploads + next.commits.len() <= self.max)
        {
            uploads += next.commits.len();
            batch.extend(queue.pop_front());
        }
        self.metrics.upload_commits_waiting.dec_by(uploads as i64);
        let groups = batch.len() as i64;
        self.metrics.upload_groups_waiting.dec_by(groups);
        batch
    }

    /// Several users' groups in one transaction, each user's in their turn
    /// (taken together, in order); if the store refuses it, each group on
    /// its own.
    async fn commit_merged(&self, batch: &[Waiting]) -> Vec<Vec<Answer>> {
        let users: Vec<&UserId> = batch.iter().map(|w| &w.user).collect();
        let groups: Vec<Vec<CommitUpload>> = batch.iter().map(|w| w.commits.clone()).collect();
        let uploads: usize = groups.iter().map(Vec::len).sum();
        // One attempt: after a write conflict (one user's document written
        // meanwhile) each group retries on its own, and the others do not
        // wait on that user's.
        let merged = self.txns.once("commit_upload_groups", async {
            let _turns = self.turns.hold_all(&users).await;
            self.metrics.upload_commit_txns.inc();
            self.files.commit_upload_groups(&groups).await
        });
        match merged.await {
            Ok(outcomes) => {
                self.metrics.uploads_grouped.inc_by(uploads as u64);
                self.metrics.upload_groups_merged.inc_by(batch.len() as u64);
                let answers = outcomes.into_iter().map(|outcomes| {
                    let answers = outcomes.into_iter().map(|a| a.map_err(Into::into));
                    answers.collect()
                });
                answers.collect()
            }
            // It may have applied (each upload settles its own), or the
            // store is not there and nothing was sent (each refuses its own).
            Err(e @ (MetaError::OutcomeUnknown(_) | MetaError::Unavailable(_))) => groups
                .iter()
                .map(|g| vec![Err(e.clone().into()); g.len()])
                .collect(),
            Err(e) => {
                tracing::debug!(error = %e, groups = batch.len(), "merged commit refused; committing each group alone");
                join_all(batch.iter().map(|w| self.commit_group(&w.user, &w.commits))).await
            }
        }
    }

    /// One user's group (the user's commit lock held): alone as ever,
    /// several in one transaction, or, if the store refuses the group, one
    /// by one. Each transaction runs in `user`'s turn ([`UserTurns`]): none
    /// of their other writes to their record in this instance (a creation)
    /// runs meanwhile, to conflict with it.
    async fn commit_group(&self, user: &UserId, commits: &[CommitUpload]) -> Vec<Answer> {
        if let [one] = commits {
            return vec![self.commit_one(user, one).await];
        }
        let grouped = self.turns.run(&self.txns, "commit_upload_group", user, || {
            self.metrics.upload_commit_txns.inc();
            self.files.commit_uploads(commits)
        });
        match grouped.await {
            Ok(r) => {
                self.metrics.uploads_grouped.inc_by(commits.len() as u64);
                r.value.into_iter().map(|a| a.map_err(Into::into)).collect()
            }
            Err(e @ (MetaError::OutcomeUnknown(_) | MetaError::Unavailable(_))) => {
                vec![Err(e.into()); commits.len()]
            }
            Err(e) => {
                tracing::debug!(error = %e, n = commits.len(), "group commit refused; committing one at a time");
                let mut answers = Vec::with_capacity(commits.len());
                for c in commits {
                    answers.push(self.commit_one(user, c).await);
                }
                answers
            }
        }
    }

    /// One upload's commit in a transaction of its own.
    async fn commit_one(&self, user: &UserId, commit: &CommitUpload) -> Answer {
        let committed = self.turns.run(&self.txns, "commit_upload", user, || {
            self.metrics.upload_commit_txns.inc();
            self.files.commit_upload(commit)
        });
        Ok(committed.await?.value)
    }
}

/// Ends a merger that did not finish (it panicked): its batch is dropped
/// unanswered (its uploads settle it as unknown); if it was the last one
/// running and groups wait, a new one takes them.
struct Done {
    merges: Arc<Merges>,
    finished: bool,
}

impl Drop for Done {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        if std::thread::panicking() {
            self.merges.metrics.committer_panics.inc();
        }
        let Ok(mut queue) = self.merges.queue.lock() else {
            return;
        };
        queue.running -= 1;
        if queue.running == 0
            && !queue.waiting.is_empty()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            queue.running += 1;
            let merges = self.merges.clone();
            runtime.spawn(async move { merges.run().await });
        }
    }
}
