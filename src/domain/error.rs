//! `DomainError`: every way a service call can fail, in the domain's terms.
//! The ports' errors map into it here; `http::ApiError` maps it to a status
//! and a body (the domain knows no status codes).

use crate::{
    blob::{BlobError, BodyError},
    coord::CoordError,
    lock::LockError,
    meta::MetaError,
};

#[derive(Debug, thiserror::Error)]
pub enum DomainError {
    #[error("missing or invalid API key")]
    Unauthenticated,
    /// A known caller without the right (a token outside its scopes).
    #[error("{0}")]
    Forbidden(String),
    /// Also for other users' resources: existence is never revealed.
    #[error("not found")]
    NotFound,
    #[error("{0}")]
    InvalidRequest(String),
    /// The client stopped sending the body.
    #[error("{0}")]
    RequestTimeout(String),
    /// The user has as many uploads in flight as one instance allows.
    #[error("too many uploads in flight for this user (at most {0}); try again")]
    TooManyUploads(usize),
    /// The user has as many open resumable uploads as they may have
    /// (`FILEDOCK_MAX_OPEN_UPLOADS`): one has to finish, be terminated or
    /// expire first.
    #[error(
        "too many open resumable uploads for this user (GET /v1/me shows them); finish or terminate one (DELETE /v1/uploads/{{id}}) or let it expire"
    )]
    TooManyOpenUploads,
    #[error("the body is larger than the limit of {0} bytes")]
    PayloadTooLarge(u64),
    #[error("timed out waiting for a lock on this resource; try again")]
    LockTimeout,
    #[error("the lock on this resource was lost before the change committed; try again")]
    LockLost,
    #[error("too many concurrent writers on this resource; try again")]
    WriteConflict,
    #[error("the upload took longer than its reservation allows and was discarded; try again")]
    UploadExpired,
    #[error("{0} is unavailable")]
    DependencyUnavailable(&'static str),
    /// The upload waited this long for buffer memory that other uploads
    /// held (`FILEDOCK_UPLOAD_MEMORY_WAIT_SECS`).
    #[error("the server's upload memory stayed in use by other uploads for {0:?}; try again")]
    MemoryBusy(std::time::Duration),
    /// The change was sent to the metadata store but its answer was lost: it
    /// may or may not have applied. `Some(path)` names the resource to read
    /// to find out.
    #[error("{}", outcome_unknown_message(.0.as_deref()))]
    OutcomeUnknown(Option<String>),
    #[error("storage quota exceeded")]
    QuotaExceeded,
    /// The user holds `FILEDOCK_MAX_KEYS_PER_USER` keys.
    #[error("this user already holds their limit of {0} API keys; revoke one first")]
    TooManyKeys(usize),
    /// The user holds `FILEDOCK_MAX_TOKENS_PER_USER` live tokens.
    #[error("this user already holds their limit of {0} live tokens; let one expire first")]
    TooManyTokens(usize),
    /// A session's or agent's list is at `FILEDOCK_MAX_CONTAINER_ITEMS`.
    #[error("this list already holds its limit of {0} items; remove one first")]
    ContainerFull(usize),
    /// The bytes received do not have the digest the client declared.
    #[error("the body does not match its Content-Digest ({0}); nothing was stored")]
    DigestMismatch(&'static str),
    /// The type (declared or detected) is outside `FILEDOCK_ALLOWED_TYPES`,
    /// or a request body is not of the type its protocol requires.
    #[error("{0}")]
    UnsupportedMediaType(String),
    /// A signed link whose signature does not match (tampered or made up).
    #[error("this link is not valid")]
    LinkInvalid,
    #[error("this link has expired")]
    LinkExpired,
    /// The key that made the link (or minted the token that did) was revoked.
    #[error("the key that made this link has been revoked")]
    LinkRevoked,
    /// The `Idempotency-Key` was used before for a different request (body,
    /// filename or content type).
    #[error(
        "this Idempotency-Key was used for a different request (body, filename or content type)"
    )]
    IdempotencyKeyMismatch,
    /// The first request with this `Idempotency-Key` has not been answered yet.
    #[error("a request with this Idempotency-Key is still in progress; try again")]
    IdempotencyKeyInFlight,
    /// The events after the cursor are no longer kept
    /// (`FILEDOCK_EVENT_RETENTION_SECS`): the reader missed some.
    #[error(
        "the events after {0} are no longer kept (FILEDOCK_EVENT_RETENTION_SECS); read again without after to go on from the oldest kept"
    )]
    CursorExpired(i64),
    /// The pre-commit hook (`FILEDOCK_PRECOMMIT_HOOK_URL`) refused the
    /// upload with a 4xx: nothing was stored. Its reason, as it gave it.
    #[error("the pre-commit hook rejected this upload: {0}")]
    RejectedByHook(String),
    /// A queued operation kept failing and was moved to the dead-letter queue.
    #[error("{0}")]
    DeadLettered(String),
    #[error("internal error")]
    Internal(#[source] anyhow::Error),
}

