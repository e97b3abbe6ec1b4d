//! Intents written together: uploads that start while an intent write is
//! on its way to the store have theirs written next, all in one
//! `insert_many`, instead of one round trip each. Every upload still waits
//! until its own intent is stored before its first byte goes to the blob
//! store. On with group commit (`upload_group_commit`).

use std::{
    collections::VecDeque,
    sync::{Arc, Mutex},
};

use tokio::sync::oneshot;

use crate::meta::{CleanupRepo, IntentRecord, MetaError, MetaResult};

struct Waiting {
    intent: IntentRecord,
    answer: oneshot::Sender<MetaResult<()>>,
}

/// The intent writer of this instance.
pub struct IntentBatches {
    cleanup: Arc<dyn CleanupRepo>,
    max: usize,
    /// Intents waiting; `Some` while a writer task runs.
    waiting: Mutex<Option<VecDeque<Waiting>>>,
}

impl IntentBatches {
    pub fn new(cleanup: Arc<dyn CleanupRepo>, max: usize) -> Arc<Self> {
        Arc::new(Self {
            cleanup,
            max: max.max(1),
            waiting: Mutex::default(),
        })
    }

    /// Stores `intent`, with whatever other intents wait at the time.
    pub(super) async fn put(self: &Arc<Self>, intent: IntentRecord) -> MetaResult<()> {
        let (answer, answered) = oneshot::channel();
        let start = {
            let mut waiting = self.waiting.lock().unwrap();
            let start = waiting.is_none();
            waiting
                .get_or_insert_default()
                .push_back(Waiting { intent, answer });
            start
        };
        if start {
            let batches = self.clone();
            tokio::spawn(async move { batches.run().await });
        }
        answered.await.unwrap_or_else(|_| {
            // The writer died (a panic) with it: it may have been written;
            // the sweeper takes an intent without an upload for abandoned.
            Err(MetaError::Other("the intent writer died".into()))
        })
    }

    /// Writes batches until none waits.
    async fn run(self: Arc<Self>) {
        let mut done = Done {
            batches: &self,
            finished: false,
        };
        loop {
            let batch: Vec<Waiting> = {
                let mut waiting = self.waiting.lock().unwrap();
                let queue = waiting.get_or_insert_default();
                if queue.is_empty() {
                    *waiting = None;
                    break;
                }
                let n = queue.len().min(self.max);
                queue.drain(..n).collect()
            };
            let result = match batch.as_slice() {
                [one] => self.cleanup.put_intent(&one.intent).await,
                _ => {
                    let intents: Vec<IntentRecord> =
                        batch.iter().map(|w| w.intent.clone()).collect();
                    self.cleanup.put_intents(&intents).await
                }
            };
            for w in batch {
                let _ = w.answer.send(result.clone());
            }
        }
        done.finished = true;
    }
}

/// Lets the next intent start a new writer if this one did not finish (a
/// panic); the intents still waiting are dropped unanswered.
struct Done<'a> {
    batches: &'a IntentBatches,
    finished: bool,
}

impl Drop for Done<'_> {
    fn drop(&mut self) {
        if !self.finished
            && let Ok(mut waiting) = self.batches.waiting.lock()
        {
            *waiting = None;
        }
    }
}
