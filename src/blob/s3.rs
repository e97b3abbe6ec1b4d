//! `BlobStore` on any S3-compatible server (MinIO, s3s-fs, AWS) through
//! `aws-sdk-s3`. Bodies are streamed: a body that fits in one part goes up
//! as one PUT; a larger one as a multipart upload with a bounded number of
//! parts in flight, aborted on any failure. Memory stays at about
//! `part_size × (part_concurrency + 1)` whatever the file size.

use std::{sync::Arc, time::Duration};

use async_trait::async_trait;
use aws_sdk_s3::{
    Client,
    config::{
        BehaviorVersion, Credentials, Region, RequestChecksumCalculation,
        ResponseChecksumValidation, timeout::TimeoutConfig,
    },
    error::{DisplayErrorContext, ProvideErrorMetadata, SdkError},
    presigning::PresigningConfig,
    primitives::ByteStream as S3Body,
    types::{CompletedMultipartUpload, CompletedPart},
};
use bytes::{Bytes, BytesMut};
use futures::{StreamExt, TryStreamExt};
use secrecy::ExposeSecret;
use tokio::task::JoinSet;
use tokio_util::io::ReaderStream;

use super::{BlobError, BlobStore, BodyError, ByteRange, ByteStream, ListedBlob, PresignedHeaders};
use crate::{
    config::S3Settings,
    metrics::{Metrics, OutcomeLabel},
};

#[path = "s3_resumable.rs"]
mod resumable;

pub struct S3BlobStore {
    client: Client,
    bucket: String,
    prefix: String,
    part_size: usize,
    part_concurrency: usize,
    metrics: Arc<Metrics>,
}

fn sdk_err<E, R>(e: SdkError<E, R>) -> BlobError
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug,
{
    match &e {
        SdkError::DispatchFailure(_) | SdkError::TimeoutError(_) => {
            BlobError::Unavailable(DisplayErrorContext(&e).to_string())
        }
        SdkError::ServiceError(se) => match se.err().code() {
            Some("NoSuchKey" | "NotFound" | "NoSuchUpload") => BlobError::NotFound,
            code => BlobError::Other(format!(
                "{}: {}",
                code.unwrap_or("unknown"),
                se.err().message().unwrap_or_default()
            )),
        },
        _ => BlobError::Other(DisplayErrorContext(&e).to_string()),
    }
}

impl S3BlobStore {
    /// Builds the client and, when allowed, creates the bucket.
    pub async fn connect(s: &S3Settings, metrics: Arc<Metrics>) -> anyhow::Result<Self> {
        let config = aws_sdk_s3::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .endpoint_url(&s.endpoint)
            .region(Region::new(s.region.clone()))
            .credentials_provider(Credentials::new(
                s.access_key.expose_secret(),
                s.secret_key.expose_secret(),
                None,
                None,
                "filedock-settings",
            ))
            .force_path_style(true)
            // Streamed bodies would otherwise go out as aws-chunked with trailers.
            .request_checksum_calculation(RequestChecksumCalculation::WhenRequired)
            .response_checksum_validation(ResponseChecksumValidation::WhenRequired)
            .timeout_config(
                TimeoutConfig::builder()
                    .connect_timeout(Duration::from_secs(3))
                    .read_timeout(Duration::from_secs(60))
                    .build(),
            )
            .build();
        let store = Self {
            client: Client::from_conf(config),
            bucket: s.bucket.clone(),
            prefix: s.key_prefix.clone(),
            part_size: s.part_size,
            part_concurrency: s.part_concurrency.max(1),
            metrics,
        };
        if s.create_bucket {
            store.create_bucket().await?;
        }
        store.ping().await?;
        Ok(store)
    }

