//! The `ResumableBlobs` port: a blob written in numbered parts over many
//! requests (tus), which appears whole only when completed. S3 maps it onto
//! a multipart upload; the local-file store onto a staging file.
//!
//! The bytes after the last whole part (fewer than a part) are the *tail*.
//! It is kept in the blob store beside the upload (S3: a staging object
//! `tus/{key}/tail-{start}-{end}`; local files: in the staging file itself),
//! so that any instance can continue the upload and no instance holds more
//! than a part of it in memory. A tail is named by its range: writing a new
//! one never overwrites the one the stored state points at.

use async_trait::async_trait;
use bytes::Bytes;

use super::BlobError;

#[async_trait]
pub trait ResumableBlobs: Send + Sync {
    /// The size of every part but the last.
    fn part_size(&self) -> usize;

    /// Starts a resumable write to `key`; returns its handle (the S3 upload id).
    async fn start(&self, key: &str) -> Result<String, BlobError>;

    /// Stores part `number` (1-based), which begins at byte `offset`;
    /// returns its tag (the S3 ETag). Storing a number again replaces it.
    async fn put_part(
        &self,
        key: &str,
        handle: &str,
        number: i32,
        offset: u64,
        part: Bytes,
    ) -> Result<String, BlobError>;

    /// Stores the tail `start..start + tail.len()`.
    async fn put_tail(
        &self,
        key: &str,
        handle: &str,
        start: u64,
        tail: Bytes,
    ) -> Result<(), BlobError>;

    /// Reads the tail `start..end` back.
    async fn get_tail(
        &self,
        key: &str,
        handle: &str,
        start: u64,
        end: u64,
    ) -> Result<Bytes, BlobError>;

    /// Drops the tail `start..end` (a newer one replaced it); a missing one is fine.
    async fn delete_tail(
        &self,
        key: &str,
        handle: &str,
        start: u64,
        end: u64,
    ) -> Result<(), BlobError>;

    /// Makes the object at `key` (`len` bytes) from the parts with these
    /// tags, in order. Completing a write that already completed succeeds
    /// (its first answer may have been lost): the object is there, whole.
    async fn complete(
        &self,
        key: &str,
        handle: &str,
        tags: &[String],
        len: u64,
    ) -> Result<(), BlobError>;

    /// Drops the parts and tails; aborting a finished or missing write
    /// succeeds (and leaves a finished write's object alone).
    async fn abort(&self, key: &str, handle: &str) -> Result<(), BlobError>;

    /// Drops what a finished write left in staging (tails whose delete
    /// failed); its object stays.
    async fn clear_staging(&self, key: &str, handle: &str) -> Result<(), BlobError>;
}
