//! A deferred length (tus's creation-defer-length extension): an upload
//! created with `Upload-Defer-Length: 1` learns its `Upload-Length` from a
//! later PATCH, once. Its quota reservation is made then, in the
//! transaction that sets the length; until then its PATCHes are held to
//! what the quota and the size limit leave, and its size category (the
//! commit's lock) is decided from the length at its commit, as every
//! upload's is.

use super::{Result, ResumableService};
use crate::{
    domain::DomainError,
    meta::{ResumableRecord, UserRecord, retry::with_txn_retry},
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
        let quota = self.limits.open.quota_bytes;
        let counting = self.counting.hold(&upload.user_id).await;
        let declared = with_txn_retry(&self.limits.txn_retry, || {
            self.resumables
                .declare_length(&upload.id, length as i64, quota)
        })
        .await;
        drop(counting);
        let declared = declared?.value.ok_or(DomainError::NotFound)?;
        // Another request declared it first: the same length or a refusal.
        same(declared.known_length().unwrap_or(length))?;
        Ok(ResumableRecord {
            length: declared.length,
            reserved: declared.reserved,
            ..upload
        })
    }

    /// How far `upload`'s next body may go: to its length, or, while the
    /// length is deferred, to the size limit and to what the user's quota
    /// leaves beside the bytes it has stored (they are not reserved yet).
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
        let by_quota = room.saturating_sub(offset);
        Ok(match by_quota < by_size.bytes {
            true => BodyLimit {
                bytes: by_quota,
                past: DomainError::QuotaExceeded,
            },
            false => by_size,
        })
    }
}
