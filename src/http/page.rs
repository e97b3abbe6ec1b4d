//! `GET /`: a small upload page, compiled into the binary. It talks to the
//! API from the same origin with the short-lived token (`POST /v1/tokens`)
//! a person pastes into it.

use axum::{
    http::header,
    response::{Html, IntoResponse},
};

const INDEX: &str = include_str!("page/index.html");

pub async fn index() -> impl IntoResponse {
    (
        [
            (header::CACHE_CONTROL, "no-cache"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        Html(INDEX),
    )
}
