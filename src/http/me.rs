//! `/v1/me`: the caller, their storage against the quota (stored and
//! reserved by open resumable uploads), their uploads in flight and open.

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
            "reserved_bytes": me.reserved_bytes,
            "open_uploads": me.open_uploads,
            "max_open_uploads": state.settings.max_open_uploads,
        },
    })))
}