impl DomainError {
    /// The stable, documented error code.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Unauthenticated => "unauthenticated",
            Self::Forbidden(_) => "forbidden",
            Self::NotFound => "not_found",
            Self::InvalidRequest(_) => "invalid_request",
            Self::RequestTimeout(_) => "request_timeout",
            Self::TooManyUploads(_) => "too_many_uploads",
            Self::TooManyOpenUploads => "too_many_open_uploads",
            Self::PayloadTooLarge(_) => "payload_too_large",
            Self::LockTimeout => "lock_timeout",
            Self::LockLost => "lock_lost",
            Self::WriteConflict => "write_conflict",
            Self::UploadExpired => "upload_expired",
            Self::DependencyUnavailable(_) => "dependency_unavailable",
            Self::MemoryBusy(_) => "memory_busy",
            Self::OutcomeUnknown(_) => "outcome_unknown",
            Self::QuotaExceeded => "quota_exceeded",
            Self::ContainerFull(_) => "container_full",
            Self::TooManyKeys(_) => "too_many_keys",
            Self::TooManyTokens(_) => "too_many_tokens",
            Self::DigestMismatch(_) => "digest_mismatch",
            Self::UnsupportedMediaType(_) => "unsupported_media_type",
            Self::LinkInvalid => "link_invalid",
            Self::LinkExpired => "link_expired",
            Self::LinkRevoked => "link_revoked",
            Self::CursorExpired(_) => "cursor_expired",
            Self::IdempotencyKeyMismatch => "idempotency_key_mismatch",
            Self::IdempotencyKeyInFlight => "idempotency_key_in_flight",
            Self::RejectedByHook(_) => "rejected_by_hook",
            Self::DeadLettered(_) => "dead_lettered",
            Self::Internal(_) => "internal",
        }
    }

    pub fn internal(e: impl Into<anyhow::Error>) -> Self {
        Self::Internal(e.into())
    }
}

fn outcome_unknown_message(location: Option<&str>) -> String {
    let read = match location {
        Some(l) => format!("read {l} to find out"),
        None => "read the resource to find out".into(),
    };
    format!("the metadata store did not confirm the change; it may or may not have applied: {read}")
}

impl From<MetaError> for DomainError {
    fn from(e: MetaError) -> Self {
        match e {
            // Another writer moved the upload on: contention, as a conflict.
            MetaError::WriteConflict | MetaError::Moved => Self::WriteConflict,
            MetaError::StaleFence => Self::LockLost,
            MetaError::IntentGone => Self::UploadExpired,
            MetaError::AlreadyApplied => {
                Self::internal(anyhow::anyhow!("operation already applied"))
            }
            MetaError::QuotaExceeded => Self::QuotaExceeded,
            MetaError::TooManyOpenUploads => Self::TooManyOpenUploads,
            MetaError::NotFound => Self::NotFound,
            // The user is being deleted, or the caller's key was revoked
            // (perhaps while the request ran; another instance's cached
            // authentication let it in): the credential holds no more.
            MetaError::UserDeleting | MetaError::MinterRevoked => Self::Unauthenticated,
            MetaError::TooManyKeys(max) => Self::TooManyKeys(max),
            MetaError::TooManyTokens(max) => Self::TooManyTokens(max),
            MetaError::ContainerFull(max)
            | MetaError::Refused(crate::meta::Refusal::ContainerFull(max)) => {
                Self::ContainerFull(max)
            }
            MetaError::Refused(crate::meta::Refusal::NotFound) => Self::NotFound,
            MetaError::Refused(_) => Self::DeadLettered(
                "the operation was settled without applying before (dead-lettered or cancelled)"
                    .into(),
            ),
            MetaError::Unavailable(_) | MetaError::Transient(_) => {
                Self::DependencyUnavailable("metadata store")
            }
            MetaError::OutcomeUnknown(_) => Self::OutcomeUnknown(None),
            e @ (MetaError::Duplicate | MetaError::Other(_)) => Self::internal(e),
        }
    }
}

impl From<BlobError> for DomainError {
    fn from(e: BlobError) -> Self {
        match e {
            BlobError::Body(body) => body.into(),
            BlobError::Unavailable(_) => Self::DependencyUnavailable("blob store"),
            // Another request's bytes: contention, as a conflict.
            BlobError::Conflict(_) => Self::WriteConflict,
            e @ (BlobError::NotFound | BlobError::Other(_)) => Self::internal(e),
        }
    }
}

/// A failed body stream, as the client's error.
impl From<BodyError> for DomainError {
    fn from(e: BodyError) -> Self {
        match e {
            e @ BodyError::Idle(_) => Self::RequestTimeout(e.to_string()),
            BodyError::TooLarge(limit) => Self::PayloadTooLarge(limit),
            BodyError::QuotaExceeded => Self::QuotaExceeded,
            BodyError::Invalid(why) => Self::InvalidRequest(why),
            BodyError::Read(e) => {
                Self::InvalidRequest(format!("the request body could not be read: {e}"))
            }
            BodyError::MemoryBusy(waited) => Self::MemoryBusy(waited),
            // Only a tus PATCH is asked to let go (it answers `Released`).
            BodyError::LetGo => Self::LockLost,
        }
    }
}

impl From<LockError> for DomainError {
    fn from(e: LockError) -> Self {
        match e {
            LockError::Timeout(_) => Self::LockTimeout,
            // Misrouted: Redis refused before running anything, so a 503
            // (nothing happened, try again) is the truthful answer.
            LockError::Unavailable(_) | LockError::Misrouted(_) => {
                Self::DependencyUnavailable("lock backend")
            }
        }
    }
}

impl From<CoordError> for DomainError {
    fn from(e: CoordError) -> Self {
        match e {
            CoordError::Lock(e) => e.into(),
            CoordError::Meta(e) => e.into(),
            CoordError::OutcomeUnknown(path) => Self::OutcomeUnknown(Some(path)),
            CoordError::Cancelled => Self::LockTimeout,
            CoordError::DeadLettered(message) => Self::DeadLettered(message),
        }
    }
}
