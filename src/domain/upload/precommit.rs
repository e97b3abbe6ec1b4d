//! The pre-commit hook (`FILEDOCK_PRECOMMIT_HOOK_URL`): once an upload's
//! bytes are stored and before its commit (before the commit's lock is
//! taken), a signed POST of its metadata and a short-lived URL to read its
//! bytes; a 2xx lets it commit, a 4xx refuses it (`422 rejected_by_hook`
//! with the hook's reason: the caller deletes the bytes and the intent, and
//! no event is written, as nothing commits), and a timeout, a 5xx or no
//! answer follows `FILEDOCK_PRECOMMIT_HOOK_FAILURE` (`reject`: 503, nothing
//! stored; `allow`: it commits). Plain uploads and a resumable upload's
//! last PATCH alike (the committer asks it).

use std::{sync::Arc, time::Instant};

use chrono::Utc;
use serde_json::json;

use crate::{
    blob::{BlobStore, ByteStream},
    config::{HookFailure, PrecommitSettings},
    domain::{
        DomainError,
        links::{LinkSigner, SignedLink},
    },
    hooks::{Asked, Caller},
    metrics::{Metrics, OutcomeLabel},
    vocab::{BlobKey, FileId, UserId},
};

/// How long a read URL lives at least (and a minute past the hook's
/// timeout when that is longer): a retried call makes a new one.
const READ_FOR: chrono::Duration = chrono::Duration::minutes(5);

/// What the hook is told of an upload.
pub struct Asking<'a> {
    pub owner: UserId,
    pub file_id: FileId,
    pub filename: &'a str,
    pub size: u64,
    pub sha256: &'a str,
    pub content_type: &'a str,
}

pub struct PrecommitHook {
    caller: Caller,
    url: String,
    on_failure: HookFailure,
    /// How long a read URL lives.
    read_for: chrono::Duration,
    /// Signs and checks the read URLs (`FILEDOCK_LINK_SECRET`).
    links: Arc<LinkSigner>,
    /// What the read URLs are built on (`FILEDOCK_PUBLIC_URL`, else the
    /// listen address).
    base: String,
    blobs: Arc<dyn BlobStore>,
    metrics: Arc<Metrics>,
}

impl PrecommitHook {
    pub fn new(
        settings: &PrecommitSettings,
        caller: Caller,
        (links, base): (Arc<LinkSigner>, String),
        blobs: Arc<dyn BlobStore>,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            caller,
            url: settings.url.clone(),
            on_failure: settings.on_failure,
            read_for: chrono::Duration::from_std(settings.timeout).map_or(READ_FOR, |t| {
                (t + chrono::Duration::minutes(1)).max(READ_FOR)
            }),
            links,
            base: base.trim_end_matches('/').to_owned(),
            blobs,
            metrics,
        }
    }

    /// Asks whether `upload` may commit: `Ok` to go on, else the answer
    /// to give (nothing may be kept of it then).
    pub async fn ask(&self, upload: &Asking<'_>) -> Result<(), DomainError> {
        let expires = Utc::now() + self.read_for;
        let (owner, file) = (upload.owner.to_string(), upload.file_id.to_string());
        let signature = self.links.sign_staged(&owner, &file, expires);
        let read_url = format!(
            "{}/v1/precommit/{file}?user={owner}&expires={}&signature={signature}",
            self.base,
            expires.timestamp()
        );
        let body = json!({
            "type": "upload.precommit",
            "timestamp": Utc::now(),
            "data": {
                "owner_id": owner,
                "file_id": file,
                "filename": upload.filename,
                "size": upload.size,
                "sha256": upload.sha256,
                "content_type": upload.content_type,
                "read_url": read_url,
                "read_url_expires_at": expires,
            },
        });
        let body = serde_json::to_vec(&body).expect("JSON values serialize");
        let started = Instant::now();
        let asked = self
            .caller
            .ask(&self.url, &format!("precommit_{file}"), &body)
            .await;
        self.metrics
            .precommit_latency
            .observe(started.elapsed().as_secs_f64());
        let (outcome, answer) = match asked {
            Asked::Yes => ("accepted", Ok(())),
            Asked::No(reason) => {
                tracing::info!(upload = %file, reason = %reason, "the pre-commit hook refused an upload");
                ("rejected", Err(DomainError::RejectedByHook(reason)))
            }
            Asked::Failed(why) => {
                tracing::warn!(upload = %file, reason = %why, policy = ?self.on_failure, "the pre-commit hook did not answer");
                match self.on_failure {
                    HookFailure::Reject => (
                        "failed_rejected",
                        Err(DomainError::DependencyUnavailable("the pre-commit hook")),
                    ),
                    HookFailure::Allow => ("failed_allowed", Ok(())),
                }
            }
        };
        self.metrics
            .precommit_calls
            .get_or_create(&OutcomeLabel {
                outcome: outcome.into(),
            })
            .inc();
        answer
    }

    /// The stored bytes a read URL names, while they are there (until the
    /// upload is refused, or the file deleted after its commit): the
    /// size and the bytes.
    pub async fn read(
        &self,
        link: &SignedLink<'_>,
    ) -> Result<(u64, ByteStream<'static>), DomainError> {
        self.links.verify_staged(link, Utc::now())?;
        let (Ok(owner), Ok(file)) = (link.owner_id.parse(), link.file_id.parse()) else {
            return Err(DomainError::LinkInvalid);
        };
        let key = BlobKey::file(owner, file);
        let size = self.blobs.head(&key).await?.ok_or(DomainError::NotFound)?;
        Ok((size, self.blobs.get(&key, None).await?))
    }
}
