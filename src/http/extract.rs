//! Extractors: the authenticated user, the admin, JSON bodies and query
//! strings that fail with the documented error shape, and the declared
//! media type of an upload.

use axum::{
    extract::{
        FromRequest, FromRequestParts, Query, Request,
        rejection::{JsonRejection, QueryRejection},
    },
    http::{StatusCode, header, request::Parts},
};
use serde::de::DeserializeOwned;

use secrecy::ExposeSecret;

use super::{error::ApiError, state::AppState};
use crate::{
    domain::{DomainError, auth::Caller, users::secrets_match},
    meta::UserRecord,
    vocab::MediaType,
};

/// The largest JSON request body.
pub const JSON_BODY_LIMIT: usize = 64 * 1024;

fn bearer(parts: &Parts) -> Option<&str> {
    let value = parts.headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

/// The user whose API key the request carries, or whose token allows the
/// route called (see `scopes.rs`).
pub struct AuthUser(pub UserRecord);

impl FromRequestParts<AppState> for AuthUser {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        Ok(Self(
            AuthCaller::from_request_parts(parts, state).await?.0.user,
        ))
    }
}

/// The caller (user, key, grant) whose key or token the request carries;
/// the handler decides what a token may do (key management takes a key).
pub struct AuthCaller(pub Caller);

impl FromRequestParts<AppState> for AuthCaller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let key = bearer(parts).ok_or(DomainError::Unauthenticated)?;
        let caller = state.users.authenticate(key).await?;
        super::scopes::authorize(parts, &caller.grant)?;
        Ok(Self(caller))
    }
}

/// A request carrying the admin key.
pub struct Admin;

impl Admin {
    /// Whether the request carries the admin key.
    pub fn carried_by(parts: &Parts, state: &AppState) -> bool {
        bearer(parts).is_some_and(|key| secrets_match(key, state.admin_key.expose_secret()))
    }
}

/// The admin, or the user whose key or token the request carries.
pub enum AdminOrUser {
    Admin,
    User(UserRecord),
}

impl FromRequestParts<AppState> for AdminOrUser {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        if Admin::carried_by(parts, state) {
            return Ok(Self::Admin);
        }
        let AuthUser(user) = AuthUser::from_request_parts(parts, state).await?;
        Ok(Self::User(user))
    }
}

impl FromRequestParts<AppState> for Admin {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        match bearer(parts) {
            Some(_) if Self::carried_by(parts, state) => Ok(Self),
            // A user's key is a known caller without the right: 403, not 401.
            Some(key) if state.users.authenticate(key).await.is_ok() => Err(ApiError::Forbidden),
            _ => Err(DomainError::Unauthenticated.into()),
        }
    }
}

/// `axum::Json`, but malformed JSON answers with `invalid_request`, and a
/// body that has not arrived within the body timeout with `request_timeout`.
pub struct AppJson<T>(pub T);

impl<T: DeserializeOwned> FromRequest<AppState> for AppJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, ApiError> {
        let limit = state.settings.body_idle_timeout;
        match tokio::time::timeout(limit, axum::Json::<T>::from_request(req, state)).await {
            Ok(json) => Ok(Self(json?.0)),
            Err(_) => Err(DomainError::RequestTimeout(format!(
                "the request body did not arrive within {} s",
                limit.as_secs_f64()
            ))
            .into()),
        }
    }
}

/// `axum::extract::Query`, but a bad query string answers with `invalid_request`.
#[derive(FromRequestParts)]
#[from_request(via(Query), rejection(ApiError))]
pub struct AppQuery<T>(pub T);

impl From<JsonRejection> for ApiError {
    fn from(e: JsonRejection) -> Self {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            return DomainError::PayloadTooLarge(JSON_BODY_LIMIT as u64).into();
        }
        Self::invalid(e.body_text())
    }
}

impl From<QueryRejection> for ApiError {
    fn from(e: QueryRejection) -> Self {
        Self::invalid(e.body_text())
    }
}

/// The media type to store: the client's, if it is one (400 otherwise).
pub fn media_type(declared: Option<&str>) -> Result<String, ApiError> {
    let declared = declared.unwrap_or("application/octet-stream");
    Ok(MediaType::parse(declared)
        .map_err(ApiError::invalid)?
        .into_string())
}

/// A resource's id from the path: what is not an id names nothing (404,
/// as another user's resource would).
pub fn path_id<T: std::str::FromStr>(raw: &str) -> Result<T, ApiError> {
    raw.parse().map_err(|_| DomainError::NotFound.into())
}
