//! `ApiError`: every failure a client can see, mapped to a status and the
//! documented body `{"error":{"code","message","request_id"}}`.

use axum::{
    Json,
    http::{HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
};
use serde_json::json;

use crate::{domain::DomainError, meta::MetaError};

tokio::task_local! {
    /// The current request's id, set by the request-id middleware.
    pub static REQUEST_ID: String;
}

pub fn current_request_id() -> String {
    REQUEST_ID.try_with(Clone::clone).unwrap_or_default()
}

/// A failure as the client sees it: a domain error, or one only HTTP knows.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error(transparent)]
    Domain(#[from] DomainError),
    #[error("this path does not take that method")]
    MethodNotAllowed,
    #[error("the range is outside the file ({size} bytes)")]
    RangeNotSatisfiable { size: u64 },
    /// `If-Match` names another version of the file.
    #[error("If-Match names no current version of this file")]
    PreconditionFailed,
    /// A valid user key on an admin route.
    #[error("this operation needs the admin key")]
    Forbidden,
}

impl ApiError {
    pub fn status(&self) -> StatusCode {
        use DomainError as D;
        let domain = match self {
            Self::MethodNotAllowed => return StatusCode::METHOD_NOT_ALLOWED,
            Self::RangeNotSatisfiable { .. } => return StatusCode::RANGE_NOT_SATISFIABLE,
            Self::Forbidden => return StatusCode::FORBIDDEN,
            Self::PreconditionFailed => return StatusCode::PRECONDITION_FAILED,
            Self::Domain(d) => d,
        };
        match domain {
            D::Unauthenticated => StatusCode::UNAUTHORIZED,
            D::NotFound => StatusCode::NOT_FOUND,
            D::InvalidRequest(_) | D::DigestMismatch(_) => StatusCode::BAD_REQUEST,
            D::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            D::LinkInvalid | D::LinkExpired | D::LinkRevoked | D::Forbidden(_) => {
                StatusCode::FORBIDDEN
            }
            D::RequestTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            D::TooManyUploads(_) => StatusCode::TOO_MANY_REQUESTS,
            // Not retried after a pause (no `Retry-After`): an open upload has to end first.
            D::TooManyOpenUploads => StatusCode::TOO_MANY_REQUESTS,
            D::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            // Contention is the client's to retry, not an outage: a load
            // balancer must not count it against the instance's health.
            D::LockTimeout => StatusCode::TOO_MANY_REQUESTS,
            D::LockLost | D::WriteConflict | D::UploadExpired => StatusCode::CONFLICT,
            D::DependencyUnavailable(_) | D::MemoryBusy(_) => StatusCode::SERVICE_UNAVAILABLE,
            D::OutcomeUnknown(_) => StatusCode::GATEWAY_TIMEOUT,
            D::CursorExpired(_) => StatusCode::GONE,
            D::QuotaExceeded => StatusCode::INSUFFICIENT_STORAGE,
            D::IdempotencyKeyMismatch | D::RejectedByHook(_) => StatusCode::UNPROCESSABLE_ENTITY,
            D::IdempotencyKeyInFlight
            | D::ContainerFull(_)
            | D::TooManyKeys(_)
            | D::TooManyTokens(_) => StatusCode::CONFLICT,
            D::Internal(_) | D::DeadLettered(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The stable, documented error code.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Domain(d) => d.code(),
            Self::MethodNotAllowed => "method_not_allowed",
            Self::RangeNotSatisfiable { .. } => "range_not_satisfiable",
            Self::Forbidden => "forbidden",
            Self::PreconditionFailed => "precondition_failed",
        }
    }

    /// A `500 internal`, its cause logged and never shown.
    pub fn internal(e: impl Into<anyhow::Error>) -> Self {
        DomainError::internal(e).into()
    }

    /// A `400 invalid_request` with this message.
    pub fn invalid(why: impl Into<String>) -> Self {
        DomainError::InvalidRequest(why.into()).into()
    }
}

/// Seconds a client told `memory_busy` waits before it tries again: the
/// uploads that held the memory have had time to move on by then.
const MEMORY_BUSY_RETRY_AFTER: &str = "5";

/// The documented error body, `{"error":{"code","message","request_id"}}`,
/// with `status`.
pub fn error_body(status: StatusCode, code: &str, message: String) -> Response {
    let body = json!({"error": {
        "code": code,
        "message": message,
        "request_id": current_request_id(),
    }});
    (status, Json(body)).into_response()
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        if let Self::Domain(DomainError::Internal(e)) = &self {
            tracing::error!(error = ?e, "internal error");
        } else if status.is_server_error() {
            tracing::warn!(code = self.code(), "{self}");
        }
        let mut res = error_body(status, self.code(), self.to_string());
        let headers = res.headers_mut();
        use DomainError as D;
        match &self {
            Self::Domain(
                D::LockTimeout
                | D::LockLost
                | D::WriteConflict
                | D::UploadExpired
                | D::TooManyUploads(_)
                | D::IdempotencyKeyInFlight
                | D::DependencyUnavailable(_),
            ) => {
                headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            }
            Self::Domain(D::MemoryBusy(_)) => {
                headers.insert(
                    header::RETRY_AFTER,
                    HeaderValue::from_static(MEMORY_BUSY_RETRY_AFTER),
                );
            }
            Self::Domain(D::OutcomeUnknown(location)) => {
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
            Self::Domain(D::Unauthenticated) => {
                headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            _ => {}
        }
        res
    }
}

/// The ports' errors reach HTTP through the domain's mapping.
macro_rules! via_domain {
    ($($port:ty),*) => {$(
        impl From<$port> for ApiError {
            fn from(e: $port) -> Self {
                DomainError::from(e).into()
            }
        }
    )*};
}

via_domain!(MetaError);

/// Everything the HTTP layer can fail with becomes an `ApiError` response.
pub type ApiResult<T = Response> = Result<T, ApiError>;

/// A handler's success.
pub fn ok<T: IntoResponse>(v: T) -> ApiResult {
    Ok(v.into_response())
}

/// The answer to a change that applied: `200` with what it changed as
/// `view` shows it, or `204` when that was deleted right after (the change
/// applied all the same: failing it would be untrue).
pub fn applied<T, V: IntoResponse>(after: Option<T>, view: impl FnOnce(T) -> V) -> ApiResult {
    match after {
        Some(changed) => ok(view(changed)),
        None => ok(StatusCode::NO_CONTENT),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contention_is_never_answered_as_an_outage() {
        for e in [
            DomainError::LockTimeout,
            DomainError::LockLost,
            DomainError::WriteConflict,
            DomainError::UploadExpired,
        ]
        .map(ApiError::from)
        {
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
