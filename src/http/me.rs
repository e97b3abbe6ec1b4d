//! `/v1/me`: the caller, their storage against the quota, their uploads in flight.

use axum::{Json, extract::State};
use serde_json::json;

use super::{
    error::{ApiResult, ok},
    extract::AuthUser,
    state::AppState,
};

/// `GET /v1/me`.
pub async fn me(AuthUser(user): AuthUser, State(state): State<AppState>) -> ApiResult {
    let usage = state.uploads.usage(&user).await?;
    let me = usage.user;
    ok(Json(json!({
        "id": me.id,
        "name": me.name,
        "created_at": me.created_at,
        "usage": {
            "used_bytes": me.used_bytes,
            "quota_bytes": usage.quota_bytes,
            "file_count": me.file_count,
            "uploads_in_flight": usage.uploads_in_flight,
        },
    })))
}
