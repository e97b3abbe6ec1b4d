//! `ResumableBlobs` on S3: one multipart upload per resumable upload, its
//! tail a small staging object beside it (see `super::super::resumable`);
//! an upload of one part at most is one `PutObject` instead, with
//! `If-None-Match: *` so that a late write never overwrites an object.

use std::sync::Arc;

use async_trait::async_trait;
use aws_sdk_s3::{error::ProvideErrorMetadata, primitives::ByteStream as S3Body};
use bytes::Bytes;
use chrono::{DateTime, Utc};

use super::{S3BlobStore, sdk_err};
use crate::{
    blob::{
        BlobError, BlobStore,
        budget::MemoryBudget,
        resumable::{ResumableBlobs, Staged},
    },
    vocab::{BlobKey, WriteHandle},
};

/// Where every tail is staged (see [`BlobKey::staging_prefix`]).
const STAGING: &str = "tus/";

/// The handle of a write stored as one object: no multipart upload was
/// started (an S3 upload id is never this).
const WHOLE: &str = "whole";

fn is_whole(handle: &WriteHandle) -> bool {
    handle.as_str() == WHOLE
}

impl S3BlobStore {
    /// Where the tails of the upload to `key` live.
    fn staging_prefix(&self, key: &BlobKey) -> String {
        self.full_key(key.staging_prefix())
    }

    fn tail_key(&self, key: &BlobKey, start: u64, end: u64) -> String {
        self.full_key(key.tail(start, end))
    }

    /// Stores `bytes` as the object at `key` unless one is there; its
    /// ETag. One that is there with the same bytes is this write, stored
    /// before (its answer, or the state's update after it, lost): stored.
    /// One with other bytes stays, and the write fails.
    async fn put_whole(&self, key: &BlobKey, bytes: Bytes) -> Result<String, BlobError> {
        let full_key = self.full_key(key);
        let put = self
            .client
            .put_object()
            .bucket(&self.bucket)
            .key(&full_key)
            .if_none_match("*")
            .content_length(bytes.len() as i64)
            .body(S3Body::from(bytes.clone()))
            .send()
            .await;
        let error = match put {
            Ok(out) => return Ok(out.e_tag().unwrap_or_default().to_owned()),
            Err(e) => e,
        };
        // Gone since the refusal (its upload ended meanwhile), or another
        // conditional write to the key at the same moment (AWS): try again.
        let again = || BlobError::Unavailable(format!("{full_key}: written or deleted meanwhile"));
        match error.as_service_error().and_then(|e| e.code()) {
            Some("PreconditionFailed") => {}
            Some("ConditionalRequestConflict") => return Err(again()),
            _ => return Err(sdk_err(error)),
        }
        let other =
            || BlobError::Conflict(format!("{full_key} is stored already, with other bytes"));
        // Another length is other bytes, without reading them.
        match self.head(key).await? {
            None => return Err(again()),
            Some(len) if len != bytes.len() as u64 => return Err(other()),
            Some(_) => {}
        }
        let (tag, stored) = match self.read_raw(&full_key).await {
            Err(BlobError::NotFound) => return Err(again()),
            read => read?,
        };
        match stored == bytes {
            true => Ok(tag),
            false => Err(other()),
        }
    }

    /// The object at `full_key`, whole, and its ETag.
    async fn read_raw(&self, full_key: &str) -> Result<(String, Bytes), BlobError> {
        let out = self
            .client
            .get_object()
            .bucket(&self.bucket)
            .key(full_key)
            .send()
            .await
            .map_err(sdk_err)?;
        let tag = out.e_tag().unwrap_or_default().to_owned();
        let bytes = out
            .body
            .collect()
            .await
            // The link broke mid-body (a truncated answer is one too).
            .map_err(|e| BlobError::Unavailable(format!("reading {full_key}: {e}")))?
            .into_bytes();
        Ok((tag, bytes))
    }

    async fn delete_raw(&self, full_key: &str) -> Result<(), BlobError> {
        self.client
            .delete_object()
            .bucket(&self.bucket)
            .key(full_key)
            .send()
            .await
            .map(|_| ())
            .or_else(|e| match sdk_err(e) {
                BlobError::NotFound => Ok(()),
                e => Err(e),
            })
    }
}

#[async_trait]
impl ResumableBlobs for S3BlobStore {
    fn part_size(&self) -> usize {
        self.part_size
    }

    fn part_concurrency(&self) -> usize {
        self.part_concurrency
    }

    fn budget(&self) -> Arc<MemoryBudget> {
        self.budget.clone()
    }

    fn stores_whole(&self, handle: &WriteHandle) -> bool {
        is_whole(handle)
    }

    async fn start(&self, key: &BlobKey, length: Option<u64>) -> Result<WriteHandle, BlobError> {
        // Shorter than a part: the part writer never fills one, so the one
        // object is written by the last PATCH only, after its checks (a
        // checksum, the length) have passed.
        if length.is_some_and(|l| l < self.part_size as u64) {
            return Ok(WriteHandle::new(WHOLE));
        }
        let upload_id = self.create_multipart(&self.full_key(key)).await?;
        Ok(WriteHandle::new(upload_id))
    }

