//! `GET /v1/precommit/{id}?user=&expires=&signature=`: the stored bytes of
//! an upload the pre-commit hook is being asked about, for the hook (the
//! read URL its call carries; no API key), while they are there.

use axum::{
    body::Body,
    extract::{Path, State},
    http::{HeaderValue, header},
    response::IntoResponse,
};
use serde::Deserialize;

use super::{
    error::{ApiResult, ok},
    extract::AppQuery,
    state::AppState,
};
use crate::domain::{DomainError, links::SignedLink};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReadQuery {
    user: String,
    expires: String,
    signature: String,
}

pub async fn read(
    State(state): State<AppState>,
    Path(id): Path<String>,
    AppQuery(q): AppQuery<ReadQuery>,
) -> ApiResult {
    // Without a hook no read URL was made: none verifies.
    let Some(hook) = &state.precommit else {
        return Err(DomainError::LinkInvalid.into());
    };
    let link = SignedLink {
        owner_id: &q.user,
        file_id: &id,
        key_id: None,
        expires: &q.expires,
        signature: &q.signature,
    };
    let (size, bytes) = hook.read(&link).await?;
    let mut res = Body::from_stream(bytes).into_response();
    let h = res.headers_mut();
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(size));
    let octets = HeaderValue::from_static("application/octet-stream");
    h.insert(header::CONTENT_TYPE, octets);
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    ok(res)
}
