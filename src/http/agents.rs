//! `/v1/agents`: agents, their files, and their MCP and toolset connections.

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
    sessions::FileRef,
    state::AppState,
};
use crate::{
    meta::AgentRecord,
    vocab::{AgentId, Container, FileId, LinkId, LinkKind},
};

fn view(a: AgentRecord) -> Json<Value> {
    Json(json!({
        "id": a.id,
        "name": a.name,
        "file_ids": a.file_ids,
        "mcp_ids": a.mcp_ids,
        "toolset_ids": a.toolset_ids,
        "created_at": a.created_at,
    }))
}

/// `GET /v1/agents?limit=&cursor=`: the caller's agents, oldest first.
pub async fn list(
    AuthUser(user): AuthUser,
    State(state): State<AppState>,
    AppQuery(q): AppQuery<ListQuery>,
) -> ApiResult {
    let page = state.containers.agents(&user, &q.page()?).await?;
    page_response("agents", page, |a| view(a).0)
}

#[derive(Deserialize)]
pub struct NewAgent {
    name: String,
}

/// `POST /v1/agents {"name"}` → 201.
pub async fn create(
    AuthUser(user): AuthUser,
    State(state): State<AppState>,
    AppJson(body): AppJson<NewAgent>,
) -> ApiResult {
    ok((
        StatusCode::CREATED,
        view(state.containers.create_agent(&user, &body.name).await?),
    ))
}

/// `GET /v1/agents/{id}`.
pub async fn get(
    AuthUser(user): AuthUser,
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult {
    ok(view(state.containers.agent(&user, &path_id(&id)?).await?))
}

/// `DELETE /v1/agents/{id}` → 204: the agent, its links and its MCP and
/// toolset connections go; its files stay the caller's.
pub async fn delete(
    AuthCaller(caller): AuthCaller,
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult {
    let id: AgentId = path_id(&id)?;
    let user = &caller.user;
    state.containers.delete(user, Container::Agent(id)).await?;
    let (actor, id) = (caller.actor(), id.to_string());
    state
        .audit
        .container_deleted(&actor, &user.id, "agent", &id);
    ok(StatusCode::NO_CONTENT)
}

/// `POST /v1/agents/{id}/files {"file_id"}`: attach (idempotent) → the agent.
pub async fn attach(
    AuthUser(user): AuthUser,
    State(state): State<AppState>,
    Path(id): Path<String>,
    AppJson(body): AppJson<FileRef>,
) -> ApiResult {
    let id: AgentId = path_id(&id)?;
    // A file id that is not one names none of the caller's files (400).
    let file_id = FileId::parse(&body.file_id);
    state
        .containers
        .set_attachment(&user, Container::Agent(id), file_id, true)
        .await?;
    applied(state.containers.agent_after_change(&user, &id).await?, view)
}

/// `DELETE /v1/agents/{id}/files/{file_id}`: detach (idempotent) → the agent.
pub async fn detach(
    AuthUser(user): AuthUser,
    State(state): State<AppState>,
    Path((id, file_id)): Path<(String, String)>,
) -> ApiResult {
    let id: AgentId = path_id(&id)?;
    let file_id = FileId::parse(&file_id);
    state
        .containers
        .set_attachment(&user, Container::Agent(id), file_id, false)
        .await?;
    applied(state.containers.agent_after_change(&user, &id).await?, view)
}

async fn link(
    state: AppState,
    user: AuthUser,
    id: String,
    kind: LinkKind,
    link_id: String,
    connected: bool,
) -> ApiResult {
    let AuthUser(user) = user;
    let id: AgentId = path_id(&id)?;
    let link_id = LinkId::parse(&link_id);
    state
        .containers
        .set_link(&user, &id, kind, link_id, connected)
        .await?;
    applied(state.containers.agent_after_change(&user, &id).await?, view)
}

/// `PUT /v1/agents/{id}/mcps/{mcp_id}`: connect (idempotent) → the agent.
pub async fn connect_mcp(
    user: AuthUser,
    State(state): State<AppState>,
    Path((id, mcp)): Path<(String, String)>,
) -> ApiResult {
    link(state, user, id, LinkKind::Mcp, mcp, true).await
}

/// `DELETE /v1/agents/{id}/mcps/{mcp_id}`: disconnect (idempotent) → the agent.
pub async fn disconnect_mcp(
    user: AuthUser,
    State(state): State<AppState>,
    Path((id, mcp)): Path<(String, String)>,
) -> ApiResult {
    link(state, user, id, LinkKind::Mcp, mcp, false).await
}

/// `PUT /v1/agents/{id}/toolsets/{toolset_id}`: connect (idempotent) → the agent.
pub async fn connect_toolset(
    user: AuthUser,
    State(state): State<AppState>,
    Path((id, t)): Path<(String, String)>,
) -> ApiResult {
    link(state, user, id, LinkKind::Toolset, t, true).await
}

/// `DELETE /v1/agents/{id}/toolsets/{toolset_id}`: disconnect (idempotent) → the agent.
pub async fn disconnect_toolset(
    user: AuthUser,
    State(state): State<AppState>,
    Path((id, t)): Path<(String, String)>,
) -> ApiResult {
    link(state, user, id, LinkKind::Toolset, t, false).await
}