    async fn put_part(
        &self,
        key: &BlobKey,
        handle: &WriteHandle,
        number: i32,
        _offset: u64,
        part: Bytes,
    ) -> Result<String, BlobError> {
        if is_whole(handle) {
            if number != 1 {
                return Err(BlobError::Other(format!(
                    "part {number} of a write stored as one object"
                )));
            }
            return self.put_whole(key, part).await;
        }
        let full_key = self.full_key(key);
        self.upload_part(&full_key, handle.as_str(), number, part)
            .await
    }

    async fn put_tail(
        &self,
        key: &BlobKey,
        _handle: &WriteHandle,
        start: u64,
        tail: Bytes,
    ) -> Result<(), BlobError> {
        let end = start + tail.len() as u64;
        self.client
            .put_object()
            .bucket(&self.bucket)
            .key(self.tail_key(key, start, end))
            .content_length(tail.len() as i64)
            .body(S3Body::from(tail))
            .send()
            .await
            .map(|_| ())
            .map_err(sdk_err)
    }

    async fn get_tail(
        &self,
        key: &BlobKey,
        _handle: &WriteHandle,
        start: u64,
        end: u64,
    ) -> Result<Bytes, BlobError> {
        let (_, bytes) = self.read_raw(&self.tail_key(key, start, end)).await?;
        if bytes.len() as u64 != end - start {
            return Err(BlobError::Other(format!(
                "tail {start}-{end} has {} bytes",
                bytes.len()
            )));
        }
        Ok(bytes)
    }

    async fn delete_tail(
        &self,
        key: &BlobKey,
        _handle: &WriteHandle,
        start: u64,
        end: u64,
    ) -> Result<(), BlobError> {
        self.delete_raw(&self.tail_key(key, start, end)).await
    }

    async fn complete(
        &self,
        key: &BlobKey,
        handle: &WriteHandle,
        tags: &[String],
        len: u64,
    ) -> Result<(), BlobError> {
        if is_whole(handle) {
            // Stored whole by its one part (an empty upload has none).
            if tags.is_empty() {
                self.put_whole(key, Bytes::new()).await?;
            }
            return Ok(());
        }
        if tags.is_empty() {
            // An empty upload: S3 completes no multipart upload without parts.
            self.client
                .put_object()
                .bucket(&self.bucket)
                .key(self.full_key(key))
                .content_length(0)
                .body(S3Body::from(Bytes::new()))
                .send()
                .await
                .map_err(sdk_err)?;
            return self.abort(key, handle).await;
        }
        // Completed before, its answer lost: the object is whole, and
        // completing again settles to success.
        self.complete_multipart(&self.full_key(key), handle.as_str(), tags, len)
            .await
    }

    async fn abort(&self, key: &BlobKey, handle: &WriteHandle) -> Result<(), BlobError> {
        // The tails first, so that an abort that fails leaves none.
        self.clear_staging(key, handle).await?;
        if is_whole(handle) {
            // Its object, if its part was stored, stays, as a completed
            // write's does: the upload's intent decides it (a commit took
            // it, or its orphan deletes the object).
            return Ok(());
        }
        // NoSuchUpload: gone already (aborted before, its answer lost).
        match self
            .abort_multipart(&self.full_key(key), handle.as_str())
            .await
        {
            Ok(()) | Err(BlobError::NotFound) => Ok(()),
            // A completed upload's id is gone (s3s-fs says AccessDenied,
            // not NoSuchUpload): its object is there. An AccessDenied
            // otherwise stands (on S3 it is a missing permission; on
            // s3s-fs, an abort retried after its answer was lost meets it
            // too), not taken as aborted.
            Err(e) if self.head(key).await?.is_none() => Err(e),
            Err(_) => Ok(()),
        }
    }

    async fn clear_staging(&self, key: &BlobKey, _: &WriteHandle) -> Result<(), BlobError> {
        let mut pages = self
            .client
            .list_objects_v2()
            .bucket(&self.bucket)
            .prefix(self.staging_prefix(key))
            .into_paginator()
            .send();
        while let Some(page) = pages.next().await {
            for obj in page.map_err(sdk_err)?.contents() {
                if let Some(k) = obj.key() {
                    self.delete_raw(k).await?;
                }
            }
        }
        Ok(())
    }

    async fn staged(&self, before: DateTime<Utc>) -> Result<Vec<Staged>, BlobError> {
        // The multipart uploads themselves are not listed: s3s-fs has no
        // ListMultipartUploads (the bucket's lifecycle rule for incomplete
        // uploads is the backstop for those no state names).
        let listed = self.list(STAGING).await?;
        Ok(listed
            .into_iter()
            .filter(|b| b.modified < before)
            .filter_map(|b| match BlobKey::parse(&b.key) {
                Some(key @ BlobKey::Tail { .. }) => Some(Staged::Tail(key)),
                _ => None,
            })
            .collect())
    }

    async fn remove_staged(&self, staged: &Staged) -> Result<(), BlobError> {
        match staged {
            Staged::Tail(key) => self.delete_raw(&self.full_key(key)).await,
            Staged::Write { .. } | Staged::Temp(_) => Ok(()),
        }
    }
}
