//! `/v1/uploads`: resumable uploads, tus 1.0 (core, creation,
//! creation-with-upload, creation-defer-length, termination, expiration,
//! checksum). The upload id
//! is the id the file commits under: after the last PATCH it is at
//! `/v1/files/{id}`.

use std::{
    io,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
};

use axum::{
    body::Body,
    extract::{Path, Request, State},
    http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header},
    middleware::Next,
    response::{IntoResponse, Response},
};
use base64::Engine;
use futures::TryStreamExt;

use super::{
    drain,
    error::{ApiError, error_body},
    extract::{AuthUser, media_type, path_id},
    state::AppState,
};
use crate::{
    blob::{BodyError, ByteStream},
    domain::{
        DomainError, Filename,
        resumable::{CHECKSUM_ALGORITHMS, Checksum, NewResumable, Patched, ResumableError},
    },
    meta::{MetaError, ResumableRecord},
    vocab::FileId,
};

/// The protocol version this server speaks.
pub const TUS_VERSION: &str = "1.0.0";
const TUS_EXTENSIONS: &str =
    "creation,creation-with-upload,creation-defer-length,termination,expiration,checksum";
/// A PATCH body's media type.
const OFFSET_OCTET_STREAM: &str = "application/offset+octet-stream";
/// The name of an upload whose metadata names none.
const DEFAULT_FILENAME: &str = "upload";

const TUS_RESUMABLE: HeaderName = HeaderName::from_static("tus-resumable");
const UPLOAD_OFFSET: HeaderName = HeaderName::from_static("upload-offset");
const UPLOAD_LENGTH: HeaderName = HeaderName::from_static("upload-length");
const UPLOAD_METADATA: HeaderName = HeaderName::from_static("upload-metadata");
const UPLOAD_EXPIRES: HeaderName = HeaderName::from_static("upload-expires");
const UPLOAD_CHECKSUM: HeaderName = HeaderName::from_static("upload-checksum");
const UPLOAD_DEFER_LENGTH: HeaderName = HeaderName::from_static("upload-defer-length");
/// A completed upload's file id (its `HEAD`, the final PATCH's answer).
const FILE_ID: HeaderName = HeaderName::from_static("filedock-file-id");

/// The headers a browser client sends and reads (CORS).
pub const REQUEST_HEADERS: [HeaderName; 6] = [
    TUS_RESUMABLE,
    UPLOAD_OFFSET,
    UPLOAD_LENGTH,
    UPLOAD_METADATA,
    UPLOAD_CHECKSUM,
    UPLOAD_DEFER_LENGTH,
];
pub const RESPONSE_HEADERS: [&str; 11] = [
    "tus-resumable",
    "tus-version",
    "tus-extension",
    "tus-max-size",
    "tus-checksum-algorithm",
    "upload-offset",
    "upload-length",
    "upload-defer-length",
    "upload-metadata",
    "upload-expires",
    "filedock-file-id",
];

/// A `/v1/uploads` failure: one only tus knows, or any other API error.
#[derive(Debug)]
pub enum TusError {
    /// The request does not say `Tus-Resumable: 1.0.0`: 412 with `Tus-Version`.
    Version,
    /// A PATCH from another offset than the upload's: 409 `offset_mismatch`.
    OffsetMismatch(u64),
    /// Another PATCH is writing to the upload: 423 `upload_locked`.
    Locked,
    /// Another request stopped this PATCH (what arrived is kept): 423 `upload_locked`.
    Released,
    /// The body does not match its `Upload-Checksum`: 460 (the checksum
    /// extension's Checksum Mismatch) `checksum_mismatch`.
    ChecksumMismatch,
    /// The instance is shutting down and cut the body (what arrived is
    /// kept, unless a checksum needed all of it): 503 `draining`, with
    /// `Retry-After` and the connection closed.
    Draining,
    Api(ApiError),
}

/// tus's checksum extension: 460 Checksum Mismatch.
const CHECKSUM_MISMATCH: u16 = 460;

