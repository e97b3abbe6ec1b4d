//! `ApiError`: every failure a client can see, mapped to a status and the
//! documented body `{"error":{"code","message","request_id"}}`.

use axum::{
    Json,
    extract::rejection::{JsonRejection, QueryRejection},
    http::{HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
};
use serde_json::json;

use crate::{blob::BlobError, lock::LockError, meta::MetaError};

tokio::task_local! {
    /// The current request's id, set by the request-id middleware.
    pub static REQUEST_ID: String;
}

pub fn current_request_id() -> String {
    REQUEST_ID.try_with(Clone::clone).unwrap_or_default()
}

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("missing or invalid API key")]
    Unauthenticated,
    /// Also for other users' resources: existence is never revealed.
    #[error("not found")]
    NotFound,
    #[error("{0}")]
    InvalidRequest(String),
    #[error("this path does not take that method")]
    MethodNotAllowed,
    /// The client stopped sending the body.
    #[error("{0}")]
    RequestTimeout(String),
    /// The user has as many uploads in flight as one instance allows.
    #[error("too many uploads in flight for this user (at most {0}); try again")]
    TooManyUploads(usize),
    #[error("the body is larger than the limit of {0} bytes")]
    PayloadTooLarge(u64),
    #[error("the range is outside the file ({size} bytes)")]
    RangeNotSatisfiable { size: u64 },
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
    /// The change was sent to the metadata store but its answer was lost: it
    /// may or may not have applied. `Some(path)` names the resource to read
    /// to find out (also sent as `Location`).
    #[error("{}", outcome_unknown_message(.0.as_deref()))]
    OutcomeUnknown(Option<String>),
    #[error("storage quota exceeded")]
    QuotaExceeded,
    /// A queued operation kept failing and was moved to the dead-letter queue.
    #[error("{0}")]
    DeadLettered(String),
    #[error("internal error")]
    Internal(#[source] anyhow::Error),
}

