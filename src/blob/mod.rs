//! The `BlobStore` port: streamed writes and ranged, streamed reads; the
//! one part writer (`parts.rs`) that cuts bodies into parts for the stores
//! that take them so, under the one budget for upload memory (`budget.rs`), and the limits every upload body is read under
//! ([`bounded`]).

pub mod budget;
pub mod fs;
pub mod parts;
pub mod resumable;
pub mod s3;

use std::{io, time::Duration};

use async_trait::async_trait;
use bytes::Bytes;
use chrono::{DateTime, Utc};
use futures::{StreamExt, stream::BoxStream};

use crate::vocab::BlobKey;

/// A stream of body chunks.
pub type ByteStream<'a> = BoxStream<'a, Result<Bytes, BodyError>>;

/// Why a body stream ended early. A typed error, so that whoever reads the
/// stream can tell the client's fault from the store's without guessing.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    /// The client sent nothing for this long.
    #[error("the client sent nothing for {0:?}")]
    Idle(Duration),
    /// The body grew past this many bytes.
    #[error("the body is larger than {0} bytes")]
    TooLarge(u64),
    /// The body grew past what is left of the user's storage quota.
    #[error("the body passes the user's storage quota")]
    QuotaExceeded,
    /// The body is malformed (e.g. a bad multipart structure).
    #[error("{0}")]
    Invalid(String),
    /// Reading failed: the client went away, or a read from the store failed.
    #[error("{0}")]
    Read(#[from] io::Error),
    /// Reading stopped: the upload memory budget stayed spent this long.
    #[error("upload memory stayed in use by other uploads for {0:?}")]
    MemoryBusy(Duration),
    /// Reading stopped: another request asked this one to let go of its
    /// upload while it waited for upload memory.
    #[error("another request asked for this upload while it waited for memory")]
    LetGo,
}

impl From<budget::Refused> for BodyError {
    fn from(r: budget::Refused) -> Self {
        match r {
            budget::Refused::Busy(waited) => Self::MemoryBusy(waited),
            budget::Refused::LetGo => Self::LetGo,
        }
    }
}

/// An inclusive byte range `start..=end`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ByteRange {
    pub start: u64,
    pub end: u64,
}

impl ByteRange {
    pub fn len(&self) -> u64 {
        self.end - self.start + 1
    }

    pub fn is_empty(&self) -> bool {
        false
    }
}

/// An object as a listing shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListedBlob {
    pub key: String,
    /// When the object was last written (it appears whole at that moment).
    pub modified: DateTime<Utc>,
}

#[derive(Debug, thiserror::Error)]
pub enum BlobError {
    #[error("blob not found")]
    NotFound,
    /// The body stream itself failed (client went away, limit hit): not the store's fault.
    #[error("body: {0}")]
    Body(BodyError),
    #[error("blob store unavailable: {0}")]
    Unavailable(String),
    #[error("blob store error: {0}")]
    Other(String),
    /// Other bytes are stored where this write goes (a small upload's one
    /// object, written by another request): nothing of it was stored.
    #[error("{0}")]
    Conflict(String),
}

#[async_trait]
pub trait BlobStore: Send + Sync {
    /// The bucket name recorded with files and orphans.
    fn bucket(&self) -> &str;

    /// Streams `body` to `key`; the object appears whole or not at all.
    /// Returns the number of bytes written.
    async fn put(&self, key: &BlobKey, body: ByteStream<'_>) -> Result<u64, BlobError>;

    /// [`Self::put`] for an upload of `hint.user` of at most `hint.at_most`
    /// bytes, which a store that buffers parts reserves its memory by (the
    /// user's share of the budget, no more than the body can bring).
    async fn put_for(
        &self,
        key: &BlobKey,
        body: ByteStream<'_>,
        _hint: PutHint<'_>,
    ) -> Result<u64, BlobError> {
        self.put(key, body).await
    }

    /// Streams the object, or `range` of it.
    async fn get(
        &self,
        key: &BlobKey,
        range: Option<ByteRange>,
    ) -> Result<ByteStream<'static>, BlobError>;

    /// Deletes the object; deleting a missing object succeeds.
    async fn delete(&self, key: &BlobKey) -> Result<(), BlobError>;

    /// The object's size, if it exists.
    async fn head(&self, key: &BlobKey) -> Result<Option<u64>, BlobError>;

    /// Every object under `prefix`, in key order, whatever its key (audits
    /// and tests; never on a hot path).
    async fn list(&self, prefix: &str) -> Result<Vec<ListedBlob>, BlobError>;

    /// Every key under `prefix`, in key order.
    async fn list_keys(&self, prefix: &str) -> Result<Vec<String>, BlobError> {
        Ok(self
            .list(prefix)
            .await?
            .into_iter()
            .map(|b| b.key)
            .collect())
    }

    async fn ping(&self) -> Result<(), BlobError>;

    /// A URL that downloads the object without credentials for `ttl`, its
    /// response carrying `headers`; `None` where the store cannot make one
    /// (local files).
    async fn presigned_get(
        &self,
        _key: &BlobKey,
        _ttl: Duration,
        _headers: &PresignedHeaders,
    ) -> Result<Option<String>, BlobError> {
        Ok(None)
    }
}

/// Who uploads a body and how long it can be, for [`BlobStore::put_for`].
#[derive(Clone, Copy, Debug, Default)]
pub struct PutHint<'a> {
    pub user: Option<&'a str>,
    /// The body brings at most this many bytes (the request's Content-Length).
    pub at_most: Option<u64>,
}

/// The response headers a presigned download asks the store to send.
pub struct PresignedHeaders {
    pub content_type: String,
    pub content_disposition: String,
    pub cache_control: String,
}

/// `body`, failing with [`BodyError::Idle`] once the client has sent nothing
/// for `idle` (it holds a connection and perhaps a lock) and with
/// [`BodyError::TooLarge`] as soon as it passes `max` bytes.
pub fn bounded(body: ByteStream<'_>, idle: Duration, max: u64) -> ByteStream<'_> {
    let body = futures::stream::unfold(Some(body), move |body| async move {
        let mut body = body?;
        match tokio::time::timeout(idle, body.next()).await {
            Ok(Some(chunk)) => Some((chunk, Some(body))),
            Ok(None) => None,
            Err(_) => Some((Err(BodyError::Idle(idle)), None)),
        }
    });
    let mut size = 0u64;
    body.map(move |chunk| {
        let chunk = chunk?;
        size += chunk.len() as u64;
        if size > max {
            return Err(BodyError::TooLarge(max));
        }
        Ok(chunk)
    })
    .boxed()
}