impl IntoResponse for TusError {
    fn into_response(self) -> Response {
        let (status, code, message) = match self {
            Self::Version => {
                let message = format!("send Tus-Resumable: {TUS_VERSION}");
                let status = StatusCode::PRECONDITION_FAILED;
                let mut res = error_body(status, "precondition_failed", message);
                res.headers_mut()
                    .insert("tus-version", HeaderValue::from_static(TUS_VERSION));
                return res;
            }
            Self::Api(e) => return e.into_response(),
            Self::OffsetMismatch(at) => {
                let message = ResumableError::OffsetMismatch(at).to_string();
                let mut res = error_body(StatusCode::CONFLICT, "offset_mismatch", message);
                // Where the upload is: the client resumes from it.
                res.headers_mut()
                    .insert(UPLOAD_OFFSET, HeaderValue::from(at));
                return res;
            }
            Self::Locked => (
                StatusCode::LOCKED,
                "upload_locked",
                ResumableError::Locked.to_string(),
            ),
            Self::Released => (
                StatusCode::LOCKED,
                "upload_locked",
                ResumableError::Released.to_string(),
            ),
            Self::ChecksumMismatch => (
                StatusCode::from_u16(CHECKSUM_MISMATCH).unwrap_or(StatusCode::BAD_REQUEST),
                "checksum_mismatch",
                ResumableError::ChecksumMismatch.to_string(),
            ),
            Self::Draining => {
                let message =
                    "this instance is shutting down; HEAD gives the offset to resume from";
                let status = StatusCode::SERVICE_UNAVAILABLE;
                let mut res = error_body(status, "draining", message.into());
                res.headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
                return res;
            }
        };
        error_body(status, code, message)
    }
}

impl TusError {
    fn is_outcome_unknown(&self) -> bool {
        matches!(
            self,
            Self::Api(ApiError::Domain(DomainError::OutcomeUnknown(_)))
        )
    }
}

impl From<ResumableError> for TusError {
    fn from(e: ResumableError) -> Self {
        match e {
            ResumableError::OffsetMismatch(at) => Self::OffsetMismatch(at),
            ResumableError::Locked => Self::Locked,
            ResumableError::Released => Self::Released,
            ResumableError::ChecksumMismatch => Self::ChecksumMismatch,
            ResumableError::Domain(e) => Self::Api(e.into()),
        }
    }
}

macro_rules! via_api {
    ($($from:ty),*) => {$(
        impl From<$from> for TusError {
            fn from(e: $from) -> Self {
                Self::Api(e.into())
            }
        }
    )*};
}

via_api!(ApiError, DomainError, MetaError);

type TusResult = Result<Response, TusError>;

/// Every `/v1/uploads` response carries `Tus-Resumable`, errors included.
pub async fn tus_resumable_header(req: Request, next: Next) -> Response {
    let tus = req.uri().path().starts_with("/v1/uploads");
    let mut res = next.run(req).await;
    if tus {
        res.headers_mut()
            .insert(TUS_RESUMABLE, HeaderValue::from_static(TUS_VERSION));
    }
    res
}

/// `OPTIONS /v1/uploads[/{id}]`: what this server supports (no key needed).
pub async fn options(State(state): State<AppState>) -> Response {
    let mut res = StatusCode::NO_CONTENT.into_response();
    let h = res.headers_mut();
    h.insert("tus-version", HeaderValue::from_static(TUS_VERSION));
    h.insert("tus-extension", HeaderValue::from_static(TUS_EXTENSIONS));
    h.insert(
        "tus-max-size",
        HeaderValue::from(state.settings.max_upload_bytes),
    );
    h.insert(
        "tus-checksum-algorithm",
        HeaderValue::from_static(CHECKSUM_ALGORITHMS),
    );
    res
}

/// `POST /v1/uploads` (creation, creation-with-upload) → 201 + `Location`.
pub async fn create(
    AuthUser(user): AuthUser,
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Body,
) -> TusResult {
    check_version(&headers)?;
    let length = creation_length(&headers)?;
    let raw_metadata = text(&headers, UPLOAD_METADATA).unwrap_or_default();
    let (filename, filetype) = metadata(raw_metadata)?;
    let new = NewResumable {
        length,
        filename: Filename::parse(filename.as_deref().unwrap_or(DEFAULT_FILENAME))
            .map_err(ApiError::invalid)?,
        content_type: media_type(filetype.as_deref())?,
        metadata: raw_metadata.to_owned(),
    };
    let with_body = content_type(&headers) == Some(OFFSET_OCTET_STREAM);
    let checksum = checksum(&headers)?;
    let created = state.resumables.create(&user, new).await?;
    let mut upload = created.clone();
    // An empty file is complete on creation (tus-js-client sends no PATCH for it).
    if with_body || length == Some(0) {
        // creation-with-upload: the upload exists whatever becomes of its
        // first bytes; the client learns from Upload-Offset what was kept.
        let at = PatchAt {
            offset: 0,
            length: None,
            checksum,
        };
        let patched = run_patch(&state, user.clone(), created.id, at, body).await;
        upload = match patched {
            Ok(patched) => patched.into_upload(),
            Err(e) => match state.resumables.find(&user, &created.id).await {
                // Still open: the client learns from Upload-Offset what was kept.
                Ok(open) if !open.all_stored() => open,
                // Its last bytes arrived but the file was refused: that is
                // the answer, and a client that never learnt the upload's
                // address cannot retry it, so nothing of it stays.
                Ok(_) if !e.is_outcome_unknown() => {
                    if let Err(t) = state.resumables.terminate(&user, &created.id).await {
                        tracing::warn!(upload = %created.id, error = %t, "a refused upload is left to expire");
                    }
                    return Err(e);
                }
                // Over, or its commit's outcome is unknown (its HEAD settles it).
                _ => return Err(e),
            },
        };
    }
    let mut res = StatusCode::CREATED.into_response();
    let h = res.headers_mut();
    h.insert(
        header::LOCATION,
        value(&format!("/v1/uploads/{}", upload.id))?,
    );
    progress_headers(h, &upload);
    Ok(res)
}

