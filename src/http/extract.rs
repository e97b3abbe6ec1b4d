//! Extractors: the authenticated user, the admin, and JSON bodies that
//! fail with the documented error shape.

use axum::{
    extract::{FromRequest, FromRequestParts, Query, Request},
    http::{header, request::Parts},
};
use serde::de::DeserializeOwned;

use secrecy::ExposeSecret;

use super::{AppState, error::ApiError};
use crate::{
    domain::{DomainError, users::secrets_match},
    meta::UserRecord,
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
        let key = bearer(parts).ok_or(DomainError::Unauthenticated)?;
        Ok(Self(state.users.authenticate(key).await?))
    }
}

/// A request carrying the admin key.
pub struct Admin;

impl FromRequestParts<AppState> for Admin {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        match bearer(parts) {
            Some(key) if secrets_match(key, state.admin_key.expose_secret()) => Ok(Self),
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
