//! Creations of one user's resumable uploads, grouped as their commits are
//! (`upload::group`): a creation hands its state and intent to the user's
//! creator on this instance and waits for its own answer; the creator
//! takes every creation of that user waiting (at most [`MAX`], in arrival
//! order) and inserts them, counted against the user together, in one
//! transaction. A group the store refuses (the user's open uploads or
//! quota cannot take all of them) is inserted one creation at a time, so
//! that each is answered for itself and those that fit are stored. The
//! creator gathers a group in the user's turn ([`UserTurns`]), and each
//! transaction attempt of it runs in that turn.
//!
//! The creator is a task of its own: a creation whose client goes away
//! does not take the others with it.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use tokio::sync::oneshot;

use crate::{
    meta::{
        IntentRecord, MetaError, MetaResult, OpenLimits, ResumableRecord, ResumableRepo, UserTurns,
        retry::Transactions,
    },
    vocab::UserId,
};

/// The most creations one transaction inserts.
const MAX: usize = 32;

/// A creation: the upload's intent and its state.
pub(super) type Creation = (IntentRecord, ResumableRecord);

struct Waiting {
    creation: Creation,
    answer: oneshot::Sender<MetaResult<()>>,
}

/// The creators of this instance, one per user while it has work.
pub(super) struct Creations {
    resumables: Arc<dyn ResumableRepo>,
    txns: Transactions,
    limits: OpenLimits,
    turns: Arc<UserTurns>,
    /// Creations waiting, per user; a user is here while its creator runs.
    waiting: Mutex<HashMap<UserId, Vec<Waiting>>>,
}

impl Creations {
    pub(super) fn new(
        resumables: Arc<dyn ResumableRepo>,
        txns: Transactions,
        limits: OpenLimits,
        turns: Arc<UserTurns>,
    ) -> Arc<Self> {
        Arc::new(Self {
            resumables,
            txns,
            limits,
            turns,
            waiting: Mutex::default(),
        })
    }

    /// Inserts `creation` and counts it against its user, with whatever
    /// else of theirs is waiting ([`ResumableRepo::insert_resumables`]).
    /// A creator that died without answering (a panic) answers
    /// `OutcomeUnknown`: the caller settles it.
    pub(super) async fn insert(self: &Arc<Self>, creation: Creation) -> MetaResult<()> {
        let user = creation.1.user_id;
        let (answer, answered) = oneshot::channel();
        let waiter = Waiting { creation, answer };
        // A user is in the map while their creator runs (its queue may be
        // empty while it writes): only the first creation starts one.
        let first = {
            let mut waiting = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
            match waiting.get_mut(&user) {
                Some(queue) => {
                    queue.push(waiter);
                    false
                }
                None => {
                    waiting.insert(user, vec![waiter]);
                    true
                }
            }
        };
        if first {
            tokio::spawn(self.clone().run(user));
        }
        answered.await.unwrap_or_else(|_| {
            Err(MetaError::OutcomeUnknown(
                "the upload's creator stopped before it answered".into(),
            ))
        })
    }

    /// The creator of `user`'s uploads: runs until none is waiting.
    async fn run(self: Arc<Self>, user: UserId) {
        // Whatever ends this task, its user's queue goes with it (the
        // creations in it are answered `OutcomeUnknown` by their dropped
        // senders), so that the next creation starts a creator again.
        let mut running = Running {
            creations: &self,
            user,
            done: false,
        };
        loop {
            // The user's turn first, then what waits by then (what came
            // while the user's other writes ran joins this group).
            let turn = self.turns.hold(&user).await;
            let group: Vec<Waiting> = {
                let mut waiting = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
                let Some(queue) = waiting.get_mut(&user) else {
                    break;
                };
                // A creation whose client went away is not stored (its
                // blob store's write is left to the sweeper and S3's
                // lifecycle rule, as when it died before its turn).
                queue.retain(|w| !w.answer.is_closed());
                if queue.is_empty() {
                    waiting.remove(&user);
                    break;
                }
                let n = queue.len().min(MAX);
                queue.drain(..n).collect()
            };
            drop(turn);
            self.insert_group(group).await;
        }
        running.done = true;
    }

    /// Inserts `group` in one transaction, or one creation at a time if
    /// the store refuses it together, and answers each.
    async fn insert_group(&self, group: Vec<Waiting>) {
        let creations: Vec<Creation> = group.iter().map(|w| w.creation.clone()).collect();
        let together = self.insert_all(&creations).await;
        match together {
            // Not all of them fit: each alone, so that those that fit are
            // stored and the others told why.
            Err(MetaError::TooManyOpenUploads | MetaError::QuotaExceeded) if group.len() > 1 => {
                for w in group {
                    let alone = self.insert_all(std::slice::from_ref(&w.creation)).await;
                    let _ = w.answer.send(alone);
                }
            }
            answer => {
                for w in group {
                    let _ = w.answer.send(answer.clone());
                }
            }
        }
    }

    /// One transaction, retried on write conflicts (racing writes of other
    /// instances to the user's record), each attempt in the user's turn.
    async fn insert_all(&self, creations: &[Creation]) -> MetaResult<()> {
        let Some((_, first)) = creations.first() else {
            return Ok(());
        };
        let inserted = self
            .turns
            .run(&self.txns, "create_upload", &first.user_id, || {
                self.resumables.insert_resumables(creations, &self.limits)
            });
        inserted.await.map(|r| r.value)
    }
}

/// A creator's hold on its user's queue: dropped before the creator
/// finished (a panic), it drops the queue.
struct Running<'a> {
    creations: &'a Creations,
    user: UserId,
    done: bool,
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        if !self.done {
            let mut waiting = self
                .creations
                .waiting
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            waiting.remove(&self.user);
        }
    }
}
