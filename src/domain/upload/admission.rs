//! The admission gate every upload passes, plain or resumable: a slot among
//! the user's uploads in flight on this instance, the user's storage quota
//! before and while the bytes stream, and the intent kept alive while they
//! do. The user record comes from the auth cache and may be
//! `auth_cache_ttl` old (after the user deleted files it overstates their
//! usage), so a refusal it suggests is confirmed against the store before
//! it is given. The commit transaction stays the authority on the quota:
//! these checks only refuse early.

use std::{sync::Arc, time::Duration};

use futures::{StreamExt, stream};

use super::slots::{UploadSlot, UploadSlots};
use crate::{
    blob::{BodyError, ByteStream},
    config::Settings,
    domain::DomainError,
    meta::{CleanupRepo, UserRecord, UserRepo, group::effective_quota},
    metrics::{Metrics, OutcomeLabel},
    vocab::{FileId, UserId},
};

/// How many times per sweeper grace period a streaming upload refreshes its
/// intent: a few missed refreshes (a store hiccup) do not get it swept.
const INTENT_REFRESHES_PER_GRACE: u32 = 4;

/// A user's storage against their quota, and their uploads in flight.
pub struct Usage {
    /// The user as the store has it now (not as the auth cache remembers it).
    pub user: UserRecord,
    /// `None`: no quota.
    pub quota_bytes: Option<u64>,
    /// Uploads of the user's that this instance is receiving.
    pub uploads_in_flight: usize,
}

/// The gate and the ports it reads.
pub struct Admission {
    /// The user's usage as the store has it, when the cached one would refuse.
    users: Arc<dyn UserRepo>,
    /// The intents kept alive.
    cleanup: Arc<dyn CleanupRepo>,
    metrics: Arc<Metrics>,
    slots: UploadSlots,
    max_uploads_per_user: usize,
    quota_bytes: Option<u64>,
    /// How often a live upload refreshes its intent (zero: never).
    refresh_every: Duration,
}

/// What `used` bytes (stored and reserved) leave of `quota`.
fn left(quota: u64, used: i64) -> u64 {
    quota.saturating_sub(used.max(0) as u64)
}

impl Admission {
    pub fn new(
        users: Arc<dyn UserRepo>,
        cleanup: Arc<dyn CleanupRepo>,
        metrics: Arc<Metrics>,
        settings: &Settings,
    ) -> Self {
        Self {
            users,
            cleanup,
            metrics,
            slots: UploadSlots::default(),
            max_uploads_per_user: settings.max_uploads_per_user,
            quota_bytes: settings.user_quota_bytes,
            refresh_every: settings.sweep.intent_grace / INTENT_REFRESHES_PER_GRACE,
        }
    }

