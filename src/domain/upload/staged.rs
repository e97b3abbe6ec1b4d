//! [`Staged`]: a blob at its intent's key that is not committed, and what
//! becomes of it if the upload stops before its answer (its future dropped:
//! the client went away, the server is stopping), as pict-rs's `Session`
//! and garage's `InterruptedCleanup` guard theirs.

use std::sync::Arc;

use super::settle::Undo;
use crate::{meta::IntentRecord, vocab::FileId};

/// What a dropped [`Staged`] does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnDrop {
    /// Deletes the blob and the intent (a plain upload's: nobody else
    /// knows of it).
    Delete,
    /// Leaves them: the caller keeps the blob (a resumable upload's, which
    /// its stored state names and its next PATCH finishes).
    Keep,
    /// Leaves them: a commit was sent and its outcome is not known, so
    /// deleting could lose an acknowledged file. The sweeper settles it
    /// (abandoning the intent is a transaction the commit would have won).
    OutcomeUnknown,
    /// Nothing is left to do: committed, undone or settled.
    Done,
}

/// A blob stored (or being stored) at its intent's key, not committed yet.
pub struct Staged {
    intent: IntentRecord,
    on_drop: OnDrop,
    /// What `on_drop` was before a commit was sent (a refusal restores it).
    before_commit: OnDrop,
    undo: Arc<Undo>,
}

impl Staged {
    pub(super) fn new(intent: IntentRecord, on_drop: OnDrop, undo: Arc<Undo>) -> Self {
        Self {
            intent,
            on_drop,
            before_commit: on_drop,
            undo,
        }
    }

    pub fn intent(&self) -> &IntentRecord {
        &self.intent
    }

    /// The id the file commits under.
    pub fn file_id(&self) -> FileId {
        self.intent.id
    }

    /// What a drop would do now.
    pub fn on_drop(&self) -> OnDrop {
        self.on_drop
    }

    /// Undoes the upload now (a refused commit, a failed upload): the blob
    /// goes (or is recorded as an orphan), then the intent.
    pub async fn undo(mut self) {
        self.on_drop = OnDrop::Done;
        self.undo.undo(&self.intent).await;
    }

    /// Forgets the intent of an upload that stored no byte.
    pub async fn forget(mut self) {
        self.on_drop = OnDrop::Done;
        self.undo.forget(&self.intent).await;
    }

    /// A commit is being sent: from here a drop leaves everything.
    pub(super) fn sending(&mut self) {
        if self.on_drop != OnDrop::OutcomeUnknown {
            self.before_commit = self.on_drop;
        }
        self.on_drop = OnDrop::OutcomeUnknown;
    }

    /// The commit applied.
    pub(super) fn committed(&mut self) {
        self.on_drop = OnDrop::Done;
    }

    /// The commit was refused: nothing of it applied, the blob is the
    /// caller's again.
    pub(super) fn refused(&mut self) {
        self.on_drop = self.before_commit;
    }

    /// Settled or handed over: nothing is left to do.
    pub(super) fn disarm(mut self) -> IntentRecord {
        self.on_drop = OnDrop::Done;
        self.intent.clone()
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if self.on_drop != OnDrop::Delete {
            return;
        }
        let (undo, intent) = (self.undo.clone(), self.intent.clone());
        // Without a runtime (the process is exiting) the intent stays: the
        // sweeper deletes the blob after its grace period.
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            tracing::info!(file_id = %intent.id, "upload stopped before its answer; undoing it");
            handle.spawn(async move { undo.undo(&intent).await });
        }
    }
}
