//! What the per-user category lock covers (`FILEDOCK_LOCK_SCOPE`), as an
//! object chosen once at start-up, and [`Hold`], the lock an upload's bytes
//! stream under when its scope takes one.

use async_trait::async_trait;

use crate::{
    config::LockScope as Scope,
    lock::{Held, LockError, LockGuard, Locks},
    meta::Fence,
    vocab::{LockKey, SizeCategory, UserId},
};

/// Where the category lock is taken.
#[async_trait]
pub(super) trait LockScope: Send + Sync {
    /// Before the first byte: the lock the bytes stream under, if this
    /// scope takes one there.
    async fn before_bytes(
        &self,
        locks: &Locks,
        user: &UserId,
        category: SizeCategory,
    ) -> Result<Option<Held>, LockError>;
}

/// `commit` (the default): the lock covers the metadata transaction alone;
/// bytes stream in parallel.
struct AtCommit;

#[async_trait]
impl LockScope for AtCommit {
    async fn before_bytes(
        &self,
        _: &Locks,
        _: &UserId,
        _: SizeCategory,
    ) -> Result<Option<Held>, LockError> {
        Ok(None)
    }
}

/// `upload` (the original design's): the lock covers the whole upload.
struct WholeUpload;

#[async_trait]
impl LockScope for WholeUpload {
    async fn before_bytes(
        &self,
        locks: &Locks,
        user: &UserId,
        category: SizeCategory,
    ) -> Result<Option<Held>, LockError> {
        locks
            .acquire(&LockKey::user_upload(user, category))
            .await
            .map(Some)
    }
}

/// The scope `setting` names.
pub(super) fn scope(setting: Scope) -> Box<dyn LockScope> {
    match setting {
        Scope::Commit => Box::new(AtCommit),
        Scope::Upload => Box::new(WholeUpload),
    }
}

/// The category lock an upload holds while its bytes stream, if it holds
/// one; without, its commit takes the lock.
#[must_use = "a held lock must be released"]
pub struct Hold {
    held: Option<Held>,
    category: SizeCategory,
}

impl Hold {
    /// No lock held: the commit takes `category`'s (a resumable upload's,
    /// and every upload's with lock scope `commit`).
    pub fn none(category: SizeCategory) -> Self {
        Self {
            held: None,
            category,
        }
    }

    pub(super) fn held(held: Option<Held>, category: SizeCategory) -> Self {
        Self { held, category }
    }

    /// The lease the bytes stream under, to stop them when it is lost.
    pub fn lease(&self) -> Option<&LockGuard> {
        self.held.as_ref().and_then(Held::guard)
    }

    /// The fence of the lock held (none without one, or with the lock
    /// backend down in development).
    pub(super) fn fence(&self) -> Option<Fence> {
        let token = self.held.as_ref().and_then(Held::fence);
        Fence::of_lock(token, self.category.as_str())
    }

    /// The category lock the commit still has to take.
    pub(super) fn to_take(&self) -> Option<SizeCategory> {
        self.held.is_none().then_some(self.category)
    }

    pub async fn release(self) {
        if let Some(held) = self.held {
            held.release().await;
        }
    }
}