/// `HEAD /v1/uploads/{id}`: the offset to resume from.
pub async fn head(
    AuthUser(user): AuthUser,
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> TusResult {
    check_version(&headers)?;
    let upload = state.resumables.head(&user, &path_id(&id)?).await?;
    let mut res = StatusCode::OK.into_response();
    let h = res.headers_mut();
    progress_headers(h, &upload);
    if let Some(length) = upload.length {
        h.insert(UPLOAD_LENGTH, HeaderValue::from(length));
    }
    if !upload.metadata.is_empty() {
        h.insert(UPLOAD_METADATA, value(&upload.metadata)?);
    }
    if upload.length.is_none() {
        h.insert(UPLOAD_DEFER_LENGTH, HeaderValue::from_static(DEFERRED));
    }
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(res)
}

/// `PATCH /v1/uploads/{id}`: the bytes from `Upload-Offset` on → 204.
pub async fn patch(
    AuthUser(user): AuthUser,
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> TusResult {
    check_version(&headers)?;
    if content_type(&headers) != Some(OFFSET_OCTET_STREAM) {
        return Err(DomainError::UnsupportedMediaType(format!(
            "a PATCH body is {OFFSET_OCTET_STREAM}"
        ))
        .into());
    }
    let offset = number(&headers, UPLOAD_OFFSET)?
        .ok_or_else(|| ApiError::invalid("Upload-Offset is required"))?;
    let at = PatchAt {
        offset,
        // Declares a deferred length (creation-defer-length), once.
        length: number(&headers, UPLOAD_LENGTH)?,
        checksum: checksum(&headers)?,
    };
    let upload = run_patch(&state, user, path_id(&id)?, at, body)
        .await?
        .into_upload();
    let mut res = StatusCode::NO_CONTENT.into_response();
    progress_headers(res.headers_mut(), &upload);
    Ok(res)
}

/// `DELETE /v1/uploads/{id}` (termination) → 204.
pub async fn terminate(
    AuthUser(user): AuthUser,
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> TusResult {
    check_version(&headers)?;
    state.resumables.terminate(&user, &path_id(&id)?).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// Runs the PATCH in a task of its own: when the client cuts the
/// connection, the server drops the request's future, but what arrived
/// must still be stored (and the lock released) for the client's `HEAD`.
async fn run_patch(
    state: &AppState,
    user: crate::meta::UserRecord,
    id: FileId,
    at: PatchAt,
    body: Body,
) -> Result<Patched, TusError> {
    let PatchAt {
        offset,
        length,
        checksum,
    } = at;
    let service = state.resumables.clone();
    let body: ByteStream<'static> = Box::pin(
        body.into_data_stream()
            .map_err(|e| BodyError::Read(io::Error::other(e))),
    );
    // Cut when the instance drains: what arrived is stored as for a client gone.
    let drained = Arc::new(AtomicBool::new(false));
    let body = drain::cut_when_closing(body, &state.drain, drained.clone());
    let task = tokio::spawn(async move {
        service
            .patch(&user, &id, offset, length, checksum, body)
            .await
    });
    match task.await {
        // The cut's answer (a body that could not be read), told truly.
        Ok(Err(ResumableError::Domain(DomainError::InvalidRequest(_))))
            if drained.load(Ordering::SeqCst) =>
        {
            Err(TusError::Draining)
        }
        Ok(patched) => patched.map_err(TusError::from),
        // The task's panic is the handler's: the panic layer answers and counts it.
        Err(e) => match e.try_into_panic() {
            Ok(panic) => std::panic::resume_unwind(panic),
            Err(cancelled) => Err(ApiError::internal(cancelled).into()),
        },
    }
}

/// A PATCH's headers: where it starts, the length it declares, its checksum.
struct PatchAt {
    offset: u64,
    length: Option<u64>,
    checksum: Option<Checksum>,
}

/// The one value `Upload-Defer-Length` has.
const DEFERRED: &str = "1";

/// A creation's length: `Upload-Length`, or `None` with
/// `Upload-Defer-Length: 1` (creation-defer-length); one of them, not both.
fn creation_length(headers: &HeaderMap) -> Result<Option<u64>, ApiError> {
    let length = number(headers, UPLOAD_LENGTH)?;
    let Some(defer) = headers.get(UPLOAD_DEFER_LENGTH) else {
        return length
            .map(Some)
            .ok_or_else(|| ApiError::invalid("send Upload-Length, or Upload-Defer-Length: 1"));
    };
    if defer.as_bytes() != DEFERRED.as_bytes() {
        return Err(ApiError::invalid("Upload-Defer-Length must be 1"));
    }
    match length {
        Some(_) => Err(ApiError::invalid(
            "send Upload-Length or Upload-Defer-Length, not both",
        )),
        None => Ok(None),
    }
}

fn progress_headers(h: &mut HeaderMap, upload: &ResumableRecord) {
    h.insert(UPLOAD_OFFSET, HeaderValue::from(upload.offset));
    if upload.committed
        && let Ok(v) = HeaderValue::from_str(&upload.id.to_string())
    {
        // Complete: the file is at /v1/files/{id}.
        h.insert(FILE_ID, v);
    }
    if !upload.all_stored()
        && let Ok(v) = HeaderValue::from_str(&http_date(upload.expires_at))
    {
        h.insert(UPLOAD_EXPIRES, v);
    }
}

/// RFC 9110's IMF-fixdate.
fn http_date(t: chrono::DateTime<chrono::Utc>) -> String {
    t.format("%a, %d %b %Y %H:%M:%S GMT").to_string()
}

fn check_version(headers: &HeaderMap) -> Result<(), TusError> {
    match text(headers, TUS_RESUMABLE) {
        Some(TUS_VERSION) => Ok(()),
        _ => Err(TusError::Version),
    }
}

fn text(headers: &HeaderMap, name: HeaderName) -> Option<&str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

fn content_type(headers: &HeaderMap) -> Option<&str> {
    text(headers, header::CONTENT_TYPE).map(|v| v.split(';').next().unwrap_or("").trim())
}

fn number(headers: &HeaderMap, name: HeaderName) -> Result<Option<u64>, ApiError> {
    let Some(v) = headers.get(&name) else {
        return Ok(None);
    };
    let n = v
        .to_str()
        .ok()
        .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|s| s.parse().ok());
    n.map(Some)
        .ok_or_else(|| ApiError::invalid(format!("{name} must be a non-negative integer")))
}

fn checksum(headers: &HeaderMap) -> Result<Option<Checksum>, ApiError> {
    text(headers, UPLOAD_CHECKSUM)
        .map(|v| Checksum::parse(v).map_err(ApiError::invalid))
        .transpose()
}

fn value(s: &str) -> Result<HeaderValue, ApiError> {
    HeaderValue::from_str(s).map_err(ApiError::internal)
}

/// `filename` and `filetype` from `Upload-Metadata` (`key base64,key base64`).
fn metadata(raw: &str) -> Result<(Option<String>, Option<String>), ApiError> {
    let (mut filename, mut filetype) = (None, None);
    for pair in raw.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (key, encoded) = pair.split_once(' ').unwrap_or((pair, ""));
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(encoded.trim())
            .ok()
            .and_then(|b| String::from_utf8(b).ok())
            .ok_or_else(|| {
                ApiError::invalid(format!("Upload-Metadata: {key:?} is not base64 of UTF-8"))
            })?;
        match key {
            "filename" => filename = Some(decoded),
            "filetype" => filetype = Some(decoded),
            _ => {}
        }
    }
    Ok((filename, filetype))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_gives_the_name_and_type() {
        let (name, kind) = metadata("filename d29ybGRfZG9taW5hdGlvbl9wbGFuLnBkZg==,is_confidential,filetype YXBwbGljYXRpb24vcGRm").unwrap();
        assert_eq!(name.as_deref(), Some("world_domination_plan.pdf"));
        assert_eq!(kind.as_deref(), Some("application/pdf"));
        assert!(metadata("filename ***").is_err());
    }
}
