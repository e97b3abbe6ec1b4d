//! Extractors: the authenticated user, the admin, and JSON bodies that
//! fail with the documented error shape.

use axum::{
    extract::{FromRequest, FromRequestParts, Query},
    http::{header, request::Parts},
};

use crate::{
    domain::users,
    error::ApiError,
    meta::UserRecord,
    startup::{AppState, is_admin_key},
};

fn bearer(parts: &Parts) -> Option<&str> {
    let value = parts.headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

/// The user whose API key the request carries.
pub struct AuthUser(pub UserRecord);

impl FromRequestParts<AppState> for AuthUser {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let key = bearer(parts).ok_or(ApiError::Unauthenticated)?;
        Ok(Self(
            users::authenticate(state.meta.as_ref(), &state.auth_cache, key).await?,
        ))
    }
}

/// A request carrying the admin key.
pub struct Admin;

impl FromRequestParts<AppState> for Admin {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        match bearer(parts) {
            Some(key) if is_admin_key(state, key) => Ok(Self),
            _ => Err(ApiError::Unauthenticated),
        }
    }
}

/// `axum::Json`, but malformed JSON answers with `invalid_request`.
#[derive(FromRequest)]
#[from_request(via(axum::Json), rejection(ApiError))]
pub struct AppJson<T>(pub T);

/// `axum::extract::Query`, but a bad query string answers with `invalid_request`.
#[derive(FromRequestParts)]
#[from_request(via(Query), rejection(ApiError))]
pub struct AppQuery<T>(pub T);
