//! Sessions and agents: creating them, attaching files, and connecting an
//! agent's MCP servers and toolsets — each write under its own lock level
//! (`session_file_add_lock`, `agent_file_add_lock`, `agent_config_lock`) and
//! inside a retried transaction that checks the lock's fencing token.

use super::{AgentId, FileId, LinkId, SessionId};
use crate::{
    error::ApiError,
    lock::LockKey,
    meta::{AgentRecord, Container, Fence, LinkKind, MetaResult, SessionRecord, UserRecord, now},
    retry::with_txn_retry,
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
    let file_id = FileId::parse(file_id)
        .ok_or(ApiError::NotFound)?
        .to_string();
    let (key, op) = match &container {
        Container::Session(id) => (LockKey::session_files(id), "session_files"),
        Container::Agent(id) => (LockKey::agent_files(id), "agent_files"),
    };
    let (container, file_id) = (&container, &file_id);
    locked_write(state, &key, "files", op, |fence| async move {
        state
            .meta
            .set_attachment(&user.id, container, file_id, attached, fence.as_ref())
            .await
    })
    .await
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
    let agent_id = AgentId::parse(agent_id)
        .ok_or(ApiError::NotFound)?
        .to_string();
    let link = LinkId::parse(link_id).map_err(ApiError::InvalidRequest)?;
    let (key, agent_id, link) = (LockKey::agent_config(&agent_id), &agent_id, &link);
    locked_write(state, &key, "config", "agent_config", |fence| async move {
        state
            .meta
            .set_agent_link(
                &user.id,
                agent_id,
                kind,
                link.as_str(),
                connected,
                fence.as_ref(),
            )
            .await
    })
    .await
}

/// Runs `write` under `key`'s lock, retrying its transaction on conflicts,
/// with the lease's fencing token stored under `slot`.
async fn locked_write<F, Fut>(
    state: &AppState,
    key: &LockKey,
    slot: &str,
    op: &str,
    write: F,
) -> Result<(), ApiError>
where
    F: Fn(Option<Fence>) -> Fut,
    Fut: Future<Output = MetaResult<()>>,
{
    let guard = state.locks.acquire(key).await?;
    let fence = guard.as_ref().map(|g| Fence {
        slot: slot.into(),
        token: g.fence() as i64,
    });
    let result = with_txn_retry(&state.txn_retry, || write(fence.clone())).await;
    if let Some(g) = guard {
        g.release().await;
    }
    match result {
        Ok(r) => {
            state.metrics.observe_txn(op, r.retries);
            Ok(())
        }
        Err(e) => {
            if e.is_write_conflict() {
                state
                    .metrics
                    .observe_txn(op, state.txn_retry.max_attempts - 1);
            }
            Err(e.into())
        }
    }
}
