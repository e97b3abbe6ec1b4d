//! The user's storage quota before and while an upload streams. The user
//! record comes from the auth cache and may be `auth_cache_ttl` old (after
//! the user deleted files it overstates their usage), so a refusal it
//! suggests is confirmed against the store before it is given. The commit
//! transaction stays the authority: these checks only refuse early.

use futures::{StreamExt, stream};

use super::UploadService;
use crate::{
    blob::{BodyError, ByteStream},
    domain::DomainError,
    meta::UserRecord,
};

/// A user's storage against their quota, and their uploads in flight.
pub struct Usage {
    /// The user as the store has it now (not as the auth cache remembers it).
    pub user: UserRecord,
    /// `None`: no quota.
    pub quota_bytes: Option<u64>,
    /// Uploads of the user's that this instance is receiving.
    pub uploads_in_flight: usize,
}

/// What `used` bytes leave of `quota`.
fn left(quota: u64, used: i64) -> u64 {
    quota.saturating_sub(used.max(0) as u64)
}

impl UploadService {
    /// `user`'s usage: bytes and files stored, read from the store in one
    /// document (so they agree with each other), and uploads in flight here.
    pub async fn usage(&self, user: &UserRecord) -> Result<Usage, DomainError> {
        let stored = self
            .users
            .user(&user.id)
            .await?
            .ok_or(DomainError::Unauthenticated)?;
        Ok(Usage {
            user: stored,
            quota_bytes: self.settings.user_quota_bytes,
            uploads_in_flight: self.upload_slots.in_flight(&user.id),
        })
    }

    /// Refuses an upload whose declared length passes the user's quota.
    pub(crate) async fn check_declared_quota(
        &self,
        user: &UserRecord,
        declared_len: Option<u64>,
    ) -> Result<(), DomainError> {
        let (Some(quota), Some(len)) = (self.settings.user_quota_bytes, declared_len) else {
            return Ok(());
        };
        if len <= left(quota, user.used_bytes) || len <= self.quota_left(user, quota).await? {
            return Ok(());
        }
        Err(DomainError::QuotaExceeded)
    }

    /// What is left of `quota` for `user`, as the store has it now.
    async fn quota_left(&self, user: &UserRecord, quota: u64) -> Result<u64, DomainError> {
        let stored = self
            .users
            .user(&user.id)
            .await?
            .ok_or(DomainError::Unauthenticated)?;
        Ok(left(quota, stored.used_bytes))
    }

    /// `body`, cut off with [`BodyError::QuotaExceeded`] as soon as it passes
    /// what is left of the user's quota, so that a body without a
    /// `Content-Length` is not read (and stored) to its end first. A cached
    /// usage lower than the store's (the user's own uploads committed since
    /// it was cached) lets the body run further; the commit refuses it then.
    pub(super) fn within_quota<'a>(
        &'a self,
        user: &'a UserRecord,
        body: ByteStream<'a>,
    ) -> ByteStream<'a> {
        let Some(quota) = self.settings.user_quota_bytes else {
            return body;
        };
        let start = Passing {
            body: Some(body),
            size: 0,
            left: Some(left(quota, user.used_bytes)),
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
                match self.quota_left(user, quota).await {
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
}

/// A body on its way past the quota check.
struct Passing<'a> {
    /// `None` once the body has failed or been cut off.
    body: Option<ByteStream<'a>>,
    size: u64,
    /// What the user may still store, as last read; `None` once unknown.
    left: Option<u64>,
}