    async fn create_bucket(&self) -> anyhow::Result<()> {
        match self
            .client
            .create_bucket()
            .bucket(&self.bucket)
            .send()
            .await
        {
            Ok(_) => Ok(()),
            Err(e) => match e.as_service_error().and_then(|se| se.code()) {
                Some("BucketAlreadyOwnedByYou" | "BucketAlreadyExists") => Ok(()),
                _ => Err(anyhow::anyhow!(
                    "creating bucket {}: {}",
                    self.bucket,
                    DisplayErrorContext(&e)
                )),
            },
        }
    }

    fn count_multipart(&self, outcome: &str) {
        self.metrics
            .s3_multipart
            .get_or_create(&OutcomeLabel {
                outcome: outcome.into(),
            })
            .inc();
    }

    fn full_key(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    async fn multipart(
        &self,
        key: &str,
        first: Bytes,
        parts: &mut PartReader<'_, '_>,
        written: &mut u64,
    ) -> Result<(), BlobError> {
        let created = self
            .client
            .create_multipart_upload()
            .bucket(&self.bucket)
            .key(key)
            .send()
            .await
            .map_err(sdk_err)?;
        let upload_id = created
            .upload_id()
            .ok_or_else(|| BlobError::Other("CreateMultipartUpload returned no upload id".into()))?
            .to_owned();
        self.count_multipart("started");
        let result = self
            .upload_parts(key, &upload_id, first, parts, written)
            .await;
        match result {
            Ok(parts) => {
                self.client
                    .complete_multipart_upload()
                    .bucket(&self.bucket)
                    .key(key)
                    .upload_id(&upload_id)
                    .multipart_upload(
                        CompletedMultipartUpload::builder()
                            .set_parts(Some(parts))
                            .build(),
                    )
                    .send()
                    .await
                    .map_err(sdk_err)?;
                self.count_multipart("completed");
                Ok(())
            }
            Err(e) => {
                match self
                    .client
                    .abort_multipart_upload()
                    .bucket(&self.bucket)
                    .key(key)
                    .upload_id(&upload_id)
                    .send()
                    .await
                {
                    Ok(_) => self.count_multipart("aborted"),
                    Err(abort) => {
                        self.count_multipart("abort_failed");
                        tracing::warn!(key, error = %DisplayErrorContext(&abort), "AbortMultipartUpload failed");
                    }
                }
                Err(e)
            }
        }
    }

    /// Uploads the parts as tasks, so that reading the next part from the
    /// client overlaps with sending the previous ones; at most
    /// `part_concurrency` parts are in flight (and in memory).
    async fn upload_parts(
        &self,
        key: &str,
        upload_id: &str,
        first: Bytes,
        parts: &mut PartReader<'_, '_>,
        written: &mut u64,
    ) -> Result<Vec<CompletedPart>, BlobError> {
        let mut in_flight = JoinSet::new();
        let mut done = Vec::new();
        let mut part = Some(first);
        let mut number = 0;
        while let Some(bytes) = part.take() {
            number += 1;
            *written += bytes.len() as u64;
            in_flight.spawn(upload_part(
                self.client.clone(),
                self.bucket.clone(),
                key.to_owned(),
                upload_id.to_owned(),
                number,
                bytes,
            ));
            while in_flight.len() >= self.part_concurrency {
                done.push(joined(in_flight.join_next().await)?);
            }
            part = parts.next().await?;
        }
        while let Some(r) = in_flight.join_next().await {
            done.push(joined(Some(r))?);
        }
        done.sort_by_key(|p: &CompletedPart| p.part_number());
        Ok(done)
    }
}

/// Cuts a body into parts of exactly `size` bytes (the last may be shorter),
/// each held in one allocation of its own size, so that memory per upload
/// stays at `size × parts in flight` whatever the chunks look like.
struct PartReader<'a, 'b> {
    body: &'a mut ByteStream<'b>,
    /// The tail of a chunk that crossed the previous part's end.
    carry: Option<Bytes>,
    size: usize,
    ended: bool,
}

impl<'a, 'b> PartReader<'a, 'b> {
    fn new(body: &'a mut ByteStream<'b>, size: usize) -> Self {
        Self {
            body,
            carry: None,
            size,
            ended: false,
        }
    }

