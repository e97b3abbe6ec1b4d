//! API keys: the admin's `/v1/admin/users/{id}/keys` and the user's own
//! `/v1/me/keys`. A key is shown with its secret once, at creation; lists
//! show its id, name and creation time only.

use axum::{
    Json,
    extract::{Path, State},
    http::{StatusCode, header},
    response::IntoResponse,
};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{
    error::{ApiResult, ok},
    extract::{Admin, AppJson, AppQuery, AuthCaller, path_id},
    listing::{ListQuery, page_response},
    state::AppState,
};
use crate::{
    domain::{page::Page, users::NewKey},
    meta::ApiKeyRecord,
    vocab::{KeyId, UserId},
};

#[derive(Deserialize)]
pub struct KeyRequest {
    name: String,
}

fn view(k: &ApiKeyRecord) -> Value {
    json!({"id": k.id, "name": k.name, "created_at": k.created_at})
}

fn created(key: NewKey) -> ApiResult {
    let mut body = view(&key.record);
    body["api_key"] = key.secret.into();
    // The secret is shown once: no cache may keep it.
    ok((
        StatusCode::CREATED,
        [(header::CACHE_CONTROL, "no-store")],
        Json(body),
    )
        .into_response())
}

/// A page of keys; `current` marks the one in use.
fn list(keys: Page<ApiKeyRecord>, current: Option<&KeyId>) -> ApiResult {
    page_response("keys", keys, |k| {
        let mut v = view(&k);
        if let Some(c) = current {
            v["current"] = (c == &k.id).into();
        }
        v
    })
}

/// `POST /v1/admin/users/{id}/keys {"name"}` → 201 with the secret (once).
pub async fn admin_create(
    _: Admin,
    State(state): State<AppState>,
    Path(id): Path<String>,
    AppJson(body): AppJson<KeyRequest>,
) -> ApiResult {
    let user: UserId = path_id(&id)?;
    let key = state.users.create_key(&user, &body.name, None).await?;
    state.audit.key_created("admin", &user, &key.record.id);
    created(key)
}

/// `GET /v1/admin/users/{id}/keys?limit=&cursor=`.
pub async fn admin_list(
    _: Admin,
    State(state): State<AppState>,
    Path(id): Path<String>,
    AppQuery(q): AppQuery<ListQuery>,
) -> ApiResult {
    list(state.users.keys(&path_id(&id)?, &q.page()?).await?, None)
}

/// `DELETE /v1/admin/users/{id}/keys/{key_id}` → 204.
pub async fn admin_revoke(
    _: Admin,
    State(state): State<AppState>,
    Path((id, key_id)): Path<(String, String)>,
) -> ApiResult {
    let user: UserId = path_id(&id)?;
    let key = state.users.revoke_key(&user, &path_id(&key_id)?).await?;
    state.audit.key_revoked("admin", &user, &key.id);
    ok(StatusCode::NO_CONTENT)
}

/// `POST /v1/me/keys {"name"}` → 201 with the secret (once).
pub async fn my_create(
    AuthCaller(caller): AuthCaller,
    State(state): State<AppState>,
    AppJson(body): AppJson<KeyRequest>,
) -> ApiResult {
    let me = caller.user.id;
    let key = (state.users)
        .create_key(&me, &body.name, Some(&caller.key_id))
        .await?;
    state
        .audit
        .key_created(&caller.actor(), &me, &key.record.id);
    created(key)
}

/// `GET /v1/me/keys?limit=&cursor=`: the caller's keys; `current` marks
/// the one in use.
pub async fn my_list(
    AuthCaller(caller): AuthCaller,
    State(state): State<AppState>,
    AppQuery(q): AppQuery<ListQuery>,
) -> ApiResult {
    let page = state.users.keys(&caller.user.id, &q.page()?).await?;
    list(page, Some(&caller.key_id))
}

/// `DELETE /v1/me/keys/{key_id}` → 204 (the key in use too: the next
/// request with it is refused).
pub async fn my_revoke(
    AuthCaller(caller): AuthCaller,
    State(state): State<AppState>,
    Path(key_id): Path<String>,
) -> ApiResult {
    let me = caller.user.id;
    let key = state.users.revoke_key(&me, &path_id(&key_id)?).await?;
    state.audit.key_revoked(&caller.actor(), &me, &key.id);
    ok(StatusCode::NO_CONTENT)
}
