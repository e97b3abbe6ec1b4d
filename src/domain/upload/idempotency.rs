//! Idempotency keys (IETF Idempotency-Key draft): a key stands for one
//! request, fingerprinted by its body's SHA-256, filename and content type.
//! A repeat of that request replays its answer; another request with the
//! key is refused, and so is one sent while the first is still in flight.

use std::{sync::Arc, time::Duration};

use futures::StreamExt;
use sha2::{Digest, Sha256};

use super::slots::{InFlightKeys, KeyClaim};
use crate::{
    blob::{ByteStream, bounded},
    domain::DomainError,
    meta::{FileRepo, IdempotencyRecord, UserRecord},
    vocab::{Filename, IdempotencyKey},
};

/// The keys used before (in the store) and in flight (on this instance).
pub struct Idempotency {
    files: Arc<dyn FileRepo>,
    in_flight: InFlightKeys,
}

impl Idempotency {
    pub fn new(files: Arc<dyn FileRepo>) -> Self {
        Self {
            files,
            in_flight: InFlightKeys::default(),
        }
    }

    /// The record of `user`'s `key` if it was used before, else the key for
    /// this request alone on this instance (`IdempotencyKeyInFlight` while
    /// another request holds it). Across instances the commit transaction
    /// lets one request through; the others replay it or get a mismatch.
    pub async fn claim(
        &self,
        user: &UserRecord,
        key: &IdempotencyKey,
    ) -> Result<Result<KeyClaim<'_>, IdempotencyRecord>, DomainError> {
        if let Some(first) = self.files.idempotency_record(&user.id, key).await? {
            return Ok(Err(first));
        }
        let claim = self
            .in_flight
            .claim(&user.id, key)
            .ok_or(DomainError::IdempotencyKeyInFlight)?;
        // The holder before us may have committed since the first look.
        match self.files.idempotency_record(&user.id, key).await? {
            Some(first) => Ok(Err(first)),
            None => Ok(Ok(claim)),
        }
    }
}

/// Answers a request whose idempotency key was used before: `true` if this
/// is the same request (its body, filename and content type match the
/// fingerprint), else `IdempotencyKeyMismatch`. The body is read (at most
/// `max` bytes, `idle` apart) and hashed, never stored.
pub async fn same_request(
    first: &IdempotencyRecord,
    filename: &Filename,
    content_type: &str,
    body: ByteStream<'_>,
    idle: Duration,
    max: u64,
) -> Result<(), DomainError> {
    if first.fingerprint.is_empty() {
        // Recorded before fingerprints were kept: such a key replays whatever is sent.
        return Ok(());
    }
    let mut body = bounded(body, idle, max);
    let mut hasher = Sha256::new();
    while let Some(chunk) = body.next().await {
        hasher.update(&chunk?);
    }
    let sha256 = hex::encode(hasher.finalize());
    match fingerprint(&sha256, filename.as_str(), content_type) == first.fingerprint {
        true => Ok(()),
        false => Err(DomainError::IdempotencyKeyMismatch),
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