    /// The next part, or `None` when the body is done.
    async fn next(&mut self) -> Result<Option<Bytes>, BlobError> {
        let mut chunks: Vec<Bytes> = Vec::new();
        let mut len = 0;
        while len < self.size {
            let chunk = match self.carry.take() {
                Some(c) => c,
                None if self.ended => break,
                None => match self.body.next().await {
                    Some(c) => c.map_err(BlobError::Body)?,
                    None => {
                        self.ended = true;
                        break;
                    }
                },
            };
            let room = self.size - len;
            if chunk.len() > room {
                self.carry = Some(chunk.slice(room..));
                chunks.push(chunk.slice(..room));
                len += room;
            } else {
                len += chunk.len();
                chunks.push(chunk);
            }
        }
        Ok(match chunks.len() {
            0 => None,
            1 => chunks.pop(),
            _ => {
                let mut part = BytesMut::with_capacity(len);
                for c in &chunks {
                    part.extend_from_slice(c);
                }
                Some(part.freeze())
            }
        })
    }

    /// Whether the whole body has been read.
    fn done(&self) -> bool {
        self.ended && self.carry.is_none()
    }
}

fn joined(
    r: Option<Result<Result<CompletedPart, BlobError>, tokio::task::JoinError>>,
) -> Result<CompletedPart, BlobError> {
    match r {
        Some(Ok(part)) => part,
        Some(Err(e)) => Err(BlobError::Other(format!("part upload task failed: {e}"))),
        None => Err(BlobError::Other("no part upload in flight".into())),
    }
}

async fn upload_part(
    client: Client,
    bucket: String,
    key: String,
    upload_id: String,
    number: i32,
    part: Bytes,
) -> Result<CompletedPart, BlobError> {
    let out = client
        .upload_part()
        .bucket(bucket)
        .key(key)
        .upload_id(upload_id)
        .part_number(number)
        .content_length(part.len() as i64)
        .body(S3Body::from(part))
        .send()
        .await
        .map_err(sdk_err)?;
    Ok(CompletedPart::builder()
        .part_number(number)
        .set_e_tag(out.e_tag().map(str::to_owned))
        .build())
}

#[async_trait]
impl BlobStore for S3BlobStore {
    fn bucket(&self) -> &str {
        &self.bucket
    }

    async fn put(&self, key: &str, mut body: ByteStream<'_>) -> Result<u64, BlobError> {
        let key = self.full_key(key);
        let mut parts = PartReader::new(&mut body, self.part_size);
        let first = parts.next().await?.unwrap_or_default();
        if parts.done() {
            let len = first.len() as u64;
            self.client
                .put_object()
                .bucket(&self.bucket)
                .key(&key)
                .content_length(len as i64)
                .body(S3Body::from(first))
                .send()
                .await
                .map_err(sdk_err)?;
            return Ok(len);
        }
        let mut written = 0;
        self.multipart(&key, first, &mut parts, &mut written)
            .await?;
        Ok(written)
    }

    async fn get(
        &self,
        key: &str,
        range: Option<ByteRange>,
    ) -> Result<ByteStream<'static>, BlobError> {
        let out = self
            .client
            .get_object()
            .bucket(&self.bucket)
            .key(self.full_key(key))
            .set_range(range.map(|r| format!("bytes={}-{}", r.start, r.end)))
            .send()
            .await
            .map_err(sdk_err)?;
        Ok(ReaderStream::new(out.body.into_async_read())
            .map_err(BodyError::Read)
            .boxed())
    }

    async fn presigned_get(
        &self,
        key: &str,
        ttl: Duration,
        headers: &PresignedHeaders,
    ) -> Result<Option<String>, BlobError> {
        let config = PresigningConfig::expires_in(ttl)
            .map_err(|e| BlobError::Other(format!("presigning: {e}")))?;
        let request = self
            .client
            .get_object()
            .bucket(&self.bucket)
            .key(self.full_key(key))
            .response_content_type(&headers.content_type)
            .response_content_disposition(&headers.content_disposition)
            .response_cache_control(&headers.cache_control)
            .presigned(config)
            .await
            .map_err(sdk_err)?;
        Ok(Some(request.uri().to_owned()))
    }

