//! `/v1/admin/users` beyond their creation: the user list, one user, and
//! a user's own storage quota (admin key).

use axum::{
    Json,
    extract::{Path, State},
};
use serde_json::{Value, json};

use super::{
    error::{ApiError, ApiResult, ok},
    extract::{Admin, AppJson, AppQuery, path_id},
    listing::{ListQuery, page_response},
    state::AppState,
};
use crate::{meta::UserRecord, vocab::UserId};

/// A user as the admin sees them: `quota_bytes` is the quota that holds
/// (their own, else `FILEDOCK_USER_QUOTA_BYTES`; `null`: none).
fn view(state: &AppState, u: &UserRecord) -> Value {
    json!({
        "id": u.id,
        "name": u.name,
        "created_at": u.created_at,
        "used_bytes": u.used_bytes,
        "file_count": u.file_count,
        "quota_bytes": state.users.quota_of(u),
        "quota_is_default": u.quota_bytes.is_none(),
    })
}

/// `GET /v1/admin/users?limit=&cursor=`: every user, oldest first.
pub async fn list(
    _: Admin,
    State(state): State<AppState>,
    AppQuery(q): AppQuery<ListQuery>,
) -> ApiResult {
    let page = state.users.users(&q.page()?).await?;
    page_response("users", page, |u| view(&state, &u))
}

/// `GET /v1/admin/users/{id}`: the user, their usage and file count.
pub async fn get(_: Admin, State(state): State<AppState>, Path(id): Path<String>) -> ApiResult {
    let user = state.users.user(&path_id(&id)?).await?;
    ok(Json(view(&state, &user)))
}

/// `PATCH /v1/admin/users/{id} {"quota_bytes": n | null}`: the user's own
/// quota (`null`: the default, `FILEDOCK_USER_QUOTA_BYTES`, again).
pub async fn update(
    _: Admin,
    State(state): State<AppState>,
    Path(id): Path<String>,
    AppJson(body): AppJson<Value>,
) -> ApiResult {
    let id: UserId = path_id(&id)?;
    let quota = match body.get("quota_bytes") {
        Some(Value::Null) => None,
        Some(v) => Some(v.as_u64().ok_or_else(|| {
            ApiError::invalid("quota_bytes must be a whole number of bytes (0 or more) or null")
        })?),
        None => {
            return Err(ApiError::invalid(
                "the body must set quota_bytes (null: the default)",
            ));
        }
    };
    let user = state.users.set_quota(&id, quota).await?;
    state.audit.quota_changed("admin", &user.id, quota);
    ok(Json(view(&state, &user)))
}
