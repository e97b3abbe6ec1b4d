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

use super::{
    conditional,
    error::{ApiError, ApiResult, ok},
    extract::{AppJson, AppQuery, AuthUser, media_type, path_id},
    listing::{ListQuery, page_response},
    multipart,
    state::AppState,
};
use crate::{
    blob::{BodyError, PresignedHeaders},
    domain::{
        Filename, digest::ExpectedDigest, digest::sha256_header, media::shows_inline,
        upload::NewUpload,
    },
    meta::FileRecord,
    vocab::{FileId, IdempotencyKey, SizeCategory},
};

/// A file as the API shows it.
#[derive(Serialize)]
pub struct FileView {
    id: FileId,
    filename: String,
    size: i64,
    content_type: String,
    sha256: String,
    category: SizeCategory,
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

fn idempotency_key(headers: &HeaderMap) -> Result<Option<IdempotencyKey>, ApiError> {
    let Some(v) = headers.get("idempotency-key") else {
        return Ok(None);
    };
    let raw = v.to_str().unwrap_or_default();
    IdempotencyKey::parse(raw)
        .map(Some)
        .map_err(ApiError::invalid)
}

/// The `Content-Digest` the client declared, if any (400 if malformed).
fn expected_digest(headers: &HeaderMap) -> Result<Option<ExpectedDigest>, ApiError> {
    let Some(v) = headers.get("content-digest") else {
        return Ok(None);
    };
    let raw = v
        .to_str()
        .map_err(|_| ApiError::invalid("Content-Digest is not ASCII"))?;
    Ok(Some(ExpectedDigest::parse(raw).map_err(ApiError::invalid)?))
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
    let expected_digest = expected_digest(&headers)?;
    let content_type =
        header_str(&headers, header::CONTENT_TYPE).unwrap_or("application/octet-stream");
    // Taken before a byte of the body is read: a body still sending its
    // multipart part headers counts against the user's cap too.
    let slot = state.uploads.reserve(&user)?;
    let new = if content_type
        .to_ascii_lowercase()
        .starts_with("multipart/form-data")
    {
        if expected_digest.is_some() {
            // RFC 9530 would make it the digest of the whole form, not the file's.
            return Err(ApiError::invalid(
                "Content-Digest is checked on raw-body uploads only; send the file as the body",
            ));
        }
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
            expected_digest: None,
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
            expected_digest,
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

/// `GET /v1/files?limit=&cursor=`: the caller's files, oldest first.
pub async fn list(
    AuthUser(user): AuthUser,
    State(state): State<AppState>,
    AppQuery(q): AppQuery<ListQuery>,
) -> ApiResult {
    let page = state.files.list(&user, &q.page()?).await?;
    page_response("files", page, FileView::from)
}

/// `GET /v1/files/{id}`.
pub async fn get(
    AuthUser(user): AuthUser,
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult {
    let id = path_id(&id)?;
    ok(Json(FileView::from(state.files.find(&user, &id).await?)))
}

#[derive(Deserialize)]
pub struct Rename {
    name: String,
}

/// `PATCH /v1/files/{id} {"name"}`: renames the file → the file.
pub async fn rename(
    AuthUser(user): AuthUser,
    State(state): State<AppState>,
    Path(id): Path<String>,
    AppJson(body): AppJson<Rename>,
) -> ApiResult {
    let file = state
        .files
        .rename(&user, &path_id(&id)?, &body.name)
        .await?;
    ok(Json(FileView::from(file)))
}

/// `DELETE /v1/files/{id}` → 204; 412 if `If-Match` names another version.
pub async fn delete(
    AuthUser(user): AuthUser,
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> ApiResult {
    let id = path_id(&id)?;
    if headers.contains_key(header::IF_MATCH) {
        // A file's bytes never change: what is checked here still holds
        // when the delete runs.
        let file = state.files.find(&user, &id).await?;
        if conditional::match_fails(&headers, &conditional::etag(&file.sha256)) {
            return Err(ApiError::PreconditionFailed);
        }
    }
    state.files.delete(&user, &id).await?;
    ok(StatusCode::NO_CONTENT)
}

/// `GET /v1/files/{id}/content`: see [`serve`].
pub async fn content(
    AuthUser(user): AuthUser,
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> ApiResult {
    let file = state.files.find(&user, &path_id(&id)?).await?;
    serve(&state, file, &headers).await
}

/// A file's bytes, streamed, for the owner or a signed link: `ETag`,
/// `Last-Modified`, the conditions of RFC 9110 (`If-Match` → 412,
/// `If-None-Match` / `If-Modified-Since` → 304, `If-Range`), `Range`,
/// `Repr-Digest`, and headers that keep a browser from running it.
pub(super) async fn serve(state: &AppState, file: FileRecord, headers: &HeaderMap) -> ApiResult {
    let etag = conditional::etag(&file.sha256);
    let size = file.size as u64;
    let last_modified = httpdate::fmt_http_date(file.created_at.into());
    if conditional::match_fails(headers, &etag) {
        return Err(ApiError::PreconditionFailed);
    }
    if not_modified(headers, &etag, file.created_at) {
        return ok((
            StatusCode::NOT_MODIFIED,
            [
                (header::ETAG, etag),
                (header::LAST_MODIFIED, last_modified),
                // RFC 9110 §15.4.5: as the 200 would.
                (header::CACHE_CONTROL, "private".into()),
            ],
        ));
    }
    let range = match header_str(headers, header::RANGE) {
        Some(raw) if conditional::range_applies(headers, &etag) => {
            conditional::requested_range(raw, size)?
        }
        _ => None,
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
    set(h, header::LAST_MODIFIED, last_modified);
    if let Some(d) = sha256_header(&file.sha256) {
        // The whole file's digest, also on a 206 (RFC 9530 §3).
        set(h, REPR_DIGEST, d);
    }
    set(h, header::ACCEPT_RANGES, "bytes".into());
    set(
        h,
        header::CONTENT_DISPOSITION,
        content_disposition(&file.filename, shows_inline(&file.content_type)),
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

/// What a presigned download asks S3 to answer with: the type and
/// disposition filedock would send, privately cached.
pub(super) fn presigned_headers(file: &FileRecord) -> PresignedHeaders {
    PresignedHeaders {
        content_type: file.content_type.clone(),
        content_disposition: content_disposition(&file.filename, shows_inline(&file.content_type)),
        cache_control: "private".into(),
    }
}

const REPR_DIGEST: header::HeaderName = header::HeaderName::from_static("repr-digest");

/// Whether the client's copy is current (RFC 9110 §13.2.2: `If-None-Match`
/// decides when present; `If-Modified-Since` only without it).
fn not_modified(headers: &HeaderMap, etag: &str, created: chrono::DateTime<chrono::Utc>) -> bool {
    if headers.contains_key(header::IF_NONE_MATCH) {
        return conditional::none_match_hits(headers, etag);
    }
    // A date that does not parse is ignored (RFC 9110 §13.1.3).
    header_str(headers, header::IF_MODIFIED_SINCE)
        .and_then(|v| httpdate::parse_http_date(v).ok())
        .is_some_and(|since| {
            let since = chrono::DateTime::<chrono::Utc>::from(since);
            created.timestamp() <= since.timestamp()
        })
}

/// `inline` (types safe to show) or `attachment`, with an ASCII fallback
/// and the exact name per RFC 6266/5987.
fn content_disposition(filename: &str, inline: bool) -> String {
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
        "{}; filename=\"{fallback}\"; filename*=UTF-8''{}",
        if inline { "inline" } else { "attachment" },
        utf8_percent_encode(filename, NON_ALPHANUMERIC)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_disposition_encodes_non_ascii() {
        let cd = content_disposition("résumé \"final\".pdf", false);
        assert_eq!(
            cd,
            "attachment; filename=\"r_sum_ _final_.pdf\"; filename*=UTF-8''r%C3%A9sum%C3%A9%20%22final%22%2Epdf"
        );
    }
}