    /// One of `user`'s in-flight upload slots, or `TooManyUploads` if this
    /// instance has `max_uploads_per_user` of theirs already. Taken before a
    /// byte of the body is read and held until the upload has its answer.
    pub fn reserve(&self, user: &UserRecord) -> Result<UploadSlot<'_>, DomainError> {
        let max = self.max_uploads_per_user;
        self.slots.take(&user.id, max).ok_or_else(|| {
            let refused = DomainError::TooManyUploads(max);
            self.count_outcome(refused.code());
            refused
        })
    }

    /// Counts an upload's outcome (`filedock_uploads_total`).
    pub(super) fn count_outcome(&self, outcome: &str) {
        self.metrics
            .uploads
            .get_or_create(&OutcomeLabel {
                outcome: outcome.into(),
            })
            .inc();
    }

    /// `user`'s usage: bytes and files stored, read from the store in one
    /// document (so they agree with each other), and uploads in flight here.
    pub async fn usage(&self, user: &UserRecord) -> Result<Usage, DomainError> {
        let stored = self
            .users
            .user(&user.id)
            .await?
            .ok_or(DomainError::Unauthenticated)?;
        Ok(Usage {
            quota_bytes: self.quota_of(&stored),
            user: stored,
            uploads_in_flight: self.slots.in_flight(&user.id),
        })
    }

    /// Refuses an upload whose declared length passes the user's quota.
    pub async fn check_declared_quota(
        &self,
        user: &UserRecord,
        declared_len: Option<u64>,
    ) -> Result<(), DomainError> {
        let (Some(quota), Some(len)) = (self.quota_of(user), declared_len) else {
            return Ok(());
        };
        if len <= left(quota, user.counted_bytes()) || len <= self.quota_left(user).await? {
            return Ok(());
        }
        Err(DomainError::QuotaExceeded)
    }

    /// The quota that holds for `user`: their own, else the setting's.
    pub fn quota_of(&self, user: &UserRecord) -> Option<u64> {
        effective_quota(user.quota_bytes, self.quota_bytes)
    }

    /// What the user's quota leaves them now beside their stored and
    /// reserved bytes, as the store has it (`None`: no quota). Whether
    /// they have one is taken from `user` (the auth cache's, as every early
    /// check does), so that no quota costs no read.
    pub async fn room(&self, user: &UserRecord) -> Result<Option<u64>, DomainError> {
        if self.quota_of(user).is_none() {
            return Ok(None);
        }
        let stored = self
            .users
            .user(&user.id)
            .await?
            .ok_or(DomainError::Unauthenticated)?;
        Ok(self
            .quota_of(&stored)
            .map(|q| left(q, stored.counted_bytes())))
    }

    /// What is left of `user`'s quota, as the store has it now (unlimited:
    /// `u64::MAX`).
    async fn quota_left(&self, user: &UserRecord) -> Result<u64, DomainError> {
        Ok(self.room(user).await?.unwrap_or(u64::MAX))
    }

    /// `body`, cut off with [`BodyError::QuotaExceeded`] as soon as it passes
    /// what is left of the user's quota, so that a body without a
    /// `Content-Length` is not read (and stored) to its end first. A cached
    /// usage lower than the store's (the user's own uploads committed since
    /// it was cached) lets the body run further; the commit refuses it then.
    pub fn within_quota<'a>(
        &'a self,
        user: &'a UserRecord,
        body: ByteStream<'a>,
    ) -> ByteStream<'a> {
        let Some(quota) = self.quota_of(user) else {
            return body;
        };
        let start = Passing {
            body: Some(body),
            size: 0,
            left: Some(left(quota, user.counted_bytes())),
        };
        stream::unfold(start, move |mut s| async move {
            let chunk = match s.body.as_mut()?.next().await? {
                Ok(chunk) => chunk,
                Err(e) => {
                    s.body = None;
                    return Some((Err(e), s));
                }
            };
            s.size += chunk.len() as u64;
            if let Some(left) = s.left
                && s.size > left
            {
                match self.quota_left(user).await {
                    Ok(fresh) if s.size <= fresh => s.left = Some(fresh),
                    Ok(_) => {
                        s.body = None;
                        return Some((Err(BodyError::QuotaExceeded), s));
                    }
                    // Unconfirmed, the refusal is not given: the commit decides.
                    Err(e) => {
                        tracing::warn!(error = %e, "could not read the user's usage; the commit will check the quota");
                        s.left = None;
                    }
                }
            }
            Some((Ok(chunk), s))
        })
        .boxed()
    }

    /// Whether `user` is being deleted or gone, as the store has it now (the
    /// record a request authenticated with may be older than the mark). A
    /// store that does not answer says no: the caller asks again later.
    pub async fn user_leaving(&self, user: &UserId) -> bool {
        match self.users.user(user).await {
            Ok(Some(u)) => u.deleting_since.is_some(),
            Ok(None) => true,
            Err(e) => {
                tracing::debug!(user_id = %user, error = %e, "could not tell whether a user is being deleted");
                false
            }
        }
    }

    /// Refreshes the upload's intent until the upload is done, so that the
    /// sweeper takes only dead uploads for abandoned ones, however long a
    /// live one streams or waits for its lock.
    pub async fn keep_alive(&self, user: &UserId, file_id: &FileId) -> std::convert::Infallible {
        if self.refresh_every.is_zero() {
            // No grace at all (tests, audits): every intent is stale at once.
            return std::future::pending().await;
        }
        loop {
            tokio::time::sleep(self.refresh_every).await;
            match self.cleanup.touch_intent(user, file_id, None).await {
                Ok(Some(_)) => {}
                // Swept after all (this process stalled): the commit will say so.
                Ok(None) => std::future::pending::<()>().await,
                Err(e) => {
                    tracing::warn!(%file_id, error = %e, "could not refresh the upload intent")
                }
            }
        }
    }
}

/// A body on its way past the quota check.
struct Passing<'a> {
    /// `None` once the body has failed or been cut off.
    body: Option<ByteStream<'a>>,
    size: u64,
    /// What the user may still store, as last read; `None` once unknown.
    left: Option<u64>,
}
