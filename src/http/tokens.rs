//! `POST /v1/tokens`: mint a short-lived scoped token with the caller's key.

use axum::{
    Json,
    extract::State,
    http::{StatusCode, header},
};
use serde::Deserialize;
use serde_json::json;

use super::{
    error::{ApiError, ApiResult, ok},
    extract::{AppJson, AuthCaller},
    state::AppState,
};
use crate::{
    domain::tokens::MintRequest,
    vocab::{AgentId, Scope, SessionId},
};

#[derive(Deserialize)]
pub struct TokenRequest {
    scopes: Vec<String>,
    expires_in: Option<u64>,
    session_id: Option<String>,
    agent_id: Option<String>,
}

/// `POST /v1/tokens {"scopes", "expires_in"?, "session_id"?, "agent_id"?}` → 201.
pub async fn mint(
    AuthCaller(caller): AuthCaller,
    State(state): State<AppState>,
    AppJson(body): AppJson<TokenRequest>,
) -> ApiResult {
    let scopes = body
        .scopes
        .iter()
        .map(|s| Scope::parse(s))
        .collect::<Result<Vec<_>, _>>()
        .map_err(ApiError::invalid)?;
    // An id that is not one names none of the caller's (404, as another's would).
    let session_id = body
        .session_id
        .as_deref()
        .map(super::extract::path_id::<SessionId>)
        .transpose()?;
    let agent_id = body
        .agent_id
        .as_deref()
        .map(super::extract::path_id::<AgentId>)
        .transpose()?;
    let request = MintRequest {
        scopes,
        expires_in: body.expires_in,
        session_id,
        agent_id,
    };
    let token = state.tokens.mint(&caller, request).await?;
    let t = &token.record;
    state.audit.token_minted(&caller.actor(), &t.user_id, t);
    ok((
        StatusCode::CREATED,
        // The secret is shown once: no cache may keep it.
        [(header::CACHE_CONTROL, "no-store")],
        Json(json!({
            "token": token.secret,
            "token_type": "Bearer",
            "id": t.id,
            "scopes": t.scopes,
            "session_id": t.session_id,
            "agent_id": t.agent_id,
            "expires_at": t.expires_at,
        })),
    ))
}
