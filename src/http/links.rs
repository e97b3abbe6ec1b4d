//! Signed links: `POST /v1/files/{id}/links` makes one; `GET /v1/links/{id}`
//! downloads the file with it, without an API key, until it expires or the
//! key that made it is revoked — by streaming it, or
//! (`FILEDOCK_SIGNED_LINKS=redirect`, S3) by a redirect to a presigned GET.

use axum::{
    Json,
    extract::{Path, State},
    http::{HeaderMap, StatusCode, header},
};
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{
    error::{ApiError, ApiResult, ok},
    extract::{AppJson, AppQuery, AuthCaller, path_id},
    files,
    state::AppState,
};
use crate::{
    config::SignedLinks,
    domain::{
        DomainError,
        auth::Grant,
        links::{SignedLink, expiry},
    },
    vocab::KeyId,
};

/// The longest a redirect's presigned URL lives (never past the link's own
/// expiry, nor past the auth cache's lifetime, the bound a key's
/// revocation promises): it is followed at once, and a file deleted
/// meanwhile is gone from the store anyway.
const PRESIGNED_SECS: u64 = 300;

#[derive(Deserialize)]
pub struct NewLink {
    /// Seconds from now, 1 to [`crate::domain::links::MAX_LINK_SECS`].
    expires_in: u64,
}

#[derive(Serialize)]
struct LinkView {
    url: String,
    expires_at: DateTime<Utc>,
}

/// `POST /v1/files/{id}/links {"expires_in": seconds}` → 201 `{url, expires_at}`.
/// The link carries the caller's key (a token's: the key that minted it)
/// and, made with a token, expires with the token at the latest.
pub async fn create(
    AuthCaller(caller): AuthCaller,
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    AppJson(body): AppJson<NewLink>,
) -> ApiResult {
    let token_expiry = match &caller.grant {
        Grant::Token(t) => Some(t.expires_at),
        Grant::Key => None,
    };
    let expires_at = expiry(Utc::now(), body.expires_in, token_expiry)?;
    let user = &caller.user;
    let file = state.files.find(user, &path_id(&id)?).await?;
    let (owner_id, file_id, key_id) = (
        user.id.to_string(),
        file.id.to_string(),
        caller.key_id.to_string(),
    );
    let signature = state
        .links
        .sign(&owner_id, &file_id, Some(&key_id), expires_at);
    let url = format!(
        "{}/v1/links/{file_id}?user={owner_id}&key={key_id}&expires={}&signature={signature}",
        base_url(&state, &headers)?,
        expires_at.timestamp(),
    );
    ok((StatusCode::CREATED, Json(LinkView { url, expires_at })))
}

/// Where this server is reached: `FILEDOCK_PUBLIC_URL`, or the request's `Host`.
fn base_url(state: &AppState, headers: &HeaderMap) -> Result<String, ApiError> {
    if let Some(url) = &state.settings.public_url {
        return Ok(url.clone());
    }
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .filter(|h| h.parse::<axum::http::uri::Authority>().is_ok())
        .ok_or_else(|| ApiError::invalid("a Host header is needed to make a link"))?;
    Ok(format!("http://{host}"))
}

#[derive(Deserialize)]
pub struct LinkQuery {
    user: String,
    /// Absent on links made before links carried their key.
    key: Option<String>,
    expires: String,
    signature: String,
}

/// `GET /v1/links/{id}?user=&key=&expires=&signature=`: the file, as
/// `GET /v1/files/{id}/content` serves it (ranges and conditionals too),
/// while the link's key is alive (checked before a redirect too).
pub async fn download(
    State(state): State<AppState>,
    Path(id): Path<String>,
    AppQuery(q): AppQuery<LinkQuery>,
    headers: HeaderMap,
) -> ApiResult {
    let link = SignedLink {
        owner_id: &q.user,
        file_id: &id,
        key_id: q.key.as_deref(),
        expires: &q.expires,
        signature: &q.signature,
    };
    let expires = state.links.verify(&link, Utc::now())?;
    let (owner, id) = (path_id(&q.user)?, path_id(&id)?);
    let redirect = state.settings.signed_links == SignedLinks::Redirect;
    // A link made with a key dies with it (from the auth cache when this
    // instance knows the key alive, so usually without a round trip; read
    // from the store before a redirect, whose presigned URL lives on for
    // up to the cache's lifetime); a link from before links carried their
    // key lives until it expires.
    if let Some(key) = &q.key {
        // Signed, so made by this server from a key id: never unparsable.
        let key: KeyId = key.parse().map_err(|_| DomainError::LinkInvalid)?;
        let alive = match redirect {
            true => state.users.key_alive_now(&owner, &key).await?,
            false => state.users.key_alive(&owner, &key).await?,
        };
        if !alive {
            return Err(DomainError::LinkRevoked.into());
        }
    }
    // Looked up every time: a deleted file's links die with it.
    let file = state.files.find_owned(&owner, &id).await?;
    if redirect {
        let left = (expires - Utc::now().timestamp()).max(1) as u64;
        let bound = PRESIGNED_SECS.min(state.settings.auth_cache_ttl.as_secs().max(1));
        let ttl = Duration::from_secs(left.min(bound));
        let presigned = files::presigned_headers(&file);
        if let Some(url) = state.files.presigned(&file, ttl, &presigned).await? {
            let no_store = "private, no-store".to_owned();
            return ok((
                StatusCode::TEMPORARY_REDIRECT,
                [(header::LOCATION, url), (header::CACHE_CONTROL, no_store)],
            ));
        }
    }
    files::serve(&state, file, &headers).await
}
