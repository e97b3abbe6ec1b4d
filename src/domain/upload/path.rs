//! How an upload's commit reaches the store (`FILEDOCK_UPLOAD_GROUP_COMMIT`),
//! as an object chosen once at start-up: one transaction per upload, or
//! group commit (the uploads of one user that are ready together, in one
//! transaction; their intents written together too).

use std::sync::Arc;

use async_trait::async_trait;

use super::{
    group::{Answer, CommitGroups},
    intents::IntentBatches,
};
use crate::{
    domain::commit::user_commit,
    lock::Locks,
    meta::retry::Transactions,
    meta::{
        CleanupRepo, CommitUpload, Fence, FileRepo, IntentRecord, MetaError, MetaResult, UserTurns,
    },
    metrics::Metrics,
    vocab::{LockKey, SizeCategory, UserId},
};

#[async_trait]
pub(super) trait CommitPath: Send + Sync {
    /// Stores an upload's intent, before its first byte.
    async fn put_intent(&self, intent: &IntentRecord) -> MetaResult<()>;

    /// Commits `commit` of `user` under the user's commit lock, having
    /// taken `category`'s lock first when given (the commit then goes under
    /// its fence; without, it carries its own). Nothing is undone here.
    async fn commit(
        &self,
        user: &UserId,
        category: Option<SizeCategory>,
        commit: CommitUpload,
    ) -> Answer;
}

/// Each upload in a transaction of its own.
pub(super) struct OneByOne {
    pub(super) files: Arc<dyn FileRepo>,
    pub(super) cleanup: Arc<dyn CleanupRepo>,
    pub(super) locks: Arc<Locks>,
    pub(super) txns: Transactions,
    pub(super) metrics: Arc<Metrics>,
    pub(super) turns: Arc<UserTurns>,
}

#[async_trait]
impl CommitPath for OneByOne {
    async fn put_intent(&self, intent: &IntentRecord) -> MetaResult<()> {
        self.cleanup.put_intent(intent).await
    }

    async fn commit(
        &self,
        user: &UserId,
        category: Option<SizeCategory>,
        mut commit: CommitUpload,
    ) -> Answer {
        let held = match category {
            Some(c) => {
                let held = self.locks.acquire(&LockKey::user_upload(user, c)).await?;
                // The holder of the category lock fences the commit.
                commit.fence = Fence::of_lock(held.fence(), c.as_str());
                Some(held)
            }
            None => None,
        };
        let committed = user_commit(
            &self.locks,
            &self.turns,
            &self.txns,
            user,
            "commit_upload",
            || async {
                self.metrics.upload_commit_txns.inc();
                self.files.commit_upload(&commit).await
            },
        )
        .await
        .map(|r| r.value);
        if let Some(held) = held {
            held.release().await;
        }
        committed
    }
}

/// Group commit: this instance's committers, one per user (and category)
/// while it has work, and the intent writer.
pub(super) struct Grouped {
    pub(super) groups: Arc<CommitGroups>,
    pub(super) intents: Arc<IntentBatches>,
}

#[async_trait]
impl CommitPath for Grouped {
    async fn put_intent(&self, intent: &IntentRecord) -> MetaResult<()> {
        self.intents.put(intent.clone()).await
    }

    async fn commit(
        &self,
        user: &UserId,
        category: Option<SizeCategory>,
        commit: CommitUpload,
    ) -> Answer {
        match self.groups.commit(user, category, commit).await {
            Some(answer) => answer,
            None => Err(MetaError::OutcomeUnknown("the group committer died".into()).into()),
        }
    }
}
