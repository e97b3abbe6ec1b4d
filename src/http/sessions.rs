//! `/v1/sessions`: chat sessions and their files.

use axum::{
    Json,
    extract::{Path, State},
    http::StatusCode,
};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{
    error::{ApiResult, applied, ok},
    extract::{AppJson, AppQuery, AuthCaller, AuthUser, path_id},
    listing::{ListQuery, page_response},
    state::AppState,
};
use crate::{
    meta::{SessionRecord, UserRecord},
    vocab::{Container, FileId, SessionId},
};

fn view(s: SessionRecord) -> Json<Value> {
    Json(json!({"id": s.id, "file_ids": s.file_ids, "created_at": s.created_at}))
}

/// `GET /v1/sessions?limit=&cursor=`: the caller's sessions, oldest first.
pub async fn list(
    AuthUser(user): AuthUser,
    State(state): State<AppState>,
    AppQuery(q): AppQuery<ListQuery>,
) -> ApiResult {
    let page = state.containers.sessions(&user, &q.page()?).await?;
    page_response("sessions", page, |s| view(s).0)
}

/// `POST /v1/sessions` → 201.
pub async fn create(AuthUser(user): AuthUser, State(state): State<AppState>) -> ApiResult {
    ok((
        StatusCode::CREATED,
        view(state.containers.create_session(&user).await?),
    ))
}

/// `GET /v1/sessions/{id}`.
pub async fn get(
    AuthUser(user): AuthUser,
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult {
    ok(view(state.containers.session(&user, &path_id(&id)?).await?))
}

/// `DELETE /v1/sessions/{id}` → 204: the session and its links go; its
/// files stay the caller's.
pub async fn delete(
    AuthCaller(caller): AuthCaller,
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult {
    let id: SessionId = path_id(&id)?;
    let user = &caller.user;
    state
        .containers
        .delete(user, Container::Session(id))
        .await?;
    let (actor, id) = (caller.actor(), id.to_string());
    state
        .audit
        .container_deleted(&actor, &user.id, "session", &id);
    ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize)]
pub struct FileRef {
    pub file_id: String,
}

/// `POST /v1/sessions/{id}/files {"file_id"}`: attach (idempotent) → the session.
pub async fn attach(
    AuthUser(user): AuthUser,
    State(state): State<AppState>,
    Path(id): Path<String>,
    AppJson(body): AppJson<FileRef>,
) -> ApiResult {
    // A file id that is not one names none of the caller's files (400).
    change(&state, &user, &id, FileId::parse(&body.file_id), true).await
}

/// `DELETE /v1/sessions/{id}/files/{file_id}`: detach (idempotent) → the session.
pub async fn detach(
    AuthUser(user): AuthUser,
    State(state): State<AppState>,
    Path((id, file_id)): Path<(String, String)>,
) -> ApiResult {
    change(&state, &user, &id, FileId::parse(&file_id), false).await
}

async fn change(
    state: &AppState,
    user: &UserRecord,
    id: &str,
    file_id: Option<FileId>,
    attached: bool,
) -> ApiResult {
    let id: SessionId = path_id(id)?;
    state
        .containers
        .set_attachment(user, Container::Session(id), file_id, attached)
        .await?;
    applied(
        state.containers.session_after_change(user, &id).await?,
        view,
    )
}
