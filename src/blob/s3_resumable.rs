//! `ResumableBlobs` on S3: one multipart upload per resumable upload, its
//! tail a small staging object beside it (see `super::super::resumable`).

use async_trait::async_trait;
use aws_sdk_s3::{
    primitives::ByteStream as S3Body,
    types::{CompletedMultipartUpload, CompletedPart},
};
use bytes::Bytes;

use super::{S3BlobStore, sdk_err};
use crate::blob::{BlobError, BlobStore, resumable::ResumableBlobs};

impl S3BlobStore {
    /// Where the tails of the upload to `key` live.
    fn staging_prefix(&self, key: &str) -> String {
        self.full_key(&format!("tus/{key}/"))
    }

    fn tail_key(&self, key: &str, start: u64, end: u64) -> String {
        format!("{}tail-{start}-{end}", self.staging_prefix(key))
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

    async fn start(&self, key: &str) -> Result<String, BlobError> {
        let created = self
            .client
            .create_multipart_upload()
            .bucket(&self.bucket)
            .key(self.full_key(key))
            .send()
            .await
            .map_err(sdk_err)?;
        self.count_multipart("started");
        created
            .upload_id()
            .map(str::to_owned)
            .ok_or_else(|| BlobError::Other("CreateMultipartUpload returned no upload id".into()))
    }

    async fn put_part(
        &self,
        key: &str,
        handle: &str,
        number: i32,
        _offset: u64,
        part: Bytes,
    ) -> Result<String, BlobError> {
        let out = self
            .client
            .upload_part()
            .bucket(&self.bucket)
            .key(self.full_key(key))
            .upload_id(handle)
            .part_number(number)
            .content_length(part.len() as i64)
            .body(S3Body::from(part))
            .send()
            .await
            .map_err(sdk_err)?;
        Ok(out.e_tag().unwrap_or_default().to_owned())
    }

    async fn put_tail(
        &self,
        key: &str,
        _handle: &str,
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
        key: &str,
        _handle: &str,
        start: u64,
        end: u64,
    ) -> Result<Bytes, BlobError> {
        let out = self
            .client
            .get_object()
            .bucket(&self.bucket)
            .key(self.tail_key(key, start, end))
            .send()
            .await
            .map_err(sdk_err)?;
        let bytes = out
            .body
            .collect()
            .await
            .map_err(|e| BlobError::Other(format!("reading a tail: {e}")))?
            .into_bytes();
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
        key: &str,
        _handle: &str,
        start: u64,
        end: u64,
    ) -> Result<(), BlobError> {
        self.delete_raw(&self.tail_key(key, start, end)).await
    }

    async fn complete(
        &self,
        key: &str,
        handle: &str,
        tags: &[String],
        len: u64,
    ) -> Result<(), BlobError> {
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
        let parts = tags
            .iter()
            .zip(1..)
            .map(|(tag, number)| {
                CompletedPart::builder()
                    .part_number(number)
                    .e_tag(tag)
                    .build()
            })
            .collect();
        let completed = self
            .client
            .complete_multipart_upload()
            .bucket(&self.bucket)
            .key(self.full_key(key))
            .upload_id(handle)
            .multipart_upload(
                CompletedMultipartUpload::builder()
                    .set_parts(Some(parts))
                    .build(),
            )
            .send()
            .await
            .map_err(sdk_err);
        match completed {
            Ok(_) => self.count_multipart("completed"),
            // Completed before, its answer lost: the upload id is gone
            // (NoSuchUpload; s3s-fs says AccessDenied) and the object is
            // whole. Nothing else writes this key.
            Err(e) if self.head(key).await? != Some(len) => return Err(e),
            Err(_) => {}
        }
        Ok(())
    }

    async fn abort(&self, key: &str, handle: &str) -> Result<(), BlobError> {
        // The tails first, so that an abort that fails leaves none.
        self.clear_staging(key, handle).await?;
        match self
            .client
            .abort_multipart_upload()
            .bucket(&self.bucket)
            .key(self.full_key(key))
            .upload_id(handle)
            .send()
            .await
            .map_err(sdk_err)
        {
            Ok(_) => self.count_multipart("aborted"),
            Err(BlobError::NotFound) => {}
            // A completed upload's id is gone (s3s-fs says AccessDenied,
            // not NoSuchUpload): its object is there.
            Err(e) if self.head(key).await?.is_none() => return Err(e),
            Err(_) => {}
        }
        Ok(())
    }

    async fn clear_staging(&self, key: &str, _handle: &str) -> Result<(), BlobError> {
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
}
