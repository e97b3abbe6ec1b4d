//! Group commit: one user's uploads whose bytes are stored commit together.
//! An upload hands its commit to the user's committer on this instance and
//! waits for its own answer; the committer takes the locks as one upload
//! would (the category lock with lock scope = commit, then the user's commit
//! lock), and with them held takes every commit waiting for them (at most
//! `upload_group_max`, in arrival order) and runs them in one transaction
//! ([`FileRepo::commit_uploads`]), under one fence: the holder's. A group
//! the store refuses is committed one upload at a time under the same locks,
//! as the queue does with a group it cannot apply.
//!
//! The committer is a task of its own: an upload whose client goes away
//! does not take the commits of others with it.

use std::{
    collections::{HashMap, VecDeque},
    sync::{Arc, Mutex},
};

use tokio::sync::oneshot;

use crate::{
    domain::commit::UserCommitError,
    lock::{Held, LockError, Locks},
    meta::retry::Transactions,
    meta::{CommitOutcome, CommitUpload, Fence, FileRepo, MetaError, UserTurns},
    metrics::Metrics,
    vocab::{LockKey, SizeCategory, UserId},
};

/// What one upload's commit came to.
pub(super) type Answer = Result<CommitOutcome, UserCommitError>;

/// Whose commits go together: a user's, and with lock scope = commit, one
/// size category's (the lock whose fence the group commits under).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct GroupKey {
    user: UserId,
    /// The category lock the committer takes (scope = commit); `None` when
    /// every upload holds its own (scope = upload) and brings its fence.
    category: Option<SizeCategory>,
}

struct Waiting {
    commit: CommitUpload,
    answer: oneshot::Sender<Answer>,
}

/// The committers of this instance, one per group key while it has work.
pub struct CommitGroups {
    files: Arc<dyn FileRepo>,
    locks: Arc<Locks>,
    txns: Transactions,
    metrics: Arc<Metrics>,
    max: usize,
    /// Commits waiting, per key; a key is here while its committer runs.
    waiting: Mutex<HashMap<GroupKey, VecDeque<Waiting>>>,
    /// Whose turn it is to write a user's record.
    turns: Arc<UserTurns>,
}

impl CommitGroups {
    pub fn new(
        files: Arc<dyn FileRepo>,
        locks: Arc<Locks>,
        txns: Transactions,
        metrics: Arc<Metrics>,
        max: usize,
        turns: Arc<UserTurns>,
    ) -> Arc<Self> {
        Arc::new(Self {
            files,
            locks,
            txns,
            metrics,
            max: max.max(1),
            waiting: Mutex::default(),
            turns,
        })
    }

    /// Commits `commit` of `user` with whatever else of theirs is ready.
    /// With `category`, the committer takes that category's lock and the
    /// commit goes under its fence; without, `commit` carries its own fence.
    /// `None` if the committer died without answering (a panic): the commit
    /// may or may not have applied.
    pub(super) async fn commit(
        self: &Arc<Self>,
        user: &UserId,
        category: Option<SizeCategory>,
        commit: CommitUpload,
    ) -> Option<Answer> {
        let key = GroupKey {
            user: *user,
            category,
        };
        let (answer, answered) = oneshot::channel();
        let start = {
            let mut waiting = self.waiting.lock().unwrap();
            let start = !waiting.contains_key(&key);
            waiting
                .entry(key.clone())
                .or_default()
                .push_back(Waiting { commit, answer });
            self.metrics.upload_commits_waiting.inc();
            start
        };
        if start {
            let groups = self.clone();
            tokio::spawn(async move { groups.run(key).await });
        }
        answered.await.ok()
    }

