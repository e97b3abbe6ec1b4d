//! Sessions and agents: creating them, attaching files, and connecting an
//! agent's MCP servers and toolsets. Each write goes through the configured
//! coordinator: under its own lock level (`session_file_add_lock`,
//! `agent_file_add_lock`, `agent_config_lock`) or through the ordered queue,
//! and always inside a retried transaction that checks a fencing token.

use super::{AgentId, FileId, LinkId, SessionId};
use crate::{
    coord::Operation,
    error::ApiError,
    meta::{AgentRecord, Container, LinkKind, SessionRecord, UserRecord, now},
    startup::AppState,
};

pub async fn create_session(
    state: &AppState,
    user: &UserRecord,
) -> Result<SessionRecord, ApiError> {
    let session = SessionRecord {
        id: SessionId::new().to_string(),
        owner_id: user.id.clone(),
        file_ids: Vec::new(),
        fence: Default::default(),
        created_at: now(),
    };
    state.meta.insert_session(&session).await?;
    Ok(session)
}

pub async fn session(
    state: &AppState,
    user: &UserRecord,
    id: &str,
) -> Result<SessionRecord, ApiError> {
    let id = SessionId::parse(id).ok_or(ApiError::NotFound)?;
    state
        .meta
        .session(&user.id, &id.to_string())
        .await?
        .ok_or(ApiError::NotFound)
}

pub async fn create_agent(
    state: &AppState,
    user: &UserRecord,
    name: &str,
) -> Result<AgentRecord, ApiError> {
    let name = name.trim();
    if name.is_empty() || name.chars().count() > 200 || name.chars().any(char::is_control) {
        return Err(ApiError::InvalidRequest(
            "name must be 1 to 200 characters without control characters".into(),
        ));
    }
    let agent = AgentRecord {
        id: AgentId::new().to_string(),
        owner_id: user.id.clone(),
        name: name.to_owned(),
        file_ids: Vec::new(),
        mcp_ids: Vec::new(),
        toolset_ids: Vec::new(),
        fence: Default::default(),
        created_at: now(),
    };
    state.meta.insert_agent(&agent).await?;
    Ok(agent)
}

pub async fn agent(state: &AppState, user: &UserRecord, id: &str) -> Result<AgentRecord, ApiError> {
    let id = AgentId::parse(id).ok_or(ApiError::NotFound)?;
    state
        .meta
        .agent(&user.id, &id.to_string())
        .await?
        .ok_or(ApiError::NotFound)
}

/// Attaches (or detaches) one of the caller's files to (from) a session or
/// an agent the caller owns.
pub async fn set_attachment(
    state: &AppState,
    user: &UserRecord,
    container: Container,
    file_id: &str,
    attached: bool,
) -> Result<(), ApiError> {
    // The session or agent must be the caller's (404 otherwise); a file that
    // is not one of the caller's is a bad reference in the request (400), the
    // same answer whether it exists for someone else or not at all.
    let container = match container {
        Container::Session(id) => Container::Session(session(state, user, &id).await?.id),
        Container::Agent(id) => Container::Agent(agent(state, user, &id).await?.id),
    };
    let not_yours = || ApiError::InvalidRequest("file_id does not name one of your files".into());
    let Some(file_id) = FileId::parse(file_id) else {
        return Err(if attached {
            not_yours()
        } else {
            ApiError::NotFound
        });
    };
    let op = Operation::Attach {
        owner_id: user.id.clone(),
        container,
        file_id: file_id.to_string(),
        attached,
    };
    match state.coordinator.run(state, op).await {
        Err(ApiError::NotFound) if attached => Err(not_yours()),
        other => other,
    }
}

/// Connects (PUT) or disconnects (DELETE) an MCP server or toolset; both idempotent.
pub async fn set_link(
    state: &AppState,
    user: &UserRecord,
    agent_id: &str,
    kind: LinkKind,
    link_id: &str,
    connected: bool,
) -> Result<(), ApiError> {
    let agent_id = agent(state, user, agent_id).await?.id;
    let link_id = LinkId::parse(link_id)
        .map_err(ApiError::InvalidRequest)?
        .as_str()
        .to_owned();
    let op = Operation::Link {
        owner_id: user.id.clone(),
        agent_id,
        kind,
        link_id,
        connected,
    };
    state.coordinator.run(state, op).await
}
