//! `BlobStore` on any S3-compatible server (MinIO, s3s-fs, AWS) through
//! `aws-sdk-s3`. Bodies are streamed: a body that fits in one part goes up
//! as one PUT; a larger one as a multipart upload whose parts the part
//! writer (`super::parts`) sends, a bounded number in flight, aborted on
//! any failure. Memory stays at about `part_size × (part_concurrency + 1)`
//! whatever the file size.

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
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use secrecy::ExposeSecret;
use tokio_util::io::ReaderStream;

use super::{
    BlobError, BlobStore, BodyError, ByteRange, ByteStream, ListedBlob, PresignedHeaders, PutHint,
    budget::MemoryBudget,
    parts::{self, Part, PartSink, Parts, PartsFrom, Short},
};
use crate::{
    config::S3Settings,
    metrics::{Metrics, OutcomeLabel},
    vocab::BlobKey,
};

#[path = "s3_counting.rs"]
mod counting;
#[path = "s3_resumable.rs"]
mod resumable;

pub struct S3BlobStore {
    client: Client,
    bucket: String,
    prefix: String,
    part_size: usize,
    part_concurrency: usize,
    metrics: Arc<Metrics>,
    /// Every part buffer is reserved here first.
    budget: Arc<MemoryBudget>,
}

fn sdk_err<E, R>(e: SdkError<E, R>) -> BlobError
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug,
{
    match &e {
        // No answer, or one cut off before it could be read: the link.
        SdkError::DispatchFailure(_) | SdkError::TimeoutError(_) | SdkError::ResponseError(_) => {
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
            .interceptor(counting::CountRequests(metrics.clone()))
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
            budget: MemoryBudget::unbounded(),
        };
        if s.create_bucket {
            store.create_bucket().await?;
        }
        store.ping().await?;
        Ok(store)
    }

    /// Reserves every part buffer from `budget`.
    pub fn with_budget(mut self, budget: Arc<MemoryBudget>) -> Self {
        self.budget = budget;
        self
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

    /// The object's key in the bucket: the key prefix, then `key`.
    fn full_key(&self, key: impl std::fmt::Display) -> String {
        format!("{}{key}", self.prefix)
    }

    /// Starts a multipart upload to `full_key`; its upload id.
    async fn create_multipart(&self, full_key: &str) -> Result<String, BlobError> {
        let created = self
            .client
            .create_multipart_upload()
            .bucket(&self.bucket)
            .key(full_key)
            .send()
            .await
            .map_err(sdk_err)?;
        let upload_id = created
            .upload_id()
            .ok_or_else(|| BlobError::Other("CreateMultipartUpload returned no upload id".into()))?
            .to_owned();
        self.count_multipart("started");
        Ok(upload_id)
    }

    /// Makes the object at `full_key` (`len` bytes) from the parts with
    /// these tags, part 1 first.
    async fn complete_multipart(
        &self,
        full_key: &str,
        upload_id: &str,
        tags: &[String],
        len: u64,
    ) -> Result<(), BlobError> {
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
            .key(full_key)
            .upload_id(upload_id)
            .multipart_upload(
                CompletedMultipartUpload::builder()
                    .set_parts(Some(parts))
                    .build(),
            )
            .send()
            .await;
        if let Err(e) = completed {
            // The server no longer knows the upload (a retry of a complete
            // whose answer was lost, or a completion done before): S3 says
            // NoSuchUpload, s3s-fs AccessDenied.
            let gone = e
                .as_service_error()
                .and_then(ProvideErrorMetadata::code)
                .is_some_and(|c| matches!(c, "NoSuchUpload" | "AccessDenied"));
            return self.settle_complete(full_key, len, gone, sdk_err(e)).await;
        }
        self.count_multipart("completed");
        Ok(())
    }

    /// A `CompleteMultipartUpload` that failed may have completed all the
    /// same: the SDK sends it again when its answer is lost, and the server
    /// no longer knows the upload then (`gone`). The object decides: there
    /// with all the bytes, the upload completed (nothing else writes its
    /// key). Absent while the upload is `gone`, the store lost it as the
    /// link broke (s3s-fs drops a complete cut midway): an outage, nothing
    /// stored. Otherwise the error stands; an object that cannot be read is
    /// the store being unavailable.
    async fn settle_complete(
        &self,
        full_key: &str,
        len: u64,
        gone: bool,
        error: BlobError,
    ) -> Result<(), BlobError> {
        let head = self
            .client
            .head_object()
            .bucket(&self.bucket)
            .key(full_key)
            .send()
            .await;
        let head = match head {
            Ok(out) => Ok(Some(out.content_length().unwrap_or_default() as u64)),
            Err(e) if e.as_service_error().is_some_and(|se| se.is_not_found()) => Ok(None),
            Err(e) => Err(sdk_err(e)),
        };
        match head {
            Ok(Some(n)) if n == len => {
                tracing::warn!(key = full_key, error = %error, "CompleteMultipartUpload failed, but the object is complete");
                Ok(())
            }
            Ok(_) if gone => Err(BlobError::Unavailable(format!(
                "the store lost the multipart upload while completing it: {error}"
            ))),
            Ok(_) => Err(error),
            Err(e) => Err(BlobError::Unavailable(format!(
                "completing a multipart upload: {error}; then: {e}"
            ))),
        }
    }

    /// Drops a multipart upload's parts.
    async fn abort_multipart(&self, full_key: &str, upload_id: &str) -> Result<(), BlobError> {
        self.client
            .abort_multipart_upload()
            .bucket(&self.bucket)
            .key(full_key)
            .upload_id(upload_id)
            .send()
            .await
            .map_err(sdk_err)?;
        self.count_multipart("aborted");
        Ok(())
    }

    /// Where the parts of multipart upload `upload_id` to `full_key` go.
    fn sink(&self, full_key: &str, upload_id: &str) -> Arc<dyn PartSink> {
        Arc::new(MultipartSink {
            client: self.client.clone(),
            bucket: self.bucket.clone(),
            key: full_key.to_owned(),
            upload_id: upload_id.to_owned(),
        })
    }

    /// A body larger than a part, `first` of it read: a multipart upload,
    /// its parts sent by the part writer, aborted on any failure.
    async fn multipart(
        &self,
        full_key: &str,
        first: Part,
        parts: &mut Parts<'_>,
    ) -> Result<(), BlobError> {
        let upload_id = self.create_multipart(full_key).await?;
        let sink = self.sink(full_key, &upload_id);
        let from = PartsFrom {
            number: 1,
            offset: 0,
        };
        let sent = parts::send(
            parts,
            Some(first),
            sink,
            from,
            self.part_concurrency,
            Short::Send,
        );
        let result = match (sent.await, parts.cut()) {
            (Err(e), _) => Err(e),
            (Ok(_), Some(cut)) => Err(BlobError::Body(cut)),
            (Ok(sent), None) => {
                let len = parts.read();
                self.complete_multipart(full_key, &upload_id, &sent.tags, len)
                    .await
            }
        };
        if result.is_err()
            && let Err(abort) = self.abort_multipart(full_key, &upload_id).await
        {
            self.count_multipart("abort_failed");
            tracing::warn!(key = full_key, error = %abort, "AbortMultipartUpload failed");
        }
        result
    }

    /// Stores part `number` of multipart upload `upload_id`; its ETag.
    async fn upload_part(
        &self,
        full_key: &str,
        upload_id: &str,
        number: i32,
        part: Bytes,
    ) -> Result<String, BlobError> {
        upload_part(
            &self.client,
            &self.bucket,
            full_key,
            upload_id,
            number,
            part,
        )
        .await
    }
}

/// The parts of one multipart upload, as the part writer sends them.
struct MultipartSink {
    client: Client,
    bucket: String,
    key: String,
    upload_id: String,
}

#[async_trait]
impl PartSink for MultipartSink {
    async fn put_part(&self, number: i32, _offset: u64, part: Bytes) -> Result<String, BlobError> {
        upload_part(
            &self.client,
            &self.bucket,
            &self.key,
            &self.upload_id,
            number,
            part,
        )
        .await
    }
}

async fn upload_part(
    client: &Client,
    bucket: &str,
    key: &str,
    upload_id: &str,
    number: i32,
    part: Bytes,
) -> Result<String, BlobError> {
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
    Ok(out.e_tag().unwrap_or_default().to_owned())
}

#[async_trait]
impl BlobStore for S3BlobStore {
    fn bucket(&self) -> &str {
        &self.bucket
    }

    async fn put(&self, key: &BlobKey, body: ByteStream<'_>) -> Result<u64, BlobError> {
        self.put_for(key, body, PutHint::default()).await
    }

    /// Each part reserves no more than the body can still bring (a small
    /// upload with a Content-Length holds its length, not a whole part),
    /// from `hint.user`'s share.
    async fn put_for(
        &self,
        key: &BlobKey,
        body: ByteStream<'_>,
        hint: PutHint<'_>,
    ) -> Result<u64, BlobError> {
        let key = self.full_key(key);
        let claim = self.budget.claim(hint.user);
        let mut parts = Parts::new(Bytes::new(), body, self.part_size, claim).at_most(hint.at_most);
        let first = parts.next().await.unwrap_or_else(Part::empty);
        if let Some(cut) = parts.cut() {
            return Err(BlobError::Body(cut));
        }
        if parts.done() {
            // The part's reservation is held until the PUT is done.
            let Part {
                bytes: first,
                held: _held,
            } = first;
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
        self.multipart(&key, first, &mut parts).await?;
        Ok(parts.read())
    }

    async fn get(
        &self,
        key: &BlobKey,
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
        key: &BlobKey,
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

    async fn delete(&self, key: &BlobKey) -> Result<(), BlobError> {
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

    async fn head(&self, key: &BlobKey) -> Result<Option<u64>, BlobError> {
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
