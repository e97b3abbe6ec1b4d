//! Admin endpoints (admin key required).

use axum::{Json, extract::State, http::StatusCode};
use serde::Deserialize;
use serde_json::json;

use super::{
    ApiResult,
    extract::{Admin, AppJson},
    ok,
};
use crate::{domain::users, startup::AppState};

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
    let (user, key) = users::create_user(state.meta.as_ref(), &body.name).await?;
    ok((
        StatusCode::CREATED,
        Json(json!({"id": user.id, "name": user.name, "api_key": key})),
    ))
}