    /// Commits `key`'s groups until none is waiting.
    async fn run(self: Arc<Self>, key: GroupKey) {
        let mut done = Done {
            groups: &self,
            key: &key,
            finished: false,
        };
        loop {
            // The locks first, and only then the group: whatever arrives
            // while they are awaited joins it.
            let held = match self.lock_group(&key).await {
                Ok(held) => held,
                Err(e) => {
                    for w in self.take(&key) {
                        let _ = w.answer.send(Err(e.clone().into()));
                    }
                    if self.finished(&key) {
                        break;
                    }
                    continue;
                }
            };
            let mut group = self.take(&key);
            if let (Some(c), [category_lock, ..]) = (key.category, held.as_slice()) {
                // The holder of the category lock fences the commit.
                let fence = Fence::of_lock(category_lock.fence(), c.as_str());
                for w in &mut group {
                    w.commit.fence = fence.clone();
                }
            }
            let commits: Vec<CommitUpload> = group.iter().map(|w| w.commit.clone()).collect();
            let answers = self.commit_group(&key.user, &commits).await;
            for held in held.into_iter().rev() {
                held.release().await;
            }
            for (w, a) in group.into_iter().zip(answers) {
                // An upload whose client went away no longer listens.
                let _ = w.answer.send(a);
            }
            if self.finished(&key) {
                break;
            }
        }
        done.finished = true;
    }

    /// The locks one upload of `key` would take, in the same order: its
    /// category's (scope = commit), then the user's commit lock.
    async fn lock_group(&self, key: &GroupKey) -> Result<Vec<Held>, LockError> {
        let mut held = Vec::with_capacity(2);
        if let Some(c) = key.category {
            held.push(
                self.locks
                    .acquire(&LockKey::user_upload(&key.user, c))
                    .await?,
            );
        }
        match self.locks.acquire(&LockKey::user_commit(&key.user)).await {
            Ok(commit_lock) => held.push(commit_lock),
            Err(e) => {
                for h in held {
                    h.release().await;
                }
                return Err(e);
            }
        }
        Ok(held)
    }

    /// The commits waiting for `key`, oldest first, at most `max`; with
    /// lock scope = upload, only as far as their fences agree (one token
    /// per slot).
    fn take(&self, key: &GroupKey) -> Vec<Waiting> {
        let mut waiting = self.waiting.lock().unwrap();
        let Some(queue) = waiting.get_mut(key) else {
            return Vec::new();
        };
        let mut group: Vec<Waiting> = Vec::new();
        while group.len() < self.max
            && let Some(next) = queue.front()
        {
            let clash = next.commit.fence.as_ref().is_some_and(|f| {
                group.iter().any(|w| {
                    w.commit
                        .fence
                        .as_ref()
                        .is_some_and(|g| g.slot == f.slot && g.token != f.token)
                })
            });
            if clash {
                break;
            }
            group.extend(queue.pop_front());
        }
        self.metrics
            .upload_commits_waiting
            .dec_by(group.len() as i64);
        group
    }

    /// Whether `key` has nothing left waiting; if so its committer ends
    /// (the key goes, and the next commit starts a new one).
    fn finished(&self, key: &GroupKey) -> bool {
        let mut waiting = self.waiting.lock().unwrap();
        if waiting.get(key).is_some_and(VecDeque::is_empty) {
            waiting.remove(key);
            return true;
        }
        false
    }

    /// Runs `commits` (the user's commit lock held): alone as ever, several
    /// in one transaction, or, if the store refuses the group, one by one.
    /// Each transaction runs in `user`'s turn ([`UserTurns`]): none of
    /// their other writes to their record in this instance (a creation)
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
            // It may have applied (each upload settles its own), or the
            // store is not there and nothing was sent (each refuses its own).
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

/// Ends a committer that did not finish (it panicked): its key goes, so
/// that the next commit starts a new one; the commits still waiting are
/// dropped unanswered (their uploads settle them as unknown).
struct Done<'a> {
    groups: &'a CommitGroups,
    key: &'a GroupKey,
    finished: bool,
}

impl Drop for Done<'_> {
    fn drop(&mut self) {
        if !self.finished && std::thread::panicking() {
            self.groups.metrics.committer_panics.inc();
        }
        if !self.finished
            && let Ok(mut waiting) = self.groups.waiting.lock()
            && let Some(dropped) = waiting.remove(self.key)
        {
            let n = dropped.len() as i64;
            self.groups.metrics.upload_commits_waiting.dec_by(n);
        }
    }
}
