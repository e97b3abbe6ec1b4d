//! Idempotency keys (IETF Idempotency-Key draft): a key stands for one
//! request, fingerprinted by its body's SHA-256, filename and content type.
//! A repeat of that request replays its answer; another request with the
//! key is refused, and so is one sent while the first is still in flight.

use sha2::{Digest, Sha256};

use super::{NewUpload, UploadService, Uploaded, bounded, slots::KeyClaim};
use crate::{
    domain::DomainError,
    meta::{IdempotencyRecord, UserRecord},
};
use futures::StreamExt;

impl UploadService {
    /// The record of `user`'s `key` if it was used before, else the key for
    /// this request alone on this instance (`IdempotencyKeyInFlight` while
    /// another request holds it). Across instances the commit transaction
    /// lets one request through; the others replay it or get a mismatch.
    pub(super) async fn claim_key(
        &self,
        user: &UserRecord,
        key: &str,
    ) -> Result<Result<KeyClaim<'_>, IdempotencyRecord>, DomainError> {
        if let Some(first) = self.files.idempotency_record(&user.id, key).await? {
            return Ok(Err(first));
        }
        let claim = self
            .idempotency_keys
            .claim(&user.id, key)
            .ok_or(DomainError::IdempotencyKeyInFlight)?;
        // The holder before us may have committed since the first look.
        match self.files.idempotency_record(&user.id, key).await? {
            Some(first) => Ok(Err(first)),
            None => Ok(Ok(claim)),
        }
    }

    /// Answers a request whose idempotency key was used before: with the
    /// first request's file if this is the same request (its body, filename
    /// and content type match the fingerprint), else `IdempotencyKeyMismatch`.
    /// The body is read and hashed, never stored.
    pub(super) async fn replay(
        &self,
        first: IdempotencyRecord,
        new: NewUpload<'_>,
    ) -> Result<Uploaded, DomainError> {
        if !first.fingerprint.is_empty() {
            let max = self.settings.max_upload_bytes;
            let mut body = std::pin::pin!(bounded(new.body, self.settings.body_idle_timeout, max));
            let mut hasher = Sha256::new();
            while let Some(chunk) = body.next().await {
                hasher.update(&chunk?);
            }
            let sha256 = hex::encode(hasher.finalize());
            if fingerprint(&sha256, new.filename.as_str(), &new.content_type) != first.fingerprint {
                return Err(DomainError::IdempotencyKeyMismatch);
            }
        }
        Ok(Uploaded {
            file: first.file,
            replayed: true,
        })
    }
}

/// The fingerprint of an upload request (IETF Idempotency-Key draft): the
/// SHA-256 of its body's SHA-256, its filename and its content type.
pub(super) fn fingerprint(body_sha256: &str, filename: &str, content_type: &str) -> String {
    let mut h = Sha256::new();
    for part in [body_sha256, filename, content_type] {
        h.update(part.as_bytes());
        h.update([0]);
    }
    hex::encode(h.finalize())
}
