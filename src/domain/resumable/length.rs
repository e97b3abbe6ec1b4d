//! A deferred length (tus's creation-defer-length extension): an upload
//! created with `Upload-Defer-Length: 1` learns its `Upload-Length` from a
//! later PATCH, once. Until then each PATCH reserves the bytes it stored
//! against the quota before the state records them (so that undeclared
//! uploads together hold no more than the quota), and its body is held to
//! what the quota and the size limit leave; the declaration reserves the
//! rest of the length, in the transaction that sets it. Its size category
//! (the commit's lock) is decided from the length at its commit, as every
//! upload's is.

use super::{Result, ResumableError, ResumableService};
use crate::{
    domain::DomainError,
    meta::{Reserve, ResumableRecord, UserRecord},
};

/// How far a PATCH's body may go, and what it is that stops it.
pub(super) struct BodyLimit {
    pub bytes: u64,
    /// What a body past `bytes` is refused as.
    pub past: DomainError,
}

impl ResumableService {
    /// Declares `upload`'s length as `length` (a PATCH's `Upload-Length`):
    /// the same length again is no change; another one, one below the
    /// bytes stored or above the size limit, is refused; a length the
    /// quota cannot reserve is refused (507) and changes nothing.
    pub(super) async fn declare(
        &self,
        upload: ResumableRecord,
        length: u64,
    ) -> Result<ResumableRecord> {
        let same = |known: u64| match known == length {
            true => Ok(()),
            false => Err(DomainError::InvalidRequest(format!(
                "the upload's Upload-Length is {known}; it cannot change"
            ))),
        };
        if let Some(known) = upload.known_length() {
            same(known)?;
            return Ok(upload);
        }
        let max = self.limits.max_upload_bytes;
        if length > max {
            return Err(DomainError::PayloadTooLarge(max).into());
        }
        if length < upload.offset as u64 {
            return Err(DomainError::InvalidRequest(format!(
                "Upload-Length {length} is less than the {} bytes stored",
                upload.offset
            ))
            .into());
        }
        let declared = self
            .reserve(&upload, Reserve::Length(length as i64))
            .await?;
        match declared.known_length() {
            // Another request may have declared it first: the same length
            // or a refusal.
            Some(known) => same(known)?,
            // A PATCH without the lock moved the offset past it meanwhile.
            None => return Err(ResumableError::OffsetMismatch(declared.offset as u64)),
        }
        Ok(ResumableRecord {
            length: declared.length,
            reserved: declared.reserved,
            ..upload
        })
    }

    /// While `upload`'s length is deferred, reserves the bytes stored up to
    /// its offset (a PATCH's, before the state records them): refused
    /// (507) past the quota, and nothing changes.
    pub(super) async fn reserve_stored(&self, upload: ResumableRecord) -> Result<ResumableRecord> {
        if upload.length.is_some() {
            return Ok(upload);
        }
        let now = self
            .reserve(&upload, Reserve::Stored(upload.offset))
            .await?;
        Ok(ResumableRecord {
            reserved: now.reserved,
            ..upload
        })
    }

    /// [`crate::meta::ResumableRepo::reserve_deferred`] under the user's
    /// turn, retried on write conflicts: the record as it is then.
    async fn reserve(&self, upload: &ResumableRecord, what: Reserve) -> Result<ResumableRecord> {
        let quota = self.limits.open.quota_bytes;
        let txns = self.committer.txns();
        let reserved = self
            .turns
            .run(txns, "declare_length", &upload.user_id, || {
                (self.resumables).reserve_deferred(&upload.user_id, &upload.id, what, quota)
            })
            .await;
        Ok(reserved?.value.ok_or(DomainError::NotFound)?)
    }

    /// How far `upload`'s next body may go: to its length, or, while the
    /// length is deferred, to the size limit and to what the user's quota
    /// leaves (its own reservation, the bytes it has stored, counted back).
    pub(super) async fn body_limit(
        &self,
        user: &UserRecord,
        upload: &ResumableRecord,
    ) -> Result<BodyLimit> {
        let offset = upload.offset as u64;
        if let Some(length) = upload.known_length() {
            return Ok(BodyLimit {
                bytes: length.saturating_sub(offset),
                past: DomainError::InvalidRequest("the body goes past Upload-Length".into()),
            });
        }
        let max = self.limits.max_upload_bytes;
        let by_size = BodyLimit {
            bytes: max.saturating_sub(offset),
            past: DomainError::PayloadTooLarge(max),
        };
        let Some(room) = self.admission.room(user).await? else {
            return Ok(by_size);
        };
        let by_quota = (room + upload.reserved.max(0) as u64).saturating_sub(offset);
        Ok(match by_quota < by_size.bytes {
            true => BodyLimit {
                bytes: by_quota,
                past: DomainError::QuotaExceeded,
            },
            false => by_size,
        })
    }
}
