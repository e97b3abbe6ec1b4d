//! The webhooks' dead letters (admin key): events given up on after
//! `FILEDOCK_WEBHOOK_MAX_AGE_SECS`, listed, replayed or discarded.

use axum::{
    Json,
    extract::{Path, State},
    http::StatusCode,
};
use serde::Deserialize;
use serde_json::json;

use super::{
    error::{ApiResult, error_body, ok},
    events::event_json,
    extract::{Admin, AppQuery},
    state::AppState,
};
use crate::domain::webhooks::Answer;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeadQuery {
    /// The last id of the previous page.
    after: Option<String>,
    limit: Option<usize>,
}

/// `GET /v1/admin/events/dead?after=&limit=`: in id order; `next` is the
/// `after` of the next page, given whenever this page is full (the next
/// may then be empty), none when it is not.
pub async fn list(
    _: Admin,
    State(state): State<AppState>,
    AppQuery(q): AppQuery<DeadQuery>,
) -> ApiResult {
    let limit = q.limit.unwrap_or(100);
    let letters = state
        .webhooks
        .dead_letters(q.after.as_deref(), limit)
        .await?;
    let next = (letters.len() == limit)
        .then(|| letters.last().map(|l| l.id.clone()))
        .flatten();
    let letters: Vec<_> = letters
        .into_iter()
        .map(|l| {
            json!({
                "id": l.id,
                "url": l.url,
                "attempts": l.attempts,
                "last_error": l.last_error,
                "dead_at": l.dead_at,
                "event": event_json(l.event),
            })
        })
        .collect();
    ok(Json(json!({"dead_letters": letters, "next": next})))
}

/// `POST /v1/admin/events/dead/{id}/replay`: one delivery now; `200` and
/// the letter removed when the receiver took it, `502 delivery_failed`
/// (the letter kept) when not.
pub async fn replay(_: Admin, State(state): State<AppState>, Path(id): Path<String>) -> ApiResult {
    match state.webhooks.replay(&id).await? {
        Answer::Accepted(status) => ok(Json(json!({"replayed": true, "status": status}))),
        Answer::Refused(why) => Ok(error_body(
            StatusCode::BAD_GATEWAY,
            "delivery_failed",
            format!("the receiver did not take it ({why}); the dead letter is kept"),
        )),
    }
}

/// `DELETE /v1/admin/events/dead/{id}`: `204`.
pub async fn discard(_: Admin, State(state): State<AppState>, Path(id): Path<String>) -> ApiResult {
    state.webhooks.discard(&id).await?;
    ok(StatusCode::NO_CONTENT)
}
