//! Admin endpoints (admin key required).

use axum::{
    Json,
    extract::State,
    http::{StatusCode, header},
};
use serde::Deserialize;
use serde_json::json;

use super::{
    error::{ApiError, ApiResult, ok},
    extract::{Admin, AppJson, AppQuery},
    state::AppState,
};
use crate::meta::OrphanStatus;

#[derive(Deserialize)]
pub struct NewUser {
    name: String,
}

/// `POST /v1/admin/users` → 201 with the new user's API key (shown once).
pub async fn create_user(
    _: Admin,
    State(state): State<AppState>,
    AppJson(body): AppJson<NewUser>,
) -> ApiResult {
    let (user, key) = state.users.create_user(&body.name).await?;
    ok((
        StatusCode::CREATED,
        // The key is shown once: no cache may keep it.
        [(header::CACHE_CONTROL, "no-store")],
        Json(json!({
            "id": user.id,
            "name": user.name,
            "api_key": key.secret,
            "key_id": key.record.id,
        })),
    ))
}

#[derive(Deserialize)]
pub struct OrphanQuery {
    status: Option<OrphanStatus>,
    limit: Option<usize>,
}

/// `GET /v1/admin/orphans?status=pending|deleted|failed&limit=`.
pub async fn orphans(
    _: Admin,
    State(state): State<AppState>,
    AppQuery(q): AppQuery<OrphanQuery>,
) -> ApiResult {
    let limit = q.limit.unwrap_or(100);
    if !(1..=1000).contains(&limit) {
        return Err(ApiError::invalid("limit must be between 1 and 1000"));
    }
    let orphans: Vec<_> = state
        .ports
        .meta
        .orphans(q.status, limit)
        .await?
        .into_iter()
        .map(|o| {
            json!({
                "id": o.id,
                "bucket": o.bucket,
                "key": o.key,
                "status": o.status,
                "retries": o.retries,
                "error": o.error,
                "created_at": o.created_at,
                "last_retry_at": o.last_retry_at,
            })
        })
        .collect();
    ok(Json(json!({ "orphans": orphans })))
}

/// `POST /v1/admin/sweep`: one sweeper pass now.
pub async fn sweep(_: Admin, State(state): State<AppState>) -> ApiResult {
    ok(Json(state.sweeper.run_once_now().await?))
}

/// `GET /v1/admin/queue`: the queue's figures and warnings (queue mode).
pub async fn queue(_: Admin, State(state): State<AppState>) -> ApiResult {
    let mode = match state.settings.coordination {
        crate::config::Coordination::Lock => "lock",
        crate::config::Coordination::Queue => "queue",
    };
    let stats = state.containers.queue_stats().await.unwrap_or_default();
    let mut body = serde_json::to_value(&stats).map_err(ApiError::internal)?;
    body["mode"] = mode.into();
    ok(Json(body))
}