    async fn delete(&self, key: &str) -> Result<(), BlobError> {
        self.client
            .delete_object()
            .bucket(&self.bucket)
            .key(self.full_key(key))
            .send()
            .await
            .map(|_| ())
            .or_else(|e| match sdk_err(e) {
                BlobError::NotFound => Ok(()),
                e => Err(e),
            })
    }

    async fn head(&self, key: &str) -> Result<Option<u64>, BlobError> {
        match self
            .client
            .head_object()
            .bucket(&self.bucket)
            .key(self.full_key(key))
            .send()
            .await
        {
            Ok(out) => Ok(Some(out.content_length().unwrap_or_default() as u64)),
            Err(e) if e.as_service_error().is_some_and(|se| se.is_not_found()) => Ok(None),
            Err(e) => Err(sdk_err(e)),
        }
    }

    async fn list(&self, prefix: &str) -> Result<Vec<ListedBlob>, BlobError> {
        let mut pages = self
            .client
            .list_objects_v2()
            .bucket(&self.bucket)
            .prefix(self.full_key(prefix))
            .into_paginator()
            .send();
        let mut listed = Vec::new();
        while let Some(page) = pages.next().await {
            for obj in page.map_err(sdk_err)?.contents() {
                let Some(key) = obj.key().and_then(|k| k.strip_prefix(&self.prefix)) else {
                    continue;
                };
                // An object without a time is treated as written just now.
                let modified = obj
                    .last_modified()
                    .and_then(|t| t.to_millis().ok())
                    .and_then(chrono::DateTime::from_timestamp_millis)
                    .unwrap_or_else(chrono::Utc::now);
                listed.push(ListedBlob {
                    key: key.to_owned(),
                    modified,
                });
            }
        }
        Ok(listed)
    }

    async fn ping(&self) -> Result<(), BlobError> {
        self.client
            .head_bucket()
            .bucket(&self.bucket)
            .send()
            .await
            .map(|_| ())
            .map_err(sdk_err)
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;

    use super::*;

    /// Cuts chunks of the given lengths into parts of `size`.
    async fn parts_of(chunks: &[usize], size: usize) -> (Vec<Bytes>, Vec<u8>) {
        let mut all = Vec::new();
        let body: Vec<Result<Bytes, BodyError>> = chunks
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                let c: Vec<u8> = (0..n).map(|j| (i * 31 + j) as u8).collect();
                all.extend_from_slice(&c);
                Ok(Bytes::from(c))
            })
            .collect();
        let mut body: ByteStream = futures::stream::iter(body).boxed();
        let mut reader = PartReader::new(&mut body, size);
        let mut parts = Vec::new();
        while let Some(p) = reader.next().await.unwrap() {
            parts.push(p);
        }
        assert!(reader.done());
        (parts, all)
    }

    #[tokio::test]
    async fn parts_are_exactly_the_part_size_whatever_the_chunks() {
        let size = 200 << 10;
        let cases: [&[usize]; 6] = [
            &[],
            &[10],
            &[1000, 3000, 5],
            &[size],
            &[size * 2 + 7],
            &[70_000, 1, 130_000, 300_000, 64 << 10, 3, size, 9],
        ];
        for chunks in cases {
            let (parts, all) = parts_of(chunks, size).await;
            let (last, full) = parts
                .split_last()
                .map_or((None, &[][..]), |(l, f)| (Some(l), f));
            assert!(full.iter().all(|p| p.len() == size), "{chunks:?}");
            assert!(
                last.is_none_or(|l| !l.is_empty() && l.len() <= size),
                "{chunks:?}"
            );
            assert_eq!(parts.concat(), all, "{chunks:?}: the bytes, in order");
        }
    }
}