impl ApiError {
    pub fn status(&self) -> StatusCode {
        match self {
            Self::Unauthenticated => StatusCode::UNAUTHORIZED,
            Self::NotFound => StatusCode::NOT_FOUND,
            Self::InvalidRequest(_) => StatusCode::BAD_REQUEST,
            Self::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Self::RequestTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            Self::TooManyUploads(_) => StatusCode::TOO_MANY_REQUESTS,
            Self::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Self::RangeNotSatisfiable { .. } => StatusCode::RANGE_NOT_SATISFIABLE,
            // Contention is the client's to retry, not an outage: a load
            // balancer must not count it against the instance's health.
            Self::LockTimeout => StatusCode::TOO_MANY_REQUESTS,
            Self::LockLost | Self::WriteConflict | Self::UploadExpired => StatusCode::CONFLICT,
            Self::DependencyUnavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::OutcomeUnknown(_) => StatusCode::GATEWAY_TIMEOUT,
            Self::QuotaExceeded => StatusCode::INSUFFICIENT_STORAGE,
            Self::Internal(_) | Self::DeadLettered(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The stable, documented error code.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Unauthenticated => "unauthenticated",
            Self::NotFound => "not_found",
            Self::InvalidRequest(_) => "invalid_request",
            Self::MethodNotAllowed => "method_not_allowed",
            Self::RequestTimeout(_) => "request_timeout",
            Self::TooManyUploads(_) => "too_many_uploads",
            Self::PayloadTooLarge(_) => "payload_too_large",
            Self::RangeNotSatisfiable { .. } => "range_not_satisfiable",
            Self::LockTimeout => "lock_timeout",
            Self::LockLost => "lock_lost",
            Self::WriteConflict => "write_conflict",
            Self::UploadExpired => "upload_expired",
            Self::DependencyUnavailable(_) => "dependency_unavailable",
            Self::OutcomeUnknown(_) => "outcome_unknown",
            Self::QuotaExceeded => "quota_exceeded",
            Self::DeadLettered(_) => "dead_lettered",
            Self::Internal(_) => "internal",
        }
    }

    pub fn internal(e: impl Into<anyhow::Error>) -> Self {
        Self::Internal(e.into())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        if let Self::Internal(e) = &self {
            tracing::error!(error = ?e, "internal error");
        } else if status.is_server_error() {
            tracing::warn!(code = self.code(), "{self}");
        }
        let body = json!({"error": {
            "code": self.code(),
            "message": self.to_string(),
            "request_id": current_request_id(),
        }});
        let mut res = (status, Json(body)).into_response();
        let headers = res.headers_mut();
        match &self {
            Self::LockTimeout
            | Self::LockLost
            | Self::WriteConflict
            | Self::UploadExpired
            | Self::TooManyUploads(_)
            | Self::DependencyUnavailable(_) => {
                headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            }
            Self::OutcomeUnknown(location) => {
                headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
                if let Some(v) = location
                    .as_deref()
                    .and_then(|l| HeaderValue::from_str(l).ok())
                {
                    headers.insert(header::LOCATION, v);
                }
            }
            Self::RangeNotSatisfiable { size } => {
                if let Ok(v) = HeaderValue::from_str(&format!("bytes */{size}")) {
                    headers.insert(header::CONTENT_RANGE, v);
                }
            }
            Self::Unauthenticated => {
                headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            _ => {}
        }
        res
    }
}

fn outcome_unknown_message(location: Option<&str>) -> String {
    let read = match location {
        Some(l) => format!("read {l} to find out"),
        None => "read the resource to find out".into(),
    };
    format!("the metadata store did not confirm the change; it may or may not have applied: {read}")
}

impl From<MetaError> for ApiError {
    fn from(e: MetaError) -> Self {
        match e {
            MetaError::WriteConflict => Self::WriteConflict,
            MetaError::StaleFence => Self::LockLost,
            MetaError::IntentGone => Self::UploadExpired,
            MetaError::AlreadyApplied => {
                Self::internal(anyhow::anyhow!("operation already applied"))
            }
            MetaError::QuotaExceeded => Self::QuotaExceeded,
            MetaError::NotFound => Self::NotFound,
            MetaError::Unavailable(_) | MetaError::Transient(_) => {
                Self::DependencyUnavailable("metadata store")
            }
            MetaError::OutcomeUnknown(_) => Self::OutcomeUnknown(None),
            e @ (MetaError::Duplicate | MetaError::Other(_)) => Self::internal(e),
        }
    }
}

impl From<BlobError> for ApiError {
    fn from(e: BlobError) -> Self {
        match e {
            BlobError::Body(io) => crate::domain::upload::body_error(io),
            BlobError::Unavailable(_) => Self::DependencyUnavailable("blob store"),
            e @ (BlobError::NotFound | BlobError::Other(_)) => Self::internal(e),
        }
    }
}

impl From<LockError> for ApiError {
    fn from(e: LockError) -> Self {
        match e {
            LockError::Timeout(_) => Self::LockTimeout,
            LockError::Unavailable(_) => Self::DependencyUnavailable("lock backend"),
        }
    }
}

impl From<JsonRejection> for ApiError {
    fn from(e: JsonRejection) -> Self {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            return Self::PayloadTooLarge(crate::http::JSON_BODY_LIMIT as u64);
        }
        Self::InvalidRequest(e.body_text())
    }
}

impl From<QueryRejection> for ApiError {
    fn from(e: QueryRejection) -> Self {
        Self::InvalidRequest(e.body_text())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contention_is_never_answered_as_an_outage() {
        for e in [
            ApiError::LockTimeout,
            ApiError::LockLost,
            ApiError::WriteConflict,
            ApiError::UploadExpired,
        ] {
            assert!(
                matches!(e.status().as_u16(), 409 | 429),
                "{} is {}",
                e.code(),
                e.status()
            );
        }
        assert_eq!(
            ApiError::from(MetaError::Transient("link cut".into())).code(),
            "dependency_unavailable",
            "a transaction aborted by a dropped link is an outage, not contention"
        );
        assert_eq!(
            ApiError::from(MetaError::OutcomeUnknown("link cut".into())).status(),
            StatusCode::GATEWAY_TIMEOUT
        );
    }
}
