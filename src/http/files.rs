//! `/v1/files`: upload, list, metadata, content, delete.

use std::io;

use axum::{
    Json,
    body::Body,
    extract::{Path, State},
    http::{HeaderMap, HeaderValue, StatusCode, header},
    response::IntoResponse,
};
use futures::TryStreamExt;
use percent_encoding::{NON_ALPHANUMERIC, utf8_percent_encode};
use serde::{Deserialize, Serialize};

use super::error::ApiError;
use super::{
    ApiResult, AppState,
    extract::{AppQuery, AuthUser},
    multipart, ok,
};
use crate::{
    blob::{BodyError, ByteRange},
    domain::{Filename, MediaType, upload::NewUpload},
    meta::FileRecord,
};

/// A file as the API shows it.
#[derive(Serialize)]
pub struct FileView {
    id: String,
    filename: String,
    size: i64,
    content_type: String,
    sha256: String,
    category: String,
    created_at: chrono::DateTime<chrono::Utc>,
}

impl From<FileRecord> for FileView {
    fn from(f: FileRecord) -> Self {
        Self {
            id: f.id,
            filename: f.filename,
            size: f.size,
            content_type: f.content_type,
            sha256: f.sha256,
            category: f.category,
            created_at: f.created_at,
        }
    }
}

/// The name of an upload that came without one.
const DEFAULT_FILENAME: &str = "upload";

#[derive(Deserialize)]
pub struct UploadQuery {
    filename: Option<String>,
}

fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(v) = headers.get("idempotency-key") else {
        return Ok(None);
    };
    match v.to_str() {
        Ok(k) if !k.is_empty() && k.len() <= 255 && k.bytes().all(|b| b.is_ascii_graphic()) => {
            Ok(Some(k.to_owned()))
        }
        _ => Err(ApiError::invalid(
            "Idempotency-Key must be 1 to 255 visible ASCII characters",
        )),
    }
}

