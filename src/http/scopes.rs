//! What a token may call: the scope each route needs, and the session or
//! agent a bound token is held to. A key may call everything; a route not
//! listed here takes a key (keys and tokens are managed with keys only).

use axum::http::{Method, request::Parts};

use crate::{
    domain::{DomainError, auth::Grant},
    vocab::Scope,
};

/// What a token needs to call a route.
#[derive(Clone, Copy)]
enum Needs {
    /// Any token (the caller's own account).
    AnyToken,
    Scope(Scope),
}

/// Routes a token may call, by method and matched path.
const TOKEN_ROUTES: &[(&str, &str, Needs)] = {
    use Needs::{AnyToken, Scope as S};
    use Scope::*;
    &[
        ("GET", "/v1/me", AnyToken),
        ("GET", "/v1/events", S(EventsRead)),
        ("GET", "/v1/files", S(FilesRead)),
        ("GET", "/v1/files/{id}", S(FilesRead)),
        ("GET", "/v1/files/{id}/content", S(FilesRead)),
        ("HEAD", "/v1/files/{id}/content", S(FilesRead)),
        ("POST", "/v1/files/{id}/links", S(FilesRead)),
        ("POST", "/v1/files", S(FilesWrite)),
        ("PATCH", "/v1/files/{id}", S(FilesWrite)),
        ("DELETE", "/v1/files/{id}", S(FilesWrite)),
        ("POST", "/v1/uploads", S(FilesWrite)),
        ("HEAD", "/v1/uploads/{id}", S(FilesWrite)),
        ("PATCH", "/v1/uploads/{id}", S(FilesWrite)),
        ("DELETE", "/v1/uploads/{id}", S(FilesWrite)),
        ("GET", "/v1/sessions", S(SessionsRead)),
        ("GET", "/v1/sessions/{id}", S(SessionsRead)),
        ("POST", "/v1/sessions", S(SessionsWrite)),
        ("DELETE", "/v1/sessions/{id}", S(SessionsWrite)),
        ("POST", "/v1/sessions/{id}/files", S(SessionsWrite)),
        (
            "DELETE",
            "/v1/sessions/{id}/files/{file_id}",
            S(SessionsWrite),
        ),
        ("GET", "/v1/agents", S(AgentsRead)),
        ("GET", "/v1/agents/{id}", S(AgentsRead)),
        ("POST", "/v1/agents", S(AgentsWrite)),
        ("DELETE", "/v1/agents/{id}", S(AgentsWrite)),
        ("POST", "/v1/agents/{id}/files", S(AgentsWrite)),
        ("DELETE", "/v1/agents/{id}/files/{file_id}", S(AgentsWrite)),
        ("PUT", "/v1/agents/{id}/mcps/{mcp_id}", S(AgentsWrite)),
        ("DELETE", "/v1/agents/{id}/mcps/{mcp_id}", S(AgentsWrite)),
        (
            "PUT",
            "/v1/agents/{id}/toolsets/{toolset_id}",
            S(AgentsWrite),
        ),
        (
            "DELETE",
            "/v1/agents/{id}/toolsets/{toolset_id}",
            S(AgentsWrite),
        ),
    ]
};

/// Refuses (403) a request its grant does not cover.
pub fn authorize(parts: &Parts, grant: &Grant) -> Result<(), DomainError> {
    let Grant::Token(token) = grant else {
        return Ok(());
    };
    let route = parts
        .extensions
        .get::<axum::extract::MatchedPath>()
        .map_or("", |p| p.as_str());
    let method = if parts.method == Method::HEAD {
        "HEAD"
    } else {
        parts.method.as_str()
    };
    let needs = TOKEN_ROUTES
        .iter()
        .find(|(m, r, _)| (*m == method || (method == "HEAD" && *m == "GET")) && *r == route)
        .map(|(_, _, n)| *n)
        .ok_or_else(|| DomainError::Forbidden("this call takes an API key, not a token".into()))?;
    if let Needs::Scope(scope) = needs
        && !token.scopes.contains(&scope)
    {
        return Err(DomainError::Forbidden(format!(
            "this token lacks the {} scope",
            scope.as_str()
        )));
    }
    // A token bound to one session (agent) touches that one only: not the
    // list, not a new one, not another.
    let bound = [
        ("/v1/sessions", token.session_id.map(|s| s.to_string())),
        ("/v1/agents", token.agent_id.map(|a| a.to_string())),
    ];
    for (prefix, only) in bound {
        let Some(only) = only else { continue };
        let Some(rest) = route.strip_prefix(prefix) else {
            continue;
        };
        let id = parts.uri.path().strip_prefix(prefix).unwrap_or("");
        let named = id.strip_prefix('/').and_then(|p| p.split('/').next());
        if rest.is_empty() || named != Some(only.as_str()) {
            return Err(DomainError::Forbidden(format!(
                "this token may only touch {}/{only}",
                prefix
            )));
        }
    }
    Ok(())
}
