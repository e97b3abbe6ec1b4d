//! `/v1/admin/users` beyond their creation: the user list, one user, and
//! a user's own storage quota (admin key).

use axum::{
    Json,
    extract::{Path, State},
    http::StatusCode,
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
        // `deleting` from `DELETE /v1/admin/users/{id}` until the user is
        // gone (then 404), with the files still to delete.
        "status": if u.deleting_since.is_some() { "deleting" } else { "active" },
        "deleting_since": u.deleting_since,
        "files_left": u.deleting_since.map(|_| u.file_count),
    })
}

/// `DELETE /v1/admin/users/{id}` → 202 with the user, `deleting`: from now
/// on their requests are refused (at once here; elsewhere once the auth
/// cache forgets them) and the sweeper deletes everything of theirs, pass
/// by pass (a crash or restart only delays it). `GET` the user for the
/// files left; 404 once they are gone.
pub async fn delete(_: Admin, State(state): State<AppState>, Path(id): Path<String>) -> ApiResult {
    let user = state.users.begin_deletion(&path_id(&id)?).await?;
    state.audit.user_deletion_begun("admin", &user.id);
    // A pass now, rather than at the next interval (the sweeper's lock
    // makes it wait its turn if one is running).
    let sweeper = state.sweeper.clone();
    tokio::spawn(async move {
        if let Err(e) = sweeper.try_run_once().await {
            tracing::warn!(error = %e, "sweep pass after a user deletion failed; the next one goes on");
        }
    });
    ok((StatusCode::ACCEPTED, Json(view(&state, &user))))
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