fn header_str(headers: &HeaderMap, name: header::HeaderName) -> Option<&str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// `POST /v1/files`: a raw body (`?filename=`) or `multipart/form-data` with a `file` part.
pub async fn upload(
    AuthUser(user): AuthUser,
    State(state): State<AppState>,
    AppQuery(q): AppQuery<UploadQuery>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult {
    // Content-Length, or 0 for a request that has no body at all.
    let declared_len = http_body::Body::size_hint(&body).exact();
    let idempotency_key = idempotency_key(&headers)?;
    let content_type =
        header_str(&headers, header::CONTENT_TYPE).unwrap_or("application/octet-stream");
    // Taken before a byte of the body is read: a body still sending its
    // multipart part headers counts against the user's cap too.
    let slot = state.uploads.reserve(&user)?;
    let new = if content_type
        .to_ascii_lowercase()
        .starts_with("multipart/form-data")
    {
        let boundary = multer::parse_boundary(content_type)
            .map_err(|e| ApiError::invalid(format!("bad multipart Content-Type: {e}")))?;
        let idle = state.settings.body_idle_timeout;
        let (part, stream) = multipart::file_part(body, boundary, idle).await?;
        let name = q
            .filename
            .or(part.filename)
            .unwrap_or_else(|| DEFAULT_FILENAME.into());
        NewUpload {
            filename: Filename::parse(&name).map_err(ApiError::invalid)?,
            content_type: media_type(part.content_type.as_deref())?,
            declared_len,
            body: stream,
            idempotency_key,
        }
    } else {
        let name = q.filename.unwrap_or_else(|| DEFAULT_FILENAME.into());
        NewUpload {
            filename: Filename::parse(&name).map_err(ApiError::invalid)?,
            content_type: media_type(Some(content_type))?,
            declared_len,
            body: Box::pin(
                body.into_data_stream()
                    .map_err(|e| BodyError::Read(io::Error::other(e))),
            ),
            idempotency_key,
        }
    };
    let uploaded = state.uploads.upload(slot, &user, new).await?;
    let location = format!("/v1/files/{}", uploaded.file.id);
    let mut res = (StatusCode::CREATED, Json(FileView::from(uploaded.file))).into_response();
    if let Ok(v) = HeaderValue::from_str(&location) {
        res.headers_mut().insert(header::LOCATION, v);
    }
    if uploaded.replayed {
        res.headers_mut()
            .insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
    Ok(res)
}

#[derive(Deserialize)]
pub struct ListQuery {
    limit: Option<usize>,
    cursor: Option<String>,
}

#[derive(Serialize)]
struct FileList {
    files: Vec<FileView>,
    next_cursor: Option<String>,
}

/// `GET /v1/files?limit=&cursor=`: the caller's files, oldest first.
pub async fn list(
    AuthUser(user): AuthUser,
    State(state): State<AppState>,
    AppQuery(q): AppQuery<ListQuery>,
) -> ApiResult {
    let limit = q.limit.unwrap_or(100);
    if !(1..=1000).contains(&limit) {
        return Err(ApiError::invalid("limit must be between 1 and 1000"));
    }
    let (files, next_cursor) = state.files.list(&user, limit, q.cursor.as_deref()).await?;
    ok(Json(FileList {
        files: files.into_iter().map(Into::into).collect(),
        next_cursor,
    }))
}

/// `GET /v1/files/{id}`.
pub async fn get(
    AuthUser(user): AuthUser,
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult {
    ok(Json(FileView::from(state.files.find(&user, &id).await?)))
}

/// `DELETE /v1/files/{id}` → 204.
pub async fn delete(
    AuthUser(user): AuthUser,
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult {
    state.files.delete(&user, &id).await?;
    ok(StatusCode::NO_CONTENT)
}

/// `GET /v1/files/{id}/content`: streamed, with `ETag`, `Content-Disposition` and `Range`.
pub async fn content(
    AuthUser(user): AuthUser,
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> ApiResult {
    let file = state.files.find(&user, &id).await?;
    let etag = format!("\"{}\"", file.sha256);
    let size = file.size as u64;
    if header_str(&headers, header::IF_NONE_MATCH)
        .is_some_and(|v| v.split(',').any(|t| t.trim() == etag || t.trim() == "*"))
    {
        return ok((StatusCode::NOT_MODIFIED, [(header::ETAG, etag)]));
    }
    let range = match header_str(&headers, header::RANGE) {
        Some(raw) => requested_range(raw, size)?,
        None => None,
    };
    let body = state.files.content(&file, range).await?;
    let mut res = Body::from_stream(body).into_response();
    let h = res.headers_mut();
    let set = |h: &mut HeaderMap, name, value: String| {
        if let Ok(v) = HeaderValue::from_str(&value) {
            h.insert(name, v);
        }
    };
    set(h, header::CONTENT_TYPE, file.content_type.clone());
    // Whatever type the uploader claimed, a browser must neither sniff the
    // bytes nor run them as a page of this origin.
    set(h, header::X_CONTENT_TYPE_OPTIONS, "nosniff".into());
    set(h, header::CONTENT_SECURITY_POLICY, "sandbox".into());
    set(h, header::CACHE_CONTROL, "private".into());
    set(h, header::ETAG, etag);
    set(h, header::ACCEPT_RANGES, "bytes".into());
    set(
        h,
        header::CONTENT_DISPOSITION,
        content_disposition(&file.filename),
    );
    match range {
        Some(r) => {
            *res.status_mut() = StatusCode::PARTIAL_CONTENT;
            let h = res.headers_mut();
            set(
                h,
                header::CONTENT_RANGE,
                format!("bytes {}-{}/{size}", r.start, r.end),
            );
            set(h, header::CONTENT_LENGTH, r.len().to_string());
        }
        None => set(res.headers_mut(), header::CONTENT_LENGTH, size.to_string()),
    }
    Ok(res)
}

/// One satisfiable range, `None` to send the whole file (no range, a
/// malformed header, or several ranges), or 416.
fn requested_range(raw: &str, size: u64) -> Result<Option<ByteRange>, ApiError> {
    let Ok(parsed) = http_range_header::parse_range_header(raw) else {
        return Ok(None); // RFC 9110: an unparseable Range is ignored
    };
    if size == 0 {
        // No byte range of an empty file is satisfiable (RFC 9110 §14.1.2).
        return Err(ApiError::RangeNotSatisfiable { size });
    }
    let ranges = parsed
        .validate(size)
        .map_err(|_| ApiError::RangeNotSatisfiable { size })?;
    Ok(match ranges.as_slice() {
        [one] => Some(ByteRange {
            start: *one.start(),
            end: *one.end(),
        }),
        _ => None,
    })
}

/// The media type to store: the client's, if it is one (400 otherwise).
pub(super) fn media_type(declared: Option<&str>) -> Result<String, ApiError> {
    let declared = declared.unwrap_or("application/octet-stream");
    Ok(MediaType::parse(declared)
        .map_err(ApiError::invalid)?
        .into_string())
}

/// `attachment` with an ASCII fallback and the exact name per RFC 6266/5987.
fn content_disposition(filename: &str) -> String {
    let fallback: String = filename
        .chars()
        .map(|c| {
            if c.is_ascii_graphic() && c != '"' && c != '\\' || c == ' ' {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!(
        "attachment; filename=\"{fallback}\"; filename*=UTF-8''{}",
        utf8_percent_encode(filename, NON_ALPHANUMERIC)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges() {
        assert_eq!(
            requested_range("bytes=0-9", 100).unwrap(),
            Some(ByteRange { start: 0, end: 9 })
        );
        assert_eq!(
            requested_range("bytes=90-", 100).unwrap(),
            Some(ByteRange { start: 90, end: 99 })
        );
        assert_eq!(
            requested_range("bytes=-10", 100).unwrap(),
            Some(ByteRange { start: 90, end: 99 })
        );
        assert_eq!(requested_range("nonsense", 100).unwrap(), None);
        assert!(matches!(
            requested_range("bytes=200-300", 100),
            Err(ApiError::RangeNotSatisfiable { size: 100 })
        ));
    }

    #[test]
    fn content_disposition_encodes_non_ascii() {
        let cd = content_disposition("résumé \"final\".pdf");
        assert_eq!(
            cd,
            "attachment; filename=\"r_sum_ _final_.pdf\"; filename*=UTF-8''r%C3%A9sum%C3%A9%20%22final%22%2Epdf"
        );
    }
}
