//! Resumable (tus) uploads in flight: the `ResumableRepo` port and its
//! record, kept in the metadata store so that any instance can continue an
//! upload another one started.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{error::MetaResult, records::bson_time};
use crate::vocab::{BlobKey, FileId, UserId, WriteHandle};

/// `resumable_uploads`: one tus upload between its creation and its last PATCH.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ResumableRecord {
    /// The upload id, which is also the id the file commits under (and its intent's).
    #[serde(rename = "_id")]
    pub id: FileId,
    pub user_id: UserId,
    /// The blob key the file will have.
    pub key: BlobKey,
    /// The blob store's handle on the write (the S3 multipart upload id).
    pub handle: WriteHandle,
    /// `Upload-Length`.
    pub length: i64,
    /// `Upload-Offset`: the bytes stored so far.
    pub offset: i64,
    /// The part size the upload was started with.
    pub part_size: i64,
    /// The tags of the whole parts stored, part 1 first; the tail (the
    /// bytes after them, up to `offset`) is in the blob store.
    pub parts: Vec<String>,
    /// The SHA-256 of the bytes up to `offset`, as a serialized hash state (hex).
    pub sha256_state: String,
    /// Whether the blob store's write was completed (the object is whole
    /// at `key`): every byte arrived, and only the file's commit is left.
    #[serde(default)]
    pub completed: bool,
    pub filename: String,
    pub content_type: String,
    /// The raw `Upload-Metadata`, returned by `HEAD`.
    pub metadata: String,
    #[serde(with = "bson_time")]
    pub created_at: DateTime<Utc>,
    /// `Upload-Expires`: after this the sweeper aborts the upload.
    #[serde(with = "bson_time")]
    pub expires_at: DateTime<Utc>,
}

impl ResumableRecord {
    /// Where the tail starts: after the whole parts.
    pub fn tail_start(&self) -> i64 {
        self.parts.len() as i64 * self.part_size
    }

    /// Whether every byte is stored (and only the commit may be left).
    pub fn all_stored(&self) -> bool {
        self.offset == self.length
    }
}

#[async_trait]
pub trait ResumableRepo: Send + Sync {
    async fn insert_resumable(&self, upload: &ResumableRecord) -> MetaResult<()>;

    async fn resumable(&self, id: &FileId) -> MetaResult<Option<ResumableRecord>>;

    /// Replaces the record with `upload` if its offset is still
    /// `expected_offset`: `false` (nothing changed) if another PATCH moved
    /// it first or the upload is gone.
    async fn advance_resumable(
        &self,
        upload: &ResumableRecord,
        expected_offset: i64,
    ) -> MetaResult<bool>;

    async fn delete_resumable(&self, id: &FileId) -> MetaResult<()>;

    /// Deletes the record if its expiry is still `expires_at` (no PATCH
    /// renewed it since it was read): `false`, and nothing changed, if one
    /// did or the upload is gone. The sweeper claims an expired upload so,
    /// which is safe with or without the upload's lock.
    async fn delete_resumable_if_expires(
        &self,
        id: &FileId,
        expires_at: DateTime<Utc>,
    ) -> MetaResult<bool>;

    /// Uploads that expired before `before`, soonest first.
    async fn expired_resumables(
        &self,
        before: DateTime<Utc>,
        limit: usize,
    ) -> MetaResult<Vec<ResumableRecord>>;
}
